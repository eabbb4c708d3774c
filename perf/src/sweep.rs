//! The sweeps themselves: every pass that `-A` and `-P` ask for, every collective,
//! type and operator, every size ([`sizes`]), and at each size the two placements (out
//! of place, in place) warmed up, timed, combined over ranks ([`combine`]) and checked.
//! What each element must hold is [`crate::check`]'s; what is printed, [`crate::output`]'s.

use crate::args::PerfArgs;
use crate::check::{Expected, start_value};
use crate::fit;
use crate::output::{columns, format_row, single_calls_row};
use anyhow::Result;
use common::collective::Collective;
use common::report::{Perf, PerfRow, Placement, Timing};
use common::session::Session;
use workbook_runtime::element::{DataType, Element, ReduceOp};

/// The sizes of the sweep, in bytes: from `min` to `max`, times `factor` or plus `step`.
pub fn sizes(min: u64, max: u64, factor: Option<u64>, step: Option<u64>) -> Vec<u64> {
    let mut out = vec![];
    let mut size = min;
    while size <= max {
        out.push(size);
        let next = match factor {
            Some(f) => size.checked_mul(f),
            None => size.checked_add(step.unwrap_or(1 << 20)),
        };
        match next {
            Some(n) if n > size && out.len() < 10_000 => size = n,
            _ => break,
        }
    }
    out
}

/// Combines every rank's seconds as `-a` says (nccl-tests: 0 = rank 0, 1 = mean, 2 = min, 3 = max).
pub fn combine(times: &[f64], average: u8) -> f64 {
    match average {
        0 => times[0],
        2 => times.iter().copied().fold(f64::INFINITY, f64::min),
        3 => times.iter().copied().fold(0.0, f64::max),
        _ => times.iter().sum::<f64>() / times.len() as f64,
    }
}

/// Every sweep `args` asks for (-A, -P, --coll, -d, -o), on the session's communicator (the
/// world's, or inside [`Session::on`] a split's): the tables, and what each measured.
pub(crate) fn sweeps(session: &mut Session, args: &PerfArgs, memcpy_gbps: f64) -> Result<Vec<Perf>> {
    // -A: every value checked before anything runs, then one pass per value.
    let algos: Vec<Option<&str>> = match args.algos.is_empty() {
        true => vec![None],
        false => args.algos.iter().map(|a| Some(a.as_str())).collect(),
    };
    for algo in algos.iter().filter(|a| a.is_some()) {
        session.check_per_sweep(*algo, None)?;
    }
    // -P likewise, inside each -A value.
    let protos: Vec<Option<&str>> = match args.protos.is_empty() {
        true => vec![None],
        false => args.protos.iter().map(|p| Some(p.as_str())).collect(),
    };
    for proto in protos.iter().filter(|p| p.is_some()) {
        session.check_per_sweep(None, *proto)?;
    }
    let mut sweeps = vec![];
    let passes = algos.iter().flat_map(|a| protos.iter().map(move |p| (*a, *p)));
    // On NCCL each value gets a communicator that NCCL started under it.
    let nccl = session.backend_name() == "nccl";
    let said = |flag: &str, var: &str, value: &str| match nccl {
        true => format!("#\n# {flag} {value}: every sweep below on a communicator NCCL started under {var}={value}"),
        false => format!("#\n# {flag} {value}: every sweep below as {var}={value} would run it"),
    };
    for (algo, proto) in passes {
        session.run_as(algo, proto)?;
        if let Some(a) = algo {
            session.say(&said("-A", "NCCL_ALGO", a));
        }
        if let Some(p) = proto {
            session.say(&said("-P", "NCCL_PROTO", p));
        }
        for coll in args.coll.iter() {
            let ops = if coll.reduces() {
                args.redop.to_vec()
            } else {
                vec![ReduceOp::Sum]
            };
            for datatype in args.datatype.iter() {
                for op in &ops {
                    let sweep = Sweep {
                        coll,
                        op: *op,
                        root: if coll.rooted() { args.root.unwrap_or(0) } else { 0 },
                    };
                    let mut perf = match datatype {
                        DataType::Float => sweep.run::<f32>(session, args, memcpy_gbps)?,
                        DataType::Double => sweep.run::<f64>(session, args, memcpy_gbps)?,
                        DataType::Int32 => sweep.run::<i32>(session, args, memcpy_gbps)?,
                        DataType::Half => sweep.run::<half::f16>(session, args, memcpy_gbps)?,
                        DataType::Bfloat16 => sweep.run::<half::bf16>(session, args, memcpy_gbps)?,
                    };
                    perf.nccl_algo = algo.map(String::from);
                    perf.nccl_proto = proto.map(String::from);
                    if args.fit {
                        perf.fit = fit::fit(&perf);
                        perf.fits = fit::by_run(&perf);
                        let costs = session.nccl_costs(coll);
                        perf.nccl_costs = costs.clone().unwrap_or_default();
                        let why_none = match (session.communicator().world(), workbook_nccl::nccl_log::captured()) {
                            (1, _) => "one rank: NCCL tunes nothing",
                            (_, false) => "NCCL_DEBUG is yours: NCCL printed its TUNING table where you asked for it",
                            (_, true) => "NCCL printed no TUNING table on this rank",
                        };
                        let nccl = fit::nccl_lines(&perf, costs.is_some(), why_none);
                        for line in fit::lines(&perf).into_iter().chain(nccl) {
                            session.say(&line);
                        }
                    }
                    sweeps.push(perf);
                }
            }
        }
    }
    if !args.protos.is_empty() {
        session.allow_protocols(None)?;
    }
    if !args.algos.is_empty() {
        session.allow_algorithms(None)?;
        if args.fit {
            for line in fit::crossings(&sweeps) {
                session.say(&line);
            }
        }
    }
    Ok(sweeps)
}

