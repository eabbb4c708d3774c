//! The check, as nccl-tests' `-c`: the values every rank's send buffer starts from
//! ([`start_value`]: small whole numbers, exact in every type), and what each element of
//! a result must then hold ([`Expected`], from the collective's sources), so that every
//! element of every checked run is compared.

use crate::sweep::Sweep;
use common::collective::{Collective, Shape, Source};
use workbook_runtime::element::{Element, ReduceOp};

/// The value element `i` of `rank`'s send buffer starts from: small whole numbers, so
/// that results over any number of ranks are exact in every type (products of 1s and 2s
/// at most 2^8, sums at most 13 × 8) and every element can be checked. The pattern
/// repeats every 13 elements.
pub(crate) fn start_value(i: usize, rank: usize, op: ReduceOp) -> f64 {
    let v = (i * 7 + rank * 3) % 13;
    match op {
        ReduceOp::Prod => (v % 2 + 1) as f64,
        _ => (v + 1) as f64,
    }
}

/// What each element of a rank's result buffer must hold, from its collective's
/// [`Collective::source`]: every start value and every reduction, for the 13 positions
/// of the repeating pattern.
pub(crate) struct Expected<T> {
    coll: &'static Collective,
    shape: Shape,
    rank: usize,
    /// Where the receive region starts in the buffer checked (in place: NCCL's layout).
    recv_at: usize,
    recv_len: usize,
    start: Vec<Vec<T>>,
    reduced: Vec<T>,
}

impl<T: Element> Expected<T> {
    pub(crate) fn new(sweep: &Sweep, world: usize, count: usize, rank: usize, in_place: bool) -> Expected<T> {
        let (coll, op) = (sweep.coll, sweep.op);
        let start: Vec<Vec<T>> = (0..world)
            .map(|r| (0..13).map(|i| T::from_f64(start_value(i, r, op))).collect())
            .collect();
        let reduced = (0..13)
            .map(|i| {
                // Integers' average truncates: from_f64 does (`as i32`).
                T::from_f64(op.over((0..world).map(|r| start_value(i, r, op))))
            })
            .collect();
        let recv_at = if in_place {
            (coll.in_place)(count, world, rank).1
        } else {
            0
        };
        Expected {
            coll,
            shape: Shape {
                count,
                ranks: world,
                root: sweep.root,
            },
            rank,
            recv_at,
            recv_len: (coll.counts)(count, world).1,
            start,
            reduced,
        }
    }

    /// Element `i` of the buffer checked, which held `before` at the start.
    pub(crate) fn at(&self, i: usize, before: T) -> T {
        let Some(j) = i.checked_sub(self.recv_at).filter(|j| *j < self.recv_len) else {
            return before;
        };
        match (self.coll.source)(&self.shape, self.rank, j) {
            Source::From { rank, index } => self.start[rank][index % 13],
            Source::Reduced { index } => self.reduced[index % 13],
            Source::Unchanged => before,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::collective;

    #[test]
    fn expected_values_follow_each_collectives_sources() {
        let sweep = |coll, op, root| Sweep { coll, op, root };
        // all-reduce avg of int32 on 3 ranks: the sum divided, truncated.
        let e = Expected::<i32>::new(&sweep(&collective::ALL_REDUCE, ReduceOp::Avg, 0), 3, 26, 1, false);
        for i in 0..26 {
            let sum: f64 = (0..3).map(|r| start_value(i, r, ReduceOp::Avg)).sum();
            assert_eq!(e.at(i, 0), (sum / 3.0) as i32);
        }
        // all-gather in place on 4 ranks: block j is rank j's.
        let e = Expected::<f32>::new(&sweep(&collective::ALL_GATHER, ReduceOp::Sum, 0), 4, 5, 2, true);
        assert_eq!(e.at(7, -1.0), start_value(2, 1, ReduceOp::Sum) as f32);
        // reduce-scatter in place: only block `rank` is written.
        let e = Expected::<f32>::new(&sweep(&collective::REDUCE_SCATTER, ReduceOp::Max, 0), 4, 5, 2, true);
        assert_eq!(e.at(3, -1.0), -1.0);
        let max = (0..4).map(|r| start_value(11, r, ReduceOp::Max)).fold(0.0, f64::max);
        assert_eq!(e.at(11, -1.0), max as f32);
        // reduce: off the root, nothing is written.
        let e = Expected::<f32>::new(&sweep(&collective::REDUCE, ReduceOp::Prod, 2), 3, 4, 1, false);
        assert_eq!(e.at(3, -1.0), -1.0);
        // The pattern repeats every 13 elements, so checking by `i % 13` is exact.
        assert!((0..100).all(|i| start_value(i, 3, ReduceOp::Sum) == start_value(i % 13, 3, ReduceOp::Sum)));
    }
}
