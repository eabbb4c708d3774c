//! The direct reduce-scatter, for small buffers: every block straight to the rank that
//! reduces it, all the sends first.

use crate::collective::direct::send_to_each;
use crate::cpu::Cpu;
use crate::element::Reduction;
use crate::prims::{Prims, Src};
use anyhow::Result;
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
    let (n, r) = (cpu.world(), cpu.rank());
    let blk = |i: usize| i * block..(i + 1) * block;
    let mut prims = Prims::new(cpu, Func::ReduceScatter, send, buf, red);
    // Block r is the only one this rank writes: in place, the others leave from the
    // buffer itself.
    send_to_each(&mut prims, (n, r), Src::Input, blk)?;
    let result = match send {
        Some(src) => {
            prims.output().copy_from_slice(&src[blk(r)]);
            0..block
        }
        None => blk(r),
    };
    for from in (0..n).filter(|&from| from != r) {
        prims.recv_reduce_from(from, result.clone())?;
    }
    red.finish(&mut prims.output()[result], n);
    Ok(())
}
