//! A communicator through cudarc's raw API, polled as a program that polls NCCL does.

use crate::collectives::{Collectives, raw_op};
use crate::ffi::{Fail, cuda, nccl, status};
use crate::ms;
use crate::values::Value;
use cudarc::driver::sys as cu;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DriverError};
use cudarc::nccl::result::{NcclError, NcclStatus};
use cudarc::nccl::{Id, ReduceOp, result, sys};
use std::cell::Cell;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A communicator through cudarc's raw API, as a program that polls NCCL uses it: ended
/// with `ncclCommAbort` when dropped, unless ended before.
pub struct Raw {
    /// The handle; null once ended.
    pub comm: Cell<sys::ncclComm_t>,
    stream: Arc<CudaStream>,
    nonblocking: bool,
}

impl Raw {
    /// Calls the init (`ncclCommInitRankConfig` with `blocking = 0` if `nonblocking`,
    /// else `ncclCommInitRank`) and returns as soon as it does.
    pub fn start(stream: &Arc<CudaStream>, rank: usize, world: usize, id: Id, nonblocking: bool) -> Result<Self, Fail> {
        let id = sys::ncclUniqueId {
            internal: *id.internal(),
        };
        let mut comm = std::ptr::null_mut();
        if nonblocking {
            // NCCL_CONFIG_INITIALIZER, then blocking = 0.
            let version = result::get_nccl_version().map_err(nccl("ncclGetVersion"))?;
            let mut config = sys::ncclConfig_t {
                size: std::mem::size_of::<sys::ncclConfig_t>(),
                magic: 0xcafe_beef,
                version: version as u32,
                blocking: 0,
                cgaClusterSize: i32::MIN,
                minCTAs: i32::MIN,
                maxCTAs: i32::MIN,
                netName: std::ptr::null(),
                splitShare: i32::MIN,
            };
            // SAFETY: valid pointers; the id by value.
            unsafe { result::comm_init_rank_config(&mut comm, world as i32, id, rank as i32, &mut config) }
                .map_err(nccl("ncclCommInitRankConfig"))?;
        } else {
            // SAFETY: as above.
            unsafe { result::comm_init_rank(&mut comm, world as i32, id, rank as i32) }
                .map_err(nccl("ncclCommInitRank"))?;
        }
        Ok(Self {
            comm: Cell::new(comm),
            stream: stream.clone(),
            nonblocking,
        })
    }

    /// [`Raw::start`], then (non-blocking) polls until the init is over; with the report
    /// line of a non-blocking init (how often it was still in progress, and how long).
    pub fn join(
        stream: &Arc<CudaStream>,
        rank: usize,
        world: usize,
        id: Id,
        nonblocking: bool,
    ) -> Result<(Self, Vec<String>), Fail> {
        let t = Instant::now();
        let comm = Self::start(stream, rank, world, id, nonblocking)?;
        if !nonblocking {
            return Ok((comm, Vec::new()));
        }
        let polls = comm.wait_ready("ncclCommInitRankConfig")?;
        let line = format!(
            "rank={rank} init=nonblocking in_progress_polls={polls} init_ms={}",
            ms(t)
        );
        Ok((comm, vec![line]))
    }

    /// A communicator made otherwise (by `ncclCommSplit`), used on `stream`.
    pub fn adopt(stream: &Arc<CudaStream>, comm: sys::ncclComm_t, nonblocking: bool) -> Self {
        Self {
            comm: Cell::new(comm),
            stream: stream.clone(),
            nonblocking,
        }
    }

    /// The handle.
    pub fn comm(&self) -> sys::ncclComm_t {
        self.comm.get()
    }

    /// `ncclCommGetAsyncError`.
    pub fn state(&self) -> Result<sys::ncclResult_t, Fail> {
        let mut state = sys::ncclResult_t::ncclSuccess;
        // SAFETY: a live communicator and a valid pointer.
        unsafe { sys::ncclCommGetAsyncError(self.comm(), &mut state) }
            .result()
            .map_err(nccl("ncclCommGetAsyncError"))?;
        Ok(state)
    }

