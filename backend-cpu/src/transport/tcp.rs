//! The TCP transport: a connection for each direction a pair of ranks uses, made on
//! first use, so any rank can send to any other, across machines as well as on one.
//!
//! Setting it up ([`connect`]): each rank listens on the address that routes to the
//! master (so the address works from other nodes), publishes it in the store, and starts
//! one thread that accepts its peers' connections. No connection is made then: as NCCL's
//! runtime connect does, a pair connects when an algorithm first uses it, each direction
//! on its own, as NCCL's send and receive connectors are:
//!
//! - the *sender* dials, at its first send to that peer ([`TcpLink`]): it connects to the
//!   peer's published address, greets (the job, its rank and the key the peer published
//!   beside its address) and waits for the answer,
//!   which the peer's accepting thread gives whatever the peer's own thread is doing. So
//!   a send never waits for the receiver to reach its receive, and no order of first
//!   uses can deadlock;
//! - the *receiver* takes, at its first receive from that peer, the connection the
//!   accepting thread received and greeted from it, waiting for it as long as
//!   `--timeout`, then naming the peer and this rank's address; a peer gone before it
//!   connected (its port refuses connections) is named at once.
//!
//! A ring makes one connection per rank, not one per pair: a job starts in about the time
//! its store takes, and holds the sockets its algorithms use. A connection that does not
//! greet (a port scanner, another job, a duplicate), or greets without the key, is closed:
//! the key (128 random bits, a new one for each rank and run) is read from the store, so
//! a link is as closed to strangers as the store is (`docs/failures.md`, who may join).
//! Strangers are read side by side, each with a second to greet, so none holds the others
//! up. The accepting thread ends, and the listener closes, when the last of the rank's TCP
//! links is dropped.

use super::{Link, Unconnected, len_mismatch, op_mismatch};
use crate::rendezvous::Store;
use crate::wire::{self, Decoder, Encoder};
use anyhow::{Context, Result, anyhow};
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};
use workbook_runtime::secret::Secret;

const GREET: u8 = 200;
const GREET_OK: u8 = 201;

/// A TCP link to one peer: the connection this rank sends on (dialed at the first send)
/// and the one it receives on (dialed by the peer at its first send), each made on first
/// use ([`connect`]).
pub struct TcpLink {
    peer: usize,
    /// Where the peer listens: what this rank dials, and what messages name.
    addr: SocketAddr,
    /// The key the peer published beside its address: what this rank's greeting shows.
    key: String,
    /// This rank's accepting thread and what it received, shared by the rank's TCP links.
    mesh: Arc<Acceptor>,
    /// The connection this rank sends on, once dialed.
    out: OnceLock<TcpStream>,
    /// The connection this rank receives on, once the peer dialed it.
    inbox: OnceLock<TcpStream>,
    /// Held while making `out` (0) or taking `inbox` (1): a send and a receive may run at
    /// once, from two threads, but each direction is made once.
    making: [Mutex<()>; 2],
    /// Where `recv_pieces` reads each piece before handing it on, kept from call to call
    /// (at most [`PIECE`] bytes): receiving is one thread at a time, so never contended.
    landing: Mutex<Vec<u8>>,
}

/// `recv_pieces` reads a message in pieces of at most this size, so that the receiver
/// reduces one while the next is still in the socket.
const PIECE: usize = 256 << 10;

/// Connections this process has dialed so far: what `NCCL_DEBUG=INFO` reports, and the
/// measure that pairs connect on first use.
static MADE: AtomicU64 = AtomicU64::new(0);

/// How many TCP connections this process has dialed so far (one per peer it sent to).
pub fn connections_made() -> u64 {
    MADE.load(Relaxed)
}

impl TcpLink {
    fn check_header(&self, stream: &TcpStream, tag: u8, len: usize) -> io::Result<()> {
        let (theirs, got) = wire::read_header(&mut &*stream, u64::MAX)?;
        if theirs != tag {
            return Err(op_mismatch(self.peer, theirs, tag));
        }
        if got != len as u64 {
            return Err(len_mismatch(self.peer, got, len));
        }
        Ok(())
    }

