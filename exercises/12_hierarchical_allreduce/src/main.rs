//! Exercise 12 — Hierarchical all-reduce from split communicators (EXERCISES.md, chapter 12).
//!
//! A cluster has fast links inside a node and a slower network between nodes. A
//! hierarchical all-reduce sends across the network only what it must: first a
//! reduce-scatter inside each node (each of its p ranks ends with the node's sum of one
//! shard, 1/p of the buffer), then an all-reduce across the nodes of that shard alone (p
//! all-reduces at once, one per local rank, each 1/p of the buffer), then an all-gather
//! inside each node (every rank gets every shard back). It runs on two communicators split
//! from the world's: the ranks of one node, and the ranks of one local rank on every node.
//!
//! Run it:   `cargo run --release --bin ex12-hierarchical-allreduce -- --nproc-per-node 4 --per-node 2 --count 8`
//! Check it: `cargo workbook check 12`

use anyhow::Result;
use clap::Parser;
use common::{Buffer, ReduceOp, Session, Split, collective};

/// Hierarchical all-reduce (sum) built from split communicators.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    #[command(flatten)]
    run: common::RunArgs,
    #[command(flatten)]
    data: common::DataArgs,
    /// Ranks per node (consecutive ranks share one): by default the ranks of the first machine.
    #[arg(long)]
    per_node: Option<usize>,
    /// Which all-reduce to time: the hierarchical one, the flat one, or both in turn.
    #[arg(long, value_enum, default_value_t = Timed::Both)]
    time: Timed,
}

/// Which all-reduce a run times (`--time`).
#[derive(Clone, Copy, PartialEq, clap::ValueEnum)]
enum Timed {
    /// The hierarchical all-reduce alone.
    Hierarchical,
    /// The flat all-reduce of the world's communicator alone.
    Flat,
    /// Both, the hierarchical first.
    Both,
}

/// The two communicators of the hierarchy.
struct Hierarchy {
    /// The ranks of this rank's node, in rank order.
    node: Split,
    /// The ranks with this rank's local rank, one per node, in node order.
    across: Split,
}

/// Splits the world into nodes of `per_node` consecutive ranks, and across them.
#[allow(unused_variables)] // remove this line when you are done
fn hierarchy(s: &mut Session, per_node: usize) -> Result<Hierarchy> {
    let rank = s.rank();
    let (node, local) = (rank / per_node, rank % per_node);
    // Step 1. Split the world twice, every rank calling both, in the same order:
    //   `node`:   the ranks of this rank's node, in rank order;
    //   `across`: the ranks with this rank's local rank, one per node, in node order.
    // The call: s.split(color: i32, key: i32)? -> Split: the ranks that give one color
    // form a communicator, numbered by their key (then their rank). `node` and `local`
    // are usize: `as i32` makes one an i32.
    // TODO: which color and key for each? (As given, every rank joins one communicator.)
    let node_comm = s.split(0, 0)?;
    let across = s.split(0, 0)?;
    Ok(Hierarchy {
        node: node_comm,
        across,
    })
}

/// Every rank's `buf` becomes the element-wise sum of all ranks' buffers; `shard` (1/p
/// of it, p ranks per node) is working memory.
#[allow(unused_variables)] // remove this line when you are done
fn hierarchical_all_reduce(
    s: &mut Session,
    h: &mut Hierarchy,
    buf: &mut Buffer<f32>,
    shard: &mut Buffer<f32>,
) -> Result<()> {
    // Three collectives, each on one communicator of the hierarchy. A call on a split
    // communicator goes inside s.on, where ranks and blocks are numbered in it:
    //     s.on(split: &mut Split, |s| s.<a collective>(...))?;
    // The collectives (op: ReduceOp::Sum; n: the ranks of the communicator they run on):
    //     s.reduce_scatter_into(send: &Buffer<f32>, recv: &mut Buffer<f32>, op)?
    //         rank i's `recv` gets block i of the op of every rank's `send` (n × recv.len())
    //     s.all_reduce(buf: &mut Buffer<f32>, op)?
    //         every rank's `buf` gets the op of all of them
    //     s.all_gather_into(send: &Buffer<f32>, recv: &mut Buffer<f32>)?
    //         every rank's `recv` (n × send.len() elements) gets rank i's `send` at block i
    // Step 2. Inside the node: this rank's shard of the node's sum.
    // Step 3. Across the nodes: that shard summed over every node.
    // Step 4. Inside the node again: every shard to every rank.
    // TODO: the three calls.
    Ok(())
}

fn main() -> std::process::ExitCode {
    let args: Args = common::parse_args();
    common::main(&args.run, |s| {
        let (rank, n) = (s.rank(), s.world_size());
        let p = common::grid::row_length("--per-node", args.per_node, s.ranks_per_node(), n)?;
        // Element i of rank r starts as r + 1 + 10 × (i mod 1000): every element's sum is
        // different (so a shard in the wrong place shows) and exact in f32.
        let start = |rank: usize, i: usize| (rank + 1 + 10 * (i % 1000)) as f32;
        let mut buf = s.buffer_with(&args.data, |i| start(rank, i))?;
        let len = common::grid::shard_len(buf.len(), p, &args.data.what())?;
        let mut shard = s.from_host(vec![0.0f32; len])?;
        let mut h = hierarchy(s, p)?;
        s.show("Before all-reduce", &buf)?;

        hierarchical_all_reduce(s, &mut h, &mut buf, &mut shard)?;

        s.show("After all-reduce", &buf)?;
        let expected: Vec<f32> = (0..buf.len()).map(|i| (0..n).map(|r| start(r, i)).sum()).collect();
        s.check_each(&buf, &expected)?;
        // Timed against the flat all-reduce of the world's communicator, in the same job.
        let bytes = buf.len() * size_of::<f32>();
        if args.time != Timed::Flat {
            s.say(&format!("Hierarchical ({} nodes of {p} ranks):", n / p));
            s.time_as(&collective::ALL_REDUCE, bytes, args.data.iters, |s| {
                hierarchical_all_reduce(s, &mut h, &mut buf, &mut shard)
            })?;
        }
        if args.time != Timed::Hierarchical {
            s.say("Flat (one all-reduce of every rank):");
            s.time(args.data.iters, |s| s.all_reduce(&mut buf, ReduceOp::Sum))?;
        }
        s.destroy(h.node)?;
        s.destroy(h.across)
    })
}
