//! The benchmark: nccl-tests' `*_perf` programs (`all_reduce_perf`, `all_gather_perf`,
//! ...) for this workbook, every collective in one program (`--coll`).
//!
//! For each size of a sweep, and for separate send and receive buffers (out of place)
//! and then one buffer (in place): warm-up runs, a barrier, timed runs back to back, the
//! time combined over ranks, then checked runs whose every element is compared with
//! what it must be. The columns, formulas and footer are nccl-tests' (see its
//! `doc/PERFORMANCE.md`), so numbers from a GPU cluster and from a laptop read alike.
//!
//! A crate of its own, beside `common` (which it uses, and which knows nothing of it), so
//! that only the benchmark builds [`plot`]'s plotters and font code, not every lesson.

pub mod fit;
pub mod nccl_tests_json;
pub mod plot;
pub mod split;

use anyhow::Result;
use clap::Args;
use clap::builder::TypedValueParser;
use common::collective::{self, Collective, Shape, Source};
use common::element::{DataType, Element, ReduceOp};
use common::error::SharedError;
use common::report::{Perf, PerfRow, Placement, Timing};
use common::session::Session;
use common::transport::Via;
use common::units::{self, parse_size};
use std::time::Instant;

/// The sweep, with nccl-tests' flags (`-b 4 -e 100M -f 2`) and their long names.
#[derive(Args, Debug, Clone)]
pub struct PerfArgs {
    /// The collective(s) to measure, by nccl-tests' names: all_reduce, broadcast, reduce,
    /// all_gather, reduce_scatter, alltoall (or with '-'), or `all` for every one in turn
    /// (nccl-tests has one program per collective: `all_reduce_perf`...).
    #[arg(long = "coll", value_name = "NAME", default_value = "all_reduce", value_parser = parse_collectives)]
    pub coll: Collectives,
    /// The reduction operator(s) (reduce, all_reduce, reduce_scatter): sum, prod, max,
    /// min, avg, or `all` for every one in turn (nccl-tests' `-o, --op`).
    #[arg(short = 'o', long = "op", alias = "redop", value_name = "OP", default_value = "sum", value_parser = parse_ops)]
    pub redop: Choice<ReduceOp>,
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
    /// The root of broadcast and reduce.
    #[arg(short = 'r', long = "root", value_name = "R")]
    pub root: Option<usize>,
    /// Element type(s): float, double, int32, half, bfloat16, or `all` (nccl-tests' `-d`).
    #[arg(short = 'd', long = "datatype", value_name = "TYPE", default_value = "float", value_parser = parse_types)]
    pub datatype: Choice<DataType>,
    /// How each rank's time is combined: 0 = rank 0's, 1 = mean, 2 = min, 3 = max.
    #[arg(short = 'a', long = "average", value_name = "0-3", default_value_t = 1,
          value_parser = clap::value_parser!(u8).range(0..=3))]
    pub average: u8,
    /// 1: the time column is the host's time to issue the calls, not the time until they
    /// finished (nccl-tests' `-C`, cputime): what each call costs the CPU (NCCL's launch,
    /// and this harness's share).
    #[arg(short = 'C', long = "report_cputime", value_name = "0|1", default_value_t = 0,
          value_parser = clap::value_parser!(u8).range(0..=1))]
    pub cputime: u8,
    /// Run every sweep once per algorithm, as `NCCL_ALGO` set to each would (`-A
    /// ring,tree`: the ring, then the tree), to set them side by side. On NCCL, which
    /// reads `NCCL_ALGO` when a communicator starts, each value gets a communicator
    /// started under it.
    #[arg(short = 'A', long = "algos", value_name = "ALGO,...", value_delimiter = ',')]
    pub algos: Vec<String>,
    /// Run every sweep once per protocol, as `NCCL_PROTO` set to each would (`-P
    /// ll,ll128,simple`: NCCL's LL, then LL128, then Simple), to set them side by side
    /// (with `-A`, every protocol for each algorithm). On the CPU backend shared memory
    /// only (TCP has Simple alone); on NCCL, a communicator started under each value.
    #[arg(short = 'P', long = "protos", value_name = "PROTO,...", value_delimiter = ',')]
    pub protos: Vec<String>,
    /// Fit time ≈ α + size/β to each sweep's out-of-place times and print it under the
    /// sweep (with `-A`, where the algorithms' fits cross): a line per algorithm the tuner
    /// chose and, on the CPU backend, per side of a rank's share of its core's own cache
    /// and of the last-level cache, each fitted to the sizes' median calls.
    #[arg(long)]
    pub fit: bool,
    /// The picture: `--plot`, `--plot-with`, `--no-run`.
    #[command(flatten)]
    pub plot: plot::PlotArgs,
    /// Write the result to FILE in nccl-tests' own JSON (its `-J`: same names and layout,
    /// so nccl-tests' scripts read it), written by rank 0 after the table.
    #[arg(short = 'J', long = "output_file", value_name = "FILE",
          value_parser = clap::builder::OsStringValueParser::new().try_map(nccl_tests_json::parse_output))]
    pub output_file: Option<std::path::PathBuf>,
}

