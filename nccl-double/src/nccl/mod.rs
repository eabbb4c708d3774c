//! The NCCL half: unique ids, communicators, every collective (`ncclAllReduce`,
//! `ncclBroadcast`, `ncclReduce`, `ncclAllGather`, `ncclReduceScatter`) and grouped
//! send/recv (all-to-all among them) across processes (and threads), meeting through
//! [`crate::exchange`]. Types: int8 to float64, float16 and bfloat16 ([`crate::reduce`]).
//!
//! As with real NCCL on one node, work is asynchronous:
//! - a call checks its arguments at once (the errors of rules 1, 2, 5 and 6 below are
//!   returned by the call), then queues the work on its CUDA stream and returns: the
//!   stream is busy ([`crate::stream`]) until the work is done;
//! - each communicator has a worker thread, started at init, that does its queued work
//!   in issue order: a collective publishes this rank's call and data, waits for every
//!   rank's, checks that all made the same call, and computes the result itself; a group
//!   (`ncclGroupStart`/`ncclGroupEnd`) is one unit whose parts all publish before any
//!   completes, so the order of calls inside it does not matter;
//! - a wait for a peer lasts until the peer comes or the communicator is aborted: a rank
//!   that never comes, was killed or is stopped leaves the others' streams busy for ever,
//!   as NCCL's kernels spin; nothing fails by itself. `ncclCommAbort` stops the worker at
//!   once, drops the queued work (the stream becomes idle) and tells nobody.
//!
//! Rules enforced, each with a WARN line saying what was broken:
//! 1. a CUDA context is current on the thread that makes a communicator (its device is the
//!    communicator's) and on every thread that uses it -> `ncclInvalidUsage`;
//! 2. `0 <= rank < nranks`, every rank of an id agreeing on `nranks`, no rank claimed
//!    twice, and every root (`ncclBroadcast`, `ncclReduce`) and peer a rank of the
//!    communicator -> `ncclInvalidArgument` ("ncclReduce: root 3 is not a rank of this
//!    communicator (0..3)");
//! 3. NCCL's own checks when all ranks have joined: no two ranks of one host on one GPU
//!    (the same PCI bus id) -> `ncclInvalidUsage`, "Duplicate GPU detected"; every rank on
//!    the same NCCL version -> `ncclInvalidUsage`, "Mismatched NCCL version detected";
//! 4. every rank calls the same collectives (kind, count, type, op, root) in the same
//!    order, and a matched send and recv have the same count and type -> `ncclInvalidUsage`
//!    on all of them;
//! 5. buffers are live device allocations of the communicator's device, holding every
//!    byte the call uses (recvbuff `nranks * sendcount` elements for all-gather, sendbuff
//!    `nranks * recvcount` for reduce-scatter; a buffer the rank does not use, a
//!    non-root's recvbuff of `ncclReduce` or sendbuff of `ncclBroadcast`, is not checked
//!    and may be NULL) -> `ncclInvalidArgument`;
//! 6. send and receive buffers that overlap are in place as NCCL documents it: all-reduce,
//!    broadcast and reduce when `sendbuff == recvbuff`; all-gather when `sendbuff ==
//!    recvbuff + rank * sendcount * size`; reduce-scatter when `recvbuff == sendbuff +
//!    rank * recvcount * size`. Any other overlap, and inside a group any memory one call
//!    writes that another call of the group reads or writes (an in-place all-to-all), ->
//!    `ncclInvalidArgument`. Real NCCL does not check this: it silently computes garbage.
//!
//! Rules 1, 2, 5 and 6 are checked by the call (synchronous errors). Rules 3 and 4, and a
//! failure published by another rank (`ncclRemoteError`), are found by the worker: they
//! become the communicator's *asynchronous* error, read with `ncclCommGetAsyncError`.
//! A rank that fails either way publishes a failure marker, so the others stop waiting
//! with `ncclRemoteError`; the communicator is then broken (every later call fails) and
//! can only be destroyed or aborted.
//!
//! Modules: [`comm`] makes, ends and watches communicators (and runs their workers);
//! [`calls`] are the collective, point-to-point and group entry points; [`work`] is what
//! a unit of queued work is and how it runs; [`group`] keeps the open group; [`tuning`]
//! reads `NCCL_ALGO` and `NCCL_PROTO` and chooses each collective's algorithm by the
//! double's [`model`]; [`debug`] prints NCCL's `INFO` lines.

mod calls;
mod comm;
mod config;
mod debug;
mod group;
mod model;
mod transport_lines;
mod tuning;
mod work;

use crate::{allowed, entry, warn};
use std::ffi::{CStr, c_char, c_int};
use std::io::Read;
use std::sync::OnceLock;

pub use crate::result::*;

/// `ncclUniqueId`: 128 bytes, passed by value to ncclCommInitRank. The double's ids are
/// `MAGIC`, 16 random bytes, the pid of the process that made it (with the random bytes,
/// the meeting folder's name: `<pid>-<hex>`), then who made it, for humans.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId {
    internal: [u8; 128],
}

/// The first bytes of every id the double makes.
const MAGIC: &[u8; 8] = b"NCCLDBL\x01";

