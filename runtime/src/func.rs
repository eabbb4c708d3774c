//! Which collective: NCCL's `ncclFunc_t` (`src/include/device.h`), the one name every
//! layer uses for it. The CPU backend's tuner and algorithms match on it, the NCCL backend
//! picks the NCCL call by it, and `common`'s descriptions (sizes, bus bandwidth, the
//! check) are keyed by it: a new collective is a new variant, and the compiler finds
//! every `match` that must learn it.

/// One of NCCL's collectives. NCCL has no all-to-all function: it groups `ncclSend` and
/// `ncclRecv` (nccl-tests' `alltoall.cu` does so); the workbook names it as the others.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Func {
    /// `ncclBroadcast`: the root's buffer to every rank.
    Broadcast,
    /// `ncclReduce`: every rank's buffer reduced into the root's.
    Reduce,
    /// `ncclAllReduce`: every rank gets the reduction of every rank's buffer.
    AllReduce,
    /// `ncclAllGather`: every rank gets every rank's block.
    AllGather,
    /// `ncclReduceScatter`: rank r gets block r of the reduction.
    ReduceScatter,
    /// Grouped `ncclSend`/`ncclRecv`: block j of rank i goes to block i of rank j.
    AllToAll,
}

impl Func {
    /// Every collective, in the order the lessons teach them and the benchmark lists them.
    pub const ALL: [Func; 6] = [
        Func::Broadcast,
        Func::Reduce,
        Func::AllReduce,
        Func::AllGather,
        Func::ReduceScatter,
        Func::AllToAll,
    ];

    /// nccl-tests' name: `all_gather` (`--coll all_gather`, the JSON report).
    pub fn name(self) -> &'static str {
        match self {
            Func::Broadcast => "broadcast",
            Func::Reduce => "reduce",
            Func::AllReduce => "all_reduce",
            Func::AllGather => "all_gather",
            Func::ReduceScatter => "reduce_scatter",
            Func::AllToAll => "alltoall",
        }
    }

    /// As a person says it: `all-gather`.
    pub fn title(self) -> &'static str {
        match self {
            Func::Broadcast => "broadcast",
            Func::Reduce => "reduce",
            Func::AllReduce => "all-reduce",
            Func::AllGather => "all-gather",
            Func::ReduceScatter => "reduce-scatter",
            Func::AllToAll => "all-to-all",
        }
    }

    /// NCCL's call: `ncclAllGather` (all-to-all: its grouped `ncclSend`/`ncclRecv`).
    pub fn nccl_name(self) -> &'static str {
        match self {
            Func::Broadcast => "ncclBroadcast",
            Func::Reduce => "ncclReduce",
            Func::AllReduce => "ncclAllReduce",
            Func::AllGather => "ncclAllGather",
            Func::ReduceScatter => "ncclReduceScatter",
            Func::AllToAll => "ncclSend/ncclRecv",
        }
    }

    /// As NCCL's `ncclFuncStr` and its `TUNING` lines name it (`AllReduce`), and as
    /// per-collective `NCCL_ALGO` lists do (`allreduce:tree`); all-to-all, which NCCL runs as
    /// sends and receives and does not tune, is the CPU backend's own `AllToAll`.
    pub fn nccl_func(self) -> &'static str {
        match self {
            Func::Broadcast => "Broadcast",
            Func::Reduce => "Reduce",
            Func::AllReduce => "AllReduce",
            Func::AllGather => "AllGather",
            Func::ReduceScatter => "ReduceScatter",
            Func::AllToAll => "AllToAll",
        }
    }

    /// What its messages are tagged with on the CPU backend's links: two ranks in two
    /// different collectives get an error instead of mixing their data.
    pub fn tag(self) -> u8 {
        match self {
            Func::Broadcast => 1,
            Func::AllReduce => 2,
            Func::Reduce => 3,
            Func::AllGather => 4,
            Func::ReduceScatter => 5,
            Func::AllToAll => 6,
        }
    }

    /// The collective whose messages carry `tag`, if any.
    pub fn from_tag(tag: u8) -> Option<Func> {
        Func::ALL.into_iter().find(|f| f.tag() == tag)
    }

    /// Whether it has a root (broadcast, reduce).
    pub fn rooted(self) -> bool {
        matches!(self, Func::Broadcast | Func::Reduce)
    }

    /// Whether it takes a reduction operator (reduce, all-reduce, reduce-scatter).
    pub fn reduces(self) -> bool {
        matches!(self, Func::Reduce | Func::AllReduce | Func::ReduceScatter)
    }

    /// The collective nccl-tests names `name` (`all_gather`), if any.
    pub fn from_name(name: &str) -> Option<Func> {
        Func::ALL.into_iter().find(|f| f.name() == name)
    }

    /// Its place in [`Func::ALL`], for tables indexed by collective.
    pub fn index(self) -> usize {
        self as usize
    }
}

impl std::fmt::Display for Func {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.title())
    }
}

#[cfg(test)]
mod tests {
    use super::Func;

    #[test]
    fn names_and_tags_are_unique_and_round_trip() {
        for (i, a) in Func::ALL.into_iter().enumerate() {
            assert_eq!(a.index(), i);
            assert_eq!(Func::from_tag(a.tag()), Some(a));
            assert_eq!(Func::from_name(a.name()), Some(a));
            for b in &Func::ALL[i + 1..] {
                assert_ne!(a.tag(), b.tag());
                assert_ne!(a.name(), b.name());
            }
        }
        assert_eq!(Func::from_tag(0), None);
    }
}
