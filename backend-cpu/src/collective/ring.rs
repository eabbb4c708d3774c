//! The ring's all-gather steps, which all-gather runs alone and all-reduce runs after its
//! reduce-scatter: each rank passes the finished chunks round the ring, one per step.

use crate::cpu::{Cpu, split_two};
use crate::record::{self, Dir, How};
use anyhow::{Context, Result};
use std::ops::Range;

/// `n - 1` steps on a buffer cut into `n` chunks (`chunk(i)`, byte ranges): at step `s`
/// each rank sends the chunk it finished or received last to its right neighbour and
/// receives the next one from its left. Rank `r` must start holding chunk
/// `(r + first) % n`; at the end every rank holds every chunk. `streaming`: write what
/// arrives around the cache (a buffer larger than the caches).
pub fn all_gather_steps(
    cpu: &Cpu,
    tag: u8,
    data: &mut [u8],
    chunk: &dyn Fn(usize) -> Range<usize>,
    first: usize,
    streaming: bool,
    what: &str,
) -> Result<()> {
    let (n, r) = (cpu.world(), cpu.rank());
    let (left, right) = cpu.neighbours();
    record::phase("all-gather");
    for step in 0..n - 1 {
        let t = record::clock();
        let (send, recv) = ((r + first + n - step) % n, (r + first + 2 * n - step - 1) % n);
        let (out, dst) = split_two(data, chunk(send), chunk(recv));
        cpu.exchange(tag, (out, right), (dst.len(), left), |link, slice| match streaming {
            true => link.recv_into_streaming(tag, &mut dst[slice]),
            false => link.recv_into(tag, &mut dst[slice]),
        })
        .with_context(|| format!("{what} step {} of {}", step + 1, n - 1))?;
        record::op(
            t,
            "send/recv",
            &[(Dir::Send, right, out, How::Copy), (Dir::Recv, left, dst, How::Copy)],
        );
    }
    Ok(())
}
