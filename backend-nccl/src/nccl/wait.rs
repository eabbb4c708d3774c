//! The waits: every wait for the GPU or for NCCL is a loop that polls (`cuStreamQuery`,
//! `ncclCommGetAsyncError`) and watches all the while (NCCL's errors, lost and silent
//! ranks, the deadline from the last progress), and aborts the communicator when it
//! fails, naming who failed.

use super::{CUDA_SUCCESS, Nccl};
use crate::calls::Call;
use anyhow::Result;
use cudarc::nccl::sys::{self, ncclResult_t};
use std::time::{Duration, Instant};
use workbook_runtime::failure::{self, Fact};

/// How long a rank whose NCCL failed asks the store whether a peer died (and caused it).
pub(super) const LOST_GRACE: Duration = Duration::from_secs(1);

impl Nccl {
    /// Waits until every operation queued on this rank's stream has finished.
    pub fn synchronize(&self) -> Result<()> {
        let since = Instant::now();
        let done = self.wait_idle();
        self.waited.set(self.waited.get() + since.elapsed());
        done
    }

    /// The time this rank spent waiting for its GPU so far ([`Nccl::synchronize`]).
    pub fn waited(&self) -> Duration {
        self.waited.get()
    }

    fn wait_idle(&self) -> Result<()> {
        let waited_for = |s: &Self| s.progress.borrow().waited_for(&s.last.borrow());
        let poll = Poll {
            call: Call::new("", "cuStreamQuery").ptr("hStream", self.stream.cu_stream()),
            done: &CUDA_SUCCESS,
            until: format!("until the GPU had finished {}", self.last.borrow()),
        };
        self.wait(
            |s| format!("the GPU to finish {}", waited_for(s)),
            poll,
            |s| s.stream_idle(),
        )?;
        self.progress.borrow_mut().all_done();
        Ok(())
    }

    /// Polls `ready` until it says yes, watching all the while: NCCL's own errors, lost
    /// ranks, silent ranks and the deadline end the wait, and abort the communicator.
    /// The deadline counts from the last progress: each time an operation of the queue is
    /// seen finished ([`Progress`](crate::progress::Progress)), the clock starts again, and `what` (what is waited
    /// for) is asked again. `poll` is the call `ready` makes, shown once the wait is over.
    pub(super) fn wait(
        &self,
        what: impl Fn(&Self) -> String,
        poll: Poll,
        mut ready: impl FnMut(&Self) -> Result<bool>,
    ) -> Result<()> {
        let since = Instant::now();
        let mut progressed = since;
        let mut waited_for = what(self);
        let mut dog = self.watchdog.borrow_mut();
        dog.reset();
        let mut pause = Duration::ZERO;
        let mut polls = 0u64;
        loop {
            polls += 1;
            let turn = ready(self).and_then(|done| {
                if !done {
                    if self.progress.borrow_mut().advance()? {
                        progressed = Instant::now();
                        waited_for = what(self);
                        dog.reset();
                    }
                    self.async_state()?;
                    dog.check(since, progressed, &waited_for)?;
                } else {
                    // A call that failed leaves nothing running: the stream is idle at
                    // once, and only the communicator's error says that it failed.
                    self.async_state()?;
                }
                Ok(done)
            });
            match turn {
                Ok(true) => {
                    let times = match polls {
                        1 => "once".to_string(),
                        n => format!("{n} times in {} µs", since.elapsed().as_micros()),
                    };
                    self.shown
                        .show(&poll.call, Some(poll.done), &format!("polled {times}, {}", poll.until));
                    return Ok(());
                }
                Ok(false) => {}
                Err(e) => {
                    // NCCL's own error (a peer's socket closed) often comes before the
                    // store's word that the peer died: ask the store, briefly, who.
                    let e = match crate::error::names_culprit(&e) {
                        false => dog.name_the_lost(e, &waited_for, LOST_GRACE),
                        true => e,
                    };
                    let mut e = e.context(format!("rank {}", self.rank));
                    // The send or receive stuck, for the failure's record.
                    if let Some((sending, peer)) = self.progress.borrow().waited_send_or_recv() {
                        e = failure::attach(
                            e,
                            Fact::Waiting {
                                sending,
                                peer,
                                on_gpu: true,
                            },
                        );
                    }
                    self.abort(Some(&e));
                    return Err(e);
                }
            }
            // In a timed loop, poll as nccl-tests' testStreamSynchronize does, yielding the
            // core between looks: a sleep would add up to its length to the time measured.
            // Elsewhere, spin a little (small collectives finish in microseconds), then
            // sleep longer and longer, up to a millisecond: a rank that waits long costs no CPU.
            if self.in_timed_loop.get() {
                std::thread::yield_now();
            } else if pause.is_zero() && since.elapsed() < Duration::from_micros(200) {
                std::hint::spin_loop();
            } else {
                pause = (pause * 2).clamp(Duration::from_micros(20), Duration::from_millis(1));
                std::thread::sleep(pause);
            }
        }
    }

    /// Whether the GPU has finished everything queued on the stream, and on the
    /// communication stream if one is open (`cuStreamQuery`).
    fn stream_idle(&self) -> Result<bool> {
        // SAFETY: the stream belongs to this rank's context, current on this thread.
        let idle = self.finished(unsafe { cudarc::driver::sys::cuStreamQuery(self.stream.cu_stream()) })?;
        Ok(idle && self.comm_stream_idle()?)
    }

    /// NCCL's asynchronous state (`ncclCommGetAsyncError`): success or in progress, or an
    /// error reported after the call that caused it (a peer lost, a network failure).
    pub(super) fn async_state(&self) -> Result<ncclResult_t> {
        let comm = self.active("ncclCommGetAsyncError")?;
        let mut state = ncclResult_t::ncclSuccess;
        // SAFETY: a live communicator and a valid place for the answer.
        let r = unsafe { sys::ncclCommGetAsyncError(comm, &mut state) };
        if r != ncclResult_t::ncclSuccess {
            return Err(self.error(r, "asking NCCL for its state (ncclCommGetAsyncError)"));
        }
        match state {
            ncclResult_t::ncclSuccess | ncclResult_t::ncclInProgress => Ok(state),
            error => Err(self.error(error, self.last.borrow())),
        }
    }
}

/// The call a wait polls, for `--show-calls`: what it returns once ready, and what the
/// wait was for.
pub(super) struct Poll {
    pub(super) call: Call,
    pub(super) done: &'static dyn std::fmt::Debug,
    pub(super) until: String,
}
