//! Rendezvous: how ranks that know nothing but the master's address find each other.
//!
//! Rank 0 hosts a small TCP key-value store (the TCPStore of torchrun and PyTorch) at
//! the master address; every rank, rank 0 included, joins it as a client. A join carries
//! the job's identity, the world size and the rank, and the store refuses a rank that
//! disagrees with it. After that the ranks only `set` keys and `wait` for keys: the
//! NCCL unique id, each rank's address for the CPU backend, the rows of a table.
//!
//! Every wait has a deadline and, when it passes, names the ranks that never arrived.
//! A rank whose connection closes without a goodbye has crashed or been killed: every
//! wait then fails at once, naming it, instead of waiting for the deadline.

use crate::wire::{self, Decoder, Encoder};
use anyhow::{Result, anyhow, bail};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

const HELLO: u8 = 1;
const SET: u8 = 2;
const GET: u8 = 3;
const WAIT: u8 = 4;
const BYE: u8 = 5;
const FIRST_LOST: u8 = 6;
const CLOCK: u8 = 7;
const WAITING: u8 = 8;
/// A heartbeat, on a rank's heartbeat connection ([`Store::heartbeat`]).
const BEAT: u8 = 9;
/// Who is to blame for a failure ([`Store::blame`]).
const BLAME: u8 = 10;
const OK: u8 = 128;
const ERR: u8 = 129;
/// The largest message the store accepts: a table row, an address, an NCCL id.
const MAX_FRAME: u64 = 16 << 20;
/// What a connection joins as, after the rank (absent: [`ROLE_RANK`]).
const ROLE_RANK: u64 = 0;
/// A rank's heartbeat connection: it beats, and its closing says nothing (the rank's own
/// connection says whether the rank is gone).
const ROLE_HEARTBEAT: u64 = 1;
/// The largest join: a job id (200 bytes at most), a world size and a rank.
const MAX_HELLO: u64 = 4 << 10;
/// How long a connection may take to join, whatever it sends meanwhile.
const JOIN_WITHIN: Duration = Duration::from_secs(10);
/// Connections that have not joined yet, at most: past it the oldest is closed, so that
/// junk can neither exhaust this process's descriptors nor crowd a real rank out.
const MAX_STRANGERS: usize = 64;

/// Meets the job's other ranks: rank 0 starts the store on the master address (its
/// server), and every rank, rank 0 too, joins it. The one way the ranks meet, for a
/// `common::Session` and for a lesson that calls NCCL itself (`common::meet`).
pub fn meet(id: &crate::launch::Identity, timeout: Duration) -> Result<(Store, Option<StoreServer>)> {
    use anyhow::Context;
    let server = match id.rank {
        0 => {
            let addr = (id.master_addr.as_str(), id.store_port)
                .to_socket_addrs()
                .with_context(|| format!("resolving the master address {}", id.master_addr))?
                .next()
                .ok_or_else(|| anyhow!("the master address {} resolves to nothing", id.master_addr))?;
            Some(StoreServer::start(addr, &id.job_id, id.world_size)?)
        }
        _ => None,
    };
    let join = Join {
        job_id: id.job_id.clone(),
        world_size: id.world_size,
        rank: id.rank,
    };
    let store = Store::connect(&id.master_addr, id.store_port, &join, timeout)?;
    Ok((store, server))
}

/// Leaves the store met with [`meet`]: says goodbye, and on rank 0 lets the others say
/// theirs (at most 5 s, or `timeout`) before the server goes.
pub fn leave(store: &mut Store, server: Option<&StoreServer>, timeout: Duration) {
    store.bye();
    if let Some(server) = server {
        server.drain(timeout.min(Duration::from_secs(5)));
    }
}

/// Who is joining: sent first on every connection to the store.
#[derive(Clone, Debug)]
pub struct Join {
    /// The job's identity: ranks of another job, or of an earlier run, are refused.
    pub job_id: String,
    /// The world size this rank was started with.
    pub world_size: usize,
    /// This rank.
    pub rank: usize,
}

/// The store's server side, running on threads of rank 0's process.
pub struct StoreServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

struct Shared {
    job_id: String,
    world_size: usize,
    /// The kernel this store runs under ([`crate::clock::boot_id`]), for [`Store::clock`].
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
    /// ([`Store::blame`]): every rank that asks later gets the same answer.
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

/// Reads from a connection until `deadline`, however slowly the bytes come: a peer
/// that sends a byte now and then cannot hold a read past it (a socket's read timeout
/// restarts at every byte). Counts what it read, so that a reply too slow can be told
/// from no reply at all.
struct Until<'a>(&'a TcpStream, Instant, usize);

