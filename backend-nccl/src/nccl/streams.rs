//! Two streams, as PyTorch's ProcessGroupNCCL keeps them, for `Session::overlap`:
//! the rank's stream, where its computation and copies run (PyTorch's current stream),
//! and a communication stream of the communicator's own, where the collectives go while
//! the overlap is open. Events order the two:
//! - before a collective, an event recorded on the compute stream, which the
//!   communication stream waits for (`cuStreamWaitEvent`): the collective starts once the
//!   computation issued before it (the gradients it reduces) is done, and not before;
//! - after it, an event on the communication stream: its wait polls that event
//!   (`cuEventQuery`, under the deadline), then makes the compute stream wait for it too,
//!   as `Work::wait()` does, so that what computes on the result comes after it.
//!
//! Between the two, the GPU runs the collective and the computation side by side.
//! Computation here is the workbook's one kernel ([`super::kernel`]).

use super::Nccl;
use crate::calls::{Call, Label};
use crate::progress::check;
use anyhow::{Context, Result, anyhow};
use cudarc::driver::CudaStream;
use cudarc::driver::sys::{self as cu, CUevent, cudaError_enum as Cu};
use std::sync::Arc;

/// A collective issued on the communication stream: the event recorded after it.
pub struct Issued {
    event: CUevent,
    what: Label,
}

impl Nccl {
    /// Opens the communication stream: collectives go there until
    /// [`Nccl::close_comm_stream`].
    pub fn open_comm_stream(&self) -> Result<()> {
        if self.side.borrow().is_some() {
            return Err(anyhow!("rank {}: a communication stream is open already", self.rank));
        }
        let stream = self
            .stream
            .context()
            .new_stream()
            .with_context(|| format!("rank {}: making the communication stream", self.rank))?;
        self.shown.show(
            &Call::new("", "cuStreamCreate").ptr("phStream", stream.cu_stream()),
            Some(&super::CUDA_SUCCESS),
            "the communication stream: the collectives go there, the computation stays on the rank's stream",
        );
        self.side.replace(Some(stream));
        Ok(())
    }

    /// Closes it, once what was issued there has finished; collectives go to the rank's
    /// stream again.
    pub fn close_comm_stream(&self) -> Result<()> {
        self.synchronize()?;
        self.side.replace(None);
        Ok(())
    }

    /// Lets it go without waiting (the communicator was aborted after a failure: its
    /// work is stopped).
    pub fn forget_comm_stream(&self) {
        self.side.replace(None);
    }

    /// The stream NCCL's calls go to now: the communication stream while one is open.
    pub(super) fn calls_stream(&self) -> Arc<CudaStream> {
        self.side.borrow().clone().unwrap_or_else(|| self.stream.clone())
    }

    /// Orders what is issued on the communication stream next (a collective) after the
    /// work issued on the compute stream so far: an event recorded there, which the
    /// communication stream waits for.
    pub fn issue_after_compute(&self) -> Result<()> {
        let side = self
            .side
            .borrow()
            .clone()
            .ok_or_else(|| anyhow!("rank {}: no communication stream is open", self.rank))?;
        let ready = self.record(
            &self.stream,
            "the computation issued so far: the collective waits for it",
        )?;
        let waits = self.stream_waits(&side, ready, "the communication stream waits for it");
        self.destroy(ready);
        waits
    }

    /// The collective `what` was just issued on the communication stream: the event after
    /// it, which its wait polls.
    pub fn issued(&self, what: &str) -> Result<Issued> {
        let side = self.calls_stream();
        let event = self.record(&side, "after the collective: its wait polls this event")?;
        Ok(Issued {
            event,
            what: Label::of(what.to_string()),
        })
    }

    /// Waits until the collective `issued` has finished (polling its event, under the
    /// deadline, as every wait here does); the compute stream's later work is ordered
    /// after it.
    pub fn wait_issued(&self, issued: Issued) -> Result<()> {
        let event = issued.event;
        let poll = super::wait::Poll {
            call: Call::new("", "cuEventQuery").ptr("hEvent", event),
            done: &super::CUDA_SUCCESS,
            until: format!("until {} had finished", issued.what),
        };
        let what = issued.what.clone();
        self.wait(
            move |s| {
                format!(
                    "the GPU to finish {what} on the communication stream ({})",
                    s.last.borrow()
                )
            },
            poll,
            move |s| s.event_done(event),
        )?;
        self.stream_waits(
            &self.stream,
            event,
            "the compute stream's next work comes after the collective (Work::wait)",
        )?;
        self.destroy(event);
        Ok(())
    }

    /// Whether the work before `event` is done (`cuEventQuery`).
    fn event_done(&self, event: CUevent) -> Result<bool> {
        // SAFETY: an event of this rank's context, current on this thread, not destroyed.
        self.finished(unsafe { cu::cuEventQuery(event) })
    }

    /// Whether the communication stream, if one is open, has finished what it was given.
    pub(super) fn comm_stream_idle(&self) -> Result<bool> {
        let Some(side) = self.side.borrow().clone() else {
            return Ok(true);
        };
        // SAFETY: a stream of this rank's context, current on this thread.
        self.finished(unsafe { cu::cuStreamQuery(side.cu_stream()) })
    }

    /// What a `cuStreamQuery` or `cuEventQuery` answered: done, not yet, or the GPU failed.
    pub(super) fn finished(&self, r: cu::CUresult) -> Result<bool> {
        match r {
            Cu::CUDA_SUCCESS => Ok(true),
            Cu::CUDA_ERROR_NOT_READY => Ok(false),
            e => Err(anyhow!("the GPU failed while running {}: {e:?}", self.last.borrow())),
        }
    }

    /// A new event recorded on `stream` now (shown with `note`).
    fn record(&self, stream: &CudaStream, note: &str) -> Result<CUevent> {
        let mut event = std::ptr::null_mut();
        // SAFETY: a place for the new event; this rank's context is current.
        check(
            unsafe { cu::cuEventCreate(&mut event, cu::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32) },
            "cuEventCreate",
        )
        .with_context(|| format!("rank {}", self.rank))?;
        // SAFETY: the event just made, and a stream of this rank's context.
        if let Err(e) = check(unsafe { cu::cuEventRecord(event, stream.cu_stream()) }, "cuEventRecord") {
            self.destroy(event);
            return Err(e.context(format!("rank {}", self.rank)));
        }
        self.shown.show(
            &Call::new("", "cuEventRecord")
                .ptr("hEvent", event)
                .ptr("hStream", stream.cu_stream()),
            Some(&super::CUDA_SUCCESS),
            note,
        );
        Ok(event)
    }

    /// Makes `stream`'s later work wait for `event` (shown with `note`).
    fn stream_waits(&self, stream: &CudaStream, event: CUevent, note: &str) -> Result<()> {
        // SAFETY: a stream and an event of this rank's context, current on this thread.
        check(
            unsafe { cu::cuStreamWaitEvent(stream.cu_stream(), event, 0) },
            "cuStreamWaitEvent",
        )
        .with_context(|| format!("rank {}", self.rank))?;
        self.shown.show(
            &Call::new("", "cuStreamWaitEvent")
                .ptr("hStream", stream.cu_stream())
                .ptr("hEvent", event)
                .arg("Flags", 0),
            Some(&super::CUDA_SUCCESS),
            note,
        );
        Ok(())
    }

    /// Destroys an event (a wait already recorded on a stream keeps its meaning).
    fn destroy(&self, event: CUevent) {
        // SAFETY: an event of this rank's context, not used after this.
        unsafe { cu::cuEventDestroy_v2(event) };
    }
}
