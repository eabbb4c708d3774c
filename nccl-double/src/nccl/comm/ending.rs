//! Watching and ending communicators: `ncclCommGetAsyncError`, `ncclCommCount` and
//! `ncclCommUserRank`; `ncclCommFinalize`, `ncclCommDestroy` and `ncclCommAbort` (queued
//! into an open group from NCCL 2.22, and waiting for the node's other ranks, as NCCL's
//! abort does).

use super::{Comm, Shared, State, comms, ensure_ready, live, live_comm, usable};
use crate::exchange::Card;
use crate::nccl::{IN_PROGRESS, INTERNAL_ERROR, INVALID_ARGUMENT, NcclResult, SUCCESS, fail, group};
use crate::{entry, warn};
use std::ffi::c_int;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// `ncclInProgress` while a non-blocking init or finalize is under way, the asynchronous
/// error if there is one, else `ncclSuccess`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommGetAsyncError(comm: *mut Comm, async_error: *mut NcclResult) -> NcclResult {
    entry("ncclCommGetAsyncError", INTERNAL_ERROR, || {
        if async_error.is_null() {
            return fail(INVALID_ARGUMENT, None, "ncclCommGetAsyncError: asyncError is NULL");
        }
        if comm.is_null() || !live(comm) {
            return fail(
                INVALID_ARGUMENT,
                None,
                &format!("ncclCommGetAsyncError: {comm:p} is not a live communicator (already destroyed or aborted?)"),
            );
        }
        // SAFETY: live, see `usable`.
        let s = unsafe { &*comm }.shared.state();
        let state = match &s.async_error {
            Some((code, _)) => *code,
            None if !s.joined || s.in_flight => IN_PROGRESS,
            None if s.finalized && !s.settled() => IN_PROGRESS,
            None => SUCCESS,
        };
        // SAFETY: `async_error` was checked non-null above; it is the caller's out-parameter, writable (the API's contract).
        unsafe { *async_error = state };
        SUCCESS
    })
}

/// How many ranks the communicator has: NCCL's `ncclCommCount` (`init.cc`, 2.18 to 2.30):
/// the communicator checked, then `count`, then `ncclCommEnsureReady` (a non-blocking
/// init not done yet is `ncclInvalidArgument`, an asynchronous error is returned).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommCount(comm: *mut Comm, count: *mut c_int) -> NcclResult {
    entry("ncclCommCount", INTERNAL_ERROR, || {
        attribute(comm, count, "ncclCommCount", "count", Comm::nranks)
    })
}

/// This rank's rank in the communicator: NCCL's `ncclCommUserRank`, checked as
/// [`ncclCommCount`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommUserRank(comm: *mut Comm, rank: *mut c_int) -> NcclResult {
    entry("ncclCommUserRank", INTERNAL_ERROR, || {
        attribute(comm, rank, "ncclCommUserRank", "rank", Comm::rank)
    })
}

/// `ncclCommCount` and `ncclCommUserRank`: writes `of(comm)` to `out`.
fn attribute(comm: *mut Comm, out: *mut c_int, call: &str, name: &str, of: fn(&Comm) -> usize) -> NcclResult {
    let c = match live_comm(comm, call) {
        Ok(c) => c,
        Err(code) => return code,
    };
    if out.is_null() {
        return fail(INVALID_ARGUMENT, Some(c.rank()), &format!("{call}: {name} is NULL"));
    }
    if let Err(code) = ensure_ready(c, call, "") {
        return code;
    }
    // SAFETY: the caller's, checked non-NULL.
    unsafe { *out = of(c) as c_int };
    SUCCESS
}

/// Finishes the queued work, then forbids further use. Blocking communicator: waits until
/// every queued operation has completed (for ever if one never does). Non-blocking:
/// returns `ncclInProgress` at once, and `ncclCommGetAsyncError` says `ncclInProgress`
/// until the work is done.
#[unsafe(no_mangle)]
pub extern "C" fn ncclCommFinalize(comm: *mut Comm) -> NcclResult {
    entry("ncclCommFinalize", INTERNAL_ERROR, || {
        let c = match usable(comm, "ncclCommFinalize") {
            Ok(c) => c,
            Err(code) => return code,
        };
        c.shared.update(|s| s.finalized = true);
        if c.blocking() {
            let _blocked = crate::teardown::blocking("ncclCommFinalize");
            c.shared.wait_for(State::settled);
            SUCCESS
        } else {
            IN_PROGRESS
        }
    })
}

/// Frees a communicator: waits for its init and queued work to finish (for ever if they
/// never do, as NCCL's destroy does: only abort stops stuck work), then leaves.
#[unsafe(no_mangle)]
pub extern "C" fn ncclCommDestroy(comm: *mut Comm) -> NcclResult {
    entry("ncclCommDestroy", INTERNAL_ERROR, || end(comm, "ncclCommDestroy", true))
}

/// Frees a communicator at once, at any time (also during a non-blocking init, or with
/// work queued and stuck): stops the worker within a few ms, drops the queued work (the
/// streams become idle, deferred frees happen), leaves the meeting folder. Like NCCL's,
/// it tells nobody: the other ranks keep waiting.
///
/// From NCCL 2.22, inside an open group it only raises the abort flag (the worker stops)
/// and queues the freeing into the group ([`group`]): it happens at the group's end, or
/// never if the group failed or never ends.
#[unsafe(no_mangle)]
pub extern "C" fn ncclCommAbort(comm: *mut Comm) -> NcclResult {
    entry("ncclCommAbort", INTERNAL_ERROR, || {
        if !comm.is_null() && live(comm) && group::defer_abort(comm as usize) {
            // SAFETY: live, see `usable`.
            let s = &unsafe { &*comm }.shared;
            s.abort.store(true, Ordering::Release);
            s.abort_queued.store(true, Ordering::Release);
            s.update(|_| ());
            warn_at_exit();
            return SUCCESS;
        }
        end(comm, "ncclCommAbort", false)
    })
}

