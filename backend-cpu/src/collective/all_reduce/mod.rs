//! All-reduce (`ncclAllReduce`): every rank's buffer becomes the element-wise reduction
//! (sum, product, max, min or average) of every rank's buffer.
//!
//! Its algorithms on the CPU backend, one file each, and their table. The ring: the
//! buffer is cut into `n` chunks; in the reduce-scatter, each of `n - 1` steps sends one
//! chunk right and reduces the chunk arriving from the left into ours; after it, rank r
//! holds the full result of chunk r+1. The all-gather then passes the finished chunks
//! around the ring, `n - 1` steps again, until every rank has every chunk. Each rank sends
//! 2(n-1)/n of the buffer in all: nccl-tests' busbw factor.
//!
//! When every link of the ring shares memory the ring runs piece by piece, as NCCL runs
//! it ([`pipelined`]), which saves the buffer's partial results; over TCP, or under
//! `--steps` on two ranks, step by step, as the lesson draws it ([`ring`]). A small
//! buffer skips the ring altogether ([`direct`]), a large one on one host is read where
//! it lies, in the other ranks' memory ([`single_copy`]), and on many nodes NCCL's double
//! binary tree takes over ([`tree`]).

pub mod direct;
pub mod pipelined;
pub mod ring;
pub mod single_copy;
pub mod tree;

use super::{Row, always, reads_peers, small};
use crate::tuner::Algorithm;

/// All-reduce's algorithms, as the tuner weighs them ([`crate::tuner::choose`]); of the
/// ring-shaped ones, the first that can run is the ring.
pub const ALGORITHMS: &[Row] = &[
    Row {
        algorithm: Algorithm::Direct,
        label: "direct: every rank's buffer to every rank (a small message)",
        can: small,
        run: |cpu, c| direct::all_reduce(cpu, c.send, c.buf, c.reduction),
    },
    Row {
        algorithm: Algorithm::SingleCopy,
        label: "single-copy: each rank reduces its chunk of every rank's buffer, then copies the others'",
        can: reads_peers,
        run: |cpu, c| single_copy::all_reduce(cpu, c.send, c.buf, c.reduction),
    },
    Row {
        algorithm: Algorithm::RingPipelined,
        label: "ring-pipelined: the ring piece by piece (pipelined)",
        // Links that hold a piece while the receiver is busy; --steps on two ranks shows
        // the ring step by step, as the lesson draws it.
        can: |facts, _| facts.ring_in_memory && (facts.ranks > 2 || !facts.steps),
        run: |cpu, c| pipelined::all_reduce(cpu, c.send, c.buf, c.reduction),
    },
    Row {
        algorithm: Algorithm::Ring,
        label: "ring: the ring step by step",
        can: always,
        run: |cpu, c| ring::all_reduce(cpu, c.send, c.buf, c.reduction),
    },
    Row {
        algorithm: Algorithm::Tree,
        label: "tree: up NCCL's double binary tree, reduced, then down (half the buffer per tree)",
        can: always,
        run: |cpu, c| tree::all_reduce(cpu, c.send, c.buf, c.reduction),
    },
];