/// One value of a flag, or every one (`all`): what a sweep goes through, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice<T>(pub Vec<T>);

impl<T> std::ops::Deref for Choice<T> {
    type Target = Vec<T>;
    fn deref(&self) -> &Vec<T> {
        &self.0
    }
}

/// The collectives a sweep measures, in order.
pub type Collectives = Choice<&'static Collective>;

/// `all_gather`, `all-gather` or `all`.
fn parse_collectives(name: &str) -> Result<Collectives, String> {
    let wanted = name.replace('-', "_").to_lowercase();
    if wanted == "all" {
        return Ok(Choice(collective::ALL.to_vec()));
    }
    collective::ALL
        .iter()
        .find(|c| c.name() == wanted || c.title().replace('-', "_") == wanted)
        .map(|c| Choice(vec![*c]))
        .ok_or_else(|| {
            let names: Vec<&str> = collective::ALL.iter().map(|c| c.name()).collect();
            format!("unknown collective '{name}': one of {}, or all", names.join(", "))
        })
}

/// One of clap's value names, or `all` for every value.
fn parse_all<V: clap::ValueEnum + Clone>(s: &str, what: &str) -> Result<Choice<V>, String> {
    if s.eq_ignore_ascii_case("all") {
        return Ok(Choice(V::value_variants().to_vec()));
    }
    V::from_str(s, true).map(|v| Choice(vec![v])).map_err(|_| {
        let names: Vec<String> = V::value_variants()
            .iter()
            .filter_map(|v| v.to_possible_value().map(|p| p.get_name().to_string()))
            .collect();
        format!("unknown {what} '{s}': one of {}, or all", names.join(", "))
    })
}

/// An operator; a collective's name gets a hint, since `--op` named the collective before
/// it named the operator as nccl-tests' `-o, --op` does.
fn parse_ops(s: &str) -> Result<Choice<ReduceOp>, String> {
    parse_all(s, "operator").map_err(|e| match parse_collectives(s) {
        Ok(_) => format!("'{s}' is a collective: --op is the reduction operator, as in nccl-tests; name the collective with --coll {s}"),
        Err(_) => e,
    })
}

fn parse_types(s: &str) -> Result<Choice<DataType>, String> {
    parse_all(s, "type")
}

/// Where `--plot`'s own sweep starts, and its step: from 8 B to `-e` (32 MiB by default),
/// times 4 (12 sizes): a curve from the latency-bound to the bandwidth-bound end, in
/// seconds on a laptop.
const PLOT_MIN_BYTES: u64 = 8;
const PLOT_FACTOR: u64 = 4;

impl PerfArgs {
    /// The sizes this sweep goes through, in bytes.
    fn sizes(&self) -> Vec<u64> {
        sizes(self.min_bytes, self.max_bytes, self.step_factor, self.step_bytes)
    }
}

