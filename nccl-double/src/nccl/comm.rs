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

use super::work::{self, Progress, Unit};
use super::{
    IN_PROGRESS, INTERNAL_ERROR, INVALID_ARGUMENT, INVALID_USAGE, MAGIC, NcclResult, REMOTE_ERROR, SUCCESS,
    SYSTEM_ERROR, UniqueId, fail, group,
};
use crate::driver::current_device;
use crate::exchange::{self, Card, Failure, Halt, Room, Wanted};
use crate::{allowed, devices, entry, warn};
use std::collections::{BTreeSet, VecDeque};
use std::ffi::{c_int, c_void};
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
    super::version() >= 22304
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
            let nccl_says = if super::version() < 22700 {
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

// ---------------------------------------------------------------------------------
// Making communicators.

/// Joins the job of `id` as `rank` of `nranks`, blocking until every rank has joined
/// (for ever if one never comes).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommInitRank(out: *mut *mut Comm, nranks: c_int, id: UniqueId, rank: c_int) -> NcclResult {
    entry("ncclCommInitRank", INTERNAL_ERROR, || {
        init(out, nranks, &id, rank, true, "ncclCommInitRank")
    })
}

/// Joins the job of `id` as `rank` of `nranks` with a config: `blocking = 0` returns
/// `ncclInProgress` at once with a valid handle and joins in the background
/// (`ncclCommGetAsyncError` says when it is done); `blocking = 1`, unset
/// (`NCCL_CONFIG_UNDEF_INT`) or a NULL config behave as `ncclCommInitRank`. The config is
/// read as NCCL of the played version reads it ([`super::config`]): a wrong magic, or
/// bytes past the declared fields that this NCCL would take as settings, are refused
/// with `ncclInvalidArgument`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommInitRankConfig(
    out: *mut *mut Comm,
    nranks: c_int,
    id: UniqueId,
    rank: c_int,
    config: *mut c_void,
) -> NcclResult {
    entry("ncclCommInitRankConfig", INTERNAL_ERROR, || {
        if !allowed() {
            return SYSTEM_ERROR;
        }
        let who = usize::try_from(rank).ok();
        let blocking = if config.is_null() {
            true
        } else {
            // SAFETY: the caller's config, read as NCCL reads it (its size first).
            match unsafe { super::config::read(config as *const u8, "ncclCommInitRankConfig") } {
                Ok(c) => c.blocking.unwrap_or(true),
                Err(f) => return fail(f.code, who, &f.why),
            }
        };
        init(out, nranks, &id, rank, blocking, "ncclCommInitRankConfig")
    })
}

/// `NCCL_SPLIT_NOCOLOR`: this rank joins no new communicator.
const NOCOLOR: c_int = -1;

