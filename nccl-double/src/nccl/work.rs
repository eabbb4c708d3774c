//! Queued work: what a unit is (one call, or one communicator's part of a group), and how
//! a communicator's worker runs it through the meeting folder.
//!
//! A unit runs in three steps: publish every share and message; complete every collective
//! and receive; wait until every send was received (a send completes when the peer has
//! taken it, as NCCL's does). Buffers are read and written when the unit runs, not when
//! it was queued, as a kernel does: every sendbuff of a unit is read before any recvbuff
//! is written (which is why an in-place collective works; overlaps NCCL would get wrong
//! are refused by the call, rule 6).
//!
//! A collective's share is its description line, then the bytes of sendbuff this rank
//! uses (none for a broadcast's non-root). Each rank computes its own result from every
//! rank's share: all-reduce, the reduction; broadcast, the root's share; reduce, the
//! reduction on the root only (a non-root's recvbuff is not written); all-gather, the
//! shares one after another in rank order; reduce-scatter, the reduction of block `rank`
//! of every share.

use super::{INTERNAL_ERROR, INVALID_ARGUMENT, INVALID_USAGE};
use crate::exchange::{Failure, Halt, Room, Wanted};
use crate::memory;
use crate::reduce::{DataType, Op, reduce};
use crate::result::SYSTEM_ERROR;
use crate::stream::{self, Key, Ticket};
use std::collections::VecDeque;
use std::sync::atomic::AtomicBool;

/// Which collective (with its op and root).
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    AllReduce(Op),
    Broadcast(usize),
    /// The op, and the root.
    Reduce(Op, usize),
    AllGather,
    ReduceScatter(Op),
}

impl Kind {
    /// How a call is described to the other ranks (and in messages). `count` is the
    /// call's own: NCCL's `sendcount` for all-gather, `recvcount` for reduce-scatter.
    pub fn describe(self, count: usize, dtype: DataType) -> String {
        match self {
            Kind::AllReduce(op) => format!("ncclAllReduce(count={count}, {dtype}, {op})"),
            Kind::Broadcast(root) => format!("ncclBroadcast(count={count}, {dtype}, root={root})"),
            Kind::Reduce(op, root) => format!("ncclReduce(count={count}, {dtype}, {op}, root={root})"),
            Kind::AllGather => format!("ncclAllGather(sendcount={count}, {dtype})"),
            Kind::ReduceScatter(op) => format!("ncclReduceScatter(recvcount={count}, {dtype}, {op})"),
        }
    }

    /// Whether rank `rank` shares data: every rank but a broadcast's non-roots.
    pub fn shares_data(self, rank: usize) -> bool {
        match self {
            Kind::Broadcast(root) => rank == root,
            _ => true,
        }
    }

    /// Bytes of sendbuff and of recvbuff that rank `rank` of `nranks` uses, for `bytes`
    /// = count x size: 0 for a buffer the rank does not use (a broadcast's sendbuff and a
    /// reduce's recvbuff, but on the root). `None` if a size overflows.
    pub fn sizes(self, rank: usize, nranks: usize, bytes: usize) -> Option<(usize, usize)> {
        let all = bytes.checked_mul(nranks)?;
        Some(match self {
            Kind::AllReduce(_) => (bytes, bytes),
            Kind::Broadcast(root) => (if rank == root { bytes } else { 0 }, bytes),
            Kind::Reduce(_, root) => (bytes, if rank == root { bytes } else { 0 }),
            Kind::AllGather => (bytes, all),
            Kind::ReduceScatter(_) => (all, bytes),
        })
    }
}

/// One checked call, to run later.
#[derive(Debug)]
pub enum Call {
    Collective {
        kind: Kind,
        dtype: DataType,
        send: usize,
        /// Bytes of sendbuff this rank reads (0: none, see [`Kind::sizes`]).
        send_bytes: usize,
        recv: usize,
        /// Bytes of recvbuff this rank writes (0: none).
        recv_bytes: usize,
        /// How the call is described to the other ranks (and in messages).
        call: String,
    },
    Send {
        peer: usize,
        dtype: DataType,
        count: usize,
        buf: usize,
    },
    Recv {
        peer: usize,
        dtype: DataType,
        count: usize,
        buf: usize,
    },
}

impl Call {
    /// How the call is named in messages.
    pub fn describe(&self) -> String {
        match self {
            Call::Collective { call, .. } => call.clone(),
            Call::Send { peer, dtype, count, .. } => format!("ncclSend(count={count}, {dtype}, peer={peer})"),
            Call::Recv { peer, dtype, count, .. } => format!("ncclRecv(count={count}, {dtype}, peer={peer})"),
        }
    }

