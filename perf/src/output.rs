//! What the benchmark prints and draws: nccl-tests' header (with the memcpy references
//! it is read against), each sweep's column titles, its rows and the line of single
//! calls under each, and, on rank 0, the picture (`--plot`) after the table. The
//! columns' widths are nccl-tests', so that programs that read its output read this.

use crate::args::PerfArgs;
use crate::sweep::Sweep;
use crate::{plot, split};
use common::report::{Perf, PerfRow, Placement};
use common::session::Session;
use std::time::Instant;
use workbook_cpu::transport::Via;
use workbook_runtime::element::DataType;

/// Rank 0 draws this run's sweeps (measured on `ranks` ranks: its communicator's), and
/// the results saved before, after the table; a picture that cannot be written fails the
/// run at the end, as a wrong element does.
pub(crate) fn plot(session: &mut Session, target: &plot::Target, saved: &[plot::Run], sweeps: &[Perf], ranks: usize) {
    let vias: std::collections::BTreeSet<&str> = session
        .transports()
        .values()
        .map(|v| if *v == Via::Shm { "shm" } else { "tcp" })
        .collect();
    let this = plot::Run {
        name: "this run".into(),
        ranks,
        transport: vias.into_iter().collect::<Vec<_>>().join("+"),
        backend: plot::backend_label(session.backend_name(), workbook_nccl::simulate::gpus()),
        host: workbook_runtime::launch::hostname(),
        sweeps: sweeps.iter().map(Into::into).collect(),
    };
    let runs: Vec<plot::Run> = std::iter::once(this).chain(saved.iter().cloned()).collect();
    match plot::draw(target, &runs) {
        Ok(n) => session.say(&format!("# Plot: {} ({})", target.path.display(), plot::lines(n))),
        Err(e) => session.fail_at_end(e),
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
pub(crate) fn header(session: &Session, args: &PerfArgs, memcpy: f64, in_cache: f64, split: Option<&split::Spec>) {
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
        && let Some(n) = workbook_nccl::simulate::gpus()
    {
        lines.push(format!(
            "# {} (--simulate-gpus {n}): every time and bandwidth below is the host's",
            workbook_nccl::simulate::NOTE
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
pub(crate) fn columns(session: &Session, sweep: &Sweep, datatype: DataType) {
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
pub(crate) fn single_calls_row(row: &PerfRow, iters: u32) -> Option<String> {
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

pub(crate) fn format_row(row: &PerfRow) -> String {
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
    fn the_algo_column_names_each_placement_only_where_they_differ() {
        assert_eq!(both("single-copy", "single-copy"), "single-copy");
        assert_eq!(both("single-copy", "pairwise"), "single-copy/pairwise");
        assert_eq!(both("", ""), "");
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
