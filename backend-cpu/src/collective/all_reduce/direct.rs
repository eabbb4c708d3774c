//! The direct all-reduce, for small buffers: every rank sends its buffer to every other.

use crate::collective::direct::send_to_each;
use crate::cpu::Cpu;
use crate::element::Reduction;
use crate::record::{self, Dir, How};
use crate::tuner::Algorithm;
use anyhow::{Context, Result};
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
    let (n, r, tag) = (cpu.world(), cpu.rank(), Func::AllReduce.tag());
    cpu.ran(Func::AllReduce, data.len(), Algorithm::Direct);
    let mine = src.unwrap_or(data);
    send_to_each(cpu, tag, "all-reduce", |_| mine)?;
    // In place, rank 0's buffer lands on this rank's own first: keep a copy of it.
    let kept = match (src, r) {
        (None, 1..) => data.to_vec(),
        _ => vec![],
    };
    for from in 0..n {
        let t = record::clock();
        if from == r {
            match (r, src) {
                (0, Some(src)) => data.copy_from_slice(src),
                (0, None) => {} // rank 0's own buffer is where the sum starts
                _ => (red.accumulate)(data, src.unwrap_or(&kept)),
            }
            continue;
        }
        let link = cpu.link(from);
        match from {
            0 => link.recv_into(tag, data),
            // Reduced where it arrives (a shared-memory slot), piece by piece.
            _ => link.recv_pieces(tag, data.len(), &mut |off, piece| {
                (red.accumulate)(&mut data[off..off + piece.len()], piece)
            }),
        }
        .map_err(|e| cpu.lost(e, from))
        .with_context(|| format!("all-reduce: receiving rank {from}'s buffer {}", cpu.peer_name(from)))?;
        let how = if from == 0 { How::Copy } else { How::Reduce };
        record::op(t, "recv", &[(Dir::Recv, from, data, how)]);
    }
    red.finish(data, n);
    Ok(())
}
