//! NCCL's three protocols: how a message's bytes and the news that they have arrived
//! travel together (or not) through shared memory.
//!
//! A receiver must learn that data is there before it reads it. NCCL has three ways, and
//! so does the shared-memory transport ([`super::shm`]) here:
//!
//! - [`Protocol::Simple`]: the sender writes a whole piece, then one flag for it (with a
//!   memory fence: Release); the receiver waits for the flag, then reads the piece. Every
//!   byte of the buffer is data (payload 1), but the receiver starts only once the whole
//!   piece is in: full bandwidth, the most latency. The slots of [`super::shm`] are this
//!   protocol (its pieces of a few bytes ride in their flag's cache line).
//! - [`Protocol::Ll`] (low latency, [`ll`]): 8-byte lines of 4 data bytes and a 4-byte
//!   flag, each written with one 8-byte store; the receiver polls each line's flag, and
//!   data and "it has arrived" come in the same load. No fence, no separate flag, the
//!   receiver reads line k while the sender writes line k + 1: the least latency, and
//!   half of the bandwidth (payload 1/2).
//! - [`Protocol::Ll128`] ([`ll128`]): 128-byte lines of 120 data bytes and an 8-byte
//!   flag; the receiver checks each line's flag. Payload 120/128 (94%), nearly Simple's
//!   bandwidth, with most of LL's latency.
//!
//! The flag of a line is the number of the step it belongs to (plus one), so a line left
//! from an earlier use of the buffer never looks new. Which protocol runs is chosen for
//! each collective by the tuner ([`crate::tuner`]), from `NCCL_PROTO` and the
//! size, the same on every rank, and set on the links ([`super::Link::set_protocol`]).
//! Point-to-point messages and the TCP transport always use Simple.

pub mod ll;
pub mod ll128;

use std::io;

/// One of NCCL's protocols (`NCCL_PROTO`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    /// 8-byte lines: 4 data bytes and a 4-byte flag.
    Ll = 0,
    /// 128-byte lines: 120 data bytes and an 8-byte flag.
    Ll128 = 1,
    /// Data, then one flag per piece.
    Simple = 2,
}

impl Protocol {
    /// Every protocol, in NCCL's order (`ncclProtoStr`: LL, LL128, Simple).
    pub const ALL: [Protocol; 3] = [Protocol::Ll, Protocol::Ll128, Protocol::Simple];

    /// The short name the workbook prints: `ll`, `ll128`, `simple`.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Ll => "ll",
            Protocol::Ll128 => "ll128",
            Protocol::Simple => "simple",
        }
    }

    /// NCCL's name (`NCCL_PROTO`): `LL`, `LL128`, `Simple`.
    pub fn nccl_name(self) -> &'static str {
        match self {
            Protocol::Ll => "LL",
            Protocol::Ll128 => "LL128",
            Protocol::Simple => "Simple",
        }
    }

    /// The share of the buffer's bytes that are data: 1/2, 120/128, 1.
    pub fn payload(self) -> f64 {
        match self {
            Protocol::Ll => ll::DATA as f64 / ll::LINE as f64,
            Protocol::Ll128 => ll128::DATA as f64 / ll128::LINE as f64,
            Protocol::Simple => 1.0,
        }
    }

    /// The protocol numbered `i` (its `as u8`), Simple for anything else.
    pub fn from_index(i: u8) -> Protocol {
        match i {
            0 => Protocol::Ll,
            1 => Protocol::Ll128,
            _ => Protocol::Simple,
        }
    }
}

/// What a step's header says: the collective's tag, the data bytes in this step, and the
/// whole message's length (the low 32 bits on LL), which the receiver checks as the
/// Simple path checks its metadata.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepHeader {
    /// The collective's tag: which kind of message this is.
    pub tag: u8,
    /// Data bytes in this step.
    pub len: usize,
    /// The whole message's length (its low 32 bits on LL).
    pub message_len: u64,
}

/// How a receiver waits for a line that has not arrived: called with a test that says
/// whether it has; returns once it holds, or with why it never will (the peer is gone,
/// the timeout passed).
pub type Wait<'a> = dyn FnMut(&dyn Fn() -> bool) -> io::Result<()> + 'a;

/// Spins a little on `ready` before handing it to `wait`: the sender is usually a line
/// or two ahead, and a clock read per line would cost more than the line.
#[inline]
fn arrive(ready: &dyn Fn() -> bool, wait: &mut Wait<'_>) -> io::Result<()> {
    for _ in 0..256 {
        if ready() {
            return Ok(());
        }
        std::hint::spin_loop();
    }
    wait(ready)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_fractions_are_nccls() {
        assert_eq!(Protocol::Ll.payload(), 0.5);
        assert_eq!(Protocol::Ll128.payload(), 120.0 / 128.0);
        assert_eq!(Protocol::Simple.payload(), 1.0);
        for p in Protocol::ALL {
            assert_eq!(Protocol::from_index(p as u8), p);
        }
    }
}