/// One sweep: a collective, an operator and a root, over every size.
pub(crate) struct Sweep {
    pub(crate) coll: &'static Collective,
    pub(crate) op: ReduceOp,
    pub(crate) root: usize,
}

impl Sweep {
    fn run<T: Element>(&self, session: &mut Session, args: &PerfArgs, memcpy_gbps: f64) -> Result<Perf> {
        // The communicator's ranks: the world's, or a split's (NCCL_TESTS_SPLIT).
        let (coll, world) = (self.coll, session.communicator().world());
        if coll.rooted() {
            session.ensure_rank(self.root, "--root")?;
        }
        columns(session, self, T::TYPE);
        let mut perf = Perf {
            op: coll.name().into(),
            datatype: T::TYPE.name().into(),
            redop: self.redop().into(),
            memcpy_gbps,
            ..Perf::default()
        };
        // nccl-tests sizes a collective by its larger buffer, rounded down to what the
        // collective can split (all-gather: a multiple of the ranks).
        let per = {
            let (s, r) = (coll.counts)(1, world);
            s.max(r)
        };
        let mut in_core_cache = false;
        for bytes in sizes(args.min_bytes, args.max_bytes, args.step_factor, args.step_bytes) {
            let elements = (bytes as usize / size_of::<T>() / per).max(1) * per;
            let mut row = PerfRow {
                size: elements * size_of::<T>(),
                count: elements,
                datatype: T::TYPE.name().into(),
                redop: self.redop().into(),
                root: if coll.rooted() { self.root as i64 } else { -1 },
                ..PerfRow::default()
            };
            let count = elements / per;
            // On the CPU backend: the first size whose buffers fill the room this rank's
            // share of the host's last-level cache has for them (3/4 of it:
            // `cache_room`); they run from memory from there.
            let buffers = {
                let (s, r) = (coll.counts)(count, world);
                (s + r) * size_of::<T>()
            };
            if let (Some(share), None) = (session.cache_share(), perf.out_of_cache_from)
                && buffers >= workbook_cpu::comm::cache_room(share)
            {
                perf.out_of_cache_from = Some(row.size);
                perf.cache_share_bytes = Some(share);
            }
            // And the first whose buffers outgrow its share of its core's own cache,
            // where an earlier size's fit in it.
            if let Some(share) = session.core_cache_share() {
                if buffers <= share {
                    in_core_cache = true;
                } else if in_core_cache && perf.out_of_core_cache_from.is_none() {
                    perf.out_of_core_cache_from = Some(row.size);
                    perf.core_cache_share_bytes = Some(share);
                }
            }
            row.out_of_place = self.measure::<T>(session, args, count, false)?;
            row.in_place = self.measure::<T>(session, args, count, true)?;
            session.say(&format_row(&row));
            if let Some(line) = single_calls_row(&row, args.iters) {
                session.say(&line);
            }
            perf.rows.push(row);
        }
        let places = || perf.rows.iter().flat_map(|r| [&r.out_of_place, &r.in_place]);
        perf.wrong = places().filter_map(|p| p.wrong).sum();
        let n = places().count().max(1);
        perf.avg_busbw = places().map(|p| p.busbw).sum::<f64>() / n as f64;
        let state = if perf.wrong == 0 { "OK" } else { "FAILED" };
        session.say(&format!("# Out of bounds values : {} {state}", perf.wrong));
        session.say(&format!("# Avg bus bandwidth    : {:.4} ", perf.avg_busbw));
        session.say("#");
        Ok(perf)
    }

