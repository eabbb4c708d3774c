//! All-reduce (`ncclAllReduce`): every rank's buffer becomes the element-wise reduction
//! (sum, product, max, min or average) of every rank's buffer.

use super::{Collective, Func, Shape, Source, same, whole};

/// All-reduce.
pub const ALL_REDUCE: Collective = Collective {
    func: Func::AllReduce,
    counts: same,
    in_place: whole,
    bus_factor,
    source,
};

/// Each rank sends (and receives) 2(n-1)/n of the buffer: nccl-tests' factor.
fn bus_factor(ranks: usize) -> f64 {
    match ranks {
        0 => 0.0,
        n => 2.0 * (n - 1) as f64 / n as f64,
    }
}

fn source(_: &Shape, _rank: usize, i: usize) -> Source {
    Source::Reduced { index: i }
}
