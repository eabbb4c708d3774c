//! A rank's heartbeat: how the others tell a rank that is stopped from one that is busy.
//!
//! A rank of the CPU backend waits inside its links (a futex on shared memory, a read
//! on a socket), where a frozen peer (SIGSTOP, a debugger) and a peer merely waiting for
//! a third look alike: nothing comes. So each rank beats, as the NCCL backend's watchdog
//! does: a thread of its own, with a connection of its own to the store, sends a
//! heartbeat every `--timeout / 10` (50 to 500 ms), and the store notes when each came.
//! The collectives never touch the store: the beats cost them nothing. Rank 0 does not
//! beat: it hosts the store, which stops with it (the others' questions then go
//! unanswered, which names it).
//!
//! When a wait fails, the rank asks the store whom to blame ([`Store::blame`]): the first
//! rank lost (its connection closed: killed, crashed), else the rank whose heartbeat
//! stopped ([`quiet`] or more ago: its process is stopped). The store gives its first
//! answer to every rank that asks, so that every rank, and through them every launcher
//! ([`crate::blame`]), names the same one.

use crate::launch::Identity;
use crate::rendezvous::{Join, Store};
use std::sync::mpsc;
use std::time::Duration;

/// How often a rank with this `--timeout` beats: a tenth of it, from 50 to 500 ms.
pub fn every(timeout: Duration) -> Duration {
    (timeout / 10).clamp(Duration::from_millis(50), Duration::from_millis(500))
}

/// How long a rank must have been without a heartbeat to be called stopped, when a wait
/// of `timeout` failed: half of it, and at least three beats (a rank stopped when the
/// wait began has been silent the whole `timeout`; a live one, a beat ago).
pub fn quiet(timeout: Duration) -> Duration {
    (every(timeout) * 3).max(timeout / 2)
}

/// A rank's heartbeat: a thread that beats until this is dropped (or the store goes).
pub struct Heartbeat {
    /// Dropped with this: the thread wakes at once and ends (its connection closing says
    /// nothing to the store).
    _stop: mpsc::Sender<()>,
}

impl Heartbeat {
    /// Starts beating for rank `id`, whose store connection `store` has joined, every
    /// [`every`] of `timeout`. `None` when the store refuses a heartbeat connection or
    /// one cannot be made: the rank runs without (a failure then names who it can).
    pub fn start(store: &Store, id: &Identity, timeout: Duration) -> Option<Heartbeat> {
        let join = Join {
            job_id: id.job_id.clone(),
            world_size: id.world_size,
            rank: id.rank,
            secret: id.secret.clone(),
        };
        // A beat waits for the store's answer as long as any request of the rank: a store
        // slow to answer (a loaded machine) must not end the heartbeat, which would make a
        // live rank look stopped; one that never answers is rank 0 stopped, which the
        // rank's own requests say.
        let mut conn = store.heartbeat(&join, timeout + crate::deadline::SLACK).ok()?;
        conn.beat().ok()?;
        let (stop, stopped) = mpsc::channel::<()>();
        let every = every(timeout);
        std::thread::Builder::new()
            .name("heartbeat".into())
            .spawn(move || {
                // Beats until told to stop (the sender dropped) or the store is gone (the job
                // is over, or rank 0 failed: its ranks' waits say that).
                while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(every) {
                    if conn.beat().is_err() {
                        return;
                    }
                }
            })
            .ok()?;
        Some(Heartbeat { _stop: stop })
    }
}
