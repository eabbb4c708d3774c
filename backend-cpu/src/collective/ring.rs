//! The ring's all-gather steps, which all-gather runs alone and all-reduce runs after its
//! reduce-scatter: each rank passes the finished chunks round the ring, one per step.

use crate::prims::{Prims, Src};
use anyhow::Result;
use std::ops::Range;

/// `n - 1` steps on an output cut into `n` chunks (`chunk(i)`, byte ranges): at step `s`
/// each rank sends the chunk it finished or received last to its right neighbour and
/// receives the next one from its left. Rank `r` must start holding chunk
/// `(r + first) % n`; at the end every rank holds every chunk.
pub fn all_gather_steps(
    prims: &mut Prims,
    (n, r): (usize, usize),
    chunk: &dyn Fn(usize) -> Range<usize>,
    first: usize,
) -> Result<()> {
    prims.phase("all-gather");
    for step in 0..n - 1 {
        let (sent, got) = ((r + first + n - step) % n, (r + first + 2 * n - step - 1) % n);
        prims.send_recv(Src::Output, chunk(sent), chunk(got))?;
    }
    Ok(())
}
