//! All-gather (`ncclAllGather`): every rank contributes `count` elements; every rank
//! receives all of them, rank i's at block i (`n × count` elements).
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
use workbook_runtime::{Func, record};

/// All-gather on the CPU backend: this rank's block goes into its place in the receive
/// buffer, then, as the tuner says ([`crate::tuner::choose`]): a small buffer goes
/// [`direct`], every block straight to every rank; else the [`ring`] passes the blocks
/// round, or on one host each rank copies the others' blocks straight from their buffers
/// ([`single_copy`]).
pub fn run(cpu: &Cpu, call: HostCall) -> Result<()> {
    let block = call.count * call.elem();
    let (n, r) = (cpu.world(), cpu.rank());
    let HostCall { send, buf, .. } = call;
    if let Some(src) = send {
        buf[r * block..(r + 1) * block].copy_from_slice(src);
        record::wrote(&buf[r * block..(r + 1) * block]);
    }
    let streaming = cpu.streams(buf.len());
    match cpu.choose(Func::AllGather, buf.len()) {
        Algorithm::Direct => return direct::all_gather(cpu, buf, block),
        Algorithm::SingleCopy => {
            // Each rank's block where the others read it: where it started, the send
            // buffer (out of place), else its place in the receive buffer. Not the copy
            // this rank makes on every call: the readers would hold its lines from the
            // call before, and each store of the copy would first have to take one back.
            let mine = send.unwrap_or(&buf[r * block..(r + 1) * block]);
            if let Some(theirs) = cpu
                .share_regions(Func::AllGather.tag(), &[mine], &[block])
                .context("all-gather")?
            {
                return single_copy::all_gather(cpu, buf, block, &theirs, streaming);
            }
        }
        _ if n == 1 => {
            cpu.ran(Func::AllGather, buf.len(), Algorithm::Ring);
            return Ok(());
        }
        _ => {}
    }
    ring::all_gather(cpu, buf, block, streaming)
}
