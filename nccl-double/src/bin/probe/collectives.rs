//! What the probe does with a communicator, whichever API it goes through: cudarc's raw
//! API ([`crate::raw::Raw`]) or its safe `Comm` ([`crate::safe::Safe`]).

use crate::ffi::{Fail, checked};
use crate::values::Value;
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use cudarc::nccl::{ReduceOp, result, sys};

/// The reduction `--reduce` names.
pub fn reduce_op(name: &str) -> Result<ReduceOp, Fail> {
    Ok(match name {
        "sum" => ReduceOp::Sum,
        "prod" => ReduceOp::Prod,
        "max" => ReduceOp::Max,
        "min" => ReduceOp::Min,
        "avg" => ReduceOp::Avg,
        _ => return Err(Fail(format!("unknown reduction {name}"))),
    })
}

/// cudarc's safe reduction as the raw API's.
pub fn raw_op(op: &ReduceOp) -> sys::ncclRedOp_t {
    match op {
        ReduceOp::Sum => sys::ncclRedOp_t::ncclSum,
        ReduceOp::Prod => sys::ncclRedOp_t::ncclProd,
        ReduceOp::Max => sys::ncclRedOp_t::ncclMax,
        ReduceOp::Min => sys::ncclRedOp_t::ncclMin,
        ReduceOp::Avg => sys::ncclRedOp_t::ncclAvg,
    }
}

/// What the probe does with a communicator, whichever API it goes through. Every method
/// queues the work; [`Collectives::settle`] waits until it is done (or failed).
pub trait Collectives {
    /// `ncclAllReduce` of `send` into `recv`.
    fn all_reduce<T: Value>(&self, send: &CudaSlice<T>, recv: &mut CudaSlice<T>, op: &ReduceOp) -> Result<(), Fail>;
    /// `ncclAllReduce` in place.
    fn all_reduce_in_place<T: Value>(&self, buf: &mut CudaSlice<T>, op: &ReduceOp) -> Result<(), Fail>;
    /// `ncclBroadcast` from `send` (on the root; `None` elsewhere) into `recv`.
    fn broadcast<T: Value>(&self, send: Option<&CudaSlice<T>>, recv: &mut CudaSlice<T>, root: i32) -> Result<(), Fail>;
    /// `ncclBroadcast` in place.
    fn broadcast_in_place<T: Value>(&self, buf: &mut CudaSlice<T>, root: i32) -> Result<(), Fail>;
    /// `ncclReduce`; `recv` `None` passes a NULL recvbuff (fine on a non-root).
    fn reduce<T: Value, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &self,
        send: &S,
        recv: Option<&mut R>,
        op: &ReduceOp,
        root: i32,
    ) -> Result<(), Fail>;
    /// `ncclReduce` in place.
    fn reduce_in_place<T: Value, R: DevicePtrMut<T>>(&self, buf: &mut R, op: &ReduceOp, root: i32) -> Result<(), Fail>;
    /// `ncclAllGather` with sendcount `send.len()`.
    fn all_gather<T: Value, S: DevicePtr<T>, R: DevicePtrMut<T>>(&self, send: &S, recv: &mut R) -> Result<(), Fail>;
    /// `ncclAllGather` of `count` elements from `buf + at` into `buf` (in place when `at`
    /// is `rank * count`).
    fn all_gather_in_place<T: Value, R: DevicePtrMut<T>>(
        &self,
        buf: &mut R,
        at: usize,
        count: usize,
    ) -> Result<(), Fail>;
    /// `ncclReduceScatter` with recvcount `recv.len()`.
    fn reduce_scatter<T: Value, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &self,
        send: &S,
        recv: &mut R,
        op: &ReduceOp,
    ) -> Result<(), Fail>;
    /// `ncclReduceScatter` of `buf` into `count` elements at `buf + at` (in place when
    /// `at` is `rank * count`).
    fn reduce_scatter_in_place<T: Value, R: DevicePtrMut<T>>(
        &self,
        buf: &mut R,
        at: usize,
        count: usize,
        op: &ReduceOp,
    ) -> Result<(), Fail>;
    /// `ncclSend` of `buf` to `peer`.
    fn send<T: Value, S: DevicePtr<T>>(&self, buf: &S, peer: i32) -> Result<(), Fail>;
    /// `ncclRecv` into `buf` from `peer`.
    fn recv<T: Value, R: DevicePtrMut<T>>(&self, buf: &mut R, peer: i32) -> Result<(), Fail>;
    /// `ncclGroupStart`.
    fn group_start(&self) -> Result<(), Fail> {
        checked("ncclGroupStart", result::group_start())
    }
    /// `ncclGroupEnd`.
    fn group_end(&self) -> Result<(), Fail>;
    /// Waits until the queued work is done; an error NCCL found meanwhile is a failure.
    fn settle(&self, what: &str) -> Result<(), Fail>;
}
