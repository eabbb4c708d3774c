//! The direct reduce-scatter, for small buffers: every block straight to the rank that
//! reduces it, all the sends first.

use crate::collective::direct::send_to_each;
use crate::cpu::Cpu;
use crate::element::Reduction;
use crate::record::{self, Dir, How};
use crate::tuner::Algorithm;
use anyhow::{Context, Result};
use workbook_runtime::Func;

/// A small reduce-scatter, direct: every rank sends block j of its buffer to rank j,
/// then reduces the `n - 1` blocks that arrive into its own block r, in rank order. One
/// message time where the ring takes n - 1 steps, each waiting for the last: for a few
/// bytes the time per message (α) is everything (with more ranks than cores, each step a
/// turn of the next rank on a core). The ring's bytes, (n - 1)/n of the buffer per rank.
///
/// `send` out of place, and `buf` the result (`block` bytes); in place (`send` is `None`)
/// `buf` is the whole buffer, and the result goes to its block r, as NCCL lays it out.
pub fn reduce_scatter(cpu: &Cpu, send: Option<&[u8]>, buf: &mut [u8], block: usize, red: Reduction) -> Result<()> {
    let (n, r, tag) = (cpu.world(), cpu.rank(), Func::ReduceScatter.tag());
    cpu.ran(Func::ReduceScatter, n * block, Algorithm::Direct);
    let blk = |i: usize| i * block..(i + 1) * block;
    // Block r is the only one this rank writes: the others leave from `buf` itself.
    let src = send.unwrap_or(buf);
    send_to_each(cpu, tag, "reduce-scatter", |to| &src[blk(to)])?;
    let result = match send {
        Some(src) => {
            buf.copy_from_slice(&src[blk(r)]);
            &mut buf[..]
        }
        None => &mut buf[blk(r)],
    };
    for from in (0..n).filter(|&from| from != r) {
        let t = record::clock();
        // Reduced where it arrives (a shared-memory slot), piece by piece.
        cpu.link(from)
            .recv_pieces(tag, block, &mut |off, piece| {
                (red.accumulate)(&mut result[off..off + piece.len()], piece)
            })
            .map_err(|e| cpu.lost(e, from))
            .with_context(|| format!("reduce-scatter: receiving block {r} {}", cpu.peer_name(from)))?;
        record::op(t, "recv", &[(Dir::Recv, from, &*result, How::Reduce)]);
    }
    red.finish(result, n);
    Ok(())
}
