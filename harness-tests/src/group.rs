//! The harness tests' program for groups (`Session::group`): many collectives in one
//! group, and an all-to-all of sends and receives with or without a group, every element
//! checked. Not a lesson: nothing to learn here (the lesson is EXERCISES.md, chapter 13).

use anyhow::Result;
use clap::{Parser, ValueEnum};
use common::{Buffer, ReduceOp, Session};

/// Groups, for the harness's tests.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    #[command(flatten)]
    run: common::RunArgs,
    /// `collectives`: broadcasts, all-reduces and one of each other collective, in one
    /// group; `alltoall`: an all-to-all of sends and receives.
    #[arg(long, value_enum, default_value_t = Mode::Collectives)]
    mode: Mode,
    /// Calls of each kind in the group (collectives).
    #[arg(long, default_value_t = 5)]
    calls: usize,
    /// Elements of a call's buffer, or of each block of the all-to-all (the k-th
    /// collective of a kind has `count + k`).
    #[arg(long, default_value_t = 4)]
    count: usize,
    /// The broadcasts' root.
    #[arg(long, default_value_t = 0)]
    root: usize,
    /// The all-to-all without a group: each rank sends to every peer, then receives.
    #[arg(long)]
    no_group: bool,
    /// How many times the group runs (each run checked).
    #[arg(long, default_value_t = 1)]
    iters: u32,
    /// The all-to-all's mistake, for the diagnosis tests: no send to rank + 1.
    #[arg(long)]
    skip_send_to_next: bool,
}

#[derive(ValueEnum, Clone, Copy)]
enum Mode {
    Collectives,
    Alltoall,
}

/// Every buffer's elements, one after the other, as one buffer to check.
fn joined(s: &mut Session, bufs: &[&Buffer<f32>]) -> Result<Buffer<f32>> {
    let mut all = Vec::new();
    for b in bufs {
        all.extend(s.to_host(b)?);
    }
    s.from_host(all)
}

