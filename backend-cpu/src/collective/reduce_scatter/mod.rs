//! Reduce-scatter (`ncclReduceScatter`): every rank contributes `n × count` elements;
//! rank i receives block i of their element-wise reduction (`count` elements).
//!
//! Its algorithms on the CPU backend, one file each, and [`run`], which asks the tuner
//! which one runs.

pub mod direct;
pub mod ring;
pub mod single_copy;

use super::HostCall;
use crate::cpu::Cpu;
use crate::tuner::Algorithm;
use anyhow::{Context, Result};
use workbook_runtime::Func;

/// Reduce-scatter on the CPU backend, as the tuner says ([`crate::tuner::choose`]): a
/// small buffer [`direct`], every block straight to the rank that reduces it; else the
/// [`ring`], or on one host each rank reduces its block straight from the others' buffers
/// ([`single_copy`]).
pub fn run(cpu: &Cpu, call: HostCall) -> Result<()> {
    let block = call.count * call.elem();
    let (n, _r) = (cpu.world(), cpu.rank());
    let HostCall {
        send,
        buf,
        reduction: red,
        ..
    } = call;
    let blk = |i: usize| i * block..(i + 1) * block;
    let algo = cpu.choose(Func::ReduceScatter, n * block);
    if n == 1 {
        cpu.ran(Func::ReduceScatter, n * block, algo);
        if let Some(src) = send {
            buf.copy_from_slice(&src[blk(0)]);
        }
        red.finish(buf, n);
        return Ok(());
    }
    if algo == Algorithm::Direct {
        return direct::reduce_scatter(cpu, send, buf, block, red);
    }
    if algo == Algorithm::SingleCopy {
        let input = send.unwrap_or(&*buf);
        let tag = Func::ReduceScatter.tag();
        if let Some(theirs) = cpu
            .share_regions(tag, &[input], &[n * block])
            .context("reduce-scatter")?
        {
            return single_copy::reduce_scatter(cpu, send, buf, block, &theirs, red);
        }
    }
    ring::reduce_scatter(cpu, send, buf, block, red)
}
