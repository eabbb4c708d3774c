//! Exercise 4 — Broadcast from point-to-point (EXERCISES.md, chapter 4).
//!
//! A broadcast is nothing but sends and receives. Three ways to arrange them:
//! - star: the root sends the whole buffer to each rank in turn;
//! - chain: each rank receives the whole buffer from the one before it and passes it on;
//! - pipeline: the chain, cut in pieces, so that every link is busy at the same time.
//!
//! Run it:   `cargo run --release --bin ex04-p2p-broadcast -- --nproc-per-node 4 --algo chain`
//! Check it: `cargo workbook check 4`

use anyhow::Result;
use clap::{Parser, ValueEnum};
use common::collective;
use common::{Buffer, Session};

/// Broadcast built from send and recv: every rank ends up with the root's buffer.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    #[command(flatten)]
    run: common::RunArgs,
    #[command(flatten)]
    data: common::DataArgs,
    /// The rank whose buffer is sent to everyone.
    #[arg(long, value_name = "R", default_value_t = 0)]
    root: usize,
    /// How the sends and receives are arranged.
    #[arg(long, value_enum, default_value_t = Algo::Star)]
    algo: Algo,
    /// Pieces the pipeline cuts the buffer into.
    #[arg(long, value_name = "P", default_value_t = 16,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pieces: u32,
}

#[derive(ValueEnum, Clone, Copy)]
enum Algo {
    Star,
    Chain,
    Pipeline,
}

/// 4a. Star: the root sends its whole buffer to every other rank, one after the other.
#[allow(unused_variables)] // remove this line when you are done
fn star(s: &mut Session, buf: &mut Buffer<f32>, root: usize) -> Result<()> {
    // The calls (ranks are usize; every send needs a matching recv on its peer):
    //     s.send(buf: &Buffer<f32>, peer)?;      sends all of `buf` to rank `peer`
    //     s.recv(buf: &mut Buffer<f32>, peer)?;  replaces all of `buf` with what `peer` sends
    // s.rank() and s.world_size() say who this rank is and how many ranks there are.
    // TODO: which ranks send, to whom, and which receive, from whom?
    Ok(())
}

/// 4b. Chain: ranks root, root+1, root+2, ... (round the ring) pass the whole buffer on,
/// each receiving it from the one before and sending it to the one after.
#[allow(unused_variables)] // remove this line when you are done
fn chain(s: &mut Session, buf: &mut Buffer<f32>, root: usize) -> Result<()> {
    let (rank, n) = (s.rank(), s.world_size());
    let pos = (rank + n - root) % n; // this rank's place in the chain: the root is 0
    let (prev, next) = ((rank + n - 1) % n, (rank + 1) % n);
    // The calls: the star's s.send(buf, peer)? and s.recv(buf, peer)?.
    // TODO: which ranks of the chain receive, and which send on? Look at `pos`: which
    //       rank has nobody before it, and which nobody after it?
    Ok(())
}

/// 4c. Pipeline: the chain, piece by piece: a rank passes piece k on as soon as it has
/// it, while piece k+1 is still on its way.
#[allow(unused_variables)] // remove this line when you are done
fn pipeline(s: &mut Session, buf: &mut Buffer<f32>, root: usize, pieces: usize) -> Result<()> {
    let (rank, n) = (s.rank(), s.world_size());
    let pos = (rank + n - root) % n;
    let (prev, next) = ((rank + n - 1) % n, (rank + 1) % n);
    let len = buf.len();
    let piece = |k: usize| len * k / pieces..len * (k + 1) / pieces;
    for k in 0..pieces {
        // The calls that move part of a buffer (range: Range<usize>, here `piece(k)`):
        //     s.send_part(buf: &Buffer<f32>, range, peer)?;      sends elements `range`
        //     s.recv_part(buf: &mut Buffer<f32>, range, peer)?;  replaces elements `range`
        // TODO: what the chain does, for piece `k` only.
    }
    Ok(())
}

fn broadcast(s: &mut Session, buf: &mut Buffer<f32>, root: usize, args: &Args) -> Result<()> {
    match args.algo {
        Algo::Star => star(s, buf, root),
        Algo::Chain => chain(s, buf, root),
        Algo::Pipeline => pipeline(s, buf, root, args.pieces as usize),
    }
}

fn main() -> std::process::ExitCode {
    let args: Args = common::parse_args();
    common::main(&args.run, |s| {
        let root = s.ensure_rank(args.root, "--root")?;
        // The root holds 42, 43, 44, ... (--value sets the first): a different value in
        // each element, so a piece put in the wrong place shows. The others hold zeros.
        let first = args.data.value.unwrap_or(42.0);
        let root_value = |i: usize| first + i as f32;
        let rank = s.rank();
        let mut buf = s.buffer_with(&args.data, |i| if rank == root { root_value(i) } else { 0.0 })?;
        s.show("Before broadcast", &buf)?;

        broadcast(s, &mut buf, root, &args)?;

        s.show("After broadcast", &buf)?;
        let expected: Vec<f32> = (0..buf.len()).map(root_value).collect();
        s.check_each(&buf, &expected)?;
        let bytes = buf.len() * size_of::<f32>();
        s.time_as(&collective::BROADCAST, bytes, args.data.iters, |s| {
            broadcast(s, &mut buf, root, &args)
        })?;
        Ok(())
    })
}
