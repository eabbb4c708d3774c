//! A soak: many verified collectives of random sizes and roots on every rank, then a
//! check that no file descriptor leaked. Run it as a job:
//! `cargo run --release -p common --example soak -- --nproc-per-node 3 --rounds 1000`

use clap::Parser;
use common::ReduceOp;
use common::{Init, Session};

/// Many verified broadcasts and all-reduces of random sizes and roots.
#[derive(Parser)]
struct Args {
    #[command(flatten)]
    run: common::RunArgs,
    /// How many collectives to run and check.
    #[arg(long, default_value_t = 1000)]
    rounds: u32,
    /// The largest buffer, in elements.
    #[arg(long, default_value_t = 50_000)]
    max_count: u64,
}

fn main() -> std::process::ExitCode {
    let args: Args = common::parse_args();
    common::main(&args.run, |session| soak(session, &args))
}

fn soak(session: &mut Session, args: &Args) -> anyhow::Result<()> {
    let (rank, n) = (session.rank(), session.world_size());
    // Every rank draws the same sequence, so all agree on each round's size and root.
    let mut rng = testkit::Xorshift(0x9e37_79b9_7f4a_7c15);
    let mut next = |n| rng.below(n);
    // A rank holds one descriptor more for each shared-memory channel it makes (its lock
    // on the channel's file), and pairs connect on first use: those are not leaks.
    let mut fds_after_first = 0;
    let mut channels_after_first = 0;
    for round in 0..args.rounds {
        let data = common::DataArgs {
            count: 1 + next(args.max_count),
            size: None,
            value: None,
            init: Init::Rank,
            show: Some(0),
            iters: 1,
        };
        if next(2) == 0 {
            let root = next(n as u64) as usize;
            let value = |r: usize| (r * 1000 + round as usize % 1000) as f32;
            let mut buf = session.buffer(&data, value(rank))?;
            session.broadcast(&mut buf, root)?;
            session.check(&buf, value(root))?;
        } else {
            let mut buf = session.buffer(&data, (rank + 1) as f32)?;
            session.all_reduce(&mut buf, ReduceOp::Sum)?;
            session.check(&buf, (n * (n + 1) / 2) as f32)?;
        }
        let fds = std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0);
        let channels = workbook_cpu::transport::shm::channels_made() as usize;
        if round == 0 {
            fds_after_first = fds;
            channels_after_first = channels;
        } else if fds > fds_after_first + (channels - channels_after_first) {
            anyhow::bail!(
                "rank {rank}: {} file descriptors leaked after {round} rounds",
                fds - fds_after_first - (channels - channels_after_first)
            );
        }
    }
    session.say(&format!(
        "soak: {} verified collectives on {n} ranks, no descriptor leaked",
        args.rounds
    ));
    Ok(())
}
