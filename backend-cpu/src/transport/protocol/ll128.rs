//! NCCL's LL128 protocol: 128-byte lines of 120 data bytes and an 8-byte flag.
//!
//! On a GPU, a warp stores a 128-byte line at once and NVLink keeps such a store whole,
//! so a receiver that sees a line's flag sees its data too, with no fence (NCCL enables
//! LL128 only where the hardware is known to keep it so). A CPU promises no such thing for
//! 128 bytes: here the sender writes the 120 data bytes, then the flag with a Release
//! store, and the receiver reads the flag with an Acquire load, then the data. The order
//! the two give each other is what the warp's store gives on a GPU; the protocol is the
//! same: one flag per line, checked line by line, 120/128 of the buffer data.
//!
//! A step starts with one header line (the collective's tag and the step's length, the
//! message's length) that the receiver checks before it reads any data.

use super::{StepHeader, Wait, arrive};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering::*};

/// Bytes per line.
pub const LINE: usize = 128;
/// Data bytes per line; the last 8 are the flag.
pub const DATA: usize = 120;
/// Words of a line (the flag is the last).
const WORDS: usize = LINE / 8;
/// Data lines per step.
const STEP_DATA_LINES: usize = 280;
/// Data bytes per step: 280 × 120 = 33,600.
pub const STEP_DATA: usize = STEP_DATA_LINES * DATA;
/// Lines per step: one header line, then the data.
pub const STEP_LINES: usize = 1 + STEP_DATA_LINES;
/// Steps in flight per channel: 16 × 33,600 B, at least 512 KiB of data may wait for the
/// receiver (one piece of the pipelined algorithms).
pub const STEPS: usize = 16;
/// Bytes of the channel's LL128 buffer.
pub const BYTES: usize = STEPS * STEP_LINES * LINE;

/// One 128-byte line: 15 data words and the flag.
#[repr(C, align(128))]
pub struct Line {
    data: [u8; DATA],
    flag: AtomicU64,
}

const _: () = assert!(size_of::<Line>() == LINE && WORDS == 16);

impl Line {
    /// Fills the line with `data` (up to 120 bytes; the rest is left as it was), then
    /// flags it.
    ///
    /// # Safety
    ///
    /// The caller owns the line's data until it is flagged: the receiver reads it only
    /// after seeing `flag` (Acquire), and hands the step back before the sender writes it
    /// again.
    unsafe fn put(this: *mut Line, data: &[u8], flag: u64) {
        debug_assert!(data.len() <= DATA);
        // SAFETY: `this` points to a line in the mapping; no one reads its data now (see
        // the contract above); the copy stays within its 120 data bytes.
        unsafe {
            let to = &raw mut (*this).data;
            match <&[u8; DATA]>::try_from(data) {
                // A whole line: a copy of fixed size, which the compiler unrolls.
                Ok(whole) => to.write(*whole),
                Err(_) => std::ptr::copy_nonoverlapping(data.as_ptr(), to.cast::<u8>(), data.len()),
            }
            // The flag last, Release: whoever sees it (Acquire) sees the data above.
            (*this).flag.store(flag, Release);
        }
    }

    /// Whether the line is flagged `flag` (Acquire: its data is then visible).
    fn ready(this: *const Line, flag: u64) -> bool {
        // SAFETY: the flag is an atomic inside the mapping, which outlives the step.
        unsafe { (*this).flag.load(Acquire) == flag }
    }

