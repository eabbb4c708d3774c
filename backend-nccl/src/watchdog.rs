//! The watchdog: what a rank does while it waits on the GPU.
//!
//! NCCL never gives up by itself. When a peer dies or freezes in the middle of a
//! collective, the other ranks' kernels spin for ever and their streams never finish.
//! Production stacks watch from outside (PyTorch's NCCL watchdog); so does this one.
//! While a rank polls its stream, every so often it
//!
//! - writes its own heartbeat into the store (`beat/<rank>`), so the others can tell it
//!   is alive;
//! - asks the store whether a rank was lost (its connection closed without a goodbye:
//!   killed, crashed), which names the culprit at once;
//! - past half the deadline, reads the others' heartbeats, to learn who went silent.
//!
//! At the deadline it fails, naming the ranks that showed no sign of life. The deadline is
//! `--timeout` of no progress: counted from the start of the wait, or from the last time
//! the caller saw an operation finish (a wait for 256 queued all-reduces of 80 ms each
//! lasts 20 s, and is never stuck). The caller then aborts the communicator.

use crate::error::Culprit;
use crate::rendezvous::Store;
use anyhow::Result;
use std::time::{Duration, Instant};
use workbook_runtime::failure::{self, Fact};

/// How long one look at the store may take: a store that does not answer in this time
/// is itself a sign that rank 0, which hosts it, is frozen.
const STORE_REPLY: Duration = Duration::from_secs(2);

/// How long rank 0, which hosts the store, stays past a deadline of a blocked call, so that
/// the other ranks, blocked with it, can still ask the store whom to blame.
const BLAME_GRACE: Duration = Duration::from_secs(1);

/// How long a wait lasts before the watchdog starts looking at the store.
const LOOK_AFTER: Duration = Duration::from_millis(20);

/// One rank's watchdog.
pub struct Watchdog {
    /// A second handle on the rank's store connection (used only between the session's
    /// own requests, on the same thread).
    store: Store,
    rank: usize,
    world: usize,
    timeout: Duration,
    /// How often to beat and look.
    every: Duration,
    beats: u64,
    last_look: Option<Instant>,
    /// Every rank's last heartbeat seen, and when this rank saw it change.
    seen: Vec<Option<(Vec<u8>, Instant)>>,
    /// When this rank began reading the others' heartbeats in the current wait.
    watching_since: Option<Instant>,
}

impl Watchdog {
    /// A watchdog for `rank` of `world`, looking through `store` (this rank's connection).
    pub fn new(store: &Store, rank: usize, world: usize, timeout: Duration) -> Result<Watchdog> {
        Ok(Watchdog {
            store: store.watcher(STORE_REPLY)?,
            rank,
            world,
            timeout,
            every: (timeout / 10).clamp(Duration::from_millis(50), Duration::from_millis(500)),
            beats: 0,
            last_look: None,
            seen: vec![None; world],
            watching_since: None,
        })
    }

    /// The deadline of every wait.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Called at every turn of a wait that began at `since` for `what` ("the GPU to finish
    /// all-reduce"), and last progressed (an operation finished) at `progressed`. Fails
    /// when a rank was lost, when the store stopped answering, or when nothing progressed
    /// for `--timeout`, with a message that names who is to blame.
    pub fn check(&mut self, since: Instant, progressed: Instant, what: &str) -> Result<()> {
        let now = Instant::now();
        // A short wait (most of them: a collective takes microseconds to milliseconds)
        // never touches the store, so that timings measure the GPU, not the watchdog.
        if now - since >= LOOK_AFTER && self.last_look.is_none_or(|t| now - t >= self.every) {
            self.last_look = Some(now);
            self.look(now, progressed, what)?;
        }
        if now - progressed >= self.timeout {
            let e = self.blame(now, what);
            // This rank gives up: told to the store, its exit is no crash to the others.
            let limit = crate::units::human_duration(self.timeout);
            let _ = self
                .store
                .give_up(&format!("nothing finished in {limit} (--timeout) waiting for {what}"));
            return Err(e);
        }
        Ok(())
    }

