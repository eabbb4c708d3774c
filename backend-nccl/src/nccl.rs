//! The NCCL backend: NVIDIA's collectives on GPUs, through cudarc.
//!
//! The steps every NCCL program takes, in order:
//! 1. each rank makes its GPU's context current on this thread, and a stream;
//! 2. the ranks compare GPUs (through the store): two ranks of one host on one GPU is
//!    what NCCL refuses as "Duplicate GPU detected";
//! 3. rank 0 creates a unique id (`ncclGetUniqueId`) and shares its 128 bytes through the
//!    store (torchrun's TCPStore does the same for PyTorch);
//! 4. each rank joins the communicator with `ncclCommInitRankConfig(world, id, rank)`;
//! 5. collectives are queued on the stream and run on the GPU; reading a result back to
//!    the host waits for them;
//! 6. at the end, `ncclCommFinalize` (finish what is queued) then `ncclCommDestroy`; on a
//!    failure, `ncclCommAbort`.
//!
//! NCCL never gives up by itself: a peer that dies or freezes leaves the others' kernels
//! spinning for ever. So the communicator is non-blocking (`blocking = 0`: every call
//! returns at once), and every wait here is a loop, as PyTorch's NCCL watchdog does it:
//! is the GPU done (`cuStreamQuery`)? did NCCL report an error (`ncclCommGetAsyncError`)?
//! did the [`Watchdog`] hear of a lost rank, or pass the deadline? On a failure the
//! communicator is aborted, which stops the kernels, and the error names who failed.

use crate::calls::{Call, Label, Shown};
use crate::device::gpu::{Gpu, identify};
use crate::element::Element;
use crate::progress::Progress;
use crate::rendezvous::Store;
use crate::watchdog::Watchdog;
use anyhow::{Context, Result, anyhow};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use cudarc::nccl::sys::{self, ncclResult_t};
use std::cell::{Cell, RefCell};
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long `ncclCommAbort` may take before the process ends without it: a healthy abort
/// takes milliseconds; the launcher waits 3 s for the other ranks after a failure.
const ABORT_DEADLINE: Duration = Duration::from_secs(2);

/// NCCL's `NCCL_SPLIT_NOCOLOR`: a rank that calls `ncclCommSplit` with it joins no
/// communicator (its `newcomm` is NULL).
pub const NOCOLOR: c_int = -1;

/// How long a rank whose NCCL failed asks the store whether a peer died (and caused it).
const LOST_GRACE: Duration = Duration::from_secs(1);

/// How many NCCL operations (collectives, sends and receives, those of a group counted one
/// by one) may be queued on the stream before the rank waits for them, so that no call
/// ever blocks inside NCCL for room, where no deadline reaches (a non-blocking
/// communicator launches in the caller's thread up to 2.22, a blocking one on every
/// version). Each queued operation holds room in four places that fill at about a
/// thousand: CUDA's launch queue (about 1024 kernels); NCCL 2.18's work FIFO (64K slots,
/// one per channel of an operation: 2048 operations on 32 channels), 2.22 and later's
/// (1 MiB, `waitWorkFifoAvailable` in `enqueue.cc` spins until the GPU frees some); and
/// the proxy's pool of network operations (`MAX_OPS_PER_PEER` in `proxy.h`, 2.28.9:
/// 2 × 64 channels × 2 × 8 per local rank, two per channel of an operation, and
/// `ncclLocalOpAppend` spins for a free one). A quarter of the smallest of them leaves
/// room for what NCCL queues of its own.
const MAX_QUEUED: usize = 256;

