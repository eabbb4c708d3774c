//! 05 — Reduce-scatter: every rank contributes n blocks; rank b gets the sum of block b.
//!
//! Each rank sends n × `--count` elements and receives `--count`: its own shard of the
//! element-wise sum (or `--op`) of every rank's buffer. ZeRO and FSDP use it for the
//! gradients: each rank keeps only the summed gradients of the parameters it owns. And
//! an all-reduce is a reduce-scatter followed by an all-gather: that is how NCCL's ring
//! all-reduce runs, and how 02 runs here with `--steps` (at other sizes the CPU backend
//! picks another algorithm, and the `Time:` line names it).
//!
//! Block b of rank r holds (r+1) × (b+1), a multiplication table: with 4 ranks rank b
//! receives (1+2+3+4) × (b+1) = 10, 20, 30, 40. `--in-place` uses one buffer, in which
//! rank r's shard replaces its block r (NCCL's `recvbuff == sendbuff + rank × count`).
//!
//! Run it: `cargo run --release --bin 05-nccl-reducescatter -- --nproc-per-node 4`

use clap::Parser;
use common::ReduceOp;

/// Reduce-scatter: rank b ends up with block b of the element-wise sum (or --op).
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
    /// One buffer of n blocks, whose block `rank` receives the shard.
    #[arg(long)]
    in_place: bool,
}

fn main() -> std::process::ExitCode {
    let args: Args = common::parse_args();
    let op = args.op;
    common::main(&args.run, |session| {
        let (rank, n) = (session.rank(), session.world_size());
        let value = |r: usize, b: usize| ((r + 1) * (b + 1)) as f32; // rank r's block b
        let mut recv = session.buffer(&args.data, 0.0)?; // this rank's shard: --count elements
        let count = recv.len();
        let mut send = session.blocks(&args.data, |b| value(rank, b))?; // n blocks of --count
        let to = |b: usize| format!("block {b} → rank {b}");
        session.show_blocks("Before reduce-scatter", &send, to)?;

        // The lesson: one call, made by every rank; rank b receives the reduction of block b.
        // NCCL:    ncclReduceScatter(sendbuff, recvbuff, recvcount, ncclFloat, ncclSum, comm, stream)
        // PyTorch: dist.reduce_scatter_tensor(out, t)
        if args.in_place {
            session.reduce_scatter(&mut send, op)?;
        } else {
            session.reduce_scatter_into(&send, &mut recv, op)?;
        }

        // What NCCL computes for block b: the op over every rank's value of block b.
        let shard = |b: usize| op.over((0..n).map(|r| value(r, b) as f64)) as f32;
        let holds = format!("the {} of every rank's block b", op.name());
        if args.in_place {
            session.show_blocks("After reduce-scatter (block b of rank b is its shard)", &send, to)?;
            session.say(&format!(
                "Block b of rank b now holds {holds}; the other blocks are unchanged."
            ));
            // The other blocks keep what this rank put there; block `rank` is its shard.
            let mut expected: Vec<f32> = (0..n * count).map(|i| value(rank, i / count)).collect();
            expected[rank * count..(rank + 1) * count].fill(shard(rank));
            session.check_each(&send, &expected)?;
        } else {
            session.show("After reduce-scatter (each rank's shard)", &recv)?;
            session.say(&format!("Rank b holds {holds}."));
            session.check_each(&recv, &vec![shard(rank); count])?;
        }
        session.time(args.data.iters, |s| {
            if args.in_place {
                s.reduce_scatter(&mut send, op)
            } else {
                s.reduce_scatter_into(&send, &mut recv, op)
            }
        })?;
        Ok(())
    })
}