    /// NCCL failed on its own (`ncclRemoteError`: a socket closed, ...) during a wait for
    /// `what`: if a rank was lost meanwhile (the store hears of it within `grace`), that
    /// rank is the cause, and the error names it, with NCCL's words after.
    pub fn name_the_lost(&mut self, nccl: anyhow::Error, what: &str, grace: Duration) -> anyhow::Error {
        let until = Instant::now() + grace;
        loop {
            match self.store.first_lost() {
                Ok(Some(v)) if v.rank != self.rank => {
                    let text = format!("{nccl:#}");
                    let said = text.strip_prefix(&format!("rank {}: ", self.rank)).unwrap_or(&text);
                    let e = Culprit(format!("{}; NCCL then said: {said}", lost(&v, what))).into();
                    return failure::attach(e, Fact::PeerLost(v.rank));
                }
                Ok(_) if Instant::now() < until => std::thread::sleep(Duration::from_millis(20)),
                _ => return nccl,
            }
        }
    }

    /// Who is to blame when a call that blocks inside NCCL passes its deadline
    /// ([`crate::deadline::Armed::blaming`]): the store's verdict, asked on a handle of
    /// this rank's connection (the rank's own thread is inside NCCL then, not in a request
    /// of its own): the first rank lost, else the rank whose heartbeat stopped.
    pub fn blamer(&self) -> Result<crate::deadline::Blame> {
        let mut store = self.store.watcher(STORE_REPLY)?;
        let (rank, quiet) = (self.rank, crate::heartbeat::quiet(self.timeout));
        Ok(Box::new(move || {
            let said = match store.blame(quiet) {
                Ok(Some(v)) if v.rank != rank => Some(format!("the store says rank {} {}", v.rank, v.why)),
                Ok(_) => None,
                Err(_) if rank != 0 => Some("rank 0, which hosts the store, stopped answering or is gone".into()),
                Err(_) => None,
            };
            // Rank 0 hosts the store, and the others, blocked in the same call, pass their
            // deadline at about the same moment: it stays a little to answer them.
            if rank == 0 {
                std::thread::sleep(BLAME_GRACE);
            }
            said
        }))
    }

    /// Forgets what the others' heartbeats showed so far: at the start of a wait, and
    /// each time it progressed (who is silent is judged over the time without progress).
    pub fn reset(&mut self) {
        self.watching_since = None;
    }

    /// Beats, asks the store for a lost rank, and, past half the deadline without progress
    /// (since `progressed`), reads the others' heartbeats.
    fn look(&mut self, now: Instant, progressed: Instant, what: &str) -> Result<()> {
        let store_gone = |e: anyhow::Error| {
            if self.rank == 0 {
                e.context(format!("while waiting for {what}"))
            } else {
                let e = Culprit(format!(
                    "rank 0, which hosts the store, stopped answering or is gone ({e:#}) while this rank was \
                     waiting for {what}"
                ));
                failure::attach(e.into(), Fact::PeerLost(0))
            }
        };
        self.beats += 1;
        let beat = self.beats.to_le_bytes();
        self.store
            .set(&format!("beat/{}", self.rank), &beat)
            .map_err(store_gone)?;
        if let Some(v) = self.store.first_lost().map_err(store_gone)?
            && v.rank != self.rank
        {
            return Err(failure::attach(Culprit(lost(&v, what)).into(), Fact::PeerLost(v.rank)));
        }
        // Heartbeats matter only if the wait is long: read them from half the deadline on.
        if now - progressed >= self.timeout / 2 {
            self.watching_since.get_or_insert(now);
            for r in (0..self.world).filter(|r| *r != self.rank) {
                let value = self.store.get(&format!("beat/{r}")).map_err(store_gone)?;
                let changed = match (&self.seen[r], &value) {
                    (Some((old, _)), Some(new)) => old != new,
                    (None, Some(_)) => true,
                    (_, None) => false,
                };
                if changed && let Some(v) = value {
                    self.seen[r] = Some((v, now));
                }
            }
        }
        Ok(())
    }

