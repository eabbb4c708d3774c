//! A test double for the CUDA driver (`libcuda.so`) and NCCL (`libnccl.so`), on host
//! memory, used only by the workbook's tests.
//!
//! No machine of this project has a GPU, yet the NCCL path must not be code that nobody
//! ran. The tests put a folder first on `LD_LIBRARY_PATH` in which this one library is
//! linked under the names cudarc loads (`libcuda.so`, `libcuda.so.1`, `libnccl.so`,
//! `libnccl.so.2`; symlinks to one file, so that glibc maps it once and the NCCL half
//! sees the CUDA half's contexts and allocations). Programs then run through cudarc's
//! real dynamic-loading path, as real processes: device memory is host memory
//! ([`memory`]), and ranks meet through files in `/dev/shm` ([`exchange`]), so the
//! collectives really work across processes.
//!
//! It behaves as the real driver and NCCL do on one node, where a program can see it:
//! - devices ([`devices`]): `NCCL_DOUBLE_DEVICES` physical GPUs with PCI bus ids and
//!   per-host UUIDs, of which the process sees those `CUDA_VISIBLE_DEVICES` lists;
//! - asynchrony ([`stream`], [`nccl`]): a collective or send/recv checks its arguments,
//!   queues its work on the CUDA stream and returns; a worker thread per communicator
//!   does the work; the stream is busy (`cuStreamQuery` says not ready) until it is done;
//! - no deadline: if a peer never makes its matching call (it never came, exited, was
//!   killed or stopped), the stream stays busy for ever and nothing fails by itself,
//!   until the program calls `ncclCommAbort`;
//! - errors found after the call (ranks disagreeing) are the communicator's asynchronous
//!   error (`ncclCommGetAsyncError`); non-blocking communicators (`ncclCommInitRankConfig`
//!   with `blocking = 0`) return `ncclInProgress`.
//!
//! It enforces rules that the real libraries either enforce or silently get wrong, each
//! with an error that says what was broken ([`nccl`] lists them). Every failure prints one
//! line `nccl-double WARN rank R: <reason>` on stderr, which is also what
//! `ncclGetLastError` returns.
//!
//! Collectives: all-reduce, broadcast, reduce, all-gather, reduce-scatter, and grouped
//! send/recv (all-to-all), for int8 to float64, float16 and bfloat16 (reduced in f32,
//! rounded to nearest even), with sum, prod, max, min and avg.
//!
//! Limits: no GPU code runs (collectives are done by host threads, through files; the one
//! kernel it knows, the workbook's `workbook_spin`, is played by keeping its stream busy);
//! no fp8 types, no `PreMulSum`.
//!
//! Safety catch: unless `NCCL_DOUBLE=1` is set, it refuses to act (cuInit says there is
//! no device), so it can never stand in for a real GPU by accident.

#![allow(clippy::missing_safety_doc)]

mod devices;
mod driver;
mod exchange;
mod memory;
mod nccl;
mod reduce;
mod result;
mod stream;
mod teardown;
mod version;

use std::collections::BTreeSet;
use std::ffi::{CString, c_char, c_int};
use std::io::Write;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Mutex, OnceLock};

/// Whether this process may use the double (`NCCL_DOUBLE=1`); says once why not.
pub(crate) fn allowed() -> bool {
    static ALLOWED: OnceLock<bool> = OnceLock::new();
    *ALLOWED.get_or_init(|| {
        let ok = std::env::var("NCCL_DOUBLE").is_ok_and(|v| v == "1");
        if !ok {
            let why =
                "nccl-double: refusing to act as CUDA/NCCL: NCCL_DOUBLE=1 is not set (this library is a test double)";
            say(why);
            remember(why);
        }
        ok
    })
}

/// Prints `line` on stderr in one write, so lines of several ranks never interleave.
pub(crate) fn say(line: &str) {
    let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
}

/// The text `ncclGetLastError` returns: the last failure of this thread, or else of the
/// process. The strings are leaked on purpose: a pointer handed out stays valid forever
/// (failures are few, and this is a test double).
static LAST_ERROR: AtomicPtr<c_char> = AtomicPtr::new(std::ptr::null_mut());
thread_local! {
    static THREAD_LAST_ERROR: std::cell::Cell<*mut c_char> = const { std::cell::Cell::new(std::ptr::null_mut()) };
}

/// Reports a failure: one WARN line on stderr (as `NCCL_DEBUG=WARN` would print), kept
/// as the last error.
pub(crate) fn warn(rank: Option<usize>, why: &str) {
    let who = rank.map(|r| format!(" rank {r}")).unwrap_or_default();
    say(&format!("nccl-double WARN{who}: {why}"));
    remember(why);
}

