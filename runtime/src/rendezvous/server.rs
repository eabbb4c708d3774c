//! The store's server: rank 0 listens on the master address, and a thread per
//! connection admits joins (refusing another job's ranks, a join without the job's
//! secret, a wrong world size, a rank twice, a heartbeat that is not its rank's own, and
//! strangers past a cap), serves `set`, `get`, waits and barriers within the store's
//! limits, notes heartbeats and lost ranks, and answers whom to blame for a failure.
//! Connections past the store's cap are refused by the accepting thread itself.

use super::{
    BEAT, BLAME, BYE, CLOCK, ERR, FIRST_LOST, FULL, GET, GIVE_UP, HELLO, MAX_FRAME, OK, ROLE_HEARTBEAT, ROLE_RANK, SET,
    Until, Verdict, WAIT, WAITING,
};
use crate::secret::{ENV_SECRET, Secret};
use crate::units::human_bytes;
use crate::wire::{self, Decoder, Encoder};
use anyhow::{Result, anyhow};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::net::TcpListener;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// The largest join: a job id (200 bytes at most), a world size and a rank.
const MAX_HELLO: u64 = 4 << 10;
/// How long a connection may take to join, whatever it sends meanwhile.
const JOIN_WITHIN: Duration = Duration::from_secs(10);
/// Connections that have not joined yet, at most: past it the oldest is closed, so that
/// junk can neither exhaust this process's descriptors nor crowd a real rank out.
pub(crate) const MAX_STRANGERS: usize = 64;
/// Heartbeat connections one rank may hold at once: its heartbeat's, and one more (a
/// communicator made anew before the closing of the last one's reached the store). A
/// rank's own connection is one: a rank joins once.
const MAX_HEARTBEATS: usize = 2;
/// The most one key may hold: twice the largest value the workbook sets (a piece of a
/// rank's trace, `common::trace::PIECE_BYTES`, 4 MiB; the rest are rows, addresses, ids
/// and accounts of some bytes per rank).
const MAX_VALUE: usize = 8 << 20;
/// What one key costs the store beside its name and value (the map's own bookkeeping),
/// so that a flood of empty keys is counted too.
const ENTRY_COST: usize = 64;
/// The size of the token a rank's join is answered with, which its heartbeat shows.
const TOKEN: usize = 16;

/// What the store of a job of `world` ranks may hold, keys and values: 256 MiB, and 1 MiB
/// per rank. Far more than the workbook keeps there: a whole `--trace` (at most 200,000
/// events for the job, tens of MB), and per rank its accounts of point-to-point calls
/// (some bytes per peer) and the rows of its tables. Without it one joined client could
/// grow rank 0 without end (1.66 GB in 7 s).
fn max_held(world: usize) -> usize {
    (256usize << 20).saturating_add(world.saturating_mul(1 << 20))
}

/// The connections the store of a job of `world` ranks holds at once, joined or not: two
/// per rank (its own, and its heartbeat's) and [`MAX_STRANGERS`] not joined yet. Past it,
/// the accepting thread refuses a connection at once ([`refuse`]), without a thread of its
/// own, so that no flood exhausts rank 0's threads or descriptors
/// ([`crate::limits::files_needed`] counts them).
fn max_connections(world: usize) -> usize {
    world.saturating_mul(2).saturating_add(MAX_STRANGERS)
}

/// The store's server side, running on threads of rank 0's process.
pub struct StoreServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

