//! All-gather (`ncclAllGather`): every rank contributes `count` elements; every rank
//! receives all of them, rank i's at block i (`n × count` elements).

use super::ring::all_gather_steps;
use super::tuner::Algorithm;
use super::{Collective, DeviceCall, HostCall, Shape, Source, all_but_own};
use crate::backend::cpu::{Cpu, keep};
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

fn nccl(n: &Nccl, c: &DeviceCall) -> Result<()> {
    n.call(c.call(&ALL_GATHER, "sendcount"), |comm, stream| unsafe {
        sys::ncclAllGather(c.send, c.recv, c.count, c.datatype, comm, stream)
    })
}

/// The ring all-gather: this rank's block goes into its place in the receive buffer,
/// then `n - 1` steps pass the blocks round the ring, each rank forwarding the block it
/// received last. It is the second half of the ring all-reduce. On one host, when the
/// tuner says so ([`super::tuner::choose`]), each rank copies the others' blocks straight
/// from their buffers instead ([`single_copy`]).
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
        Algorithm::SingleCopy => {
            // Each rank's block, in its receive buffer, where the others read it.
            let mine = &buf[r * block..(r + 1) * block];
            if let Some(theirs) = cpu
                .share_regions(ALL_GATHER.tag, &[mine], &[block])
                .context("all-gather")?
            {
                return single_copy(cpu, buf, block, &theirs, streaming);
            }
        }
        _ if n == 1 => {
            cpu.ran(&ALL_GATHER, buf.len(), Algorithm::Ring);
            return Ok(());
        }
        _ => {}
    }
    cpu.ran(&ALL_GATHER, buf.len(), Algorithm::Ring);
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

/// A large all-gather on one host, single copy: every rank has told the others where its
/// block lies (`theirs`, [`Cpu::share_regions`]); each copies every other rank's block
/// straight from that rank's buffer into its own, one copy per byte where the ring's
/// slots take two, then all say they are done reading.
fn single_copy(cpu: &Cpu, buf: &mut [u8], block: usize, theirs: &[Vec<&[u8]>], streaming: bool) -> Result<()> {
    use crate::record::{self, Dir, How};
    let (n, r) = (cpu.world(), cpu.rank());
    cpu.ran(&ALL_GATHER, buf.len(), Algorithm::SingleCopy);
    for p in (1..n).map(|k| (r + k) % n) {
        let t = record::clock();
        let dst = &mut buf[p * block..(p + 1) * block];
        keep(dst, theirs[p][0], streaming);
        record::op(t, "read", &[(Dir::Recv, p, dst, How::Copy)]);
    }
    cpu.all_done(ALL_GATHER.tag).context("all-gather")
}
