//! Reduce-scatter (`ncclReduceScatter`): every rank contributes `n × count` elements;
//! rank i receives block i of their element-wise reduction (`count` elements).
//!
//! Its algorithms on the CPU backend, one file each, and their table: a small buffer
//! [`direct`], every block straight to the rank that reduces it; else the [`ring`], or on
//! one host each rank reduces its block straight from the others' buffers
//! ([`single_copy`]).

pub mod direct;
pub mod ring;
pub mod single_copy;

use super::{Row, always, reads_peers, small};
use crate::tuner::Algorithm;

/// Reduce-scatter's algorithms, as the tuner weighs them ([`crate::tuner::choose`]).
pub const ALGORITHMS: &[Row] = &[
    Row {
        algorithm: Algorithm::Direct,
        label: "direct: every block straight to the rank that reduces it (a small message)",
        can: small,
        run: |cpu, c| direct::reduce_scatter(cpu, c.send, c.buf, c.count * c.elem(), c.reduction),
    },
    Row {
        algorithm: Algorithm::SingleCopy,
        label: "single-copy: each rank reduces its block of every rank's buffer",
        can: reads_peers,
        run: single_copy::reduce_scatter,
    },
    Row {
        algorithm: Algorithm::Ring,
        label: "ring: the blocks pass round the ring, one per step",
        can: always,
        run: |cpu, c| ring::reduce_scatter(cpu, c.send, c.buf, c.count * c.elem(), c.reduction),
    },
];
