//! Reduce-scatter (`ncclReduceScatter`): every rank contributes `n × count` elements;
//! rank i receives block i of their element-wise reduction (`count` elements).

use super::{Collective, Func, Shape, Source, all_but_own};

/// Reduce-scatter.
pub const REDUCE_SCATTER: Collective = Collective {
    func: Func::ReduceScatter,
    counts: |count, ranks| (ranks * count, count),
    // NCCL's in-place reduce-scatter: recvbuff == sendbuff + rank × count.
    in_place: |count, _ranks, rank| (0, rank * count),
    bus_factor: all_but_own,
    source,
};

fn source(shape: &Shape, rank: usize, i: usize) -> Source {
    Source::Reduced {
        index: rank * shape.count + i,
    }
}
