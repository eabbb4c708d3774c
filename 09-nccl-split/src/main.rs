//! 09 — Split communicators: the world's ranks as a grid, as Megatron builds it.
//!
//! Large models are trained on a grid of GPUs. The ranks of one node form a
//! tensor-parallel group (a row: they all-reduce activations many times per layer, over
//! the node's fast links); the ranks that hold the same part of the model on every node
//! form a data-parallel group (a column: they all-reduce gradients once per step, over
//! the network). Each group is a communicator of its own, split from the world's with
//! `ncclCommSplit`: ranks that give the same color join one, ordered by their key.
//!
//! An all-reduce on the rows, then one on the columns, gives every rank the sum of the
//! whole world: the two-step all-reduce that hierarchical algorithms are made of.
//!
//! Run it: `cargo run --release --bin 09-nccl-split -- --nproc-per-node 4 --tp 2`

use clap::Parser;
use common::ReduceOp;

/// Split the world into rows (tensor-parallel groups) and columns (data-parallel groups),
/// and all-reduce on each.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    #[command(flatten)]
    run: common::RunArgs,
    #[command(flatten)]
    data: common::DataArgs,
    /// Ranks per row (tensor-parallel group): by default the ranks of one node.
    #[arg(long)]
    tp: Option<usize>,
}

fn main() -> std::process::ExitCode {
    let args: Args = common::parse_args();
    common::main(&args.run, |session| {
        let (rank, n) = (session.rank(), session.world_size());
        // The grid: `tp` ranks per row, as Megatron places them (rank = row × tp + column).
        let tp = common::grid::row_length("--tp", args.tp, session.ranks_per_node(), n)?;
        let (row, column) = (rank / tp, rank % tp);

        // Two splits, each called by every rank: the color says which group, the key the
        // rank's place in it.
        // NCCL:    ncclCommSplit(comm, color, key, &newcomm, config)
        // PyTorch: dist.new_group(ranks), or a DeviceMesh's dimensions
        let mut rows = session.split(row as i32, column as i32)?;
        let mut columns = session.split(column as i32, row as i32)?;
        let rows_n = n / tp;
        session.say(&format!(
            "A grid of {rows_n} row{} (tensor-parallel groups) of {tp} ranks; its columns are the data-parallel groups.",
            if rows_n == 1 { "" } else { "s" }
        ));

        // Rank r holds r + 1 (or --value), so that every sum shows who took part.
        let start = |r: usize| args.data.value.unwrap_or((r + 1) as f32);
        let mut buf = session.buffer(&args.data, start(rank))?;
        session.show("Before", &buf)?;

        // The lesson: an all-reduce on each row, then on each column.
        session.on(&mut rows, |s| {
            s.all_reduce(&mut buf, ReduceOp::Sum)?;
            s.show("Rows: after the all-reduce in each tensor-parallel group", &buf)?;
            s.check(&buf, (row * tp..row * tp + tp).map(start).sum())
        })?;
        session.on(&mut columns, |s| {
            s.all_reduce(&mut buf, ReduceOp::Sum)?;
            s.show("Columns: after the all-reduce in each data-parallel group", &buf)?;
            s.check(&buf, (0..n).map(start).sum())
        })?;
        session.say("Rows then columns: every rank holds the sum over the whole world, as one all-reduce would give.");

        session.destroy(rows)?;
        session.destroy(columns)
    })
}
