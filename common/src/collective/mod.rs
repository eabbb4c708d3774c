//! The collectives as the benchmark and the check see them, one file each, as nccl-tests
//! has one file per collective (`all_gather.cu`) filling a struct of functions
//! (`testColl`).
//!
//! A [`Collective`] holds what is that collective's own beyond its identity ([`Func`]):
//! its buffer sizes for NCCL's `count` argument, its in-place layout, its bus-bandwidth
//! factor and where each element of the result comes from (for the check). The session,
//! the benchmark, the check and the reports read from it. How it runs is the backends':
//! on the CPU backend the algorithms of `workbook_cpu::collective` (one file each, and
//! `workbook_cpu::tuner::choose`, the one place that decides), on GPUs the NCCL call of
//! `workbook_nccl::collectives`.
//!
//! Adding a collective: a [`Func`], one file here and one line in [`ALL`], its algorithms
//! on the CPU backend, its NCCL call, and its lesson (CONTRIBUTING.md's "Adding a
//! collective" lists the rest; "Adding an algorithm" too).

pub mod all_gather;
pub mod all_reduce;
pub mod all_to_all;
pub mod broadcast;
pub mod reduce;
pub mod reduce_scatter;

pub use all_gather::ALL_GATHER;
pub use all_reduce::ALL_REDUCE;
pub use all_to_all::ALL_TO_ALL;
pub use broadcast::BROADCAST;
pub use reduce::REDUCE;
pub use reduce_scatter::REDUCE_SCATTER;
pub use workbook_runtime::Func;

/// Every collective, in the order the lessons teach them and the benchmark lists them
/// ([`Func::ALL`]'s).
pub const ALL: [&Collective; 6] = [
    &BROADCAST,
    &REDUCE,
    &ALL_REDUCE,
    &ALL_GATHER,
    &REDUCE_SCATTER,
    &ALL_TO_ALL,
];

/// One collective: what nccl-tests' `testColl` holds. Its identity ([`Func`]: names,
/// tag, root, operator) is the one every layer shares; how it runs is each backend's
/// (`workbook_cpu::collective::run`, `workbook_nccl::collectives::run`).
#[derive(Debug)]
pub struct Collective {
    /// Which collective (NCCL's `ncclFunc_t`).
    pub func: Func,
    /// The send and receive buffers' elements for NCCL's `count` argument on `ranks`
    /// ranks (all-gather: `count` and `ranks × count`).
    pub counts: fn(count: usize, ranks: usize) -> (usize, usize),
    /// In place, where the send and the receive regions start in the one buffer, in
    /// elements, on `rank` (all-gather: `sendbuff == recvbuff + rank × count`).
    pub in_place: fn(count: usize, ranks: usize, rank: usize) -> (usize, usize),
    /// nccl-tests' bus-bandwidth factor on `ranks` ranks: busbw = algbw × factor.
    pub bus_factor: fn(ranks: usize) -> f64,
    /// Where element `i` of `rank`'s receive buffer comes from, afterwards.
    pub source: fn(shape: &Shape, rank: usize, i: usize) -> Source,
}

impl Collective {
    /// The description of `func`.
    pub fn of(func: Func) -> &'static Collective {
        ALL[func.index()]
    }

    /// nccl-tests' name: `all_gather` (`--coll all_gather`, the JSON report).
    pub fn name(&self) -> &'static str {
        self.func.name()
    }

    /// As a person says it: `all-gather`.
    pub fn title(&self) -> &'static str {
        self.func.title()
    }

    /// NCCL's function: `ncclAllGather` (all-to-all: grouped `ncclSend`/`ncclRecv`).
    pub fn nccl_name(&self) -> &'static str {
        self.func.nccl_name()
    }

    /// Whether it has a root (broadcast, reduce).
    pub fn rooted(&self) -> bool {
        self.func.rooted()
    }

    /// Whether it takes a reduction operator (reduce, all-reduce, reduce-scatter).
    pub fn reduces(&self) -> bool {
        self.func.reduces()
    }

    /// The `count` argument NCCL takes for buffers whose larger one has `elements`
    /// (nccl-tests sizes a collective by its larger buffer): `None` if no count fits.
    pub fn count_for(&self, elements: usize, ranks: usize) -> Option<usize> {
        let (s, r) = (self.counts)(1, ranks);
        let per = s.max(r).max(1);
        elements.is_multiple_of(per).then_some(elements / per)
    }

    /// NCCL's `count` argument for a call with a send buffer of `send` elements (`None`:
    /// in place) and a receive buffer of `recv` (in place, the one buffer), or why these
    /// buffers do not fit this collective, in one line.
    pub fn count_of(&self, send: Option<usize>, recv: usize, ranks: usize) -> Result<usize, String> {
        let count = match send {
            Some(send) => self
                .count_for(send.max(recv), ranks)
                .filter(|c| (self.counts)(*c, ranks) == (send, recv)),
            None => self.count_for(recv, ranks),
        };
        count.ok_or_else(|| self.counts_needed(send, recv, ranks))
    }

    /// [`Collective::count_of`]'s line when the buffers do not fit.
    #[cold]
    fn counts_needed(&self, send: Option<usize>, recv: usize, ranks: usize) -> String {
        let (s1, r1) = (self.counts)(1, ranks);
        let per = |k: usize| match k {
            1 => "count".to_string(),
            k => format!("{k} × count"),
        };
        match send {
            Some(send) => format!(
                "{} on {ranks} ranks needs a send buffer of {} and a receive buffer of {} elements; these have \
                 {send} and {recv}",
                self.title(),
                per(s1),
                per(r1)
            ),
            None => format!(
                "{} in place on {ranks} ranks needs a buffer of {} elements; this one has {recv}, not a multiple of {}",
                self.title(),
                per(s1.max(r1)),
                s1.max(r1)
            ),
        }
    }
}

