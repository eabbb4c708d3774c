//! The TCP transport: every pair of ranks shares one connection (a full mesh), so any
//! rank can send to any other, across machines as well as on one.
//!
//! Setting it up: each rank listens on the address that routes to the master (so the
//! address works from other nodes), publishes it in the store, connects to every lower
//! rank and accepts every higher one. Each new connection starts with a greeting naming
//! the job and the rank; one that does not (a port scanner, another job) is closed.

use super::{Link, len_mismatch, op_mismatch};
use crate::rendezvous::Store;
use crate::wire::{self, Decoder, Encoder};
use anyhow::{Context, Result, anyhow, bail};
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs, UdpSocket};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

const GREET: u8 = 200;
const GREET_OK: u8 = 201;

/// A TCP connection to one peer.
pub struct TcpLink {
    stream: TcpStream,
    peer: usize,
    addr: SocketAddr,
    /// Where `recv_pieces` reads each piece before handing it on, kept from call to call
    /// (at most [`PIECE`] bytes): receiving is one thread at a time, so never contended.
    landing: Mutex<Vec<u8>>,
}

/// `recv_pieces` reads a message in pieces of at most this size, so that the receiver
/// reduces one while the next is still in the socket.
const PIECE: usize = 256 << 10;

impl TcpLink {
    fn check_header(&self, tag: u8, len: usize) -> io::Result<()> {
        let (theirs, got) = wire::read_header(&mut &self.stream, u64::MAX)?;
        if theirs != tag {
            return Err(op_mismatch(self.peer, theirs, tag));
        }
        if got != len as u64 {
            return Err(len_mismatch(self.peer, got, len));
        }
        Ok(())
    }
}

impl Link for TcpLink {
    fn send(&self, tag: u8, data: &[u8]) -> io::Result<()> {
        let mut s = &self.stream;
        s.write_all(&wire::header(tag, data.len() as u64))?;
        s.write_all(data)
    }

    fn recv_into(&self, tag: u8, dst: &mut [u8]) -> io::Result<()> {
        self.check_header(tag, dst.len())?;
        (&self.stream).read_exact(dst)
    }

