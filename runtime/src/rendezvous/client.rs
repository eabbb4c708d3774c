//! A rank's connection to the store: joining it (retrying while the master is not up,
//! failing at once on a refusal), and the requests a rank makes: set, get, wait, share,
//! barrier, heartbeats, whom to blame, goodbye, each with its deadline.

use super::{
    BEAT, BLAME, BYE, CLOCK, ERR, FIRST_LOST, FULL, GET, GIVE_UP, HELLO, Join, MAX_FRAME, OK, ROLE_HEARTBEAT,
    ROLE_RANK, SET, StoreLost, StoreSaid, Until, Verdict, WAIT, WAITING,
};
use crate::wire::{self, Decoder, Encoder};
use anyhow::{Result, anyhow, bail};
use std::io;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::thread;
use std::time::{Duration, Instant};

/// A rank's connection to the store.
pub struct Store {
    conn: TcpStream,
    addr: String,
    /// What the store answered this rank's join with: its heartbeat connections show it,
    /// as only this rank's own process has it ([`Store::heartbeat`]).
    token: Vec<u8>,
    pub(super) timeout: Duration,
    /// How long to wait for any reply: a wait's own deadline plus [`deadline::SLACK`].
    reply_within: Duration,
}

impl Store {
    /// Joins the store at `host:port`, retrying until `timeout` while the master is not
    /// up yet (or its store is full); a refusal (wrong job, secret, world size or rank)
    /// fails at once.
    pub fn connect(host: &str, port: u16, join: &Join, timeout: Duration) -> Result<Store> {
        let addr = format!("{host}:{port}");
        let deadline = Instant::now() + timeout;
        let mut last_err;
        loop {
            match try_connect(&addr, join, (ROLE_RANK, &[]), deadline, timeout) {
                Ok((conn, token)) => {
                    return Ok(Store {
                        conn,
                        addr,
                        token,
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
            token: self.token.clone(),
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

    /// The first rank whose connection closed without a goodbye, and how (`why`: "its
    /// connection closed", or, if it gave up, what it waited for): after a failure, the
    /// rank that caused it, rather than the neighbour that reported it.
    pub fn first_lost(&mut self) -> Result<Option<Verdict>> {
        let reply = self.call(FIRST_LOST, &[], "the first rank lost")?;
        let mut d = Decoder(&reply);
        Ok(if d.u64()? == 1 {
            Some(Verdict::new(d.u64()? as usize, d.str()?.to_string(), d.u64()? == 1))
        } else {
            None
        })
    }

    /// Who is to blame for the failure this rank met, as the store judges it for every rank
    /// alike: the first rank lost (killed, crashed), else the rank silent longest, at least
    /// `quiet` (no heartbeat: stopped or frozen), else the first rank that gave up
    /// ([`Store::give_up`]). The first answer given is the answer every rank gets from then
    /// on. `None` when every rank is alive, beating and waiting (nothing is recorded).
    pub fn blame(&mut self, quiet: Duration) -> Result<Option<Verdict>> {
        let reply = self.call(BLAME, &Encoder::default().u64(quiet.as_millis() as u64).0, "who failed")?;
        let mut d = Decoder(&reply);
        Ok(if d.u64()? == 1 {
            Some(Verdict::new(d.u64()? as usize, d.str()?.to_string(), d.u64()? == 1))
        } else {
            None
        })
    }

    /// Tells the store that this rank gives up: a wait of its own timed out (for `why`,
    /// "nothing came from rank 2 for the whole --timeout"), and the store had nobody to
    /// blame. When it exits, its connection closing is then no crash: the others are told
    /// that it gave up, and why, not that it failed.
    pub fn give_up(&mut self, why: &str) -> Result<()> {
        self.call(GIVE_UP, &Encoder::default().str(why).0, "giving up")
            .map(drop)
    }

    /// A connection of this rank's own for its heartbeat ([`crate::heartbeat`]), beside the
    /// rank's connection (which must have joined: the store takes a heartbeat only with the
    /// token it answered that join with): each request gives up after `limit`. A store
    /// full at that moment is tried again for a second. Its closing, whenever, says
    /// nothing: the rank's connection says whether it is gone.
    pub fn heartbeat(&self, join: &Join, limit: Duration) -> Result<Store> {
        let deadline = Instant::now() + limit;
        let retry_until = Instant::now() + limit.min(Duration::from_secs(1));
        loop {
            match try_connect(&self.addr, join, (ROLE_HEARTBEAT, &self.token), deadline, limit) {
                Ok((conn, _)) => {
                    return Ok(Store {
                        conn,
                        addr: self.addr.clone(),
                        token: Vec::new(),
                        timeout: limit,
                        reply_within: limit,
                    });
                }
                Err(Attempt::Refused(why) | Attempt::Silent(why)) => bail!("{why}"),
                Err(Attempt::Failed(e)) if Instant::now() >= retry_until => return Err(e.into()),
                Err(Attempt::Failed(_)) => thread::sleep(Duration::from_millis(100)),
            }
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
            ERR => Err(StoreSaid::from_wire(&body).into()),
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

/// One try at joining the store at `addr` as `role` (with the token of the rank's join,
/// for a heartbeat), over by `deadline` (the end of the `timeout` the rank gives the whole
/// join, which messages name). The connection, and the body of the store's answer.
fn try_connect(
    addr: &str,
    join: &Join,
    (role, token): (u64, &[u8]),
    deadline: Instant,
    timeout: Duration,
) -> std::result::Result<(TcpStream, Vec<u8>), Attempt> {
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
                let hello = Encoder::default()
                    .str(&join.job_id)
                    .u64(join.world_size as u64)
                    .u64(join.rank as u64)
                    .u64(role)
                    .str(join.secret.as_ref().map_or("", |s| s.text()))
                    .bytes(token);
                wire::write_frame(&mut conn, HELLO, &hello.0).map_err(Attempt::Failed)?;
                let mut reply = Until::new(&conn, by);
                let answer = wire::read_frame(&mut reply, MAX_FRAME);
                let waited = crate::units::human_duration(timeout);
                return match answer {
                    Ok((OK, body)) => Ok((conn, body)),
                    Ok((ERR, why)) => Err(Attempt::Refused(String::from_utf8_lossy(&why).into_owned())),
                    // Full for now (strangers crowd it): another try may get in.
                    Ok((FULL, why)) => Err(Attempt::Failed(io::Error::other(
                        String::from_utf8_lossy(&why).into_owned(),
                    ))),
                    // Closed before a byte of answer: a store that shed this connection
                    // (full, or crowded by strangers) before it read it; another try may get in.
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::UnexpectedEof
                                | io::ErrorKind::ConnectionReset
                                | io::ErrorKind::ConnectionAborted
                        ) && reply.2 == 0 =>
                    {
                        Err(Attempt::Failed(io::Error::new(
                            e.kind(),
                            format!("{target} closed the connection before answering"),
                        )))
                    }
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
