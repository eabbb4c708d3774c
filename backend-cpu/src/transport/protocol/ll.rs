//! NCCL's LL ("low latency") protocol: 8-byte lines of 4 data bytes and a 4-byte flag.
//!
//! The sender writes each line with one 8-byte store, data in the low half and the step's
//! flag in the high half. The receiver loads the line (one 8-byte load) and compares the
//! flag: when it matches, the data in the same word is the step's, since one store wrote
//! both. No fence and no flag of its own: the news that a line has arrived is the line,
//! so the receiver can take line k while the sender writes line k + 1. The price is half
//! the buffer: 4 bytes of every 8 are flags. (NCCL's `ncclLLFifoLine` holds two such
//! pairs in 16 bytes, stored by one thread with one 16-byte store; one pair per line
//! here, as the CPU's atomic stores are 8 bytes.)
//!
//! A step starts with two header lines (the collective's tag and the step's length; the
//! message's length, low 32 bits) that the receiver checks before it reads any data, as
//! the Simple path checks its metadata.
//!
//! One CPU cache line holds 8 LL lines. Written in order, a cache line would travel to
//! the polling receiver up to 8 times, once per LL line. So the sender writes each cache
//! line's LL lines last to first: when the receiver sees the first one's flag, the others
//! are there too (on x86, which keeps stores in order; elsewhere the receiver still checks
//! every flag, so the order is a speed-up, never a condition).

use super::{StepHeader, Wait, arrive};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Bytes per line.
pub const LINE: usize = 8;
/// Data bytes per line.
pub const DATA: usize = 4;
/// Header lines at the start of each step.
const HEADER_LINES: usize = 2;
/// Data bytes per step.
pub const STEP_DATA: usize = 32 << 10;
/// Lines per step: the header, then the data, padded to a multiple of 16 lines so that
/// every step starts on a 128-byte boundary (its cache lines are its own).
pub const STEP_LINES: usize = (HEADER_LINES + STEP_DATA / DATA).next_multiple_of(16);
/// LL lines per CPU cache line.
const PER_CACHE_LINE: usize = 64 / LINE;
/// Steps in flight per channel: 16 × 32 KiB = 512 KiB of data may wait for the receiver,
/// one piece of the pipelined algorithms (which send a piece before they receive one).
pub const STEPS: usize = 16;
/// Bytes of the channel's LL buffer.
pub const BYTES: usize = STEPS * STEP_LINES * LINE;

fn line(data: u32, flag: u32) -> u64 {
    (flag as u64) << 32 | data as u64
}

/// Writes one step: `h` (whose `len` is `data.len()`, at most [`STEP_DATA`]) and `data`,
/// every line flagged `flag`. The last line is padded with zeros.
pub fn write(step: &[AtomicU64], flag: u32, h: StepHeader, data: &[u8]) {
    assert!(data.len() == h.len && h.len <= STEP_DATA && step.len() >= STEP_LINES);
    let (whole, rest) = data.as_chunks::<DATA>();
    let mut last = [0u8; DATA];
    last[..rest.len()].copy_from_slice(rest);
    // The data word of line i.
    let word = |i: usize| match i {
        0 => h.tag as u32 | (h.len as u32) << 8,
        1 => h.message_len as u32,
        i => whole
            .get(i - HEADER_LINES)
            .map_or(u32::from_le_bytes(last), |c| u32::from_le_bytes(*c)),
    };
    let lines = HEADER_LINES + data.len().div_ceil(DATA);
    for first in (0..lines).step_by(PER_CACHE_LINE) {
        // Each cache line's LL lines last to first (see the module's doc). One 8-byte
        // store each: the receiver sees the data and the flag together or neither.
        for i in (first..(first + PER_CACHE_LINE).min(lines)).rev() {
            step[i].store(line(word(i), flag), Relaxed);
        }
    }
}

/// The data of `l` once its flag is `flag`.
#[inline]
fn get(l: &AtomicU64, flag: u32, wait: &mut Wait<'_>) -> io::Result<u32> {
    let v = l.load(Relaxed);
    if (v >> 32) as u32 == flag {
        return Ok(v as u32);
    }
    arrive(&|| (l.load(Relaxed) >> 32) as u32 == flag, wait)?;
    // The line stays as it is until the receiver hands the step back.
    Ok(l.load(Relaxed) as u32)
}

/// Waits for and reads a step's header.
pub fn read_header(step: &[AtomicU64], flag: u32, wait: &mut Wait<'_>) -> io::Result<StepHeader> {
    let w0 = get(&step[0], flag, wait)?;
    let w1 = get(&step[1], flag, wait)?;
    Ok(StepHeader {
        tag: w0 as u8,
        len: (w0 >> 8) as usize,
        message_len: w1 as u64,
    })
}

/// Reads a step's data into `dst` (its length, as the header said), each line as it
/// arrives.
pub fn read_data(step: &[AtomicU64], flag: u32, dst: &mut [u8], wait: &mut Wait<'_>) -> io::Result<()> {
    assert!(dst.len() <= STEP_DATA && step.len() >= STEP_LINES);
    let lines = &step[HEADER_LINES..];
    let (whole, rest) = dst.as_chunks_mut::<DATA>();
    let n = whole.len();
    for (c, l) in whole.iter_mut().zip(lines) {
        *c = get(l, flag, wait)?.to_le_bytes();
    }
    if !rest.is_empty() {
        let last = get(&lines[n], flag, wait)?.to_le_bytes();
        let k = rest.len();
        rest.copy_from_slice(&last[..k]);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_crosses_whole_and_an_old_flag_is_not_taken_for_a_new_one() {
        let step: Vec<AtomicU64> = (0..STEP_LINES).map(|_| AtomicU64::new(0)).collect();
        let mut never = |_: &dyn Fn() -> bool| -> io::Result<()> { Err(io::Error::other("not there")) };
        for len in [0, 1, 3, 4, 5, 119, 4093, STEP_DATA] {
            let data: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
            let h = StepHeader {
                tag: 9,
                len,
                message_len: 1 << 33 | 77,
            };
            write(&step, 5, h, &data);
            let got = read_header(&step, 5, &mut never).unwrap();
            assert_eq!((got.tag, got.len, got.message_len), (9, len, 77));
            let mut dst = vec![0u8; len];
            read_data(&step, 5, &mut dst, &mut never).unwrap();
            assert_eq!(dst, data, "{len} bytes");
            // The next use of these lines has another flag: nothing has arrived for it.
            assert!(read_header(&step, 6, &mut never).is_err());
        }
    }
}
