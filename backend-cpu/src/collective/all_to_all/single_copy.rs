//! The single-copy all-to-all, for large buffers on one host.

use crate::cpu::{Cpu, keep};
use crate::element::Reduction;
use crate::record::{self, Dir, How};
use crate::tuner::Algorithm;
use anyhow::{Context, Result};
use workbook_runtime::Func;

/// On one host, each rank copies its block of every other rank's blocks to send (`src`:
/// its send buffer, or in place the copy aside) straight from it
/// ([`Comm::share_regions`](crate::Comm::share_regions)): one copy per byte, where a slot
/// takes two. Then all say they are done reading. Where any rank's blocks lie outside its
/// arena, every rank sees that and all go [pairwise](super::pairwise).
pub fn all_to_all(cpu: &Cpu, src: &[u8], buf: &mut [u8], block: usize, red: Reduction) -> Result<()> {
    let (n, r, tag) = (cpu.world(), cpu.rank(), Func::AllToAll.tag());
    let Some(theirs) = cpu.share_regions(tag, &[src], &[src.len()]).context("all-to-all")? else {
        cpu.ran(Func::AllToAll, buf.len(), Algorithm::Pairwise);
        return super::pairwise::all_to_all(cpu, src, buf, block, red);
    };
    let streaming = cpu.streams(buf.len());
    let blk = |i: usize| i * block..(i + 1) * block;
    for s in 1..n {
        let from = (r + n - s) % n;
        let t = record::clock();
        keep(&mut buf[blk(from)], &theirs[from][0][blk(r)], streaming);
        record::op(t, "read", &[(Dir::Recv, from, &buf[blk(from)], How::Copy)]);
    }
    cpu.all_done(tag).context("all-to-all")
}
