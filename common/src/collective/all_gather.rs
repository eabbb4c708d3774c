//! All-gather (`ncclAllGather`): every rank contributes `count` elements; every rank
//! receives all of them, rank i's at block i (`n × count` elements).

use super::{Collective, Func, Shape, Source, all_but_own};

/// All-gather.
pub const ALL_GATHER: Collective = Collective {
    func: Func::AllGather,
    counts: |count, ranks| (count, ranks * count),
    // NCCL's in-place all-gather: sendbuff == recvbuff + rank × count.
    in_place: |count, _ranks, rank| (rank * count, 0),
    bus_factor: all_but_own,
    source,
};

fn source(shape: &Shape, _rank: usize, i: usize) -> Source {
    Source::From {
        rank: i / shape.count.max(1),
        index: i % shape.count.max(1),
    }
}
