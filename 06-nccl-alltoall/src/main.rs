//! 06 — All-to-all: every rank sends a different block to every rank.
//!
//! Each rank's send buffer holds n blocks of `--count` elements: block j goes to rank j,
//! and block i of the receive buffer comes from rank i. It is a transpose of the blocks
//! across the ranks. Mixture-of-experts models route each token to the rank that holds
//! its expert this way, and back; distributed FFTs and matrix transposes use it too.
//! Here it is a group of sends and receives, one per peer: NCCL had no all-to-all function
//! before 2.28 (`ncclAlltoAll`), and the workbook builds against NCCL 2.24's API.
//!
//! Block j of rank i holds 10·i + j: the tens digit says who sent it, the units digit
//! to whom (100·i + j beyond 10 ranks). After the call, rank j holds 10·i + j in block i.
//! `--in-place` uses one buffer, whose blocks are replaced by what arrives.
//!
//! Run it: `cargo run --release --bin 06-nccl-alltoall -- --nproc-per-node 4`

use clap::Parser;

/// All-to-all: block j of rank i's buffer goes to block i of rank j's.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    #[command(flatten)]
    run: common::RunArgs,
    #[command(flatten)]
    data: common::DataArgs,
    /// One buffer of n blocks, sent and replaced.
    #[arg(long)]
    in_place: bool,
}

fn main() -> std::process::ExitCode {
    let args: Args = common::parse_args();
    common::main(&args.run, |session| {
        let (rank, n) = (session.rank(), session.world_size());
        let scale = if n <= 10 { 10 } else { 100 };
        let value = |from: usize, to: usize| (scale * from + to) as f32;
        // n blocks of --count elements: block j of this rank's send buffer is for rank j.
        let mut send = session.blocks(&args.data, |j| value(rank, j))?;
        let mut recv = session.blocks(&args.data, |_| 0.0)?;
        let count = args.data.count();
        session.show_blocks("Before all-to-all (send buffers)", &send, |b| format!("to rank {b}"))?;

        // The lesson: one call, made by every rank: block j goes to rank j.
        // NCCL:    ncclGroupStart(), ncclSend and ncclRecv per peer, ncclGroupEnd() (ncclAlltoAll from 2.28)
        // PyTorch: dist.all_to_all_single(out, t)
        if args.in_place {
            session.all_to_all(&mut send)?;
        } else {
            session.all_to_all_into(&send, &mut recv)?;
        }

        let got = if args.in_place { &send } else { &recv };
        session.show_blocks("After all-to-all (receive buffers)", got, |b| format!("from rank {b}"))?;
        session.say("Block j of rank i went to rank j, as its block i: the blocks were transposed.");
        let expected: Vec<f32> = (0..n * count).map(|i| value(i / count, rank)).collect();
        session.check_each(got, &expected)?;
        session.time(args.data.iters, |s| {
            if args.in_place {
                s.all_to_all(&mut send)
            } else {
                s.all_to_all_into(&send, &mut recv)
            }
        })?;
        Ok(())
    })
}
