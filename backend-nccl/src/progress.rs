//! What a rank has queued on its GPU and not yet seen finish, and how far the GPU got.
//!
//! NCCL's calls return as soon as their work is queued on the stream; the GPU runs it
//! later, in order. A rank may queue many operations before it waits (a timed loop queues
//! hundreds), so "the wait took longer than `--timeout`" says nothing: 256 all-reduces of
//! 80 ms each take 20 s while progressing all along. What a deadline must mean is
//! "nothing finished for `--timeout`". So, as PyTorch's NCCL watchdog does with its work
//! objects, operations are followed by CUDA events (`cuEventRecord` after the call; the
//! event completes when everything queued before it has): a wait asks the oldest events
//! (`cuEventQuery`) and restarts its clock whenever one completed.
//!
//! An event costs about a microsecond of the host's time, as much as a small collective's
//! launch: so outside timed loops every operation gets one (a stuck rank names the exact
//! operation it waits for), and inside them only operations of a MiB or more, and every
//! 16th smaller one (the timing stays nccl-tests', whose loop records no event).

use super::calls::Label;
use anyhow::{Result, anyhow};
use cudarc::driver::CudaStream;
use cudarc::driver::sys::{self as cu, CUevent, cudaError_enum as Cu};
use std::collections::VecDeque;

/// Inside a timed loop, an operation smaller than this gets an event only every
/// [`EVERY_SMALL`] operations.
pub const LARGE: usize = 1 << 20;
/// See [`LARGE`].
pub const EVERY_SMALL: u32 = 16;

/// The operations queued and not yet seen finished, oldest first, with their events.
#[derive(Default)]
pub struct Progress {
    /// Runs of operations, oldest first, each ending with its event (but maybe the last).
    ops: VecDeque<Queued>,
    /// How many operations they hold.
    count: usize,
    /// Events made and free to record again.
    spare: Vec<CUevent>,
    /// Operations queued since the last event.
    unmarked: u32,
    /// Inside a timed loop: events only now and then (see the module's doc).
    sparse: bool,
}

/// A run of operations: what the first is called in messages, how many there are, and
/// the event recorded after the last (none yet: more may join the run).
struct Queued {
    what: Label,
    /// How many operations `what` is (a group's calls, or 1).
    first: usize,
    ops: usize,
    event: Option<CUevent>,
}

impl Progress {
    /// How many operations are queued and not yet seen finished.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Inside a timed loop or not (see the module's doc).
    pub fn sparse(&mut self, on: bool) {
        self.sparse = on;
    }

    /// Notes `ops` operations (one call, or a group's calls) of `bytes` just queued on
    /// `stream` as `what`, and records an event after them when they should have one:
    /// that event, if so.
    pub fn queued(&mut self, what: &Label, bytes: usize, ops: usize, stream: &CudaStream) -> Result<Option<CUevent>> {
        self.unmarked += 1;
        self.count += ops;
        match self.ops.back_mut() {
            Some(run) if run.event.is_none() => run.ops += ops,
            _ => self.ops.push_back(Queued {
                what: what.clone(),
                first: ops,
                ops,
                event: None,
            }),
        }
        let mark = !self.sparse || bytes >= LARGE || self.unmarked >= EVERY_SMALL;
        if mark {
            self.unmarked = 0;
            let event = match self.spare.pop() {
                Some(e) => e,
                None => {
                    let mut e = std::ptr::null_mut();
                    // SAFETY: a place for the new event; the stream's context is current.
                    check(
                        unsafe { cu::cuEventCreate(&mut e, cu::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32) },
                        "cuEventCreate",
                    )?;
                    e
                }
            };
            // SAFETY: an event of this context, and the stream the operation was queued on.
            if let Err(e) = check(unsafe { cu::cuEventRecord(event, stream.cu_stream()) }, "cuEventRecord") {
                self.spare.push(event);
                return Err(e);
            }
            if let Some(run) = self.ops.back_mut() {
                run.event = Some(event);
            }
            return Ok(Some(event));
        }
        Ok(None)
    }

    /// Forgets the operations the GPU has finished, as far as the events tell: whether
    /// any was (the GPU progressed since the last look).
    pub fn advance(&mut self) -> Result<bool> {
        // The last operation known finished: the newest whose event completed, looking
        // from the oldest and stopping at the first that has not.
        let mut done = None;
        for (i, run) in self.ops.iter().enumerate() {
            let Some(event) = run.event else { continue };
            // SAFETY: an event this rank made and recorded; the context is current.
            match unsafe { cu::cuEventQuery(event) } {
                Cu::CUDA_SUCCESS => done = Some(i),
                Cu::CUDA_ERROR_NOT_READY => break,
                e => return Err(anyhow!("the GPU failed while running {}: {e:?}", run.what)),
            }
        }
        let Some(last) = done else { return Ok(false) };
        for run in self.ops.drain(..=last) {
            self.count -= run.ops;
            self.spare.extend(run.event);
        }
        Ok(true)
    }

    /// Everything queued has finished (the stream is idle).
    pub fn all_done(&mut self) {
        for run in self.ops.drain(..) {
            self.spare.extend(run.event);
        }
        (self.count, self.unmarked) = (0, 0);
    }

    /// The operation waited for, for messages: the oldest not seen finished ("all-reduce
    /// (ncclAllReduce)", "... and the 36 queued after it"), or `last` if none is queued.
    pub fn waited_for(&self, last: &Label) -> String {
        match (self.ops.front(), self.count) {
            (None, _) => last.to_string(),
            (Some(run), n) if n <= run.first => run.what.to_string(),
            (Some(run), n) => format!("{} (and the {} queued after it)", run.what, n - run.first),
        }
    }

    /// The send or receive waited for, if the oldest operation not seen finished is one:
    /// `(sending, peer)`.
    pub fn waited_send_or_recv(&self) -> Option<(bool, usize)> {
        self.ops.front()?.what.send_or_recv()
    }

    /// Destroys the events (the context must be current): at the end of the rank.
    pub fn release(&mut self) {
        self.all_done();
        for event in self.spare.drain(..) {
            // SAFETY: an event this rank made, not recorded on any pending work any more
            // (or the communicator was aborted); the context is current.
            unsafe { cu::cuEventDestroy_v2(event) };
        }
    }
}

pub(crate) fn check(r: cu::CUresult, call: &str) -> Result<()> {
    match r {
        Cu::CUDA_SUCCESS => Ok(()),
        e => Err(anyhow!("{call} failed: {e:?}")),
    }
}
