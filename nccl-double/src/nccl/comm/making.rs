//! Making communicators: `ncclCommInitRank`, `ncclCommInitRankConfig` and `ncclCommSplit`,
//! each starting the communicator's worker thread, which joins the job (every rank's card
//! published and read, NCCL's checks when all have joined: one rank per GPU, one NCCL
//! version) and then runs the queued work in issue order.

use super::{Comm, Shared, State, comms, ensure_ready, live_comm, usable};
use crate::driver::current_device;
use crate::exchange::{Card, Failure, Halt, Room, Wanted};
use crate::nccl::work::{self, Progress};
use crate::nccl::{
    IN_PROGRESS, INTERNAL_ERROR, INVALID_ARGUMENT, INVALID_USAGE, MAGIC, NcclResult, SUCCESS, SYSTEM_ERROR, UniqueId,
    fail, group,
};
use crate::{allowed, devices, entry};
use std::collections::BTreeSet;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};

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
/// read as NCCL of the played version reads it ([`crate::nccl::config`]): a wrong magic, or
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
            match unsafe { crate::nccl::config::read(config as *const u8, "ncclCommInitRankConfig") } {
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
        let note = if crate::version::version() < 21900 {
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
            match unsafe { crate::nccl::config::read(config as *const u8, "ncclCommSplit") } {
                Ok(cfg) => cfg.blocking.unwrap_or(true),
                Err(f) => return fail(f.code, who, &f.why),
            }
        };
        // The child's config, read over by the environment (`envConfigOverride(childComm)`).
        let (blocking, _) = crate::nccl::config::env_override(blocking, false);
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
    let (blocking, _) = crate::nccl::config::env_override(blocking, false);
    let who = usize::try_from(rank).ok();
    if out.is_null() {
        return fail(INVALID_ARGUMENT, who, &format!("{name}: comm is NULL"));
    }
    crate::nccl::stats_at_exit();
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
    crate::nccl::debug::open();
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
    let version = crate::version::version();
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
    crate::nccl::transport_lines::print(shared.device, me, &cards); // NCCL connects its rings, then tunes
    // Then NCCL tunes its model: NCCL_ALGO and NCCL_PROTO are read there.
    if let Some(e) = crate::nccl::tuning::check_init(shared.device, shared.rank, shared.nranks)? {
        let _ = shared.tuned.set(e);
    }
    Ok(())
}
