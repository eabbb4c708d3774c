//! Broadcast (`ncclBroadcast`): the root's buffer is copied into every rank's buffer.

pub mod chain;
pub mod direct;
pub mod single_copy;

use super::tuner::Algorithm;
use super::{Collective, DeviceCall, HostCall, Shape, Source, once, same, whole};
use crate::backend::cpu::Cpu;
use crate::backend::nccl::Nccl;
use anyhow::Result;
use cudarc::nccl::sys;

/// Broadcast.
pub const BROADCAST: Collective = Collective {
    name: "broadcast",
    title: "broadcast",
    nccl_name: "ncclBroadcast",
    tag: 1,
    rooted: true,
    reduces: false,
    counts: same,
    in_place: whole,
    bus_factor: once,
    source,
    cpu,
    nccl,
};

fn source(shape: &Shape, _rank: usize, i: usize) -> Source {
    Source::From {
        rank: shape.root,
        index: i,
    }
}

/// # Safety
///
/// As [`Collective::nccl`] says.
unsafe fn nccl(n: &Nccl, c: &DeviceCall) -> Result<()> {
    n.call(c.call(&BROADCAST, "count"), |comm, stream| {
        // SAFETY: the pointers are as this function's contract says (device memory of this
        // GPU, large enough for the count, alive until the stream has run the call); comm
        // and stream are the live communicator and its stream, which Nccl::call passes.
        unsafe { sys::ncclBroadcast(c.send, c.recv, c.count, c.datatype, c.root, comm, stream) }
    })
}

/// Broadcast on the CPU backend: what the tuner chooses ([`super::tuner::choose`]). A
/// small buffer goes [`direct`] from the root; on one host, a large one is copied by
/// every rank straight from the root's memory ([`single_copy`]); else the [`chain`].
fn cpu(cpu: &Cpu, call: HostCall) -> Result<()> {
    let HostCall { send, buf, root, .. } = call;
    let (n, r) = (cpu.world(), cpu.rank());
    let pos = (r + n - root) % n; // this rank's distance from the root along the ring
    let root_src = send.filter(|_| pos == 0);
    match cpu.choose(&BROADCAST, buf.len()) {
        Algorithm::Direct => direct::broadcast(cpu, root_src, buf, root),
        Algorithm::SingleCopy => single_copy::broadcast(cpu, root_src, buf, root),
        _ => chain::broadcast(cpu, root_src, buf, root),
    }
}
