//! The collectives on NCCL: one NCCL call each (all-to-all: its grouped sends and
//! receives), queued on the rank's stream through [`Nccl::call`], which shows it
//! (`--show-calls`), polls it and watches it. [`run`] picks the call by the collective
//! ([`Func`]); what a collective's buffers must hold is `common`'s description of it.

use crate::calls::Call;
use crate::nccl::{Nccl, NcclName};
use anyhow::Result;
use cudarc::nccl::sys;
use std::ffi::{c_int, c_void};
use workbook_runtime::Func;
use workbook_runtime::element::{DataType, ReduceOp};

/// A collective on NCCL: device pointers (in place, both into the one buffer) and the
/// arguments of NCCL's call.
pub struct DeviceCall {
    /// `sendbuff`.
    pub send: *const c_void,
    /// `recvbuff`.
    pub recv: *mut c_void,
    /// NCCL's `count` argument.
    pub count: usize,
    /// Bytes per element.
    pub elem: usize,
    /// `datatype`, by the workbook's name (NCCL's constant is [`NcclName::nccl`]'s).
    pub datatype: DataType,
    /// `op`.
    pub op: ReduceOp,
    /// `root`.
    pub root: c_int,
}

impl DeviceCall {
    /// NCCL's call of `func` with these arguments, for messages and `--show-calls`:
    /// `ncclReduce(sendbuff, recvbuff, count, datatype, op, root, …)`. `count` is what
    /// NCCL's header names it (all-gather's is `sendcount`, reduce-scatter's `recvcount`).
    pub fn call(&self, func: Func, count: &'static str) -> Call {
        let mut call = Call::new(func.title(), func.nccl_name())
            .ptr("sendbuff", self.send)
            .ptr("recvbuff", self.recv)
            .arg(count, self.count)
            .named("datatype", self.datatype.nccl())
            .bytes(self.count * self.elem);
        if func.reduces() {
            call = call.named("op", self.op.nccl());
        }
        if func.rooted() {
            call = call.arg("root", self.root);
        }
        call
    }
}

/// Queues `func` on this rank's stream: NCCL's call for it.
///
/// # Safety
///
/// `c.send` and `c.recv` must point into device memory of this rank's GPU, which holds at
/// least the elements (of `c.datatype`, `c.elem` bytes each) the collective's buffers need
/// for `c.count` on the communicator's ranks (in place, at NCCL's offsets: `common`'s `Collective::counts` and `in_place`),
/// and that memory must stay allocated until the stream has run the call. NCCL reads and
/// writes it from the GPU, unchecked.
pub unsafe fn run(n: &Nccl, func: Func, c: &DeviceCall) -> Result<()> {
    // SAFETY: each function's contract is this one's.
    unsafe {
        match func {
            Func::Broadcast => broadcast(n, c),
            Func::Reduce => reduce(n, c),
            Func::AllReduce => all_reduce(n, c),
            Func::AllGather => all_gather(n, c),
            Func::ReduceScatter => reduce_scatter(n, c),
            Func::AllToAll => all_to_all(n, c),
        }
    }
}

/// # Safety
///
/// As [`run`] says.
unsafe fn broadcast(n: &Nccl, c: &DeviceCall) -> Result<()> {
    n.call(c.call(Func::Broadcast, "count"), |comm, stream| {
        // SAFETY: the pointers are as this function's contract says (device memory of this
        // GPU, large enough for the count, alive until the stream has run the call); comm
        // and stream are the live communicator and its stream, which Nccl::call passes.
        unsafe { sys::ncclBroadcast(c.send, c.recv, c.count, c.datatype.nccl(), c.root, comm, stream) }
    })
}

/// # Safety
///
/// As [`run`] says.
unsafe fn reduce(n: &Nccl, c: &DeviceCall) -> Result<()> {
    n.call(c.call(Func::Reduce, "count"), |comm, stream| {
        // SAFETY: the pointers are as this function's contract says (device memory of this
        // GPU, large enough for the count, alive until the stream has run the call); comm
        // and stream are the live communicator and its stream, which Nccl::call passes.
        unsafe {
            sys::ncclReduce(
                c.send,
                c.recv,
                c.count,
                c.datatype.nccl(),
                c.op.nccl(),
                c.root,
                comm,
                stream,
            )
        }
    })
}