impl<'a> Until<'a> {
    fn new(conn: &'a TcpStream, deadline: Instant) -> Self {
        Until(conn, deadline, 0)
    }
}

impl io::Read for Until<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.1.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        self.0.set_read_timeout(Some(left))?;
        let n = (&mut &*self.0).read(buf)?;
        self.2 += n;
        Ok(n)
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
                return Err(format!(
                    "rank {rank} is gone ({how}; it crashed or was killed) while waiting for {what}"
                ));
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
                return Err(format!(
                    "timed out after {} waiting for {what}: {}",
                    crate::units::human_duration(timeout),
                    missing_ranks(&st, &missing)
                ));
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
fn missing_ranks(st: &State, missing: &[u64]) -> String {
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
    said.join("; ")
}

/// The store stopped answering or closed: rank 0, its host, is stopped or gone. Typed,
/// so that a rank explaining its failure does not ask the store again (each question
/// would wait for an answer that cannot come).
#[derive(Debug)]
pub struct StoreLost(String);

impl std::fmt::Display for StoreLost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for StoreLost {}

/// Whether `err` (or what it wraps) is a [`StoreLost`].
pub fn lost_the_store(err: &anyhow::Error) -> bool {
    err.chain().any(|e| e.is::<StoreLost>())
}

/// What the store answered to a request it could not grant: a wait whose ranks never
/// came or are gone, a refusal. Typed, so that a rank tells a failure that other ranks
/// caused (it then asks whom to blame) from its own.
#[derive(Debug)]
pub struct StoreSaid(String);

impl std::fmt::Display for StoreSaid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for StoreSaid {}

/// Whether `err` (or what it wraps) is the store's answer ([`StoreSaid`]).
pub fn store_said(err: &anyhow::Error) -> bool {
    err.chain().any(|e| e.is::<StoreSaid>())
}

/// A rank's connection to the store.
pub struct Store {
    conn: TcpStream,
    addr: String,
    timeout: Duration,
    /// How long to wait for any reply: a wait's own deadline plus [`deadline::SLACK`].
    reply_within: Duration,
}

