//! The direct all-to-all, for small buffers: every block straight to its rank, all the
//! sends first.

use super::ALL_TO_ALL;
use crate::backend::cpu::Cpu;
use crate::collective::tuner::Algorithm;
use crate::record::{self, Dir, How};
use anyhow::{Context, Result};

/// A small all-to-all, direct: every rank first sends every other rank its block, then
/// receives its block from each. The [pairwise](super::pairwise) exchange takes n - 1
/// steps, and a rank's next send waits for its last receive; here no send waits (a small
/// block fits the link's buffer), so a rank waits only until each peer has sent once: one
/// message time instead of n - 1. Where ranks share cores, one turn of each peer on a core.
pub fn all_to_all(cpu: &Cpu, src: &[u8], buf: &mut [u8], block: usize) -> Result<()> {
    let (n, r, tag) = (cpu.world(), cpu.rank(), ALL_TO_ALL.tag);
    let blk = |i: usize| i * block..(i + 1) * block;
    cpu.ran(&ALL_TO_ALL, buf.len(), Algorithm::Direct);
    for s in 1..n {
        let to = (r + s) % n;
        let t = record::clock();
        cpu.send_tagged(tag, &src[blk(to)], to)
            .with_context(|| format!("all-to-all: sending rank {to} its block {}", cpu.peer_name(to)))?;
        record::op(t, "send", &[(Dir::Send, to, &src[blk(to)], How::Copy)]);
    }
    for s in 1..n {
        let from = (r + n - s) % n;
        let dst = &mut buf[blk(from)];
        let t = record::clock();
        cpu.link(from)
            .recv_into(tag, dst)
            .map_err(|e| cpu.lost(e, from))
            .with_context(|| format!("all-to-all: receiving rank {from}'s block {}", cpu.peer_name(from)))?;
        record::op(t, "recv", &[(Dir::Recv, from, &*dst, How::Copy)]);
    }
    Ok(())
}