    /// The deadline passed: who showed no sign of life while this rank watched?
    fn blame(&self, now: Instant, what: &str) -> anyhow::Error {
        let limit = crate::units::human_duration(self.timeout);
        let since = self.watching_since.unwrap_or(now);
        // Silent: no new heartbeat for the last 3 looks, or none since we started watching.
        let quiet = (self.every * 3).max(Duration::from_millis(1500));
        let silent: Vec<usize> = (0..self.world)
            .filter(|r| *r != self.rank)
            .filter(|r| match &self.seen[*r] {
                Some((_, at)) => now - *at >= quiet,
                None => now - since >= quiet,
            })
            .collect();
        // A rank beats here only while it waits on the GPU: one waiting in a meeting of
        // the store (a table's rows, a check) is silent here but alive. The store's own
        // heartbeats, which every rank's thread sends wherever it waits, name the rank
        // that stopped, as every other rank's explanation does.
        if !silent.is_empty()
            && let Ok(mut store) = self.store.watcher(STORE_REPLY)
            && let Ok(Some(crate::rendezvous::Verdict { rank: r, why, .. })) =
                store.blame(crate::heartbeat::quiet(self.timeout))
            && r != self.rank
        {
            let said = format!("rank {r} {why}; nothing finished in {limit} (--timeout) waiting for {what}");
            let e = failure::attach(Culprit(said).into(), Fact::Awaited(vec![r]));
            return failure::attach(e, Fact::Deadline);
        }
        let said = match silent.as_slice() {
            // The calls of one group progress together: a send of it waits for the peer's
            // matching receive, which the peer's group must hold.
            [] if what.contains(crate::nccl::GROUP_END)
                && (what.contains(" ncclSend") || what.contains(" ncclRecv")) =>
            {
                format!(
                    "nothing finished in {limit} (--timeout) waiting for {what}: every rank is alive, and the calls of \
                 a group progress together, each send with its peer's receive: does every peer's group hold the \
                 receive (and the send) that matches this rank's, with the same count and type?"
                )
            }
            // A send waits for its receiver (past NCCL's eager size), a receive for its sender.
            [] if what.contains("(ncclSend)") || what.contains("(ncclRecv)") => format!(
                "nothing finished in {limit} (--timeout) waiting for {what}: every rank is alive, and a send \
                 returns only once its peer receives it (past NCCL's eager size), a receive once its peer sends: if \
                 that peer waits in a send or a receive of its own, this is a deadlock; sends and receives that must \
                 progress together go in one group (ncclGroupStart ... ncclGroupEnd; here, session.group())"
            ),
            [] => format!(
                "nothing finished in {limit} (--timeout) waiting for {what}: every rank is alive, so NCCL \
                 itself made no progress (a network problem? run with NCCL_DEBUG=INFO to see where it stopped)"
            ),
            ranks => {
                let names: Vec<String> = ranks.iter().map(|r| r.to_string()).collect();
                let who = if ranks.len() == 1 {
                    format!("rank {} stopped responding", names[0])
                } else {
                    format!("ranks {} stopped responding", names.join(", "))
                };
                format!(
                    "{who}: no sign of life in the last {} (stopped, frozen, or stuck outside NCCL); nothing \
                     finished in {limit} (--timeout) waiting for {what}",
                    crate::units::human_duration(now - self.seen_since(ranks[0], since))
                )
            }
        };
        // Its own deadline ran out; the silent ranks, if any, are whom it waited for.
        let e = failure::attach(Culprit(said).into(), Fact::Awaited(silent));
        failure::attach(e, Fact::Deadline)
    }

    /// Since when `r` has been silent, as far as this rank knows.
    fn seen_since(&self, r: usize, watching: Instant) -> Instant {
        self.seen[r].as_ref().map(|(_, at)| *at).unwrap_or(watching)
    }
}