struct Shared {
    job_id: String,
    /// The secret every join must carry ([`crate::secret`]); `None`: no join may carry one.
    secret: Option<Secret>,
    world_size: usize,
    /// What the store may hold, keys and values ([`max_held`]).
    max_held: usize,
    /// The kernel this store runs under ([`crate::clock::boot_id`]), for [`Store::clock`](super::Store::clock).
    boot: String,
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    kv: HashMap<String, Vec<u8>>,
    /// What `kv` holds, as [`max_held`] counts it (each key's name and value, and
    /// [`ENTRY_COST`]).
    held: usize,
    /// Ranks that joined, with where they joined from.
    joined: BTreeMap<usize, String>,
    /// The token each rank's join was answered with: its heartbeat connections show it,
    /// so that only its own process can beat for it.
    tokens: HashMap<usize, [u8; TOKEN]>,
    /// The heartbeat connections each rank holds now ([`MAX_HEARTBEATS`] at most).
    heartbeats: HashMap<usize, usize>,
    /// Ranks that said goodbye: their connection closing is expected.
    finished: HashSet<usize>,
    /// Ranks whose connection closed without a goodbye, and how.
    lost: BTreeMap<usize, String>,
    /// The first rank lost, whatever the reason: what a rank waiting on others learns.
    first_lost: Option<usize>,
    /// The first rank lost that had not given up (killed, crashed): the cause of the
    /// failures that follow.
    first_failed: Option<usize>,
    /// Ranks that gave up ([`GIVE_UP`]: a wait of their own timed out, with nobody to
    /// blame), and what they waited for: when they exit, they are no crash.
    gave_up: BTreeMap<usize, String>,
    /// The first rank that gave up.
    first_gave_up: Option<usize>,
    /// What each rank is waiting for in the store now: a rank missing from a wait that
    /// is itself waiting here is not the one stuck.
    waiting: HashMap<usize, String>,
    /// When each rank's heartbeat last came (the ranks that beat: the CPU backend's).
    beats: HashMap<usize, Instant>,
    /// The rank to blame for the job's failure, and why, once a rank asked
    /// ([`Store::blame`](super::Store::blame)): every rank that asks later gets the same answer
    /// (not kept while the answer is a rank that only gave up).
    culprit: Option<Verdict>,
}

impl StoreServer {
    /// Binds the store of a job without a secret at `addr` (the master address, not every
    /// interface) and serves it on background threads until the process exits.
    pub fn start(addr: SocketAddr, job_id: &str, world_size: usize) -> Result<StoreServer> {
        Self::start_with(addr, job_id, world_size, None)
    }