/// Splits `comm`: every rank of it calls this; those of one `color` form a new
/// communicator, ranked by `key`, then by their rank in `comm`; a rank with
/// `NCCL_SPLIT_NOCOLOR` gets none (`*newcomm` stays NULL). The new communicator shares
/// the parent's device; `config` (read as [`ncclCommInitRankConfig`] reads it) says
/// whether it is blocking; a NULL config copies the parent's. As in NCCL, the split runs
/// as a job of the parent: on a non-blocking parent, it returns `ncclInProgress` at once,
/// the parent says `ncclInProgress` until every rank of the new communicator has joined,
/// and `*newcomm` is written then (so it must stay valid until then).
///
/// The checks are NCCL's (`ncclCommSplit` in `init.cc` up to 2.26, then
/// `ncclCommInitChildComm`, tags v2.18.1 to v2.30.7), in its order: the communicator
/// (`PtrCheck`; from 2.21 `CommCheck`), `newcomm` (`PtrCheck`), the parent's state
/// (`ncclCommEnsureReady`, from 2.19: its asynchronous error is returned as it is), and
/// the config, which only a rank that joins a new communicator reads (`parseCommConfig`
/// is in the branch for a color other than `NCCL_SPLIT_NOCOLOR`). Any other color, a
/// negative one included, is a color: `commGetSplitInfo` only compares colors.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommSplit(
    comm: *mut Comm,
    color: c_int,
    key: c_int,
    newcomm: *mut *mut Comm,
    config: *mut c_void,
) -> NcclResult {
    entry("ncclCommSplit", INTERNAL_ERROR, || {
        let c = match live_comm(comm, "ncclCommSplit") {
            Ok(c) => c,
            Err(code) => return code,
        };
        let who = Some(c.rank());
        if newcomm.is_null() {
            return fail(INVALID_ARGUMENT, who, "ncclCommSplit: newcomm is NULL");
        }
        // SAFETY: the caller's, checked non-NULL. NCCL: NULL until the split is complete,
        // and NULL after a failure.
        unsafe { *newcomm = std::ptr::null_mut() };
        // The parent's asynchronous error is the split's (ncclCommEnsureReady, from 2.19).
        let note = if super::version() < 21900 {
            " from 2.19 on. NCCL 2.18's ncclCommSplit does not look: it would run the split's allgather over a \
             job that already failed (which then fails or hangs); the double refuses it as 2.19 does"
        } else {
            ""
        };
        if let Err(code) = ensure_ready(c, "ncclCommSplit", note) {
            return code;
        }
        let c = match usable(comm, "ncclCommSplit") {
            Ok(c) => c,
            Err(code) => return code,
        };
        if group::open() {
            return fail(
                INVALID_USAGE,
                who,
                "ncclCommSplit inside ncclGroupStart/ncclGroupEnd is not supported by the test double",
            );
        }
        // NCCL_SPLIT_NOCOLOR: the config is not read (NCCL parses it only for a rank that
        // joins a new communicator). A NULL config: the parent's (copyCommConfig).
        let blocking = if color == NOCOLOR || config.is_null() {
            c.blocking()
        } else {
            // SAFETY: the caller's config, read as NCCL reads it.
            match unsafe { super::config::read(config as *const u8, "ncclCommSplit") } {
                Ok(cfg) => cfg.blocking.unwrap_or(true),
                Err(f) => return fail(f.code, who, &f.why),
            }
        };
        // The child's config, read over by the environment (`envConfigOverride(childComm)`).
        let (blocking, _) = super::config::env_override(blocking, false);
        let shared = Arc::clone(&c.shared);
        let out = newcomm as usize;
        let job = move || split(&shared, (color, key), blocking, out);
        if c.blocking() {
            match job() {
                Ok(()) => SUCCESS,
                Err(f) => c.fail(f),
            }
        } else {
            // NCCL (init.cc, 2.18 to 2.30) returns the split's own result, ncclSuccess, and
            // drops its group's ncclInProgress: the job runs on, the parent says
            // ncclInProgress and `*newcomm` stays NULL until it is done (seen on an H200
            // with NCCL 2.28.3 and 2.28.9, 2026-11-26).
            match c.shared.in_background("split", job) {
                IN_PROGRESS => SUCCESS,
                other => other,
            }
        }
    })
}

/// The split's job: every rank publishes its color and key in the parent's room; the
/// ranks of this rank's color meet in a room of their own, and the new communicator is
/// made there, fully joined, before `*out` is written.
fn split(parent: &Shared, (color, key): (c_int, c_int), blocking: bool, out: usize) -> Result<(), Failure> {
    let seq = parent.splits.fetch_add(1, Ordering::Relaxed);
    let me = parent.rank;
    parent
        .room
        .publish(&format!("split-{seq}-{me}"), format!("{color} {key}").as_bytes())?;
    let read = |b: &[u8]| -> Option<(c_int, c_int)> {
        let text = String::from_utf8_lossy(b);
        let (c, k) = text.split_once(' ')?;
        Some((c.parse().ok()?, k.parse().ok()?))
    };
    let wanted: Vec<Wanted> = (0..parent.nranks)
        .map(|r| Wanted {
            name: format!("split-{seq}-{r}"),
            from: r,
        })
        .collect();
    let got = parent.room.wait(
        &wanted,
        "every rank to call ncclCommSplit",
        &mut |r, b| {
            read(b)
                .map(|_| ())
                .ok_or_else(|| Failure::new(SYSTEM_ERROR, format!("rank {r}'s split is unreadable")))
        },
        &parent.abort,
    );
    let got = match got {
        Ok(g) => g,
        Err(Halt::Failed(f)) => return Err(f),
        Err(Halt::Aborted) => {
            return Err(Failure::new(
                INVALID_USAGE,
                "ncclCommSplit: the communicator was aborted",
            ));
        }
    };
    if color == NOCOLOR {
        return Ok(());
    }
    let picked: Vec<(c_int, c_int)> = got.iter().map(|b| read(b).unwrap_or((NOCOLOR, 0))).collect();
    let mut members: Vec<usize> = (0..parent.nranks).filter(|&r| picked[r].0 == color).collect();
    members.sort_by_key(|&r| (picked[r].1, r));
    let rank = members.iter().position(|&r| r == me).unwrap_or(0);
    let nranks = members.len();
    let room = Room::open(&format!("{}-s{seq}c{color}", parent.room.name()), rank, nranks)?;
    let call = format!("ncclCommSplit(color {color}, key {key}: rank {rank} of {nranks})");
    let mut child = start_in(room, (rank, nranks), parent.device, blocking, call)?;
    child.shared.wait_for(|s| s.joined || s.async_error.is_some());
    let failed = child.shared.state().async_error.clone();
    if let Some((code, why)) = failed {
        child.stop();
        child.shared.room.leave();
        return Err(Failure::new(code, why));
    }
    let child = Box::into_raw(Box::new(child));
    comms().insert(child as usize);
    // SAFETY: the caller's `newcomm`, which NCCL's API requires to stay valid until the
    // split is complete.
    unsafe { *(out as *mut *mut Comm) = child };
    Ok(())
}