/// The shape of one call, for [`Collective::source`].
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    /// NCCL's `count` argument.
    pub count: usize,
    /// The number of ranks.
    pub ranks: usize,
    /// The root (0 when there is none).
    pub root: usize,
}

/// Where an element of a result comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// A copy of element `index` of `rank`'s send buffer.
    From {
        /// The rank whose send buffer holds it.
        rank: usize,
        /// Its index there.
        index: usize,
    },
    /// The reduction over every rank of element `index` of their send buffers.
    Reduced {
        /// The index, the same in every rank's send buffer.
        index: usize,
    },
    /// Not written: it keeps what it held before (reduce's receive buffer off the root).
    Unchanged,
}

/// The same count for every rank's buffers (broadcast, reduce, all-reduce).
fn same(count: usize, _ranks: usize) -> (usize, usize) {
    (count, count)
}

/// In place, the send and receive regions are the whole buffer.
fn whole(_count: usize, _ranks: usize, _rank: usize) -> (usize, usize) {
    (0, 0)
}

/// The factor of collectives in which each rank's link carries the data once: 1.
fn once(_ranks: usize) -> f64 {
    1.0
}

/// The factor of all-gather, reduce-scatter and all-to-all: (n-1)/n of the data crosses
/// each rank's link.
fn all_but_own(ranks: usize) -> f64 {
    match ranks {
        0 => 0.0,
        n => (n - 1) as f64 / n as f64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_collective_is_its_funcs_description() {
        for (f, c) in Func::ALL.into_iter().zip(ALL) {
            assert_eq!(c.func, f);
            assert_eq!(Collective::of(f).func, f);
        }
    }

    #[test]
    fn bus_factors_follow_nccl_tests() {
        assert_eq!((ALL_REDUCE.bus_factor)(1), 0.0);
        assert_eq!((ALL_REDUCE.bus_factor)(4), 1.5);
        assert_eq!((BROADCAST.bus_factor)(8), 1.0);
        assert_eq!((REDUCE.bus_factor)(8), 1.0);
        for c in [&ALL_GATHER, &REDUCE_SCATTER, &ALL_TO_ALL] {
            assert_eq!((c.bus_factor)(4), 0.75, "{}", c.name());
        }
    }

    #[test]
    fn counts_and_misfits_follow_nccls_arguments() {
        assert_eq!((ALL_GATHER.counts)(3, 4), (3, 12));
        assert_eq!((REDUCE_SCATTER.counts)(3, 4), (12, 3));
        assert_eq!((ALL_TO_ALL.counts)(3, 4), (12, 12));
        assert_eq!(ALL_GATHER.count_for(12, 4), Some(3));
        assert_eq!(ALL_GATHER.count_for(10, 4), None);
        assert_eq!(ALL_REDUCE.count_for(10, 4), Some(10));
        assert_eq!(ALL_GATHER.count_of(Some(3), 12, 4), Ok(3));
        let m = ALL_GATHER.count_of(Some(3), 10, 4).unwrap_err();
        assert!(
            m.contains("all-gather on 4 ranks needs a send buffer of count and a receive buffer of 4 × count"),
            "{m}"
        );
        assert_eq!(REDUCE_SCATTER.count_of(Some(8), 2, 4), Ok(2));
        assert!(ALL_REDUCE.count_of(Some(8), 7, 4).is_err());
        assert_eq!(ALL_GATHER.count_of(None, 12, 4), Ok(3));
        let m = ALL_TO_ALL.count_of(None, 10, 4).unwrap_err();
        assert!(m.contains("not a multiple of 4"), "{m}");
    }

    #[test]
    fn in_place_layouts_are_nccls() {
        assert_eq!((ALL_GATHER.in_place)(3, 4, 2), (6, 0)); // sendbuff = recvbuff + rank·count
        assert_eq!((REDUCE_SCATTER.in_place)(3, 4, 2), (0, 6)); // recvbuff = sendbuff + rank·count
        assert_eq!((ALL_REDUCE.in_place)(3, 4, 2), (0, 0));
    }
}