impl Store {
    /// Joins the store at `host:port`, retrying until `timeout` while the master is not
    /// up yet; a refusal (wrong job, world size or rank) fails at once.
    pub fn connect(host: &str, port: u16, join: &Join, timeout: Duration) -> Result<Store> {
        let addr = format!("{host}:{port}");
        let deadline = Instant::now() + timeout;
        let mut last_err;
        loop {
            match try_connect(&addr, join, ROLE_RANK, deadline, timeout) {
                Ok(conn) => {
                    return Ok(Store {
                        conn,
                        addr,
                        timeout,
                        reply_within: timeout + crate::deadline::SLACK,
                    });
                }
                Err(Attempt::Refused(why)) => bail!("the store at {addr} refused this rank: {why}"),
                Err(Attempt::Silent(why)) => bail!("{why}"),
                Err(Attempt::Failed(e)) => last_err = e,
            }
            if Instant::now() >= deadline {
                bail!(
                    "could not reach the master at {addr} within {} ({last_err}): is rank 0 running, \
                     and is the address right?",
                    crate::units::human_duration(timeout)
                );
            }
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// A second handle on this same connection whose requests give up after `limit`:
    /// for quick looks (`set`, `get`, `first_lost`) while the rank waits on something
    /// else, such as the GPU. The two handles must never be used at the same time (one
    /// thread, one request at a time), as each request reads its own reply.
    pub fn watcher(&self, limit: Duration) -> Result<Store> {
        Ok(Store {
            conn: self.conn.try_clone()?,
            addr: self.addr.clone(),
            timeout: limit,
            reply_within: limit,
        })
    }

    /// Sets `key` to `value` for every rank to see.
    pub fn set(&mut self, key: &str, value: &[u8]) -> Result<()> {
        self.call(SET, &Encoder::default().str(key).bytes(value).0, key)
            .map(drop)
    }

    /// Reads `key` if it is set, without waiting.
    pub fn get(&mut self, key: &str) -> Result<Option<Vec<u8>>> {
        let reply = self.call(GET, &Encoder::default().str(key).0, key)?;
        let mut d = Decoder(&reply);
        Ok(if d.u64()? == 1 { Some(d.bytes()?.to_vec()) } else { None })
    }

    /// Waits until each `(key, rank that sets it)` is set and returns the values in order.
    /// `what` says what is awaited, for the message if it times out.
    pub fn wait(&mut self, keys: &[(String, usize)], what: &str) -> Result<Vec<Vec<u8>>> {
        let mut e = Encoder::default()
            .u64(self.timeout.as_millis() as u64)
            .str(what)
            .u64(keys.len() as u64);
        for (k, r) in keys {
            e = e.str(k).u64(*r as u64);
        }
        let reply = self.call(WAIT, &e.0, what)?;
        let mut d = Decoder(&reply);
        keys.iter().map(|_| Ok(d.bytes()?.to_vec())).collect()
    }

    /// Every rank shares a value: sets `prefix/<rank>` and waits for the same key of every
    /// rank of `0..world_size`, returned in rank order. (A meeting through the store, not
    /// the collective all-gather, which moves buffers between ranks.)
    pub fn share(
        &mut self,
        prefix: &str,
        rank: usize,
        world_size: usize,
        value: &[u8],
        what: &str,
    ) -> Result<Vec<Vec<u8>>> {
        self.set(&format!("{prefix}/{rank}"), value)?;
        let keys: Vec<_> = (0..world_size).map(|r| (format!("{prefix}/{r}"), r)).collect();
        self.wait(&keys, what)
    }

    /// [`Store::share`] of a value as JSON: every rank's, parsed, in rank order. `what`
    /// names it in errors ("every rank's GPU"; a value that does not parse names its rank).
    pub fn share_json<T: serde::Serialize + serde::de::DeserializeOwned>(
        &mut self,
        prefix: &str,
        rank: usize,
        world_size: usize,
        value: &T,
        what: &str,
    ) -> Result<Vec<T>> {
        let all = self.share(prefix, rank, world_size, &serde_json::to_vec(value)?, what)?;
        all.iter()
            .enumerate()
            .map(|(r, v)| {
                serde_json::from_slice(v).map_err(|e| anyhow!("rank {r} sent a malformed value for {what}: {e}"))
            })
            .collect()
    }

    /// Waits until every rank has reached the barrier called `name`.
    pub fn barrier(&mut self, name: &str, rank: usize, world_size: usize) -> Result<()> {
        self.share(
            &format!("barrier/{name}"),
            rank,
            world_size,
            &[],
            &format!("every rank to reach '{name}'"),
        )
        .map(drop)
    }

    /// The first rank whose connection closed without a goodbye, and how: after a
    /// failure, the rank that caused it, rather than the neighbour that reported it.
    pub fn first_lost(&mut self) -> Result<Option<(usize, String)>> {
        let reply = self.call(FIRST_LOST, &[], "the first rank lost")?;
        let mut d = Decoder(&reply);
        Ok(if d.u64()? == 1 {
            Some((d.u64()? as usize, d.str()?.to_string()))
        } else {
            None
        })
    }

    /// Who is to blame for the failure this rank met, as the store judges it for every rank
    /// alike: the first rank lost, else the rank silent longest, at least `quiet` (no
    /// heartbeat: stopped or frozen). The first answer given is the answer every rank gets
    /// from then on. `None` when every rank is alive and beating (nothing is recorded).
    pub fn blame(&mut self, quiet: Duration) -> Result<Option<(usize, String)>> {
        let reply = self.call(BLAME, &Encoder::default().u64(quiet.as_millis() as u64).0, "who failed")?;
        let mut d = Decoder(&reply);
        Ok(if d.u64()? == 1 {
            Some((d.u64()? as usize, d.str()?.to_string()))
        } else {
            None
        })
    }

    /// A connection of this rank's own for its heartbeat ([`crate::heartbeat`]), beside the
    /// rank's connection (which must have joined): each request gives up after `limit`.
    /// Its closing, whenever, says nothing: the rank's connection says whether it is gone.
    pub fn heartbeat(&self, join: &Join, limit: Duration) -> Result<Store> {
        let deadline = Instant::now() + limit;
        match try_connect(&self.addr, join, ROLE_HEARTBEAT, deadline, limit) {
            Ok(conn) => Ok(Store {
                conn,
                addr: self.addr.clone(),
                timeout: limit,
                reply_within: limit,
            }),
            Err(Attempt::Refused(why) | Attempt::Silent(why)) => bail!("{why}"),
            Err(Attempt::Failed(e)) => Err(e.into()),
        }
    }

    /// One heartbeat, on a connection made by [`Store::heartbeat`].
    pub fn beat(&mut self) -> Result<()> {
        self.call(BEAT, &[], "a heartbeat").map(drop)
    }

    /// The ranks waiting in the store now (in a meeting: a table, a check, a barrier):
    /// ranks that went on, as opposed to ranks busy elsewhere.
    pub fn waiting(&mut self) -> Result<Vec<usize>> {
        let reply = self.call(WAITING, &[], "the ranks waiting")?;
        let mut d = Decoder(&reply);
        let n = d.u64()?;
        (0..n).map(|_| Ok(d.u64()? as usize)).collect()
    }

    /// The store's clock, read once: its monotonic clock in nanoseconds (rank 0's, which
    /// hosts it) and the boot id of its kernel ([`crate::clock::boot_id`]). One round trip;
    /// `common::trace::Clock::measure` makes several and keeps the quickest.
    pub fn clock(&mut self) -> Result<(u64, String)> {
        let reply = self.call(CLOCK, &[], "the store's clock")?;
        let mut d = Decoder(&reply);
        Ok((d.u64()?, d.str()?.to_string()))
    }

    /// Says goodbye, so that this connection closing is not taken for a crash.
    pub fn bye(&mut self) {
        let _ = wire::write_frame(&mut self.conn, BYE, &[]);
    }

    fn call(&mut self, kind: u8, payload: &[u8], about: &str) -> Result<Vec<u8>> {
        let lost = |e: io::Error| {
            let how = match e.kind() {
                io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe => {
                    "the connection closed: rank 0, which hosts it, has exited or crashed".to_string()
                }
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => "no answer in time".to_string(),
                _ => e.to_string(),
            };
            anyhow::Error::new(StoreLost(format!("lost the store at {} ({how})", self.addr)))
        };
        // The store answers a wait within the timeout; allow SLACK more before giving up,
        // for the whole reply however slowly it comes.
        let reply_by = Instant::now() + self.reply_within;
        self.conn.set_write_timeout(Some(self.reply_within))?;
        wire::write_frame(&mut self.conn, kind, payload).map_err(lost)?;
        let (reply, body) = wire::read_frame(&mut Until::new(&self.conn, reply_by), MAX_FRAME).map_err(lost)?;
        match reply {
            OK => Ok(body),
            ERR => Err(StoreSaid(String::from_utf8_lossy(&body).into_owned()).into()),
            other => Err(anyhow!(
                "the store sent an unknown reply kind {other} to a request about '{about}'"
            )),
        }
    }
}

enum Attempt {
    Refused(String),
    /// It took the connection and said nothing.
    Silent(String),
    Failed(io::Error),
}

/// One try at joining the store at `addr`, over by `deadline` (the end of the `timeout`
/// the rank gives the whole join, which messages name).
fn try_connect(
    addr: &str,
    join: &Join,
    role: u64,
    deadline: Instant,
    timeout: Duration,
) -> std::result::Result<TcpStream, Attempt> {
    let targets: Vec<SocketAddr> = addr.to_socket_addrs().map_err(Attempt::Failed)?.collect();
    let mut last = io::Error::new(io::ErrorKind::NotFound, "the name resolves to no address");
    // The whole join, connection and answer, ends by the deadline (a last try gets a
    // moment even when it is past), however slowly the other end answers.
    let by = deadline.max(Instant::now() + Duration::from_millis(200));
    for target in targets {
        let left = by
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        match TcpStream::connect_timeout(&target, left.min(Duration::from_secs(2))) {
            Ok(mut conn) => {
                let _ = conn.set_nodelay(true);
                conn.set_write_timeout(Some(left)).map_err(Attempt::Failed)?;
                let mut hello = Encoder::default()
                    .str(&join.job_id)
                    .u64(join.world_size as u64)
                    .u64(join.rank as u64);
                if role != ROLE_RANK {
                    hello = hello.u64(role);
                }
                wire::write_frame(&mut conn, HELLO, &hello.0).map_err(Attempt::Failed)?;
                let mut reply = Until::new(&conn, by);
                let answer = wire::read_frame(&mut reply, MAX_FRAME);
                let waited = crate::units::human_duration(timeout);
                return match answer {
                    Ok((OK, _)) => Ok(conn),
                    Ok((ERR, why)) => Err(Attempt::Refused(String::from_utf8_lossy(&why).into_owned())),
                    // Nothing at all came back: a store that does not answer (its process
                    // frozen, or overwhelmed), not a stranger.
                    Err(e)
                        if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) && reply.2 == 0 =>
                    {
                        Err(Attempt::Silent(format!(
                            "the store at {target} took the connection but did not answer within {waited}: rank 0 \
                             is stuck (stopped, or overloaded) or it is another program"
                        )))
                    }
                    Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                        Err(Attempt::Silent(format!(
                            "something at {target} answers, but no whole reply came within {waited} ({} bytes): \
                             not this program's store, or one too slow to serve",
                            reply.2
                        )))
                    }
                    Ok(_) | Err(_) => Err(Attempt::Refused(format!(
                        "something other than this program's store answers at {target} \
                         (torchrun's agent, or another program?)"
                    ))),
                };
            }
            Err(e) => last = e,
        }
    }
    Err(Attempt::Failed(last))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(world: usize) -> StoreServer {
        StoreServer::start("127.0.0.1:0".parse().unwrap(), "job-a", world).unwrap()
    }