/// A rank of the NCCL backend: its GPU's context, its stream and its communicator.
pub struct Nccl {
    /// This rank in the world (what messages name), whatever communicator this is.
    rank: usize,
    /// This rank and the number of ranks in this communicator: the world's, or a split one's.
    place: (usize, usize),
    /// The stream collectives are queued on (it holds the GPU's context).
    stream: Arc<CudaStream>,
    /// The communicator; null once it is left (destroyed or aborted).
    comm: Cell<sys::ncclComm_t>,
    /// How many NCCL groups this rank has open (`ncclGroupStart` without its end yet).
    groups: Cell<u32>,
    /// The blocking communicator of timed loops (null until the first one): see
    /// [`Nccl::timing`].
    timed: Cell<sys::ncclComm_t>,
    /// Where `ncclCommSplit` writes it: a place that outlives the call (NCCL's helper
    /// thread writes it when the split is complete).
    timed_slot: Box<Cell<sys::ncclComm_t>>,
    /// Inside a timed loop: calls go to the blocking communicator, each under [`Nccl::stuck`].
    in_timed_loop: Cell<bool>,
    /// The deadline of a call on the blocking communicator (armed at each call).
    stuck: RefCell<Option<crate::deadline::Armed>>,
    /// The time spent in [`Nccl::synchronize`] so far (a timed loop's time to issue its
    /// calls leaves out the waits of [`MAX_QUEUED`]).
    waited: Cell<Duration>,
    /// What the last operation was, for the messages of the wait that follows.
    last: RefCell<Label>,
    /// The operations queued on the stream and not yet seen finished, with their events.
    progress: RefCell<Progress>,
    watchdog: RefCell<Watchdog>,
    gpu: Gpu,
    /// Working memory for [`Nccl::copy_aside`].
    aside: RefCell<Option<CudaSlice<u8>>>,
    /// The calls of the open group (outermost): nothing of them reaches the stream before
    /// the group's end, so they get no event of their own, only the group one at its end.
    grouped: RefCell<Vec<(Label, usize)>>,
    /// The working memory of copies set aside inside an open group: one per call (the
    /// calls of a group run together, at its end, so they cannot share one), freed in
    /// stream order once the group is queued ([`Nccl::group_end`]).
    held: RefCell<Vec<CudaSlice<u8>>>,
    /// Where `--show-calls` prints the calls.
    shown: Shown,
    /// This rank's heartbeat (the world's communicator, ranks but 0): while this rank's
    /// thread is blocked inside NCCL, it still says the rank is alive, so that the store
    /// can tell a rank stopped from the ranks blocked waiting for it ([`Watchdog::blamer`]).
    _heartbeat: Option<crate::heartbeat::Heartbeat>,
    /// The last collective queued (NCCL's name without `nccl`, and its bytes as NCCL
    /// counts them), to look up what NCCL chose for it ([`Nccl::choice`]).
    last_collective: Cell<Option<(&'static str, u64)>>,
    /// Collectives queued: NCCL's own lines are read every [`LOG_EVERY`] of them.
    collectives: Cell<u64>,
    /// `NCCL_ALGO` and `NCCL_PROTO` when this communicator started: NCCL read them then
    /// (`ncclTopoTuneModel`), and does not read them again for it.
    started_under: [Option<String>; 2],
}

/// The variables NCCL reads when a communicator starts, in [`Nccl::started_under`]'s order.
const TUNING_VARS: [&str; 2] = ["NCCL_ALGO", "NCCL_PROTO"];

/// How often (in collectives) NCCL's lines are read, so that they never pile up.
const LOG_EVERY: u64 = 1024;

impl Nccl {
    /// Joins the NCCL communicator of the job's ranks as the rank `job` names, on GPU `device`
    /// of this process (`host` names the machine), watching every wait with `timeout`;
    /// `shown` says whether to print each call (`--show-calls`).
    pub fn init(
        store: &mut Store,
        job: &crate::launch::Identity,
        device: usize,
        host: &str,
        timeout: Duration,
        shown: Shown,
    ) -> Result<Nccl> {
        let (rank, world) = (job.rank, job.world_size);
        // 1. The GPU's context, current on this thread (NCCL uses the thread's current
        //    context: without it, every rank would land on GPU 0), and its stream.
        let ctx = CudaContext::new(device).with_context(|| format!("rank {rank}: opening CUDA device {device}"))?;
        ctx.bind_to_thread()
            .with_context(|| format!("rank {rank}: making device {device} current"))?;
        // SAFETY: cudarc's event tracking orders a buffer's uses across streams; every use
        // of this rank's GPU memory goes through `stream`, the one stream it makes, whose own
        // order already does that, so the tracking would only add events to each call.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx
            .new_stream()
            .with_context(|| format!("rank {rank}: making a stream on device {device}"))?;
        let ok = Some(&CUDA_SUCCESS as &dyn std::fmt::Debug);
        let dev = ctx.cu_device();
        shown.show(
            &Call::new("", "cuInit").arg("Flags", 0),
            ok,
            &format!("cudarc's CudaContext::new({device}) makes this call and the next three"),
        );
        shown.show(
            &Call::new("", "cuDeviceGet")
                .arg("device", format!("→{dev}"))
                .arg("ordinal", device),
            ok,
            "",
        );
        shown.show(
            &Call::new("", "cuDevicePrimaryCtxRetain")
                .arg("pctx", format!("→{:p}", ctx.cu_ctx()))
                .arg("dev", dev),
            ok,
            "the GPU's context: its memory, its streams",
        );
        shown.show(
            &Call::new("", "cuCtxSetCurrent").ptr("ctx", ctx.cu_ctx()),
            ok,
            "current on this thread: NCCL uses the thread's current context",
        );
        shown.show(
            &Call::new("", "cuStreamCreate")
                .arg("phStream", format!("→{:p}", stream.cu_stream()))
                .arg("Flags", "CU_STREAM_NON_BLOCKING"),
            ok,
            "the rank's stream, as nccl-tests and PyTorch make theirs: every copy and collective goes on it, in order",
        );

        // 2. One rank per GPU: compare every rank's GPU before NCCL does.
        let gpu = identify(&ctx, host).with_context(|| format!("rank {rank}: reading device {device}'s identity"))?;
        shown.show(
            &Call::new("", "cuDeviceGetPCIBusId")
                .arg("pciBusId", format!("→\"{}\"", gpu.bus_id))
                .arg("len", 32)
                .arg("dev", dev),
            ok,
            "with cuDeviceGetUuid: which GPU this is, compared across ranks through the store",
        );
        crate::device::gpu::one_rank_per_gpu(store, (rank, world), &gpu)?;

        // 3. The unique id: made by rank 0, read by everyone from the store.
        let id = if rank == 0 {
            let id = cudarc::nccl::result::get_uniqueid().map_err(|e| {
                anyhow!(
                    "rank {rank}: NCCL failed in creating the unique id (ncclGetUniqueId) with {:?}",
                    e.0
                )
            })?;
            let bytes: Vec<u8> = id.internal.iter().map(|c| *c as u8).collect();
            shown.show(
                &Call::new("", "ncclGetUniqueId").arg("uniqueId", format!("→{}", id_bytes(&bytes))),
                Some(&ncclResult_t::ncclSuccess),
                "rank 0 makes the id; every rank reads it from the store (key \"nccl/id\")",
            );
            store.set("nccl/id", &bytes)?;
            id
        } else {
            let bytes = store
                .wait(&[("nccl/id".into(), 0)], "rank 0's NCCL unique id")?
                .remove(0);
            sys::ncclUniqueId {
                internal: std::array::from_fn(|i| bytes.get(i).copied().unwrap_or(0) as c_char),
            }
        };

        // 4. Join, without blocking: the call returns at once, and the wait below polls
        //    until every rank has joined (or someone failed, or the deadline passed).
        let watchdog = Watchdog::new(store, rank, world, timeout)?;
        // Beats from now on (not rank 0: it hosts the store, which stops with it).
        let heartbeat = (rank > 0)
            .then(|| crate::heartbeat::Heartbeat::start(store, job, timeout))
            .flatten();
        let mut nccl = Nccl::on_stream(
            rank,
            (rank, world),
            (stream, gpu, shown),
            watchdog,
            "joining the communicator (ncclCommInitRankConfig)",
        );
        nccl._heartbeat = heartbeat;
        let mut comm = std::ptr::null_mut();
        let mut config = config(false);
        let bytes: Vec<u8> = id.internal.iter().map(|c| *c as u8).collect();
        // SAFETY: `comm` and `config` are valid for the call; the id is 128 bytes by value.
        let r = unsafe { sys::ncclCommInitRankConfig(&mut comm, world as c_int, id, rank as c_int, &mut config) };
        nccl.comm.set(comm);
        let call = Call::new("joining the communicator", "ncclCommInitRankConfig")
            .arg("comm", format!("→{comm:p}"))
            .arg("nranks", world)
            .arg("commId", id_bytes(&bytes))
            .arg("rank", rank)
            .arg("config", format!("{{size={CONFIG_SIZE}, blocking=0}}"));
        shown.show(
            &call,
            Some(&r),
            "non-blocking: it returns at once, and this rank polls until every rank has joined",
        );
        nccl.called(r, call.label())?;
        Ok(nccl)
    }

    /// A rank's communicator before NCCL has made it (null until the init or split writes
    /// it): world rank `rank`, `place` in it, on `stream` of `gpu`, calls shown as `shown`
    /// says, its waits watched by `watchdog`; `doing` names what the first wait is for.
    fn on_stream(
        rank: usize,
        place: (usize, usize),
        (stream, gpu, shown): (Arc<CudaStream>, Gpu, Shown),
        watchdog: Watchdog,
        doing: &'static str,
    ) -> Nccl {
        Nccl {
            rank,
            place,
            stream,
            comm: Cell::new(std::ptr::null_mut()),
            groups: Cell::new(0),
            timed: Cell::new(std::ptr::null_mut()),
            timed_slot: Box::new(Cell::new(std::ptr::null_mut())),
            in_timed_loop: Cell::new(false),
            stuck: RefCell::new(None),
            waited: Cell::new(Duration::ZERO),
            last: RefCell::new(Label::of(doing)),
            progress: RefCell::new(Progress::default()),
            watchdog: RefCell::new(watchdog),
            gpu,
            aside: RefCell::new(None),
            grouped: RefCell::new(Vec::new()),
            held: RefCell::new(Vec::new()),
            shown,
            _heartbeat: None,
            last_collective: Cell::new(None),
            collectives: Cell::new(0),
            // Made just before the init or once the split is complete: the variables have
            // not changed since NCCL read them (they change only between communicators).
            started_under: TUNING_VARS.map(|name| std::env::var(name).ok()),
        }
    }

    /// The value `name` (`NCCL_ALGO` or `NCCL_PROTO`) had when this communicator started:
    /// the one NCCL tuned it with.
    pub fn started_under(&self, name: &str) -> Option<&str> {
        let i = TUNING_VARS.iter().position(|v| *v == name)?;
        self.started_under[i].as_deref()
    }

    /// A communicator of the same ranks, in the same order, split from this one
    /// (`ncclCommSplit`): NCCL tunes it under `NCCL_ALGO` and `NCCL_PROTO` as they are now
    /// (the benchmark's `-A` and `-P`, one communicator per sweep). Every rank of this one
    /// calls it at the same point. Then this one can be closed.
    pub fn renewed(&self, watchdog: Watchdog) -> Result<Nccl> {
        let said = (
            "a communicator for the next sweep",
            "the same ranks: NCCL reads NCCL_ALGO and NCCL_PROTO when a communicator starts (-A, -P)",
        );
        let child = self.split_saying(0, self.place.0 as c_int, self.place, watchdog, said)?;
        child.ok_or_else(|| anyhow!("rank {}: ncclCommSplit gave no communicator", self.rank))
    }