/// # Safety
///
/// As [`run`] says.
unsafe fn all_reduce(n: &Nccl, c: &DeviceCall) -> Result<()> {
    n.call(c.call(Func::AllReduce, "count"), |comm, stream| {
        // SAFETY: the pointers are as this function's contract says (device memory of this
        // GPU, large enough for the count, alive until the stream has run the call); comm
        // and stream are the live communicator and its stream, which Nccl::call passes.
        unsafe { sys::ncclAllReduce(c.send, c.recv, c.count, c.datatype.nccl(), c.op.nccl(), comm, stream) }
    })
}

/// # Safety
///
/// As [`run`] says.
unsafe fn all_gather(n: &Nccl, c: &DeviceCall) -> Result<()> {
    n.call(c.call(Func::AllGather, "sendcount"), |comm, stream| {
        // SAFETY: the pointers are as this function's contract says (device memory of this
        // GPU, large enough for the count, alive until the stream has run the call); comm
        // and stream are the live communicator and its stream, which Nccl::call passes.
        unsafe { sys::ncclAllGather(c.send, c.recv, c.count, c.datatype.nccl(), comm, stream) }
    })
}

/// # Safety
///
/// As [`run`] says.
unsafe fn reduce_scatter(n: &Nccl, c: &DeviceCall) -> Result<()> {
    n.call(c.call(Func::ReduceScatter, "recvcount"), |comm, stream| {
        // SAFETY: the pointers are as this function's contract says (device memory of this
        // GPU, large enough for the count, alive until the stream has run the call); comm
        // and stream are the live communicator and its stream, which Nccl::call passes.
        unsafe { sys::ncclReduceScatter(c.send, c.recv, c.count, c.datatype.nccl(), c.op.nccl(), comm, stream) }
    })
}

/// One group: a send of block j to every rank j and a receive of block i from every rank
/// i, this rank included. In place, the blocks to send are copied aside first, since the
/// receives overwrite them.
///
/// # Safety
///
/// As [`run`] says.
unsafe fn all_to_all(n: &Nccl, c: &DeviceCall) -> Result<()> {
    let bytes = c.count * c.elem;
    let send = match c.send == c.recv.cast_const() {
        true => n.copy_aside(c.send, bytes * n.world())?,
        false => c.send,
    };
    n.group_start()?;
    for peer in 0..n.world() {
        let block = |base: *const c_void| base.wrapping_byte_add(peer * bytes);
        let call = |doing: String, function, buff, at: *const c_void| {
            Call::new(doing, function)
                .ptr(buff, at)
                .arg("count", c.count)
                .named("datatype", c.datatype.nccl())
                .arg("peer", peer)
                .bytes(bytes)
        };
        let what = call(
            format!("all-to-all: send to rank {peer}"),
            "ncclSend",
            "sendbuff",
            block(send),
        );
        let sent = n.call(what, |comm, stream| {
            // SAFETY: block `peer` of the send buffer (or of the copy aside, which this rank
            // keeps until the stream has used it): `count` elements inside the buffer this
            // function's contract vouches for; comm and stream are Nccl::call's, live.
            unsafe { sys::ncclSend(block(send), c.count, c.datatype.nccl(), peer as c_int, comm, stream) }
        });
        let what = call(
            format!("all-to-all: receive from rank {peer}"),
            "ncclRecv",
            "recvbuff",
            block(c.recv),
        );
        let got = sent.and_then(|()| {
            n.call(what, |comm, stream| {
                // SAFETY: block `peer` of the receive buffer, `count` elements inside the
                // buffer this function's contract vouches for; comm and stream as above.
                unsafe {
                    sys::ncclRecv(
                        block(c.recv).cast_mut(),
                        c.count,
                        c.datatype.nccl(),
                        peer as c_int,
                        comm,
                        stream,
                    )
                }
            })
        });
        if got.is_err() {
            let _ = n.group_end();
            return got;
        }
    }
    n.group_end()
}
