//! 03 — How fast is it, and why: a benchmark in the manner of nccl-tests' `*_perf`.
//!
//! For each size of a sweep, it times the collective (out of place: separate send and
//! receive buffers; in place: one buffer), then checks every element, and prints
//! nccl-tests' columns:
//!
//! - `algbw` = size / time: how fast the buffer got through;
//! - `busbw` = algbw × 2(n-1)/n for an all-reduce (× 1 for a broadcast): what each link
//!   carried, comparable across rank counts and with the hardware's own bandwidth;
//! - `#wrong`: elements that differ from what they must be (a non-zero exit if any).
//!
//! Small messages are latency-bound (time barely grows with size, algbw is tiny); large
//! ones are bandwidth-bound (time grows with size, busbw levels off at the link's speed).
//!
//! Run it: `cargo run --release --bin 03-nccl-perf -- -b 4 -e 100M -f 4`
//! (`--op broadcast`, `--nproc-per-node 4`, `-d double`, `--format json`; see `--help`).

use clap::Parser;

/// Benchmark broadcast or all-reduce over a range of sizes, as nccl-tests does.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    #[command(flatten)]
    run: common::RunArgs,
    #[command(flatten)]
    perf: common::perf::PerfArgs,
}

fn main() -> std::process::ExitCode {
    let args: Args = common::parse_args();
    common::main(&args.run, |session| common::perf::run(session, &args.perf))
}