    /// The connection this rank sends on: dialed, greeted and answered at the first call.
    fn out(&self) -> io::Result<&TcpStream> {
        if let Some(s) = self.out.get() {
            return Ok(s);
        }
        let _one = self.making[0].lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = self.out.get() {
            return Ok(s);
        }
        let stream = self.dial()?;
        MADE.fetch_add(1, Relaxed);
        Ok(self.out.get_or_init(|| stream))
    }

    /// The connection this rank receives on: the one the peer dialed, taken from the
    /// accepting thread at the first call (waiting for it at most `--timeout`).
    fn inbox(&self) -> io::Result<&TcpStream> {
        if let Some(s) = self.inbox.get() {
            return Ok(s);
        }
        let _one = self.making[1].lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = self.inbox.get() {
            return Ok(s);
        }
        let stream = self.mesh.take(self.peer, self.addr)?;
        Ok(self.inbox.get_or_init(|| stream))
    }

    /// A connection to the peer's port, tried until `deadline`.
    fn reach(&self, deadline: Instant) -> io::Result<TcpStream> {
        let (peer, addr) = (self.peer, self.addr);
        let failed = |timed_out: bool, message: String| Unconnected::error(peer, timed_out, message);
        loop {
            match TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
                Ok(s) => return Ok(s),
                // Its listener lives as long as its communicator: a refusal means it is gone.
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                    return Err(failed(
                        false,
                        format!(
                            "connecting to rank {peer} at {addr}: it refused the connection ({e}): it has exited, \
                             crashed or was killed"
                        ),
                    ));
                }
                // Waiting would not free one: said at once, with the limit.
                Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                    let limit = crate::limits::open_files().map_or("unlimited".to_string(), |n| n.to_string());
                    return Err(failed(
                        false,
                        format!(
                            "connecting to rank {peer} at {addr}: this rank is out of open files ({e}; ulimit -n: \
                             {limit}): each peer it sends to or receives from over TCP takes one"
                        ),
                    ));
                }
                Err(e) if Instant::now() >= deadline => {
                    return Err(failed(
                        true,
                        format!("connecting to rank {peer} at {addr}: rank {peer} never answered ({e})"),
                    ));
                }
                Err(_) => thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// Connects to the peer and greets it, within `--timeout` from now.
    fn dial(&self) -> io::Result<TcpStream> {
        let (peer, addr, mesh) = (self.peer, self.addr, &self.mesh.shared);
        let deadline = Instant::now() + mesh.timeout;
        let failed = |timed_out: bool, message: String| Unconnected::error(peer, timed_out, message);
        let stream = loop {
            let stream = self.reach(deadline)?;
            // The greeting and its answer, within what is left of the deadline.
            let left = deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(10));
            stream.set_read_timeout(Some(left))?;
            stream.set_write_timeout(Some(left))?;
            let mut s = &stream;
            let greeting = Encoder::default()
                .str(&mesh.job_id)
                .u64(mesh.rank as u64)
                .str(&self.key)
                .0;
            let answer = wire::write_frame(&mut s, GREET, &greeting).and_then(|()| wire::read_frame(&mut s, 1024));
            match answer {
                Ok((GREET_OK, _)) => break stream,
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                    return Err(failed(
                        true,
                        format!(
                            "rank {peer} at {addr} took the connection but did not answer this rank's greeting within \
                             --timeout: it is stuck or gone"
                        ),
                    ));
                }
                // Closed unanswered: its newcomers' places were full (many peers connecting at
                // once on a loaded machine), or it is gone, which the next dial says.
                Err(e) if closed(&e) && Instant::now() < deadline => thread::sleep(Duration::from_millis(20)),
                _ => {
                    return Err(failed(
                        false,
                        format!(
                            "rank {peer} at {addr} did not accept this rank's greeting (another job on that port?)"
                        ),
                    ));
                }
            }
        };
        configure(&stream, mesh.timeout)?;
        Ok(stream)
    }
}

