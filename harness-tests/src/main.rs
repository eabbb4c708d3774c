//! The harness tests' program: an all-reduce that uses `common` as a lesson does, with
//! the common flags (`common::RunArgs`, `common::DataArgs`) and `--op`, and the same
//! output as lesson 02 (its titles, its `Check:` line), so that the harness's tests run on
//! a program that no lesson's change can break. Not a lesson: nothing to learn here.

use clap::Parser;
use common::{Init, ReduceOp};

/// An all-reduce on every rank, for the harness's tests.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    #[command(flatten)]
    run: common::RunArgs,
    #[command(flatten)]
    data: common::DataArgs,
    /// How the buffers are combined, element by element.
    #[arg(long, value_enum, default_value_t = ReduceOp::Sum)]
    op: ReduceOp,
}

fn main() -> std::process::ExitCode {
    let args: Args = common::parse_args();
    let op = args.op;
    common::main(&args.run, |session| {
        // Ones (or --value) everywhere, or with --init rank, r+1 on rank r.
        let start = |rank: usize| match args.data.init {
            Init::Ones => args.data.value.unwrap_or(1.0),
            Init::Rank => (rank + 1) as f32,
        };
        let mut buf = session.buffer(&args.data, start(session.rank()))?;
        session.show("Before all-reduce", &buf)?;
        session.all_reduce(&mut buf, op)?;
        session.show("After all-reduce", &buf)?;
        let expected = op.over((0..session.world_size()).map(|r| start(r) as f64));
        session.check(&buf, expected as f32)?;
        session.time(args.data.iters, |s| s.all_reduce(&mut buf, op))?;
        Ok(())
    })
}
