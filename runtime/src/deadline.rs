//! A deadline for a call that may never return: NCCL's abort, a blocking NCCL call.
//!
//! Every wait of the workbook polls, and so keeps its deadline; a few calls cannot be
//! polled. `ncclCommAbort` waits for the other ranks of the node (NCCL's issues #863,
//! #992, #1013, #1777: when a peer of the node is stopped or dead, it may never return);
//! a call on a blocking communicator may block inside NCCL. For those, a watcher thread
//! holds the deadline: if the call is still running when it passes, the watcher says one
//! line and ends the process at once, without running destructors (`_exit`), as
//! PyTorch's NCCL watchdog ends a process whose abort hangs. (`exit` would run the
//! static destructors of the CUDA runtime inside libnccl while the main thread is still
//! inside it, which can deadlock.)
//!
//! Arming costs an atomic store (a timed loop renews it at every call); the watcher looks
//! every few tens of milliseconds while anything is armed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, Once};
use std::time::{Duration, Instant};

/// The one allowance past `--timeout` that any wait of the workbook may take, to learn
/// why it failed (asking the store which rank is lost), to read a reply the store sent
/// at its own deadline, or to abort: every wait ends within `--timeout` plus this.
pub const SLACK: Duration = Duration::from_secs(2);

/// When the armed deadline passes, in microseconds since [`epoch`] (0: nothing armed).
static AT: AtomicU64 = AtomicU64::new(0);
/// Which arming is current (so that an old guard does not disarm a newer one).
static GENERATION: AtomicU64 = AtomicU64::new(0);
/// What to say when it passes.
static LINE: Mutex<String> = Mutex::new(String::new());
/// Who is to blame, asked when it passes (see [`Armed::blaming`]).
static BLAME: Mutex<Option<Blame>> = Mutex::new(None);

/// Asked when a deadline passes, on the watcher's thread: who is to blame, in words
/// ("rank 2 stopped responding (…)"), said after the line; `None` if it cannot tell.
pub type Blame = Box<dyn FnMut() -> Option<String> + Send>;

/// How often the watcher looks.
const LOOK: Duration = Duration::from_millis(20);

fn epoch() -> Instant {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn micros_from_now(after: Duration) -> u64 {
    let at = (Instant::now() + after).duration_since(epoch()).as_micros();
    u64::try_from(at).unwrap_or(u64::MAX).max(1)
}

/// An armed deadline: dropping it disarms it (if no newer one replaced it).
#[must_use = "the deadline is disarmed when this is dropped"]
pub struct Armed {
    generation: u64,
}

impl Armed {
    /// Moves the deadline to `after` from now (an atomic store: cheap enough for every
    /// call of a timed loop).
    pub fn renew(&self, after: Duration) {
        if GENERATION.load(Ordering::Acquire) == self.generation {
            AT.store(micros_from_now(after), Ordering::Release);
        }
    }

    /// When this deadline passes, `blame` is asked who is to blame, and its answer is said
    /// after the line: for a call that blocks inside NCCL, where the rank's own waits
    /// cannot look (the answer must come within a few seconds: it delays the exit).
    pub fn blaming(self, blame: Blame) -> Armed {
        if GENERATION.load(Ordering::Acquire) == self.generation {
            *BLAME.lock().unwrap_or_else(|p| p.into_inner()) = Some(blame);
        }
        self
    }

    /// Holds the deadline off until the next [`Armed::renew`] (an atomic store).
    pub fn pause(&self) {
        if GENERATION.load(Ordering::Acquire) == self.generation {
            AT.store(0, Ordering::Release);
        }
    }
}

impl Drop for Armed {
    fn drop(&mut self) {
        self.pause();
    }
}

/// Arms the deadline: unless the returned guard is dropped within `after`, `line` is said
/// (as the process's last line on stderr) and the process ends with status 1.
pub fn arm(after: Duration, line: String) -> Armed {
    let armed = standby(line);
    armed.renew(after);
    armed
}

/// A deadline that says `line` when it passes, held off until [`Armed::renew`] sets it:
/// for calls that each get the same deadline, renewed before and paused after each one.
pub fn standby(line: String) -> Armed {
    watch();
    *LINE.lock().unwrap_or_else(|p| p.into_inner()) = line;
    *BLAME.lock().unwrap_or_else(|p| p.into_inner()) = None;
    AT.store(0, Ordering::Release);
    let generation = GENERATION.fetch_add(1, Ordering::AcqRel) + 1;
    Armed { generation }
}

/// Starts the watcher thread, once.
fn watch() {
    static STARTED: Once = Once::new();
    STARTED.call_once(|| {
        epoch();
        let _ = std::thread::Builder::new().name("deadline".into()).spawn(|| {
            loop {
                std::thread::sleep(LOOK);
                let at = AT.load(Ordering::Acquire);
                let now = Instant::now().duration_since(epoch()).as_micros() as u64;
                if at != 0 && now >= at {
                    let mut line = LINE.lock().unwrap_or_else(|p| p.into_inner()).clone();
                    let blamed = BLAME
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .as_mut()
                        .and_then(|b| b());
                    if let Some(who) = blamed {
                        line = format!("{line}; {who}");
                    }
                    crate::error::exit_now(&line, crate::error::EXIT_FAILURE);
                }
            }
        });
    });
}
