//! Every collective, in place and out of place, on split communicators, each result
//! checked element by element. Run it as a job:
//! `cargo run -p common --example split -- --nproc-per-node 6 --colors 2 --reverse`
//! (tested by common/tests/split_job.rs)

use clap::Parser;
use common::{Buffer, ReduceOp, SPLIT_NOCOLOR, Session};

/// Splits the world into `--colors` communicators (rank r takes color r % colors) and
/// checks every collective on each.
#[derive(Parser)]
struct Args {
    #[command(flatten)]
    run: common::RunArgs,
    /// How many communicators: rank r takes color r % colors.
    #[arg(long, default_value_t = 2)]
    colors: usize,
    /// Keys in reverse (key = -rank): each communicator numbers its ranks backwards.
    #[arg(long)]
    reverse: bool,
    /// The last rank takes SPLIT_NOCOLOR: it joins no communicator.
    #[arg(long)]
    nocolor_last: bool,
    /// This rank calls no split and ends at once: the others must say it never came.
    #[arg(long)]
    skip_split: Option<usize>,
    /// Elements per block.
    #[arg(long, default_value_t = 5)]
    count: usize,
}

fn main() -> std::process::ExitCode {
    let args: Args = common::parse_args();
    common::main(&args.run, |session| run(session, &args))
}

/// What rank `s` of communicator `color` holds at element `i` (each element different,
/// and different in each communicator, so that a block from the wrong rank shows).
fn value(color: i32, s: usize, i: usize) -> f32 {
    (color * 1000) as f32 + ((s + 1) * 10) as f32 + (i % 7) as f32
}

fn run(session: &mut Session, args: &Args) -> anyhow::Result<()> {
    let rank = session.rank();
    let nocolor = args.nocolor_last && rank == session.world_size() - 1;
    let color = if nocolor {
        SPLIT_NOCOLOR
    } else {
        (rank % args.colors) as i32
    };
    let key = if args.reverse { -(rank as i32) } else { 0 };
    if args.skip_split == Some(rank) {
        return Ok(());
    }
    let mut split = session.split(color, key)?;
    if split.rank().is_none() {
        session.destroy(split)?;
        return Ok(());
    }
    let (c, k, groups) = (color, args.count, split.groups().len());
    session.on(&mut split, |s| {
        let (me, n) = (s.communicator().rank(), s.communicator().world());
        let v = |r: usize, i: usize| value(c, r, i);
        let mine = |len: usize| (0..len).map(|i| v(me, i)).collect::<Vec<f32>>();
        let sum = |i: usize| (0..n).map(|r| v(r, i)).sum::<f32>();
        let root = n - 1;

        // Broadcast, in place and out of place: the root's elements everywhere.
        let mut buf = s.from_host(mine(k))?;
        s.broadcast(&mut buf, root)?;
        check(s, &buf, (0..k).map(|i| v(root, i)).collect())?;
        let (send, mut recv) = (s.from_host(mine(k))?, s.from_host(vec![-1.0; k])?);
        s.broadcast_into(&send, &mut recv, root)?;
        check(s, &recv, (0..k).map(|i| v(root, i)).collect())?;

        // Reduce: the root gets the sum; the others keep theirs (in place) or an
        // unwritten receive buffer.
        let mut buf = s.from_host(mine(k))?;
        s.reduce(&mut buf, root, ReduceOp::Sum)?;
        check(
            s,
            &buf,
            (0..k).map(|i| if me == root { sum(i) } else { v(me, i) }).collect(),
        )?;
        let (send, mut recv) = (s.from_host(mine(k))?, s.from_host(vec![-1.0; k])?);
        s.reduce_into(&send, &mut recv, root, ReduceOp::Sum)?;
        check(
            s,
            &recv,
            (0..k).map(|i| if me == root { sum(i) } else { -1.0 }).collect(),
        )?;

        // All-reduce: the sum everywhere.
        let mut buf = s.from_host(mine(k))?;
        s.all_reduce(&mut buf, ReduceOp::Sum)?;
        check(s, &buf, (0..k).map(sum).collect())?;
        let (send, mut recv) = (s.from_host(mine(k))?, s.from_host(vec![-1.0; k])?);
        s.all_reduce_into(&send, &mut recv, ReduceOp::Sum)?;
        check(s, &recv, (0..k).map(sum).collect())?;

        // All-gather: block b holds rank b's elements.
        let gathered: Vec<f32> = (0..n * k).map(|j| v(j / k, j % k)).collect();
        let in_place = (0..n * k)
            .map(|j| if j / k == me { v(me, j % k) } else { -1.0 })
            .collect();
        let mut buf = s.from_host(in_place)?;
        s.all_gather(&mut buf)?;
        check(s, &buf, gathered.clone())?;
        let (send, mut recv) = (s.from_host(mine(k))?, s.from_host(vec![-1.0; n * k])?);
        s.all_gather_into(&send, &mut recv)?;
        check(s, &recv, gathered)?;

        // Reduce-scatter: this rank's block of the sum (in place: the other blocks unchanged).
        let mut buf = s.from_host(mine(n * k))?;
        s.reduce_scatter(&mut buf, ReduceOp::Sum)?;
        check(
            s,
            &buf,
            (0..n * k)
                .map(|j| if j / k == me { sum(j) } else { v(me, j) })
                .collect(),
        )?;
        let (send, mut recv) = (s.from_host(mine(n * k))?, s.from_host(vec![-1.0; k])?);
        s.reduce_scatter_into(&send, &mut recv, ReduceOp::Sum)?;
        check(s, &recv, (0..k).map(|i| sum(me * k + i)).collect())?;

        // All-to-all: block b of rank r goes to rank b, as block r.
        let to = |r: usize, b: usize, i: usize| v(r, 0) * 100.0 + (b * 10 + i % 7) as f32;
        let out: Vec<f32> = (0..n * k).map(|j| to(me, j / k, j % k)).collect();
        let expected: Vec<f32> = (0..n * k).map(|j| to(j / k, me, j % k)).collect();
        let mut buf = s.from_host(out.clone())?;
        s.all_to_all(&mut buf)?;
        check(s, &buf, expected.clone())?;
        let (send, mut recv) = (s.from_host(out)?, s.from_host(vec![-1.0; n * k])?);
        s.all_to_all_into(&send, &mut recv)?;
        check(s, &recv, expected)?;
        s.say(&format!("split: 12 collectives checked on {groups} communicator(s)"));
        Ok(())
    })?;
    session.destroy(split)
}

/// Checks `buf` against `expected` on every rank of the split.
fn check(s: &mut Session, buf: &Buffer<f32>, expected: Vec<f32>) -> anyhow::Result<()> {
    s.check_each(buf, &expected)
}