/// Keeps `why` as the last error, for `ncclGetLastError`.
pub(crate) fn remember(why: &str) {
    let text = CString::new(why.replace('\0', " ")).unwrap_or_default().into_raw();
    LAST_ERROR.store(text, Ordering::Release);
    THREAD_LAST_ERROR.with(|t| t.set(text));
}

/// The last failure's text (empty if none), for `ncclGetLastError`.
pub(crate) fn last_error() -> *const c_char {
    let mine = THREAD_LAST_ERROR.with(|t| t.get());
    let text = if mine.is_null() {
        LAST_ERROR.load(Ordering::Acquire)
    } else {
        mine
    };
    if text.is_null() { c"".as_ptr() } else { text }
}

/// Runs an exported function's body: records the call for `NCCL_DOUBLE_TRACE`, and turns
/// a panic into `on_panic` (a panic must never unwind into C).
pub(crate) fn entry<R: Copy>(name: &'static str, on_panic: R, body: impl FnOnce() -> R) -> R {
    trace(name);
    stop_if_asked(name);
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(r) => r,
        Err(p) => {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            warn(None, &format!("{name} panicked (a bug in the double): {what}"));
            on_panic
        }
    }
}

/// The value of `var`, `<function>:<n>` (`ncclRecv:2`: the second call of `ncclRecv`), as
/// a function's name and a call's number; `None` if unset, or not of that form (said once).
pub(crate) fn nth_call(var: &str) -> Option<(String, u64)> {
    let v = std::env::var(var).ok()?;
    let parsed = v
        .split_once(':')
        .and_then(|(f, n)| Some((f.to_string(), n.trim().parse().ok()?)));
    if parsed.is_none() {
        warn(None, &format!("{var}={v:?} is not <function>:<n>: ignored"));
    }
    parsed
}

/// With `NCCL_DOUBLE_STOP=<function>:<n>` (`ncclGroupEnd:2`), the process stops itself
/// (SIGSTOP) at the start of the n-th call of that function, as a rank frozen by a
/// debugger or a stalled node would stop: how the tests freeze a rank at an exact point
/// (a signal from outside lands wherever the rank happens to be).
fn stop_if_asked(name: &str) {
    static SPEC: OnceLock<Option<(String, u64)>> = OnceLock::new();
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let spec = SPEC.get_or_init(|| nth_call("NCCL_DOUBLE_STOP"));
    let Some((function, n)) = spec else { return };
    if function == name && CALLS.fetch_add(1, Ordering::Relaxed) + 1 == *n {
        unsafe extern "C" {
            fn raise(sig: c_int) -> c_int;
        }
        const SIGSTOP: c_int = 19;
        // SAFETY: raise(3) with a valid signal number; SIGSTOP cannot be caught, and the
        // process goes on from here when it gets SIGCONT.
        unsafe { raise(SIGSTOP) };
    }
}

/// With `NCCL_DOUBLE_TRACE=<file>`, appends the name of each entry point the first time
/// this process calls it: how the tests learn which symbols cudarc really uses.
fn trace(name: &'static str) {
    static FILE: OnceLock<Option<String>> = OnceLock::new();
    static SEEN: Mutex<BTreeSet<&'static str>> = Mutex::new(BTreeSet::new());
    let Some(file) = FILE.get_or_init(|| std::env::var("NCCL_DOUBLE_TRACE").ok()) else {
        return;
    };
    if SEEN.lock().unwrap_or_else(|p| p.into_inner()).insert(name) {
        let _ = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(file)
            .and_then(|mut f| f.write_all(format!("{name}\n").as_bytes()));
    }
}

/// Runs `f` when the process exits through `exit` (`atexit`; `_exit` skips it): the
/// double's reports at exit. `f` must only read the double's own state and write files.
pub(crate) fn at_exit(f: extern "C" fn()) {
    unsafe extern "C" {
        fn atexit(f: extern "C" fn()) -> std::ffi::c_int;
    }
    // SAFETY: registers a plain function of this library, which stays mapped until the
    // process ends (it is never unloaded: cudarc keeps it open).
    unsafe { atexit(f) };
}

/// A setting from the environment, or `default` (with a warning if it does not parse).
pub(crate) fn env_number(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Err(_) => default,
        Ok(v) => v.trim().parse().unwrap_or_else(|_| {
            warn(None, &format!("{name}={v:?} is not a number: using {default}"));
            default
        }),
    }
}
