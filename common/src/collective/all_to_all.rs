//! All-to-all: every rank's buffer is `n` blocks of `count` elements; block j of rank i
//! goes to rank j, where it lands as block i. NCCL has no call for it: programs (and
//! nccl-tests' `alltoall`) group one `ncclSend` and one `ncclRecv` per peer.

use super::{Collective, Func, Shape, Source, all_but_own, whole};

/// All-to-all.
pub const ALL_TO_ALL: Collective = Collective {
    func: Func::AllToAll,
    counts: |count, ranks| (ranks * count, ranks * count),
    in_place: whole,
    bus_factor: all_but_own,
    source,
};

fn source(shape: &Shape, rank: usize, i: usize) -> Source {
    let count = shape.count.max(1);
    Source::From {
        rank: i / count,
        index: rank * count + i % count,
    }
}
