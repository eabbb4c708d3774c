//! The store's server: rank 0 listens on the master address, and a thread per
//! connection admits joins (refusing another job's ranks, a wrong world size, a rank
//! twice, and strangers past a cap), serves `set`, `get`, waits and barriers, notes
//! heartbeats and lost ranks, and answers whom to blame for a failure.

use super::{
    BEAT, BLAME, BYE, CLOCK, ERR, FIRST_LOST, GET, HELLO, MAX_FRAME, OK, ROLE_HEARTBEAT, ROLE_RANK, SET, Until, WAIT,
    WAITING,
};
use crate::wire::{self, Decoder, Encoder};
use anyhow::{Result, anyhow};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::net::TcpListener;
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// The largest join: a job id (200 bytes at most), a world size and a rank.
const MAX_HELLO: u64 = 4 << 10;
/// How long a connection may take to join, whatever it sends meanwhile.
const JOIN_WITHIN: Duration = Duration::from_secs(10);
/// Connections that have not joined yet, at most: past it the oldest is closed, so that
/// junk can neither exhaust this process's descriptors nor crowd a real rank out.
const MAX_STRANGERS: usize = 64;

/// The store's server side, running on threads of rank 0's process.
pub struct StoreServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

struct Shared {
    job_id: String,
    world_size: usize,
    /// The kernel this store runs under ([`crate::clock::boot_id`]), for [`Store::clock`](super::Store::clock).
    boot: String,
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    kv: HashMap<String, Vec<u8>>,
    /// Ranks that joined, with where they joined from.
    joined: BTreeMap<usize, String>,
    /// Ranks that said goodbye: their connection closing is expected.
    finished: HashSet<usize>,
    /// Ranks whose connection closed without a goodbye, and how.
    lost: BTreeMap<usize, String>,
    /// The first rank lost: the cause of the failures that follow.
    first_lost: Option<usize>,
    /// What each rank is waiting for in the store now: a rank missing from a wait that
    /// is itself waiting here is not the one stuck.
    waiting: HashMap<usize, String>,
    /// When each rank's heartbeat last came (the ranks that beat: the CPU backend's).
    beats: HashMap<usize, Instant>,
    /// The rank to blame for the job's failure, and why, once a rank asked
    /// ([`Store::blame`](super::Store::blame)): every rank that asks later gets the same answer.
    culprit: Option<(usize, String)>,
}

impl StoreServer {
    /// Binds the store at `addr` (the master address, not every interface) and serves it
    /// on background threads until the process exits.
    pub fn start(addr: SocketAddr, job_id: &str, world_size: usize) -> Result<StoreServer> {
        let listener = TcpListener::bind(addr).map_err(|e| match e.kind() {
            io::ErrorKind::AddrInUse => anyhow!(
                "port {} on {} is already in use (another job, or a program still running?): \
                 choose another with --master-port or MASTER_PORT",
                addr.port(),
                addr.ip()
            ),
            io::ErrorKind::AddrNotAvailable => anyhow!(
                "cannot host the store on {addr}: that address is not one of this machine's \
                 (rank 0 must run on the master host)"
            ),
            _ => anyhow!("cannot host the store on {addr}: {e}"),
        })?;
        let shared = Arc::new(Shared {
            job_id: job_id.to_string(),
            world_size,
            boot: crate::clock::boot_id(),
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
        });
        let server = StoreServer {
            addr: listener.local_addr()?,
            shared: shared.clone(),
        };
        thread::Builder::new().name("store-accept".into()).spawn(move || {
            let strangers: Arc<Mutex<Strangers>> = Arc::default();
            loop {
                let conn = match listener.accept() {
                    Ok((conn, _)) => conn,
                    Err(_) => {
                        // Out of descriptors (or another passing error): make room, and
                        // do not spin.
                        strangers.lock().unwrap_or_else(|p| p.into_inner()).close_oldest();
                        thread::sleep(Duration::from_millis(10));
                        continue;
                    }
                };
                let (shared, strangers) = (shared.clone(), strangers.clone());
                let _ = thread::Builder::new().name("store-conn".into()).spawn(move || {
                    // Counted in by its own thread, which alone closes it, after counting it out.
                    let id = strangers.lock().unwrap_or_else(|p| p.into_inner()).admit(&conn);
                    serve(conn, &shared, &|| {
                        strangers.lock().unwrap_or_else(|p| p.into_inner()).joined(id);
                    })
                });
            }
        })?;
        Ok(server)
    }

