//! Broadcast (`ncclBroadcast`): the root's buffer is copied into every rank's buffer.
//!
//! Its algorithms on the CPU backend, one file each, and their table: a small buffer
//! goes [`direct`] from the root; on one host, a large one is copied by every rank
//! straight from the root's memory ([`single_copy`]); else the [`chain`].

pub mod chain;
pub mod direct;
pub mod single_copy;

use super::{Row, always, reads_peers, small};
use crate::cpu::Cpu;
use crate::tuner::Algorithm;

/// Broadcast's algorithms, as the tuner weighs them ([`crate::tuner::choose`]).
pub const ALGORITHMS: &[Row] = &[
    Row {
        algorithm: Algorithm::Direct,
        label: "direct: the root to every rank (a small message)",
        // On two ranks the chain is one message already.
        can: |facts, bytes| small(facts, bytes) && facts.ranks > 2,
        run: |cpu, c| direct::broadcast(cpu, from_root(cpu, c.send, c.root), c.buf, c.root, c.reduction),
    },
    Row {
        algorithm: Algorithm::SingleCopy,
        label: "single-copy: every rank copies the root's buffer straight from its memory",
        can: reads_peers,
        run: |cpu, c| single_copy::broadcast(cpu, from_root(cpu, c.send, c.root), c.buf, c.root),
    },
    Row {
        algorithm: Algorithm::Chain,
        label: "chain: from the root round the ring, piece by piece (pipelined)",
        can: always,
        run: |cpu, c| chain::broadcast(cpu, from_root(cpu, c.send, c.root), c.buf, c.root, c.reduction),
    },
];

/// The root's send buffer, out of place, on the root (`None` elsewhere, and in place).
fn from_root<'a>(cpu: &Cpu, send: Option<&'a [u8]>, root: usize) -> Option<&'a [u8]> {
    send.filter(|_| cpu.rank() == root)
}
