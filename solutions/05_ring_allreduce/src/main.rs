//! Exercise 5 — Ring all-reduce from point-to-point: the reference solution (EXERCISES.md, chapter 5).
//!
//! The ranks sit in a ring, each sending to its right neighbour and receiving from its
//! left. The buffer is cut into n chunks. A reduce-scatter (n-1 steps) leaves each rank
//! with the full sum of one chunk; an all-gather (n-1 more steps) passes the finished
//! chunks round until every rank has all of them. It is how NCCL and Gloo all-reduce, and
//! the exercise the PyTorch tutorial "Writing Distributed Applications" leaves to its reader.
//!
//! Run it:   `cargo run --release --bin sol05-ring-allreduce -- --nproc-per-node 3 --count 7`
//! Check it: `cargo workbook check 5 --solution`

use anyhow::Result;
use clap::Parser;
use common::collective;
use common::{Buffer, Session};
use std::ops::Range;

/// Ring all-reduce (sum) built from send and recv.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    #[command(flatten)]
    run: common::RunArgs,
    #[command(flatten)]
    data: common::DataArgs,
    /// Each step sends, then receives (instead of both at once): see EXERCISES.md 5c.
    #[arg(long)]
    send_first: bool,
}

/// Chunk `i` of the `n` chunks of a buffer of `len` elements: as equal as can be (7
/// elements in 3 chunks: 0..2, 2..4, 4..7); some are empty when `len < n`.
fn chunk(len: usize, n: usize, i: usize) -> Range<usize> {
    len * i / n..len * (i + 1) / n
}

/// Every rank's `buf` becomes the element-wise sum of all ranks' buffers.
fn ring_all_reduce(s: &mut Session, buf: &mut Buffer<f32>, send_first: bool) -> Result<()> {
    let (rank, n, len) = (s.rank(), s.world_size(), buf.len());
    let (left, right) = ((rank + n - 1) % n, (rank + 1) % n);
    // Chunk numbers count round the ring: chunk n + 1 is chunk 1. They are usize: write
    // `rank + n - t`, never `rank - t`, which would go below zero.
    let c = |i: usize| chunk(len, n, i % n);

    // 5a. Reduce-scatter: at step t, send chunk (rank - t) to the right and add the chunk
    // (rank - t - 1) arriving from the left into yours. After n-1 steps, this rank holds
    // the whole sum of chunk (rank + 1).
    for t in 0..n - 1 {
        let (send, recv) = (c(rank + n - t), c(rank + n - t - 1));
        if send_first {
            s.send_part(buf, send, right)?;
            s.recv_add_part(buf, recv, left)?;
        } else {
            s.send_recv_add(buf, send, right, recv, left)?;
        }
    }
    // 5b. All-gather: at step t, send the finished chunk (rank + 1 - t) to the right and
    // take the finished chunk (rank - t) from the left in place of yours.
    for t in 0..n - 1 {
        s.send_recv(buf, c(rank + 1 + n - t), right, c(rank + n - t), left)?;
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    let args: Args = common::parse_args();
    common::main(&args.run, |s| {
        // Element i of rank r starts as r + 1 + 10 × (i mod 1000): every element's sum is
        // different (so a chunk in the wrong place shows) and exact in f32.
        let start = |rank: usize, i: usize| (rank + 1 + 10 * (i % 1000)) as f32;
        let rank = s.rank();
        let mut buf = s.buffer_with(&args.data, |i| start(rank, i))?;
        s.show("Before all-reduce", &buf)?;

        ring_all_reduce(s, &mut buf, args.send_first)?;

        s.show("After all-reduce", &buf)?;
        let n = s.world_size();
        let expected: Vec<f32> = (0..buf.len()).map(|i| (0..n).map(|r| start(r, i)).sum()).collect();
        s.check_each(&buf, &expected)?;
        let bytes = buf.len() * size_of::<f32>();
        s.time_as(&collective::ALL_REDUCE, bytes, args.data.iters, |s| {
            ring_all_reduce(s, &mut buf, args.send_first)
        })?;
        Ok(())
    })
}