    /// The address the store listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Waits (at most `limit`) until every other rank has said goodbye or gone, so that
    /// rank 0 does not exit while others still wait for a reply from its store.
    pub fn drain(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        let mut st = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            // Every rank that joined, rank 0 included, has said goodbye or is gone.
            let gone = st
                .joined
                .keys()
                .filter(|r| st.finished.contains(r) || st.lost.contains_key(r));
            if gone.count() >= st.joined.len() {
                return;
            }
            let now = Instant::now();
            if now >= deadline {
                return;
            }
            st = self
                .shared
                .changed
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// Rank 0 leaving, for whatever reason, keeps its store up a moment (until every rank
/// has said goodbye or gone, 2 s at most): a rank still waiting for a reply gets it, and
/// meets the same error itself, rather than reporting a lost store.
impl Drop for StoreServer {
    fn drop(&mut self) {
        self.drain(Duration::from_secs(2));
    }
}

/// The connections that have not joined yet, oldest first, by descriptor: one descriptor
/// each (a clone would double what strangers cost rank 0). A connection's thread counts it
/// out ([`Strangers::joined`]) before it can close it, under the same lock as
/// [`Strangers::close_oldest`], so a descriptor listed here is always still that connection's.
#[derive(Default)]
struct Strangers {
    next: u64,
    waiting: std::collections::VecDeque<(u64, std::os::fd::RawFd)>,
}

impl Strangers {
    /// Counts a new connection in (closing the oldest stranger past the cap); its id.
    fn admit(&mut self, conn: &TcpStream) -> u64 {
        use std::os::fd::AsRawFd;
        if self.waiting.len() >= MAX_STRANGERS {
            self.close_oldest();
        }
        self.next += 1;
        self.waiting.push_back((self.next, conn.as_raw_fd()));
        self.next
    }

    /// Connection `id` joined (or ended): no longer a stranger.
    fn joined(&mut self, id: u64) {
        self.waiting.retain(|(i, _)| *i != id);
    }

    /// Shuts down the connection that has waited longest without joining: its thread's
    /// read ends at once, and its thread then closes it.
    fn close_oldest(&mut self) {
        if let Some((_, fd)) = self.waiting.pop_front() {
            // SAFETY: `fd` is open (its thread counts it out before closing it, under the
            // lock held here); shutdown(2) ends its reads and writes, and closes nothing.
            unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
        }
    }
}

/// Serves one connection: a join, then requests until goodbye or the connection ends.
/// `joined` is called once the join is read (or the connection gave up before it).
fn serve(mut conn: TcpStream, shared: &Shared, joined: &dyn Fn()) {
    let _ = conn.set_nodelay(true);
    let peer = conn.peer_addr().map(|a| a.to_string()).unwrap_or_default();
    // A join is small and comes at once: anything larger, or slower, is not a rank.
    let hello = wire::read_frame(&mut Until::new(&conn, Instant::now() + JOIN_WITHIN), MAX_HELLO);
    joined();
    let Ok((HELLO, payload)) = hello else {
        return;
    };
    let (rank, role) = match shared.join(&payload, &peer) {
        Ok(joined) => joined,
        Err(why) => {
            let _ = wire::write_frame(&mut conn, ERR, why.as_bytes());
            return;
        }
    };
    if wire::write_frame(&mut conn, OK, &[]).is_err() {
        return;
    }
    let _ = conn.set_read_timeout(None);
    let how = loop {
        let (kind, payload) = match wire::read_frame(&mut conn, MAX_FRAME) {
            Ok(frame) => frame,
            Err(_) if role == ROLE_HEARTBEAT => return,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break "its connection closed".to_string(),
            Err(e) => break format!("its connection failed: {e}"),
        };
        if role == ROLE_HEARTBEAT {
            // Only heartbeats; their connection closing says nothing.
            if kind != BEAT {
                return;
            }
            shared
                .state
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .beats
                .insert(rank, Instant::now());
            if wire::write_frame(&mut conn, OK, &[]).is_err() {
                return;
            }
            continue;
        }
        if kind == BYE {
            shared.update(|st| st.finished.insert(rank));
            return;
        }
        let reply = match shared.request(rank, kind, &payload) {
            Ok(body) => wire::write_frame(&mut conn, OK, &body),
            Err(why) => wire::write_frame(&mut conn, ERR, why.as_bytes()),
        };
        if let Err(e) = reply {
            break format!("its connection failed: {e}");
        }
    };
    shared.update(|st| {
        st.first_lost.get_or_insert(rank);
        st.lost.insert(rank, how)
    });
}

impl Shared {
    fn update<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let r = f(&mut self.state.lock().unwrap_or_else(|p| p.into_inner()));
        self.changed.notify_all();
        r
    }

    /// Checks a join against the job: identity, world size, rank, no second copy of a rank.
    /// Returns the rank and what the connection joins as (a rank, or its heartbeat).
    fn join(&self, payload: &[u8], peer: &str) -> std::result::Result<(usize, u64), String> {
        let mut d = Decoder(payload);
        let (job, world, rank) =
            (|| Ok::<_, io::Error>((d.str()?, d.u64()?, d.u64()?)))().map_err(|e| format!("malformed join: {e}"))?;
        let role = if d.0.is_empty() {
            ROLE_RANK
        } else {
            d.u64().map_err(|e| format!("malformed join: {e}"))?
        };
        if job != self.job_id {
            return Err(format!(
                "this store belongs to job '{}', not to job '{job}': is another job using the same \
                 master port, or is this a rank left over from an earlier run?",
                self.job_id
            ));
        }
        if world as usize != self.world_size {
            return Err(format!(
                "rank {rank} was started with a world of {world} ranks, but rank 0 with {}: \
                 every rank must be started with the same world size",
                self.world_size
            ));
        }
        crate::rank::check(rank as usize, world as usize, "the joining rank")?;
        let rank = rank as usize;
        match role {
            ROLE_RANK => {}
            // A heartbeat comes from a rank that has joined: it adds no rank.
            ROLE_HEARTBEAT
                if self
                    .state
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .joined
                    .contains_key(&rank) =>
            {
                return Ok((rank, role));
            }
            ROLE_HEARTBEAT => return Err(format!("a heartbeat of rank {rank}, which has not joined")),
            other => return Err(format!("malformed join: role {other}")),
        }
        self.update(|st| {
            if let Some(first) = st.joined.get(&rank) {
                return Err(format!(
                    "rank {rank} has already joined from {first}: two processes claim the same rank"
                ));
            }
            st.joined.insert(rank, peer.to_string());
            Ok((rank, role))
        })
    }

    /// Answers one request of `rank`.
    fn request(&self, rank: usize, kind: u8, payload: &[u8]) -> std::result::Result<Vec<u8>, String> {
        let mut d = Decoder(payload);
        let malformed = |e: io::Error| format!("malformed request: {e}");
        match kind {
            SET => {
                let (key, value) = (d.str().map_err(malformed)?, d.bytes().map_err(malformed)?);
                self.update(|st| st.kv.insert(key.to_string(), value.to_vec()));
                Ok(Vec::new())
            }
            GET => {
                let key = d.str().map_err(malformed)?;
                let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
                Ok(match st.kv.get(key) {
                    Some(v) => Encoder::default().u64(1).bytes(v).0,
                    None => Encoder::default().u64(0).0,
                })
            }
            WAIT => {
                let timeout = Duration::from_millis(d.u64().map_err(malformed)?);
                let what = d.str().map_err(malformed)?.to_string();
                let n = d.u64().map_err(malformed)? as usize;
                let mut keys = Vec::with_capacity(n.min(1 << 16));
                for _ in 0..n {
                    keys.push((d.str().map_err(malformed)?.to_string(), d.u64().map_err(malformed)?));
                }
                self.update(|st| st.waiting.insert(rank, what.clone()));
                let reply = self.wait(&keys, &what, timeout);
                // A rank whose wait failed fails too, from this meeting: it stays counted
                // in it, so that no moment shows it busy elsewhere.
                if reply.is_ok() {
                    self.update(|st| st.waiting.remove(&rank));
                }
                reply
            }
            FIRST_LOST => {
                let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
                Ok(match st.first_lost {
                    Some(r) => Encoder::default().u64(1).u64(r as u64).str(&st.lost[&r]).0,
                    None => Encoder::default().u64(0).0,
                })
            }
            WAITING => {
                let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
                let mut e = Encoder::default().u64(st.waiting.len() as u64);
                for r in st.waiting.keys() {
                    e = e.u64(*r as u64);
                }
                Ok(e.0)
            }
            BLAME => {
                let quiet = Duration::from_millis(d.u64().map_err(malformed)?);
                let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
                if st.culprit.is_none() {
                    st.culprit = culprit(&st, rank, quiet, Instant::now());
                }
                Ok(match &st.culprit {
                    Some((r, why)) => Encoder::default().u64(1).u64(*r as u64).str(why).0,
                    None => Encoder::default().u64(0).0,
                })
            }
            CLOCK => Ok(Encoder::default().u64(crate::clock::monotonic_ns()).str(&self.boot).0),
            other => Err(format!("unknown request kind {other}")),
        }
    }

    /// Blocks until every key is set; fails at the deadline, or at once if a rank is lost.
    fn wait(&self, keys: &[(String, u64)], what: &str, timeout: Duration) -> std::result::Result<Vec<u8>, String> {
        let deadline = Instant::now() + timeout;
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let missing: Vec<u64> = keys
                .iter()
                .filter(|(k, _)| !st.kv.contains_key(k))
                .map(|(_, r)| *r)
                .collect();
            // A rank that is gone will never set its key: fail now rather than at the deadline.
            if let Some((rank, how)) = missing.iter().find_map(|r| st.lost.get_key_value(&(*r as usize))) {
                let said = format!("rank {rank} is gone ({how}; it crashed or was killed) while waiting for {what}");
                return Err(super::with_awaited(said, &[*rank]));
            }
            if missing.is_empty() {
                let mut e = Encoder::default();
                for (k, _) in keys {
                    e = e.bytes(&st.kv[k]);
                }
                return Ok(e.0);
            }
            let now = Instant::now();
            if now >= deadline {
                let (why, busy) = missing_ranks(&st, &missing);
                let said = format!(
                    "timed out after {} waiting for {what}: {why}",
                    crate::units::human_duration(timeout)
                );
                return Err(super::with_awaited(said, &busy));
            }
            st = self
                .changed
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// The rank to blame for a failure that `asker` met, and why: the first rank lost (its
/// connection closed without a goodbye: killed, crashed, or exited without a word), else
/// the rank whose heartbeat has been missing longest, at least `quiet` (its process is
/// stopped or frozen: it cannot even beat). `None` when every rank is alive and beating.
fn culprit(st: &State, asker: usize, quiet: Duration, now: Instant) -> Option<(usize, String)> {
    if let Some(r) = st.first_lost {
        return Some((r, format!("failed first ({})", st.lost[&r])));
    }
    let gone = |r: &usize| st.finished.contains(r) || st.lost.contains_key(r) || *r == asker;
    st.beats
        .iter()
        .filter(|(r, _)| !gone(r))
        .map(|(r, at)| (now.saturating_duration_since(*at), *r))
        .filter(|(silent, _)| *silent >= quiet)
        .max()
        .map(|(silent, r)| {
            (
                r,
                format!(
                    "stopped responding (no heartbeat for {}: its process is stopped or frozen)",
                    crate::units::human_duration(Duration::from_millis(silent.as_millis() as u64 / 100 * 100))
                ),
            )
        })
}

/// Who of `missing` kept a wait from ending, the rank the others wait on first: ranks
/// alive but busy elsewhere (in a send or receive, on the GPU: not waiting in the store),
/// then ranks that are themselves waiting in the store for something else (they wait
/// too, and are no cause), then ranks that never joined.
/// Also returns the ranks that are alive but busy elsewhere: those the waiting ranks wait
/// for ([`super::with_awaited`]).
fn missing_ranks(st: &State, missing: &[u64]) -> (String, Vec<usize>) {
    let (mut busy, mut waiting, mut never) = (Vec::new(), Vec::new(), Vec::new());
    for r in missing {
        let rank = *r as usize;
        if !st.joined.contains_key(&rank) {
            never.push(*r);
        } else if let Some(what) = st.waiting.get(&rank) {
            match waiting.iter_mut().find(|(w, _): &&mut (String, Vec<u64>)| w == what) {
                Some((_, ranks)) => ranks.push(*r),
                None => waiting.push((what.clone(), vec![*r])),
            }
        } else {
            busy.push(*r);
        }
    }
    let mut said = Vec::new();
    if !busy.is_empty() {
        let (who, verb) = (crate::rank::list(&busy), if busy.len() == 1 { "is" } else { "are" });
        said.push(format!(
            "{who} {verb} alive but did not come: busy outside the store (stuck in a send, a receive or on the GPU?)"
        ));
    }
    // Grouped by what they waited for: thousands of ranks waiting alike are one clause.
    said.extend(waiting.iter().map(|(what, ranks)| {
        let verb = if ranks.len() == 1 {
            "was itself"
        } else {
            "were themselves"
        };
        format!("{} {verb} waiting for {what}", crate::rank::list(ranks))
    }));
    if !never.is_empty() {
        let hint = if never.len() == missing.len() {
            " (they never joined: did they start?)"
        } else {
            " (never joined)"
        };
        said.push(format!("{} not there{hint}", crate::rank::list(&never)));
    }
    (said.join("; "), busy.iter().map(|r| *r as usize).collect())
}