    /// The algorithm and protocol NCCL chose for the last collective (`ring`, `simple`),
    /// as it printed them ([`crate::nccl_log`]): on the communicator's rank 0, with NCCL
    /// 2.21 or later, and where the user left `NCCL_DEBUG` to the workbook.
    pub fn choice(&self) -> Option<(&'static str, &'static str)> {
        let (function, bytes) = self.last_collective.get()?;
        crate::nccl_log::choice(function, bytes, self.place.1).map(|c| (c.algo, c.proto))
    }

    /// The GPU's name, as `nvidia-smi` shows it.
    pub fn device_name(&self) -> String {
        self.gpu.name.clone()
    }

    /// A copy of `host` in this GPU's memory, queued on the stream.
    pub fn upload<T: Element>(&self, host: Vec<T>) -> Result<CudaSlice<T>> {
        self.synchronize()?;
        let slice = self
            .stream
            .clone_htod(&host)
            .map_err(cuda_error)
            .with_context(|| format!("rank {}: copying to the GPU", self.rank))?;
        let bytes = std::mem::size_of_val(host.as_slice());
        self.last.replace(Label::of("copying to the GPU (cuMemcpyHtoDAsync)"));
        let (dst, _written) = slice.device_ptr(self.stream.as_ref());
        self.show_alloc(dst, bytes, "cudarc's clone_htod: GPU memory for the buffer...");
        self.show_cuda(
            Call::new("", "cuMemcpyHtoDAsync_v2")
                .arg("dstDevice", format!("{dst:#x}"))
                .ptr("srcHost", host.as_ptr())
                .arg("ByteCount", bytes),
            "...and the host's values copied into it, queued on the stream",
        );
        drop(_written);
        Ok(slice)
    }

    /// Elements `range` of `buf`, read back after every queued operation is done.
    pub fn download<T: Element>(&self, buf: &CudaSlice<T>, range: std::ops::Range<usize>) -> Result<Vec<T>> {
        // The copy would wait for the queued collectives without a deadline: wait here first.
        self.synchronize()?;
        let n = range.len();
        if n == 0 {
            return Ok(vec![]);
        }
        let view = buf.slice(range);
        let host = self
            .stream
            .clone_dtoh(&view)
            .map_err(cuda_error)
            .with_context(|| format!("rank {}: copying {n} elements back from the GPU", self.rank))?;
        let (src, _read) = view.device_ptr(self.stream.as_ref());
        self.show_cuda(
            Call::new("", "cuMemcpyDtoHAsync_v2")
                .ptr("dstHost", host.as_ptr())
                .arg("srcDevice", format!("{src:#x}"))
                .arg("ByteCount", std::mem::size_of_val(host.as_slice())),
            "cudarc's clone_dtoh: the GPU's values back to the host",
        );
        drop(_read);
        // The last thing queued is now this copy: a later wait names it, not the collective.
        self.last
            .replace(Label::of("copying back from the GPU (cuMemcpyDtoHAsync)"));
        Ok(host)
    }

    /// This rank, in this communicator.
    pub fn rank(&self) -> usize {
        self.place.0
    }

    /// The number of ranks in this communicator.
    pub fn world(&self) -> usize {
        self.place.1
    }

    /// This rank's part of a communicator split from this one (`ncclCommSplit`, as every
    /// rank of this one must call it): the ranks of `color` ordered by `key`, then by their
    /// rank here; `place` is this rank's (rank, size) in it, as the caller worked it out
    /// from every rank's color and key. `None` for [`NOCOLOR`], which joins none.
    /// Non-blocking, like this one: polled under the same watchdog and deadline;
    /// `watchdog` is the new communicator's (`--timeout`, this rank's heartbeat).
    pub fn split(&self, color: c_int, key: c_int, place: (usize, usize), watchdog: Watchdog) -> Result<Option<Nccl>> {
        let said = (
            "splitting the communicator",
            "every rank of the parent calls it; those of one color form a communicator (a job of the parent: polled)",
        );
        self.split_saying(color, key, place, watchdog, said)
    }

