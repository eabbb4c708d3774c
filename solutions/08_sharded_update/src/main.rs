//! Exercise 8 — A sharded update, as ZeRO does it: the reference solution (EXERCISES.md, chapter 8).
//!
//! Plain data parallelism all-reduces the gradients, then every rank applies the same
//! update to every parameter: n copies of the same work (and of the optimizer's state).
//! ZeRO (DeepSpeed) and PyTorch's FSDP cut the parameters into n shards instead: a
//! reduce-scatter gives rank r the average gradient of shard r alone, rank r updates shard
//! r, and an all-gather gives every rank all the updated shards. The same bytes move as in
//! the all-reduce, which is itself a reduce-scatter followed by an all-gather.
//!
//! Run it:   `cargo run --release --bin sol08-sharded-update -- --nproc-per-node 4`
//! Check it: `cargo workbook check 8 --solution`

use anyhow::Result;
use clap::Parser;
use common::{Buffer, DataArgs, ReduceOp, Session, collective};

/// One step of SGD, sharded: reduce-scatter the gradients, update a shard, all-gather.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    #[command(flatten)]
    run: common::RunArgs,
    #[command(flatten)]
    data: DataArgs,
    /// The learning rate: each parameter p becomes p - lr × g.
    #[arg(long, value_name = "LR", default_value_t = 0.25)]
    lr: f32,
}

/// The plain data-parallel step, to check against: all-reduce the gradients (their
/// average), then every rank updates every parameter.
fn plain_step(s: &mut Session, params: &mut Buffer<f32>, grads: &Buffer<f32>, lr: f32) -> Result<()> {
    let mut g = s.from_host(vec![0.0; grads.len()])?;
    s.all_reduce_into(grads, &mut g, ReduceOp::Avg)?;
    let g = s.to_host(&g)?;
    let p: Vec<f32> = s.to_host(params)?.iter().zip(&g).map(|(p, g)| p - lr * g).collect();
    *params = s.from_host(p)?;
    Ok(())
}

/// The same step, sharded: this rank owns elements `rank × shard .. (rank + 1) × shard` of
/// the parameters (its shard), and updates only those.
fn sharded_step(s: &mut Session, params: &mut Buffer<f32>, grads: &Buffer<f32>, lr: f32) -> Result<()> {
    let (rank, n) = (s.rank(), s.world_size());
    let shard = params.len() / n;
    // Step 1. Reduce-scatter: `g` gets the average over the ranks of block `rank` of the gradients.
    let mut g = s.from_host(vec![0.0; shard])?;
    s.reduce_scatter_into(grads, &mut g, ReduceOp::Avg)?;
    // Step 2. Update this rank's shard of the parameters, and only it.
    let g = s.to_host(&g)?;
    let mine = rank * shard..(rank + 1) * shard;
    let updated: Vec<f32> = s.to_host(params)?[mine]
        .iter()
        .zip(&g)
        .map(|(p, g)| p - lr * g)
        .collect();
    let updated = s.from_host(updated)?;
    // Step 3. All-gather: rank i's updated shard lands at block i of every rank's parameters.
    s.all_gather_into(&updated, params)
}

fn main() -> std::process::ExitCode {
    let args: Args = common::parse_args();
    common::main(&args.run, |s| {
        let (rank, n) = (s.rank(), s.world_size());
        // ZeRO pads its flat parameters with zeros to n shards of one length: so do we.
        let (count, shard) = (args.data.count(), args.data.count().div_ceil(n));
        let data = DataArgs {
            count: (n * shard) as u64,
            size: None,
            ..args.data.clone()
        };
        let pad = n * shard - count;
        s.say(&format!(
            "{count} parameters + {pad} of padding = {n} shards of {shard}"
        ));
        // Every rank holds the same parameters, p_i = i + 1, and its own gradients,
        // (rank + 1)(i + 1): their average over the ranks is (n + 1)/2 × (i + 1).
        let param = |i: usize| if i < count { (i + 1) as f32 } else { 0.0 };
        let mut params = s.buffer_with(&data, param)?;
        let grads = s.buffer_with(&data, |i| (rank + 1) as f32 * param(i))?;
        s.show("Before the step: the parameters, the same on every rank", &params)?;
        s.show("Gradients: each rank's own", &grads)?;

        let mut plain = s.buffer_with(&data, param)?;
        plain_step(s, &mut plain, &grads, args.lr)?;
        s.show(
            "Expected: the plain step (all-reduce, every rank updates everything)",
            &plain,
        )?;

        sharded_step(s, &mut params, &grads, args.lr)?;

        s.show("After the sharded step", &params)?;
        let expected = s.to_host(&plain)?;
        s.check_each(&params, &expected)?;
        let bytes = grads.len() * size_of::<f32>();
        s.time_as(&collective::ALL_REDUCE, bytes, args.data.iters, |s| {
            sharded_step(s, &mut params, &grads, args.lr)
        })?;
        Ok(())
    })
}
