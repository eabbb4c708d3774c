//! The NCCL backend: NVIDIA's collectives on GPUs, through cudarc.
//!
//! The steps every NCCL program takes, in order:
//! 1. rank 0 creates a unique id (`ncclGetUniqueId`) and shares its 128 bytes through the
//!    store (torchrun's TCPStore does the same for PyTorch);
//! 2. each rank makes its GPU's context current on this thread, and a stream;
//! 3. each rank joins the communicator with `ncclCommInitRank(world, id, rank)`: the call
//!    returns once every rank has joined;
//! 4. collectives are queued on the stream and run on the GPU; reading a result back to
//!    the host waits for them.

use super::{Buffer, Element, Storage};
use crate::error::usage;
use crate::rendezvous::Store;
use anyhow::{Context, Result, anyhow};
use cudarc::driver::{CudaContext, CudaStream};
use cudarc::nccl::result::{NcclError, NcclStatus};
use cudarc::nccl::{Comm, Id, ReduceOp};
use std::ffi::{CStr, c_char};
use std::mem::ManuallyDrop;
use std::sync::Arc;

/// A rank of the NCCL backend: its GPU's context, its stream and its communicator.
pub struct Nccl {
    rank: usize,
    world: usize,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// Dropped only by [`Nccl::close`], after the stream has finished: cudarc's `Drop`
    /// for `Comm` aborts the communicator and panics if that fails (cudarc#584).
    comm: ManuallyDrop<Comm>,
}

impl Nccl {
    /// Joins the NCCL communicator of `world` ranks as `rank`, on GPU `device`.
    pub fn init(store: &mut Store, rank: usize, world: usize, device: usize) -> Result<Nccl> {
        // 1. The unique id: made by rank 0, read by everyone from the store.
        let id = if rank == 0 {
            let id = Id::new().map_err(|e| nccl_error(e, rank, None, "creating the unique id (ncclGetUniqueId)"))?;
            let bytes: Vec<u8> = id.internal().iter().map(|c| *c as u8).collect();
            store.set("nccl/id", &bytes)?;
            id
        } else {
            let bytes = store
                .wait(&[("nccl/id".into(), 0)], "rank 0's NCCL unique id")?
                .remove(0);
            let raw: [c_char; 128] = std::array::from_fn(|i| bytes.get(i).copied().unwrap_or(0) as c_char);
            Id::uninit(raw)
        };
        // 2. The GPU's context, current on this thread (NCCL uses the thread's current
        //    context: without it, every rank would land on GPU 0), and its stream.
        let ctx = CudaContext::new(device).with_context(|| format!("rank {rank}: opening CUDA device {device}"))?;
        ctx.bind_to_thread()
            .with_context(|| format!("rank {rank}: making device {device} current"))?;
        let stream = ctx.default_stream();
        // 3. Join: returns when all `world` ranks have called it with the same id.
        let comm = Comm::from_rank(stream.clone(), rank, world, id)
            .map_err(|e| nccl_error(e, rank, None, "joining the communicator (ncclCommInitRank)"))?;
        Ok(Nccl {
            rank,
            world,
            ctx,
            stream,
            comm: ManuallyDrop::new(comm),
        })
    }

    /// The GPU's name, as `nvidia-smi` shows it.
    pub fn device_name(&self) -> String {
        self.ctx.name().unwrap_or_else(|e| format!("(unknown: {e:?})"))
    }

    pub(super) fn upload<T: Element>(&self, host: Vec<T>) -> Result<Buffer<T>> {
        let slice = self
            .stream
            .clone_htod(&host)
            .with_context(|| format!("rank {}: copying to the GPU", self.rank))?;
        Ok(Buffer {
            storage: Storage::Device(slice),
        })
    }

    pub(super) fn download<T: Element>(&self, buf: &Buffer<T>, n: usize) -> Result<Vec<T>> {
        let Storage::Device(slice) = &buf.storage else {
            unreachable!("NCCL buffers live on the device")
        };
        // Waits for the queued collectives: a copy on the same stream runs after them.
        self.stream
            .clone_dtoh(&slice.slice(..n))
            .with_context(|| format!("rank {}: copying {n} elements back from the GPU", self.rank))
    }

    pub(super) fn broadcast<T: Element>(&self, buf: &mut Buffer<T>, root: usize) -> Result<()> {
        if root >= self.world {
            return Err(usage(format!(
                "--root {root} is not a rank: the world has ranks 0 to {}",
                self.world - 1
            )));
        }
        let slice = device_mut(buf);
        status(self.comm.broadcast_in_place(slice, root as i32))
            .map_err(|e| nccl_error(e, self.rank, Some(&self.comm), "broadcast (ncclBroadcast)"))
    }

    pub(super) fn all_reduce_sum<T: Element>(&self, buf: &mut Buffer<T>) -> Result<()> {
        status(self.comm.all_reduce_in_place(device_mut(buf), &ReduceOp::Sum))
            .map_err(|e| nccl_error(e, self.rank, Some(&self.comm), "all-reduce (ncclAllReduce)"))
    }