    fn join(s: &StoreServer, job: &str, world: usize, rank: usize) -> Result<Store> {
        let j = Join {
            job_id: job.into(),
            world_size: world,
            rank,
        };
        Store::connect("127.0.0.1", s.addr().port(), &j, Duration::from_secs(2))
    }

    #[test]
    fn set_wait_and_barrier_across_ranks() {
        let s = server(2);
        let port = s.addr().port();
        let other = thread::spawn(move || {
            let j = Join {
                job_id: "job-a".into(),
                world_size: 2,
                rank: 1,
            };
            let mut st = Store::connect("127.0.0.1", port, &j, Duration::from_secs(2)).unwrap();
            st.set("x", b"from 1").unwrap();
            st.barrier("end", 1, 2).unwrap();
            st.bye();
        });
        let mut st = join(&s, "job-a", 2, 0).unwrap();
        let got = st.wait(&[("x".into(), 1)], "x").unwrap();
        assert_eq!(got, vec![b"from 1".to_vec()]);
        st.barrier("end", 0, 2).unwrap();
        other.join().unwrap();
    }

    #[test]
    fn refuses_wrong_job_world_and_duplicate_rank() {
        let s = server(2);
        let e = join(&s, "job-b", 2, 1).err().unwrap().to_string();
        assert!(e.contains("belongs to job 'job-a'"), "{e}");
        let e = join(&s, "job-a", 3, 1).err().unwrap().to_string();
        assert!(e.contains("world of 3 ranks, but rank 0 with 2"), "{e}");
        let _first = join(&s, "job-a", 2, 1).unwrap();
        let e = join(&s, "job-a", 2, 1).err().unwrap().to_string();
        assert!(e.contains("already joined"), "{e}");
    }

