//! The single-copy reduce-scatter, for large buffers on one host: every rank reduces its
//! block straight from the others' buffers.

use crate::collective::HostCall;
use crate::collective::single_copy::reduce_into;
use crate::cpu::Cpu;
use crate::record::{self, Dir, How};
use crate::tuner::Algorithm;
use anyhow::{Context, Result};
use workbook_runtime::Func;

/// A large reduce-scatter on one host, single copy: every rank tells the others where
/// its send buffer lies ([`Comm::share_regions`](crate::Comm::share_regions)); rank r
/// reduces block r of every rank's straight from their memory into its result (in place,
/// its own block r, which no other rank reads), then all say they are done reading. Where
/// some rank's buffer is outside its arena, every rank sees it and all run the
/// [ring](super::ring).
pub fn reduce_scatter(cpu: &Cpu, c: HostCall) -> Result<()> {
    let (n, r, block, red) = (cpu.world(), cpu.rank(), c.count * c.elem(), c.reduction);
    let (send, buf) = (c.send, c.buf);
    let input = send.unwrap_or(&*buf);
    let tag = Func::ReduceScatter.tag();
    let Some(theirs) = cpu
        .share_regions(tag, &[input], &[n * block])
        .context("reduce-scatter")?
    else {
        cpu.ran(Func::ReduceScatter, n * block, Algorithm::Ring);
        return super::ring::reduce_scatter(cpu, send, buf, block, red);
    };
    let mine = r * block..(r + 1) * block;
    let t = record::clock();
    let result = match send {
        Some(_) => &mut buf[..],
        None => &mut buf[mine.clone()],
    };
    let own = send.map(|s| &s[mine.clone()]);
    reduce_into(cpu, result, own, |p| Some(&theirs[p][0][mine.clone()]), red);
    red.finish(result, n);
    let parts: Vec<_> = (1..n)
        .map(|k| (Dir::Recv, (r + k) % n, &*result, How::Reduce))
        .collect();
    record::op(t, "read", &parts);
    cpu.all_done(tag).context("reduce-scatter")
}
