//! How one side of a link waits for the other: it spins while the peer is likely to
//! answer within a microsecond, yields where ranks share cores, then sleeps on a futex
//! in the shared memory that the other side wakes, checking every few milliseconds that
//! the peer process lives and that the timeout has not passed ([`ShmLink::wait`]).

use super::ShmLink;
use super::cpu::current_cpu;
use super::layout::Channel;
use std::io;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};
use std::time::{Duration, Instant};

/// How long a waiting side with a core of its own spins before it sleeps: far longer
/// than a peer on another core takes to answer a small message (a fraction of a
/// microsecond), so that two ranks calling back to back never sleep, and short enough
/// that a rank kept waiting (its peer late, or busy with a large reduction) gives its
/// core back soon (a 3 s wait costs well under a second of CPU).
pub(super) const SPIN_FOR: Duration = Duration::from_micros(100);
/// How long a side that shares a core (more ranks than cores) yields it before it sleeps.
const YIELD_FOR: Duration = Duration::from_micros(50);
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
    /// run), then sleeps.
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
        if self.spin.is_zero() {
            while start.elapsed() < YIELD_FOR {
                if ready() {
                    return Ok(());
                }
                std::thread::yield_now();
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
    fn liveness_reads_proc() {
        assert!(process_alive(std::process::id()));
        assert!(!process_alive(u32::MAX - 1));
    }
}