    pub(super) fn broadcast_into<T: Element>(&self, send: &Buffer<T>, recv: &mut Buffer<T>, root: usize) -> Result<()> {
        if root >= self.world {
            return Err(usage(format!(
                "--root {root} is not a rank: the world has ranks 0 to {}",
                self.world - 1
            )));
        }
        let src = device(send);
        status(self.comm.broadcast(Some(src), device_mut(recv), root as i32))
            .map_err(|e| nccl_error(e, self.rank, Some(&self.comm), "broadcast (ncclBroadcast)"))
    }

    pub(super) fn all_reduce_sum_into<T: Element>(&self, send: &Buffer<T>, recv: &mut Buffer<T>) -> Result<()> {
        status(self.comm.all_reduce(device(send), device_mut(recv), &ReduceOp::Sum))
            .map_err(|e| nccl_error(e, self.rank, Some(&self.comm), "all-reduce (ncclAllReduce)"))
    }

    pub(super) fn send<T: Element>(&self, buf: &Buffer<T>, peer: usize) -> Result<()> {
        self.check_peer(peer)?;
        let Storage::Device(slice) = &buf.storage else {
            unreachable!("NCCL buffers live on the device")
        };
        self.comm.send(slice, peer as i32).map_err(|e| {
            nccl_error(
                e,
                self.rank,
                Some(&self.comm),
                &format!("send to rank {peer} (ncclSend)"),
            )
        })
    }

    pub(super) fn recv<T: Element>(&self, buf: &mut Buffer<T>, peer: usize) -> Result<()> {
        self.check_peer(peer)?;
        status(self.comm.recv(device_mut(buf), peer as i32)).map_err(|e| {
            nccl_error(
                e,
                self.rank,
                Some(&self.comm),
                &format!("receive from rank {peer} (ncclRecv)"),
            )
        })
    }

    /// Leaves the communicator once every queued operation has finished.
    pub(super) fn close(&mut self) -> Result<()> {
        self.synchronize()?;
        // SAFETY: `comm` is not used again; `close` consumes the backend's last use.
        let comm = unsafe { ManuallyDrop::take(&mut self.comm) };
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(comm))).map_err(|_| {
            anyhow!(
                "rank {}: NCCL failed to release the communicator (ncclCommAbort)",
                self.rank
            )
        })
    }

    pub(super) fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .with_context(|| format!("rank {}: waiting for the GPU stream", self.rank))
    }

    fn check_peer(&self, peer: usize) -> Result<()> {
        if peer >= self.world || peer == self.rank {
            return Err(usage(format!(
                "rank {} cannot exchange with rank {peer}: peers are the other ranks of 0 to {}",
                self.rank,
                self.world - 1
            )));
        }
        Ok(())
    }
}

fn device<T: Element>(buf: &Buffer<T>) -> &cudarc::driver::CudaSlice<T> {
    match &buf.storage {
        Storage::Device(s) => s,
        Storage::Host(_) => unreachable!("NCCL buffers live on the device"),
    }
}

fn device_mut<T: Element>(buf: &mut Buffer<T>) -> &mut cudarc::driver::CudaSlice<T> {
    match &mut buf.storage {
        Storage::Device(s) => s,
        Storage::Host(_) => unreachable!("NCCL buffers live on the device"),
    }
}

/// NCCL's version as `major.minor.patch`, from `ncclGetVersion`.
pub fn version() -> Result<String> {
    let code = cudarc::nccl::result::get_nccl_version().map_err(|e| anyhow!("ncclGetVersion failed: {:?}", e.0))?;
    // NCCL encodes 2.18.3 as 21803 (and versions before 2.9 as 2903-style 1000s).
    let (major, minor, patch) = if code >= 10000 {
        (code / 10000, (code / 100) % 100, code % 100)
    } else {
        (code / 1000, (code / 100) % 10, code % 100)
    };
    Ok(format!("{major}.{minor}.{patch}"))
}

/// An NCCL failure as a person needs it: which rank, doing what, NCCL's result code and
/// NCCL's own last error text.
fn nccl_error(e: NcclError, rank: usize, comm: Option<&Comm>, doing: &str) -> anyhow::Error {
    let text = last_error_text(comm);
    let text = if text.is_empty() {
        String::new()
    } else {
        format!(": {text}")
    };
    anyhow!("rank {rank}: NCCL failed in {doing} with {:?}{text}", e.0)
}

/// NCCL's own text for the last error on this thread (`ncclGetLastError`).
fn last_error_text(comm: Option<&Comm>) -> String {
    let _ = comm; // cudarc keeps the raw communicator private; NCCL also keeps the thread's last error.
    // SAFETY: the library is loaded (we are reporting its error); a null communicator is allowed.
    let p = unsafe { cudarc::nccl::sys::ncclGetLastError(std::ptr::null_mut()) };
    if p.is_null() {
        return String::new();
    }
    // SAFETY: NCCL returns a NUL-terminated string it owns.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().trim().to_string()
}

/// cudarc maps NCCL's result codes to a status: `NumResults` is what a code newer than
/// the 2.22 bindings reads as (2.30's ncclTimeout is 8), so it is an error here.
fn status(r: Result<NcclStatus, NcclError>) -> Result<(), NcclError> {
    match r? {
        NcclStatus::NumResults => Err(NcclError(cudarc::nccl::sys::ncclResult_t::ncclNumResults)),
        NcclStatus::Success | NcclStatus::InProgress => Ok(()),
    }
}