impl Link for TcpLink {
    fn send(&self, tag: u8, data: &[u8]) -> io::Result<()> {
        let mut s = self.out()?;
        s.write_all(&wire::header(tag, data.len() as u64))?;
        s.write_all(data)
    }

    fn recv_into(&self, tag: u8, dst: &mut [u8]) -> io::Result<()> {
        let stream = self.inbox()?;
        self.check_header(stream, tag, dst.len())?;
        (&*stream).read_exact(dst)
    }

    fn recv_pieces(&self, tag: u8, len: usize, each: &mut dyn FnMut(usize, &[u8])) -> io::Result<()> {
        let stream = self.inbox()?;
        self.check_header(stream, tag, len)?;
        let mut landing = self.landing.lock().unwrap_or_else(|p| p.into_inner());
        let size = len.min(PIECE);
        if landing.len() < size {
            landing.resize(size, 0);
        }
        let mut off = 0;
        while off < len {
            let n = size.min(len - off);
            (&*stream).read_exact(&mut landing[..n])?;
            each(off, &landing[..n]);
            off += n;
        }
        Ok(())
    }

    fn describe(&self) -> String {
        format!("rank {} at {}", self.peer, self.addr)
    }

    /// What any kernel's socket buffers hold, however small they are configured.
    fn eager_limit(&self) -> usize {
        16 << 10
    }
}

/// The local address this host uses to reach `host`: the address other nodes can
/// reach this rank at (127.0.0.1 when the master is on loopback).
pub fn local_ip_towards(host: &str, port: u16) -> Result<IpAddr> {
    let target = (host, port)
        .to_socket_addrs()
        .with_context(|| format!("resolving the master address {host}"))?
        .next()
        .ok_or_else(|| anyhow!("the master address {host} resolves to nothing"))?;
    let any: SocketAddr = if target.is_ipv4() {
        "0.0.0.0:0".parse()?
    } else {
        "[::]:0".parse()?
    };
    let probe = UdpSocket::bind(any)?;
    probe
        .connect(target)
        .with_context(|| format!("finding a route to the master {target}"))?;
    Ok(probe.local_addr()?.ip())
}

/// Sets up this rank's TCP links to every peer `wanted` marks (the pairs that use TCP);
/// `links[peer]` is `None` for the others and for `rank` itself. Listens, publishes the
/// address through the store (every rank takes part) and starts the accepting thread;
/// the connections themselves are made on first use (see the module's documentation).
pub fn connect(
    store: &mut Store,
    rank: usize,
    job_id: &str,
    wanted: &[bool],
    local_ip: IpAddr,
    timeout: Duration,
) -> Result<Vec<Option<TcpLink>>> {
    let world = wanted.len();
    let listener = TcpListener::bind((local_ip, 0)).with_context(|| format!("listening for peers on {local_ip}"))?;
    let me = listener.local_addr()?;
    // The key a greeting must show: only ranks that read it from the store know it.
    let key = Secret::fresh().with_context(|| format!("making rank {rank}'s key for its peer links"))?;
    let addrs = store.share(
        "cpu/addr",
        rank,
        world,
        format!("{me} {}", key.text()).as_bytes(),
        "every rank's CPU-backend address",
    )?;
    let mut peers = vec![];
    for (peer, published) in addrs.iter().enumerate().filter(|(p, _)| wanted[*p] && *p != rank) {
        let (addr, key): (SocketAddr, String) = std::str::from_utf8(published)
            .ok()
            .and_then(|a| a.split_once(' '))
            .and_then(|(a, k)| Some((a.parse().ok()?, k.to_string())))
            .ok_or_else(|| anyhow!("rank {peer} published a malformed address"))?;
        peers.push((peer, addr, key));
    }
    listener.set_nonblocking(true)?;
    let shared = Arc::new(Shared {
        rank,
        job_id: job_id.to_string(),
        key,
        wanted: wanted.to_vec(),
        me,
        timeout,
        arrived: Mutex::new(Arrivals {
            streams: (0..world).map(|_| None).collect(),
            greeted: vec![false; world],
            trouble: None,
        }),
        ready: Condvar::new(),
        stop: AtomicBool::new(false),
    });
    let thread = {
        let shared = shared.clone();
        thread::Builder::new()
            .name(format!("tcp-accept-{rank}"))
            .spawn(move || accept_peers(&listener, &shared))
            .with_context(|| format!("starting rank {rank}'s thread that accepts its peers' connections"))?
    };
    let mesh = Arc::new(Acceptor {
        shared,
        thread: Some(thread),
    });
    stall_for_tests(rank);
    let mut links: Vec<Option<TcpLink>> = (0..world).map(|_| None).collect();
    for (peer, addr, key) in peers {
        links[peer] = Some(TcpLink {
            peer,
            addr,
            key,
            mesh: mesh.clone(),
            out: OnceLock::new(),
            inbox: OnceLock::new(),
            making: Default::default(),
            landing: Mutex::new(vec![]),
        });
    }
    Ok(links)
}

