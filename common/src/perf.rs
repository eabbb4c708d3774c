//! The benchmark: nccl-tests' `all_reduce_perf` and `broadcast_perf` for this workbook.
//!
//! For each size of a sweep, and for separate send and receive buffers (out of place)
//! and then one buffer (in place): warm-up runs, a barrier, timed runs back to back, the
//! time combined over ranks, then checked runs whose every element is compared with
//! what it must be. The columns, formulas and footer are nccl-tests' (see its
//! `doc/PERFORMANCE.md`), so numbers from a GPU cluster and from a laptop read alike.

use crate::backend::{Element, bus_factor};
use crate::error::SharedError;
use crate::report::{Perf, PerfRow, Placement, Timing};
use crate::session::Session;
use crate::transport::{Op, Via};
use crate::units::{self, parse_size};
use anyhow::Result;
use clap::{Args, ValueEnum};
use std::time::Instant;

/// The sweep, with nccl-tests' flags (`-b 4 -e 100M -f 2`) and their long names.
#[derive(Args, Debug, Clone)]
pub struct PerfArgs {
    /// The collective to measure.
    #[arg(long, value_enum, default_value_t = Collective::AllReduce)]
    pub op: Collective,
    /// Smallest size in bytes (K, M, G are 1024-based, as in nccl-tests).
    #[arg(short = 'b', long = "minbytes", value_name = "BYTES", default_value = "32M", value_parser = parse_size)]
    pub min_bytes: u64,
    /// Largest size in bytes.
    #[arg(short = 'e', long = "maxbytes", value_name = "BYTES", default_value = "32M", value_parser = parse_size)]
    pub max_bytes: u64,
    /// Multiply the size by this factor at each step.
    #[arg(short = 'f', long = "stepfactor", value_name = "F", conflicts_with = "step_bytes",
          value_parser = clap::value_parser!(u64).range(2..))]
    pub step_factor: Option<u64>,
    /// Add this many bytes at each step (the default: 1M, as in nccl-tests).
    #[arg(short = 'i', long = "stepbytes", value_name = "BYTES", value_parser = parse_size)]
    pub step_bytes: Option<u64>,
    /// Timed iterations per size.
    #[arg(short = 'n', long = "iters", value_name = "N", default_value_t = 20,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub iters: u32,
    /// Untimed iterations first, per size.
    #[arg(short = 'w', long = "warmup_iters", value_name = "N", default_value_t = 5,
          value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    pub warmup: u32,
    /// Checked iterations per size (0: no check, #wrong shows N/A).
    #[arg(short = 'c', long = "check", value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(0..=1000))]
    pub check: u32,
    /// The broadcast's root.
    #[arg(short = 'r', long = "root", value_name = "R", default_value_t = 0)]
    pub root: usize,
    /// Element type.
    #[arg(short = 'd', long = "datatype", value_enum, default_value_t = DataType::Float)]
    pub datatype: DataType,
    /// How each rank's time is combined: 0 = rank 0's, 1 = mean, 2 = min, 3 = max.
    #[arg(short = 'a', long = "average", value_name = "0-3", default_value_t = 1,
          value_parser = clap::value_parser!(u8).range(0..=3))]
    pub average: u8,
}

/// The collectives the benchmark knows.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Collective {
    /// Every rank gets the sum of every rank's buffer.
    AllReduce,
    /// Every rank gets the root's buffer.
    Broadcast,
}

/// Element types, with nccl-tests' names.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataType {
    /// 32-bit floating point.
    Float,
    /// 64-bit floating point.
    Double,
    /// 32-bit signed integer.
    Int32,
}

impl Collective {
    fn op(self) -> Op {
        match self {
            Collective::AllReduce => Op::AllReduce,
            Collective::Broadcast => Op::Broadcast,
        }
    }

    /// nccl-tests' name for it.
    pub fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "all_reduce",
            Collective::Broadcast => "broadcast",
        }
    }
}

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

/// The value element `i` of `rank`'s buffer starts from: small whole numbers, so that
/// sums over any number of ranks are exact in every type and every element can be checked.
fn start_value(i: usize, rank: usize) -> i32 {
    ((i * 7 + rank * 3) % 13) as i32 + 1
}

/// Runs the sweep that `args` describes, prints it as nccl-tests does, and fails at the
/// end (after the report) if any element was wrong.
pub fn run(session: &mut Session, args: &PerfArgs) -> Result<()> {
    if args.min_bytes > args.max_bytes {
        return Err(SharedError {
            message: format!(
                "-b {} is larger than -e {}: the sweep goes from -b up to -e",
                units::typed_size(args.min_bytes),
                units::typed_size(args.max_bytes)
            ),
            usage: true,
        }
        .into());
    }
    match args.datatype {
        DataType::Float => sweep::<f32>(session, args),
        DataType::Double => sweep::<f64>(session, args),
        DataType::Int32 => sweep::<i32>(session, args),
    }
}