    /// The device memory the call reads, as (name, address, bytes); none if empty.
    pub fn reads(&self) -> Option<Region> {
        let (at, bytes) = match self {
            Call::Collective { send, send_bytes, .. } => (*send, *send_bytes),
            Call::Send { dtype, count, buf, .. } => (*buf, count * dtype.size()),
            Call::Recv { .. } => return None,
        };
        (bytes > 0).then_some(Region {
            name: "sendbuff",
            at,
            bytes,
        })
    }

    /// The device memory the call writes; none if empty.
    pub fn writes(&self) -> Option<Region> {
        let (at, bytes) = match self {
            Call::Collective { recv, recv_bytes, .. } => (*recv, *recv_bytes),
            Call::Recv { dtype, count, buf, .. } => (*buf, count * dtype.size()),
            Call::Send { .. } => return None,
        };
        (bytes > 0).then_some(Region {
            name: "recvbuff",
            at,
            bytes,
        })
    }
}

/// A range of device memory a call uses.
#[derive(Clone, Copy, Debug)]
pub struct Region {
    /// `sendbuff` or `recvbuff`.
    pub name: &'static str,
    pub at: usize,
    pub bytes: usize,
}

impl Region {
    /// Whether the two ranges share a byte.
    pub fn overlaps(&self, o: &Region) -> bool {
        self.at < o.at + o.bytes && o.at < self.at + self.bytes
    }
}

impl std::fmt::Display for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {:#x} ({} bytes)", self.name, self.at, self.bytes)
    }
}

/// A unit of queued work: its calls, and one ticket per stream they were given, which
/// keeps those streams busy until the unit is dropped (done, failed, or aborted).
#[derive(Debug)]
pub struct Unit {
    calls: Vec<Call>,
    /// One per stream: the unit's place in each stream's order.
    tickets: Vec<Ticket>,
}

impl Unit {
    /// Queues `calls` on their `streams`: from now on those streams are busy.
    pub fn new(calls: Vec<Call>, streams: &[Key]) -> Self {
        let mut keys: Vec<Key> = Vec::new();
        for k in streams {
            if !keys.contains(k) {
                keys.push(*k);
            }
        }
        Self {
            calls,
            tickets: keys.into_iter().map(stream::begin).collect(),
        }
    }

    /// The unit's calls, in issue order.
    pub fn calls(&self) -> &[Call] {
        &self.calls
    }
}

/// What a worker keeps between units: how many collectives and messages so far, and
/// which of its shares are still in the folder.
pub struct Progress {
    rank: usize,
    nranks: usize,
    /// Collectives run so far (the number of the last one).
    seq: u64,
    /// Messages sent to / received from each peer so far.
    sent: Vec<u64>,
    received: Vec<u64>,
    /// This rank's collective shares not yet removed.
    unswept: VecDeque<u64>,
}

impl Progress {
    /// Nothing run yet, as rank `rank` of `nranks`.
    pub fn new(rank: usize, nranks: usize) -> Self {
        Self {
            rank,
            nranks,
            seq: 0,
            sent: vec![0; nranks],
            received: vec![0; nranks],
            unswept: VecDeque::new(),
        }
    }

    /// Removes this rank's collective shares that every rank has finished reading.
    fn sweep(&mut self, room: &Room) {
        let Some(&oldest) = self.unswept.front() else {
            return;
        };
        let mut done = u64::MAX;
        for r in 0..self.nranks {
            let d = room
                .read(&format!("done-{r}"))
                .and_then(|b| String::from_utf8_lossy(&b).trim().parse().ok())
                .unwrap_or(0);
            done = done.min(d);
            if done < oldest {
                return;
            }
        }
        while self.unswept.front().is_some_and(|&s| s <= done) {
            let s = self.unswept.pop_front().unwrap_or_default();
            room.remove(&format!("op-{s}-{}", self.rank));
        }
    }
}

/// A buffer that is no longer device memory when the queued call runs.
fn gone(call: &str, which: &str, why: String) -> Failure {
    Failure::new(
        INVALID_ARGUMENT,
        format!("{call}: {which} when the queued call ran: {why} (freed before the work was done?)"),
    )
}

/// A buffer the queued call could not read: gone ([`gone`]), or no room in host memory
/// for its copy (NCCL's system error, as its own failed allocations are).
fn unread(call: &str, which: &str, why: memory::Unread) -> Failure {
    match why {
        memory::Unread::Gone(why) => gone(call, which, why),
        memory::Unread::NoRoom(why) => Failure::new(SYSTEM_ERROR, format!("{call}: {why}")),
    }
}