/// Both inits: the checks of the call, then the join (waited for if `blocking`).
fn init(out: *mut *mut Comm, nranks: c_int, id: &UniqueId, rank: c_int, blocking: bool, name: &str) -> NcclResult {
    if !allowed() {
        return SYSTEM_ERROR;
    }
    // NCCL_COMM_BLOCKING overrides the config (or its absence), as NCCL reads it.
    let (blocking, _) = super::config::env_override(blocking, false);
    let who = usize::try_from(rank).ok();
    if out.is_null() {
        return fail(INVALID_ARGUMENT, who, &format!("{name}: comm is NULL"));
    }
    super::stats_at_exit();
    let mut comm = match start(nranks, id, rank, blocking, name) {
        Ok(c) => c,
        Err(f) => return fail(f.code, who, &f.why),
    };
    if blocking {
        let _blocked = crate::teardown::blocking(name);
        comm.shared.wait_for(|s| s.joined || s.async_error.is_some());
        let failed = comm.shared.state().async_error.clone();
        if let Some((code, why)) = failed {
            // The worker said it (WARN line); the caller's thread keeps it too.
            comm.stop();
            comm.shared.room.leave();
            crate::remember(&why);
            return code;
        }
    }
    let comm = Box::into_raw(Box::new(comm));
    comms().insert(comm as usize);
    // SAFETY: `out` is the caller's, checked non-NULL.
    unsafe { *out = comm };
    if blocking { SUCCESS } else { IN_PROGRESS }
}

/// The checks an init makes at once (rules 1 and 2: the id, the rank's range, a current
/// context, the rank not claimed by another process), then the worker's start.
fn start(nranks: c_int, id: &UniqueId, rank: c_int, blocking: bool, name: &str) -> Result<Comm, Failure> {
    let call = format!("{name}(rank {rank} of {nranks})");
    if group::open() {
        return Err(Failure::new(
            INVALID_USAGE,
            format!("{call} inside ncclGroupStart/ncclGroupEnd is not supported by the test double"),
        ));
    }
    if id.internal[..8] != MAGIC[..] {
        let why = if id.internal.iter().all(|b| *b == 0) {
            "the unique id is all zeros: it was never filled in (rank 0 makes it with ncclGetUniqueId and every rank must receive it)"
        } else {
            "the unique id was not made by ncclGetUniqueId (of this test double)"
        };
        return Err(Failure::new(INVALID_ARGUMENT, format!("{call}: {why}")));
    }
    // Its maker's pid first: a folder left by a killed job says whose it was, so that the
    // workbook can remove it once every process that used it is gone.
    let maker = u32::from_le_bytes([id.internal[24], id.internal[25], id.internal[26], id.internal[27]]);
    let random: String = id.internal[8..24].iter().map(|b| format!("{b:02x}")).collect();
    let room_name = format!("{maker}-{random}");
    let in_range = nranks >= 1 && rank >= 0 && rank < nranks;
    let (r, n) = (rank.max(0) as usize, nranks.max(1) as usize);
    let room = Room::open(&room_name, r, n)?;
    if !in_range {
        let why = format!("{call}: rank must be in 0..{nranks} (and nranks at least 1)");
        room.mark_failed(&format!("a process failed: {why}"));
        return Err(Failure::new(INVALID_ARGUMENT, why));
    }
    // Rule 1: the device is the current context's.
    let Some(device) = current_device() else {
        let why = format!(
            "{call} with no CUDA context current on this thread: NCCL takes the device from the calling \
             thread's current context (real NCCL would silently use device 0). Make the rank's device current \
             first: CudaContext::new(device) on this thread, or ctx.bind_to_thread()"
        );
        room.mark_failed(&format!("rank {r} failed: {why}"));
        room.leave();
        return Err(Failure::new(INVALID_USAGE, why));
    };
    start_in(room, (r, n), device, blocking, call)
}

