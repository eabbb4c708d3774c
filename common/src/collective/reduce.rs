//! Reduce (`ncclReduce`): the element-wise reduction of every rank's buffer, on the root
//! only. The other ranks' receive buffers are not written.

use super::{Collective, Func, Shape, Source, once, same, whole};

/// Reduce.
pub const REDUCE: Collective = Collective {
    func: Func::Reduce,
    counts: same,
    in_place: whole,
    bus_factor: once,
    source,
};

fn source(shape: &Shape, rank: usize, i: usize) -> Source {
    match rank == shape.root {
        true => Source::Reduced { index: i },
        false => Source::Unchanged,
    }
}