fn sweep<T: Element>(session: &mut Session, args: &PerfArgs) -> Result<()> {
    let root = match args.op {
        Collective::Broadcast => Some(session.ensure_rank(args.root, "--root")?),
        Collective::AllReduce => None,
    };
    let memcpy_gbps = if session.rank() == 0 { memcpy_gbps() } else { 0.0 };
    let memcpy_gbps = session.share_f64(memcpy_gbps, "memcpy bandwidth")?[0];
    header(session, args, memcpy_gbps);

    let mut perf = Perf {
        op: args.op.name().into(),
        datatype: T::NAME.into(),
        memcpy_gbps,
        ..Perf::default()
    };
    for bytes in sizes(args.min_bytes, args.max_bytes, args.step_factor, args.step_bytes) {
        let count = (bytes as usize / size_of::<T>()).max(1);
        let mut row = PerfRow {
            size: count * size_of::<T>(),
            count,
            datatype: T::NAME.into(),
            redop: if root.is_some() { "none" } else { "sum" }.into(),
            root: root.map_or(-1, |r| r as i64),
            ..PerfRow::default()
        };
        row.out_of_place = measure::<T>(session, args, count, false)?;
        row.in_place = measure::<T>(session, args, count, true)?;
        session.say(&format_row(&row));
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
    if perf.wrong > 0 {
        session.fail_at_end(format!(
            "{} wrong element(s) over the sweep: see the #wrong columns",
            perf.wrong
        ));
    }
    session.set_perf(perf);
    Ok(())
}

/// One placement at one size: warm up, time, check.
fn measure<T: Element>(session: &mut Session, args: &PerfArgs, count: usize, in_place: bool) -> Result<Placement> {
    let (rank, world) = (session.rank(), session.world_size());
    let root = args.root;
    let mine: Vec<T> = (0..count).map(|i| T::from_small(start_value(i, rank))).collect();
    let send = session.from_host(mine.clone())?;
    let mut recv = session.from_host(if in_place {
        mine.clone()
    } else {
        vec![T::default(); count]
    })?;
    let once = |s: &mut Session, recv: &mut crate::Buffer<T>| match (args.op, in_place) {
        (Collective::AllReduce, false) => s.all_reduce_sum_into(&send, recv),
        (Collective::AllReduce, true) => s.all_reduce_sum(recv),
        (Collective::Broadcast, false) => s.broadcast_into(&send, recv, root),
        (Collective::Broadcast, true) => s.broadcast(recv, root),
    };

    for _ in 0..args.warmup {
        once(session, &mut recv)?;
    }
    let times = session.time_runs(args.iters, |s| once(s, &mut recv))?;
    let seconds = combine(&times, args.average);
    let t = Timing::new(args.op.op(), count * size_of::<T>(), world, seconds);

    // The check, as nccl-tests' -c: fresh data, one more run, every element compared.
    let wrong = if args.check == 0 {
        None
    } else {
        let expected = expected_values::<T>(args.op, root, world);
        let mut wrong = 0u64;
        for _ in 0..args.check {
            let mut fresh = session.from_host(if in_place {
                mine.clone()
            } else {
                vec![T::default(); count]
            })?;
            once(session, &mut fresh)?;
            let mut got = session.to_host(&fresh)?;
            crate::session::corrupt_for_tests(session.rank(), &mut got);
            wrong += got
                .iter()
                .enumerate()
                .filter(|(i, v)| !v.matches(expected[i % expected.len()]))
                .count() as u64;
        }
        let all = session.share_f64(wrong as f64, "count of wrong elements")?;
        Some(all.iter().sum::<f64>() as u64)
    };
    Ok(Placement {
        time_us: t.seconds * 1e6,
        algbw: t.algbw,
        busbw: t.busbw,
        wrong,
    })
}

/// What element `i` must hold afterwards, for `i` modulo the pattern's period (13).
fn expected_values<T: Element>(op: Collective, root: usize, world: usize) -> Vec<T> {
    (0..13)
        .map(|i| match op {
            Collective::Broadcast => T::from_small(start_value(i, root)),
            Collective::AllReduce => (0..world).fold(T::default(), |acc, r| acc.sum(T::from_small(start_value(i, r)))),
        })
        .collect()
}

/// The single-thread memcpy bandwidth of 100 MiB, best of 5 (GB/s): a copy-based
/// collective on one machine cannot beat the memory it copies through.
pub fn memcpy_gbps() -> f64 {
    let n = 100 << 20;
    let src = vec![1u8; n];
    let mut dst = vec![0u8; n];
    dst.copy_from_slice(&src); // touch every page first
    let best = (0..5)
        .map(|_| {
            let t = Instant::now();
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&dst);
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min);
    n as f64 / 1e9 / best
}

fn header(session: &Session, args: &PerfArgs, memcpy: f64) {
    let step = match (args.step_factor, args.step_bytes) {
        (Some(f), _) => format!("{f}(factor)"),
        (None, b) => format!("{}(bytes)", b.unwrap_or(1 << 20)),
    };
    let timing = ["rank 0's", "mean over ranks", "min over ranks", "max over ranks"][args.average as usize];
    let mut lines = vec![
        format!(
            "# nccl-workbook 03-nccl-perf: {} on {} ranks, {} backend",
            args.op.name(),
            session.world_size(),
            session.backend_name()
        ),
        format!(
            "# minBytes {} maxBytes {} step: {step} warmup iters: {} iters: {} validation: {} time: {timing}",
            args.min_bytes, args.max_bytes, args.warmup, args.iters, args.check
        ),
        format!("# memcpy, 1 thread, 100 MiB: {memcpy:.2} GB/s (what one core can copy: the bound for busbw here)"),
    ];
    let t = session.transports();
    if !t.is_empty() {
        let shm = t.values().filter(|v| **v == Via::Shm).count();
        lines.push(format!(
            "# transports: {shm} pair(s) over shared memory, {} over TCP (NCCL_DEBUG=INFO lists them)",
            t.len() - shm
        ));
    }
    lines.push("#".into());
    lines.push("# Using devices".into());
    lines.extend(session.rank_lines());
    lines.push("#".into());
    lines.push(format!(
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>30}  {:>30}",
        "", "", "", "", "", "out-of-place", "in-place"
    ));
    lines.push(format!(
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {}  {}",
        "size", "count", "type", "redop", "root", COLUMNS, COLUMNS
    ));
    lines.push(format!(
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {}  {}",
        "(B)", "(elements)", "", "", "", UNITS, UNITS
    ));
    for l in lines {
        session.say(&l);
    }
}