/// A failure outside any communicator: WARN line and last error.
fn fail(code: NcclResult, rank: Option<usize>, why: &str) -> NcclResult {
    warn(rank, why);
    group::failed(code);
    code
}

/// With `NCCL_DOUBLE_FAIL=<function>:<n>` (`ncclRecv:2`), the n-th call of that function
/// in this process fails with `ncclSystemError` (as a network or CUDA failure inside
/// NCCL would): how the tests reach error paths that a correct program never takes.
pub fn injected(function: &str) -> Option<crate::exchange::Failure> {
    static SPEC: OnceLock<Option<(String, u64)>> = OnceLock::new();
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let spec = SPEC.get_or_init(|| crate::nth_call("NCCL_DOUBLE_FAIL"));
    let (name, n) = spec.as_ref()?;
    if name != function {
        return None;
    }
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
    (call == *n).then(|| {
        crate::exchange::Failure::new(
            SYSTEM_ERROR,
            format!("{function}: call {call} fails as NCCL_DOUBLE_FAIL asks (an injected failure)"),
        )
    })
}

/// With `NCCL_DOUBLE_STATS=<file>`, writes at the process's exit what the double counted:
/// `helper_threads=N` (the helper threads started: NCCL 2.23's one per operation of a
/// non-blocking communicator, and splits). Registered when the first communicator is made.
pub fn stats_at_exit() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    extern "C" fn write_stats() {
        if let Some(file) = std::env::var_os("NCCL_DOUBLE_STATS") {
            let n = comm::HELPERS.load(std::sync::atomic::Ordering::Relaxed);
            let _ = std::fs::write(file, format!("helper_threads={n}\n"));
        }
    }
    if std::env::var_os("NCCL_DOUBLE_STATS").is_some() {
        ONCE.call_once(|| crate::at_exit(write_stats));
    }
}

/// The NCCL version code ([`version`](crate::version::version)).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclGetVersion(version_out: *mut c_int) -> NcclResult {
    entry("ncclGetVersion", INTERNAL_ERROR, || {
        if !allowed() {
            return SYSTEM_ERROR;
        }
        if version_out.is_null() {
            return fail(INVALID_ARGUMENT, None, "ncclGetVersion: version is NULL");
        }
        // SAFETY: `version_out` was checked non-null above; it is the caller's out-parameter, writable (the API's contract).
        unsafe { *version_out = crate::version::version() as c_int };
        SUCCESS
    })
}

/// 16 random bytes from the kernel (so two jobs never share a folder).
fn random_bytes() -> [u8; 16] {
    let mut b = [0u8; 16];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .is_err()
    {
        use std::hash::{BuildHasher, Hasher};
        for chunk in b.chunks_mut(8) {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u128(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_nanos(),
            );
            h.write_u32(std::process::id());
            chunk.copy_from_slice(&h.finish().to_ne_bytes());
        }
    }
    b
}

/// A fresh unique id: the name of a new meeting folder.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclGetUniqueId(id: *mut UniqueId) -> NcclResult {
    entry("ncclGetUniqueId", INTERNAL_ERROR, || {
        if !allowed() {
            return SYSTEM_ERROR;
        }
        if id.is_null() {
            return fail(INVALID_ARGUMENT, None, "ncclGetUniqueId: uniqueId is NULL");
        }
        // NCCL logs its bootstrap's network here: its debug file is opened.
        debug::open();
        let mut internal = [0u8; 128];
        internal[..8].copy_from_slice(MAGIC);
        internal[8..24].copy_from_slice(&random_bytes());
        internal[24..28].copy_from_slice(&std::process::id().to_le_bytes());
        let who = format!(
            "nccl-double id by pid {} on {}",
            std::process::id(),
            crate::devices::real_host()
        );
        let n = who.len().min(128 - 32 - 1);
        internal[32..32 + n].copy_from_slice(&who.as_bytes()[..n]);
        // SAFETY: `id` was checked non-null above; it is the caller's out-parameter, writable (the API's contract).
        unsafe { *id = UniqueId { internal } };
        SUCCESS
    })
}

/// NCCL 2.18's texts.
#[unsafe(no_mangle)]
pub extern "C" fn ncclGetErrorString(result: NcclResult) -> *const c_char {
    entry("ncclGetErrorString", c"internal error".as_ptr(), || {
        let s: &'static CStr = match result {
            0 => c"no error",
            1 => c"unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
            2 => c"unhandled system error (run with NCCL_DEBUG=INFO for details)",
            3 => c"internal error - please report this issue to the NCCL developers",
            4 => c"invalid argument (run with NCCL_DEBUG=WARN for details)",
            5 => c"invalid usage (run with NCCL_DEBUG=WARN for details)",
            6 => c"remote process exited or there was a network error",
            7 => c"NCCL operation in progress",
            _ => c"unknown result code",
        };
        s.as_ptr()
    })
}

/// The last failure's text, as NCCL keeps it (the communicator is not used).
#[unsafe(no_mangle)]
pub extern "C" fn ncclGetLastError(_comm: *mut comm::Comm) -> *const c_char {
    entry("ncclGetLastError", c"".as_ptr(), crate::last_error)
}
