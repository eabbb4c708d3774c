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
use std::ffi::{c_char, c_int, c_uint};
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
}

impl State {
    /// Whether the init is over and no work is left (what finalize and destroy wait for).
    fn settled(&self) -> bool {
        (self.joined || self.async_error.is_some()) && !self.running && self.queue.is_empty()
    }
}

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

    /// The communicator's device (visible ordinal).
    pub fn device(&self) -> usize {
        self.shared.device
    }

    /// Whether the communicator was made blocking.
    pub fn blocking(&self) -> bool {
        self.shared.blocking
    }

    /// A call failed its checks: the communicator is broken (every later call fails),
    /// the other ranks are told, and the call returns `f.code`.
    pub fn fail(&self, f: Failure) -> NcclResult {
        let s = &self.shared;
        s.room
            .mark_failed(&exchange::cause(s.rank, f.code == REMOTE_ERROR, &f.why));
        warn(Some(s.rank), &f.why);
        s.update(|st| {
            st.broken.get_or_insert(f.why);
        });
        f.code
    }

    /// Queues `unit` for the worker: `ncclSuccess`, or `ncclInProgress` for a non-blocking
    /// communicator. Refused if the communicator failed meanwhile (the unit is dropped).
    pub fn enqueue(&self, unit: Unit) -> NcclResult {
        let refused = self.shared.update(|s| {
            if let Some(why) = s.broken.as_ref().or(s.async_error.as_ref().map(|e| &e.1)) {
                return Err((unit, why.clone()));
            }
            s.queue.push_back(unit);
            Ok(())
        });
        match refused {
            Ok(()) if self.blocking() => SUCCESS,
            Ok(()) => IN_PROGRESS,
            Err((unit, why)) => {
                drop(unit);
                fail(
                    INVALID_USAGE,
                    Some(self.rank()),
                    &format!(
                        "a call on a communicator that already failed ({why}): it can only be destroyed or aborted"
                    ),
                )
            }
        }
    }

    /// Stops the worker (at its next look, within a few ms), waits for it, and drops the
    /// queued work: the streams become idle and the frees deferred behind it happen.
    fn stop(&mut self) {
        self.shared.abort.store(true, Ordering::Release);
        self.shared.update(|_| ());
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
        let dropped = self.shared.update(|s| std::mem::take(&mut s.queue));
        drop(dropped);
    }
}

/// Looks up a communicator handed in by the caller for a new call: live, joined, not
/// broken, not failed, not finalized.
pub fn usable<'a>(comm: *mut Comm, call: &str) -> Result<&'a Comm, NcclResult> {
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
    let c = unsafe { &*comm };
    let s = c.shared.state();
    let refusal = if let Some(why) = s.broken.as_ref().or(s.async_error.as_ref().map(|e| &e.1)) {
        Some((
            INVALID_USAGE,
            format!("{call} on a communicator that already failed ({why}): it can only be destroyed or aborted"),
        ))
    } else if s.finalized {
        Some((INVALID_USAGE, format!("{call} on a finalized communicator")))
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
    };
    drop(s);
    match refusal {
        Some((code, why)) => Err(fail(code, Some(c.rank()), &why)),
        None => Ok(c),
    }
}

// ---------------------------------------------------------------------------------
// Making communicators.

/// `ncclConfig_t` as cudarc's NCCL 2.22-2.25 bindings lay it out (`ncclConfig_v21700`).
#[repr(C)]
pub struct Config {
    size: usize,
    magic: c_uint,
    version: c_uint,
    blocking: c_int,
    cga_cluster_size: c_int,
    min_ctas: c_int,
    max_ctas: c_int,
    net_name: *const c_char,
    split_share: c_int,
}

/// `NCCL_CONFIG_INITIALIZER`'s magic number.
const CONFIG_MAGIC: c_uint = 0xcafe_beef;
/// `NCCL_CONFIG_UNDEF_INT`: a field left at its default.
const UNDEF_INT: c_int = c_int::MIN;

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
/// (`NCCL_CONFIG_UNDEF_INT`) or a NULL config behave as `ncclCommInitRank`. A config not
/// made by `NCCL_CONFIG_INITIALIZER` (wrong magic) is refused with `ncclInvalidArgument`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommInitRankConfig(
    out: *mut *mut Comm,
    nranks: c_int,
    id: UniqueId,
    rank: c_int,
    config: *mut Config,
) -> NcclResult {
    entry("ncclCommInitRankConfig", INTERNAL_ERROR, || {
        if !allowed() {
            return SYSTEM_ERROR;
        }
        let who = usize::try_from(rank).ok();
        let blocking = if config.is_null() {
            true
        } else {
            // SAFETY: the caller's config, as NCCL reads it.
            let c = unsafe { &*config };
            if c.magic != CONFIG_MAGIC {
                return fail(
                    INVALID_ARGUMENT,
                    who,
                    &format!(
                        "ncclCommInitRankConfig: the config's magic is {:#x}, not {CONFIG_MAGIC:#x}: initialise it with \
                         NCCL_CONFIG_INITIALIZER",
                        c.magic
                    ),
                );
            }
            match c.blocking {
                0 => false,
                1 | UNDEF_INT => true,
                b => {
                    return fail(
                        INVALID_ARGUMENT,
                        who,
                        &format!("ncclCommInitRankConfig: config.blocking is {b}: it must be 0 or 1"),
                    );
                }
            }
        };
        init(out, nranks, &id, rank, blocking, "ncclCommInitRankConfig")
    })
}

/// Both inits: the checks of the call, then the join (waited for if `blocking`).
fn init(out: *mut *mut Comm, nranks: c_int, id: &UniqueId, rank: c_int, blocking: bool, name: &str) -> NcclResult {
    if !allowed() {
        return SYSTEM_ERROR;
    }
    let who = usize::try_from(rank).ok();
    if out.is_null() {
        return fail(INVALID_ARGUMENT, who, &format!("{name}: comm is NULL"));
    }
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
    let room_name: String = id.internal[8..24].iter().map(|b| format!("{b:02x}")).collect();
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
    let duplicate = |a: usize, b: usize| {
        Failure::new(
            INVALID_USAGE,
            format!(
                "Duplicate GPU detected : rank {a} and rank {b} both on CUDA device {} (host \"{}\"; NCCL refuses \
                 two ranks of one host on one GPU)",
                cards[a].bus_id, cards[a].host
            ),
        )
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
        if i != me && c.host == mine.host && c.bus_id == mine.bus_id {
            return Err(duplicate(me, i).into());
        }
    }
    // A rank on no shared GPU fails alike (real NCCL would leave it waiting for the
    // others, which failed): naming the first pair.
    for a in 0..cards.len() {
        for b in a + 1..cards.len() {
            if cards[a].host == cards[b].host && cards[a].bus_id == cards[b].bus_id {
                return Err(duplicate(a, b).into());
            }
        }
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
            None if !s.joined => IN_PROGRESS,
            None if s.finalized && !s.settled() => IN_PROGRESS,
            None => SUCCESS,
        };
        unsafe { *async_error = state };
        SUCCESS
    })
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
#[unsafe(no_mangle)]
pub extern "C" fn ncclCommAbort(comm: *mut Comm) -> NcclResult {
    entry("ncclCommAbort", INTERNAL_ERROR, || end(comm, "ncclCommAbort", false))
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
    c.stop();
    c.shared.room.leave();
    SUCCESS
}
