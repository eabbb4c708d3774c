//! Exercise 14 — DDP's buckets (EXERCISES.md, chapter 14): the solution.
//!
//! DDP averages the gradients of every rank before the optimizer steps. It does not wait
//! for the whole backward pass to end: the gradients are grouped into buckets in the order
//! the backward produces them (the last layer first), and each bucket is all-reduced on a
//! stream of its own as soon as its last layer is computed, while the backward goes on
//! computing the earlier layers. Only once every layer is computed does it wait for the
//! buckets. Write the bucketing and the asynchronous launches.
//!
//! Run it:   `cargo run --release --bin sol14-ddp-buckets -- --nproc-per-node 2`
//! Check it: `cargo workbook check 14 --solution`

use anyhow::Result;
use clap::Parser;
use common::compute::{Compute, Model};
use common::{ReduceOp, Stream};
use std::time::Duration;

/// A data-parallel backward pass, its gradients averaged in buckets.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    #[command(flatten)]
    run: common::RunArgs,
    /// Layers of the model (chapter 7's transformer layers).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1024))]
    layers: u32,
    /// The layers' width h: each has 12·h² + 13·h parameters.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=4096))]
    hidden: u32,
    /// What one layer's backward computes, in microseconds on a core of its own.
    #[arg(long, value_name = "US", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    compute_us: u64,
    /// The bucket size in MiB (PyTorch's bucket_cap_mb).
    #[arg(long, value_name = "MIB", default_value_t = 0.5, value_parser = common::compute::bucket_mib)]
    bucket_mb: f64,
}

/// The backward pass: `grads[k]` is the gradient of the k-th layer the backward computes
/// (the last layer first). Returns the gradients averaged over every rank, in that order.
///
/// The calls:
///     stream.compute(compute)?                      computes one layer's backward
///     stream.from_host(v: Vec<f32>)? -> Buffer<f32>  a buffer holding v
///     stream.all_reduce(buf, ReduceOp::Avg)? -> Work<f32>
///                                                   issues an all-reduce on the stream and
///                                                   returns at once; the Work holds `buf`
///     stream.wait(work)? -> Buffer<f32>             waits for it, and gives the buffer back
///     stream.to_host(&buf)? -> Vec<f32>             the buffer's elements
fn backward(stream: &mut Stream, compute: &Compute, grads: Vec<Vec<f32>>, bucket_bytes: usize) -> Result<Vec<f32>> {
    let mut averaged = Vec::new();
    let mut bucket: Vec<f32> = Vec::new();
    let mut works = Vec::new();
    let layers = grads.len();
    for (k, grad) in grads.into_iter().enumerate() {
        stream.compute(compute)?; // this layer's backward: its gradient is ready after it
        bucket.extend(grad);
        if bucket.len() * 4 >= bucket_bytes || k + 1 == layers {
            let buf = stream.from_host(std::mem::take(&mut bucket))?;
            works.push(stream.all_reduce(buf, ReduceOp::Avg)?);
        }
    }
    for work in works {
        let buf = stream.wait(work)?;
        averaged.extend(stream.to_host(&buf)?);
    }
    Ok(averaged)
}

fn main() -> std::process::ExitCode {
    let args: Args = common::parse_args();
    common::main(&args.run, |s| {
        let (rank, n) = (s.rank(), s.world_size());
        let model = Model::new(args.layers as usize, args.hidden as usize);
        model.ensure_fits(s, 4)?; // one line, not an aborted allocation, if it cannot fit here
        let compute = Compute::lasting(Duration::from_micros(args.compute_us));
        let bucket_bytes = (args.bucket_mb * (1 << 20) as f64) as usize;
        // Rank r's gradient of layer l is (r + 1)(l + 1) everywhere: the average over n ranks
        // is (n + 1)(l + 1) / 2. The backward produces them last layer first.
        let layers = (0..model.layers.len()).rev();
        let grads = layers
            .clone()
            .map(|l| vec![((rank + 1) * (l + 1)) as f32; model.layers[l]]);
        let averaged = s.overlap(|stream| backward(stream, &compute, grads.collect(), bucket_bytes))?;

        let averaged = s.from_host(averaged)?;
        s.show("After the backward (the last layer's gradients first)", &averaged)?;
        let average = |l: usize| ((n + 1) * (l + 1)) as f32 / 2.0;
        let expected: Vec<f32> = layers.flat_map(|l| vec![average(l); model.layers[l]]).collect();
        s.check_each(&averaged, &expected)
    })
}
