//! Process exit while a thread is blocked inside the library, as the real one behaves.
//!
//! Real NCCL links the CUDA runtime statically, and the runtime's static destructors run
//! when the process calls `exit` (from `main`'s return, or `std::process::exit` on any
//! thread). They take locks that a thread blocked inside CUDA or NCCL holds (a blocking
//! `ncclCommInitRank` whose peer never comes, a `cuStreamSynchronize` behind a kernel
//! that spins for ever), so they wait for that thread: the process never ends. A program
//! with a deadline on another thread must end with `_exit` instead, which runs no
//! destructor.
//!
//! The double plays it: every wait of a blocking call holds a [`Blocked`] mark while it
//! waits, and the library's destructor (in `.fini_array`, run by `exit` for every loaded
//! library) waits until no thread holds one: for ever if the wait never ends, after
//! saying so once on stderr.

use std::sync::{Condvar, Mutex, MutexGuard};

/// The calls threads are blocked in now, one entry per thread waiting.
static BLOCKED: Mutex<Vec<String>> = Mutex::new(Vec::new());
/// Signalled whenever a thread leaves its wait.
static LEFT: Condvar = Condvar::new();

fn blocked() -> MutexGuard<'static, Vec<String>> {
    BLOCKED.lock().unwrap_or_else(|p| p.into_inner())
}

/// A thread's mark, held while it waits inside a blocking call: the process's exit waits
/// for it to be dropped.
#[must_use = "the mark counts only while it is held"]
pub struct Blocked(String);

/// Marks this thread as blocked in `call` until the mark is dropped.
pub fn blocking(call: &str) -> Blocked {
    blocked().push(call.to_string());
    Blocked(call.to_string())
}

impl Drop for Blocked {
    fn drop(&mut self) {
        let mut b = blocked();
        if let Some(i) = b.iter().position(|c| *c == self.0) {
            b.remove(i);
        }
        LEFT.notify_all();
    }
}

/// The library's destructor: waits until no thread is blocked in a call of the double,
/// as the CUDA runtime's static destructors do (for ever, when the wait never ends).
extern "C" fn at_exit() {
    let mut b = blocked();
    if let Some(call) = b.first() {
        crate::say(&format!(
            "nccl-double WARN: process exit while a thread is blocked in {call}: waiting (the CUDA runtime's \
             static destructors would deadlock here)"
        ));
    }
    while !b.is_empty() {
        b = LEFT.wait(b).unwrap_or_else(|p| p.into_inner());
    }
}

/// Run by the loader when the process exits (or the library is unloaded), as a C++
/// static destructor is.
#[used]
#[unsafe(link_section = ".fini_array")]
static AT_EXIT: extern "C" fn() = at_exit;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_counts_while_it_is_held() {
        let count = |call: &str| blocked().iter().filter(|c| *c == call).count();
        let first = blocking("cuStreamSynchronize (test)");
        let second = blocking("cuStreamSynchronize (test)");
        assert_eq!(count("cuStreamSynchronize (test)"), 2);
        drop(first);
        assert_eq!(count("cuStreamSynchronize (test)"), 1);
        drop(second);
        assert_eq!(count("cuStreamSynchronize (test)"), 0);
    }
}
