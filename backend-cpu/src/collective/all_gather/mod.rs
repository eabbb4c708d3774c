//! All-gather (`ncclAllGather`): every rank contributes `count` elements; every rank
//! receives all of them, rank i's at block i (`n × count` elements).
//!
//! Its algorithms on the CPU backend, one file each, and their table: a small buffer goes
//! [`direct`], every block straight to every rank; else the [`ring`] passes the blocks
//! round, or on one host each rank copies the others' blocks straight from their buffers
//! ([`single_copy`]). Each starts with this rank's block in its place in the receive
//! buffer (`own_block`).

pub mod direct;
pub mod ring;
pub mod single_copy;

use super::{Row, always, reads_peers, small};
use crate::record;
use crate::tuner::Algorithm;

/// All-gather's algorithms, as the tuner weighs them ([`crate::tuner::choose`]).
pub const ALGORITHMS: &[Row] = &[
    Row {
        algorithm: Algorithm::Direct,
        label: "direct: every rank's block to every rank (a small message)",
        can: small,
        run: |cpu, c| {
            let block = own_block(cpu.rank(), &c.send, c.buf, c.count * c.elem());
            direct::all_gather(cpu, c.buf, block, c.reduction)
        },
    },
    Row {
        algorithm: Algorithm::SingleCopy,
        label: "single-copy: every rank copies every other rank's block from its buffer",
        can: reads_peers,
        run: single_copy::all_gather,
    },
    Row {
        algorithm: Algorithm::Ring,
        label: "ring: the blocks pass round the ring, one per step",
        can: always,
        run: |cpu, c| {
            let block = own_block(cpu.rank(), &c.send, c.buf, c.count * c.elem());
            ring::all_gather(cpu, c.buf, block, c.reduction)
        },
    },
];

/// Puts this rank's block (`rank`, `block` bytes) in its place in the receive buffer
/// `buf`, out of place (in place it is there already); returns `block`.
pub(crate) fn own_block(rank: usize, send: &Option<&[u8]>, buf: &mut [u8], block: usize) -> usize {
    if let Some(src) = send {
        buf[rank * block..(rank + 1) * block].copy_from_slice(src);
        record::wrote(&buf[rank * block..(rank + 1) * block]);
    }
    block
}
