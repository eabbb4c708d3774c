//! Transports: how the CPU backend moves bytes between two ranks.
//!
//! A [`Link`] joins this rank to one peer and carries whole messages both ways. The ring
//! algorithms in [`crate::backend::cpu`] are written once over links, so a faster
//! transport (shared memory within a node, as NCCL does) can slot in under the same
//! algorithm. Each message is tagged with the operation that sent it, so two ranks that
//! run different collectives, or the same one with different sizes, get an error saying
//! so instead of mixing their data.

pub mod tcp;

use std::io;

/// What a message belongs to: a mismatch between sender and receiver is a bug in the
/// program (ranks calling different collectives), reported as such.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Op {
    /// A broadcast.
    Broadcast = 1,
    /// An all-reduce.
    AllReduce = 2,
    /// A point-to-point send/recv.
    PointToPoint = 3,
}

impl Op {
    /// The operation's name, as a person would say it.
    pub fn name(self) -> &'static str {
        match self {
            Op::Broadcast => "broadcast",
            Op::AllReduce => "all-reduce",
            Op::PointToPoint => "send/recv",
        }
    }

    /// The op a tag byte stands for.
    pub fn from_tag(tag: u8) -> Option<Op> {
        [Op::Broadcast, Op::AllReduce, Op::PointToPoint]
            .into_iter()
            .find(|op| *op as u8 == tag)
    }
}

/// A connection to one peer that carries whole messages both ways. Sending and receiving
/// may happen at the same time from two threads (a ring step does both).
pub trait Link: Send + Sync {
    /// Sends one message.
    fn send(&self, op: Op, data: &[u8]) -> io::Result<()>;
    /// Receives one message of exactly `dst.len()` bytes into `dst`.
    fn recv_into(&self, op: Op, dst: &mut [u8]) -> io::Result<()>;
    /// Receives one message of `len` bytes piece by piece through `scratch` (whose length
    /// is the piece size), calling `each(offset, piece)` as each piece arrives: the
    /// receiver can reduce one piece while the next is still on the wire.
    fn recv_pieces(&self, op: Op, len: usize, scratch: &mut [u8], each: &mut dyn FnMut(usize, &[u8]))
    -> io::Result<()>;
    /// Where the peer is, for messages.
    fn describe(&self) -> String;
}
