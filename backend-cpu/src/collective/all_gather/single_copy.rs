//! The single-copy all-gather, for large buffers on one host: every rank copies the
//! others' blocks straight from their buffers.

use crate::collective::HostCall;
use crate::cpu::{Cpu, keep};
use crate::record::{self, Dir, How};
use crate::tuner::Algorithm;
use anyhow::{Context, Result};
use workbook_runtime::Func;

/// A large all-gather on one host, single copy: every rank tells the others where its
/// block lies ([`Comm::share_regions`](crate::Comm::share_regions)): where it started, the
/// send buffer (out of place), else its place in the receive buffer. Not the copy this
/// rank makes of it on every call: the readers would hold its lines from the call before,
/// and each store of the copy would first have to take one back. Each copies every other
/// rank's block straight from there into its own buffer, one copy per byte where the
/// ring's slots take two, then all say they are done reading. Where some rank's block is
/// outside its arena, every rank sees it and all run the [ring](super::ring).
pub fn all_gather(cpu: &Cpu, c: HostCall) -> Result<()> {
    let (n, r, block) = (cpu.world(), cpu.rank(), c.count * c.elem());
    let mine = c.send.unwrap_or(&c.buf[r * block..(r + 1) * block]);
    let shared = cpu
        .share_regions(Func::AllGather.tag(), &[mine], &[block])
        .context("all-gather")?;
    super::own_block(r, &c.send, c.buf, block);
    let streaming = cpu.streams(c.buf.len());
    let Some(theirs) = shared else {
        cpu.ran(Func::AllGather, c.buf.len(), Algorithm::Ring);
        return super::ring::all_gather(cpu, c.buf, block, c.reduction);
    };
    let buf = c.buf;
    for p in (1..n).map(|k| (r + k) % n) {
        let t = record::clock();
        let dst = &mut buf[p * block..(p + 1) * block];
        keep(dst, theirs[p][0], streaming);
        record::op(t, "read", &[(Dir::Recv, p, dst, How::Copy)]);
    }
    cpu.all_done(Func::AllGather.tag()).context("all-gather")
}
