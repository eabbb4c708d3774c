//! A communicator's life: joined (`ncclCommInitRankConfig`, after the GPU's context,
//! the GPUs compared and the unique id shared), split (`ncclCommSplit`: a split of the
//! user's, a renewed one per sweep, the timed loops' blocking one), closed
//! (`ncclCommFinalize`, `ncclCommDestroy`) or, on a failure, aborted (`ncclCommAbort`,
//! under a deadline of its own).

use super::config::{CONFIG_SIZE, config};
use super::{CUDA_SUCCESS, Nccl, TUNING_VARS};
use crate::calls::{Call, Label, Shown};
use crate::device::gpu::{Gpu, identify};
use crate::progress::Progress;
use crate::rendezvous::Store;
use crate::watchdog::Watchdog;
use anyhow::{Context, Result, anyhow};
use cudarc::driver::{CudaContext, CudaStream};
use cudarc::nccl::sys::{self, ncclResult_t};
use std::cell::{Cell, RefCell};
use std::ffi::{c_char, c_int};
use std::sync::Arc;
use std::time::Duration;

/// How long `ncclCommAbort` may take before the process ends without it: a healthy abort
/// takes milliseconds; the launcher waits 3 s for the other ranks after a failure.
const ABORT_DEADLINE: Duration = Duration::from_secs(2);

/// NCCL's `NCCL_SPLIT_NOCOLOR`: a rank that calls `ncclCommSplit` with it joins no
/// communicator (its `newcomm` is NULL).
pub const NOCOLOR: c_int = -1;

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
            spin: RefCell::new(None),
            side: RefCell::new(None),
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
    pub(super) fn abort(&self, failure: Option<&anyhow::Error>) {
        self.stuck.borrow_mut().take();
        self.grouped.borrow_mut().clear();
        let rank = self.rank;
        // The rank's failure, said once for every communicator it holds: a split's, or the
        // world's dropped after the split's was abandoned, would otherwise end without it.
        let mut first = FAILURE.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = failure {
            first.get_or_insert_with(|| crate::error::line(Some(rank), e));
        }
        let said = match first.as_ref() {
            Some(line) => format!("{line}; then"),
            None => format!("error: rank {rank}: ending with its NCCL communicator open:"),
        };
        drop(first);
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
}

/// What made this rank fail, the first time one of its communicators was abandoned
/// ([`Nccl::abandon`]): the line every later abort of its communicators repeats.
static FAILURE: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

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

/// NCCL's unique id as `--show-calls` shows it: its size and first bytes.
fn id_bytes(bytes: &[u8]) -> String {
    let first: Vec<String> = bytes.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("{{{} bytes: {} …}}", bytes.len(), first.join(" "))
}
