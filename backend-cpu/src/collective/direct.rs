//! What the direct algorithms share (each collective's own lives in its file, as the
//! ring's shared steps live in `ring.rs`): every send goes before any receive. A small
//! message fits the link's buffer, so no send waits for its receiver, and a rank waits
//! only until each peer has sent once: one message time, where the ring takes n - 1.

use crate::prims::{Prims, Src};
use anyhow::Result;
use std::ops::Range;

/// Sends `from[at(to)]` to every other rank `to`, from this rank + 1 on.
pub(super) fn send_to_each(
    prims: &mut Prims,
    (n, r): (usize, usize),
    from: Src,
    at: impl Fn(usize) -> Range<usize>,
) -> Result<()> {
    for s in 1..n {
        let to = (r + s) % n;
        prims.send_to(to, from, at(to))?;
    }
    Ok(())
}

/// Receives every other rank's message into `output[at(from)]`, from this rank - 1 down.
pub(super) fn recv_from_each(
    prims: &mut Prims,
    (n, r): (usize, usize),
    at: impl Fn(usize) -> Range<usize>,
) -> Result<()> {
    for s in 1..n {
        let from = (r + n - s) % n;
        prims.recv_from(from, at(from))?;
    }
    Ok(())
}
