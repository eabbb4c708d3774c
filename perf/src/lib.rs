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

mod args;
mod check;
pub mod fit;
pub mod nccl_tests_json;
mod output;
pub mod plot;
pub mod split;
mod sweep;

pub use args::{Choice, Collectives, PerfArgs};
pub use output::{memcpy_gbps, memcpy_in_cache_gbps};
pub use sweep::{combine, sizes};

use anyhow::Result;
use args::{PLOT_FACTOR, plot_sweep};
use common::session::Session;
use output::header;
use sweep::sweeps;
use workbook_runtime::element::ReduceOp;
use workbook_runtime::error::SharedError;
use workbook_runtime::units;

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
        output::plot(session, target, &args.plot.plot_with, &sweeps, ranks);
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