fn collectives(s: &mut Session, a: &Args) -> Result<()> {
    let (rank, n) = (s.rank(), s.world_size());
    let root = s.ensure_rank(a.root, "--root")?;
    let len = |k: usize| a.count + k;
    // Broadcast k: the root holds 1000 k + i, the others -1.
    let bcast = |k: usize, i: usize| (1000 * k + i) as f32;
    // All-reduce k: rank r holds (r + 1)(k + 1) + i mod 7; the sum is n(n+1)/2 (k+1) + n (i mod 7).
    let value = |r: usize, k: usize, i: usize| ((r + 1) * (k + 1) + i % 7) as f32;
    let sum = |k: usize, i: usize| (n * (n + 1) / 2 * (k + 1) + n * (i % 7)) as f32;
    let mut expected: Vec<f32> = Vec::new();
    let mut b = Vec::new();
    let mut r = Vec::new();
    for k in 0..a.calls {
        let mine: Vec<f32> = (0..len(k))
            .map(|i| if rank == root { bcast(k, i) } else { -1.0 })
            .collect();
        b.push(s.from_host(mine)?);
        expected.extend((0..len(k)).map(|i| bcast(k, i)));
    }
    for k in 0..a.calls {
        r.push(s.from_host((0..len(k)).map(|i| value(rank, k, i)).collect())?);
        expected.extend((0..len(k)).map(|i| sum(k, i)));
    }
    // One of each other kind: an all-gather of rank + 1, a reduce-scatter whose block b
    // holds b + 1 on every rank, a min-reduce onto the last rank (the others keep theirs).
    let gather_in = s.from_host(vec![(rank + 1) as f32; a.count])?;
    let mut gathered = s.from_host(vec![0.0; n * a.count])?;
    expected.extend((0..n * a.count).map(|i| (i / a.count + 1) as f32));
    let scatter_in = s.from_host((0..n * a.count).map(|i| (i / a.count + 1) as f32).collect())?;
    let mut scattered = s.from_host(vec![0.0; a.count])?;
    expected.extend(std::iter::repeat_n((n * (rank + 1)) as f32, a.count));
    let mut reduced = s.from_host(vec![rank as f32; a.count])?;
    let min = if rank == n - 1 { 0.0 } else { rank as f32 };
    expected.extend(std::iter::repeat_n(min, a.count));
    // In place, two calls of each (so that they pack), call k offset by 100 k: an
    // all-gather whose own block holds rank + 1, a reduce-scatter whose block b holds
    // b + 1 (the others' blocks stay as they were), an all-to-all whose block j of rank i
    // holds 10 i + j (it becomes block i of rank j).
    let c = a.count;
    let off = |k: usize| (100 * k) as f32;
    let blocks = |f: &dyn Fn(usize) -> f32| (0..n * c).map(|i| f(i / c)).collect::<Vec<f32>>();
    let in_place_start = |k: usize| -> [Vec<f32>; 3] {
        [
            blocks(&|b| if b == rank { (rank + 1) as f32 + off(k) } else { -1.0 }),
            blocks(&|b| (b + 1) as f32 + off(k)),
            blocks(&|j| (10 * rank + j) as f32 + off(k)),
        ]
    };
    let mut in_place: Vec<[Buffer<f32>; 3]> = Vec::new();
    for k in 0..2 {
        let [ag, rs, aa] = in_place_start(k);
        in_place.push([s.from_host(ag)?, s.from_host(rs)?, s.from_host(aa)?]);
        expected.extend(blocks(&|b| (b + 1) as f32 + off(k)));
        expected.extend(blocks(&|b| match b == rank {
            true => (n * (rank + 1)) as f32 + n as f32 * off(k),
            false => (b + 1) as f32 + off(k),
        }));
        expected.extend(blocks(&|i| (10 * i + rank) as f32 + off(k)));
    }
    for _ in 0..a.iters {
        let mut g = s.group()?;
        for t in b.iter_mut() {
            g.broadcast(t, root)?;
        }
        for t in r.iter_mut() {
            g.all_reduce(t, ReduceOp::Sum)?;
        }
        g.all_gather_into(&gather_in, &mut gathered)?;
        g.reduce_scatter_into(&scatter_in, &mut scattered, ReduceOp::Sum)?;
        g.reduce(&mut reduced, n - 1, ReduceOp::Min)?;
        for [ag, rs, aa] in in_place.iter_mut() {
            g.all_gather(ag)?;
            g.reduce_scatter(rs, ReduceOp::Sum)?;
            g.all_to_all(aa)?;
        }
        g.end()?;
        let mut bufs: Vec<&Buffer<f32>> = b.iter().chain(r.iter()).collect();
        bufs.extend([&gathered, &scattered, &reduced]);
        bufs.extend(in_place.iter().flatten());
        let all = joined(s, &bufs)?;
        s.check_each(&all, &expected)?;
        // The next run starts again from the same values.
        for (k, t) in r.iter_mut().enumerate() {
            *t = s.from_host((0..len(k)).map(|i| value(rank, k, i)).collect())?;
        }
        reduced = s.from_host(vec![rank as f32; a.count])?;
        for (k, bufs) in in_place.iter_mut().enumerate() {
            let [ag, rs, aa] = in_place_start(k);
            *bufs = [s.from_host(ag)?, s.from_host(rs)?, s.from_host(aa)?];
        }
    }
    Ok(())
}

fn all_to_all(s: &mut Session, a: &Args) -> Result<()> {
    let (rank, n) = (s.rank(), s.world_size());
    // Block j of rank i: 1000 i + 10 j + (e mod 10); it becomes block i of rank j.
    let value = |i: usize, j: usize, e: usize| (1000 * i + 10 * j + e % 10) as f32;
    let mut send = Vec::new();
    let mut recv = Vec::new();
    for j in 0..n {
        send.push(s.from_host((0..a.count).map(|e| value(rank, j, e)).collect())?);
        recv.push(s.from_host(vec![0.0; a.count])?);
    }
    let expected: Vec<f32> = (0..n)
        .flat_map(|i| (0..a.count).map(move |e| value(i, rank, e)))
        .collect();
    let peers: Vec<usize> = (0..n).filter(|&p| p != rank).collect();
    for _ in 0..a.iters {
        if a.no_group {
            for &p in &peers {
                s.send(&send[p], p)?;
            }
            for &p in &peers {
                s.recv(&mut recv[p], p)?;
            }
        } else {
            let mut g = s.group()?;
            for &p in peers.iter().filter(|&&p| !(a.skip_send_to_next && p == (rank + 1) % n)) {
                g.send(&send[p], p)?;
            }
            for (p, block) in recv.iter_mut().enumerate() {
                if p != rank {
                    g.recv(block, p)?;
                }
            }
            g.end()?;
        }
        recv[rank] = s.from_host(s.to_host(&send[rank])?)?;
        let all: Vec<&Buffer<f32>> = recv.iter().collect();
        let all = joined(s, &all)?;
        s.check_each(&all, &expected)?;
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    let args: Args = common::parse_args();
    common::main(&args.run, |s| match args.mode {
        Mode::Collectives => collectives(s, &args),
        Mode::Alltoall => all_to_all(s, &args),
    })
}
