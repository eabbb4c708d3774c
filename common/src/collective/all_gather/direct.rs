//! The direct all-gather, for small buffers: every rank's block straight to every rank.

use super::ALL_GATHER;
use crate::backend::cpu::Cpu;
use crate::collective::tuner::Algorithm;
use crate::record::{self, Dir, How};
use anyhow::{Context, Result};

/// A small all-gather, direct: with its own block in place in `buf`, every rank first
/// sends it to every other rank, then receives each one's block into its place. The
/// [ring](super::ring) takes n - 1 steps, each forwarding the block the last one brought;
/// here no send waits (a small block fits the link's buffer), so a rank waits only until
/// each peer has sent once: one message time instead of n - 1.
pub fn all_gather(cpu: &Cpu, buf: &mut [u8], block: usize) -> Result<()> {
    let (n, r, tag) = (cpu.world(), cpu.rank(), ALL_GATHER.tag);
    let blk = |i: usize| i * block..(i + 1) * block;
    cpu.ran(&ALL_GATHER, buf.len(), Algorithm::Direct);
    for s in 1..n {
        let to = (r + s) % n;
        let mine = &buf[blk(r)];
        let t = record::clock();
        cpu.send_tagged(tag, mine, to)
            .with_context(|| format!("all-gather: sending this rank's block {}", cpu.peer_name(to)))?;
        record::op(t, "send", &[(Dir::Send, to, mine, How::Copy)]);
    }
    for s in 1..n {
        let from = (r + n - s) % n;
        let dst = &mut buf[blk(from)];
        let t = record::clock();
        cpu.link(from)
            .recv_into(tag, dst)
            .map_err(|e| cpu.lost(e, from))
            .with_context(|| format!("all-gather: receiving rank {from}'s block {}", cpu.peer_name(from)))?;
        record::op(t, "recv", &[(Dir::Recv, from, &*dst, How::Copy)]);
    }
    Ok(())
}
