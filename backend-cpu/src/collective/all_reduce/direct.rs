//! The direct all-reduce, for small buffers: every rank sends its buffer to every other.

use crate::collective::direct::send_to_each;
use crate::cpu::Cpu;
use crate::element::Reduction;
use crate::prims::{Prims, Src};
use anyhow::Result;
use workbook_runtime::Func;

/// A small all-reduce, direct: every rank sends its whole buffer to every other rank,
/// then reduces the `n` buffers itself, in rank order (0 ⊕ 1 ⊕ 2 …), so every rank gets
/// the same bits. One message time where the ring takes 2(n - 1): for a few bytes the
/// time per message (α) is everything, and the bytes sent (n - 1 buffers instead of
/// 2(n - 1)/n) cost nothing. NCCL makes the same trade with its tree and its LL protocol.
///
/// The sends go first, to every peer: a small message fits the link's buffer (a shared
/// memory slot, a socket's buffer), so no rank waits for another to receive.
pub fn all_reduce(cpu: &Cpu, src: Option<&[u8]>, data: &mut [u8], red: Reduction) -> Result<()> {
    let (n, r, all) = (cpu.world(), cpu.rank(), 0..data.len());
    // In place, rank 0's buffer lands on this rank's own first: keep a copy of it.
    let kept = match (src, r) {
        (None, 1..) => data.to_vec(),
        _ => vec![],
    };
    let mut prims = Prims::new(cpu, Func::AllReduce, src, data, red);
    send_to_each(&mut prims, (n, r), Src::Input, |_| all.clone())?;
    for from in 0..n {
        match from {
            _ if from == r => match (r, src) {
                (0, Some(src)) => prims.output().copy_from_slice(src),
                (0, None) => {} // rank 0's own buffer is where the sum starts
                _ => (red.accumulate)(prims.output(), src.unwrap_or(&kept)),
            },
            0 => prims.recv_from(0, all.clone())?,
            _ => prims.recv_reduce_from(from, all.clone())?,
        }
    }
    red.finish(prims.output(), n);
    Ok(())
}