    #[test]
    fn a_wait_times_out_naming_the_missing_rank() {
        let s = server(3);
        let mut st = join(&s, "job-a", 3, 0).unwrap();
        st.timeout = Duration::from_millis(200);
        let e = st.barrier("b", 0, 3).unwrap_err().to_string();
        assert!(e.contains("ranks 1, 2 not there (they never joined"), "{e}");
    }

    #[test]
    fn a_timeout_names_the_rank_busy_elsewhere_before_the_ranks_that_wait_too() {
        // Rank 1 waits in the store for another meeting; rank 2 joined and never comes
        // (stuck in a send, say): rank 2 is the one the others wait on.
        let s = server(3);
        let mut zero = join(&s, "job-a", 3, 0).unwrap();
        let mut one = join(&s, "job-a", 3, 1).unwrap();
        let _two = join(&s, "job-a", 3, 2).unwrap();
        one.timeout = Duration::from_secs(3);
        let waiter = thread::spawn(move || one.barrier("rows", 1, 3));
        thread::sleep(Duration::from_millis(100));
        zero.timeout = Duration::from_millis(300);
        let e = zero.barrier("check", 0, 3).unwrap_err().to_string();
        assert!(
            e.contains(
                "waiting for every rank to reach 'check': rank 2 is alive but did not come: busy outside the store \
                 (stuck in a send, a receive or on the GPU?); rank 1 was itself waiting for every rank to reach 'rows'"
            ),
            "{e}"
        );
        let (busy, waiting) = (
            e.find("rank 2 is alive").unwrap(),
            e.find("rank 1 was itself waiting").unwrap(),
        );
        assert!(busy < waiting, "the rank waited on first: {e}");
        assert!(!e.contains("not there"), "{e}");
        drop(zero);
        let _ = waiter.join();
    }

