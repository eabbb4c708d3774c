//! 03 — Reduce: every rank contributes its buffer; only the root gets the result.
//!
//! An all-reduce whose result lands on one rank, the root: what a training loop does with
//! a loss or a metric that only rank 0 logs. The other ranks' buffers are left as they
//! were and nothing is sent back to them, so each link carries about half of what an
//! all-reduce's does.
//! `--op` picks how the buffers combine: `sum`, `prod`, `max`, `min` or `avg` (sum / n).
//!
//! Run it: `cargo run --release --bin 03-nccl-reduce -- --nproc-per-node 4 --init rank --root 2`

use clap::Parser;
use common::{Init, ReduceOp};

/// Reduce: the root ends up with the element-wise sum (or --op) of every rank's buffer.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    #[command(flatten)]
    run: common::RunArgs,
    #[command(flatten)]
    data: common::DataArgs,
    /// The rank that receives the result.
    #[arg(long, value_name = "R", default_value_t = 0)]
    root: usize,
    /// How the buffers are combined, element by element (NCCL's ncclSum, ncclProd...).
    #[arg(long, value_enum, default_value_t = ReduceOp::Sum)]
    op: ReduceOp,
}

fn main() -> std::process::ExitCode {
    let args: Args = common::parse_args();
    let op = args.op;
    common::main(&args.run, |session| {
        let root = session.ensure_rank(args.root, "--root")?; // the root must be one of the ranks

        // What each rank contributes, as in 02: ones (or --value), or with --init rank,
        // rank r holds r+1, so the result shows that every rank took part.
        let start = |rank: usize| match args.data.init {
            Init::Ones => args.data.value.unwrap_or(1.0),
            Init::Rank => (rank + 1) as f32,
        };
        let mut buf = session.buffer(&args.data, start(session.rank()))?;
        session.show("Before reduce", &buf)?;

        // The lesson: one call, made by every rank. Only the root's buffer changes.
        // NCCL:    ncclReduce(sendbuff, recvbuff, count, ncclFloat, ncclSum, root, comm, stream)
        // PyTorch: dist.reduce(t, dst=root)
        session.reduce(&mut buf, root, op)?;

        session.show("After reduce", &buf)?;
        session.say(&format!(
            "Only the root, rank {root}, holds the {} of every rank's buffer; the other ranks' buffers are unchanged.",
            op.name()
        ));
        // The root holds what NCCL computes from every rank's start value; the others
        // still hold their own.
        let result = op.over((0..session.world_size()).map(|r| start(r) as f64)) as f32;
        let mine = if session.rank() == root {
            result
        } else {
            start(session.rank())
        };
        session.check_each(&buf, &vec![mine; buf.len()])?;
        session.time(args.data.iters, |s| s.reduce(&mut buf, root, op))?;
        Ok(())
    })
}
