//! Broadcast (`ncclBroadcast`): the root's buffer is copied into every rank's buffer.

use super::{Collective, Func, Shape, Source, once, same, whole};

/// Broadcast.
pub const BROADCAST: Collective = Collective {
    func: Func::Broadcast,
    counts: same,
    in_place: whole,
    bus_factor: once,
    source,
};

fn source(shape: &Shape, _rank: usize, i: usize) -> Source {
    Source::From {
        rank: shape.root,
        index: i,
    }
}
