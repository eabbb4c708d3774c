//! Exercise 13 — An all-to-all from sends and receives in one group (EXERCISES.md, chapter 13).
//!
//! Block j of every rank's send buffer goes to rank j, where it becomes block i of the
//! receive buffer, i being the sender: n - 1 sends and n - 1 receives per rank, every
//! rank sending at once. Issued one by one, a send of a large block waits until its peer
//! receives it, and the peer is sending too: a deadlock. Issued in one group, they
//! progress together (NCCL's ncclGroupStart/ncclGroupEnd, which is how programs for NCCL
//! before 2.28, and NCCL's own alltoall, write it).
//!
//! Run it:   `cargo run --release --bin ex13-grouped-alltoall -- --nproc-per-node 4`
//! Check it: `cargo workbook check 13`

use anyhow::Result;
use clap::Parser;
use common::collective;
use common::{Buffer, Session};

/// An all-to-all of `--count` elements per block, from grouped sends and receives.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    #[command(flatten)]
    run: common::RunArgs,
    #[command(flatten)]
    data: common::DataArgs,
    /// Without the group: every rank makes its sends one by one, then its receives
    /// (question 13.1).
    #[arg(long)]
    no_group: bool,
}

/// The all-to-all as n - 1 sends and n - 1 receives, all in one group: block j of
/// `send` to rank j, block i of `recv` from rank i. Your own block is copied already.
#[allow(unused_variables)] // remove this line when you are done
fn all_to_all_grouped(s: &mut Session, send: &[Buffer<f32>], recv: &mut [Buffer<f32>]) -> Result<()> {
    // The calls (ranks are usize):
    //     s.group()? -> Group                       opens a group (ncclGroupStart)
    //     g.send(buf: &Buffer<f32>, peer)?          a send of all of `buf`, in the group
    //     g.recv(buf: &mut Buffer<f32>, peer)?      a receive into all of `buf`, in the group
    //     g.end()?                                  ends it (ncclGroupEnd): runs them together
    // A group keeps every buffer it is given until its end: `&mut recv[i]` in a loop lends
    // it the whole of `recv` each time, `recv.iter_mut()` one block at a time.
    // TODO: the all-to-all, in one group.
    Ok(())
}

/// The same without a group (question 13.1), written for you: every rank sends all its
/// blocks, then receives.
fn all_to_all_ungrouped(s: &mut Session, send: &[Buffer<f32>], recv: &mut [Buffer<f32>]) -> Result<()> {
    let rank = s.rank();
    for (peer, block) in send.iter().enumerate() {
        if peer != rank {
            s.send(block, peer)?;
        }
    }
    for (peer, block) in recv.iter_mut().enumerate() {
        if peer != rank {
            s.recv(block, peer)?;
        }
    }
    Ok(())
}

fn all_to_all(s: &mut Session, send: &[Buffer<f32>], recv: &mut [Buffer<f32>], no_group: bool) -> Result<()> {
    match no_group {
        false => all_to_all_grouped(s, send, recv),
        true => all_to_all_ungrouped(s, send, recv),
    }
}

/// The blocks one after the other, as one buffer (for the tables and the check).
fn joined(s: &mut Session, blocks: &[Buffer<f32>]) -> Result<Buffer<f32>> {
    let mut all = Vec::new();
    for b in blocks {
        all.extend(s.to_host(b)?);
    }
    s.from_host(all)
}

fn main() -> std::process::ExitCode {
    let args: Args = common::parse_args();
    common::main(&args.run, |s| {
        let (rank, n) = (s.rank(), s.world_size());
        let count = args.data.count();
        // Block j of rank i holds 10 i + j (from i, to j), as in lesson 06.
        let scale = if n <= 10 { 10 } else { 100 };
        let value = |from: usize, to: usize| (scale * from + to) as f32;
        // One buffer per block: the group needs each block on its own to lend it.
        let all = s.blocks(&args.data, |j| value(rank, j))?;
        s.show_blocks("Before all-to-all (send buffers)", &all, |b| format!("to rank {b}"))?;
        let host = s.to_host(&all)?;
        let mut send = Vec::new();
        let mut recv = Vec::new();
        for block in host.chunks(count) {
            send.push(s.from_host(block.to_vec())?);
            recv.push(s.from_host(vec![0.0; count])?);
        }
        // This rank's own block stays here: a copy, no message.
        recv[rank] = s.from_host(host[rank * count..(rank + 1) * count].to_vec())?;

        all_to_all(s, &send, &mut recv, args.no_group)?;

        let got = joined(s, &recv)?;
        s.show_blocks("After all-to-all (receive buffers)", &got, |b| format!("from rank {b}"))?;
        let expected: Vec<f32> = (0..n * count).map(|i| value(i / count, rank)).collect();
        s.check_each(&got, &expected)?;
        let bytes = n * count * size_of::<f32>();
        s.time_as(&collective::ALL_TO_ALL, bytes, args.data.iters, |s| {
            all_to_all(s, &send, &mut recv, args.no_group)
        })?;
        Ok(())
    })
}
