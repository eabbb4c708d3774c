//! All-gather (`ncclAllGather`): every rank contributes `count` elements; every rank
//! receives all of them, rank i's at block i (`n × count` elements).

pub mod direct;
pub mod ring;
pub mod single_copy;

use super::tuner::Algorithm;
use super::{Collective, DeviceCall, HostCall, Shape, Source, all_but_own};
use crate::backend::cpu::Cpu;
use crate::backend::nccl::Nccl;
use anyhow::{Context, Result};
use cudarc::nccl::sys;

/// All-gather.
pub const ALL_GATHER: Collective = Collective {
    name: "all_gather",
    title: "all-gather",
    nccl_name: "ncclAllGather",
    tag: 4,
    rooted: false,
    reduces: false,
    counts: |count, ranks| (count, ranks * count),
    // NCCL's in-place all-gather: sendbuff == recvbuff + rank × count.
    in_place: |count, _ranks, rank| (rank * count, 0),
    bus_factor: all_but_own,
    source,
    cpu,
    nccl,
};

fn source(shape: &Shape, _rank: usize, i: usize) -> Source {
    Source::From {
        rank: i / shape.count.max(1),
        index: i % shape.count.max(1),
    }
}

/// # Safety
///
/// As [`Collective::nccl`] says.
unsafe fn nccl(n: &Nccl, c: &DeviceCall) -> Result<()> {
    n.call(c.call(&ALL_GATHER, "sendcount"), |comm, stream| {
        // SAFETY: the pointers are as this function's contract says (device memory of this
        // GPU, large enough for the count, alive until the stream has run the call); comm
        // and stream are the live communicator and its stream, which Nccl::call passes.
        unsafe { sys::ncclAllGather(c.send, c.recv, c.count, c.datatype, comm, stream) }
    })
}

/// All-gather on the CPU backend: this rank's block goes into its place in the receive
/// buffer, then, as the tuner says ([`super::tuner::choose`]): a small buffer goes
/// [`direct`], every block straight to every rank; else the [`ring`] passes the blocks
/// round, or on one host each rank copies the others' blocks straight from their buffers
/// ([`single_copy`]).
fn cpu(cpu: &Cpu, call: HostCall) -> Result<()> {
    let block = call.count * call.elem();
    let (n, r) = (cpu.world(), cpu.rank());
    let HostCall { send, buf, .. } = call;
    if let Some(src) = send {
        buf[r * block..(r + 1) * block].copy_from_slice(src);
        crate::record::wrote(&buf[r * block..(r + 1) * block]);
    }
    let streaming = cpu.streams(buf.len());
    match cpu.choose(&ALL_GATHER, buf.len()) {
        Algorithm::Direct => return direct::all_gather(cpu, buf, block),
        Algorithm::SingleCopy => {
            // Each rank's block where the others read it: where it started, the send
            // buffer (out of place), else its place in the receive buffer. Not the copy
            // this rank makes on every call: the readers would hold its lines from the
            // call before, and each store of the copy would first have to take one back.
            let mine = send.unwrap_or(&buf[r * block..(r + 1) * block]);
            if let Some(theirs) = cpu
                .share_regions(ALL_GATHER.tag, &[mine], &[block])
                .context("all-gather")?
            {
                return single_copy::all_gather(cpu, buf, block, &theirs, streaming);
            }
        }
        _ if n == 1 => {
            cpu.ran(&ALL_GATHER, buf.len(), Algorithm::Ring);
            return Ok(());
        }
        _ => {}
    }
    ring::all_gather(cpu, buf, block, streaming)
}
