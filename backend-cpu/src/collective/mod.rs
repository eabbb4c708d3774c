//! The collectives on the CPU backend: one folder per collective, one file per algorithm,
//! as NCCL (`src/device/all_reduce.h`: `runRing`, `runTreeUpDown`) and Open MPI's `coll`
//! have one function per algorithm, written in the primitives of [`crate::prims`].
//!
//! Each folder's `mod.rs` holds its table of algorithms, [`Row`]s (as Open MPI's
//! `coll_tuned_*_decision.c` tables do): which algorithm, what it does in one line, when it
//! can run, and the function. Its `run` asks the tuner ([`crate::tuner::choose`], the one
//! place that decides) which row runs, and runs it; [`run`] picks the folder by the
//! collective. A new algorithm is one file and one row.
//!
//! [`ring`], [`direct`] and [`single_copy`] hold the steps several collectives share;
//! [`tree`] builds NCCL's double binary tree; [`packed`] packs a group's collectives of
//! one kind into one call.

pub mod all_gather;
pub mod all_reduce;
pub mod all_to_all;
pub mod broadcast;
pub mod direct;
pub mod packed;
pub mod reduce;
pub mod reduce_scatter;
pub mod ring;
pub mod single_copy;
pub mod tree;

use crate::SEND_RECV_TAG;
use crate::cpu::Cpu;
use crate::element::Reduction;
use crate::tuner::{Algorithm, Facts};
use anyhow::Result;
use workbook_runtime::Func;

/// One algorithm of one collective: a row of its table.
pub struct Row {
    /// Which algorithm (its name, and the family `NCCL_ALGO` names it by).
    pub algorithm: Algorithm,
    /// What it does, in one line after its name (the trace, `--steps`): `single-copy:
    /// every rank copies the root's buffer straight from its memory`.
    pub label: &'static str,
    /// Whether it can run on this job and this size (its larger buffer), whatever
    /// `NCCL_ALGO` says.
    pub can: fn(facts: &Facts, bytes: usize) -> bool,
    /// The algorithm.
    pub run: fn(cpu: &Cpu, call: HostCall) -> Result<()>,
}

/// A row's `can` for an algorithm that always can.
pub(crate) fn always(_: &Facts, _: usize) -> bool {
    true
}

/// A row's `can` for a direct exchange: a small message (every send goes before any
/// receive, so it must fit a link's buffer). (Under `--steps` the tuner prefers the ring.)
pub(crate) fn small(_: &Facts, bytes: usize) -> bool {
    bytes <= crate::SMALL
}

/// A row's `can` for a single copy: every rank maps every other's buffers.
pub(crate) fn reads_peers(facts: &Facts, _: usize) -> bool {
    facts.reads_peers
}

/// The table of `func`'s algorithms.
pub fn algorithms(func: Func) -> &'static [Row] {
    match func {
        Func::Broadcast => broadcast::ALGORITHMS,
        Func::Reduce => reduce::ALGORITHMS,
        Func::AllReduce => all_reduce::ALGORITHMS,
        Func::AllGather => all_gather::ALGORITHMS,
        Func::ReduceScatter => reduce_scatter::ALGORITHMS,
        Func::AllToAll => all_to_all::ALGORITHMS,
    }
}

/// The row of `algo` in `func`'s table (its first, if none).
pub fn row(func: Func, algo: Algorithm) -> &'static Row {
    let rows = algorithms(func);
    rows.iter().find(|r| r.algorithm == algo).unwrap_or(&rows[0])
}

/// A collective on the CPU backend: host buffers as bytes, and NCCL's arguments.
pub struct HostCall<'a> {
    /// Out of place, the send buffer; in place `None`: the send region lies in `buf`, at
    /// NCCL's in-place offset (`common`'s `Collective::in_place`).
    pub send: Option<&'a [u8]>,
    /// The receive buffer; in place, the one buffer.
    pub buf: &'a mut [u8],
    /// NCCL's `count` argument.
    pub count: usize,
    /// The root (rooted collectives).
    pub root: usize,
    /// The element type's size and the operator's loops.
    pub reduction: Reduction,
}

impl HostCall<'_> {
    /// Bytes per element.
    pub fn elem(&self) -> usize {
        self.reduction.elem
    }

    /// The larger buffer's bytes, by which the tuner sizes a call (as nccl-tests does).
    pub fn bytes(&self) -> usize {
        self.send.map_or(0, <[u8]>::len).max(self.buf.len())
    }
}

/// Runs `func` on this rank: the row of its table the tuner chooses ([`Cpu::choose`]).
/// On one rank there is nobody to talk to: the result is the input (finished: `ncclAvg`
/// of one rank divides by one).
pub fn run(cpu: &Cpu, func: Func, call: HostCall) -> Result<()> {
    let row = cpu.choose(func, call.bytes());
    if cpu.world() == 1 {
        let HostCall {
            send, buf, reduction, ..
        } = call;
        if let Some(src) = send {
            buf.copy_from_slice(&src[..buf.len()]);
        }
        reduction.finish(buf, 1);
        crate::record::wrote(buf);
        return Ok(());
    }
    (row.run)(cpu, call)
}

/// The name of what sends messages tagged `tag` (for the links' mismatch errors).
pub fn named(tag: u8) -> &'static str {
    match Func::from_tag(tag) {
        Some(f) => f.title(),
        None if tag == SEND_RECV_TAG => "send/recv",
        None => "something unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_named() {
        for f in Func::ALL {
            assert_ne!(f.tag(), SEND_RECV_TAG);
            assert_eq!(named(f.tag()), f.title());
        }
        assert_eq!(named(SEND_RECV_TAG), "send/recv");
    }

    #[test]
    fn every_collective_has_one_row_per_algorithm_and_a_ring_shaped_one() {
        for f in Func::ALL {
            let rows = algorithms(f);
            for (i, a) in rows.iter().enumerate() {
                assert!(a.label.starts_with(a.algorithm.name()), "{f}: {}", a.label);
                assert!(rows[i + 1..].iter().all(|b| b.algorithm != a.algorithm), "{f}");
            }
            assert!(rows.iter().any(|r| r.algorithm.is_ring_shaped()), "{f}");
        }
    }
}
