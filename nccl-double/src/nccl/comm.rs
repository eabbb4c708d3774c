//! Communicators: made by `ncclCommInitRank` (blocking) or `ncclCommInitRankConfig`
//! (blocking or not), each with a worker thread that joins the job and then runs the
//! communicator's queued work in issue order; watched with `ncclCommGetAsyncError`;
//! ended by `ncclCommFinalize` + `ncclCommDestroy`, or by `ncclCommAbort`.
//!
//! States, as `ncclCommGetAsyncError` reports them: `ncclInProgress` while the join of a
//! non-blocking init is under way, and after a non-blocking `ncclCommFinalize` until the
//! queued work is done; the asynchronous error once the worker found one (rules 3 and 4,
//! or another rank's failure); else `ncclSuccess`. A peer that has not arrived yet is
//! never an error: the worker waits for it until the communicator is aborted.
//!
//! Here: the communicator, what its calling thread and its worker share, its state, the
//! live ones, and the checks of a communicator handed in by a call. Making them (init,
//! split, the worker and the join) is [`making`]; watching and ending them (the
//! asynchronous error, count and rank, finalize, destroy, abort) is [`ending`].

mod ending;
mod making;

pub use ending::{abort_queued, lose_aborts};

use super::work::{self, Unit};
use super::{
    IN_PROGRESS, INTERNAL_ERROR, INVALID_ARGUMENT, INVALID_USAGE, NcclResult, REMOTE_ERROR, SUCCESS, SYSTEM_ERROR,
    fail, group,
};
use crate::exchange::{self, Failure, Halt, Room, Wanted};
use crate::warn;
use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

/// What an `ncclComm_t` points to: one rank's communicator.
pub struct Comm {
    shared: Arc<Shared>,
    /// The worker thread (taken when the communicator ends).
    worker: Option<JoinHandle<()>>,
}

/// What the calling thread and the worker share.
pub struct Shared {
    room: Room,
    rank: usize,
    nranks: usize,
    /// The communicator's device (visible ordinal of the process that made it).
    device: usize,
    /// Whether calls block (`ncclSuccess`) or say `ncclInProgress` (non-blocking config).
    blocking: bool,
    /// Set by abort (or a failed blocking init): the worker stops at its next look.
    abort: AtomicBool,
    /// Its ncclCommAbort was queued into a group (NCCL 2.22 on): freed at the group's end,
    /// if that end comes and the group did not fail.
    abort_queued: AtomicBool,
    /// The helper thread of the operation in flight (non-blocking: NCCL 2.23 on, for every
    /// operation; a split, for every version), joined by the next call.
    helper: Mutex<Option<JoinHandle<()>>>,
    /// The peers this rank has a point-to-point connection with (made at the first send or
    /// receive between the two: [`Shared::connect`]).
    connected: Mutex<BTreeSet<usize>>,
    /// How many splits this communicator made (each one's files are numbered).
    splits: std::sync::atomic::AtomicU64,
    /// How many units of work were queued (NCCL's `opCount`: one per ungrouped call, one
    /// per group), for the `NCCL_DEBUG_SUBSYS=COLL` lines.
    launches: std::sync::atomic::AtomicU64,
    /// What `NCCL_ALGO` and `NCCL_PROTO` enabled at this communicator's init (set once
    /// every rank has joined; none on one rank): its collectives choose by it.
    tuned: std::sync::OnceLock<super::tuning::Enabled>,
    state: Mutex<State>,
    /// Rung whenever `state` changes.
    changed: Condvar,
}

/// The communicator's state (see the module's doc).
#[derive(Default)]
struct State {
    /// Every rank has joined (the init is over).
    joined: bool,
    /// The asynchronous error (or a failed join's), with its reason.
    async_error: Option<(NcclResult, String)>,
    /// Why a call on this communicator failed its checks (it can only be ended now).
    broken: Option<String>,
    /// Work not yet started, in issue order.
    queue: VecDeque<Unit>,
    /// The worker is running a unit.
    running: bool,
    /// `ncclCommFinalize` was called.
    finalized: bool,
    /// An operation's helper thread has not finished yet: `ncclCommGetAsyncError` says
    /// `ncclInProgress`, and a new call is refused (NCCL's `ncclCommEnsureReady`).
    in_flight: bool,
}

