//! Stream order: which work is still unfinished on each CUDA stream.
//!
//! There are no kernels, but NCCL's calls are queued on a stream and finish later (on a
//! communicator's worker thread, [`crate::nccl`]). Each piece of queued work holds a
//! [`Ticket`], numbered in issue order on its stream; the stream is busy while any ticket
//! is alive, and dropping the ticket (the work finished, failed, or was dropped by an
//! abort) ends it. Everything else the driver does on a stream waits for, or is measured
//! against, the work issued before it:
//! - a *mark* is the stream's position now (how many tickets it has handed out); "done
//!   before mark m" means no unfinished ticket below m;
//! - copies, memsets and allocations wait until everything before them is done;
//!   `cuStreamSynchronize` likewise; `cuStreamQuery` and events only look;
//! - `cuMemFreeAsync` never waits: on a busy stream the free is deferred until the work
//!   issued before it is done (or dropped).
//!
//! Waits have no deadline: work that never finishes (a peer that never comes) keeps its
//! stream busy for ever, as a spinning kernel does, until the communicator is aborted.

use crate::memory;
use std::collections::{BTreeSet, HashMap};
use std::sync::{Condvar, LazyLock, Mutex, MutexGuard};
use std::time::Duration;

/// A stream as the double tracks it: the device (visible ordinal) and the handle. The
/// NULL stream and `CU_STREAM_LEGACY` (0x1) are one stream, the device's legacy default
/// stream; `CU_STREAM_PER_THREAD` (0x2) is tracked as one more stream of the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Key {
    pub device: usize,
    pub handle: usize,
}

impl Key {
    /// The stream `handle` of `device`.
    pub fn new(device: usize, handle: usize) -> Self {
        let handle = if handle == 0x1 { 0 } else { handle };
        Self { device, handle }
    }
}

/// One stream's state.
#[derive(Default)]
struct Lane {
    /// The number the next ticket gets (the stream's mark now).
    next: u64,
    /// Tickets handed out and not yet dropped.
    unfinished: BTreeSet<u64>,
    /// Frees waiting for the work before them: (mark at the free, pointer).
    deferred: Vec<(u64, usize)>,
}

impl Lane {
    /// Whether everything issued before `mark` is done.
    fn done_before(&self, mark: u64) -> bool {
        self.unfinished.first().is_none_or(|&t| t >= mark)
    }
}

/// Every stream's state, and a signal rung whenever work finishes.
static LANES: LazyLock<Mutex<HashMap<Key, Lane>>> = LazyLock::new(|| Mutex::new(HashMap::new()));
static FINISHED: Condvar = Condvar::new();

fn lanes() -> MutexGuard<'static, HashMap<Key, Lane>> {
    LANES.lock().unwrap_or_else(|p| p.into_inner())
}

/// A piece of work queued on a stream: the stream is busy until the ticket is dropped.
#[derive(Debug)]
pub struct Ticket {
    key: Key,
    n: u64,
}

/// Queues a piece of work on `key`: the stream is busy from now on.
pub fn begin(key: Key) -> Ticket {
    let mut l = lanes();
    let lane = l.entry(key).or_default();
    let n = lane.next;
    lane.next += 1;
    lane.unfinished.insert(n);
    Ticket { key, n }
}

impl Ticket {
    /// Whether everything issued on its stream before it is done: the work it stands for
    /// may start, as a kernel starts once the stream's earlier work is done, whatever
    /// communicator queued that work (two communicators on one stream run in its order).
    pub fn may_start(&self) -> bool {
        done_before(self.key, self.n)
    }

    /// Waits at most `limit` for its turn ([`Ticket::may_start`]).
    pub fn wait_turn(&self, limit: Duration) {
        let l = lanes();
        if !l.get(&self.key).is_none_or(|lane| lane.done_before(self.n)) {
            drop(FINISHED.wait_timeout(l, limit));
        }
    }
}

impl Drop for Ticket {
    /// The work is over (done, failed or dropped): the frees it held back happen now.
    fn drop(&mut self) {
        let due: Vec<usize> = {
            let mut l = lanes();
            let Some(lane) = l.get_mut(&self.key) else {
                return;
            };
            lane.unfinished.remove(&self.n);
            let (due, later): (Vec<_>, Vec<_>) = lane
                .deferred
                .drain(..)
                .partition(|&(mark, _)| lane.unfinished.first().is_none_or(|&t| t >= mark));
            lane.deferred = later;
            due.into_iter().map(|(_, p)| p).collect()
        };
        for p in due {
            memory::free(p);
        }
        FINISHED.notify_all();
    }
}

/// The stream's position now: work issued from here on is "after" it.
pub fn mark(key: Key) -> u64 {
    lanes().get(&key).map_or(0, |lane| lane.next)
}

/// Whether everything issued on `key` before `mark` is done.
pub fn done_before(key: Key, mark: u64) -> bool {
    lanes().get(&key).is_none_or(|lane| lane.done_before(mark))
}

/// Whether the stream is idle (`cuStreamQuery`).
pub fn idle(key: Key) -> bool {
    done_before(key, u64::MAX)
}

