//! The ring all-gather: the second half of the ring all-reduce.

use crate::collective::ring::all_gather_steps;
use crate::cpu::Cpu;
use crate::tuner::Algorithm;
use anyhow::Result;
use workbook_runtime::Func;

/// The ring all-gather: with this rank's block in its place in the receive buffer, `n -
/// 1` steps pass the blocks round the ring, each rank forwarding the block it received
/// last.
pub fn all_gather(cpu: &Cpu, buf: &mut [u8], block: usize, streaming: bool) -> Result<()> {
    cpu.ran(Func::AllGather, buf.len(), Algorithm::Ring);
    // Rank r starts with block r (`first` = 0).
    all_gather_steps(
        cpu,
        Func::AllGather.tag(),
        buf,
        &|i| i * block..(i + 1) * block,
        0,
        streaming,
        "all-gather",
    )
}
