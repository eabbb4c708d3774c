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
//!
//! The parts, a file each: the communicator's life, from init and split to close and
//! abort ([`life`]), with the config it is made with ([`config`]); the calls queued on
//! the stream, groups, sends and receives ([`queue`]); the polled waits ([`wait`]); a
//! communication stream of its own, ordered by events ([`streams`]); a layer's
//! computation, the workbook's kernel ([`kernel`]); GPU
//! memory, uploads and downloads ([`memory`], its buffers [`DeviceBuffer`]); NCCL's and
//! CUDA's errors in words ([`errors`]); and NCCL's constants for the workbook's types and
//! operators ([`names`]).

mod config;
mod errors;
mod kernel;
mod life;
mod memory;
mod names;
mod queue;
mod streams;
mod wait;

pub use config::check_config_env;
pub use errors::{NcclResult, cuda_error};
pub use life::NOCOLOR;
pub use memory::DeviceBuffer;
pub use names::NcclName;
pub use queue::GROUP_END;
pub use streams::Issued;

use crate::calls::{Label, Shown};
use crate::device::gpu::Gpu;
use crate::progress::Progress;
use crate::watchdog::Watchdog;
use cudarc::driver::{CudaSlice, CudaStream};
use cudarc::nccl::sys;
use std::cell::{Cell, RefCell};
use std::sync::Arc;
use std::time::Duration;

/// A rank of the NCCL backend: its GPU's context, its stream and its communicator.
pub struct Nccl {
    /// This rank in the world (what messages name), whatever communicator this is.
    rank: usize,
    /// This rank and the number of ranks in this communicator: the world's, or a split one's.
    place: (usize, usize),
    /// The layer's kernel, once loaded ([`Nccl::compute`]); dropped first, while the
    /// context lives.
    spin: RefCell<Option<kernel::Spin>>,
    /// The rank's stream: collectives are queued on it, copies and computation run on it
    /// (it holds the GPU's context).
    stream: Arc<CudaStream>,
    /// The communication stream of `Session::overlap`, while one is open: collectives go
    /// there instead ([`streams`]).
    side: RefCell<Option<Arc<CudaStream>>>,
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
    /// calls leaves out the waits of [`MAX_QUEUED`](queue::MAX_QUEUED)).
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
    /// Collectives queued: NCCL's own lines are read every [`LOG_EVERY`](queue::LOG_EVERY) of them.
    collectives: Cell<u64>,
    /// `NCCL_ALGO` and `NCCL_PROTO` when this communicator started: NCCL read them then
    /// (`ncclTopoTuneModel`), and does not read them again for it.
    started_under: [Option<String>; 2],
}

/// The variables NCCL reads when a communicator starts, in [`Nccl::started_under`]'s order.
const TUNING_VARS: [&str; 2] = ["NCCL_ALGO", "NCCL_PROTO"];

impl Nccl {
    /// The value `name` (`NCCL_ALGO` or `NCCL_PROTO`) had when this communicator started:
    /// the one NCCL tuned it with.
    pub fn started_under(&self, name: &str) -> Option<&str> {
        let i = TUNING_VARS.iter().position(|v| *v == name)?;
        self.started_under[i].as_deref()
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

    /// This rank, in this communicator.
    pub fn rank(&self) -> usize {
        self.place.0
    }

    /// The number of ranks in this communicator.
    pub fn world(&self) -> usize {
        self.place.1
    }
}

/// The CUDA driver's success, as `--show-calls` prints a call's result.
const CUDA_SUCCESS: cudarc::driver::sys::cudaError_enum = cudarc::driver::sys::cudaError_enum::CUDA_SUCCESS;