impl State {
    /// Whether the init is over and no work is left (what finalize and destroy wait for).
    fn settled(&self) -> bool {
        (self.joined || self.async_error.is_some()) && !self.running && self.queue.is_empty()
    }
}

/// Whether the played NCCL launches every operation of a non-blocking communicator from a
/// helper thread: from v2.23.4 (`group.cc`: the non-blocking group path no longer depends
/// on connections to set up), so every call says `ncclInProgress`, and the next call is
/// refused until `ncclCommGetAsyncError` says `ncclSuccess`.
pub fn helper_per_call() -> bool {
    crate::version::version() >= 22304
}

/// How many helper threads this process started (`NCCL_DOUBLE_STATS` says it at exit).
pub static HELPERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Live communicators (addresses): a destroyed or made-up one is refused, not used.
static COMMS: Mutex<BTreeSet<usize>> = Mutex::new(BTreeSet::new());

/// The set of live communicators, locked.
fn comms() -> MutexGuard<'static, BTreeSet<usize>> {
    COMMS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether `comm` is a live communicator.
pub fn live(comm: *mut Comm) -> bool {
    comms().contains(&(comm as usize))
}

/// How long a condition wait sleeps before looking again (only against a lost wake-up:
/// the waits themselves have no deadline).
const RECHECK: Duration = Duration::from_millis(50);

