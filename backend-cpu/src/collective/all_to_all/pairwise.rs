//! The pairwise all-to-all: NCCL's grouped sends and receives, one peer per step.

use crate::cpu::Cpu;
use crate::record::{self, Dir, How};
use crate::tuner::Algorithm;
use anyhow::{Context, Result};
use workbook_runtime::Func;

/// The pairwise exchange: at step s (1 to n - 1) each rank sends its block for rank r +
/// s and receives the block rank r - s has for it, so that every step pairs every rank
/// with two others and every link is busy once.
pub fn all_to_all(cpu: &Cpu, src: &[u8], buf: &mut [u8], block: usize, streaming: bool) -> Result<()> {
    let (n, r, tag) = (cpu.world(), cpu.rank(), Func::AllToAll.tag());
    let blk = |i: usize| i * block..(i + 1) * block;
    cpu.ran(Func::AllToAll, buf.len(), Algorithm::Pairwise);
    for s in 1..n {
        let (to, from) = ((r + s) % n, (r + n - s) % n);
        let dst = &mut buf[blk(from)];
        let t = record::clock();
        cpu.exchange(tag, (&src[blk(to)], to), (block, from), |link, slice| match streaming {
            true => link.recv_into_streaming(tag, &mut dst[slice]),
            false => link.recv_into(tag, &mut dst[slice]),
        })
        .with_context(|| format!("all-to-all step {s} of {}: to rank {to}, from rank {from}", n - 1))?;
        let parts = [
            (Dir::Send, to, &src[blk(to)], How::Copy),
            (Dir::Recv, from, &*dst, How::Copy),
        ];
        record::op(t, "send/recv", &parts);
    }
    Ok(())
}
