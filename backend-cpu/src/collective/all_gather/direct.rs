//! The direct all-gather, for small buffers: every rank's block straight to every rank.

use crate::collective::direct::{recv_from_each, send_to_each};
use crate::cpu::Cpu;
use crate::element::Reduction;
use crate::prims::{Prims, Src};
use anyhow::Result;
use workbook_runtime::Func;

/// A small all-gather, direct: with its own block in place in `buf`, every rank first
/// sends it to every other rank, then receives each one's block into its place. The
/// [ring](super::ring) takes n - 1 steps, each forwarding the block the last one brought;
/// here no send waits (a small block fits the link's buffer), so a rank waits only until
/// each peer has sent once: one message time instead of n - 1.
pub fn all_gather(cpu: &Cpu, buf: &mut [u8], block: usize, red: Reduction) -> Result<()> {
    let (n, r) = (cpu.world(), cpu.rank());
    let blk = |i: usize| i * block..(i + 1) * block;
    let mut prims = Prims::new(cpu, Func::AllGather, None, buf, red);
    send_to_each(&mut prims, (n, r), Src::Output, |_| blk(r))?;
    recv_from_each(&mut prims, (n, r), blk)
}