const COLUMNS: &str = "   time   algbw   busbw  #wrong";
const UNITS: &str = "   (us)  (GB/s)  (GB/s)        ";

fn format_row(row: &PerfRow) -> String {
    let place = |p: &Placement| {
        let wrong = p.wrong.map_or("N/A".to_string(), |w| w.to_string());
        format!(
            "{:>7}  {:>6.2}  {:>6.2}  {:>6}",
            time_text(p.time_us),
            p.algbw,
            p.busbw,
            wrong
        )
    };
    format!(
        "  {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {}  {}",
        row.size,
        row.count,
        row.datatype,
        row.redop,
        row.root,
        place(&row.out_of_place),
        place(&row.in_place)
    )
}

/// A time as nccl-tests prints it: two decimals while they fit in the column.
fn time_text(us: f64) -> String {
    if us < 10_000.0 {
        format!("{us:.2}")
    } else if us < 100_000.0 {
        format!("{us:.1}")
    } else {
        format!("{us:.0}")
    }
}

/// nccl-tests' busbw for `op` on `n` ranks, from its algbw (re-exported for the tests).
pub fn busbw(op: Collective, algbw: f64, n: usize) -> f64 {
    algbw * bus_factor(op.op(), n)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        // all_reduce on 8 ranks: busbw = algbw × 2(n-1)/n = × 1.75; broadcast: busbw = algbw.
        assert_eq!(busbw(Collective::AllReduce, 2.0, 8), 3.5);
        assert_eq!(busbw(Collective::AllReduce, 2.0, 2), 2.0);
        assert_eq!(busbw(Collective::Broadcast, 2.0, 8), 2.0);
        // algbw = bytes / 1e9 / seconds: 100 MiB in 50 ms.
        let t = Timing::new(Op::AllReduce, 100 << 20, 4, 0.05);
        assert!((t.algbw - 2.097152).abs() < 1e-9 && (t.busbw - 3.145728).abs() < 1e-9);
    }

    #[test]
    fn times_combine_as_the_average_flag_says() {
        let t = [3.0, 1.0, 2.0];
        assert_eq!([0, 1, 2, 3].map(|a| combine(&t, a)), [3.0, 2.0, 1.0, 3.0]);
    }

    #[test]
    fn expected_values_are_exact_sums() {
        let e = expected_values::<f32>(Collective::AllReduce, 0, 3);
        for (i, v) in e.iter().enumerate() {
            assert_eq!(*v, (0..3).map(|r| start_value(i, r) as f32).sum::<f32>());
        }
        assert_eq!(
            expected_values::<i32>(Collective::Broadcast, 2, 5)[4],
            start_value(4, 2)
        );
        // The pattern repeats every 13 elements, so checking by `i % 13` is exact.
        assert!((0..100).all(|i| start_value(i, 3) == start_value(i % 13, 3)));
    }

    #[test]
    fn rows_line_up_under_the_header() {
        let p = Placement {
            time_us: 123456.7,
            algbw: 0.85,
            busbw: 1.27,
            wrong: Some(0),
        };
        let row = PerfRow {
            size: 104857600,
            count: 26214400,
            datatype: "float".into(),
            redop: "sum".into(),
            root: -1,
            out_of_place: p.clone(),
            in_place: Placement { wrong: None, ..p },
        };
        let line = format_row(&row);
        assert!(
            line.contains("104857600      26214400     float     sum      -1"),
            "{line}"
        );
        assert!(line.contains(" 123457    0.85    1.27       0"), "{line}");
        assert!(line.ends_with("N/A"), "{line}");
        let header = format!("# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {}", "", "", "", "", "", COLUMNS);
        assert_eq!(line.len(), header.len() + 2 + COLUMNS.len(), "{line}\n{header}");
    }
}
