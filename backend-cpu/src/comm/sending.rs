//! How a ring step's message travels: cut into slices its link can buffer ([`slices`]),
//! or, where the link buffers little (a large message over TCP), handed whole to the
//! communicator's send thread ([`Comm::send_aside`]) while this rank receives, as NCCL's
//! proxy thread sends over the network.

use super::Comm;
use crate::transport::Link;
use std::ops::Range;
use std::sync::{Arc, mpsc};
use std::thread;

/// A link that buffers at least this much gets ring steps in slices, in one thread.
const MIN_SLICE: usize = 256 << 10;

impl Comm {
    /// Hands `out` to this communicator's send thread for `to`, started on first use
    /// (a thread started per step cost about 300 µs a step where 8 ranks share 2 cores, as
    /// much as the step's message). `None` where the thread cannot be had: the caller
    /// sends from a thread of its own.
    pub(super) fn send_aside<'a>(&self, tag: u8, out: &'a [u8], to: usize) -> Option<Sending<'a>> {
        let jobs = self.send_thread.get_or_init(start_send_thread).as_ref()?;
        let link = self.links[to].clone()?;
        let (done, result) = mpsc::sync_channel(1);
        let job = SendJob {
            link,
            tag,
            data: out.as_ptr(),
            len: out.len(),
            done,
        };
        jobs.send(job).ok()?;
        Some(Sending {
            result,
            waited: false,
            _out: std::marker::PhantomData,
        })
    }
}

/// How a message of `len` bytes over `link` is cut: into slices the link can buffer
/// when that is a useful amount (at least [`MIN_SLICE`]), else whole. Both ends of a link
/// cut alike, since they see the same kind of link. Always at least one slice, maybe empty.
pub(super) fn slices(len: usize, link: &dyn Link) -> Slices {
    let size = match link.eager_limit() {
        e if e >= MIN_SLICE => e,
        _ => len.max(1),
    };
    Slices { len, size }
}

/// One message for the send thread ([`Comm::send_aside`]): `len` bytes at `data`, for
/// `link`, and where to say how it went.
pub(super) struct SendJob {
    link: Arc<dyn Link>,
    tag: u8,
    data: *const u8,
    len: usize,
    done: mpsc::SyncSender<std::io::Result<()>>,
}

// SAFETY: `data` points to `len` bytes that the [`Sending`] made with the job borrows for
// its whole life, and a `Sending` does not end (even while unwinding) before the thread
// has answered on `done` or is gone: the bytes live, unchanged, while the thread reads
// them. The rest of the job is `Send` as it is.
unsafe impl Send for SendJob {}

/// A message being sent by the send thread: [`Sending::wait`] says how it went. Borrows
/// the message's bytes until then; dropped unwaited (a receive that panicked), it still
/// waits, so that the thread never reads bytes given back.
pub(super) struct Sending<'a> {
    result: mpsc::Receiver<std::io::Result<()>>,
    waited: bool,
    _out: std::marker::PhantomData<&'a [u8]>,
}

impl Sending<'_> {
    /// Waits until the message is sent, or its send failed.
    pub(super) fn wait(mut self) -> std::io::Result<()> {
        self.waited = true;
        self.result
            .recv()
            .unwrap_or_else(|_| Err(std::io::Error::other("the sending thread stopped")))
    }
}

impl Drop for Sending<'_> {
    fn drop(&mut self) {
        if !self.waited {
            // The thread answers, or drops `done` if it stops: either ends the wait.
            let _ = self.result.recv();
        }
    }
}

/// The send thread of a communicator: sends each job's message in turn and answers how
/// it went, until the communicator drops its end. `None` where no thread can be started.
fn start_send_thread() -> Option<mpsc::Sender<SendJob>> {
    let (jobs, queue) = mpsc::channel::<SendJob>();
    thread::Builder::new()
        .name("send".into())
        .spawn(move || {
            for job in queue {
                // SAFETY: as `SendJob` says, the bytes live and stay unchanged until the
                // answer below.
                let data = unsafe { std::slice::from_raw_parts(job.data, job.len) };
                let sent = job.link.send(job.tag, data);
                let _ = job.done.send(sent);
            }
        })
        .ok()?;
    Some(jobs)
}

/// A message of `len` bytes cut in slices of `size` (the last may be shorter; an empty
/// message is one empty slice). Computed, not collected: an exchange of a few bytes
/// costs less than an allocation.
#[derive(Clone, Copy)]
pub(super) struct Slices {
    len: usize,
    size: usize,
}

impl Slices {
    /// How many slices.
    pub(super) fn count(self) -> usize {
        self.len.div_ceil(self.size).max(1)
    }

    /// Slice `k`, if there is one.
    pub(super) fn get(self, k: usize) -> Option<Range<usize>> {
        (k < self.count()).then(|| (k * self.size).min(self.len)..((k + 1) * self.size).min(self.len))
    }

    /// Every slice, in order.
    pub(super) fn iter(self) -> impl Iterator<Item = Range<usize>> {
        (0..self.count()).filter_map(move |k| self.get(k))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_is_cut_in_whole_slices_and_an_empty_one_is_one_empty_slice() {
        let cut = |len, size| Slices { len, size }.iter().collect::<Vec<_>>();
        assert_eq!(cut(10, 4), vec![0..4, 4..8, 8..10]);
        assert_eq!(cut(8, 4), vec![0..4, 4..8]);
        assert_eq!(cut(3, 4), vec![0..3]);
        assert_eq!(cut(0, 1), vec![0..0]);
        let s = Slices { len: 10, size: 4 };
        assert_eq!((s.count(), s.get(2), s.get(3)), (3, Some(8..10), None));
    }
}