/// What a rank says of the rank the store says is lost, while it waited for `what`:
/// failed (how), or gave up (what it waited for: no crash).
fn lost(v: &crate::rendezvous::Verdict, what: &str) -> String {
    let (r, why) = (v.rank, &v.why);
    match v.gave_up {
        true => format!("rank {r} gave up ({why}) and is gone while this rank was waiting for {what}"),
        false => format!("rank {r} failed ({why}) while this rank was waiting for {what}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rendezvous::{Join, StoreServer};
    use std::thread;

    fn join(port: u16, rank: usize) -> Store {
        let j = Join {
            job_id: "job-w".into(),
            world_size: 3,
            rank,
            secret: None,
        };
        Store::connect("127.0.0.1", port, &j, Duration::from_secs(5)).unwrap()
    }

    /// A store for 3 ranks, joined as rank 0 (the watchdog's) and as rank 1 (alive): the
    /// store (kept running), its port, rank 0's connection and rank 1's.
    fn ranks_0_and_1() -> (StoreServer, u16, Store, Store) {
        let server = StoreServer::start("127.0.0.1:0".parse().unwrap(), "job-w", 3).unwrap();
        let port = server.addr().port();
        let (me, alive) = (join(port, 0), join(port, 1));
        (server, port, me, alive)
    }

    /// Calls `check` as a waiting rank does, until it fails (or 10 s pass).
    fn wait_until_it_fails(dog: &mut Watchdog) -> (String, Duration) {
        let since = Instant::now();
        while since.elapsed() < Duration::from_secs(10) {
            if let Err(e) = dog.check(since, since, "the GPU to finish all-reduce (ncclAllReduce)") {
                return (format!("{e:#}"), since.elapsed());
            }
            thread::sleep(Duration::from_millis(5));
        }
        panic!("the watchdog never gave up");
    }

    #[test]
    fn at_the_deadline_the_silent_rank_is_named_not_the_live_one() {
        let server = StoreServer::start("127.0.0.1:0".parse().unwrap(), "job-w", 3).unwrap();
        let port = server.addr().port();
        let me = join(port, 0);
        // Rank 1 beats as a waiting rank does; rank 2 joined, then froze.
        let _frozen = join(port, 2);
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let beating = {
            let stop = stop.clone();
            thread::spawn(move || {
                let mut live = join(port, 1);
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    n += 1;
                    live.set("beat/1", &n.to_le_bytes()).unwrap();
                    thread::sleep(Duration::from_millis(50));
                }
                live.bye();
            })
        };
        let mut dog = Watchdog::new(&me, 0, 3, Duration::from_secs(4)).unwrap();
        let (why, took) = wait_until_it_fails(&mut dog);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        beating.join().unwrap();
        assert!(
            why.starts_with("rank 2 stopped responding: no sign of life in the last "),
            "{why}"
        );
        assert!(
            why.contains("nothing finished in 4 s (--timeout) waiting for the GPU to finish all-reduce"),
            "{why}"
        );
        assert!(
            took >= Duration::from_secs(4) && took < Duration::from_secs(6),
            "{took:?}"
        );
    }

    #[test]
    fn a_rank_whose_connection_closes_is_named_at_once() {
        let (_server, port, me, _alive) = ranks_0_and_1();
        drop(join(port, 2)); // killed: no goodbye
        let mut dog = Watchdog::new(&me, 0, 3, Duration::from_secs(30)).unwrap();
        let (why, took) = wait_until_it_fails(&mut dog);
        assert!(why.starts_with("rank 2 failed ("), "{why}");
        assert!(took < Duration::from_secs(2), "{took:?}");
    }

    #[test]
    fn a_rank_that_gave_up_is_said_to_have_given_up_not_to_have_failed() {
        // Rank 2's own deadline passed first: its watchdog told the store it gives up, then
        // its process ended. Rank 0's watchdog names it at once, as having given up.
        let (_server, port, me, _alive) = ranks_0_and_1();
        let mut two = join(port, 2);
        two.give_up("nothing finished in 4 s (--timeout) waiting for the GPU")
            .unwrap();
        drop(two);
        let mut dog = Watchdog::new(&me, 0, 3, Duration::from_secs(30)).unwrap();
        let (why, took) = wait_until_it_fails(&mut dog);
        assert!(
            why.starts_with(
                "rank 2 gave up (nothing finished in 4 s (--timeout) waiting for the GPU) and is gone while this rank \
                 was waiting for the GPU to finish all-reduce"
            ),
            "{why}"
        );
        assert!(took < Duration::from_secs(2), "{took:?}");
    }

    #[test]
    fn nccls_own_error_names_the_rank_the_store_lost_with_ncclss_words_after() {
        // On a GPU (4 nodes of one H100, NCCL 2.28.3), a peer killed during an all-reduce
        // made NCCL say "ncclRemoteError: socketProgress: Connection closed by remote
        // peer" on two ranks before their store said who had died.
        let (_server, port, me, _alive) = ranks_0_and_1();
        let mut dog = Watchdog::new(&me, 0, 3, Duration::from_secs(30)).unwrap();
        let nccl = || {
            anyhow::anyhow!(
                "rank 0: NCCL failed in all-reduce (ncclAllReduce) with ncclRemoteError: socketProgress: Connection closed by remote peer localhost<58742>"
            )
        };
        // Nobody lost: NCCL's words alone, after the grace.
        let e = dog.name_the_lost(nccl(), "the GPU", Duration::from_millis(200));
        assert!(!crate::error::names_culprit(&e), "{e:#}");
        // Rank 2's process died: named, NCCL's words kept.
        drop(join(port, 2));
        let e = dog.name_the_lost(nccl(), "the GPU to finish all-reduce", Duration::from_secs(2));
        let said = format!("{e:#}");
        assert!(crate::error::names_culprit(&e), "{said}");
        assert!(said.starts_with("rank 2 failed ("), "{said}");
        assert!(
            said.contains("; NCCL then said: NCCL failed in all-reduce (ncclAllReduce) with ncclRemoteError"),
            "{said}"
        );
    }
}
