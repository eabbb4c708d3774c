//! The ring all-gather: the second half of the ring all-reduce.

use crate::collective::ring::all_gather_steps;
use crate::cpu::Cpu;
use crate::element::Reduction;
use crate::prims::Prims;
use anyhow::Result;
use workbook_runtime::Func;

/// The ring all-gather: with this rank's block in its place in the receive buffer, `n -
/// 1` steps pass the blocks round the ring, each rank forwarding the block it received
/// last.
pub fn all_gather(cpu: &Cpu, buf: &mut [u8], block: usize, red: Reduction) -> Result<()> {
    let mut prims = Prims::new(cpu, Func::AllGather, None, buf, red);
    // Rank r starts with block r (`first` = 0).
    all_gather_steps(
        &mut prims,
        (cpu.world(), cpu.rank()),
        &|i| i * block..(i + 1) * block,
        0,
    )
}