/// A communicator's start once its room and device are known (an init's, or a split's,
/// whose device is the parent's): claim the rank (rule 2), then start the worker.
fn start_in(room: Room, (r, n): (usize, usize), device: usize, blocking: bool, call: String) -> Result<Comm, Failure> {
    let bus_id = devices::physical(device).map(devices::bus_id).unwrap_or_default();
    let card = Card::mine(n, bus_id);
    // Rule 2: nobody else has this rank.
    if !room.claim(&format!("rank-{r}"), &card.to_bytes())? {
        let other = room.read(&format!("rank-{r}")).and_then(|b| Card::parse(&b));
        let why = format!(
            "{call}: two processes claim the same rank {r}: {} joined as rank {r} first; every rank of a job \
             needs its own rank",
            other.map_or("another process".into(), |c| format!("pid {} on {}", c.pid, c.host))
        );
        room.mark_failed(&format!("a process failed: {why}"));
        return Err(Failure::new(INVALID_ARGUMENT, why));
    }
    let shared = Arc::new(Shared {
        room,
        rank: r,
        nranks: n,
        device,
        blocking,
        abort: AtomicBool::new(false),
        abort_queued: AtomicBool::new(false),
        helper: Mutex::new(None),
        connected: Mutex::new(BTreeSet::new()),
        splits: std::sync::atomic::AtomicU64::new(0),
        launches: std::sync::atomic::AtomicU64::new(0),
        tuned: std::sync::OnceLock::new(),
        state: Mutex::new(State::default()),
        changed: Condvar::new(),
    });
    let theirs = Arc::clone(&shared);
    let worker = std::thread::Builder::new()
        .name(format!("nccl-double rank {r}"))
        .spawn(move || worker(theirs, card, call));
    match worker {
        Ok(w) => Ok(Comm {
            shared,
            worker: Some(w),
        }),
        Err(e) => {
            shared.room.leave();
            Err(Failure::new(
                SYSTEM_ERROR,
                format!("starting the communicator's worker thread: {e}"),
            ))
        }
    }
}

/// The worker thread of a communicator: joins, then runs the queued units in order until
/// the communicator ends. A panic (a bug of the double) becomes the async error.
fn worker(shared: Arc<Shared>, card: Card, call: String) {
    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| serve(&shared, &card, &call)));
    if let Err(p) = ran {
        let what = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        shared.fail_async(Failure::new(
            INTERNAL_ERROR,
            format!("the communicator's worker panicked (a bug in the double): {what}"),
        ));
    }
}

/// The worker's life: the join, then every unit in turn.
fn serve(shared: &Shared, card: &Card, call: &str) {
    // NCCL's first log call of a process opens its debug file.
    super::debug::open();
    match join(shared, call, card) {
        Ok(()) => shared.update(|s| s.joined = true),
        Err(Halt::Aborted) => return,
        Err(Halt::Failed(f)) => return shared.fail_async(f),
    }
    let mut progress = Progress::new(shared.rank, shared.nranks);
    while let Some(unit) = shared.next_unit() {
        match work::run(&unit, &mut progress, &shared.room, &shared.abort) {
            Ok(()) => {}
            // The unit is dropped on the way out: its streams become idle.
            Err(Halt::Aborted) => return,
            Err(Halt::Failed(f)) => shared.fail_async(f),
        }
        drop(unit);
        shared.update(|s| s.running = false);
    }
}