/// Runs `unit` as this rank: the three steps, in order. Stops with [`Halt::Aborted`] as
/// soon as `abort` is set.
pub fn run(unit: &Unit, p: &mut Progress, room: &Room, abort: &AtomicBool) -> Result<(), Halt> {
    // Stream order: the unit starts once the work queued before it on each of its
    // streams is done, by this communicator or another (a split's and its parent's
    // calls on one stream run in the order they were queued, as kernels do).
    for t in &unit.tickets {
        while !t.may_start() {
            if abort.load(std::sync::atomic::Ordering::Acquire) {
                return Err(Halt::Aborted);
            }
            t.wait_turn(std::time::Duration::from_millis(5));
        }
    }
    pace(abort)?;
    // Step 1: publish. Each call gets its number: the collective's, or the message's.
    let mut numbers = Vec::with_capacity(unit.calls.len());
    for call in &unit.calls {
        numbers.push(publish(call, p, room)?);
    }
    let calls = || unit.calls.iter().zip(numbers.iter().copied());
    // Step 2: collectives and receives.
    for (call, n) in calls().filter(|(c, _)| !matches!(c, Call::Send { .. })) {
        complete(call, n, p, room, abort)?;
    }
    // Step 3: every send taken by its peer.
    for (call, n) in calls().filter(|(c, _)| matches!(c, Call::Send { .. })) {
        complete(call, n, p, room, abort)?;
    }
    Ok(())
}

/// With `NCCL_DOUBLE_WORK_US=N`, every unit of work takes at least N microseconds before
/// it starts (a slow GPU or network, played by sleeping: long queues of work that
/// progress throughout, at little CPU cost). Aborting stops the sleep within a few ms.
fn pace(abort: &AtomicBool) -> Result<(), Halt> {
    static PACE: std::sync::OnceLock<std::time::Duration> = std::sync::OnceLock::new();
    let pace = *PACE.get_or_init(|| std::time::Duration::from_micros(crate::env_number("NCCL_DOUBLE_WORK_US", 0)));
    let until = std::time::Instant::now() + pace;
    loop {
        if abort.load(std::sync::atomic::Ordering::Acquire) {
            return Err(Halt::Aborted);
        }
        let left = until.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Ok(());
        }
        std::thread::sleep(left.min(std::time::Duration::from_millis(5)));
    }
}

/// Step 1 of a call: publish this rank's share or message; returns the call's number.
fn publish(call: &Call, p: &mut Progress, room: &Room) -> Result<u64, Failure> {
    Ok(match call {
        Call::Collective {
            send, send_bytes, call, ..
        } => {
            p.sweep(room);
            p.seq += 1;
            let share = memory::read_after(format!("{call}\n").as_bytes(), *send, *send_bytes)
                .map_err(|e| unread(call, "sendbuff", e))?;
            room.publish(&format!("op-{}-{}", p.seq, p.rank), &share)?;
            p.unswept.push_back(p.seq);
            p.seq
        }
        Call::Send {
            peer,
            dtype,
            count,
            buf,
        } => {
            let n = p.sent[*peer];
            p.sent[*peer] += 1;
            let msg = memory::read_after(format!("{count} {dtype}\n").as_bytes(), *buf, *count * dtype.size())
                .map_err(|e| unread(&format!("ncclSend(count={count}, {dtype}, peer={peer})"), "sendbuff", e))?;
            room.publish(&format!("msg-{}-{peer}-{n}", p.rank), &msg)?;
            n
        }
        Call::Recv { peer, .. } => {
            let n = p.received[*peer];
            p.received[*peer] += 1;
            n
        }
    })
}

/// Splits a share or message into its description line and its data.
fn split(b: &[u8]) -> (String, &[u8]) {
    let nl = b.iter().position(|x| *x == b'\n').unwrap_or(b.len());
    (
        String::from_utf8_lossy(&b[..nl]).into_owned(),
        &b[(nl + 1).min(b.len())..],
    )
}

