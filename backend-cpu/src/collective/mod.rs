//! The collectives on the CPU backend: one folder per collective, one file per algorithm,
//! as NCCL (`src/device/all_reduce.h`: `runRing`, `runTreeSplit`) and Open MPI's `coll`
//! have one function per algorithm. Each folder's `run` asks the tuner
//! ([`crate::tuner::choose`], the one place that decides) and runs what it answers;
//! [`run`] picks the folder by the collective.
//!
//! [`ring`], [`direct`] and [`single_copy`] hold the steps several collectives share;
//! [`tree`] builds NCCL's double binary tree; [`packed`] packs a group's collectives of
//! one kind into one call.

pub mod all_gather;
pub mod all_reduce;
pub mod all_to_all;
pub mod broadcast;
mod direct;
pub mod packed;
pub mod reduce;
pub mod reduce_scatter;
mod ring;
mod single_copy;
pub mod tree;

use crate::SEND_RECV_TAG;
use crate::cpu::Cpu;
use crate::element::Reduction;
use anyhow::Result;
use workbook_runtime::Func;

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
}

/// Runs `func` on this rank: the algorithm the tuner chooses for it.
pub fn run(cpu: &Cpu, func: Func, call: HostCall) -> Result<()> {
    match func {
        Func::Broadcast => broadcast::run(cpu, call),
        Func::Reduce => reduce::run(cpu, call),
        Func::AllReduce => all_reduce::run(cpu, call),
        Func::AllGather => all_gather::run(cpu, call),
        Func::ReduceScatter => reduce_scatter::run(cpu, call),
        Func::AllToAll => all_to_all::run(cpu, call),
    }
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
}
