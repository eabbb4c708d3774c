//! 00 — Hello world: ranks, devices and the rendezvous.
//!
//! A distributed program is the same program started several times. Each copy, a
//! *rank*, learns three things before it can talk to the others:
//! - who it is: its rank among `world_size` ranks, and its *local rank* on its machine;
//! - where to meet: the master's address, where rank 0 hosts a small key-value store;
//! - which device to use: the course's rule, `device = rank % device_count`.
//!
//! Run it: `cargo run --release --bin 00-nccl-hello-world -- --nproc-per-node 4`

use clap::Parser;

/// Starts the ranks, lets them meet, and prints who is who.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    #[command(flatten)]
    run: common::RunArgs,
}

fn main() -> std::process::ExitCode {
    let args: Args = common::parse_args();

    // `common::main` either starts the ranks (when nothing says which rank this process
    // is) or, inside a rank, joins the rendezvous and hands us the session.
    // NCCL:    ncclGetUniqueId on rank 0, shared, then ncclCommInitRank(&comm, nranks, id, rank)
    // PyTorch: dist.init_process_group("nccl")
    common::main(&args.run, |session| {
        // Every rank has registered its rank, local rank, host, pid and device with the
        // store; rank 0 gathers them and prints one row per rank, in rank order.
        session.roll_call()
    })
}