/// The end of a group that had an abort queued into it: the freeing runs now.
pub fn abort_queued(comm: *mut Comm) {
    if live(comm) {
        end(comm, "ncclCommAbort", false);
    }
}

/// A group with aborts queued into it failed: as NCCL's `groupCleanup`, the aborts are
/// dropped with it. The communicators stay allocated, their meeting folders in place;
/// the process says so when it exits.
pub fn lose_aborts(comms: &[usize]) {
    for &c in comms {
        if live(c as *mut Comm) {
            // SAFETY: live, see `usable`.
            let rank = unsafe { &*(c as *mut Comm) }.rank();
            warn(
                Some(rank),
                "ncclGroupEnd: the group failed, and the ncclCommAbort queued into it (NCCL 2.22 and later run an \
                 abort called inside ncclGroupStart/ncclGroupEnd at the group's end) is dropped with it: the \
                 communicator is never freed",
            );
        }
    }
}

/// Once an abort was queued into a group: at the process's exit, every communicator whose
/// queued abort never ran is named (`atexit`).
fn warn_at_exit() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    extern "C" fn at_exit() {
        let lost: Vec<usize> = comms()
            .iter()
            // SAFETY: live communicators are boxes made by the init and not yet freed.
            .filter(|&&c| {
                unsafe { &*(c as *mut Comm) }
                    .shared
                    .abort_queued
                    .load(Ordering::Acquire)
            })
            .copied()
            .collect();
        for c in lost {
            // SAFETY: as above.
            let rank = unsafe { &*(c as *mut Comm) }.rank();
            warn(
                Some(rank),
                "the process exits with a communicator never freed: its ncclCommAbort was called inside an open \
                 group, and NCCL 2.22 and later queue it into the group, where it runs only if the group ends \
                 without error (close the group, ncclGroupEnd, before aborting)",
            );
        }
    }
    ONCE.call_once(|| crate::at_exit(at_exit));
}

/// NCCL's abort frees memory that the other ranks of the node may still be using, so it
/// synchronises with them (NCCL's maintainers, issue #863: "within a node, you need all
/// ranks to abort"); issues #863, #992, #1013 and #1777 show it blocked in `commReclaim`
/// and the proxy threads' joins when only some ranks of a node abort. Played here: the
/// abort does not return while a rank of this node (the same played host) that has not
/// left the communicator is stopped (SIGSTOP) or gone (its process is dead or a zombie);
/// a stopped one that resumes lets it go. `NCCL_DOUBLE_ABORT_WAITS=0` turns it off.
fn wait_for_the_node(shared: &Shared) {
    if crate::env_number("NCCL_DOUBLE_ABORT_WAITS", 1) == 0 {
        return;
    }
    let mine = Card::mine(shared.nranks, String::new());
    let holding = || {
        (0..shared.nranks).filter(|&r| r != shared.rank).find_map(|r| {
            if shared.room.path(&format!("left-{r}")).exists() {
                return None;
            }
            let card = shared.room.read(&format!("rank-{r}")).and_then(|b| Card::parse(&b))?;
            if card.host != mine.host || card.real_host != mine.real_host {
                return None;
            }
            let state = std::fs::read_to_string(format!("/proc/{}/stat", card.pid))
                .ok()
                .and_then(|s| {
                    s.rsplit_once(')')
                        .and_then(|(_, rest)| rest.trim_start().chars().next())
                });
            match state {
                None | Some('Z') | Some('X') => Some((r, card.pid, "gone")),
                Some('T') | Some('t') => Some((r, card.pid, "stopped")),
                Some(_) => None,
            }
        })
    };
    // Not a failure of a call: a warning of NCCL's, in its debug output (where NCCL_DEBUG
    // asks for one), not on stderr, where a program's failure is its own one line.
    let mut said = false;
    while let Some((r, pid, how)) = holding() {
        if !said {
            let why = format!(
                "ncclCommAbort waits for rank {r} of this node (pid {pid}), which is {how}: NCCL's abort \
                 synchronises with the node's other ranks before it frees their shared memory"
            );
            crate::nccl::debug::warn(shared.device, &format!("rank {}: {why}", shared.rank));
            said = true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Destroy (`settle` first) and abort.
fn end(comm: *mut Comm, call: &str, settle: bool) -> NcclResult {
    if comm.is_null() {
        return SUCCESS;
    }
    let not_live = || {
        fail(
            INVALID_ARGUMENT,
            None,
            &format!(
                "{call}({comm:p}): not a live communicator. Destroyed twice? (cudarc's Comm calls ncclCommAbort \
                 when dropped: after destroying it yourself, std::mem::forget the Comm)"
            ),
        )
    };
    if settle {
        if !live(comm) {
            return not_live();
        }
        let _blocked = crate::teardown::blocking(call);
        // SAFETY: live, see `usable`.
        unsafe { &*comm }.shared.wait_for(State::settled);
    }
    if !comms().remove(&(comm as usize)) {
        return not_live();
    }
    // SAFETY: the pointer was live (made by the init) and is now unregistered.
    let mut c = unsafe { Box::from_raw(comm) };
    if !settle {
        wait_for_the_node(&c.shared);
    }
    c.stop();
    c.shared.room.leave();
    SUCCESS
}