    /// Waits until the line is flagged `flag`, then copies `dst.len()` of its data bytes.
    ///
    /// # Safety
    ///
    /// `this` points to a line in the mapping that the sender will not write again
    /// until the receiver hands the step back.
    unsafe fn take(this: *const Line, flag: u64, dst: &mut [u8], wait: &mut Wait<'_>) -> io::Result<()> {
        if !Line::ready(this, flag) {
            arrive(&|| Line::ready(this, flag), wait)?;
        }
        // SAFETY: the flag was seen with Acquire after the sender's Release, so the data
        // is written and will not change until the step is handed back; dst.len() <= 120.
        unsafe {
            let from = &raw const (*this).data;
            match <&mut [u8; DATA]>::try_from(&mut *dst) {
                Ok(whole) => *whole = from.read(),
                Err(_) => std::ptr::copy_nonoverlapping(from.cast::<u8>(), dst.as_mut_ptr(), dst.len()),
            }
        }
        Ok(())
    }
}

/// Writes one step: `h` (whose `len` is `data.len()`, at most [`STEP_DATA`]) and `data`.
///
/// # Safety
///
/// `step` points to [`STEP_LINES`] lines of the mapping that the receiver has handed back
/// (or never used).
pub unsafe fn write(step: *mut Line, flag: u64, h: StepHeader, data: &[u8]) {
    assert!(data.len() == h.len && h.len <= STEP_DATA);
    let mut head = [0u8; DATA];
    head[..8].copy_from_slice(&(h.tag as u64 | (h.len as u64) << 8).to_le_bytes());
    head[8..16].copy_from_slice(&h.message_len.to_le_bytes());
    // SAFETY: per this function's contract, every line written is inside the step and ours.
    unsafe {
        Line::put(step, &head[..16], flag);
        for (k, c) in data.chunks(DATA).enumerate() {
            Line::put(step.add(1 + k), c, flag);
        }
    }
}

/// Waits for and reads a step's header.
///
/// # Safety
///
/// `step` points to [`STEP_LINES`] lines of the mapping, the receiver's until it hands
/// the step back.
pub unsafe fn read_header(step: *const Line, flag: u64, wait: &mut Wait<'_>) -> io::Result<StepHeader> {
    let mut head = [0u8; 16];
    // SAFETY: the header line is the step's first; see this function's contract.
    unsafe { Line::take(step, flag, &mut head, wait)? };
    let w0 = u64::from_le_bytes(head[..8].try_into().expect("8 bytes"));
    Ok(StepHeader {
        tag: w0 as u8,
        len: (w0 >> 8) as usize,
        message_len: u64::from_le_bytes(head[8..].try_into().expect("8 bytes")),
    })
}

/// Reads a step's data into `dst` (its length, as the header said), line by line as
/// each arrives.
///
/// # Safety
///
/// As [`read_header`].
pub unsafe fn read_data(step: *const Line, flag: u64, dst: &mut [u8], wait: &mut Wait<'_>) -> io::Result<()> {
    assert!(dst.len() <= STEP_DATA);
    for (k, c) in dst.chunks_mut(DATA).enumerate() {
        // SAFETY: line 1 + k < STEP_LINES, inside the step; see this function's contract.
        unsafe { Line::take(step.add(1 + k), flag, c, wait)? };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_crosses_whole_and_an_old_flag_is_not_taken_for_a_new_one() {
        let mut lines: Vec<Line> = (0..STEP_LINES)
            .map(|_| Line {
                data: [0; DATA],
                flag: AtomicU64::new(0),
            })
            .collect();
        let step = lines.as_mut_ptr();
        let mut never = |_: &dyn Fn() -> bool| -> io::Result<()> { Err(io::Error::other("not there")) };
        for len in [0, 1, 119, 120, 121, 4093, STEP_DATA] {
            let data: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
            let h = StepHeader {
                tag: 3,
                len,
                message_len: 1 << 40,
            };
            // SAFETY: `lines` is a whole step, used by this thread alone.
            unsafe {
                write(step, 8, h, &data);
                assert_eq!(read_header(step, 8, &mut never).unwrap(), h);
                let mut dst = vec![0u8; len];
                read_data(step, 8, &mut dst, &mut never).unwrap();
                assert_eq!(dst, data, "{len} bytes");
                assert!(read_header(step, 9, &mut never).is_err());
            }
        }
    }
}
