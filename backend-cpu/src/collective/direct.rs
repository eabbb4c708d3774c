//! What the direct algorithms share (each collective's own lives in its file, as the
//! ring's shared steps live in `ring.rs`): every send goes before any receive. A small
//! message fits the link's buffer, so no send waits for its receiver, and a rank waits
//! only until each peer has sent once: one message time, where the ring takes n - 1.

use crate::cpu::Cpu;
use crate::record::{self, Dir, How};
use anyhow::{Context, Result};

/// Sends `out(to)` to every other rank `to`, from this rank + 1 on. `what` names the
/// collective in errors; the peer is named by its link (the world's rank, which a split
/// communicator's number is not).
pub(super) fn send_to_each<'a>(cpu: &Cpu, tag: u8, what: &str, out: impl Fn(usize) -> &'a [u8]) -> Result<()> {
    let (n, r) = (cpu.world(), cpu.rank());
    for s in 1..n {
        let to = (r + s) % n;
        let out = out(to);
        let t = record::clock();
        cpu.send_tagged(tag, out, to)
            .with_context(|| format!("{what}: sending {}", cpu.peer_name(to)))?;
        record::op(t, "send", &[(Dir::Send, to, out, How::Copy)]);
    }
    Ok(())
}

/// Receives every other rank's message into its block of `buf` (rank `from`'s into block
/// `from`, `block` bytes each), from this rank - 1 down. `what` names the collective in
/// errors.
pub(super) fn recv_from_each(cpu: &Cpu, tag: u8, what: &str, buf: &mut [u8], block: usize) -> Result<()> {
    let (n, r) = (cpu.world(), cpu.rank());
    for s in 1..n {
        let from = (r + n - s) % n;
        let dst = &mut buf[from * block..(from + 1) * block];
        let t = record::clock();
        cpu.link(from)
            .recv_into(tag, dst)
            .map_err(|e| cpu.lost(e, from))
            .with_context(|| format!("{what}: receiving block {from} {}", cpu.peer_name(from)))?;
        record::op(t, "recv", &[(Dir::Recv, from, &*dst, How::Copy)]);
    }
    Ok(())
}