/// Test hook: `NCCL_WORKBOOK_FAULT=stall-mesh:RANK:MS` holds one rank for MS
/// milliseconds after every rank has published its address, so that tests can reach the
/// other ranks' open peer ports while the job starts.
fn stall_for_tests(rank: usize) {
    if let Some(ms) = crate::fault::asked("stall-mesh", Some(rank)).and_then(|v| v.first()?.parse().ok()) {
        thread::sleep(Duration::from_millis(ms));
    }
}

/// What a rank's accepting thread and its links share.
struct Shared {
    rank: usize,
    job_id: String,
    /// This rank's key, published beside its address: a greeting without it is a stranger's.
    key: Secret,
    /// The peers that may connect (the pairs that use TCP).
    wanted: Vec<bool>,
    /// This rank's listening address, for messages.
    me: SocketAddr,
    timeout: Duration,
    arrived: Mutex<Arrivals>,
    /// Signalled when a connection arrives.
    ready: Condvar,
    /// Set when the links are gone: the accepting thread ends.
    stop: AtomicBool,
}

/// The connections the accepting thread received and greeted.
struct Arrivals {
    /// Each peer's, until its link takes it.
    streams: Vec<Option<TcpStream>>,
    /// The peers that have connected (a second connection from one is closed).
    greeted: Vec<bool>,
    /// The last error accepting a connection (out of descriptors), for a wait's message.
    trouble: Option<String>,
}

