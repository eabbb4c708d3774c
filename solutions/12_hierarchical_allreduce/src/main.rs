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
fn hierarchy(s: &mut Session, per_node: usize) -> Result<Hierarchy> {
    let rank = s.rank();
    let (node, local) = (rank / per_node, rank % per_node);
    // Step 1. One communicator per node (color: the node), one per local rank (color: the
    // local rank), each ordered by the other number.
    let node_comm = s.split(node as i32, local as i32)?;
    let across = s.split(local as i32, node as i32)?;
    Ok(Hierarchy {
        node: node_comm,
        across,
    })
}

/// Every rank's `buf` becomes the element-wise sum of all ranks' buffers; `shard` (1/p
/// of it, p ranks per node) is working memory.
fn hierarchical_all_reduce(
    s: &mut Session,
    h: &mut Hierarchy,
    buf: &mut Buffer<f32>,
    shard: &mut Buffer<f32>,
) -> Result<()> {
    // Step 2. Inside the node: this rank's shard of the node's sum.
    s.on(&mut h.node, |s| s.reduce_scatter_into(buf, shard, ReduceOp::Sum))?;
    // Step 3. Across the nodes: that shard summed over every node.
    s.on(&mut h.across, |s| s.all_reduce(shard, ReduceOp::Sum))?;
    // Step 4. Inside the node again: every shard to every rank.
    s.on(&mut h.node, |s| s.all_gather_into(shard, buf))
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
