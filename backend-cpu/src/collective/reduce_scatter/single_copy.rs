//! The single-copy reduce-scatter, for large buffers on one host: every rank reduces its
//! block straight from the others' buffers.

use crate::collective::single_copy::reduce_into;
use crate::cpu::Cpu;
use crate::element::Reduction;
use crate::tuner::Algorithm;
use anyhow::{Context, Result};
use workbook_runtime::Func;

/// A large reduce-scatter on one host, single copy: every rank has told the others where
/// its send buffer lies (`theirs`, [`Comm::share_regions`](crate::Comm::share_regions)); rank r reduces block r of
/// every rank's straight from their memory into its result (in place, its own block r,
/// which no other rank reads), then all say they are done reading.
pub fn reduce_scatter(
    cpu: &Cpu,
    send: Option<&[u8]>,
    buf: &mut [u8],
    block: usize,
    theirs: &[Vec<&[u8]>],
    red: Reduction,
) -> Result<()> {
    use crate::record::{self, Dir, How};
    let (n, r) = (cpu.world(), cpu.rank());
    let mine = r * block..(r + 1) * block;
    cpu.ran(Func::ReduceScatter, n * block, Algorithm::SingleCopy);
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
    cpu.all_done(Func::ReduceScatter.tag()).context("reduce-scatter")
}
