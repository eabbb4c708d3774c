//! 10 — Overlap: hiding communication behind computation, as DDP's buckets and FSDP's
//! prefetch do.
//!
//! A training step computes and communicates. What decides its time on a cluster is the
//! communication that is *exposed*: not hidden behind computation. DDP all-reduces the
//! gradients in buckets while the backward pass still computes the earlier layers; FSDP
//! all-gathers the next layer's parameters while this one computes. Both issue their
//! collectives on a stream of their own (`async_op=True`) and wait for each only when its
//! result is needed.
//!
//! Run it: `cargo run --release --bin 10-nccl-overlap -- --nproc-per-node 2`

use anyhow::Result;
use common::compute::{Compute, Model};
use common::{Buffer, ReduceOp, Stream};
use std::time::Duration;

mod overlap;
use overlap::{Args, Bucket, Prepared, Step};

/// DDP's backward: the last layer first, as autograd runs it. Once a layer is computed,
/// each bucket its gradients complete is all-reduced on the stream at once, while the
/// backward goes on; the step waits for every bucket at the end.
fn ddp_backward(stream: &mut Stream, compute: &Compute, layers: usize, buckets: Vec<Bucket>) -> Result<Step> {
    let mut step = Step::new();
    let (mut buckets, mut works) = (buckets.into_iter().peekable(), Vec::new());
    for done in 1..=layers {
        step.computing += stream.compute(compute)?;
        while let Some(bucket) = buckets.next_if(|b| b.ready_after == done) {
            works.push(stream.all_reduce(bucket.gradients, ReduceOp::Avg)?);
        }
    }
    for work in works {
        step.results.push(stream.wait(work)?);
    }
    step.done(stream)
}

/// FSDP's forward: each rank keeps 1/n of every layer's parameters, and a layer's whole
/// parameters are all-gathered before it computes; with `prefetch`, the next layer's
/// gather is issued before this layer computes, so that it runs meanwhile.
fn fsdp_forward(stream: &mut Stream, compute: &Compute, shards: Vec<Buffer<f32>>, prefetch: bool) -> Result<Step> {
    let mut step = Step::new();
    let mut shards = shards.into_iter();
    let mut next = shards.next().map(|shard| stream.all_gather(shard)).transpose()?;
    while let Some(gathering) = next.take() {
        let params = stream.wait(gathering)?;
        if prefetch {
            next = shards.next().map(|shard| stream.all_gather(shard)).transpose()?;
        }
        step.computing += stream.compute(compute)?;
        if !prefetch {
            next = shards.next().map(|shard| stream.all_gather(shard)).transpose()?;
        }
        step.results.push(params);
    }
    step.done(stream)
}

fn main() -> std::process::ExitCode {
    let args: Args = common::parse_args();
    common::main(&args.run, |s| {
        let model = Model::new(args.layers as usize, args.hidden as usize);
        let compute = Compute::lasting(Duration::from_micros(args.compute_us));
        let bucket = (args.bucket_mb * (1 << 20) as f64) as usize;
        overlap::introduce(s, &model, &compute, &args)?;
        let (draw, mut drawn) = (s.draw_own(), Vec::new());
        let mut last = None;
        for way in overlap::WAYS {
            let mut times = Vec::new();
            for _ in 0..args.iters {
                drop(last.take()); // the step before's buffers go before this one's are made
                // The buffers are made before the step (DDP's buckets are allocated once,
                // and the backward writes the gradients into them): it times only the step.
                let step = match way.prepare(s, &model, bucket)? {
                    Prepared::Buckets(buckets) => {
                        s.overlap(|st| ddp_backward(st, &compute, model.layers.len(), buckets))?
                    }
                    Prepared::Shards(shards) => s.overlap(|st| fsdp_forward(st, &compute, shards, way.prefetch))?,
                };
                times.push(step.times());
                last = Some(step);
            }
            let step = last.take().expect("--iters is at least 1");
            overlap::report(s, way, &times, &step)?;
            drawn.push(overlap::timeline(way, &step));
            overlap::check(s, way, step, &model)?;
        }
        draw.map_or(Ok(()), |path| overlap::draw(s, &path, &drawn))
    })
}
