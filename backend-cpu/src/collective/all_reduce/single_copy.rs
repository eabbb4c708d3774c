//! The single-copy all-reduce, for large buffers on one host: every rank reads the
//! others' buffers where they lie.

use crate::collective::single_copy::reduce_into;
use crate::cpu::{Cpu, Signal, chunk_range, keep};
use crate::element::Reduction;
use crate::record::{self, Dir, How};
use crate::tuner::Algorithm;
use anyhow::{Context, Result};
use workbook_runtime::Func;

/// A large all-reduce on one host, single copy: every rank reads the other ranks'
/// buffers where they lie ([`crate::host_memory`]) instead of receiving them.
/// The buffer is cut into `n` chunks, and rank r makes chunk r:
///
/// 1. every rank tells every other where its buffers are;
/// 2. reduce-scatter: rank r reduces chunk r of every rank's buffer into its own, in
///    pieces that stay in the cache (its own ⊕ rank r+1's ⊕ …), then says it is finished;
/// 3. all-gather: rank r copies every other rank's finished chunk into its buffer;
/// 4. each rank tells every other that it is done reading, and leaves once all have.
///
/// Each byte crosses between ranks once per phase, read where it lies, as the ring's
/// 2(n-1)/n of the buffer per rank, but with one copy where a shared slot takes two, and
/// no rank waits for another's steps (with more ranks than cores, whoever runs makes
/// progress). Every chunk is computed once, so every rank holds the same bits. If any
/// rank's buffer is outside its arena, all ranks see it in step 1 and run the ring.
pub fn all_reduce(cpu: &Cpu, src: Option<&[u8]>, data: &mut [u8], red: Reduction) -> Result<()> {
    let (n, r, e, tag) = (cpu.world(), cpu.rank(), red.elem, Func::AllReduce.tag());
    let others = || (1..n).map(move |k| (r + k) % n);
    let count = data.len() / e;
    let chunk = |i: usize| {
        let c = chunk_range(count, n, i);
        c.start * e..c.end * e
    };
    let len = data.len();
    // (input, result) of every rank, as this rank sees them.
    let Some(theirs) = cpu
        .share_regions(tag, &[src.unwrap_or(data), data], &[len, len])
        .context("all-reduce")?
    else {
        cpu.ran(Func::AllReduce, len, Algorithm::RingPipelined);
        return super::pipelined::all_reduce(cpu, src, data, red);
    };
    let peer = |p: usize| (theirs[p][0], theirs[p][1]);

    record::phase("reduce-scatter");
    let own = chunk(r);
    let t = record::clock();
    let mine = src.map(|s| &s[own.clone()]);
    reduce_into(
        cpu,
        &mut data[own.clone()],
        mine,
        |p| Some(&peer(p).0[own.clone()]),
        red,
    );
    red.finish(&mut data[own.clone()], n);
    let mine = &data[own.clone()];
    let parts: Vec<_> = others().map(|p| (Dir::Recv, p, mine, How::Reduce)).collect();
    record::op(t, "read", &parts);
    others()
        .try_for_each(|p| cpu.signal(tag, p, Signal::Finished))
        .context("all-reduce, reduce-scatter")?;

    record::phase("all-gather");
    let streaming = cpu.streams(len);
    for p in others() {
        cpu.wait_signal(tag, p, Signal::Finished)
            .context("all-reduce, all-gather")?;
        let t = record::clock();
        let c = chunk(p);
        keep(&mut data[c.clone()], &peer(p).1[c.clone()], streaming);
        record::op(t, "read", &[(Dir::Recv, p, &data[c], How::Copy)]);
    }
    cpu.all_done(tag).context("all-reduce")
}