    /// Polls `ncclCommGetAsyncError` while it says `ncclInProgress`; an error is a
    /// failure. Returns how many polls said `ncclInProgress`.
    pub fn wait_ready(&self, after: &str) -> Result<u64, Fail> {
        let mut polls = 0;
        loop {
            match self.state()? {
                sys::ncclResult_t::ncclSuccess => return Ok(polls),
                sys::ncclResult_t::ncclInProgress => polls += 1,
                e => return Err(nccl(&format!("{after} (ncclCommGetAsyncError)"))(NcclError(e))),
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// A call's result: an error fails; `ncclInProgress` (non-blocking) is waited out.
    fn called(&self, what: &str, r: Result<NcclStatus, NcclError>) -> Result<(), Fail> {
        match r.map_err(nccl(what))? {
            NcclStatus::Success => Ok(()),
            NcclStatus::InProgress if self.nonblocking => self.wait_ready(what).map(drop),
            other => Err(Fail(format!(
                "{what} returned {} on a blocking communicator",
                status(Ok(other))
            ))),
        }
    }

    /// The one wrapper of the raw API's collectives and point-to-point calls: `call` makes
    /// the call on this communicator and stream (it is given both), and its result is
    /// taken as [`Raw::called`] takes it, under the name `what`.
    fn queue(
        &self,
        what: &str,
        call: impl FnOnce(sys::ncclComm_t, sys::cudaStream_t) -> Result<NcclStatus, NcclError>,
    ) -> Result<(), Fail> {
        self.called(what, call(self.comm(), self.stream.cu_stream() as _))
    }

    /// Whether the stream has finished its work (`cuStreamQuery`).
    pub fn stream_idle(&self) -> Result<bool, Fail> {
        // SAFETY: the stream of a live context.
        match unsafe { cu::cuStreamQuery(self.stream.cu_stream()) } {
            cu::CUresult::CUDA_SUCCESS => Ok(true),
            cu::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            e => Err(cuda("cuStreamQuery")(DriverError(e))),
        }
    }

    /// `ncclCommAbort` (once).
    pub fn abort(&self) -> Result<(), Fail> {
        let comm = self.comm.replace(std::ptr::null_mut());
        if comm.is_null() {
            return Ok(());
        }
        // SAFETY: a live communicator, ended once.
        unsafe { result::comm_abort(comm) }
            .map(drop)
            .map_err(nccl("ncclCommAbort"))
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        if let Err(Fail(why)) = self.abort() {
            eprintln!("{why}");
        }
    }
}

// In every call below, the pointers are those of live device buffers of the lengths
// given, kept alive by their guards (`_read`, `_written`) until the call is queued; or,
// with `--break`, on purpose not (host or freed memory, a buffer one short, overlapping
// buffers), for the double to catch (tests/rules.rs).
impl Collectives for Raw {
    fn all_reduce<T: Value>(&self, send: &CudaSlice<T>, recv: &mut CudaSlice<T>, op: &ReduceOp) -> Result<(), Fail> {
        let n = send.len();
        let (s, _read) = send.device_ptr(&self.stream);
        let (r, _written) = recv.device_ptr_mut(&self.stream);
        // SAFETY: device buffers of n elements (see above).
        self.queue("all_reduce", |comm, stream| unsafe {
            result::all_reduce(s as _, r as _, n, T::as_nccl_type(), raw_op(op), comm, stream)
        })
    }

    fn all_reduce_in_place<T: Value>(&self, buf: &mut CudaSlice<T>, op: &ReduceOp) -> Result<(), Fail> {
        let n = buf.len();
        let (p, _written) = buf.device_ptr_mut(&self.stream);
        // SAFETY: a device buffer of n elements (see above).
        self.queue("all_reduce_in_place", |comm, stream| unsafe {
            result::all_reduce(p as _, p as _, n, T::as_nccl_type(), raw_op(op), comm, stream)
        })
    }

    fn broadcast<T: Value>(&self, send: Option<&CudaSlice<T>>, recv: &mut CudaSlice<T>, root: i32) -> Result<(), Fail> {
        let n = recv.len();
        let (s, _read) = send.map(|b| b.device_ptr(&self.stream)).unzip();
        let (r, _written) = recv.device_ptr_mut(&self.stream);
        let s = s.map_or(std::ptr::null(), |p| p as _);
        // SAFETY: device buffers of n elements (see above); sendbuff is only read on the root.
        self.queue("broadcast", |comm, stream| unsafe {
            result::broadcast(s, r as _, n, T::as_nccl_type(), root, comm, stream)
        })
    }

    fn broadcast_in_place<T: Value>(&self, buf: &mut CudaSlice<T>, root: i32) -> Result<(), Fail> {
        let n = buf.len();
        let (p, _written) = buf.device_ptr_mut(&self.stream);
        // SAFETY: a device buffer of n elements (see above).
        self.queue("broadcast_in_place", |comm, stream| unsafe {
            result::broadcast(p as _, p as _, n, T::as_nccl_type(), root, comm, stream)
        })
    }

    fn reduce<T: Value, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &self,
        send: &S,
        recv: Option<&mut R>,
        op: &ReduceOp,
        root: i32,
    ) -> Result<(), Fail> {
        let n = send.len();
        let (s, _read) = send.device_ptr(&self.stream);
        let (r, _written) = recv.map(|b| b.device_ptr_mut(&self.stream)).unzip();
        let r = r.map_or(std::ptr::null_mut(), |p| p as _);
        // SAFETY: device buffers of n elements (see above); recvbuff is only written on
        // the root.
        self.queue("reduce", |comm, stream| unsafe {
            result::reduce(s as _, r, n, T::as_nccl_type(), raw_op(op), root, comm, stream)
        })
    }

    fn reduce_in_place<T: Value, R: DevicePtrMut<T>>(&self, buf: &mut R, op: &ReduceOp, root: i32) -> Result<(), Fail> {
        let n = buf.len();
        let (p, _written) = buf.device_ptr_mut(&self.stream);
        // SAFETY: a device buffer of n elements (see above).
        self.queue("reduce_in_place", |comm, stream| unsafe {
            result::reduce(p as _, p as _, n, T::as_nccl_type(), raw_op(op), root, comm, stream)
        })
    }

    fn all_gather<T: Value, S: DevicePtr<T>, R: DevicePtrMut<T>>(&self, send: &S, recv: &mut R) -> Result<(), Fail> {
        let n = send.len();
        let (s, _read) = send.device_ptr(&self.stream);
        let (r, _written) = recv.device_ptr_mut(&self.stream);
        // SAFETY: a device buffer of n elements and one of world * n (see above).
        self.queue("all_gather", |comm, stream| unsafe {
            result::all_gather(s as _, r as _, n, T::as_nccl_type(), comm, stream)
        })
    }

    fn all_gather_in_place<T: Value, R: DevicePtrMut<T>>(
        &self,
        buf: &mut R,
        at: usize,
        count: usize,
    ) -> Result<(), Fail> {
        let (p, _written) = buf.device_ptr_mut(&self.stream);
        let s = p + (at * std::mem::size_of::<T>()) as u64;
        // SAFETY: a device buffer of world * count elements, sent from at (see above).
        self.queue("all_gather_in_place", |comm, stream| unsafe {
            result::all_gather(s as _, p as _, count, T::as_nccl_type(), comm, stream)
        })
    }

    fn reduce_scatter<T: Value, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &self,
        send: &S,
        recv: &mut R,
        op: &ReduceOp,
    ) -> Result<(), Fail> {
        let n = recv.len();
        let (s, _read) = send.device_ptr(&self.stream);
        let (r, _written) = recv.device_ptr_mut(&self.stream);
        // SAFETY: a device buffer of world * n elements and one of n (see above).
        self.queue("reduce_scatter", |comm, stream| unsafe {
            result::reduce_scatter(s as _, r as _, n, T::as_nccl_type(), raw_op(op), comm, stream)
        })
    }

    fn reduce_scatter_in_place<T: Value, R: DevicePtrMut<T>>(
        &self,
        buf: &mut R,
        at: usize,
        count: usize,
        op: &ReduceOp,
    ) -> Result<(), Fail> {
        let (p, _written) = buf.device_ptr_mut(&self.stream);
        let r = p + (at * std::mem::size_of::<T>()) as u64;
        // SAFETY: a device buffer of world * count elements, received at at (see above).
        self.queue("reduce_scatter_in_place", |comm, stream| unsafe {
            result::reduce_scatter(p as _, r as _, count, T::as_nccl_type(), raw_op(op), comm, stream)
        })
    }

    fn send<T: Value, S: DevicePtr<T>>(&self, buf: &S, peer: i32) -> Result<(), Fail> {
        let (p, _read) = buf.device_ptr(&self.stream);
        // SAFETY: a device buffer of buf.len() elements (see above).
        self.queue("send", |comm, stream| unsafe {
            result::send(p as _, buf.len(), T::as_nccl_type(), peer, comm, stream)
        })
    }

    fn recv<T: Value, R: DevicePtrMut<T>>(&self, buf: &mut R, peer: i32) -> Result<(), Fail> {
        let n = buf.len();
        let (p, _written) = buf.device_ptr_mut(&self.stream);
        // SAFETY: a device buffer of n elements (see above).
        self.queue("recv", |comm, stream| unsafe {
            result::recv(p as _, n, T::as_nccl_type(), peer, comm, stream)
        })
    }

    fn group_end(&self) -> Result<(), Fail> {
        self.called("ncclGroupEnd", result::group_end())
    }

    /// Polls `cuStreamQuery` until the stream is idle, reading `ncclCommGetAsyncError`
    /// at every look: the way to wait for NCCL without hanging on a failed peer.
    fn settle(&self, what: &str) -> Result<(), Fail> {
        loop {
            let idle = self.stream_idle()?;
            match self.state()? {
                sys::ncclResult_t::ncclSuccess if idle => return Ok(()),
                sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress => {}
                e => return Err(nccl(&format!("{what} (ncclCommGetAsyncError)"))(NcclError(e))),
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
