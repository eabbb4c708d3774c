//! The direct all-to-all, for small buffers: every block straight to its rank, all the
//! sends first.

use crate::collective::direct::{recv_from_each, send_to_each};
use crate::cpu::Cpu;
use crate::tuner::Algorithm;
use anyhow::Result;
use workbook_runtime::Func;

/// A small all-to-all, direct: every rank first sends every other rank its block, then
/// receives its block from each. The [pairwise](super::pairwise) exchange takes n - 1
/// steps, and a rank's next send waits for its last receive; here no send waits (a small
/// block fits the link's buffer), so a rank waits only until each peer has sent once: one
/// message time instead of n - 1. Where ranks share cores, one turn of each peer on a core.
/// In place (`send` is `None`) the blocks leave from `buf` itself, before any arrives.
pub fn all_to_all(cpu: &Cpu, send: Option<&[u8]>, buf: &mut [u8], block: usize) -> Result<()> {
    let tag = Func::AllToAll.tag();
    cpu.ran(Func::AllToAll, buf.len(), Algorithm::Direct);
    let src = send.unwrap_or(buf);
    send_to_each(cpu, tag, "all-to-all", |to| &src[to * block..(to + 1) * block])?;
    recv_from_each(cpu, tag, "all-to-all", buf, block)
}
