//! The calls queued on the stream: each NCCL call run and its result dealt with (in
//! progress: polled; an error: the communicator aborted), an event after each so that a
//! wait can tell progress from a hang, at most [`MAX_QUEUED`] in flight, groups
//! (`ncclGroupStart`/`ncclGroupEnd`), sends and receives.

use super::wait::{LOST_GRACE, Poll};
use super::{DeviceBuffer, Nccl, NcclName};
use crate::calls::{Call, Label};
use crate::element::Element;
use anyhow::{Context, Result, anyhow};
use cudarc::driver::{DevicePtr, DevicePtrMut};
use cudarc::nccl::sys::{self, ncclResult_t};
use std::ffi::{c_int, c_void};

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
pub(super) const MAX_QUEUED: usize = 256;

/// How often (in collectives) NCCL's lines are read, so that they never pile up.
pub(super) const LOG_EVERY: u64 = 1024;

impl Nccl {
    /// Sends the whole buffer to `peer` (`ncclSend`).
    pub fn send<T: Element>(&self, buf: &DeviceBuffer<T>, peer: usize) -> Result<()> {
        let count = buf.len();
        let (src, _read) = buf.bytes.device_ptr(self.stream.as_ref());
        let call = Call::new(format!("send to rank {peer}"), "ncclSend")
            .peer(peer)
            .ptr("sendbuff", src as *const c_void)
            .arg("count", count)
            .named("datatype", T::TYPE.nccl())
            .arg("peer", peer)
            .bytes(count * size_of::<T>());
        self.call(call, |comm, stream| {
            // SAFETY: `src` is `buf`'s device memory on this GPU, `count` elements of T
            // (NCCL reads them as T::TYPE: Element's contract), recorded as read by the
            // stream (cudarc frees it in stream order, after the send); comm and stream are
            // Nccl::call's, live.
            unsafe { sys::ncclSend(src as _, count, T::TYPE.nccl(), peer as c_int, comm, stream) }
        })
    }

    /// Receives the whole buffer from `peer` (`ncclRecv`).
    pub fn recv<T: Element>(&self, buf: &mut DeviceBuffer<T>, peer: usize) -> Result<()> {
        let count = buf.len();
        let (dst, _written) = buf.bytes.device_ptr_mut(self.stream.as_ref());
        let call = Call::new(format!("receive from rank {peer}"), "ncclRecv")
            .peer(peer)
            .ptr("recvbuff", dst as *const c_void)
            .arg("count", count)
            .named("datatype", T::TYPE.nccl())
            .arg("peer", peer)
            .bytes(count * size_of::<T>());
        self.call(call, |comm, stream| {
            // SAFETY: `dst` is `buf`'s device memory on this GPU, `count` elements of T
            // (NCCL writes them as T::TYPE: Element's contract), held mutably for this call
            // and recorded as written by the stream; comm and stream are Nccl::call's, live.
            unsafe { sys::ncclRecv(dst as _, count, T::TYPE.nccl(), peer as c_int, comm, stream) }
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
    pub(super) fn under_deadline<R>(&self, f: impl FnOnce() -> R) -> R {
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

    /// Runs one NCCL call (`f`, given the communicator and the stream) and deals with
    /// its result; `call` names it and its arguments, for messages and `--show-calls`.
    pub fn call(&self, call: Call, f: impl FnOnce(sys::ncclComm_t, sys::cudaStream_t) -> ncclResult_t) -> Result<()> {
        let what = call.label();
        let comm = self.active(&what)?;
        let stream = self.calls_stream().cu_stream() as sys::cudaStream_t;
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
        let stream = self.calls_stream();
        let (event, queued) = {
            let mut p = self.progress.borrow_mut();
            let event = p
                .queued(&what, bytes, ops, &stream)
                .with_context(|| format!("rank {}: marking the stream's progress", self.rank))?;
            (event, p.len())
        };
        if let Some(event) = event {
            self.shown.show(
                &Call::new("", "cuEventRecord")
                    .ptr("hEvent", event)
                    .ptr("hStream", stream.cu_stream()),
                Some(&super::CUDA_SUCCESS),
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
    pub(super) fn called(&self, r: ncclResult_t, what: impl std::fmt::Display) -> Result<()> {
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

    /// The communicator calls go to now: the timed loops' blocking one inside a timed
    /// loop, else the first one; an error if it was already left.
    pub(super) fn active(&self, what: impl std::fmt::Display) -> Result<sys::ncclComm_t> {
        let comm = self.live(what)?;
        match self.in_timed_loop.get() && !self.timed.get().is_null() {
            true => Ok(self.timed.get()),
            false => Ok(comm),
        }
    }

    /// The communicator, or an error if it was already left.
    pub(super) fn live(&self, what: impl std::fmt::Display) -> Result<sys::ncclComm_t> {
        let comm = self.comm.get();
        if comm.is_null() {
            return Err(anyhow!(
                "rank {}: {what} after the communicator was ended (aborted after a failure, or closed)",
                self.rank
            ));
        }
        Ok(comm)
    }
}

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
