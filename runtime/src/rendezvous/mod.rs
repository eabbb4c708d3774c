//! Rendezvous: how ranks that know nothing but the master's address find each other.
//!
//! Rank 0 hosts a small TCP key-value store (the TCPStore of torchrun and PyTorch) at
//! the master address; every rank, rank 0 included, joins it as a client. A join carries
//! the job's identity, the world size and the rank, and the store refuses a rank that
//! disagrees with it. After that the ranks only `set` keys and `wait` for keys: the
//! NCCL unique id, each rank's address for the CPU backend, the rows of a table.
//!
//! The store is rank 0's to keep: a join must carry the job's secret where the job has
//! one ([`crate::secret`]); a rank holds its own connection and at most two heartbeat
//! connections, which only its own process can open (its join's answer carries a token
//! they must show), and the store at most two connections per rank and 64 not yet joined,
//! refusing the rest as they come, without a thread each; one key holds at most
//! 8 MiB and the whole store 256 MiB and 1 MiB per rank, and a `set` past either is refused
//! in one line naming the rank (the server's constants set these limits).
//!
//! Every wait has a deadline and, when it passes, names the ranks that never arrived.
//! A rank whose connection closes without a goodbye has crashed or been killed, unless it
//! said it gave up (a wait of its own timed out): every wait then fails at once, naming
//! it, instead of waiting for the deadline.
//!
//! Here are what both ends share: the messages' kinds and limits, who joins ([`Join`]),
//! reads bounded by a deadline, and the errors a rank tells apart ([`StoreLost`],
//! [`StoreSaid`]); the server, on rank 0, is [`server`]; a rank's connection, [`client`].

mod client;
mod server;
#[cfg(test)]
mod tests;

pub use client::Store;
pub(crate) use server::MAX_STRANGERS;
pub use server::StoreServer;

use anyhow::{Result, anyhow};
use std::io;

/// The store's answer to whom a failure is to blame ([`Store::blame`]): the rank and why,
/// in words ("failed first (its connection closed)"), and whether that rank only gave up
/// (its own wait timed out: [`Store::give_up`]), which is no crash: a rank whose own wait
/// timed out too may have a cause nearer to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub rank: usize,
    pub why: String,
    pub gave_up: bool,
}

impl Verdict {
    fn new(rank: usize, why: String, gave_up: bool) -> Verdict {
        Verdict { rank, why, gave_up }
    }
}
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// A join ([`Join`]): the job's id, the world size, the rank, then, each if there, what
/// the connection joins as ([`ROLE_RANK`] if absent), the job's secret (empty: none) and
/// the token of the rank's join (a heartbeat's). A rank's join is answered with its token.
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
/// This rank gives up: its own wait timed out, with nobody to blame ([`Store::give_up`]).
const GIVE_UP: u8 = 11;
const OK: u8 = 128;
const ERR: u8 = 129;
/// The store holds all the connections it takes: this one is refused before it is read,
/// and may come again (a rank tries again until its deadline).
const FULL: u8 = 130;
/// The largest message the store accepts: a table row, an address, an NCCL id.
const MAX_FRAME: u64 = 16 << 20;
/// What a connection joins as, after the rank (absent: [`ROLE_RANK`]).
const ROLE_RANK: u64 = 0;
/// A rank's heartbeat connection: it beats, and its closing says nothing (the rank's own
/// connection says whether the rank is gone).
const ROLE_HEARTBEAT: u64 = 1;

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
            Some(StoreServer::start_with(
                addr,
                &id.job_id,
                id.world_size,
                id.secret.clone(),
            )?)
        }
        _ => None,
    };
    let join = Join {
        job_id: id.job_id.clone(),
        world_size: id.world_size,
        rank: id.rank,
        secret: id.secret.clone(),
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
    /// The job's secret, which the store asks of every join when rank 0 has one.
    pub secret: Option<crate::secret::Secret>,
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
/// caused (it then asks whom to blame) from its own, and knows whom it waited for.
#[derive(Debug)]
pub struct StoreSaid {
    /// What to say.
    said: String,
    /// The ranks the wait was for that did not come (alive but busy elsewhere, or gone).
    awaited: Vec<usize>,
}

impl StoreSaid {
    /// The store's answer as it travels: the sentence, then, after [`AWAITED`], the ranks
    /// a wait waited for.
    pub(crate) fn from_wire(body: &[u8]) -> StoreSaid {
        let text = String::from_utf8_lossy(body);
        let (said, ranks) = text.split_once(AWAITED).unwrap_or((&text, ""));
        StoreSaid {
            said: said.to_string(),
            awaited: ranks.split(',').filter_map(|r| r.parse().ok()).collect(),
        }
    }
}

/// What separates the store's sentence from the ranks it waited for, on the wire.
const AWAITED: char = '\u{1f}';

/// `said`, with the ranks a wait waited for, as the store sends it ([`StoreSaid::from_wire`]).
pub(crate) fn with_awaited(said: String, ranks: &[usize]) -> String {
    let ranks: Vec<String> = ranks.iter().map(usize::to_string).collect();
    format!("{said}{AWAITED}{}", ranks.join(","))
}

/// The ranks a store's answer (`cause`, one link of an error's chain) says a wait waited
/// for, if it is one: for the failure's record ([`crate::failure::Record`]).
pub fn store_awaited<'a>(cause: &'a (dyn std::error::Error + 'static)) -> Option<&'a [usize]> {
    cause.downcast_ref::<StoreSaid>().map(|s| s.awaited.as_slice())
}

impl std::fmt::Display for StoreSaid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.said)
    }
}

impl std::error::Error for StoreSaid {}

/// Whether `err` (or what it wraps) is the store's answer ([`StoreSaid`]).
pub fn store_said(err: &anyhow::Error) -> bool {
    err.chain().any(|e| e.is::<StoreSaid>())
}
