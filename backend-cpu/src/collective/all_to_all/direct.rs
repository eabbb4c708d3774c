//! The direct all-to-all, for small buffers: every block straight to its rank, all the
//! sends first.

use crate::collective::direct::{recv_from_each, send_to_each};
use crate::cpu::Cpu;
use crate::element::Reduction;
use crate::prims::{Prims, Src};
use anyhow::Result;
use workbook_runtime::Func;

/// A small all-to-all, direct: every rank first sends every other rank its block, then
/// receives its block from each. The [pairwise](super::pairwise) exchange takes n - 1
/// steps, and a rank's next send waits for its last receive; here no send waits (a small
/// block fits the link's buffer), so a rank waits only until each peer has sent once: one
/// message time instead of n - 1. Where ranks share cores, one turn of each peer on a core.
/// In place (`send` is `None`) the blocks leave from `buf` itself, before any arrives.
pub fn all_to_all(cpu: &Cpu, send: Option<&[u8]>, buf: &mut [u8], block: usize, red: Reduction) -> Result<()> {
    let (n, r) = (cpu.world(), cpu.rank());
    let blk = |i: usize| i * block..(i + 1) * block;
    let mut prims = Prims::new(cpu, Func::AllToAll, send, buf, red);
    send_to_each(&mut prims, (n, r), Src::Input, blk)?;
    recv_from_each(&mut prims, (n, r), blk)
}
