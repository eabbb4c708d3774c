//! All-gather (`ncclAllGather`): every rank contributes `count` elements; every rank
//! receives all of them, rank i's at block i (`n × count` elements).

use super::ring::all_gather_steps;
use super::{Collective, DeviceCall, HostCall, Shape, Source, all_but_own};
use crate::backend::cpu::Cpu;
use crate::backend::nccl::Nccl;
use anyhow::Result;
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

fn nccl(n: &Nccl, c: &DeviceCall) -> Result<()> {
    n.call(c.call(&ALL_GATHER, "sendcount"), |comm, stream| unsafe {
        sys::ncclAllGather(c.send, c.recv, c.count, c.datatype, comm, stream)
    })
}

/// The ring all-gather: this rank's block goes into its place in the receive buffer,
/// then `n - 1` steps pass the blocks round the ring, each rank forwarding the block it
/// received last. It is the second half of the ring all-reduce.
fn cpu(cpu: &Cpu, call: HostCall) -> Result<()> {
    let block = call.count * call.elem();
    let (n, r) = (cpu.world(), cpu.rank());
    let HostCall { send, buf, .. } = call;
    if let Some(src) = send {
        buf[r * block..(r + 1) * block].copy_from_slice(src);
        crate::record::wrote(&buf[r * block..(r + 1) * block]);
    }
    crate::record::algorithm("the ring");
    if n == 1 {
        return Ok(());
    }
    let streaming = cpu.streams(buf.len());
    // Rank r starts with block r (`first` = 0).
    all_gather_steps(
        cpu,
        ALL_GATHER.tag,
        buf,
        &|i| i * block..(i + 1) * block,
        0,
        streaming,
        "all-gather",
    )
}
