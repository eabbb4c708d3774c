//! How one side of a link waits for the other: it spins while the peer is likely to
//! answer within a microsecond, yields where ranks share cores (unless a busy program
//! takes the core at each yield), then sleeps on a futex in the shared memory that the
//! other side wakes, checking every few milliseconds that the peer process lives and that
//! the timeout has not passed ([`ShmLink::wait`]).

use super::ShmLink;
use super::cpu::current_cpu;
use super::layout::Channel;
use std::io;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};
use std::time::{Duration, Instant};
use workbook_runtime::clock::monotonic_ns;

/// How long a waiting side with a core of its own spins before it sleeps: far longer
/// than a peer on another core takes to answer a small message (a fraction of a
/// microsecond), so that two ranks calling back to back never sleep, and short enough
/// that a rank kept waiting (its peer late, or busy with a large reduction) gives its
/// core back soon (a 3 s wait costs well under a second of CPU).
pub(super) const SPIN_FOR: Duration = Duration::from_micros(100);
/// How long a side that shares a core (more ranks than cores) yields it before it sleeps.
const YIELD_FOR: Duration = Duration::from_micros(50);
/// A yield that comes back this late gave the core to something that kept it for a whole
/// time slice (Linux's last at least 0.75 ms x (1 + log2 of the cores, counting at most
/// 8): 1.5 ms on 2 cores): a program that computes. A rank gives the core back as soon as
/// it waits, though while a job starts its ranks may keep a core as long, filling their
/// buffers' pages.
const LOST_YIELD: Duration = Duration::from_millis(1);
/// How many lost yields within [`LOST_WITHIN`] show that this process shares its core with
/// a busy program: one may be a neighbour's long reduction, three are a program that holds
/// the core.
const LOST_YIELDS: usize = 3;
/// See [`LOST_YIELDS`]: also how long the waits sleep at once after the third, before they
/// try yielding again.
const LOST_WITHIN: Duration = Duration::from_millis(100);

/// This process's yields that came back late ([`LostYields`]).
static LOST: LostYields = LostYields::new();

/// How often a sleeping side wakes up to check that its peer is alive.
const CHECK_EVERY: Duration = Duration::from_millis(10);

/// Waits, over every shared-memory link of this process, that went to sleep on the futex.
static SLEPT: AtomicU64 = AtomicU64::new(0);

/// How many waits of this process have slept on the futex so far: a call during which it
/// moved slept at least once (the benchmark's `slept` column).
pub fn waits_slept() -> u64 {
    SLEPT.load(Relaxed)
}

impl ShmLink {
    /// Waits until `ready()` holds: spins, then sleeps on `word` (a futex), flagging
    /// `sleeping` so the other side knows to wake it. Fails when the peer has left or
    /// died, or when nothing happened for the whole timeout.
    ///
    /// Spinning pays when the peer runs on another core right now: it answers within a
    /// fraction of a microsecond, where a sleeping process takes several to be woken (and
    /// each wake-up costs the waker a system call). So a rank with a core of its own spins
    /// for [`SPIN_FOR`]. But the scheduler may put both ranks on one core (it wakes a
    /// process where its waker runs, and leaves cache-hot processes where they are): then
    /// the peer cannot run while this rank spins, and every call would cost a whole spin
    /// and a switch. Each side says where it last waited (`sender_cpu`); a rank that finds
    /// its peer on its own core sleeps at once, and the wake-up lets the scheduler move
    /// it to an idle core, after which both spin again. Where the host runs more ranks
    /// than cores, a wait yields its core for [`YIELD_FOR`] (a peer that shares it can
    /// run), then sleeps; it sleeps at once where yields lately handed the core to a busy
    /// program for whole time slices ([`LostYields`]).
    #[inline]
    pub(super) fn wait(
        &self,
        channel: &Channel,
        word: &AtomicU32,
        sleeping: &AtomicU32,
        ready: impl Fn() -> bool,
        gone: io::ErrorKind,
    ) -> io::Result<()> {
        match ready() {
            true => Ok(()), // the usual case when the peer is ahead: no clock read, no call
            false => self.wait_longer(channel, word, sleeping, ready, gone),
        }
    }

    /// [`ShmLink::wait`] once the first look found nothing.
    #[inline(never)]
    fn wait_longer(
        &self,
        channel: &Channel,
        word: &AtomicU32,
        sleeping: &AtomicU32,
        ready: impl Fn() -> bool,
        gone: io::ErrorKind,
    ) -> io::Result<()> {
        let start = Instant::now();
        let mine = current_cpu();
        if let Some(out) = self.out.get() {
            let told = &out.header().sender_cpu;
            if told.load(Relaxed) != mine {
                told.store(mine, Relaxed);
            }
        }
        let peer_here =
            mine != 0 && (self.inbox.get()).is_some_and(|inbox| inbox.header().sender_cpu.load(Relaxed) == mine);
        if !peer_here {
            while start.elapsed() < self.spin {
                for _ in 0..16 {
                    if ready() {
                        return Ok(());
                    }
                    std::hint::spin_loop();
                }
            }
        }
        // A rank with a core of its own that finds its peer on that core sleeps at once.
        if self.spin.is_zero() && !LOST.clustered(monotonic_ns()) {
            while start.elapsed() < YIELD_FOR {
                if ready() {
                    return Ok(());
                }
                let yielded = Instant::now();
                std::thread::yield_now();
                if LOST.note(yielded.elapsed(), monotonic_ns()) {
                    break;
                }
            }
        }
        let deadline = Instant::now() + self.timeout;
        let mut counted = false;
        loop {
            sleeping.store(1, SeqCst);
            let seen = word.load(SeqCst);
            if ready() {
                sleeping.store(0, Relaxed);
                return Ok(());
            }
            if channel.header().closed.load(SeqCst) != 0 {
                sleeping.store(0, Relaxed);
                return Err(io::Error::new(gone, format!("rank {} closed the channel", self.peer)));
            }
            if !counted {
                SLEPT.fetch_add(1, Relaxed);
                counted = true;
            }
            futex_wait(word, seen, CHECK_EVERY);
            sleeping.store(0, Relaxed);
            if ready() {
                return Ok(());
            }
            if !process_alive(self.peer_pid) {
                return Err(io::Error::new(
                    gone,
                    format!("rank {} (pid {}) is gone", self.peer, self.peer_pid),
                ));
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "nothing moved for the whole timeout",
                ));
            }
        }
    }
}

