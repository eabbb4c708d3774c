//! All-to-all: every rank's buffer is `n` blocks of `count` elements; block j of rank i
//! goes to rank j, where it lands as block i. NCCL has no call for it: programs (and
//! nccl-tests' `alltoall`) group one `ncclSend` and one `ncclRecv` per peer.
//!
//! Its algorithms on the CPU backend, one file each, and [`run`], which asks the tuner
//! which one runs.

pub mod direct;
pub mod pairwise;
pub mod single_copy;

use super::HostCall;
use crate::cpu::{Cpu, keep};
use crate::tuner::Algorithm;
use anyhow::{Context, Result};
use workbook_runtime::{Func, record};

/// All-to-all on the CPU backend: this rank's own block is a copy; the others travel as
/// the tuner says ([`crate::tuner::choose`]): a small buffer [`direct`], every block
/// straight to its rank; else by the [`pairwise`] exchange, `n - 1` steps, or out of
/// place on one host each rank copies its blocks straight from the others' send buffers
/// ([`single_copy`]).
pub fn run(cpu: &Cpu, call: HostCall) -> Result<()> {
    let block = call.count * call.elem();
    let (n, r, tag) = (cpu.world(), cpu.rank(), Func::AllToAll.tag());
    let HostCall { send, buf, .. } = call;
    let blk = |i: usize| i * block..(i + 1) * block;
    // A buffer larger than the caches is written around them (nothing reads it back soon).
    let streaming = cpu.streams(buf.len());
    // In place, this rank's own block is where it belongs already.
    if let Some(s) = send {
        keep(&mut buf[blk(r)], &s[blk(r)], streaming);
    }
    record::wrote(&buf[blk(r)]);
    let chosen = cpu.choose(Func::AllToAll, buf.len());
    if chosen == Algorithm::Direct {
        // Every send goes before the first receive: in place, nothing need go aside.
        return direct::all_to_all(cpu, send, buf, block);
    }
    // Otherwise blocks leave while others arrive: in place, the blocks to send are put
    // aside first, since the receives overwrite them.
    let mut aside = None;
    let src: &[u8] = match send {
        Some(s) => s,
        None => {
            let mut guard = cpu.scratch(buf.len());
            for i in (0..n).filter(|&i| i != r) {
                keep(&mut guard.0[blk(i)], &buf[blk(i)], streaming);
            }
            &aside.insert(guard).0[..buf.len()]
        }
    };
    // On one host each rank copies its block of every other rank's send buffer straight
    // from it: one copy per byte, where a slot takes two. In place the blocks to send are
    // the copy aside, which lies in the arena too when it is large (`Cpu::scratch`); where
    // any rank's does not, every rank sees that and all go pairwise.
    if chosen == Algorithm::SingleCopy
        && let Some(theirs) = cpu.share_regions(tag, &[src], &[src.len()]).context("all-to-all")?
    {
        return single_copy::all_to_all(cpu, buf, block, &theirs, streaming);
    }
    pairwise::all_to_all(cpu, src, buf, block, streaming)
}
