//! Reduce (`ncclReduce`): the element-wise reduction of every rank's buffer, on the root
//! only. The other ranks' receive buffers are not written.

pub mod chain;
pub mod single_copy;

use super::tuner::Algorithm;
use super::{Collective, DeviceCall, HostCall, Shape, Source, once, same, whole};
use crate::backend::cpu::Cpu;
use crate::backend::nccl::Nccl;
use anyhow::Result;
use cudarc::nccl::sys;

/// Reduce.
pub const REDUCE: Collective = Collective {
    name: "reduce",
    title: "reduce",
    nccl_name: "ncclReduce",
    tag: 3,
    rooted: true,
    reduces: true,
    counts: same,
    in_place: whole,
    bus_factor: once,
    source,
    cpu,
    nccl,
};

fn source(shape: &Shape, rank: usize, i: usize) -> Source {
    match rank == shape.root {
        true => Source::Reduced { index: i },
        false => Source::Unchanged,
    }
}

/// # Safety
///
/// As [`Collective::nccl`] says.
unsafe fn nccl(n: &Nccl, c: &DeviceCall) -> Result<()> {
    n.call(c.call(&REDUCE, "count"), |comm, stream| {
        // SAFETY: the pointers are as this function's contract says (device memory of this
        // GPU, large enough for the count, alive until the stream has run the call); comm
        // and stream are the live communicator and its stream, which Nccl::call passes.
        unsafe { sys::ncclReduce(c.send, c.recv, c.count, c.datatype, c.op.nccl(), c.root, comm, stream) }
    })
}

/// Reduce on the CPU backend: as the tuner says ([`super::tuner::choose`]), the
/// [`chain`] round the ring, or, on one host and between two sizes, the root reading
/// every rank's buffer where it lies ([`single_copy`]).
fn cpu(cpu: &Cpu, call: HostCall) -> Result<()> {
    let HostCall {
        send,
        buf,
        root,
        reduction: red,
        ..
    } = call;
    let n = cpu.world();
    let algo = cpu.choose(&REDUCE, buf.len());
    if algo == Algorithm::SingleCopy {
        return single_copy::reduce(cpu, send, buf, root, red);
    }
    cpu.ran(&REDUCE, buf.len(), algo);
    if n == 1 {
        if let Some(src) = send {
            buf.copy_from_slice(src);
        }
        red.finish(buf, n);
        return Ok(());
    }
    chain::reduce(cpu, send, buf, root, red)
}
