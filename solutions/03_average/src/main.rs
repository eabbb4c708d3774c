//! Exercise 3 — From sum to average: the reference solution (EXERCISES.md, chapter 3).
//!
//! Data-parallel training runs the same model on every rank, each on its own slice of
//! the batch. Before the weights are updated, the gradients are all-reduced and divided
//! by the number of ranks: every rank then applies the *average* gradient, the same
//! update everywhere. `all_reduce` with `ReduceOp::Sum` gives the sum; finish `average` below.
//!
//! Run it:   `cargo run --release --bin sol03-average -- --nproc-per-node 4 --init rank`
//! Check it: `cargo workbook check 3 --solution`

use anyhow::Result;
use clap::Parser;
use common::ReduceOp;
use common::{Buffer, Init, Session};

/// All-reduce, then average: every rank ends with the mean of all buffers.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    #[command(flatten)]
    run: common::RunArgs,
    #[command(flatten)]
    data: common::DataArgs,
}

/// Turns the sum of all ranks' buffers, in `buf`, into their average.
fn average(session: &mut Session, buf: &mut Buffer<f32>) -> Result<()> {
    let n = session.world_size() as f32;
    let mean: Vec<f32> = session.to_host(buf)?.iter().map(|sum| sum / n).collect();
    *buf = session.from_host(mean)?;
    Ok(())
}

fn main() -> std::process::ExitCode {
    let args: Args = common::parse_args();
    common::main(&args.run, |session| {
        // Ones (or --value) everywhere, or with --init rank, rank r holds r+1.
        let start = |rank: usize| match args.data.init {
            Init::Ones => args.data.value.unwrap_or(1.0),
            Init::Rank => (rank + 1) as f32,
        };
        let mut buf = session.buffer(&args.data, start(session.rank()))?;
        session.show("Before all-reduce", &buf)?;
        session.all_reduce(&mut buf, ReduceOp::Sum)?;
        session.show("After all-reduce", &buf)?;

        average(session, &mut buf)?;

        let n = session.world_size();
        session.show(&format!("Average (sum / {n})"), &buf)?;
        let mean = (0..n).map(start).sum::<f32>() / n as f32;
        session.check(&buf, mean)
    })
}
