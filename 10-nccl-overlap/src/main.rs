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

/// DDP's backward: the last layer first, as autograd runs it. A bucket's gradients are
/// ready once its layers are computed, and it is all-reduced on the stream at once while
/// the backward goes on; the step waits for every bucket at the end.
fn ddp_backward(stream: &mut Stream, compute: &Compute, buckets: Vec<Bucket>) -> Result<Step> {
    let mut step = Step::new();
    let mut works = Vec::new();
    for bucket in buckets {
        for _ in 0..bucket.layers {
            step.computing += compute.layer();
        }
        works.push(stream.all_reduce(bucket.gradients, ReduceOp::Avg)?);
    }
    for work in works {
        step.results.push(stream.wait(work)?);
    }
    Ok(step.done(stream))
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
        step.computing += compute.layer();
        if !prefetch {
            next = shards.next().map(|shard| stream.all_gather(shard)).transpose()?;
        }
        step.results.push(params);
    }
    Ok(step.done(stream))
}

fn main() -> std::process::ExitCode {
    let args: Args = common::parse_args();
    common::main(&args.run, |s| {
        let model = Model::new(args.layers as usize, args.hidden as usize);
        let compute = Compute::lasting(Duration::from_micros(args.compute_us));
        let bucket = (args.bucket_mb * (1 << 20) as f64) as usize;
        overlap::introduce(s, &model, &compute, args.bucket_mb)?;
        for way in overlap::WAYS {
            // The buffers are made before the step (DDP's buckets are allocated once, and
            // the backward writes the gradients into them): the step times only the step.
            let step = match way.prepare(s, &model, bucket)? {
                Prepared::Buckets(buckets) => s.overlap(|st| ddp_backward(st, &compute, buckets))?,
                Prepared::Shards(shards) => s.overlap(|st| fsdp_forward(st, &compute, shards, way.prefetch))?,
            };
            overlap::report(s, way, &step)?;
            overlap::check(s, way, step, &model)?;
        }
        Ok(())
    })
}