impl Shared {
    /// The state, locked.
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits on `changed` until `done(state)` holds.
    fn wait_for(&self, done: impl Fn(&State) -> bool) {
        let mut s = self.state();
        while !done(&s) {
            s = self
                .changed
                .wait_timeout(s, RECHECK)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Changes the state and wakes whoever waits on it.
    fn update<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let r = f(&mut self.state());
        self.changed.notify_all();
        r
    }

    /// The worker found an error: it becomes the communicator's asynchronous error, the
    /// other ranks are told (failure marker), and the queued work is dropped so that the
    /// streams become idle (real NCCL would leave them busy until the abort; dropping
    /// keeps a program that only waits for the stream from hanging on a rule's test). The
    /// error is set before the work is dropped: an idle stream already shows it.
    fn fail_async(&self, f: Failure) {
        self.room
            .mark_failed(&exchange::cause(self.rank, f.code == REMOTE_ERROR, &f.why));
        warn(Some(self.rank), &f.why);
        let dropped = self.update(|s| {
            s.async_error.get_or_insert((f.code, f.why));
            std::mem::take(&mut s.queue)
        });
        drop(dropped);
    }

    /// Puts `unit` in the queue; why not, if the communicator failed meanwhile.
    fn push(&self, unit: Unit) -> Result<(), String> {
        let refused = self.update(|s| {
            if let Some(why) = s.broken.as_ref().or(s.async_error.as_ref().map(|e| &e.1)) {
                return Err((unit, why.clone()));
            }
            s.queue.push_back(unit);
            Ok(())
        });
        refused.map_err(|(unit, why)| {
            drop(unit);
            format!("a call on a communicator that already failed ({why}): it can only be destroyed or aborted")
        })
    }

    /// Runs `job` on a helper thread, as NCCL runs a non-blocking communicator's group job
    /// (`pthread_create` in `ncclGroupEndInternal`): the communicator is in progress until
    /// it is done; its failure becomes the asynchronous error. `ncclInProgress`.
    fn in_background(
        self: &Arc<Self>,
        what: &str,
        job: impl FnOnce() -> Result<(), Failure> + Send + 'static,
    ) -> NcclResult {
        self.join_helper();
        self.update(|s| s.in_flight = true);
        HELPERS.fetch_add(1, Ordering::Relaxed);
        let shared = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name(format!("nccl-double {what}"))
            .spawn(move || {
                let done = job();
                if let Err(f) = done {
                    shared.fail_async(f);
                }
                shared.update(|s| s.in_flight = false);
            });
        match spawned {
            Ok(h) => {
                *self.helper.lock().unwrap_or_else(|p| p.into_inner()) = Some(h);
                IN_PROGRESS
            }
            Err(e) => {
                self.update(|s| s.in_flight = false);
                fail(SYSTEM_ERROR, Some(self.rank), &format!("starting a helper thread: {e}"))
            }
        }
    }

    /// The peers of `unit`'s sends and receives this rank has no connection with yet.
    fn unconnected(&self, unit: &Unit) -> Vec<usize> {
        let connected = self.connected.lock().unwrap_or_else(|p| p.into_inner());
        let mut peers: Vec<usize> = unit
            .calls()
            .iter()
            .filter_map(|c| match c {
                work::Call::Send { peer, .. } | work::Call::Recv { peer, .. } => Some(*peer),
                work::Call::Collective { .. } => None,
            })
            .filter(|p| *p != self.rank && !connected.contains(p))
            .collect();
        peers.sort_unstable();
        peers.dedup();
        peers
    }

    /// Connects this rank with `peers` for sends and receives, as NCCL does at the first
    /// send or receive between two ranks (`ncclTransportP2pSetup`, run by the group's
    /// launch: each side sends its connection's details through the bootstrap network and
    /// waits for the peer's). So it waits until each peer comes to its own first send or
    /// receive with this rank: for ever if a peer never does (stopped, dead), unless the
    /// communicator is aborted.
    fn connect(&self, peers: &[usize]) -> Result<(), Halt> {
        let me = self.rank;
        for p in peers {
            self.room.publish(&format!("connect-{me}-{p}"), b"")?;
        }
        let wanted: Vec<Wanted> = peers
            .iter()
            .map(|p| Wanted {
                name: format!("connect-{p}-{me}"),
                from: *p,
            })
            .collect();
        let who: Vec<String> = peers.iter().map(|p| p.to_string()).collect();
        let what = format!(
            "rank(s) {} to connect (their first send or receive with this rank)",
            who.join(", ")
        );
        self.room.wait(&wanted, &what, &mut |_, _| Ok(()), &self.abort)?;
        self.connected.lock().unwrap_or_else(|p| p.into_inner()).extend(peers);
        Ok(())
    }

    /// Waits for the helper thread of the last operation, if any (it is done, or about to be).
    fn join_helper(&self) {
        let helper = self.helper.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = helper {
            let _ = h.join();
        }
    }

    /// The next unit to run (the worker waits for one), or `None` once aborted.
    fn next_unit(&self) -> Option<Unit> {
        let mut s = self.state();
        loop {
            if self.abort.load(Ordering::Acquire) {
                return None;
            }
            if let Some(u) = s.queue.pop_front() {
                s.running = true;
                return Some(u);
            }
            s = self
                .changed
                .wait_timeout(s, RECHECK)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

impl Comm {
    /// This rank.
    pub fn rank(&self) -> usize {
        self.shared.rank
    }

    /// The number of ranks.
    pub fn nranks(&self) -> usize {
        self.shared.nranks
    }

    /// What `NCCL_ALGO` and `NCCL_PROTO` enabled at this communicator's init.
    pub fn tuned(&self) -> Option<&super::tuning::Enabled> {
        self.shared.tuned.get()
    }

    /// The communicator's device (visible ordinal).
    pub fn device(&self) -> usize {
        self.shared.device
    }

    /// Whether the communicator was made blocking.
    pub fn blocking(&self) -> bool {
        self.shared.blocking
    }

    /// NCCL's `opCount`: how many units of work were queued so far.
    pub fn op_count(&self) -> u64 {
        self.shared.launches.load(Ordering::Relaxed)
    }

    /// A call failed its checks: the communicator is broken (every later call fails),
    /// the other ranks are told, and the call returns `f.code`.
    pub fn fail(&self, f: Failure) -> NcclResult {
        let s = &self.shared;
        s.room
            .mark_failed(&exchange::cause(s.rank, f.code == REMOTE_ERROR, &f.why));
        warn(Some(s.rank), &f.why);
        group::failed(f.code);
        s.update(|st| {
            st.broken.get_or_insert(f.why);
        });
        f.code
    }

    /// Queues `unit` for the worker, as NCCL of the played version launches work:
    /// `ncclSuccess` for a blocking communicator; `ncclInProgress` for a non-blocking one,
    /// and from NCCL 2.23 on ([`helper_per_call`]) from a helper thread started for the
    /// call, the communicator in progress until that thread has queued it. Refused if the
    /// communicator failed meanwhile (the unit is dropped).
    ///
    /// The first send or receive between two ranks connects them first ([`Shared::connect`]),
    /// in the group's launch, which waits for the peer: a blocking communicator launches in
    /// the caller's thread (`groupLaunch` in `ncclGroupEndInternal`, 2.18 to 2.30), so the
    /// call itself waits, for ever if the peer never comes; a non-blocking one launches a
    /// group with connections to make from a helper thread on every version (before 2.23,
    /// the `ncclGroupCommPreconnectHead` case; from 2.23, every group).
    pub fn enqueue(&self, unit: Unit) -> NcclResult {
        let peers = self.shared.unconnected(&unit);
        if self.blocking() {
            if !peers.is_empty() {
                let _mark = crate::teardown::blocking("ncclGroupEnd");
                match self.shared.connect(&peers) {
                    Ok(()) => {}
                    Err(Halt::Aborted) => {
                        return fail(INVALID_USAGE, Some(self.rank()), "the communicator was aborted");
                    }
                    Err(Halt::Failed(f)) => return self.fail(f),
                }
            }
            return self.launch_now(unit);
        }
        if !helper_per_call() && peers.is_empty() {
            return match self.launch_now(unit) {
                SUCCESS => IN_PROGRESS,
                other => other,
            };
        }
        self.shared.launches.fetch_add(1, Ordering::Relaxed);
        let shared = Arc::clone(&self.shared);
        self.shared.in_background("enqueue", move || {
            if !peers.is_empty() {
                match shared.connect(&peers) {
                    Ok(()) => {}
                    Err(Halt::Aborted) => return Ok(()),
                    Err(Halt::Failed(f)) => return Err(f),
                }
            }
            super::tuning::print_choices(
                unit.calls(),
                shared.device,
                shared.rank,
                shared.nranks,
                shared.tuned.get(),
            );
            shared.push(unit).map_err(|why| Failure::new(INVALID_USAGE, why))
        })
    }

    /// Queues `unit` for the worker now, with no helper thread and no group, and says
    /// `ncclSuccess`: a blocking launch, and NCCL's launch of a one-rank collective
    /// (`ncclLaunchOneRank`), non-blocking or not. Refused if the communicator failed.
    pub fn launch_now(&self, unit: Unit) -> NcclResult {
        self.shared.launches.fetch_add(1, Ordering::Relaxed);
        // Where NCCL plans the launch, rank 0 says each collective's algorithm.
        super::tuning::print_choices(unit.calls(), self.device(), self.rank(), self.nranks(), self.tuned());
        match self.shared.push(unit) {
            Ok(()) => SUCCESS,
            Err(why) => fail(INVALID_USAGE, Some(self.rank()), &why),
        }
    }

    /// Stops the worker (at its next look, within a few ms), waits for it, and drops the
    /// queued work: the streams become idle and the frees deferred behind it happen.
    fn stop(&mut self) {
        self.shared.join_helper();
        self.shared.abort.store(true, Ordering::Release);
        self.shared.update(|_| ());
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
        let dropped = self.shared.update(|s| std::mem::take(&mut s.queue));
        drop(dropped);
    }
}

/// Looks up a communicator handed in by the caller: not NULL, and live (NCCL's
/// `PtrCheck`, and from 2.21 `CommCheck`, which finds a freed one by its magic numbers).
fn live_comm<'a>(comm: *mut Comm, call: &str) -> Result<&'a Comm, NcclResult> {
    if comm.is_null() {
        return Err(fail(
            INVALID_ARGUMENT,
            None,
            &format!("{call}: the communicator is NULL"),
        ));
    }
    if !live(comm) {
        return Err(fail(
            INVALID_ARGUMENT,
            None,
            &format!("{call}: {comm:p} is not a live communicator (already destroyed or aborted?)"),
        ));
    }
    // SAFETY: live communicators are boxes made by the init and not yet freed; NCCL (like
    // the double) requires that one communicator is used by one thread at a time.
    Ok(unsafe { &*comm })
}

/// Looks up a communicator handed in by the caller for a new call: live, joined, not
/// broken, not failed, not finalized.
pub fn usable<'a>(comm: *mut Comm, call: &str) -> Result<&'a Comm, NcclResult> {
    let c = live_comm(comm, call)?;
    let s = c.shared.state();
    let refusal = if let Some(why) = s.broken.as_ref().or(s.async_error.as_ref().map(|e| &e.1)) {
        Some((
            INVALID_USAGE,
            format!("{call} on a communicator that already failed ({why}): it can only be destroyed or aborted"),
        ))
    } else if s.finalized {
        Some((INVALID_USAGE, format!("{call} on a finalized communicator")))
    } else {
        not_ready(&s, call)
    };
    drop(s);
    match refusal {
        Some((code, why)) => Err(fail(code, Some(c.rank()), &why)),
        None => {
            // NCCL's ncclCommEnsureReady joins the helper of the last operation.
            c.shared.join_helper();
            Ok(c)
        }
    }
}

/// Why a communicator cannot take a call yet (NCCL's `ncclCommEnsureReady`, which turns
/// `ncclInProgress` into `ncclInvalidArgument`): its non-blocking init, or the helper
/// thread of its last operation, is not done.
fn not_ready(s: &State, call: &str) -> Option<(NcclResult, String)> {
    if s.in_flight {
        Some((
            INVALID_ARGUMENT,
            format!(
                "{call}: Attempt to use communicator before the previous operation returned ncclSuccess (NCCL \
                 2.23 and later launch each operation of a non-blocking communicator from a helper thread: poll \
                 ncclCommGetAsyncError until it says ncclSuccess before the next call)"
            ),
        ))
    } else if !s.joined {
        // NCCL's ncclCommEnsureReady says this, and turns ncclInProgress into an error.
        Some((
            INVALID_ARGUMENT,
            format!(
                "{call}: Attempt to use communicator before the previous operation returned ncclSuccess (its \
                 non-blocking init is in progress: poll ncclCommGetAsyncError until it says ncclSuccess)"
            ),
        ))
    } else {
        None
    }
}

/// NCCL's `ncclCommEnsureReady` (`init.cc`, 2.18 to 2.30) for a call that reads the
/// communicator: its asynchronous error is returned as it is ("if ret is not
/// ncclInProgress, we just keep it"), a non-blocking init or operation not done yet is
/// `ncclInvalidArgument`. A call that failed its checks (the double's broken state) is no
/// error for NCCL: the call goes on.
///
/// Up to 2.26 it WARNs "Attempt to use communicator before the previous operation
/// returned ncclSuccess" for an error too; from 2.27 only for `ncclInProgress`. `note`
/// ends the message of an asynchronous error.
fn ensure_ready(c: &Comm, call: &str, note: &str) -> Result<(), NcclResult> {
    let s = c.shared.state();
    let refusal = match &s.async_error {
        Some((code, why)) => {
            let nccl_says = if crate::version::version() < 22700 {
                ": Attempt to use communicator before the previous operation returned ncclSuccess"
            } else {
                ""
            };
            Some((
                *code,
                format!(
                    "{call}{nccl_says}: the communicator's asynchronous error is {} ({why}), and NCCL's \
                     ncclCommEnsureReady returns it{note}",
                    code_name(*code)
                ),
            ))
        }
        None => not_ready(&s, call),
    };
    drop(s);
    match refusal {
        Some((code, why)) => Err(fail(code, Some(c.rank()), &why)),
        None => {
            c.shared.join_helper();
            Ok(())
        }
    }
}

/// An `ncclResult_t` by its name in `nccl.h`.
fn code_name(code: NcclResult) -> &'static str {
    match code {
        SUCCESS => "ncclSuccess",
        1 => "ncclUnhandledCudaError",
        SYSTEM_ERROR => "ncclSystemError",
        INTERNAL_ERROR => "ncclInternalError",
        INVALID_ARGUMENT => "ncclInvalidArgument",
        INVALID_USAGE => "ncclInvalidUsage",
        REMOTE_ERROR => "ncclRemoteError",
        IN_PROGRESS => "ncclInProgress",
        _ => "an unknown result",
    }
}
