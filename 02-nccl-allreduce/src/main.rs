//! 02 — All-reduce: every rank contributes its buffer; every rank gets the sum.
//!
//! This is the operation at the heart of data-parallel training: each GPU computes
//! gradients on its own slice of the data, and an all-reduce adds them up so that every
//! GPU applies the same update. With all-ones buffers on n ranks, every element becomes n.
//! `--op` picks NCCL's other operators: `prod`, `max`, `min`, and `avg` (the sum divided
//! by n: the mean gradient, in one call).
//!
//! Run it: `cargo run --release --bin 02-nccl-allreduce -- --nproc-per-node 4 --init rank`

use clap::Parser;
use common::Init;
use common::ReduceOp;

/// All-reduce: every rank ends up with the element-wise sum (or --op) of all buffers.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    #[command(flatten)]
    run: common::RunArgs,
    #[command(flatten)]
    data: common::DataArgs,
    /// How the buffers are combined, element by element (NCCL's ncclSum, ncclProd...).
    #[arg(long, value_enum, default_value_t = ReduceOp::Sum)]
    op: ReduceOp,
}

fn main() -> std::process::ExitCode {
    let args: Args = common::parse_args();
    let op = args.op;
    common::main(&args.run, |session| {
        // What each rank contributes: ones (or --value) everywhere, or with --init rank,
        // rank r holds r+1, so the sum 1+2+…+n shows that every rank took part.
        let start = |rank: usize| match args.data.init {
            Init::Ones => args.data.value.unwrap_or(1.0),
            Init::Rank => (rank + 1) as f32,
        };
        let mut buf = session.buffer(&args.data, start(session.rank()))?;
        session.show("Before all-reduce", &buf)?;

        // The lesson: one call, and every rank's buffer becomes the sum (or --op) of all of them.
        // NCCL:    ncclAllReduce(sendbuff, recvbuff, count, ncclFloat, ncclSum, comm, stream)
        // PyTorch: dist.all_reduce(t, op=ReduceOp.SUM)
        session.all_reduce(&mut buf, op)?;

        session.show("After all-reduce", &buf)?;
        // What NCCL computes for each element, from every rank's start value.
        let expected = op.over((0..session.world_size()).map(|r| start(r) as f64));
        session.check(&buf, expected as f32)?;
        session.time(args.data.iters, |s| s.all_reduce(&mut buf, op))?;
        Ok(())
    })
}
