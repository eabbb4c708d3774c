//! 07 — How fast is it, and why: a benchmark in the manner of nccl-tests' `*_perf`.
//!
//! For each size of a sweep, it times the collective (out of place: separate send and
//! receive buffers; in place: one buffer), then checks every element, and prints
//! nccl-tests' columns:
//!
//! - `algbw` = size / time: how fast the buffer got through;
//! - `busbw` = algbw × the collective's factor (all-reduce 2(n-1)/n; all-gather,
//!   reduce-scatter, all-to-all (n-1)/n; broadcast, reduce 1): what each link carried,
//!   comparable across collectives, rank counts and the hardware's own bandwidth;
//! - `#wrong`: elements that differ from what they must be (a non-zero exit if any).
//!
//! Small messages are latency-bound (time barely grows with size, algbw is tiny); large
//! ones are bandwidth-bound (time grows with size, busbw levels off at the link's speed).
//!
//! Run it: `cargo run --release --bin 07-nccl-perf -- -b 4 -e 100M -f 4`
//! (`--coll all_gather` or `--coll all`, `-o avg`, `-d half`, `--nproc-per-node 4`,
//! `--format json`; see `--help`).
//!
//! On sub-communicators, as nccl-tests: `NCCL_TESTS_SPLIT="MOD 2"` (or `AND`, `OR`, `DIV`;
//! `%2`, `&0x1`, ...) gives each rank a color from its rank, and each color's ranks run
//! the sweep on a communicator of their own, all at once (`Session::split`,
//! `Session::on`); busbw counts a communicator's ranks.
//!
//! See it: `--plot perf.png` draws busbw and time against size (log scales) after the
//! table, with the machine's bound; `--plot-with old.json` adds a run saved before with
//! `--format json > old.json` (2 against 4 ranks, shm against TCP), and `--no-run` draws
//! only the saved runs.

use clap::Parser;

/// Benchmark NCCL's collectives over a range of sizes, as nccl-tests does.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    #[command(flatten)]
    run: common::RunArgs,
    #[command(flatten)]
    perf: workbook_perf::PerfArgs,
}

fn main() -> std::process::ExitCode {
    let mut args: Args = common::parse_args();
    if args.perf.plot.no_run {
        // Only a picture of results saved before: no rank starts.
        return workbook_perf::plot::draw_saved(&args.perf.plot);
    }
    // -A and -P change NCCL_ALGO and NCCL_PROTO between sweeps: set before NCCL starts.
    args.run.nccl_env_per_sweep = args.perf.nccl_env_per_sweep();
    common::main(&args.run, |session| workbook_perf::run(session, &args.perf))
}
