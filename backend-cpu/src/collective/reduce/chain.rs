//! The chain reduce: NCCL's ring reduce, the broadcast's chain run backwards.

use crate::cpu::Cpu;
use crate::element::Reduction;
use crate::prims::Prims;
use anyhow::Result;
use workbook_runtime::Func;

/// The chain moves in pieces of this size, each reduced as it passes.
const PIECE: usize = 512 << 10;

/// The broadcast's chain run backwards, as NCCL's ring reduce does (`runRing` in
/// `reduce.h`): it starts at the rank after the root, and each rank reduces its own piece
/// into what arrives from the left and passes it right, until the root receives the last
/// partial result and adds its own. Partial results live only in the links: no rank's
/// buffer but the root's is written.
pub fn reduce(cpu: &Cpu, send: Option<&[u8]>, buf: &mut [u8], root: usize, red: Reduction) -> Result<()> {
    let (n, r) = (cpu.world(), cpu.rank());
    let pos = (r + 2 * n - root - 1) % n; // 0 after the root, ..., n - 1 on the root
    let len = buf.len();
    let mut prims = Prims::new(cpu, Func::Reduce, send, buf, red);
    for start in (0..len.max(1)).step_by(PIECE) {
        let at = start..(start + PIECE).min(len);
        match pos {
            0 => prims.send(at)?,
            _ if pos == n - 1 => prims.recv_reduce_copy(at)?,
            _ => prims.recv_reduce_send(at)?,
        }
    }
    Ok(())
}
