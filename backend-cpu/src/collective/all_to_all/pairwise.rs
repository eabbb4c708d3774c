//! The pairwise all-to-all: NCCL's grouped sends and receives, one peer per step.

use crate::cpu::Cpu;
use crate::element::Reduction;
use crate::prims::{Prims, Src};
use anyhow::Result;
use workbook_runtime::Func;

/// The pairwise exchange: at step s (1 to n - 1) each rank sends its block for rank r +
/// s and receives the block rank r - s has for it, so that every step pairs every rank
/// with two others and every link is busy once.
pub fn all_to_all(cpu: &Cpu, src: &[u8], buf: &mut [u8], block: usize, red: Reduction) -> Result<()> {
    let (n, r) = (cpu.world(), cpu.rank());
    let blk = |i: usize| i * block..(i + 1) * block;
    let mut prims = Prims::new(cpu, Func::AllToAll, Some(src), buf, red);
    for s in 1..n {
        let (to, from) = ((r + s) % n, (r + n - s) % n);
        prims.send_recv_with(to, (Src::Input, blk(to)), from, blk(from))?;
    }
    Ok(())
}