/// The last [`LOST_YIELDS`] yields of this process that came back late ([`LOST_YIELD`]).
///
/// A yield hands the core to whoever runs next on it. Where that is a rank, it gives the
/// core back as soon as it waits, a few microseconds later. Where it is a program that
/// computes (another job, a `yes > /dev/null`), the scheduler lets it run its whole time
/// slice, milliseconds, though the bytes this rank waits for may land a microsecond later;
/// and the next wait does the same: four ranks on two cores beside two busy programs took
/// 6 ms per 1 MiB all-reduce. A rank that sleeps on the futex instead is woken the moment
/// its bytes land, and the scheduler lets a task that wakes run ahead of one that has
/// computed for a while (0.6-0.9 ms there). So when yields come back late [`LOST_YIELDS`]
/// times within [`LOST_WITHIN`], this process's waits sleep at once.
struct LostYields {
    /// How many yields came back late so far.
    count: AtomicU64,
    /// When the last [`LOST_YIELDS`] of them did ([`monotonic_ns`]); a ring, the oldest at
    /// `count % LOST_YIELDS`.
    at: [AtomicU64; LOST_YIELDS],
}

impl LostYields {
    const fn new() -> LostYields {
        LostYields {
            count: AtomicU64::new(0),
            at: [const { AtomicU64::new(0) }; LOST_YIELDS],
        }
    }

    /// Notes a yield that came back `took` after it began, at `now`: whether it was lost.
    fn note(&self, took: Duration, now: u64) -> bool {
        let lost = took >= LOST_YIELD;
        if lost {
            let n = self.count.fetch_add(1, Relaxed);
            self.at[n as usize % LOST_YIELDS].store(now, Relaxed);
        }
        lost
    }

    /// Whether the last [`LOST_YIELDS`] lost yields all came within [`LOST_WITHIN`] of `now`.
    fn clustered(&self, now: u64) -> bool {
        let n = self.count.load(Relaxed);
        let oldest = self.at[n as usize % LOST_YIELDS].load(Relaxed);
        n >= LOST_YIELDS as u64 && now.saturating_sub(oldest) < LOST_WITHIN.as_nanos() as u64
    }
}

/// Whether process `pid` is still running (not gone, not a zombie waiting to be reaped).
pub(super) fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name in parentheses: "1234 (name) S ...".
        Ok(stat) => !matches!(
            stat.rsplit_once(") ").and_then(|(_, rest)| rest.chars().next()),
            Some('Z' | 'X')
        ),
        Err(_) => false,
    }
}

/// Sleeps until `word` is woken or no longer holds `seen`, for at most `at_most`.
fn futex_wait(word: &AtomicU32, seen: u32, at_most: Duration) {
    let ts = libc::timespec {
        tv_sec: at_most.as_secs() as libc::time_t,
        tv_nsec: at_most.subsec_nanos() as libc::c_long,
    };
    // SAFETY: FUTEX_WAIT (shared, not PRIVATE: the word is in memory two processes map)
    // on a valid, aligned u32; a spurious return is harmless, the caller re-checks.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            seen,
            &ts as *const libc::timespec,
        );
    }
}

/// Wakes whoever sleeps on `word`.
pub(super) fn futex_wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE on a valid, aligned u32.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_late_yields_within_100_ms_make_waits_sleep_for_a_while() {
        let ms = |n: u64| n * 1_000_000;
        let lost = LostYields::new();
        // A neighbour's turn on the core, however many: not lost.
        for t in 0..10 {
            assert!(!lost.note(Duration::from_micros(300), ms(t)));
        }
        assert!(lost.note(LOST_YIELD, ms(10)));
        assert!(lost.note(Duration::from_millis(3), ms(20)));
        assert!(!lost.clustered(ms(20)), "two lost yields are not yet a busy program");
        lost.note(LOST_YIELD, ms(60));
        assert!(lost.clustered(ms(60)));
        assert!(lost.clustered(ms(109)));
        assert!(
            !lost.clustered(ms(110)),
            "100 ms after the first of the three, yield again"
        );
        // Three lost yields spread over 300 ms: no cluster.
        for t in [200, 300, 400] {
            lost.note(LOST_YIELD, ms(t));
        }
        assert!(!lost.clustered(ms(400)));
    }

    #[test]
    fn liveness_reads_proc() {
        assert!(process_alive(std::process::id()));
        assert!(!process_alive(u32::MAX - 1));
    }
}
