//! The direct all-gather, for small buffers: every rank's block straight to every rank.

use crate::collective::direct::{recv_from_each, send_to_each};
use crate::cpu::Cpu;
use crate::tuner::Algorithm;
use anyhow::Result;
use workbook_runtime::Func;

/// A small all-gather, direct: with its own block in place in `buf`, every rank first
/// sends it to every other rank, then receives each one's block into its place. The
/// [ring](super::ring) takes n - 1 steps, each forwarding the block the last one brought;
/// here no send waits (a small block fits the link's buffer), so a rank waits only until
/// each peer has sent once: one message time instead of n - 1.
pub fn all_gather(cpu: &Cpu, buf: &mut [u8], block: usize) -> Result<()> {
    let (r, tag) = (cpu.rank(), Func::AllGather.tag());
    cpu.ran(Func::AllGather, buf.len(), Algorithm::Direct);
    let mine = &buf[r * block..(r + 1) * block];
    send_to_each(cpu, tag, "all-gather", |_| mine)?;
    recv_from_each(cpu, tag, "all-gather", buf, block)
}