/// Blocks until everything issued on `key` before `mark` is done: for ever, if it never is.
pub fn wait_before(key: Key, mark: u64) {
    let mut l = lanes();
    while !l.get(&key).is_none_or(|lane| lane.done_before(mark)) {
        // The timeout only guards against a missed signal; the wait itself has no end.
        l = FINISHED
            .wait_timeout(l, Duration::from_millis(100))
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
}

/// Blocks until everything issued on `key` so far is done (stream order for the driver's
/// own calls, and `cuStreamSynchronize`).
pub fn wait_issued(key: Key) {
    wait_before(key, mark(key));
}

/// Blocks until every stream of `device` has finished what was issued so far
/// (`cuCtxSynchronize`).
pub fn wait_device(device: usize) {
    let marks: Vec<(Key, u64)> = lanes()
        .iter()
        .filter(|(k, _)| k.device == device)
        .map(|(k, lane)| (*k, lane.next))
        .collect();
    for (k, m) in marks {
        wait_before(k, m);
    }
}

/// `cuStreamWaitEvent`: the work issued on `key` from now on starts only once what was
/// issued on `on` before `mark` is done (an event recorded there), as a GPU orders two
/// streams. A ticket on `key` stands for the wait: a thread of the double drops it when
/// `on` gets there (for ever later, if it never does: as a stream waits on a GPU).
pub fn wait_for(key: Key, on: Key, mark: u64) {
    if done_before(on, mark) {
        return;
    }
    let ticket = begin(key);
    let waiter = std::thread::Builder::new()
        .name("double: stream waits".into())
        .spawn(move || {
            wait_before(on, mark);
            drop(ticket);
        });
    if waiter.is_err() {
        // No thread to wait with (none left): the caller's thread waits, which keeps
        // the order, at the cost of blocking it.
        wait_before(on, mark);
    }
}

/// Keeps `key` busy for `time` once the work issued before is done: what the double
/// does for a kernel ([`crate::driver`]'s `cuLaunchKernel`), on a thread of its own.
pub fn busy_for(key: Key, time: Duration) {
    let ticket = begin(key);
    let kernel = std::thread::Builder::new()
        .name("double: kernel".into())
        .spawn(move || play(&ticket, time));
    if let Err(e) = kernel {
        // No thread to play it on: the caller's thread plays it.
        let ticket = begin(key);
        crate::warn(
            None,
            &format!("no thread for a kernel ({e}): it is played in the caller's thread"),
        );
        play(&ticket, time);
    }
}

/// Waits for the ticket's turn, then for `time`.
fn play(ticket: &Ticket, time: Duration) {
    while !ticket.may_start() {
        ticket.wait_turn(Duration::from_millis(5));
    }
    std::thread::sleep(time);
}

/// Frees `ptr` once the work issued on `key` so far is done: now if the stream is idle,
/// else later, by whoever finishes that work. Never blocks.
pub fn free_after(key: Key, ptr: usize) {
    {
        let mut l = lanes();
        let lane = l.entry(key).or_default();
        if !lane.done_before(lane.next) {
            let mark = lane.next;
            lane.deferred.push((mark, ptr));
            return;
        }
    }
    memory::free(ptr);
}

/// Whether a free of `ptr` is already waiting (a second free is refused).
pub fn free_pending(ptr: usize) -> bool {
    lanes()
        .values()
        .any(|lane| lane.deferred.iter().any(|&(_, p)| p == ptr))
}

/// Takes back the frees still waiting on the streams of `device`, whose context is
/// being destroyed (the caller frees them with the rest of the device's memory).
pub fn forget_frees(device: usize) -> Vec<usize> {
    lanes()
        .iter_mut()
        .filter(|(k, _)| k.device == device)
        .flat_map(|(_, lane)| lane.deferred.drain(..).map(|(_, p)| p))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_is_busy_until_its_tickets_are_dropped_and_frees_wait_for_them() {
        let key = Key::new(7, 0x1234_5670);
        assert!(idle(key));
        let first = begin(key);
        let m = mark(key);
        let second = begin(key);
        assert!(!idle(key));
        let p = memory::alloc(8, 7).unwrap();
        free_after(key, p);
        assert!(free_pending(p), "deferred while the stream is busy");
        assert!(memory::check(p, 8).is_ok());
        drop(second);
        assert!(!done_before(key, m), "the first is still running");
        assert!(memory::check(p, 8).is_ok(), "the free waits for the first too");
        drop(first);
        assert!(idle(key) && done_before(key, m));
        assert!(memory::check(p, 8).is_err(), "freed once the work before it ended");
        assert!(!free_pending(p));
        // On an idle stream a free is immediate.
        let q = memory::alloc(8, 7).unwrap();
        free_after(key, q);
        assert!(memory::check(q, 8).is_err());
        // Waiting for work that ends on another thread.
        let t = begin(key);
        let ender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            drop(t);
        });
        wait_issued(key);
        assert!(idle(key));
        ender.join().unwrap();
    }

    #[test]
    fn a_stream_waiting_for_an_event_starts_its_work_after_the_other_streams() {
        let (compute, comm) = (Key::new(8, 0x1000), Key::new(8, 0x2000));
        busy_for(compute, Duration::from_millis(80));
        let event = mark(compute);
        wait_for(comm, compute, event);
        let collective = begin(comm);
        assert!(
            !collective.may_start(),
            "the collective waits for the kernel before the event"
        );
        // Work issued on the compute stream after the event (held here, unfinished):
        // the collective does not wait for it.
        let later = begin(compute);
        while !collective.may_start() {
            collective.wait_turn(Duration::from_millis(5));
        }
        assert!(done_before(compute, event) && !idle(compute));
        drop(later);
        drop(collective);
        // An event already complete orders nothing.
        wait_for(comm, compute, event);
        assert!(idle(comm));
        wait_issued(compute);
    }
}
