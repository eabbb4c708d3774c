//! Reduce (`ncclReduce`): the element-wise reduction of every rank's buffer, on the root
//! only. The other ranks' receive buffers are not written.
//!
//! Its algorithms on the CPU backend, one file each, and their table: the [`chain`]
//! round the ring, or, on one host and between two sizes, the root reading every rank's
//! buffer where it lies ([`single_copy`]).

pub mod chain;
pub mod single_copy;

use super::{Row, always, reads_peers};
use crate::tuner::Algorithm;

/// Reduce's algorithms, as the tuner weighs them ([`crate::tuner::choose`]).
pub const ALGORITHMS: &[Row] = &[
    Row {
        algorithm: Algorithm::SingleCopy,
        label: "single-copy: the root reduces every rank's buffer straight from its memory",
        can: reads_peers,
        run: |cpu, c| single_copy::reduce(cpu, c.send, c.buf, c.root, c.reduction),
    },
    Row {
        algorithm: Algorithm::Chain,
        label: "chain: round the ring to the root, piece by piece (pipelined)",
        can: always,
        run: |cpu, c| chain::reduce(cpu, c.send, c.buf, c.root, c.reduction),
    },
];