/// Waits for every rank's card, checking rule 2 (same world size) as they arrive, then
/// what NCCL checks when it has them all (in its order: for each rank, the version, then
/// the GPU).
fn join(shared: &Shared, call: &str, mine: &Card) -> Result<(), Halt> {
    let me = shared.rank;
    let wanted: Vec<Wanted> = (0..shared.nranks)
        .map(|r| Wanted {
            name: format!("rank-{r}"),
            from: r,
        })
        .collect();
    let what = format!("every rank to join ({})", call.split('(').next().unwrap_or(call));
    let cards = shared.room.wait(
        &wanted,
        &what,
        &mut |r, b| {
            let c =
                Card::parse(b).ok_or_else(|| Failure::new(SYSTEM_ERROR, format!("rank {r}'s card is unreadable")))?;
            if c.nranks != shared.nranks {
                return Err(Failure::new(
                    INVALID_ARGUMENT,
                    format!(
                        "{call}: rank {r} joined a world of {} ranks, this rank ({me}) one of {}: every rank must give \
                         the same nranks",
                        c.nranks, shared.nranks
                    ),
                ));
            }
            Ok(())
        },
        &shared.abort,
    )?;
    let cards: Vec<Card> = cards.iter().filter_map(|b| Card::parse(b)).collect();
    // Two ranks on one GPU of one host (`init.cc`): 2.18 to 2.29 compare PCI bus ids and
    // refuse; 2.30.3 and 2.30.4 too (`ncclCheckMultiRank`), 2.30.7 (from 2.30.5 here)
    // UUIDs (a GPU's partitions are GPUs of their own), both unless
    // NCCL_MULTI_RANK_GPU_ENABLE is set, each with its own message.
    let version = super::version();
    let allowed = version >= 23000 && devices::multi_rank_gpu_enabled();
    let by_uuid = version >= 23005;
    let same_gpu = |a: &Card, b: &Card| {
        a.host == b.host
            && if by_uuid {
                a.uuid == b.uuid
            } else {
                a.bus_id == b.bus_id
            }
    };
    let shared_gpu = |a: usize, b: usize| {
        let c = &cards[a];
        let text = if version < 23000 {
            format!(
                "Duplicate GPU detected : rank {a} and rank {b} both on CUDA device {} (host \"{}\"; NCCL refuses \
                 two ranks of one host on one GPU)",
                c.bus_id, c.host
            )
        } else if !by_uuid {
            format!(
                "Multiple ranks detected using the same GPU on this node. Set NCCL_MULTI_RANK_GPU_ENABLE=1 to enable \
                 this configuration. (ranks {a} and {b} on CUDA device {} of host \"{}\")",
                c.bus_id, c.host
            )
        } else {
            format!(
                "Multiple Ranks are using the same GPU/Partition. Set NCCL_MULTI_RANK_GPU_ENABLE=1 to enable this \
                 configuration. (ranks {a} and {b} on GPU {} of host \"{}\")",
                c.uuid, c.host
            )
        };
        Failure::new(INVALID_USAGE, text)
    };
    for (i, c) in cards.iter().enumerate() {
        if c.version != mine.version {
            return Err(Failure::new(
                INVALID_USAGE,
                format!(
                    "Mismatched NCCL version detected : rank {i} version {} rank {me} version {} (every rank must load \
                     the same NCCL)",
                    c.version, mine.version
                ),
            )
            .into());
        }
        // In the same loop: up to 2.29 this rank against rank i, in 2.30.7 every pair (j, i).
        if version < 23000 && i != me && same_gpu(c, mine) {
            return Err(shared_gpu(me, i).into());
        }
        if by_uuid
            && !allowed
            && let Some(j) = (0..i).find(|&j| same_gpu(&cards[j], c))
        {
            return Err(shared_gpu(j, i).into());
        }
    }
    // A rank on no shared GPU fails alike (real NCCL would leave it waiting for the
    // others, which failed): naming the first pair.
    for a in 0..cards.len() {
        for b in a + 1..cards.len() {
            if !allowed && same_gpu(&cards[a], &cards[b]) {
                return Err(shared_gpu(a, b).into());
            }
        }
    }
    super::transport_lines::print(shared.device, me, &cards); // NCCL connects its rings, then tunes
    // Then NCCL tunes its model: NCCL_ALGO and NCCL_PROTO are read there.
    if let Some(e) = super::tuning::check_init(shared.device, shared.rank, shared.nranks)? {
        let _ = shared.tuned.set(e);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------
// Watching and ending communicators.

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
    let mut said = false;
    while let Some((r, pid, how)) = holding() {
        if !said {
            warn(
                Some(shared.rank),
                &format!(
                    "ncclCommAbort waits for rank {r} of this node (pid {pid}), which is {how}: NCCL's abort \
                     synchronises with the node's other ranks before it frees their shared memory"
                ),
            );
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
