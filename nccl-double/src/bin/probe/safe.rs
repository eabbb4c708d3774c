//! A communicator through cudarc's safe `Comm`.

use crate::collectives::Collectives;
use crate::ffi::{Fail, checked, cuda};
use crate::values::Value;
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use cudarc::nccl::{Comm, ReduceOp, result};

/// cudarc's safe `Comm` (which aborts the communicator when dropped).
pub struct Safe {
    /// The communicator.
    pub comm: Comm,
}

impl Collectives for Safe {
    fn all_reduce<T: Value>(&self, send: &CudaSlice<T>, recv: &mut CudaSlice<T>, op: &ReduceOp) -> Result<(), Fail> {
        checked("all_reduce", self.comm.all_reduce(send, recv, op))
    }

    fn all_reduce_in_place<T: Value>(&self, buf: &mut CudaSlice<T>, op: &ReduceOp) -> Result<(), Fail> {
        checked("all_reduce_in_place", self.comm.all_reduce_in_place(buf, op))
    }

    fn broadcast<T: Value>(&self, send: Option<&CudaSlice<T>>, recv: &mut CudaSlice<T>, root: i32) -> Result<(), Fail> {
        checked("broadcast", self.comm.broadcast(send, recv, root))
    }

    fn broadcast_in_place<T: Value>(&self, buf: &mut CudaSlice<T>, root: i32) -> Result<(), Fail> {
        checked("broadcast_in_place", self.comm.broadcast_in_place(buf, root))
    }

    fn reduce<T: Value, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &self,
        send: &S,
        recv: Option<&mut R>,
        op: &ReduceOp,
        root: i32,
    ) -> Result<(), Fail> {
        checked("reduce", self.comm.reduce(send, recv, op, root))
    }

    fn reduce_in_place<T: Value, R: DevicePtrMut<T>>(&self, buf: &mut R, op: &ReduceOp, root: i32) -> Result<(), Fail> {
        checked("reduce_in_place", self.comm.reduce_in_place(buf, op, root))
    }

    fn all_gather<T: Value, S: DevicePtr<T>, R: DevicePtrMut<T>>(&self, send: &S, recv: &mut R) -> Result<(), Fail> {
        checked("all_gather", self.comm.all_gather(send, recv))
    }

    fn all_gather_in_place<T: Value, R: DevicePtrMut<T>>(
        &self,
        _buf: &mut R,
        _at: usize,
        _count: usize,
    ) -> Result<(), Fail> {
        Err(Fail(
            "cudarc's safe Comm has no in-place all-gather (its sendbuff would borrow the recvbuff it is part of)"
                .into(),
        ))
    }

    fn reduce_scatter<T: Value, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &self,
        send: &S,
        recv: &mut R,
        op: &ReduceOp,
    ) -> Result<(), Fail> {
        checked("reduce_scatter", self.comm.reduce_scatter(send, recv, op))
    }

    fn reduce_scatter_in_place<T: Value, R: DevicePtrMut<T>>(
        &self,
        _buf: &mut R,
        _at: usize,
        _count: usize,
        _op: &ReduceOp,
    ) -> Result<(), Fail> {
        Err(Fail(
            "cudarc's safe Comm has no in-place reduce-scatter (its recvbuff would borrow the sendbuff it is part of)"
                .into(),
        ))
    }

    fn send<T: Value, S: DevicePtr<T>>(&self, buf: &S, peer: i32) -> Result<(), Fail> {
        checked("send", self.comm.send(buf, peer))
    }

    fn recv<T: Value, R: DevicePtrMut<T>>(&self, buf: &mut R, peer: i32) -> Result<(), Fail> {
        checked("recv", self.comm.recv(buf, peer))
    }

    fn group_end(&self) -> Result<(), Fail> {
        checked("ncclGroupEnd", result::group_end())
    }

    fn settle(&self, _what: &str) -> Result<(), Fail> {
        self.comm.stream().synchronize().map_err(cuda("stream.synchronize"))
    }
}