    fn recv_pieces(&self, tag: u8, len: usize, each: &mut dyn FnMut(usize, &[u8])) -> io::Result<()> {
        self.check_header(tag, len)?;
        let mut landing = self.landing.lock().unwrap_or_else(|p| p.into_inner());
        let size = len.min(PIECE);
        if landing.len() < size {
            landing.resize(size, 0);
        }
        let mut off = 0;
        while off < len {
            let n = size.min(len - off);
            (&self.stream).read_exact(&mut landing[..n])?;
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

/// Connects this rank to every peer `wanted` marks (the pairs that use TCP);
/// `links[peer]` is `None` for the others and for `rank` itself.
pub fn connect_mesh(
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
    let addrs = store.share(
        "cpu/addr",
        rank,
        world,
        me.to_string().as_bytes(),
        "every rank's CPU-backend address",
    )?;
    stall_for_tests(rank);
    let deadline = Instant::now() + timeout;
    let mut links: Vec<Option<TcpLink>> = (0..world).map(|_| None).collect();

    // Connect to every lower rank; the listener's backlog holds us until they accept.
    for (peer, addr) in addrs.iter().enumerate().take(rank).filter(|(p, _)| wanted[*p]) {
        let addr: SocketAddr = std::str::from_utf8(addr)
            .ok()
            .and_then(|a| a.parse().ok())
            .ok_or_else(|| anyhow!("rank {peer} published a malformed address"))?;
        let stream = dial(addr, peer, deadline).with_context(|| format!("connecting to rank {peer} at {addr}"))?;
        // The greeting and its answer, within what is left of the deadline.
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(10));
        stream.set_read_timeout(Some(left))?;
        stream.set_write_timeout(Some(left))?;
        let mut s = &stream;
        wire::write_frame(&mut s, GREET, &Encoder::default().str(job_id).u64(rank as u64).0)?;
        match wire::read_frame(&mut s, 1024) {
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => bail!(
                "rank {peer} at {addr} took the connection but did not answer this rank's greeting within \
                 --timeout: it is stuck or gone"
            ),
            Ok((GREET_OK, _)) => {}
            _ => bail!("rank {peer} at {addr} did not accept this rank's greeting (another job on that port?)"),
        }
        links[peer] = Some(configure(stream, peer, addr, timeout)?);
    }

    // Accept every higher rank, closing whatever else knocks. Newcomers are read side by
    // side, each with a second to greet: a silent or trickling stranger holds nobody up,
    // and the whole setup ends by the deadline.
    listener.set_nonblocking(true)?;
    let missing = |links: &[Option<TcpLink>]| (rank + 1..world).filter(|p| wanted[*p] && links[*p].is_none()).count();
    let mut pending: Vec<Newcomer> = vec![];
    while missing(&links) > 0 {
        let mut moved = false;
        match listener.accept() {
            Ok((stream, from)) => {
                moved = true;
                if stream.set_nonblocking(true).is_ok() {
                    // Bounded: the oldest stranger goes first when too many wait at once.
                    if pending.len() >= MAX_NEWCOMERS {
                        pending.remove(0);
                    }
                    let until = (Instant::now() + GREET_WITHIN).min(deadline);
                    pending.push(Newcomer {
                        stream,
                        from,
                        got: vec![],
                        until,
                    });
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e).context("accepting a peer connection"),
        }
        let mut still = vec![];
        for mut n in pending.drain(..) {
            match n.read_greeting() {
                Greeting::Waiting if Instant::now() < n.until => still.push(n),
                Greeting::Waiting | Greeting::Junk => moved = true,
                Greeting::Frame(kind, payload) => {
                    moved = true;
                    if let Some(peer) = greeted(kind, &payload, job_id, rank, wanted, &links) {
                        n.stream.set_nonblocking(false)?;
                        n.stream.set_write_timeout(Some(GREET_WITHIN))?;
                        let mut s = &n.stream;
                        wire::write_frame(&mut s, GREET_OK, &[])?;
                        links[peer] = Some(configure(n.stream, peer, n.from, timeout)?);
                    }
                }
            }
        }
        pending = still;
        if Instant::now() >= deadline && missing(&links) > 0 {
            let missing: Vec<String> = (rank + 1..world)
                .filter(|p| wanted[*p] && links[*p].is_none())
                .map(|p| p.to_string())
                .collect();
            bail!(
                "timed out after {} waiting for rank(s) {} to connect to this rank at {me}",
                crate::units::human_duration(timeout),
                missing.join(", ")
            );
        }
        if !moved {
            thread::sleep(Duration::from_millis(1));
        }
    }
    Ok(links)
}

/// Test hook: `NCCL_WORKBOOK_FAULT=stall-mesh:RANK:MS` holds one rank for MS
/// milliseconds after every rank has published its address, so that tests can reach the
/// other ranks' open peer ports while the mesh is being built.
fn stall_for_tests(rank: usize) {
    if let Some(ms) = crate::fault::asked("stall-mesh", Some(rank)).and_then(|v| v.first()?.parse().ok()) {
        thread::sleep(Duration::from_millis(ms));
    }
}

fn dial(addr: SocketAddr, peer: usize, deadline: Instant) -> Result<TcpStream> {
    loop {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() >= deadline => return Err(e).context(format!("rank {peer} never answered")),
            Err(_) => thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// How long a newcomer has to greet, and how many may be greeting at once.
const GREET_WITHIN: Duration = Duration::from_secs(1);
const MAX_NEWCOMERS: usize = 64;

/// A connection that has not greeted yet, read without blocking.
struct Newcomer {
    stream: TcpStream,
    from: SocketAddr,
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

/// A newcomer's greeting: the peer's rank if it is one of ours, else `None`.
fn greeted(
    kind: u8,
    payload: &[u8],
    job_id: &str,
    rank: usize,
    wanted: &[bool],
    links: &[Option<TcpLink>],
) -> Option<usize> {
    if kind != GREET {
        return None;
    }
    let mut d = Decoder(payload);
    let (job, peer) = (d.str().ok()?, d.u64().ok()? as usize);
    (job == job_id && peer > rank && wanted.get(peer) == Some(&true) && links[peer].is_none()).then_some(peer)
}

fn configure(stream: TcpStream, peer: usize, addr: SocketAddr, timeout: Duration) -> Result<TcpLink> {
    stream.set_nodelay(true)?;
    stream.set_nonblocking(false)?;
    // A peer that goes silent for the whole timeout is treated as lost, never waited on forever.
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    Ok(TcpLink {
        stream,
        peer,
        addr,
        landing: Mutex::new(vec![]),
    })
}
