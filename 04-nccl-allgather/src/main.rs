//! 04 — All-gather: every rank contributes one block; every rank gets all of them.
//!
//! Each rank sends `--count` elements and receives n × count: block b of every rank's
//! receive buffer is rank b's send buffer. This is how ZeRO and FSDP train models too
//! large for one GPU: each rank keeps only its shard of the parameters, and an
//! all-gather puts the whole layer together on every rank just before it is needed.
//! Here rank r sends r+1, so each block shows who sent it.
//!
//! With `--in-place` there is one buffer of n blocks per rank, its own block filled at
//! block `rank` (NCCL's in-place form: `sendbuff == recvbuff + rank × count`).
//!
//! Run it: `cargo run --release --bin 04-nccl-allgather -- --nproc-per-node 4`

use clap::Parser;

/// All-gather: every rank ends up with every rank's block, in rank order.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    #[command(flatten)]
    run: common::RunArgs,
    #[command(flatten)]
    data: common::DataArgs,
    /// One buffer of n blocks (own block at block `rank`) instead of a send and a receive buffer.
    #[arg(long)]
    in_place: bool,
}

fn main() -> std::process::ExitCode {
    let args: Args = common::parse_args();
    common::main(&args.run, |session| {
        let (rank, n) = (session.rank(), session.world_size());
        let mine = (rank + 1) as f32; // what rank r sends: r+1
        let send = session.buffer(&args.data, mine)?;
        let count = send.len();
        // After the all-gather, block b of every rank holds rank b's r+1.
        let expected: Vec<f32> = (0..n * count).map(|i| (i / count + 1) as f32).collect();
        let from = |b: usize| format!("from rank {b}");

        // The lesson, below: one call, made by every rank; block b of every rank's result is rank b's.
        // NCCL:    ncclAllGather(sendbuff, recvbuff, sendcount, ncclFloat, comm, stream)
        // PyTorch: dist.all_gather_into_tensor(out, t)
        let mut recv = if args.in_place {
            // One buffer: this rank's own block filled, the others zeros.
            let mut buf = session.blocks(&args.data, |b| if b == rank { mine } else { 0.0 })?;
            session.show_blocks("Before all-gather (one buffer, own block filled)", &buf, from)?;
            session.all_gather(&mut buf)?; // the lesson, in place
            buf
        } else {
            session.show("Before all-gather (each rank's send buffer)", &send)?;
            let mut recv = session.blocks(&args.data, |_| 0.0)?;
            session.all_gather_into(&send, &mut recv)?; // the lesson: one call, every rank
            recv
        };

        session.show_blocks("After all-gather (each rank's receive buffer)", &recv, from)?;
        session.say("Every rank holds the same buffer: block b is what rank b sent.");
        session.check_each(&recv, &expected)?;
        session.time(args.data.iters, |s| {
            if args.in_place {
                s.all_gather(&mut recv)
            } else {
                s.all_gather_into(&send, &mut recv)
            }
        })?;
        Ok(())
    })
}
