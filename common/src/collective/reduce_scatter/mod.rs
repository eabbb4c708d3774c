//! Reduce-scatter (`ncclReduceScatter`): every rank contributes `n × count` elements;
//! rank i receives block i of their element-wise reduction (`count` elements).

pub mod direct;
pub mod ring;
pub mod single_copy;

use super::tuner::Algorithm;
use super::{Collective, DeviceCall, HostCall, Shape, Source, all_but_own};
use crate::backend::cpu::Cpu;
use crate::backend::nccl::Nccl;
use anyhow::{Context, Result};
use cudarc::nccl::sys;

/// Reduce-scatter.
pub const REDUCE_SCATTER: Collective = Collective {
    name: "reduce_scatter",
    title: "reduce-scatter",
    nccl_name: "ncclReduceScatter",
    tag: 5,
    rooted: false,
    reduces: true,
    counts: |count, ranks| (ranks * count, count),
    // NCCL's in-place reduce-scatter: recvbuff == sendbuff + rank × count.
    in_place: |count, _ranks, rank| (0, rank * count),
    bus_factor: all_but_own,
    source,
    cpu,
    nccl,
};

fn source(shape: &Shape, rank: usize, i: usize) -> Source {
    Source::Reduced {
        index: rank * shape.count + i,
    }
}

/// # Safety
///
/// As [`Collective::nccl`] says.
unsafe fn nccl(n: &Nccl, c: &DeviceCall) -> Result<()> {
    n.call(c.call(&REDUCE_SCATTER, "recvcount"), |comm, stream| {
        // SAFETY: the pointers are as this function's contract says (device memory of this
        // GPU, large enough for the count, alive until the stream has run the call); comm
        // and stream are the live communicator and its stream, which Nccl::call passes.
        unsafe { sys::ncclReduceScatter(c.send, c.recv, c.count, c.datatype, c.op.nccl(), comm, stream) }
    })
}

/// Reduce-scatter on the CPU backend, as the tuner says ([`super::tuner::choose`]): a
/// small buffer [`direct`], every block straight to the rank that reduces it; else the
/// [`ring`], or on one host each rank reduces its block straight from the others' buffers
/// ([`single_copy`]).
fn cpu(cpu: &Cpu, call: HostCall) -> Result<()> {
    let block = call.count * call.elem();
    let (n, _r) = (cpu.world(), cpu.rank());
    let HostCall {
        send,
        buf,
        reduction: red,
        ..
    } = call;
    let blk = |i: usize| i * block..(i + 1) * block;
    let algo = cpu.choose(&REDUCE_SCATTER, n * block);
    if n == 1 {
        cpu.ran(&REDUCE_SCATTER, n * block, algo);
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
        let tag = REDUCE_SCATTER.tag;
        if let Some(theirs) = cpu
            .share_regions(tag, &[input], &[n * block])
            .context("reduce-scatter")?
        {
            return single_copy::reduce_scatter(cpu, send, buf, block, &theirs, red);
        }
    }
    ring::reduce_scatter(cpu, send, buf, block, red)
}