    #[test]
    fn a_lost_rank_fails_waits_at_once() {
        let s = server(2);
        let mut st = join(&s, "job-a", 2, 0).unwrap();
        drop(join(&s, "job-a", 2, 1).unwrap()); // rank 1 vanishes without a goodbye
        let t = Instant::now();
        let e = st.barrier("b", 0, 2).unwrap_err().to_string();
        assert!(e.contains("rank 1 is gone"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(2));
    }

    /// A heartbeat connection for `rank` of a world of 3, beside `store`'s.
    fn heartbeat_of(store: &Store, rank: usize) -> Result<Store> {
        let j = Join {
            job_id: "job-a".into(),
            world_size: 3,
            rank,
        };
        store.heartbeat(&j, Duration::from_secs(2))
    }

    #[test]
    fn the_rank_whose_heartbeat_stopped_is_blamed_and_every_rank_gets_that_answer() {
        let s = server(3);
        let mut zero = join(&s, "job-a", 3, 0).unwrap();
        let (one, two) = (join(&s, "job-a", 3, 1).unwrap(), join(&s, "job-a", 3, 2).unwrap());
        let (mut beat1, mut beat2) = (heartbeat_of(&one, 1).unwrap(), heartbeat_of(&two, 2).unwrap());
        beat1.beat().unwrap();
        beat2.beat().unwrap();
        // Both beat: nobody to blame (and nothing recorded).
        assert_eq!(zero.blame(Duration::from_millis(300)).unwrap(), None);
        // Rank 2 stops beating; rank 1 goes on.
        for _ in 0..8 {
            thread::sleep(Duration::from_millis(50));
            beat1.beat().unwrap();
        }
        let (rank, why) = zero.blame(Duration::from_millis(300)).unwrap().unwrap();
        assert_eq!(rank, 2, "{why}");
        assert!(
            why.starts_with("stopped responding (no heartbeat for ")
                && why.ends_with(": its process is stopped or frozen)"),
            "{why}"
        );
        // The answer stands, for every rank, whatever happens next (rank 1 lost, say).
        drop(beat1);
        drop(one);
        thread::sleep(Duration::from_millis(100));
        assert_eq!(zero.blame(Duration::from_millis(300)).unwrap(), Some((2, why)));
        drop(two);
    }

    #[test]
    fn a_lost_rank_is_blamed_before_a_silent_one_and_a_heartbeat_closing_loses_nobody() {
        let s = server(3);
        let mut zero = join(&s, "job-a", 3, 0).unwrap();
        let one = join(&s, "job-a", 3, 1).unwrap();
        let two = join(&s, "job-a", 3, 2).unwrap();
        let mut beat1 = heartbeat_of(&one, 1).unwrap();
        beat1.beat().unwrap();
        // A heartbeat's connection closing says nothing; its rank is still there.
        drop(beat1);
        thread::sleep(Duration::from_millis(100));
        assert_eq!(zero.first_lost().unwrap(), None);
        // Rank 1 is silent by now, but rank 2 is lost: the lost one is to blame.
        drop(two);
        thread::sleep(Duration::from_millis(100));
        assert_eq!(
            zero.blame(Duration::from_millis(50)).unwrap(),
            Some((2, "failed first (its connection closed)".into()))
        );
        drop(one);
    }

    #[test]
    fn a_heartbeat_is_refused_for_a_rank_that_has_not_joined() {
        let s = server(3);
        let zero = join(&s, "job-a", 3, 0).unwrap();
        let e = heartbeat_of(&zero, 2).err().unwrap().to_string();
        assert!(e.contains("a heartbeat of rank 2, which has not joined"), "{e}");
        // A heartbeat adds no rank: rank 0 may beat, and still join only once.
        assert!(heartbeat_of(&zero, 0).is_ok());
        let e = join(&s, "job-a", 3, 0).err().unwrap().to_string();
        assert!(e.contains("already joined"), "{e}");
    }

    #[test]
    fn the_store_remembers_which_rank_went_first() {
        let s = server(3);
        let mut st = join(&s, "job-a", 3, 0).unwrap();
        assert_eq!(st.first_lost().unwrap(), None);
        drop(join(&s, "job-a", 3, 2).unwrap());
        thread::sleep(Duration::from_millis(100));
        drop(join(&s, "job-a", 3, 1).unwrap());
        thread::sleep(Duration::from_millis(100));
        let (rank, how) = st.first_lost().unwrap().unwrap();
        assert_eq!((rank, how.as_str()), (2, "its connection closed"));
    }

    #[test]
    fn stray_bytes_do_not_disturb_the_store() {
        use std::io::Write;
        let s = server(1);
        for junk in [
            &b"GET / HTTP/1.1\r\n\r\n"[..],
            &wire::header(HELLO, u64::MAX),
            &[0u8; 3],
        ] {
            let mut c = TcpStream::connect(s.addr()).unwrap();
            let _ = c.write_all(junk);
        }
        let mut st = join(&s, "job-a", 1, 0).unwrap();
        st.set("k", b"v").unwrap();
        assert_eq!(st.get("k").unwrap(), Some(b"v".to_vec()));
    }

    #[test]
    fn a_join_larger_than_a_join_is_closed_at_once_not_awaited() {
        // A header announcing a 16 MiB join: closed before anything is allocated for it.
        use std::io::{Read, Write};
        let s = server(1);
        let mut c = TcpStream::connect(s.addr()).unwrap();
        c.write_all(&wire::header(HELLO, 16 << 20)).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let t = Instant::now();
        let mut buf = [0u8; 1];
        assert_eq!(c.read(&mut buf).unwrap_or(0), 0, "the store answered a 16 MiB join");
        assert!(
            t.elapsed() < Duration::from_secs(4),
            "closed only after {:?}",
            t.elapsed()
        );
    }

    /// A listener on a free port whose every connection gets `first` at once (if any),
    /// then, after reading `reads` frames, one byte every 100 ms for 30 s.
    fn trickler(first: Option<Vec<u8>>, reads: usize) -> u16 {
        use std::io::Write;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        thread::spawn(move || {
            for c in l.incoming() {
                let Ok(mut c) = c else { return };
                let first = first.clone();
                thread::spawn(move || {
                    let _ = wire::read_frame(&mut c, MAX_FRAME);
                    if let Some(f) = first {
                        let _ = c.write_all(&f);
                    }
                    for _ in 0..reads {
                        let _ = wire::read_frame(&mut c, MAX_FRAME);
                    }
                    // A header announcing a large reply, one byte at a time.
                    for b in wire::header(OK, 1 << 20).iter().chain(&[0u8; 300]) {
                        if c.write_all(&[*b]).is_err() {
                            return;
                        }
                        thread::sleep(Duration::from_millis(100));
                    }
                });
            }
        });
        port
    }

    fn rank_one() -> Join {
        Join {
            job_id: "job-a".into(),
            world_size: 2,
            rank: 1,
        }
    }

    #[test]
    fn a_master_that_trickles_bytes_holds_a_join_no_longer_than_the_timeout() {
        let port = trickler(None, 0);
        let t = Instant::now();
        let e = Store::connect("127.0.0.1", port, &rank_one(), Duration::from_secs(1))
            .err()
            .unwrap();
        let took = t.elapsed();
        assert!(took < Duration::from_secs(1) + crate::deadline::SLACK, "{took:?}");
        assert!(e.to_string().contains("no whole reply came within 1 s"), "{e}");
    }

    #[test]
    fn a_store_that_trickles_a_reply_is_left_within_the_timeout_and_the_slack() {
        let mut ok = vec![];
        wire::write_frame(&mut ok, OK, &[]).unwrap();
        let port = trickler(Some(ok), 0);
        let mut st = Store::connect("127.0.0.1", port, &rank_one(), Duration::from_secs(1)).unwrap();
        let t = Instant::now();
        let e = st.get("k").err().unwrap();
        let took = t.elapsed();
        assert!(
            took < Duration::from_secs(1) + crate::deadline::SLACK + Duration::from_millis(500),
            "{took:?}"
        );
        assert!(
            took >= Duration::from_secs(1),
            "it gave up before the timeout and slack: {took:?}"
        );
        assert!(e.to_string().contains("no answer in time"), "{e}");
    }
}
