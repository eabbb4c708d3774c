//! The single-copy all-to-all, for large buffers on one host.

use crate::cpu::{Cpu, keep};
use crate::record::{self, Dir, How};
use crate::tuner::Algorithm;
use anyhow::{Context, Result};
use workbook_runtime::Func;

/// Out of place on one host, each rank copies its block of every other rank's send
/// buffer straight from it (`theirs`, [`Comm::share_regions`](crate::Comm::share_regions)): one copy per byte, where
/// a slot takes two. Then all say they are done reading.
pub fn all_to_all(cpu: &Cpu, buf: &mut [u8], block: usize, theirs: &[Vec<&[u8]>], streaming: bool) -> Result<()> {
    let (n, r, tag) = (cpu.world(), cpu.rank(), Func::AllToAll.tag());
    let blk = |i: usize| i * block..(i + 1) * block;
    cpu.ran(Func::AllToAll, buf.len(), Algorithm::SingleCopy);
    for s in 1..n {
        let from = (r + n - s) % n;
        let t = record::clock();
        keep(&mut buf[blk(from)], &theirs[from][0][blk(r)], streaming);
        record::op(t, "read", &[(Dir::Recv, from, &buf[blk(from)], How::Copy)]);
    }
    cpu.all_done(tag).context("all-to-all")
}