/// Steps 2 and 3 of call number `n`: wait for the others and finish the call.
fn complete(call: &Call, n: u64, p: &Progress, room: &Room, abort: &AtomicBool) -> Result<(), Halt> {
    match call {
        Call::Collective {
            kind,
            dtype,
            send_bytes,
            recv,
            recv_bytes,
            call,
            ..
        } => {
            let wanted: Vec<Wanted> = (0..p.nranks)
                .map(|r| Wanted {
                    name: format!("op-{n}-{r}"),
                    from: r,
                })
                .collect();
            let what = format!("every rank's collective #{n} ({call})");
            let shares = room.wait(&wanted, &what, &mut |_, _| Ok(()), abort)?;
            let shares: Vec<(String, &[u8])> = shares.iter().map(|b| split(b)).collect();
            // Rule 4: all ranks made the same call (compared with rank 0's, so every rank
            // reports the same pair).
            if let Some((r, (theirs, _))) = shares.iter().enumerate().find(|(_, (s, _))| *s != shares[0].0) {
                return Err(Failure::new(
                    INVALID_USAGE,
                    format!(
                        "collective mismatch at call #{n}: rank 0 called {} but rank {r} called {theirs}. Every \
                         rank must call the same collectives (same count, type, op and root) in the same order \
                         (real NCCL would hang or corrupt data)",
                        shares[0].0
                    ),
                )
                .into());
            }
            // Every rank made this call: what each shared is known. A broadcast's root
            // shares what every other rank receives; the others, what this rank sends.
            let shared = match kind {
                Kind::Broadcast(_) => *recv_bytes,
                _ => *send_bytes,
            };
            for (r, (_, data)) in shares.iter().enumerate() {
                let expected = if kind.shares_data(r) { shared } else { 0 };
                if data.len() != expected {
                    return Err(Failure::new(
                        INTERNAL_ERROR,
                        format!("collective #{n}: rank {r} shared {} bytes for {expected}", data.len()),
                    )
                    .into());
                }
            }
            let data: Vec<&[u8]> = shares.iter().map(|(_, d)| *d).collect();
            // What this rank receives (`None`: nothing, a reduce's non-root).
            // Working copies in host memory: short of it, the call fails (NCCL's system
            // error, as for any host allocation NCCL cannot make), never the process.
            let result = match kind {
                Kind::AllReduce(o) => Some(reduce(&data, *dtype, *o)),
                Kind::Broadcast(root) => Some(memory::try_copy(data[*root])),
                Kind::Reduce(o, root) => (p.rank == *root).then(|| reduce(&data, *dtype, *o)),
                Kind::AllGather => Some(memory::try_copy(&[]).and_then(|mut all| {
                    let total = data.iter().map(|d| d.len()).sum();
                    all.try_reserve_exact(total).map_err(|_| memory::no_room(total))?;
                    data.iter().for_each(|d| all.extend_from_slice(d));
                    Ok(all)
                })),
                Kind::ReduceScatter(o) => {
                    // Block `rank` of every rank's sendbuff.
                    let at = p.rank * recv_bytes;
                    let blocks: Vec<&[u8]> = data.iter().map(|d| &d[at..at + recv_bytes]).collect();
                    Some(reduce(&blocks, *dtype, *o))
                }
            };
            let result = result
                .transpose()
                .map_err(|why| Failure::new(SYSTEM_ERROR, format!("{call}: {why}")))?
                .unwrap_or_default();
            if result.len() != *recv_bytes {
                return Err(Failure::new(
                    INTERNAL_ERROR,
                    format!("collective #{n}: {} bytes of data for {recv_bytes}", result.len()),
                )
                .into());
            }
            if !result.is_empty() {
                memory::write_checked(*recv, &result).map_err(|e| gone(call, "recvbuff", e))?;
            }
            room.publish(&format!("done-{}", p.rank), n.to_string().as_bytes())?;
        }
        Call::Recv {
            peer,
            dtype,
            count,
            buf,
        } => {
            let name = format!("msg-{peer}-{}-{n}", p.rank);
            let what = format!("message #{n} from rank {peer} (ncclRecv of {count} x {dtype})");
            let wanted = [Wanted {
                name: name.clone(),
                from: *peer,
            }];
            let msg = room.wait(&wanted, &what, &mut |_, _| Ok(()), abort)?;
            let (header, data) = split(&msg[0]);
            room.remove(&name);
            let ack = format!("ack-{peer}-{}-{n}", p.rank);
            if header != format!("{count} {dtype}") {
                let (sc, st) = header.split_once(' ').unwrap_or((&header, "?"));
                let why = format!(
                    "ncclRecv of {count} x {dtype} by rank {} from rank {peer} does not match ncclSend of {sc} x {st} \
                     by rank {peer} (message #{n} between them): a matched send and recv must have the same count and type",
                    p.rank
                );
                room.publish(&ack, format!("error\n{why}").as_bytes())?;
                return Err(Failure::new(INVALID_USAGE, why).into());
            }
            if !data.is_empty() {
                let what = format!("ncclRecv(count={count}, {dtype}, peer={peer})");
                memory::write_checked(*buf, data).map_err(|e| gone(&what, "recvbuff", e))?;
            }
            room.publish(&ack, b"ok")?;
        }
        Call::Send { peer, dtype, count, .. } => {
            let name = format!("ack-{}-{peer}-{n}", p.rank);
            let what = format!(
                "rank {peer} to receive message #{n} (ncclSend of {count} x {dtype}; a send completes only when the \
                 peer posts the matching ncclRecv: sends and receives that must progress together belong in one \
                 ncclGroupStart/ncclGroupEnd)"
            );
            let wanted = [Wanted {
                name: name.clone(),
                from: *peer,
            }];
            let ack = room.wait(&wanted, &what, &mut |_, _| Ok(()), abort)?;
            room.remove(&name);
            if let Some(why) = String::from_utf8_lossy(&ack[0]).strip_prefix("error\n") {
                return Err(Failure::new(INVALID_USAGE, why.to_string()).into());
            }
        }
    }
    Ok(())
}
