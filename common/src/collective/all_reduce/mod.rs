//! All-reduce (`ncclAllReduce`): every rank's buffer becomes the element-wise reduction
//! (sum, product, max, min or average) of every rank's buffer.

pub mod direct;
pub mod pipelined;
pub mod ring;
pub mod single_copy;
pub mod tree;

use super::tuner::Algorithm;
use super::{Collective, DeviceCall, HostCall, Shape, Source, same, whole};
use crate::backend::cpu::Cpu;
use crate::backend::nccl::Nccl;
use anyhow::Result;
use cudarc::nccl::sys;

/// All-reduce.
pub const ALL_REDUCE: Collective = Collective {
    name: "all_reduce",
    title: "all-reduce",
    nccl_name: "ncclAllReduce",
    tag: 2,
    rooted: false,
    reduces: true,
    counts: same,
    in_place: whole,
    bus_factor,
    source,
    cpu,
    nccl,
};

/// Each rank sends (and receives) 2(n-1)/n of the buffer: nccl-tests' factor.
fn bus_factor(ranks: usize) -> f64 {
    match ranks {
        0 => 0.0,
        n => 2.0 * (n - 1) as f64 / n as f64,
    }
}

fn source(_: &Shape, _rank: usize, i: usize) -> Source {
    Source::Reduced { index: i }
}

/// # Safety
///
/// As [`Collective::nccl`] says.
unsafe fn nccl(n: &Nccl, c: &DeviceCall) -> Result<()> {
    n.call(c.call(&ALL_REDUCE, "count"), |comm, stream| {
        // SAFETY: the pointers are as this function's contract says (device memory of this
        // GPU, large enough for the count, alive until the stream has run the call); comm
        // and stream are the live communicator and its stream, which Nccl::call passes.
        unsafe { sys::ncclAllReduce(c.send, c.recv, c.count, c.datatype, c.op.nccl(), comm, stream) }
    })
}

/// Ring all-reduce: reduce-scatter, then all-gather.
///
/// The buffer is cut into `n` chunks. In the reduce-scatter, each of `n - 1` steps sends
/// one chunk right and reduces the chunk arriving from the left into ours; after it, rank
/// r holds the full result of chunk r+1. The all-gather then passes the finished chunks
/// around the ring, `n - 1` steps again, until every rank has every chunk. Each rank
/// sends 2(n-1)/n of the buffer in all: nccl-tests' busbw factor.
///
/// This is the ring step by step, as the lesson draws it ([`ring`]). The tuner
/// ([`super::tuner::choose`]) picks it only over TCP or under `--steps` on two ranks:
/// when every link of the ring shares memory, the same ring runs piece by piece instead
/// ([`pipelined`]), which saves the buffer's partial results; a small buffer skips the
/// ring altogether ([`direct`]), and a large one on one host is read where it lies, in
/// the other ranks' memory ([`single_copy`]). `NCCL_ALGO=Tree` runs NCCL's double binary
/// tree instead ([`tree`]).
fn cpu(cpu: &Cpu, call: HostCall) -> Result<()> {
    let HostCall {
        send,
        buf: data,
        reduction: red,
        ..
    } = call;
    let n = cpu.world();
    let algo = cpu.choose(&ALL_REDUCE, data.len());
    if n == 1 {
        cpu.ran(&ALL_REDUCE, data.len(), algo);
        if let Some(src) = send {
            data.copy_from_slice(src);
        }
        red.finish(data, n);
        return Ok(());
    }
    match algo {
        Algorithm::Direct => direct::all_reduce(cpu, send, data, red),
        Algorithm::SingleCopy => single_copy::all_reduce(cpu, send, data, red),
        Algorithm::RingPipelined => pipelined::all_reduce(cpu, send, data, red),
        Algorithm::Tree => tree::all_reduce(cpu, send, data, red),
        _ => ring::all_reduce(cpu, send, data, red),
    }
}