/// `--plot` where the sweep is one size (`-b` and `-e` the same, as by default, with no
/// step): the sweep the picture needs, [`PLOT_MIN_BYTES`] to `-e` times [`PLOT_FACTOR`];
/// `None` where the user asked for a sweep.
fn plot_sweep(args: &PerfArgs) -> Option<PerfArgs> {
    let one_size = args.min_bytes == args.max_bytes && args.step_factor.is_none() && args.step_bytes.is_none();
    if args.plot.plot.is_none() || !one_size || args.max_bytes <= PLOT_MIN_BYTES {
        return None;
    }
    Some(PerfArgs {
        min_bytes: PLOT_MIN_BYTES,
        step_factor: Some(PLOT_FACTOR),
        ..args.clone()
    })
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

/// The value element `i` of `rank`'s send buffer starts from: small whole numbers, so
/// that results over any number of ranks are exact in every type (products of 1s and 2s
/// at most 2^8, sums at most 13 × 8) and every element can be checked. The pattern
/// repeats every 13 elements.
fn start_value(i: usize, rank: usize, op: ReduceOp) -> f64 {
    let v = (i * 7 + rank * 3) % 13;
    match op {
        ReduceOp::Prod => (v % 2 + 1) as f64,
        _ => (v + 1) as f64,
    }
}

/// Runs the sweep(s) that `args` describes, prints each as nccl-tests does, and fails at
/// the end (after the report) if any element was wrong. Under `NCCL_TESTS_SPLIT` (or
/// `NCCL_TESTS_SPLIT_MASK`, see [`split`]) every communicator of the split runs them at
/// once, as nccl-tests does: busbw for the communicator's ranks, the time combined and
/// `#wrong` summed over the world, the rows rank 0's communicator's.
pub fn run(session: &mut Session, args: &PerfArgs) -> Result<()> {
    let started = nccl_tests_json::now();
    // NCCL_TESTS_SPLIT: every rank reads the same value; a bad one is said once, by rank 0.
    let split = split::from_env().map_err(|message| SharedError { message, usage: true })?;
    let swept;
    let args = match plot_sweep(args) {
        Some(wider) => {
            session.say(&format!(
                "# --plot: a sweep of one size would be one dot: sizes {} to {}, x{PLOT_FACTOR} (-b, -e, -f choose)",
                units::human_bytes(wider.min_bytes as usize),
                units::human_bytes(wider.sizes().last().copied().unwrap_or(wider.max_bytes) as usize)
            ));
            swept = wider;
            &swept
        }
        None => args,
    };
    let refuse = |message: String| -> Result<()> { Err(SharedError { message, usage: true }.into()) };
    if args.min_bytes > args.max_bytes {
        return refuse(format!(
            "-b {} is larger than -e {}: the sweep goes from -b up to -e",
            units::typed_size(args.min_bytes),
            units::typed_size(args.max_bytes)
        ));
    }
    let one = |v: &[_]| v.len() == 1;
    if let Some(c) = args
        .coll
        .iter()
        .find(|c| !c.rooted())
        .filter(|_| one(&args.coll) && args.root.is_some())
    {
        return refuse(format!(
            "{} has no root: -r/--root is for broadcast and reduce",
            c.name()
        ));
    }
    if let Some(c) = args.coll.iter().find(|c| !c.reduces()).filter(|_| one(&args.coll))
        && (args.redop.len() > 1 || args.redop[0] != ReduceOp::Sum)
    {
        return refuse(format!(
            "{} reduces nothing: -o/--op is for reduce, all_reduce and reduce_scatter",
            c.name()
        ));
    }
    // A root is a rank of the communicator: under a split, of the smallest one's.
    if let (Some(spec), Some(root)) = (&split, args.root.filter(|_| args.coll.iter().any(|c| c.rooted()))) {
        let smallest = spec
            .groups(session.world_size())
            .values()
            .map(Vec::len)
            .min()
            .unwrap_or(0);
        if root >= smallest {
            return refuse(format!(
                "--root {root} is not a rank of every communicator: {}={} makes one of {smallest} rank(s) \
                 (ranks 0 to {})",
                spec.var,
                spec.text,
                smallest.saturating_sub(1)
            ));
        }
    }
    // At the largest size a rank holds a send and a receive buffer, a fresh one for the
    // check and its copy read back.
    let widest = args.datatype.iter().map(|d| d.size()).max().unwrap_or(4) as u64;
    let largest = sizes(args.min_bytes, args.max_bytes, args.step_factor, args.step_bytes)
        .last()
        .map_or(0, |b| (b / widest).max(1) * widest);
    session.ensure_memory(4 * largest, &format!("-e {}", units::typed_size(args.max_bytes)))?;
    let (memcpy_gbps, in_cache) = match session.rank() {
        0 => (memcpy_gbps(), memcpy_in_cache_gbps()),
        _ => (0.0, 0.0), // only rank 0 prints the header
    };
    let memcpy_gbps = session.share_f64(memcpy_gbps, "memcpy bandwidth")?[0];
    header(session, args, memcpy_gbps, in_cache, split.as_ref());
    // NCCL_TESTS_SPLIT: every communicator of the split runs every sweep, at once; the
    // rows printed are rank 0's communicator's (the first rank with a color prints).
    let (sweeps, ranks) = match &split {
        None => (sweeps(session, args, memcpy_gbps)?, session.world_size()),
        Some(spec) => {
            let mut sub = session.split(spec.color(session.rank()), 0)?;
            let swept = session.on(&mut sub, |s| sweeps(s, args, memcpy_gbps))?;
            let ranks = sub.size();
            session.destroy(sub)?;
            (swept, ranks)
        }
    };
    let wrong: u64 = sweeps.iter().map(|p| p.wrong).sum();
    if wrong > 0 {
        session.fail_at_end(format!(
            "{wrong} wrong element(s) over the sweep: see the #wrong columns"
        ));
    }
    if let Some(target) = args.plot.plot.as_ref().filter(|_| session.rank() == 0) {
        plot(session, target, &args.plot.plot_with, &sweeps, ranks);
    }
    if let Some(path) = args.output_file.as_ref().filter(|_| session.rank() == 0) {
        let doc = nccl_tests_json::document(session.run_report(), args, &sweeps, &started, split.as_ref());
        match nccl_tests_json::write(path, &doc) {
            Ok(()) => session.say(&format!("# nccl-tests JSON (-J): {}", path.display())),
            Err(e) => session.fail_at_end(e),
        }
    }
    if let Some(spec) = &split {
        session.set_split(nccl_tests_json::split_object(spec, session.world_size()));
    }
    session.set_perf(sweeps);
    Ok(())
}

impl PerfArgs {
    /// The variables `-A` and `-P` change between sweeps, each with its first sweep's
    /// value: on NCCL a rank makes them ready before NCCL loads
    /// ([`common::RunArgs::nccl_env_per_sweep`]).
    pub fn nccl_env_per_sweep(&self) -> Vec<(&'static str, String)> {
        let first = |values: &[String]| values.first().cloned();
        [("NCCL_ALGO", first(&self.algos)), ("NCCL_PROTO", first(&self.protos))]
            .into_iter()
            .filter_map(|(name, value)| Some((name, value?)))
            .collect()
    }
}

/// Every sweep `args` asks for (-A, -P, --coll, -d, -o), on the session's communicator (the
/// world's, or inside [`Session::on`] a split's): the tables, and what each measured.
fn sweeps(session: &mut Session, args: &PerfArgs, memcpy_gbps: f64) -> Result<Vec<Perf>> {
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
                        let why_none = match (session.communicator().world(), common::backend::nccl_log::captured()) {
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

/// Rank 0 draws this run's sweeps (measured on `ranks` ranks: its communicator's), and
/// the results saved before, after the table; a picture that cannot be written fails the
/// run at the end, as a wrong element does.
fn plot(session: &mut Session, target: &plot::Target, saved: &[plot::Run], sweeps: &[Perf], ranks: usize) {
    let vias: std::collections::BTreeSet<&str> = session
        .transports()
        .values()
        .map(|v| if *v == Via::Shm { "shm" } else { "tcp" })
        .collect();
    let this = plot::Run {
        name: "this run".into(),
        ranks,
        transport: vias.into_iter().collect::<Vec<_>>().join("+"),
        backend: plot::backend_label(session.backend_name(), common::simulate::gpus()),
        host: common::launch::hostname(),
        sweeps: sweeps.iter().map(Into::into).collect(),
    };
    let runs: Vec<plot::Run> = std::iter::once(this).chain(saved.iter().cloned()).collect();
    match plot::draw(target, &runs) {
        Ok(n) => session.say(&format!("# Plot: {} ({})", target.path.display(), plot::lines(n))),
        Err(e) => session.fail_at_end(e),
    }
}

/// One sweep: a collective, an operator and a root, over every size.
struct Sweep {
    coll: &'static Collective,
    op: ReduceOp,
    root: usize,
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
        let sent = || common::transport::protocol::Protocol::ALL.map(common::transport::shm::sent_by);
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

/// What each element of a rank's result buffer must hold, from its collective's
/// [`Collective::source`]: every start value and every reduction, for the 13 positions
/// of the repeating pattern.
struct Expected<T> {
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
    fn new(sweep: &Sweep, world: usize, count: usize, rank: usize, in_place: bool) -> Expected<T> {
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
    fn at(&self, i: usize, before: T) -> T {
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

/// The single-thread memcpy bandwidth of 100 MiB, in memory, best of 5 (GB/s): a
/// reference for busbw, not a bound (see [`header`]).
pub fn memcpy_gbps() -> f64 {
    copy_gbps(100 << 20, 1)
}

/// The single-thread memcpy bandwidth of 256 KiB copied over and over, in the core's
/// own cache, best of 5 (GB/s).
pub fn memcpy_in_cache_gbps() -> f64 {
    copy_gbps(256 << 10, 400)
}

fn copy_gbps(n: usize, reps: usize) -> f64 {
    let src = vec![1u8; n];
    let mut dst = vec![0u8; n];
    dst.copy_from_slice(&src); // touch every page first
    let best = (0..5)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..reps {
                dst.copy_from_slice(std::hint::black_box(&src));
                std::hint::black_box(&mut dst);
            }
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min);
    (n * reps) as f64 / 1e9 / best
}

/// What nccl-tests prints once, at the top: the program, the sweep, the devices; and
/// what one core copies, in memory and in its cache. Those are references for busbw, not
/// bounds: on one machine several ranks copy at once, each through its own core, and a
/// piece that is still in a cache moves at the cache's speed, so a row can beat either.
fn header(session: &Session, args: &PerfArgs, memcpy: f64, in_cache: f64, split: Option<&split::Spec>) {
    let step = match (args.step_factor, args.step_bytes) {
        (Some(f), _) => format!("{f}(factor)"),
        (None, b) => format!("{}(bytes)", b.unwrap_or(1 << 20)),
    };
    let timing = ["rank 0's", "mean over ranks", "min over ranks", "max over ranks"][args.average as usize];
    let timing = match args.cputime {
        1 => format!("{timing}, to issue the calls (-C 1: the host's time, not the collectives')"),
        _ => timing.to_string(),
    };
    let names: Vec<&str> = args.coll.iter().map(|c| c.name()).collect();
    let mut lines = vec![
        format!(
            "# nccl-workbook {}: {} on {} ranks, {} backend",
            common::example_name(),
            names.join(", "),
            session.world_size(),
            session.backend_name()
        ),
        format!(
            "# minBytes {} maxBytes {} step: {step} warmup iters: {} iters: {} validation: {} time: {timing}",
            args.min_bytes, args.max_bytes, args.warmup, args.iters, args.check
        ),
        format!(
            "# memcpy, 1 thread: {memcpy:.2} GB/s in memory (100 MiB), {in_cache:.2} GB/s in cache (256 KiB): \
             references, not bounds (EXERCISES.md, chapter 6)"
        ),
    ];
    let t = session.transports();
    if !t.is_empty() {
        let shm = t.values().filter(|v| **v == Via::Shm).count();
        let single = match (shm == t.len(), session.single_copy()) {
            (false, _) => "",
            (true, true) => "; large buffers: single copy (NCCL_P2P_DISABLE=1 turns it off)",
            (true, false) => "; single copy off: every byte through the slots",
        };
        lines.push(format!(
            "# transports: {shm} pair(s) over shared memory, {} over TCP (NCCL_DEBUG=INFO lists them){single}",
            t.len() - shm
        ));
        if let Some(link) = session.simulated_link() {
            lines.push(format!(
                "# network: every TCP link simulated at {link} (--link): no time or bandwidth across TCP is this \
                 machine's"
            ));
        }
    }
    if session.backend_name() == "nccl"
        && let Some(n) = common::simulate::gpus()
    {
        lines.push(format!(
            "# {} (--simulate-gpus {n}): every time and bandwidth below is the host's",
            common::simulate::NOTE
        ));
    }
    if let Some(spec) = split {
        lines.extend(spec.header(session.world_size()));
    }
    lines.push("#".into());
    lines.push("# Using devices".into());
    // With a split, each rank's color, where nccl-tests prints it: `Rank  0 Group  0 Pid`.
    lines.extend(session.rank_lines().into_iter().enumerate().map(|(r, line)| {
        match (split, line.split_once(" Pid ")) {
            (Some(spec), Some((head, tail))) => format!("{head} Group {:>2} Pid {tail}", spec.color(r)),
            _ => line,
        }
    }));
    for l in lines {
        session.say(&l);
    }
}

/// The columns' titles, above each sweep, named for its collective.
fn columns(session: &Session, sweep: &Sweep, datatype: DataType) {
    let coll = sweep.coll;
    let ranks = session.communicator().world();
    let factor = match (coll.bus_factor)(ranks) {
        1.0 => "busbw = algbw".to_string(),
        f => format!("busbw = algbw × {f:.3}"),
    };
    let lines = [
        "#".to_string(),
        format!(
            "# {} ({}), {}, {}: {factor}",
            coll.name(),
            coll.nccl_name(),
            datatype.name(),
            match coll.reduces() {
                true => format!("operator {}", sweep.op.name()),
                false => "no operator".into(),
            }
        ),
        format!(
            "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>30}  {:>30}",
            "", "", "", "", "", "out-of-place", "in-place"
        ),
        format!(
            "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {}  {}  algo proto",
            "size", "count", "type", "redop", "root", COLUMNS, COLUMNS
        ),
        format!(
            "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {}  {}",
            "(B)", "(elements)", "", "", "", UNITS, UNITS
        ),
    ];
    let overlap = match coll.rooted() && ranks > 1 {
        true => " A rooted collective's calls may overlap back to back (a rank leaves once its part is handed over).",
        false => "",
    };
    // Single calls are stamped on the CPU backend only: a GPU's calls are queued on its
    // stream and timed together, as nccl-tests times them without -I.
    let under = match session.backend_name() {
        "cpu" => {
            " Under each row, the same calls one by one (nccl-tests' -I, each its slowest rank): median, p99 \
                   (us), and how many slept (a rank waited on the futex, not spinning)."
        }
        _ => " The calls are queued on the GPU's stream and waited for once, at the end.",
    };
    let lines = lines
        .into_iter()
        .chain([format!("# time: mean of the calls back to back.{under}{overlap}")]);
    for l in lines {
        session.say(&l);
    }
}

/// The line under a row: its single calls, placed under each placement's columns (a
/// comment for programs that read nccl-tests' rows; `None` when there were none).
fn single_calls_row(row: &PerfRow, iters: u32) -> Option<String> {
    let place = |p: &Placement| -> Option<String> {
        let slept = p.slept.map_or("n/a".to_string(), |n| n.to_string());
        Some(format!(
            "{:>31}",
            format!(
                "p50 {} p99 {} slept {slept}",
                time_text(p.median_us?),
                time_text(p.p99_us?)
            )
        ))
    };
    let calls = (iters as usize).min(common::session::SINGLE_CALLS_MAX);
    Some(format!(
        "#{:>51}  {}  {}",
        format!("{calls} single calls:"),
        place(&row.out_of_place)?,
        place(&row.in_place)?
    ))
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
    // The algorithm, as NCCL's tuner names its choice.
    let mut algo = both(&row.out_of_place.algo, &row.in_place.algo);
    // Then the protocol, as NCCL's tuner line says `Algo ring proto LL`.
    let proto = both(&row.out_of_place.proto, &row.in_place.proto);
    if !proto.is_empty() {
        algo = format!("{algo} {proto}");
    }
    format!(
        "  {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {}  {}  {algo}",
        row.size,
        row.count,
        row.datatype,
        row.redop,
        row.root,
        place(&row.out_of_place),
        place(&row.in_place)
    )
}

/// One name where both placements ran the same, else out-of-place's and in-place's
/// (`single-copy/pairwise`: where a rank's buffer of one placement is outside the arena,
/// that placement goes by messages).
fn both(out_of_place: &str, in_place: &str) -> String {
    match out_of_place == in_place {
        true => out_of_place.to_string(),
        false => format!("{out_of_place}/{in_place}"),
    }
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
        // algbw = bytes / 1e9 / seconds: 100 MiB in 50 ms; all_reduce on 4 ranks × 1.5.
        let t = Timing::new((collective::ALL_REDUCE.bus_factor)(4), 100 << 20, 0.05);
        assert!((t.algbw - 2.097152).abs() < 1e-9 && (t.busbw - 3.145728).abs() < 1e-9);
    }

    #[test]
    fn collectives_operators_and_types_parse_by_nccl_tests_names_or_all() {
        assert_eq!(parse_collectives("all_gather").unwrap()[0].name(), "all_gather");
        assert_eq!(parse_collectives("all-reduce").unwrap()[0].name(), "all_reduce");
        assert_eq!(parse_collectives("alltoall").unwrap()[0].name(), "alltoall");
        assert_eq!(parse_collectives("all").unwrap().len(), collective::ALL.len());
        assert!(
            parse_collectives("gather")
                .unwrap_err()
                .contains("one of broadcast, reduce")
        );
        assert_eq!(parse_ops("all").unwrap().len(), 5);
        assert_eq!(parse_types("bfloat16").unwrap().0, vec![DataType::Bfloat16]);
        assert!(parse_types("fp8").unwrap_err().contains("unknown type 'fp8'"));
    }

    #[test]
    fn the_algo_column_names_each_placement_only_where_they_differ() {
        assert_eq!(both("single-copy", "single-copy"), "single-copy");
        assert_eq!(both("single-copy", "pairwise"), "single-copy/pairwise");
        assert_eq!(both("", ""), "");
    }

    #[test]
    fn times_combine_as_the_average_flag_says() {
        let t = [3.0, 1.0, 2.0];
        assert_eq!([0, 1, 2, 3].map(|a| combine(&t, a)), [3.0, 2.0, 1.0, 3.0]);
    }

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

    #[test]
    fn rows_line_up_under_the_header() {
        let p = Placement {
            time_us: 123456.7,
            algbw: 0.85,
            busbw: 1.27,
            wrong: Some(0),
            algo: "ring".into(),
            ..Placement::default()
        };
        let row = PerfRow {
            size: 104857600,
            count: 26214400,
            datatype: "float".into(),
            redop: "sum".into(),
            root: -1,
            out_of_place: p.clone(),
            in_place: Placement {
                wrong: None,
                algo: "single-copy".into(),
                ..p
            },
        };
        let line = format_row(&row);
        assert!(
            line.contains("104857600      26214400     float     sum      -1"),
            "{line}"
        );
        assert!(line.contains(" 123457    0.85    1.27       0"), "{line}");
        assert!(line.ends_with("N/A  ring/single-copy"), "{line}");
        let header = format!("# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {}", "", "", "", "", "", COLUMNS);
        let algo = "  ring/single-copy".len();
        assert_eq!(line.len(), header.len() + 2 + COLUMNS.len() + algo, "{line}\n{header}");
    }
}
