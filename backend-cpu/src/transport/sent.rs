//! How many steps (LL, LL128) or pieces (Simple) this process has sent over shared memory,
//! per protocol: what shows that a protocol really ran (the benchmark's `proto_steps`).
//!
//! Each sending thread counts in its own counters, with a plain load and store. One
//! counter shared by the process would need a locked add per message, and on x86 a locked
//! instruction waits until every store before it has reached the other cores: the sender
//! of a 4-byte message would wait, on every call, for its message's cache line to reach
//! the receiver, where without it the store drains while the sender goes on. A reader
//! sums the live threads' counters and what the threads that ended left behind.

use super::protocol::Protocol;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};

/// One thread's counts, by protocol ([`Protocol`] as index). Only that thread writes them.
#[derive(Default)]
struct Counts([AtomicU64; 3]);

/// The counts of every thread that is alive and has sent, and the sums of those of the
/// threads that ended: both change under this one lock, so a reader finds a thread's
/// counts in exactly one of the two places.
static ALL: Mutex<(Vec<Arc<Counts>>, [u64; 3])> = Mutex::new((Vec::new(), [0; 3]));

fn all() -> MutexGuard<'static, (Vec<Arc<Counts>>, [u64; 3])> {
    ALL.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// This thread's entry in [`ALL`], taken at its first send and handed over when it ends.
struct Mine(Arc<Counts>);

impl Mine {
    fn register() -> Mine {
        let counts = Arc::new(Counts::default());
        all().0.push(Arc::clone(&counts));
        Mine(counts)
    }
}

impl Drop for Mine {
    fn drop(&mut self) {
        let mut all = all();
        let (live, ended) = &mut *all;
        live.retain(|c| !Arc::ptr_eq(c, &self.0));
        for (sum, c) in ended.iter_mut().zip(&self.0.0) {
            *sum += c.load(Relaxed);
        }
    }
}

thread_local! {
    static MINE: Mine = Mine::register();
}

/// Counts one step or piece sent by `proto` from this thread.
#[inline]
pub(crate) fn count(proto: Protocol) {
    // A thread already ending (a send from another thread-local's destructor) is not counted.
    let _ = MINE.try_with(|mine| {
        let c = &mine.0.0[proto as usize];
        c.store(c.load(Relaxed) + 1, Relaxed);
    });
}

/// Steps or pieces sent by `proto` so far, by every thread of this process.
pub fn total(proto: Protocol) -> u64 {
    let all = all();
    let (live, ended) = &*all;
    ended[proto as usize] + live.iter().map(|c| c.0[proto as usize].load(Relaxed)).sum::<u64>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_count_apart_and_an_ended_threads_counts_stay() {
        // Other tests of this binary send over shared memory too, concurrently: only what
        // this test adds is exact, and only as a lower bound.
        let before = total(Protocol::Ll128);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| (0..1000).for_each(|_| count(Protocol::Ll128)));
            }
        });
        // Each thread was joined, so its counts are in `ended` or still listed.
        let after = total(Protocol::Ll128);
        assert!(after >= before + 4000, "{before} then {after}");
        count(Protocol::Ll128);
        assert!(total(Protocol::Ll128) > after);
    }
}
