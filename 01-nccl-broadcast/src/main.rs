//! 01 — Broadcast: one rank's buffer, copied to every rank.
//!
//! The root (rank 0 by default) fills its buffer with 42; every other rank starts with
//! zeros. After `broadcast`, every rank holds the root's buffer. How it travels depends
//! on the size and on where the ranks are, on NCCL as here, and the `Time:` line names
//! it: a small buffer goes from the root straight to every rank, a large one on one host
//! is copied by every rank straight from the root's memory, and between hosts it flows
//! along a ring, in pieces (docs/cpu-backend.md, "Which algorithm runs").
//!
//! Run it: `cargo run --release --bin 01-nccl-broadcast -- --nproc-per-node 4 --root 2`

use clap::Parser;
use common::Init;

/// Broadcast: every rank ends up with the root's buffer.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    #[command(flatten)]
    run: common::RunArgs,
    #[command(flatten)]
    data: common::DataArgs,
    /// The rank whose buffer is sent to everyone.
    #[arg(long, value_name = "R", default_value_t = 0)]
    root: usize,
}

fn main() -> std::process::ExitCode {
    let args: Args = common::parse_args();
    common::main(&args.run, |session| {
        let root = session.ensure_rank(args.root, "--root")?; // the root must be one of the ranks

        // What each rank holds before: the root has the message (42, or --value), the
        // others zeros. With --init rank, rank r holds r+1, so you can tell who was root.
        let start = |rank: usize| match args.data.init {
            Init::Ones if rank == root => args.data.value.unwrap_or(42.0),
            Init::Ones => 0.0,
            Init::Rank => (rank + 1) as f32,
        };
        let mut buf = session.buffer(&args.data, start(session.rank()))?;
        session.show("Before broadcast", &buf)?;

        // The lesson: one call, made by every rank. The root sends, the others receive.
        // NCCL:    ncclBroadcast(sendbuff, recvbuff, count, ncclFloat, root, comm, stream)
        // PyTorch: dist.broadcast(t, src=root)
        session.broadcast(&mut buf, root)?;

        session.show("After broadcast", &buf)?;
        // Every element of every rank must now be the root's value.
        session.check(&buf, start(root))?;
        session.time(args.data.iters, |s| s.broadcast(&mut buf, root))?;
        Ok(())
    })
}