    /// nccl-tests' redop column: the operator, or `none`.
    fn redop(&self) -> &'static str {
        match self.coll.reduces() {
            true => self.op.name(),
            false => "none",
        }
    }

    /// This rank's buffers at the start: the send buffer and the receive buffer (out of
    /// place), or the one buffer (in place: zeros, with the send region filled).
    fn start<T: Element>(&self, rank: usize, world: usize, count: usize, in_place: bool) -> (Vec<T>, Vec<T>) {
        let (s, r) = (self.coll.counts)(count, world);
        let mine: Vec<T> = (0..s).map(|i| T::from_f64(start_value(i, rank, self.op))).collect();
        if !in_place {
            return (mine, vec![T::default(); r]);
        }
        let mut one = vec![T::default(); s.max(r)];
        let at = (self.coll.in_place)(count, world, rank).0;
        one[at..at + s].copy_from_slice(&mine);
        (vec![], one)
    }

    /// One placement at one size: warm up, time, check.
    fn measure<T: Element>(&self, s: &mut Session, args: &PerfArgs, count: usize, in_place: bool) -> Result<Placement> {
        // This rank in the communicator the sweep runs on (a split's, NCCL_TESTS_SPLIT).
        let (rank, world) = (s.communicator().rank(), s.communicator().world());
        let (mine, initial) = self.start::<T>(rank, world, count, in_place);
        let send = match in_place {
            true => None,
            false => Some(s.from_host(mine)?),
        };
        let mut recv = s.from_host(initial.clone())?;
        let (coll, root, op) = (self.coll, self.root, self.op);
        let once = |s: &mut Session, recv: &mut common::Buffer<T>| s.run(coll, send.as_ref(), recv, root, op);

        // Steps sent by each protocol during the timed runs: the one that ran shows.
        let sent = || workbook_cpu::transport::protocol::Protocol::ALL.map(workbook_cpu::transport::shm::sent_by);
        let before = sent();
        let runs = s.time_runs(args.iters, args.warmup, |s| once(s, &mut recv))?;
        let after = sent();
        let mut times = runs.means;
        let algo = s.algorithm().to_string();
        let ran = s.protocol();
        // On NCCL, NCCL chooses both: `algo` says so, the protocol stays empty.
        let proto = ran.map_or("", |p| p.name()).to_string();
        let mine = ran.map_or(0, |p| after[p as usize] - before[p as usize]);
        let all = s.share_f64(mine as f64, "steps sent by the protocol")?;
        let proto_steps = ran.map(|_| all.iter().sum::<f64>() as u64);
        if args.cputime == 1 {
            let issued = s.issue_time();
            times = s.share_f64(issued, "every rank's time to issue the calls")?;
        }
        let bytes = initial.len().max(send.as_ref().map_or(0, |b| b.len())) * size_of::<T>();
        let t = Timing::new((coll.bus_factor)(world), bytes, combine(&times, args.average));

        // The check, as nccl-tests' -c: fresh data, one more run, every element compared.
        let wrong = if args.check == 0 {
            None
        } else {
            let expect = Expected::<T>::new(self, world, count, rank, in_place);
            let mut wrong = 0u64;
            for _ in 0..args.check {
                let mut fresh = s.from_host(initial.clone())?;
                once(s, &mut fresh)?;
                let mut got = s.to_host(&fresh)?;
                // The test hook names world ranks.
                common::session::corrupt_for_tests(s.rank(), &mut got);
                wrong += got
                    .iter()
                    .enumerate()
                    .filter(|(i, v)| !v.matches(expect.at(*i, initial[*i])))
                    .count() as u64;
            }
            // Every rank's count, over every communicator of a split, as nccl-tests sums
            // #wrong over MPI_COMM_WORLD.
            let all = s.share_f64(wrong as f64, "count of wrong elements")?;
            Some(all.iter().sum::<f64>() as u64)
        };
        Ok(Placement {
            time_us: t.seconds * 1e6,
            algbw: t.algbw,
            busbw: t.busbw,
            wrong,
            algo,
            proto,
            proto_steps,
            median_us: runs.single.map(|c| c.median_us),
            p99_us: runs.single.map(|c| c.p99_us),
            slept: runs.single.and_then(|c| c.slept),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::collective;

    #[test]
    fn sweeps_follow_nccl_tests() {
        assert_eq!(sizes(4, 64, Some(2), None), vec![4, 8, 16, 32, 64]);
        assert_eq!(sizes(4, 100, Some(4), None), vec![4, 16, 64]);
        assert_eq!(sizes(1 << 20, 3 << 20, None, None), vec![1 << 20, 2 << 20, 3 << 20]);
        assert_eq!(sizes(10, 25, None, Some(5)), vec![10, 15, 20, 25]);
        assert_eq!(sizes(32, 8, Some(2), None), Vec::<u64>::new());
        assert_eq!(sizes(4, 4, Some(2), None), vec![4]);
        assert_eq!(sizes(u64::MAX / 2, u64::MAX, Some(4), None).len(), 1); // no overflow, no endless sweep
        assert_eq!(sizes(u64::MAX - 1, u64::MAX, None, Some(8)).len(), 1);
    }

    #[test]
    fn bandwidths_are_nccl_tests_formulas() {
        // algbw = bytes / 1e9 / seconds: 100 MiB in 50 ms; all_reduce on 4 ranks × 1.5.
        let t = Timing::new((collective::ALL_REDUCE.bus_factor)(4), 100 << 20, 0.05);
        assert!((t.algbw - 2.097152).abs() < 1e-9 && (t.busbw - 3.145728).abs() < 1e-9);
    }

    #[test]
    fn times_combine_as_the_average_flag_says() {
        let t = [3.0, 1.0, 2.0];
        assert_eq!([0, 1, 2, 3].map(|a| combine(&t, a)), [3.0, 2.0, 1.0, 3.0]);
    }
}
