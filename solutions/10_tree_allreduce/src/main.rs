//! Exercise 10 — Tree all-reduce from point-to-point: the reference solution (EXERCISES.md, chapter 10).
//!
//! The ranks sit in a binary tree rooted at rank 0 (rank r's children are 2r + 1 and
//! 2r + 2). Up: each rank adds its children's partial sums into its own buffer and sends
//! the sum of its whole subtree to its parent, so that the root ends with the sum of every
//! rank. Down: the root's finished buffer is broadcast back down the same tree. Both go
//! piece by piece (`--pieces`), so that every level of the tree works at once. NCCL's tree
//! is two trees over the nodes, each carrying half the data, with a chain inside each node
//! (EXERCISES.md, chapter 10).
//!
//! Run it:   `cargo run --release --bin sol10-tree-allreduce -- --nproc-per-node 5 --count 7`
//! Check it: `cargo workbook check 10 --solution`

use anyhow::Result;
use clap::Parser;
use common::collective;
use common::{Buffer, Session};

/// Tree all-reduce (sum) built from send and recv.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    #[command(flatten)]
    run: common::RunArgs,
    #[command(flatten)]
    data: common::DataArgs,
    /// Pieces the buffer is cut into, each going up (and then down) the tree on its own.
    #[arg(long, value_name = "P", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pieces: u32,
}

/// Rank `rank`'s place in a binary tree over `n` ranks rooted at rank 0, numbered as a
/// heap: its parent (`None` for the root) and its children (none, one or two).
fn tree(rank: usize, n: usize) -> (Option<usize>, Vec<usize>) {
    let parent = (rank > 0).then(|| (rank - 1) / 2);
    let children = [2 * rank + 1, 2 * rank + 2].into_iter().filter(|&c| c < n).collect();
    (parent, children)
}

/// Every rank's `buf` becomes the element-wise sum of all ranks' buffers.
fn tree_all_reduce(s: &mut Session, buf: &mut Buffer<f32>, pieces: usize) -> Result<()> {
    let (parent, children) = tree(s.rank(), s.world_size());
    let len = buf.len();
    // Piece k of the buffer: as equal as can be, some empty when len < pieces.
    let piece = |k: usize| len * k / pieces..len * (k + 1) / pieces;

    // 10a. Reduce, up: add each child's piece (the sum of its subtree) into yours, then
    // pass the sum of your subtree on to your parent. The root ends with the whole sum.
    for k in 0..pieces {
        for &child in &children {
            s.recv_add_part(buf, piece(k), child)?;
        }
        if let Some(parent) = parent {
            s.send_part(buf, piece(k), parent)?;
        }
    }
    // 10b. Broadcast, down: take the finished piece from your parent in place of your
    // partial sum, and pass it on to each child.
    for k in 0..pieces {
        if let Some(parent) = parent {
            s.recv_part(buf, piece(k), parent)?;
        }
        for &child in &children {
            s.send_part(buf, piece(k), child)?;
        }
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    let args: Args = common::parse_args();
    common::main(&args.run, |s| {
        // Element i of rank r starts as r + 1 + 10 × (i mod 1000): every element's sum is
        // different (so a piece in the wrong place shows) and exact in f32.
        let start = |rank: usize, i: usize| (rank + 1 + 10 * (i % 1000)) as f32;
        let rank = s.rank();
        let pieces = args.pieces as usize;
        let mut buf = s.buffer_with(&args.data, |i| start(rank, i))?;
        s.show("Before all-reduce", &buf)?;

        tree_all_reduce(s, &mut buf, pieces)?;

        s.show("After all-reduce", &buf)?;
        let n = s.world_size();
        let expected: Vec<f32> = (0..buf.len()).map(|i| (0..n).map(|r| start(r, i)).sum()).collect();
        s.check_each(&buf, &expected)?;
        let bytes = buf.len() * size_of::<f32>();
        s.time_as(&collective::ALL_REDUCE, bytes, args.data.iters, |s| {
            tree_all_reduce(s, &mut buf, pieces)
        })?;
        Ok(())
    })
}