/// A rank's accepting thread, ended when the last of its links is dropped.
struct Acceptor {
    shared: Arc<Shared>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Acceptor {
    /// The connection `peer` (listening at `addr`) dialed to this rank, waiting for it at
    /// most `--timeout`. A peer that is gone before it connected is named at once, as a
    /// closed connection would name it: every [`PROBE_EVERY`] of waiting, its port is
    /// knocked on, and a refusal means its listener, which lives as long as its
    /// communicator, is closed.
    fn take(&self, peer: usize, addr: SocketAddr) -> io::Result<TcpStream> {
        let s = &self.shared;
        let deadline = Instant::now() + s.timeout;
        let lock = || s.arrived.lock().unwrap_or_else(|p| p.into_inner());
        let mut arrived = lock();
        loop {
            if let Some(stream) = arrived.streams[peer].take() {
                return Ok(stream);
            }
            let now = Instant::now();
            if now >= deadline {
                let trouble = match &arrived.trouble {
                    Some(e) => format!(" (accepting connections failed here: {e})"),
                    None => String::new(),
                };
                return Err(Unconnected::error(
                    peer,
                    true,
                    format!(
                        "timed out after {} waiting for rank {peer} to connect to this rank at {}{trouble}",
                        crate::units::human_duration(s.timeout),
                        s.me
                    ),
                ));
            }
            let (again, waited) = s
                .ready
                .wait_timeout(arrived, (deadline - now).min(PROBE_EVERY))
                .unwrap_or_else(|p| p.into_inner());
            arrived = again;
            if !waited.timed_out() || arrived.streams[peer].is_some() || arrived.greeted[peer] {
                continue;
            }
            drop(arrived);
            let refused = matches!(
                TcpStream::connect_timeout(&addr, PROBE_EVERY),
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused
            );
            arrived = lock();
            // Greeted meanwhile: its connection is on its way (it may have sent and exited).
            if refused && arrived.streams[peer].is_none() && !arrived.greeted[peer] {
                return Err(Unconnected::error(
                    peer,
                    false,
                    format!(
                        "rank {peer} at {addr} is gone (its port refuses connections) and never connected to this \
                         rank: it exited, crashed or was killed"
                    ),
                ));
            }
        }
    }
}

/// How long a receiver waits for its peer's connection before it checks that the peer
/// still listens (and then again, as long as it waits).
const PROBE_EVERY: Duration = Duration::from_millis(200);

impl Drop for Acceptor {
    fn drop(&mut self) {
        self.shared.stop.store(true, Relaxed);
        // Wakes the thread from its poll at once (it looks at `stop` at least every
        // [`IDLE_POLL`] otherwise).
        let _ = TcpStream::connect_timeout(&self.shared.me, Duration::from_millis(100));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// How long the accepting thread sleeps at most without looking at its stop flag.
const IDLE_POLL: Duration = Duration::from_millis(500);

/// The accepting thread: accepts the peers' connections, reads their greetings side by
/// side and hands each greeted one to its peer's link, closing whatever else knocks,
/// until the links are gone.
fn accept_peers(listener: &TcpListener, shared: &Shared) {
    let mut pending: Vec<Newcomer> = vec![];
    while !shared.stop.load(Relaxed) {
        // Sleep until a connection knocks, a newcomer sends, or the first newcomer's
        // second to greet is up.
        let now = Instant::now();
        let wait = pending
            .iter()
            .map(|n| n.until.saturating_duration_since(now))
            .min()
            .unwrap_or(IDLE_POLL)
            .min(IDLE_POLL);
        let mut fds: Vec<libc::pollfd> = std::iter::once(listener.as_raw_fd())
            .chain(pending.iter().map(|n| n.stream.as_raw_fd()))
            .map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: `fds` is a valid array of `fds.len()` pollfds, alive for the call.
        unsafe {
            libc::poll(
                fds.as_mut_ptr(),
                fds.len() as libc::nfds_t,
                wait.as_millis().max(1) as libc::c_int,
            )
        };
        if shared.stop.load(Relaxed) {
            return;
        }
        loop {
            match listener.accept() {
                Ok((stream, _)) => {
                    if stream.set_nonblocking(true).is_err() {
                        continue;
                    }
                    let mut n = Newcomer {
                        stream,
                        got: vec![],
                        until: Instant::now() + GREET_WITHIN,
                    };
                    // A peer greets as soon as it connects: most are settled here, so that
                    // many peers connecting at once (an all-to-all's first call) never
                    // fill the newcomers' places.
                    match n.read_greeting() {
                        Greeting::Frame(kind, payload) => shared.welcome(kind, &payload, n.stream),
                        Greeting::Junk => {}
                        Greeting::Waiting => {
                            if pending.len() >= MAX_NEWCOMERS {
                                pending = settle(pending, shared);
                            }
                            // Bounded: the oldest stranger goes first when too many wait at once.
                            if pending.len() >= MAX_NEWCOMERS {
                                pending.remove(0);
                            }
                            pending.push(n);
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted || e.kind() == io::ErrorKind::ConnectionAborted => {}
                Err(e) => {
                    // Out of descriptors, say: noted for a wait's message, tried again soon.
                    shared.arrived.lock().unwrap_or_else(|p| p.into_inner()).trouble = Some(e.to_string());
                    thread::sleep(Duration::from_millis(10));
                    break;
                }
            }
        }
        pending = settle(pending, shared);
    }
}

/// Reads what the newcomers sent: welcomes those that greeted, closes those that sent
/// junk or whose second to greet is up, and gives back the others.
fn settle(pending: Vec<Newcomer>, shared: &Shared) -> Vec<Newcomer> {
    let mut still = vec![];
    for mut n in pending {
        match n.read_greeting() {
            Greeting::Waiting if Instant::now() < n.until => still.push(n),
            Greeting::Waiting | Greeting::Junk => {}
            Greeting::Frame(kind, payload) => shared.welcome(kind, &payload, n.stream),
        }
    }
    still
}

impl Shared {
    /// Answers a newcomer's greeting and hands its connection to its peer's link, if it
    /// is one of this job's ranks that may connect and has not; closes it otherwise.
    fn welcome(&self, kind: u8, payload: &[u8], stream: TcpStream) {
        let lock = || self.arrived.lock().unwrap_or_else(|p| p.into_inner());
        let Some(peer) = self.greeted(kind, payload, &mut lock().greeted) else {
            return;
        };
        // Answered outside the lock: a receiver may be looking at what arrived meanwhile.
        // Readied first: once answered, the connection is the peer's link.
        let answered = configure(&stream, self.timeout)
            .and_then(|()| stream.set_write_timeout(Some(GREET_WITHIN)))
            .and_then(|()| wire::write_frame(&mut &stream, GREET_OK, &[]))
            .and_then(|()| stream.set_write_timeout(Some(self.timeout)));
        let mut arrived = lock();
        match answered {
            Ok(()) => {
                arrived.streams[peer] = Some(stream);
                self.ready.notify_all();
            }
            // Gone before the answer: it may dial again.
            Err(_) => arrived.greeted[peer] = false,
        }
    }

    /// A newcomer's greeting: the peer's rank if it is one of ours and has not connected
    /// yet (then marked as connected), else `None`.
    fn greeted(&self, kind: u8, payload: &[u8], greeted: &mut [bool]) -> Option<usize> {
        if kind != GREET {
            return None;
        }
        let mut d = Decoder(payload);
        let (job, peer, key) = (d.str().ok()?, d.u64().ok()? as usize, d.str().ok()?);
        let ours =
            job == self.job_id && peer != self.rank && self.wanted.get(peer) == Some(&true) && self.key.matches(key);
        if !ours || greeted[peer] {
            return None;
        }
        greeted[peer] = true;
        Some(peer)
    }
}

/// How long a newcomer has to greet, and how many may be greeting at once.
const GREET_WITHIN: Duration = Duration::from_secs(1);
const MAX_NEWCOMERS: usize = 64;

/// A connection that has not greeted yet, read without blocking.
struct Newcomer {
    stream: TcpStream,
    got: Vec<u8>,
    until: Instant,
}

enum Greeting {
    Waiting,
    Junk,
    Frame(u8, Vec<u8>),
}

impl Newcomer {
    /// Reads what has arrived: a whole frame, not yet, or something that is no greeting.
    fn read_greeting(&mut self) -> Greeting {
        let mut buf = [0u8; 1024 + wire::HEADER];
        loop {
            match (&self.stream).read(&mut buf) {
                Ok(0) => return Greeting::Junk,
                Ok(n) => self.got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => return Greeting::Junk,
            }
            if self.got.len() > 1024 + wire::HEADER {
                return Greeting::Junk;
            }
        }
        if self.got.len() < wire::HEADER {
            return Greeting::Waiting;
        }
        let mut head = &self.got[..];
        let Ok((kind, len)) = wire::read_header(&mut head, 1024) else {
            return Greeting::Junk;
        };
        match self.got.len() - wire::HEADER {
            n if n < len as usize => Greeting::Waiting,
            _ => Greeting::Frame(kind, self.got[wire::HEADER..wire::HEADER + len as usize].to_vec()),
        }
    }
}

/// Whether `e` says the other end closed the connection.
fn closed(e: &io::Error) -> bool {
    use io::ErrorKind::*;
    matches!(
        e.kind(),
        UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe
    )
}

/// Readies a greeted connection for messages: no delay for small ones, blocking, and a
/// peer that goes silent for the whole timeout treated as lost, never waited on forever.
fn configure(stream: &TcpStream, timeout: Duration) -> io::Result<()> {
    stream.set_nodelay(true)?;
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))
}