    /// [`StoreServer::start`], for a job whose every join must carry `secret` (`None`: a
    /// job without one, where no join may carry one).
    pub fn start_with(
        addr: SocketAddr,
        job_id: &str,
        world_size: usize,
        secret: Option<Secret>,
    ) -> Result<StoreServer> {
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
            secret,
            world_size,
            max_held: max_held(world_size),
            boot: crate::clock::boot_id(),
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
        });
        let server = StoreServer {
            addr: listener.local_addr()?,
            shared: shared.clone(),
        };
        let (most, at) = (max_connections(world_size), server.addr);
        let full = format!(
            "the store at {at} holds {most} connections, the most it takes for a job of {world_size} ranks (2 per \
             rank, and {MAX_STRANGERS} joining): something else is connecting to it"
        );
        thread::Builder::new().name("store-accept".into()).spawn(move || {
            let strangers: Arc<Mutex<Strangers>> = Arc::default();
            // Connections with a thread of their own, until that thread ends.
            let live = Arc::new(AtomicUsize::new(0));
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
                if live.load(Ordering::Acquire) >= most {
                    refuse(conn, full.as_bytes());
                    continue;
                }
                let (shared, strangers, counted) = (shared.clone(), strangers.clone(), Live::count(&live));
                let _ = thread::Builder::new().name("store-conn".into()).spawn(move || {
                    // Counted out when this thread ends (or never starts), after the connection closed.
                    let _counted = counted;
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
            // Every other rank that joined has said goodbye or is gone (rank 0, whose store
            // this is, is leaving: a rank alone, or one that failed, says no goodbye, and
            // waiting for it held every such exit for the whole limit).
            let others = st.joined.keys().filter(|r| **r != 0);
            let gone = others
                .clone()
                .filter(|r| st.finished.contains(r) || st.lost.contains_key(r));
            if gone.count() >= others.count() {
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

/// One connection counted among the store's live ones ([`max_connections`]) while this
/// lives: its thread holds it, and drops it last.
struct Live(Arc<AtomicUsize>);

impl Live {
    fn count(live: &Arc<AtomicUsize>) -> Live {
        live.fetch_add(1, Ordering::AcqRel);
        Live(live.clone())
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Refuses a connection past the store's cap, on the accepting thread and without ever
/// blocking it: reads what already came (closing with unread bytes would reset the
/// connection and lose the answer), says why in one frame, and closes. A rank that meets
/// it tries again until its deadline.
fn refuse(mut conn: TcpStream, why: &[u8]) {
    use std::io::Read;
    if conn.set_nonblocking(true).is_err() {
        return;
    }
    let mut came = [0u8; 1024];
    for _ in 0..MAX_HELLO as usize / came.len() {
        if !matches!(conn.read(&mut came), Ok(n) if n > 0) {
            break;
        }
    }
    let _ = wire::write_frame(&mut conn, FULL, why);
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
    let (rank, role, answer) = match shared.join(&payload, &peer) {
        Ok(joined) => joined,
        Err(why) => {
            let _ = wire::write_frame(&mut conn, ERR, why.as_bytes());
            return;
        }
    };
    let _ = conn.set_read_timeout(None);
    if role == ROLE_HEARTBEAT {
        if wire::write_frame(&mut conn, OK, &answer).is_ok() {
            serve_beats(&mut conn, shared, rank);
        }
        shared.update(|st| {
            if let Some(n) = st.heartbeats.get_mut(&rank) {
                *n = n.saturating_sub(1);
            }
        });
        return;
    }
    if wire::write_frame(&mut conn, OK, &answer).is_err() {
        return;
    }
    let how = loop {
        let (kind, payload) = match wire::read_frame(&mut conn, MAX_FRAME) {
            Ok(frame) => frame,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break "its connection closed".to_string(),
            Err(e) => break format!("its connection failed: {e}"),
        };
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
        let how = match st.gave_up.get(&rank) {
            Some(why) => format!("it gave up: {why}"),
            None => {
                st.first_failed.get_or_insert(rank);
                how
            }
        };
        st.lost.insert(rank, how)
    });
}

/// Serves the heartbeat connection of `rank`: notes each beat, and answers it. Nothing
/// else is taken on it (a beat is empty: no frame larger than a join is read), and its
/// closing says nothing (the rank's own connection says whether it is gone).
fn serve_beats(conn: &mut TcpStream, shared: &Shared, rank: usize) {
    while let Ok((BEAT, _)) = wire::read_frame(conn, MAX_HELLO) {
        shared
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .beats
            .insert(rank, Instant::now());
        if wire::write_frame(conn, OK, &[]).is_err() {
            return;
        }
    }
}

/// A key as a message shows it: one line, and at most 60 characters of it.
fn shown_key(key: &str) -> String {
    let line = crate::error::one_line(key);
    match line.char_indices().nth(60) {
        Some((cut, _)) => format!("'{}…'", &line[..cut]),
        None => format!("'{line}'"),
    }
}

impl Shared {
    fn update<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let r = f(&mut self.state.lock().unwrap_or_else(|p| p.into_inner()));
        self.changed.notify_all();
        r
    }

    /// Checks a join against the job: identity, secret, world size, rank, no second copy of
    /// a rank, a heartbeat only from its rank's own process and within [`MAX_HEARTBEATS`].
    /// Returns the rank, what the connection joins as (a rank, or its heartbeat) and the
    /// answer's body (to a rank, the token its heartbeats are to show).
    fn join(&self, payload: &[u8], peer: &str) -> std::result::Result<(usize, u64, Vec<u8>), String> {
        let mut d = Decoder(payload);
        let malformed = |e: io::Error| format!("malformed join: {e}");
        let (job, world, rank) = (|| Ok::<_, io::Error>((d.str()?, d.u64()?, d.u64()?)))().map_err(malformed)?;
        // Then, each in turn if there: the role, the secret, the token.
        let role = if d.0.is_empty() {
            ROLE_RANK
        } else {
            d.u64().map_err(malformed)?
        };
        let secret = if d.0.is_empty() {
            ""
        } else {
            d.str().map_err(malformed)?
        };
        let token = if d.0.is_empty() {
            &[][..]
        } else {
            d.bytes().map_err(malformed)?
        };
        if job != self.job_id {
            return Err(format!(
                "this store belongs to job '{}', not to job '{job}': is another job using the same \
                 master port, or is this a rank left over from an earlier run?",
                self.job_id
            ));
        }
        // Before anything about the job's ranks is said or changed.
        match (&self.secret, secret) {
            (Some(_), "") => {
                return Err(format!(
                    "this job's store takes only joins that carry the job's secret ({ENV_SECRET}), and this one \
                     carries none: its launcher gives its ranks theirs; ranks started otherwise need the same \
                     {ENV_SECRET} set on every rank"
                ));
            }
            (Some(ours), theirs) if !ours.matches(theirs) => {
                return Err(format!(
                    "the secret this join carries ({ENV_SECRET}) is not this job's: is it a rank of another job, or \
                     of an earlier run?"
                ));
            }
            (None, theirs) if !theirs.is_empty() => {
                return Err(format!(
                    "this join carries a secret ({ENV_SECRET}), and rank 0, which hosts the store, was started \
                     without one: set the same one on every rank, or on none"
                ));
            }
            _ => {}
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
            // A heartbeat comes from the process of a rank that has joined (it shows the
            // token that rank's join was answered with): it adds no rank.
            ROLE_HEARTBEAT => {
                return self.update(|st| {
                    let Some(ours) = st.tokens.get(&rank) else {
                        return Err(format!("a heartbeat of rank {rank}, which has not joined"));
                    };
                    if !crate::secret::same(ours, token) {
                        return Err(format!(
                            "a heartbeat for rank {rank} from {peer}, which is not rank {rank}'s own process (it \
                             lacks the token of rank {rank}'s join): it is not counted"
                        ));
                    }
                    let n = st.heartbeats.entry(rank).or_default();
                    if *n >= MAX_HEARTBEATS {
                        return Err(format!(
                            "rank {rank} already holds {n} heartbeat connections, the most one rank may hold"
                        ));
                    }
                    *n += 1;
                    Ok((rank, role, Vec::new()))
                });
            }
            other => return Err(format!("malformed join: role {other}")),
        }
        let token = crate::secret::random_bytes::<TOKEN>().map_err(|e| format!("rank {rank}: {e:#}"))?;
        self.update(|st| {
            if let Some(first) = st.joined.get(&rank) {
                return Err(format!(
                    "rank {rank} has already joined from {first}: two processes claim the same rank"
                ));
            }
            st.joined.insert(rank, peer.to_string());
            st.tokens.insert(rank, token);
            Ok((rank, role, token.to_vec()))
        })
    }

    /// Sets `key` to `value` for `rank`, within the store's limits: [`MAX_VALUE`] for one
    /// key, [`Shared::max_held`] in all (a key set again counts once, at its new size).
    fn set(&self, rank: usize, key: &str, value: &[u8]) -> std::result::Result<(), String> {
        if value.len() > MAX_VALUE {
            return Err(format!(
                "rank {rank} set {} to {}: one key of the store holds at most {}",
                shown_key(key),
                human_bytes(value.len()),
                human_bytes(MAX_VALUE)
            ));
        }
        let cost = ENTRY_COST + key.len() + value.len();
        self.update(|st| {
            let before = st.kv.get(key).map_or(0, |v| ENTRY_COST + key.len() + v.len());
            let after = st.held.saturating_sub(before).saturating_add(cost);
            if after > self.max_held {
                return Err(format!(
                    "rank {rank} set {} ({}) past what the store keeps for a job of {} ranks, {} (256 MiB, and 1 MiB \
                     per rank), of which it holds {} already",
                    shown_key(key),
                    human_bytes(value.len()),
                    self.world_size,
                    human_bytes(self.max_held),
                    human_bytes(st.held)
                ));
            }
            st.held = after;
            st.kv.insert(key.to_string(), value.to_vec());
            Ok(())
        })
    }

    /// Answers one request of `rank`.
    fn request(&self, rank: usize, kind: u8, payload: &[u8]) -> std::result::Result<Vec<u8>, String> {
        let mut d = Decoder(payload);
        let malformed = |e: io::Error| format!("malformed request: {e}");
        match kind {
            SET => {
                let (key, value) = (d.str().map_err(malformed)?, d.bytes().map_err(malformed)?);
                self.set(rank, key, value).map(|()| Vec::new())
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
                let reply = self.wait(rank, &keys, &what, timeout);
                // A rank whose wait failed fails too, from this meeting: it stays counted
                // in it, so that no moment shows it busy elsewhere.
                if reply.is_ok() {
                    self.update(|st| st.waiting.remove(&rank));
                }
                reply
            }
            FIRST_LOST => {
                let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
                // How it went: what it waited for, if it gave up.
                Ok(match st.first_lost {
                    Some(r) => match st.gave_up.get(&r) {
                        Some(why) => Encoder::default().u64(1).u64(r as u64).str(why).u64(1).0,
                        None => Encoder::default().u64(1).u64(r as u64).str(&st.lost[&r]).u64(0).0,
                    },
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
                // A rank that only gave up stands until a lost or silent one is found: it is
                // not kept as the job's answer.
                let verdict = match &st.culprit {
                    Some(v) => Some(v.clone()),
                    None => culprit(&st, rank, quiet, Instant::now()),
                };
                if st.culprit.is_none() && verdict.as_ref().is_some_and(|v| !v.gave_up) {
                    st.culprit = verdict.clone();
                }
                Ok(match &verdict {
                    Some(v) => {
                        Encoder::default()
                            .u64(1)
                            .u64(v.rank as u64)
                            .str(&v.why)
                            .u64(v.gave_up as u64)
                            .0
                    }
                    None => Encoder::default().u64(0).0,
                })
            }
            GIVE_UP => {
                let why = d.str().map_err(malformed)?.to_string();
                self.update(|st| {
                    st.gave_up.entry(rank).or_insert(why);
                    st.first_gave_up.get_or_insert(rank);
                });
                Ok(Vec::new())
            }
            CLOCK => Ok(Encoder::default().u64(crate::clock::monotonic_ns()).str(&self.boot).0),
            other => Err(format!("unknown request kind {other}")),
        }
    }

    /// Blocks until every key is set; fails at the deadline, or at once if a rank is lost,
    /// or if the values are more than one answer to `rank` carries ([`MAX_FRAME`]: a wait
    /// that names one key many times must not make the store build gigabytes).
    fn wait(
        &self,
        rank: usize,
        keys: &[(String, u64)],
        what: &str,
        timeout: Duration,
    ) -> std::result::Result<Vec<u8>, String> {
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
                let said = match st.gave_up.contains_key(rank) {
                    true => format!("rank {rank} is gone ({how}) while waiting for {what}"),
                    false => format!("rank {rank} is gone ({how}; it crashed or was killed) while waiting for {what}"),
                };
                return Err(super::with_awaited(said, &[*rank]));
            }
            if missing.is_empty() {
                let size = keys
                    .iter()
                    .map(|(k, _)| 4 + st.kv[k].len())
                    .fold(0usize, usize::saturating_add);
                if size > MAX_FRAME as usize {
                    return Err(format!(
                        "rank {rank} waited for {} keys that hold {} together, more than one answer of the store \
                         carries ({}): wait for fewer at once",
                        keys.len(),
                        human_bytes(size),
                        human_bytes(MAX_FRAME as usize)
                    ));
                }
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

/// The rank to blame for a failure that `asker` met, and why: the first rank lost that
/// had not given up (its connection closed without a goodbye: killed, crashed, or exited
/// without a word), else the rank whose heartbeat has been missing longest, at least
/// `quiet` (its process is stopped or frozen: it cannot even beat), else the first rank
/// that gave up (its own wait timed out: it is no crash, and the rank it waited for may
/// be the asker's cause too). `None` when every rank is alive, beating and waiting.
fn culprit(st: &State, asker: usize, quiet: Duration, now: Instant) -> Option<Verdict> {
    if let Some(r) = st.first_failed {
        return Some(Verdict::new(r, format!("failed first ({})", st.lost[&r]), false));
    }
    let gone = |r: &usize| st.finished.contains(r) || st.lost.contains_key(r) || *r == asker;
    let silent = st
        .beats
        .iter()
        .filter(|(r, _)| !gone(r))
        .map(|(r, at)| (now.saturating_duration_since(*at), *r))
        .filter(|(silent, _)| *silent >= quiet)
        .max()
        .map(|(silent, r)| {
            let why = format!(
                "stopped responding (no heartbeat for {}: its process is stopped or frozen)",
                crate::units::human_duration(Duration::from_millis(silent.as_millis() as u64 / 100 * 100))
            );
            Verdict::new(r, why, false)
        });
    silent.or_else(|| {
        let r = st.first_gave_up.filter(|r| *r != asker)?;
        Some(Verdict::new(r, format!("gave up first ({})", st.gave_up[&r]), true))
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