    /// [`Nccl::split`], the call shown with `said` (what it is for, and the note).
    fn split_saying(
        &self,
        color: c_int,
        key: c_int,
        place: (usize, usize),
        watchdog: Watchdog,
        said: (&'static str, &str),
    ) -> Result<Option<Nccl>> {
        // NCCL writes the new communicator here from its helper thread, when the split is
        // complete: boxed, so that it stays where it is whatever happens to this frame.
        let slot: Box<Cell<sys::ncclComm_t>> = Box::new(Cell::new(std::ptr::null_mut()));
        // SAFETY: `slot` outlives the split: kept until the parent says it is complete, or
        // leaked when it fails (NCCL may still write it if the abort did not stop its thread).
        if let Err(e) = unsafe { self.split_into(color, key, false, slot.as_ptr(), said) } {
            Box::leak(slot);
            return Err(e);
        }
        let comm = slot.get();
        if color == NOCOLOR {
            return Ok(None);
        }
        if comm.is_null() {
            return Err(anyhow!(
                "rank {}: ncclCommSplit said success but gave no communicator",
                self.rank
            ));
        }
        let child = Nccl::on_stream(
            self.rank,
            place,
            (self.stream.clone(), self.gpu.clone(), self.shown),
            watchdog,
            "joining the split communicator (ncclCommSplit)",
        );
        child.comm.set(comm);
        // The new communicator is non-blocking too: it may still be connecting.
        child.called(
            ncclResult_t::ncclInProgress,
            "joining the split communicator (ncclCommSplit)",
        )?;
        Ok(Some(child))
    }

    /// Calls `f` with the device pointers of a collective's buffers: `send`'s and
    /// `recv`'s, or in place (`send` is `None`) both into `recv`, at the element offsets
    /// `in_place` gives (NCCL's in-place layouts). The buffers are recorded as used by the
    /// stream.
    pub fn with_pointers<T: Element, R>(
        &self,
        send: Option<&CudaSlice<T>>,
        recv: &mut CudaSlice<T>,
        in_place: (usize, usize),
        f: impl FnOnce(*const c_void, *mut c_void) -> R,
    ) -> R {
        let stream = self.stream.as_ref();
        let elem = size_of::<T>();
        // The guards record, when dropped after the call, that the stream used the buffers.
        let (dst, _written) = recv.device_ptr_mut(stream);
        let (src, _read) = match send {
            Some(s) => {
                let (p, guard) = s.device_ptr(stream);
                (p, Some(guard))
            }
            None => (dst + (in_place.0 * elem) as u64, None),
        };
        let dst = match send {
            Some(_) => dst,
            None => dst + (in_place.1 * elem) as u64,
        };
        f(src as *const c_void, dst as *mut c_void)
    }

    /// A copy of `bytes` at `src`, queued on the stream into working memory this rank
    /// keeps: for a collective whose input its own output would overwrite.
    /// Inside an open group, each copy has working memory of its own, kept until the group
    /// is queued: the group's calls all run at its end, after every copy.
    pub fn copy_aside(&self, src: *const c_void, bytes: usize) -> Result<*const c_void> {
        let make = || -> Result<CudaSlice<u8>> {
            let made = self
                .stream
                .alloc_zeros::<u8>(bytes.max(1))
                .map_err(cuda_error)
                .with_context(|| format!("rank {}: allocating {bytes} bytes of GPU memory", self.rank))?;
            let (p, _written) = made.device_ptr(self.stream.as_ref());
            self.show_alloc(
                p,
                bytes.max(1),
                "working memory for an input the output would overwrite",
            );
            drop(_written);
            Ok(made)
        };
        let mut held = self.held.borrow_mut();
        let mut aside = self.aside.borrow_mut();
        let target = match self.groups.get() {
            0 => {
                if aside.as_ref().is_none_or(|a| a.len() < bytes) {
                    *aside = Some(make()?);
                }
                aside.as_mut().expect("just made")
            }
            _ => {
                held.push(make()?);
                held.last_mut().expect("just made")
            }
        };
        let stream = self.stream.as_ref();
        let (dst, _written) = target.device_ptr_mut(stream);
        // SAFETY: both ranges are device memory of this context, `bytes` long, on this stream.
        let r = unsafe { cudarc::driver::sys::cuMemcpyDtoDAsync_v2(dst, src as u64, bytes, stream.cu_stream()) };
        self.shown.show(
            &Call::new("", "cuMemcpyDtoDAsync_v2")
                .arg("dstDevice", format!("{dst:#x}"))
                .ptr("srcDevice", src)
                .arg("ByteCount", bytes)
                .ptr("hStream", stream.cu_stream()),
            Some(&r),
            "the input set aside, on the GPU",
        );
        if r != cudarc::driver::sys::cudaError_enum::CUDA_SUCCESS {
            return Err(anyhow!(
                "rank {}: copying {bytes} bytes on the GPU failed: {r:?}",
                self.rank
            ));
        }
        Ok(dst as *const c_void)
    }

    /// Sends the whole buffer to `peer` (`ncclSend`).
    pub fn send<T: Element>(&self, buf: &CudaSlice<T>, peer: usize) -> Result<()> {
        let (src, _read) = buf.device_ptr(self.stream.as_ref());
        let call = Call::new(format!("send to rank {peer}"), "ncclSend")
            .ptr("sendbuff", src as *const c_void)
            .arg("count", buf.len())
            .named("datatype", T::as_nccl_type())
            .arg("peer", peer)
            .bytes(buf.len() * size_of::<T>());
        self.call(call, |comm, stream| {
            // SAFETY: `src` is `buf`'s device memory on this GPU, `buf.len()` elements of T,
            // recorded as read by the stream (cudarc frees it in stream order, after the
            // send); comm and stream are Nccl::call's, live.
            unsafe { sys::ncclSend(src as _, buf.len(), T::as_nccl_type(), peer as c_int, comm, stream) }
        })
    }

    /// Receives the whole buffer from `peer` (`ncclRecv`).
    pub fn recv<T: Element>(&self, buf: &mut CudaSlice<T>, peer: usize) -> Result<()> {
        let count = buf.len();
        let (dst, _written) = buf.device_ptr_mut(self.stream.as_ref());
        let call = Call::new(format!("receive from rank {peer}"), "ncclRecv")
            .ptr("recvbuff", dst as *const c_void)
            .arg("count", count)
            .named("datatype", T::as_nccl_type())
            .arg("peer", peer)
            .bytes(count * size_of::<T>());
        self.call(call, |comm, stream| {
            // SAFETY: `dst` is `buf`'s device memory on this GPU, `count` elements of T, held
            // mutably for this call and recorded as written by the stream; comm and stream
            // are Nccl::call's, live.
            unsafe { sys::ncclRecv(dst as _, count, T::as_nccl_type(), peer as c_int, comm, stream) }
        })
    }

    /// Opens an NCCL group: the sends and receives until [`Nccl::group_end`] progress together.
    pub fn group_start(&self) -> Result<()> {
        // SAFETY: no arguments; NCCL keeps the group per thread.
        let r = unsafe { sys::ncclGroupStart() };
        self.groups.set(self.groups.get() + 1);
        let call = Call::new("opening a group", "ncclGroupStart");
        self.shown
            .show(&call, Some(&r), "the calls until ncclGroupEnd are queued together");
        self.called(r, call.label())
    }

    /// Closes the group: its operations are queued (and, non-blocking, may still be).
    /// Nothing to do if an abort closed it already (after a failed call inside it).
    pub fn group_end(&self) -> Result<()> {
        if self.groups.get() == 0 {
            return Ok(());
        }
        self.groups.set(self.groups.get() - 1);
        // On the timed loops' blocking communicator, the outermost end launches the group
        // in this thread, and connects to each peer of its first sends and receives
        // (`groupLaunch` in `ncclGroupEndInternal`): it waits for those peers, under the
        // timed calls' deadline.
        // SAFETY: no arguments; ends the group this thread opened.
        let r = self.under_deadline(|| unsafe { sys::ncclGroupEnd() });
        let call = Call::new("closing a group", "ncclGroupEnd");
        self.shown.show(&call, Some(&r), "");
        let queued = self.called(r, call.label());
        if self.groups.get() > 0 {
            return queued;
        }
        // Freed in stream order: after the group's calls, which read them.
        self.held.borrow_mut().clear();
        let calls = std::mem::take(&mut *self.grouped.borrow_mut());
        queued?;
        if calls.is_empty() {
            return Ok(());
        }
        // The group is on the stream now: one event after it, for the waits.
        let bytes = calls.iter().map(|(_, b)| b).sum();
        self.queued(group_label(&calls), bytes, calls.len())
    }

    /// Runs `f`, an NCCL call, under the timed calls' deadline when one is set (inside a
    /// timed loop: its blocking communicator may block inside NCCL, where no poll reaches).
    fn under_deadline<R>(&self, f: impl FnOnce() -> R) -> R {
        let stuck = self.stuck.borrow();
        if let Some(d) = stuck.as_ref() {
            d.renew(self.watchdog.borrow().timeout());
        }
        let r = f();
        if let Some(d) = stuck.as_ref() {
            d.pause();
        }
        r
    }

    /// Leaves the communicator as NCCL documents it: once every queued operation has
    /// finished, `ncclCommFinalize`, then `ncclCommDestroy`.
    pub fn close(&mut self) -> Result<()> {
        self.synchronize()?;
        self.progress.get_mut().release();
        self.close_timed()?;
        let comm = self.live("ncclCommFinalize")?;
        // SAFETY: a live communicator of this thread.
        let r = unsafe { sys::ncclCommFinalize(comm) };
        let call = Call::new("finishing the communicator", "ncclCommFinalize").ptr("comm", comm);
        self.shown
            .show(&call, Some(&r), "finishes what is queued, with the other ranks");
        self.called(r, call.label())?;
        // SAFETY: finalized; nothing uses it after this.
        let r = unsafe { sys::ncclCommDestroy(comm) };
        self.shown
            .show(&Call::new("", "ncclCommDestroy").ptr("comm", comm), Some(&r), "");
        self.comm.set(std::ptr::null_mut());
        if r != ncclResult_t::ncclSuccess {
            return Err(self.error(r, "freeing the communicator (ncclCommDestroy)"));
        }
        Ok(())
    }

    /// Inside a timed loop (`on`) or not. A timed loop is nccl-tests' own: its calls go to
    /// a blocking communicator (nccl-tests' default), and its progress is marked with few
    /// events ([`Progress`]).
    ///
    /// Why a second communicator: every wait of this backend keeps a deadline, so its
    /// communicator is non-blocking; and from NCCL 2.23 every call on a non-blocking
    /// communicator is launched by a helper thread (`pthread_create` in `group.cc`), the
    /// call says `ncclInProgress`, and the next call is refused until
    /// `ncclCommGetAsyncError` says `ncclSuccess`: a thread and a poll per call, tens of
    /// microseconds where a small all-reduce takes ten. So the first timed loop makes a
    /// blocking communicator of the same ranks with `ncclCommSplit`, itself a job of the
    /// non-blocking one, polled with its deadline like an init. It has resources of its
    /// own: NCCL shares them only when the *parent* was made with `splitShare = 1`, and a
    /// sharing child has bugs of its own (NVIDIA/nccl issue 2430). Its calls cannot be
    /// polled: each gets a deadline of its own (`--timeout`, [`crate::deadline`]) in case
    /// NCCL blocks inside it, `ncclGroupEnd` included (a blocking group end launches in
    /// this thread and connects to each new peer, waiting for it); past it, the store
    /// names the rank whose heartbeat stopped ([`Watchdog::blamer`]).
    pub fn timing(&self, on: bool) -> Result<()> {
        if on && self.timed.get().is_null() {
            self.split_timed()?;
        }
        self.progress.borrow_mut().sparse(on);
        self.in_timed_loop.set(on);
        let blame = match on {
            true => Some(self.watchdog.borrow().blamer()?),
            false => None,
        };
        *self.stuck.borrow_mut() = blame.map(|blame| {
            let limit = crate::units::human_duration(self.watchdog.borrow().timeout());
            crate::deadline::standby(format!(
                "error: rank {}: an NCCL call of the timed loop, on its blocking communicator, did not return in \
                 {limit} (--timeout), and this process ends here: NCCL blocked inside it (a blocking communicator \
                 connects to a peer in the caller's thread, at the first call that involves it: is one gone?)",
                self.rank
            ))
            .blaming(blame)
        });
        Ok(())
    }

    /// Makes the blocking communicator of timed loops: `ncclCommSplit` of this one, every
    /// rank in it (color 0, key = rank: the same ranks, in the same order).
    fn split_timed(&self) -> Result<()> {
        let said = (
            "making the timed loop's blocking communicator",
            "the same ranks, blocking, for timed loops as nccl-tests times them (a job of the non-blocking one: polled)",
        );
        // SAFETY: `timed_slot` lives as long as `self` (NCCL writes it when the split is
        // complete, or never once the parent is aborted).
        unsafe { self.split_into(0, self.rank() as c_int, true, self.timed_slot.as_ptr(), said)? };
        let timed = self.timed_slot.get();
        if timed.is_null() {
            return Err(anyhow!(
                "rank {}: ncclCommSplit said success but gave no communicator",
                self.rank
            ));
        }
        self.timed.set(timed);
        Ok(())
    }

    /// `ncclCommSplit` of this communicator into `slot` (`color`, `key`, a `blocking` child
    /// or not), shown with `said` (what it is for, and the note), and polled until the
    /// parent says the split is complete.
    ///
    /// # Safety
    /// `slot` must stay valid until then, or for as long as NCCL's helper thread may still
    /// write it after a failure (the caller leaks it, or it lives as long as `self`).
    unsafe fn split_into(
        &self,
        color: c_int,
        key: c_int,
        blocking: bool,
        slot: *mut sys::ncclComm_t,
        (why, note): (&'static str, &str),
    ) -> Result<()> {
        let parent = self.live("ncclCommSplit")?;
        let mut config = config(blocking);
        // SAFETY: a live communicator; `slot` as the caller promises; the config is read
        // during the call.
        let r = unsafe { sys::ncclCommSplit(parent, color, key, slot, &mut config) };
        let shown_color = match color {
            NOCOLOR => "NCCL_SPLIT_NOCOLOR".to_string(),
            c => c.to_string(),
        };
        let call = Call::new(why, "ncclCommSplit")
            .ptr("comm", parent)
            .arg("color", shown_color)
            .arg("key", key)
            .ptr("newcomm", slot)
            .arg(
                "config",
                format!("{{size={CONFIG_SIZE}, blocking={}}}", u8::from(blocking)),
            );
        self.shown.show(&call, Some(&r), note);
        // On a non-blocking parent, ncclCommSplit says ncclSuccess while its job runs on:
        // NCCL drops its group's ncclInProgress (`NCCLCHECK(ncclGroupEndInternal())` in
        // init.cc, 2.18 to 2.30; seen on an H200 with NCCL 2.28.3 and 2.28.9). The parent
        // says ncclInProgress until the new communicator is written, so it is polled, as
        // PyTorch does (NVIDIA/nccl issue 1472), whatever the call said.
        let r = match r {
            ncclResult_t::ncclSuccess => ncclResult_t::ncclInProgress,
            other => other,
        };
        self.called(r, call.label())
    }

    /// Ends the timed loops' communicator, if there is one: finalize, then destroy, each
    /// under the deadline (it is blocking: the calls return when done).
    fn close_timed(&self) -> Result<()> {
        let timed = self.timed.replace(std::ptr::null_mut());
        if timed.is_null() {
            return Ok(());
        }
        let limit = self.watchdog.borrow().timeout();
        type End = unsafe fn(sys::ncclComm_t) -> ncclResult_t;
        let steps: [(&str, End, &str); 2] = [
            (
                "ncclCommFinalize",
                sys::ncclCommFinalize,
                "finishes what is queued: blocking, it returns when done",
            ),
            ("ncclCommDestroy", sys::ncclCommDestroy, ""),
        ];
        for (function, end, note) in steps {
            let _deadline = crate::deadline::arm(
                limit,
                format!(
                    "error: rank {}: {function} of the timed loops' blocking communicator did not return in {} \
                     (--timeout); this process ends here, without cleaning up",
                    self.rank,
                    crate::units::human_duration(limit)
                ),
            );
            // SAFETY: the timed communicator, live (not yet destroyed); finalized before
            // it is destroyed, and not used after.
            let r = unsafe { end(timed) };
            self.shown
                .show(&Call::new("", function).ptr("comm", timed), Some(&r), note);
            if r != ncclResult_t::ncclSuccess {
                return Err(self.error(r, format!("ending the timed loops' communicator ({function})")));
            }
        }
        Ok(())
    }

    /// Waits until every operation queued on this rank's stream has finished.
    pub fn synchronize(&self) -> Result<()> {
        let since = Instant::now();
        let done = self.wait_idle();
        self.waited.set(self.waited.get() + since.elapsed());
        done
    }

    /// The time this rank spent waiting for its GPU so far ([`Nccl::synchronize`]).
    pub fn waited(&self) -> Duration {
        self.waited.get()
    }

    fn wait_idle(&self) -> Result<()> {
        let waited_for = |s: &Self| s.progress.borrow().waited_for(&s.last.borrow());
        let poll = Poll {
            call: Call::new("", "cuStreamQuery").ptr("hStream", self.stream.cu_stream()),
            done: &CUDA_SUCCESS,
            until: format!("until the GPU had finished {}", self.last.borrow()),
        };
        self.wait(
            |s| format!("the GPU to finish {}", waited_for(s)),
            poll,
            |s| s.stream_idle(),
        )?;
        self.progress.borrow_mut().all_done();
        Ok(())
    }

    /// Runs one NCCL call (`f`, given the communicator and the stream) and deals with
    /// its result; `call` names it and its arguments, for messages and `--show-calls`.
    pub fn call(&self, call: Call, f: impl FnOnce(sys::ncclComm_t, sys::cudaStream_t) -> ncclResult_t) -> Result<()> {
        let what = call.label();
        let comm = self.active(&what)?;
        let stream = self.stream.cu_stream() as sys::cudaStream_t;
        // A `call` span on this rank's track of --trace, and an NVTX range for Nsight.
        let span = crate::record::span(call.function(), call.moved());
        let range = crate::nvtx::range(call.function());
        let r = self.under_deadline(|| f(comm, stream));
        drop((range, span));
        let bytes = call.moved() as usize;
        if let Some(function) = collective_name(call.function()) {
            self.last_collective.set(Some((function, bytes as u64)));
            let n = self.collectives.get() + 1;
            self.collectives.set(n);
            if n.is_multiple_of(LOG_EVERY) {
                crate::nccl_log::update();
            }
        }
        let call = call.ptr("comm", comm).ptr("stream", stream);
        self.shown.show(&call, Some(&r), "");
        self.called(r, &what)?;
        // Inside a group, nothing reaches the stream before the group's end (NCCL's
        // `ncclEnqueueCheck` only adds the call to the group's tasks): an event now would
        // complete at once, before the group's kernel exists. The group's end records one.
        if self.groups.get() > 0 {
            self.grouped.borrow_mut().push((what.clone(), bytes));
            self.last.replace(what);
            return Ok(());
        }
        self.queued(what, bytes, 1)
    }

    /// `ops` NCCL operations (`what`, moving `bytes`) were just queued on the stream: an
    /// event after them, so that waits can tell progress from a hang, and a wait when
    /// [`MAX_QUEUED`] operations are in flight.
    fn queued(&self, what: Label, bytes: usize, ops: usize) -> Result<()> {
        let (event, queued) = {
            let mut p = self.progress.borrow_mut();
            let event = p
                .queued(&what, bytes, ops, &self.stream)
                .with_context(|| format!("rank {}: marking the stream's progress", self.rank))?;
            (event, p.len())
        };
        if let Some(event) = event {
            self.show_cuda(
                Call::new("", "cuEventRecord").ptr("hEvent", event),
                "after it: a wait counts the GPU's progress by these (cuEventQuery)",
            );
        }
        self.last.replace(what);
        if queued >= MAX_QUEUED {
            self.synchronize()?;
        }
        Ok(())
    }

    /// What an NCCL call returned: success; in progress (a non-blocking communicator is
    /// still queueing it: wait until NCCL says it is done); or an error, which aborts.
    fn called(&self, r: ncclResult_t, what: impl std::fmt::Display) -> Result<()> {
        match r {
            ncclResult_t::ncclSuccess => Ok(()),
            ncclResult_t::ncclInProgress => {
                let poll = Poll {
                    call: Call::new("", "ncclCommGetAsyncError")
                        .ptr("comm", self.comm.get())
                        .arg("asyncError", "→ncclSuccess"),
                    done: &ncclResult_t::ncclSuccess,
                    until: "until NCCL was done with the call".into(),
                };
                self.wait(
                    |_| format!("NCCL to finish {what}"),
                    poll,
                    |s| Ok(s.async_state()? == ncclResult_t::ncclSuccess),
                )
            }
            error => {
                // A peer that died makes NCCL fail here too (a blocking communicator's
                // call): name it, as a wait does.
                let what = what.to_string();
                let e = self.error(error, &what);
                let from_peers = matches!(
                    error,
                    ncclResult_t::ncclRemoteError | ncclResult_t::ncclSystemError | ncclResult_t::ncclInternalError
                );
                let e = match self.watchdog.try_borrow_mut() {
                    Ok(mut dog) if from_peers => dog.name_the_lost(e, &format!("NCCL to finish {what}"), LOST_GRACE),
                    _ => e,
                };
                self.abort(Some(&e));
                Err(e)
            }
        }
    }

    /// Polls `ready` until it says yes, watching all the while: NCCL's own errors, lost
    /// ranks, silent ranks and the deadline end the wait, and abort the communicator.
    /// The deadline counts from the last progress: each time an operation of the queue is
    /// seen finished ([`Progress`]), the clock starts again, and `what` (what is waited
    /// for) is asked again. `poll` is the call `ready` makes, shown once the wait is over.
    fn wait(
        &self,
        what: impl Fn(&Self) -> String,
        poll: Poll,
        mut ready: impl FnMut(&Self) -> Result<bool>,
    ) -> Result<()> {
        let since = Instant::now();
        let mut progressed = since;
        let mut waited_for = what(self);
        let mut dog = self.watchdog.borrow_mut();
        dog.reset();
        let mut pause = Duration::ZERO;
        let mut polls = 0u64;
        loop {
            polls += 1;
            let turn = ready(self).and_then(|done| {
                if !done {
                    if self.progress.borrow_mut().advance()? {
                        progressed = Instant::now();
                        waited_for = what(self);
                        dog.reset();
                    }
                    self.async_state()?;
                    dog.check(since, progressed, &waited_for)?;
                } else {
                    // A call that failed leaves nothing running: the stream is idle at
                    // once, and only the communicator's error says that it failed.
                    self.async_state()?;
                }
                Ok(done)
            });
            match turn {
                Ok(true) => {
                    let times = match polls {
                        1 => "once".to_string(),
                        n => format!("{n} times in {} µs", since.elapsed().as_micros()),
                    };
                    self.shown
                        .show(&poll.call, Some(poll.done), &format!("polled {times}, {}", poll.until));
                    return Ok(());
                }
                Ok(false) => {}
                Err(e) => {
                    // NCCL's own error (a peer's socket closed) often comes before the
                    // store's word that the peer died: ask the store, briefly, who.
                    let e = match e.downcast_ref::<crate::error::Culprit>() {
                        None => dog.name_the_lost(e, &waited_for, LOST_GRACE),
                        Some(_) => e,
                    };
                    let e = e.context(format!("rank {}", self.rank));
                    self.abort(Some(&e));
                    return Err(e);
                }
            }
            // In a timed loop, poll as nccl-tests' testStreamSynchronize does, yielding the
            // core between looks: a sleep would add up to its length to the time measured.
            // Elsewhere, spin a little (small collectives finish in microseconds), then
            // sleep longer and longer, up to a millisecond: a rank that waits long costs no CPU.
            if self.in_timed_loop.get() {
                std::thread::yield_now();
            } else if pause.is_zero() && since.elapsed() < Duration::from_micros(200) {
                std::hint::spin_loop();
            } else {
                pause = (pause * 2).clamp(Duration::from_micros(20), Duration::from_millis(1));
                std::thread::sleep(pause);
            }
        }
    }

    /// Shows a CUDA call cudarc made and succeeded in (it returns an error otherwise).
    fn show_cuda(&self, call: Call, note: &str) {
        let call = call.ptr("hStream", self.stream.cu_stream());
        self.shown.show(&call, Some(&CUDA_SUCCESS), note);
    }

    /// Shows the allocation cudarc made of `bytes` at `at`: from the stream's memory pool
    /// when the GPU has one (`cuMemAllocAsync`), else `cuMemAlloc`.
    fn show_alloc(&self, at: u64, bytes: usize, note: &str) {
        let dptr = format!("→{at:#x}");
        match self.stream.context().has_async_alloc() {
            true => self.show_cuda(
                Call::new("", "cuMemAllocAsync")
                    .arg("dptr", dptr)
                    .arg("bytesize", bytes),
                note,
            ),
            false => self.shown.show(
                &Call::new("", "cuMemAlloc_v2").arg("dptr", dptr).arg("bytesize", bytes),
                Some(&CUDA_SUCCESS),
                note,
            ),
        }
    }

    /// Whether the GPU has finished everything queued on the stream (`cuStreamQuery`).
    fn stream_idle(&self) -> Result<bool> {
        use cudarc::driver::sys::cudaError_enum as Cu;
        // SAFETY: the stream belongs to this rank's context, current on this thread.
        match unsafe { cudarc::driver::sys::cuStreamQuery(self.stream.cu_stream()) } {
            Cu::CUDA_SUCCESS => Ok(true),
            Cu::CUDA_ERROR_NOT_READY => Ok(false),
            e => Err(anyhow!("the GPU failed while running {}: {e:?}", self.last.borrow())),
        }
    }

    /// NCCL's asynchronous state (`ncclCommGetAsyncError`): success or in progress, or an
    /// error reported after the call that caused it (a peer lost, a network failure).
    fn async_state(&self) -> Result<ncclResult_t> {
        let comm = self.active("ncclCommGetAsyncError")?;
        let mut state = ncclResult_t::ncclSuccess;
        // SAFETY: a live communicator and a valid place for the answer.
        let r = unsafe { sys::ncclCommGetAsyncError(comm, &mut state) };
        if r != ncclResult_t::ncclSuccess {
            return Err(self.error(r, "asking NCCL for its state (ncclCommGetAsyncError)"));
        }
        match state {
            ncclResult_t::ncclSuccess | ncclResult_t::ncclInProgress => Ok(state),
            error => Err(self.error(error, self.last.borrow())),
        }
    }

    /// The communicator calls go to now: the timed loops' blocking one inside a timed
    /// loop, else the first one; an error if it was already left.
    fn active(&self, what: impl std::fmt::Display) -> Result<sys::ncclComm_t> {
        let comm = self.live(what)?;
        match self.in_timed_loop.get() && !self.timed.get().is_null() {
            true => Ok(self.timed.get()),
            false => Ok(comm),
        }
    }

    /// The communicator, or an error if it was already left.
    fn live(&self, what: impl std::fmt::Display) -> Result<sys::ncclComm_t> {
        let comm = self.comm.get();
        if comm.is_null() {
            return Err(anyhow!(
                "rank {}: {what} after the communicator was ended (aborted after a failure, or closed)",
                self.rank
            ));
        }
        Ok(comm)
    }

    /// Aborts the communicator (stops its kernels, frees it), if it is still there.
    ///
    /// A group left open (a call inside it failed) is closed first: from NCCL 2.22,
    /// `ncclCommAbort` runs through the group machinery, so inside an open group it would
    /// only be queued into it, and a group with a failed call drops what is queued at its
    /// end: the communicator would never be freed.
    ///
    /// The abort has a deadline of its own ([`ABORT_DEADLINE`]): NCCL's abort waits for the
    /// node's other ranks, and may never return when one of them is stopped or dead
    /// (NCCL's issues #863, #1013, #1777); over the network it hung too, on a GPU, with a
    /// peer killed and every rank alone on its node (`docs/gpu-runs.md`, run 10). Past it, the process says `failure` (what
    /// made it abort) and that the abort did not return, in one line, and ends at once.
    fn abort(&self, failure: Option<&anyhow::Error>) {
        self.stuck.borrow_mut().take();
        self.grouped.borrow_mut().clear();
        let rank = self.rank;
        let said = match failure {
            Some(e) => format!("{}; then", crate::error::line(Some(rank), e)),
            None => format!("error: rank {rank}: ending with its NCCL communicator open:"),
        };
        // Each step that may wait for peers gets a deadline of its own, armed before it.
        let deadline = |what: &str| {
            crate::deadline::arm(
                ABORT_DEADLINE,
                format!(
                    "{said} {what} did not return in {}: it can wait for peers, and hang when one of \
                     them is stopped or gone (NCCL issues #1013, #1777); this process ends here, without \
                     cleaning up",
                    crate::units::human_duration(ABORT_DEADLINE)
                ),
            )
        };
        if self.groups.get() > 0 {
            // A blocking communicator's group end launches in this thread and may wait for
            // a peer that never comes (see `group_end`).
            let _deadline = deadline("closing the open group (ncclGroupEnd) before NCCL's abort");
            while self.groups.get() > 0 {
                self.groups.set(self.groups.get() - 1);
                // SAFETY: no arguments; ends a group this thread opened. Its error is the
                // failure being reported already.
                let r = unsafe { sys::ncclGroupEnd() };
                self.shown.show(
                    &Call::new("", "ncclGroupEnd"),
                    Some(&r),
                    "closing the open group before the abort (NCCL 2.22+ would queue the abort into it)",
                );
            }
        }
        let timed = self.timed.replace(std::ptr::null_mut());
        let comm = self.comm.replace(std::ptr::null_mut());
        if comm.is_null() {
            return;
        }
        for c in [timed, comm].into_iter().filter(|c| !c.is_null()) {
            let _deadline = deadline("NCCL's abort (ncclCommAbort)");
            // SAFETY: a live communicator, not used again (the cells are null now).
            let r = unsafe { sys::ncclCommAbort(c) };
            let call = Call::new("", "ncclCommAbort").ptr("comm", c);
            self.shown
                .show(&call, Some(&r), "after a failure: stops this rank's kernels");
        }
    }

    /// An NCCL failure as a person needs it: which rank, doing what, NCCL's result code
    /// and NCCL's own last error text.
    fn error(&self, r: ncclResult_t, what: impl std::fmt::Display) -> anyhow::Error {
        let text = last_error_text(self.comm.get());
        let text = if text.is_empty() {
            String::new()
        } else {
            format!(": {text}")
        };
        // 8 is ncclNumResults in the 2.24 bindings cudarc uses, ncclTimeout in NCCL 2.30.
        let code = match r {
            ncclResult_t::ncclNumResults => "result code 8 (ncclTimeout in NCCL 2.30)".to_string(),
            r => format!("{r:?}"),
        };
        anyhow!("rank {}: NCCL failed in {what} with {code}{text}", self.rank)
    }
}

impl Nccl {
    /// The rank failed (`failure`, outside this communicator's own calls: the store lost,
    /// a check): aborts the communicator now, so that if NCCL's abort hangs, the line
    /// that ends the process says why the rank failed, not only that it ended with its
    /// communicator open.
    pub fn abandon(&self, failure: &anyhow::Error) {
        self.abort(Some(failure));
    }
}

/// A rank that fails (or ends without closing) aborts its communicator: NCCL then stops
/// its kernels. Nothing here can panic, unlike cudarc's `Comm`, whose `Drop` panics when
/// the abort fails.
impl Drop for Nccl {
    fn drop(&mut self) {
        self.abort(None);
        self.progress.get_mut().release();
    }
}

/// How many bytes of `ncclConfig_t` NCCL is given: the fields of the layout declared
/// (version 2.17's, as cudarc's bindings declare it), through `splitShare`: 44 bytes,
/// not `size_of` (48, with 4 bytes of padding at the end). NCCL copies `size` bytes over
/// its own defaults, and NCCL 2.26 reads bytes 44..48 as `trafficClass` (the InfiniBand
/// traffic class of every connection) with no version guard: padding handed over would
/// become a setting.
const CONFIG_SIZE: usize = std::mem::offset_of!(sys::ncclConfig_t, splitShare) + size_of::<c_int>();

/// The variables that override a communicator's config in NCCL (`envConfigOverride` in
/// `init.cc`, 2.18.1 to 2.30.7, for every init and split), and why the workbook cannot
/// run under them: it chooses per communicator, and these would choose for all.
const CONFIG_OVERRIDES: [(&str, &str); 2] = [
    (
        "NCCL_COMM_BLOCKING",
        "NCCL would give every communicator of the workbook this blocking mode, over the config it sets: the \
         workbook's own is non-blocking, so that every wait is polled under --timeout (a blocking init or call waits \
         for ever for a peer that is gone), and the timed loops' is blocking, as nccl-tests times (non-blocking, NCCL \
         2.23 and later start a thread for every call)",
    ),
    (
        "NCCL_COMM_SPLIT_SHARE_RESOURCES",
        "NCCL would make the communicators the workbook splits (the timed loops', the benchmark's per sweep, lesson \
         09's) share their parent's resources, which it leaves separate (shared, a child's abort or error reaches its \
         parent: NVIDIA/nccl issue 2430)",
    ),
];

/// `NCCL_COMM_BLOCKING` and `NCCL_COMM_SPLIT_SHARE_RESOURCES` (read with `var`, as
/// [`crate::nccl_env::param`] reads them: the environment, then NCCL's files) set to a
/// value NCCL would apply: one line saying so and what to do. NCCL reads them as
/// `NCCL_PARAM` does: an empty value is unset; `NCCL_COMM_BLOCKING` applies when it is 0
/// or 1, `NCCL_COMM_SPLIT_SHARE_RESOURCES` whatever its value. They are refused rather
/// than unset behind the user's back: whoever set them meant them for something.
pub fn check_config_env(var: &dyn Fn(&str) -> Option<String>) -> Result<(), String> {
    for (name, why) in CONFIG_OVERRIDES {
        let Some(value) = var(name).filter(|v| !v.trim().is_empty()) else {
            continue;
        };
        let applies = match name {
            // 0 and 1 apply; NCCL ignores any other value (and one that overflows).
            "NCCL_COMM_BLOCKING" => matches!(crate::nccl_env::strtoll(&value), Some(0 | 1)),
            _ => true,
        };
        if applies {
            return Err(format!(
                "{name}={value} is set: {why}; run without it (env -u {name} ..., or out of NCCL_CONF_FILE, \
                 ~/.nccl.conf or /etc/nccl.conf, where NCCL also reads it)"
            ));
        }
    }
    Ok(())
}

/// NCCL's configuration for a communicator: `NCCL_CONFIG_INITIALIZER` of the 2.17 layout
/// (what cudarc's bindings declare; NCCL reads the fields of that version and defaults
/// the rest) with `blocking` set. Zeroed first, and only [`CONFIG_SIZE`] bytes given.
fn config(blocking: bool) -> sys::ncclConfig_t {
    const UNDEF: c_int = i32::MIN; // NCCL_CONFIG_UNDEF_INT: "NCCL decides"
    // SAFETY: ncclConfig_t is plain data (integers and a pointer): all zeros is a value.
    let mut c: sys::ncclConfig_t = unsafe { std::mem::zeroed() };
    c.size = CONFIG_SIZE;
    c.magic = 0xcafe_beef;
    c.version = 21700;
    c.blocking = c_int::from(blocking);
    c.cgaClusterSize = UNDEF;
    c.minCTAs = UNDEF;
    c.maxCTAs = UNDEF;
    c.netName = std::ptr::null();
    c.splitShare = UNDEF;
    c
}

/// The call a wait polls, for `--show-calls`: what it returns once ready, and what the
/// wait was for.
struct Poll {
    call: Call,
    done: &'static dyn std::fmt::Debug,
    until: String,
}

/// The CUDA driver's success, as `--show-calls` prints a call's result.
const CUDA_SUCCESS: cudarc::driver::sys::cudaError_enum = cudarc::driver::sys::cudaError_enum::CUDA_SUCCESS;

/// What a wait names a group by, once it is queued: its calls by kind ("the group of 4
/// calls (2 ncclSend, 2 ncclRecv)").
fn group_label(calls: &[(Label, usize)]) -> Label {
    let mut kinds: Vec<(&'static str, usize)> = Vec::new();
    for (label, _) in calls {
        match kinds.iter_mut().find(|(f, _)| *f == label.function()) {
            Some((_, n)) => *n += 1,
            None => kinds.push((label.function(), 1)),
        }
    }
    let kinds: Vec<String> = kinds.iter().map(|(f, n)| format!("{n} {f}")).collect();
    Label::of(format!(
        "the group of {} calls ({}) queued by {GROUP_END}",
        calls.len(),
        kinds.join(", ")
    ))
}

/// How a group's label ends: what the watchdog looks for to say a group is waited for.
pub const GROUP_END: &str = "ncclGroupEnd";

/// NCCL's unique id as `--show-calls` shows it: its size and first bytes.
fn id_bytes(bytes: &[u8]) -> String {
    let first: Vec<String> = bytes.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("{{{} bytes: {} …}}", bytes.len(), first.join(" "))
}

/// NCCL's own text for the last error (`ncclGetLastError`).
fn last_error_text(comm: sys::ncclComm_t) -> String {
    // SAFETY: the library is loaded (we are reporting its error); a null communicator is allowed.
    let p = unsafe { sys::ncclGetLastError(comm) };
    if p.is_null() {
        return String::new();
    }
    // SAFETY: NCCL returns a NUL-terminated string it owns.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().trim().to_string()
}

/// A collective's name as NCCL's lines print it (`ncclAllReduce` → `AllReduce`); `None`
/// for what is not a collective NCCL plans (sends, receives, groups).
fn collective_name(function: &'static str) -> Option<&'static str> {
    match function {
        "ncclAllReduce" | "ncclBroadcast" | "ncclReduce" | "ncclAllGather" | "ncclReduceScatter" => {
            function.strip_prefix("nccl")
        }
        _ => None,
    }
}

/// A CUDA driver error in words, `out of memory (CUDA_ERROR_OUT_OF_MEMORY)`, instead of
/// cudarc's debug form; running out of GPU memory says what to do about it.
pub fn cuda_error(e: cudarc::driver::DriverError) -> anyhow::Error {
    use cudarc::driver::sys::CUresult;
    let words = e
        .error_string()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "an error cuGetErrorString does not name".into());
    // On a GPU node the other tenant is the usual cause (nvidia-smi shows it); simulated
    // GPUs keep their memory in the host's, where the usual cause is `ulimit -v`.
    let hint = match (e.0, crate::simulate::gpus()) {
        (CUresult::CUDA_ERROR_OUT_OF_MEMORY, None) => {
            ": the GPU has no room for the buffer (ask for less, or leave the GPU to this job: nvidia-smi \
             shows what else holds its memory)"
        }
        (CUresult::CUDA_ERROR_OUT_OF_MEMORY, Some(_)) => {
            ": the simulated GPU has no room for the buffer (simulated GPUs keep theirs in the host's memory: \
             ask for less, or raise ulimit -v)"
        }
        _ => "",
    };
    anyhow!("{words} ({:?}){hint}", e.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variables_that_override_the_config_are_refused_where_nccl_applies_them() {
        let check = |name: &'static str, value: &'static str| {
            check_config_env(&move |n| (n == name).then(|| value.to_string()))
        };
        for v in ["1", "0", " 1", "1x", "+1", "01"] {
            let said = check("NCCL_COMM_BLOCKING", v).unwrap_err();
            assert!(said.starts_with(&format!("NCCL_COMM_BLOCKING={v} is set: ")), "{said}");
        }
        // strtoll: no digits is 0, "0x1" is 1, "010" is 8.
        for v in ["yes", "0x1", "-0"] {
            assert!(check("NCCL_COMM_BLOCKING", v).is_err(), "{v}");
        }
        // NCCL ignores a blocking value other than 0 and 1, and an empty one.
        for v in ["", "2", "-1", "010", "99999999999999999999"] {
            assert_eq!(check("NCCL_COMM_BLOCKING", v), Ok(()), "{v}");
        }
        assert!(check("NCCL_COMM_SPLIT_SHARE_RESOURCES", "0").is_err());
        assert_eq!(check("NCCL_COMM_SPLIT_SHARE_RESOURCES", ""), Ok(()));
    }

    #[test]
    fn the_config_is_nccls_initializer_made_non_blocking_and_gives_its_fields_only() {
        let c = config(false);
        assert_eq!((c.magic, c.blocking, c.version), (0xcafe_beef, 0, 21700));
        // The 2.17 layout's fields end with splitShare at 40..44; the 4 bytes after are
        // padding that NCCL 2.26 would read as trafficClass.
        assert_eq!((c.size, size_of::<sys::ncclConfig_t>()), (44, 48));
    }
}
