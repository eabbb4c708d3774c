//! Exercise 5 — Ring all-reduce from point-to-point (EXERCISES.md, chapter 5).
//!
//! The ranks sit in a ring, each sending to its right neighbour and receiving from its
//! left. The buffer is cut into n chunks. A reduce-scatter (n-1 steps) leaves each rank
//! with the full sum of one chunk; an all-gather (n-1 more steps) passes the finished
//! chunks round until every rank has all of them. It is how NCCL and Gloo all-reduce, and
//! the exercise the PyTorch tutorial "Writing Distributed Applications" leaves to its reader.
//!
//! Run it:   `cargo run --release --bin ex05-ring-allreduce -- --nproc-per-node 3 --count 7`
//! Check it: `cargo workbook check 5`

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
}

/// Chunk `i` of the `n` chunks of a buffer of `len` elements: as equal as can be (7
/// elements in 3 chunks: 0..2, 2..4, 4..7); some are empty when `len < n`.
fn chunk(len: usize, n: usize, i: usize) -> Range<usize> {
    len * i / n..len * (i + 1) / n
}

/// Every rank's `buf` becomes the element-wise sum of all ranks' buffers.
#[allow(unused_variables)] // remove this line when you are done
fn ring_all_reduce(s: &mut Session, buf: &mut Buffer<f32>) -> Result<()> {
    let (rank, n, len) = (s.rank(), s.world_size(), buf.len());
    let (left, right) = ((rank + n - 1) % n, (rank + 1) % n);
    // Chunk numbers count round the ring: chunk n + 1 is chunk 1. They are usize: write
    // `rank + n - t`, never `rank - t`, which would go below zero.
    let c = |i: usize| chunk(len, n, i % n);

    // 5a. Reduce-scatter: n-1 steps. At each, send one chunk to the right and add the
    // chunk arriving from the left into yours, both at once:
    //     s.send_recv_add(buf, c(chunk you send), right, c(chunk you receive), left)?;
    // After the last step, this rank must hold the whole sum of chunk (rank + 1).
    for t in 0..n - 1 {
        // TODO: which chunk does this rank send at step t, and which one arrives?
    }
    // 5b. All-gather: n-1 more steps. At each, send a finished chunk to the right and put
    // the finished chunk arriving from the left in place of yours:
    //     s.send_recv(buf, c(chunk you send), right, c(chunk you receive), left)?;
    for t in 0..n - 1 {
        // TODO: which finished chunk does this rank send at step t, and which one arrives?
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

        ring_all_reduce(s, &mut buf)?;

        s.show("After all-reduce", &buf)?;
        let n = s.world_size();
        let expected: Vec<f32> = (0..buf.len()).map(|i| (0..n).map(|r| start(r, i)).sum()).collect();
        s.check_each(&buf, &expected)?;
        let bytes = buf.len() * size_of::<f32>();
        s.time_as(&collective::ALL_REDUCE, bytes, args.data.iters, |s| {
            ring_all_reduce(s, &mut buf)
        })?;
        Ok(())
    })
}
