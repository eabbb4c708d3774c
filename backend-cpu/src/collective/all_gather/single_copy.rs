//! The single-copy all-gather, for large buffers on one host: every rank copies the
//! others' blocks straight from their buffers.

use crate::cpu::{Cpu, keep};
use crate::tuner::Algorithm;
use anyhow::{Context, Result};
use workbook_runtime::Func;

/// A large all-gather on one host, single copy: every rank has told the others where its
/// block lies (`theirs`, [`Comm::share_regions`](crate::Comm::share_regions): its send buffer, or in place its block of
/// the receive buffer); each copies every other rank's block straight from there into its
/// own buffer, one copy per byte where the ring's slots take two, then all say they are
/// done reading.
pub fn all_gather(cpu: &Cpu, buf: &mut [u8], block: usize, theirs: &[Vec<&[u8]>], streaming: bool) -> Result<()> {
    use crate::record::{self, Dir, How};
    let (n, r) = (cpu.world(), cpu.rank());
    cpu.ran(Func::AllGather, buf.len(), Algorithm::SingleCopy);
    for p in (1..n).map(|k| (r + k) % n) {
        let t = record::clock();
        let dst = &mut buf[p * block..(p + 1) * block];
        keep(dst, theirs[p][0], streaming);
        record::op(t, "read", &[(Dir::Recv, p, dst, How::Copy)]);
    }
    cpu.all_done(Func::AllGather.tag()).context("all-gather")
}
