//! What the exercises (EXERCISES.md) add to the session, to build collectives by hand:
//!
//! - point-to-point on *parts* of a buffer: [`Session::send_part`], [`Session::recv_part`],
//!   [`Session::recv_add_part`];
//! - a send and a receive at the same time, as `MPI_Sendrecv` (or the tutorial's `isend`
//!   before `recv`): [`Session::send_recv`], [`Session::send_recv_add`]. A ring in which
//!   every rank sends before it receives deadlocks once messages outgrow the transport's
//!   buffers; these never do;
//! - buffers from and to host memory: [`Session::buffer_with`], [`Session::from_host`],
//!   [`Session::to_host`];
//! - a check element by element ([`Session::check_each`]) and the timing of a collective
//!   built by hand ([`Session::time_as`]);
//! - the accounts of every message ([`Ledger`]): each rank counts what it sent to and
//!   received from each peer, and the end of the job compares them, so that a message sent
//!   and never received is an error on every backend (NCCL would hang there; the CPU
//!   backend's buffers would hold a small one and say nothing); and a rank that fails
//!   inside a send says what its receiver was waiting in meanwhile (a send of its own:
//!   a deadlock, which a group, [`Session::group`], would have avoided).
//!
//! On the CPU backend buffers are host memory and these calls are the backend's own
//! send and receive on slices. On NCCL they stage through host memory (download, NCCL
//! send/recv of a whole temporary buffer, upload): slow, but exact, and enough for
//! exercises; a real GPU program would send device views and reduce with a kernel.

use super::Session;
use crate::Communicator;
use crate::args::DataArgs;
use crate::backend::{Buffer, Storage};
use crate::collective::Collective;
use crate::report::Timing;
use anyhow::{Context, Result, anyhow};
use serde::{Deserialize, Serialize};
use std::ops::Range;
use std::thread;
use std::time::Duration;
use workbook_cpu::Cpu;
use workbook_cpu::comm::split_two;
use workbook_runtime::element::{Element, ReduceOp, as_bytes};
use workbook_runtime::error::{SharedError, usage};
use workbook_runtime::failure::{self, Fact};
use workbook_runtime::record::{self, Dir, How};
use workbook_runtime::units::human_bytes;

/// Parts up to this size are sent before receiving, with no helper thread: the socket's
/// buffers hold them, so two ranks sending to each other at once cannot deadlock.
const INLINE_SEND: usize = 16 << 10;

/// Messages and bytes, counted one way between two ranks.
#[derive(Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, Debug)]
pub(crate) struct Tally {
    pub messages: u64,
    pub bytes: u64,
}

/// One rank's accounts of its point-to-point calls (the session's send, recv and their
/// parts), per peer, counted when a call is made (a send that never returns counts): what
/// the end of the job compares, rank against rank. Collectives are not counted: their
/// sends and receives match by construction.
#[derive(Clone, Default, Serialize, Deserialize, Debug)]
pub(crate) struct Ledger {
    /// What this rank sent to each rank (by rank; its own entry stays zero).
    pub sent: Vec<Tally>,
    /// What this rank received from each rank.
    pub received: Vec<Tally>,
    /// Whether this rank is inside a send or a receive (when it failed: stuck in one,
    /// rather than gone on without receiving).
    pub inside: bool,
    /// Said at this rank's failure (else at a meeting, before waiting there).
    pub failed: bool,
    /// The one send or receive this rank is inside, when it is one call of one direction
    /// (not an exchange, nor a group's): what it waits for.
    #[serde(default)]
    pub waits: Option<Wait>,
    /// Changed since the store last heard of it (at first, it never did).
    #[serde(skip)]
    unsaid: bool,
}

/// A send to a peer, or a receive from one, that a rank waits in.
#[derive(Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Debug)]
pub(crate) struct Wait {
    /// A send (else a receive).
    pub send: bool,
    /// The peer, as a rank of the world.
    pub peer: usize,
    pub bytes: u64,
}

impl Ledger {
    /// Empty accounts for a world of `world` ranks.
    pub fn new(world: usize) -> Ledger {
        Ledger {
            sent: vec![Tally::default(); world],
            received: vec![Tally::default(); world],
            inside: false,
            failed: false,
            waits: None,
            unsaid: true,
        }
    }

    /// A call begins: `send` to a peer and `recv` from one, of so many bytes each.
    pub(super) fn enter(&mut self, send: Option<(usize, usize)>, recv: Option<(usize, usize)>) {
        for (book, entry) in [(&mut self.sent, send), (&mut self.received, recv)] {
            if let Some((peer, bytes)) = entry
                && let Some(t) = book.get_mut(peer)
            {
                t.messages += 1;
                t.bytes += bytes as u64;
            }
        }
        self.inside = true;
        self.unsaid = true;
        let wait = |send: bool, (peer, bytes): (usize, usize)| Wait {
            send,
            peer,
            bytes: bytes as u64,
        };
        self.waits = match (send, recv) {
            (Some(s), None) => Some(wait(true, s)),
            (None, Some(r)) => Some(wait(false, r)),
            _ => None,
        };
    }

    /// Several calls begin at once (a group's): each counted, none waited in alone.
    pub(super) fn enter_all(
        &mut self,
        calls: impl IntoIterator<Item = (Option<(usize, usize)>, Option<(usize, usize)>)>,
    ) {
        for (send, recv) in calls {
            self.enter(send, recv);
        }
        self.waits = None;
    }

    /// The call returned (with or without an error of its own).
    pub(super) fn leave<R>(&mut self, result: Result<R>) -> Result<R> {
        if result.is_ok() {
            self.inside = false;
            self.waits = None;
        }
        result
    }
}

/// Every pair of ranks whose accounts disagree, as `(sender, line)`, one line each: what
/// `sender` sent to a rank that did not receive it all. `ledgers[r]` is rank r's, or
/// `None` when it is not known (a rank gone); `only_gone_on` leaves out receivers that are
/// themselves inside a send or receive (stuck in a deadlock: the deadlock is the story).
/// `nccl`: the job runs on NCCL, where such a send waits for ever (else: it would).
/// One pair of ranks whose accounts differ ([`unmatched`]).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Unmatched {
    /// The sender.
    pub from: usize,
    /// The receiver.
    pub to: usize,
    /// Whether `from` sent what `to` never received (else the sizes or counts differ).
    pub unreceived: bool,
    /// The line that says it.
    pub line: String,
}

impl Unmatched {
    /// Its line as an error, with the fact for the sender's failure record
    /// ([`workbook_runtime::failure`]).
    pub(crate) fn error(self) -> anyhow::Error {
        let e = anyhow::anyhow!(self.line);
        match self.unreceived {
            true => failure::attach(e, Fact::Unreceived { to: self.to }),
            false => e,
        }
    }
}

pub(crate) fn unmatched(ledgers: &[Option<Ledger>], only_gone_on: bool, nccl: bool) -> Vec<Unmatched> {
    let mut lines = Vec::new();
    for (from, a) in ledgers.iter().enumerate() {
        let Some(a) = a else { continue };
        for (to, b) in ledgers.iter().enumerate() {
            let Some(b) = b else { continue };
            if from == to || (only_gone_on && b.inside) {
                continue;
            }
            let (sent, got) = (
                a.sent.get(to).copied().unwrap_or_default(),
                b.received.get(from).copied().unwrap_or_default(),
            );
            if sent == got || (only_gone_on && sent.messages <= got.messages) {
                continue;
            }
            lines.push(Unmatched {
                from,
                to,
                unreceived: sent.messages > got.messages && sent.bytes >= got.bytes,
                line: mismatch(from, to, sent, got, nccl),
            });
        }
    }
    lines
}

/// One line for what `from` sent to `to` against what `to` received from `from`.
fn mismatch(from: usize, to: usize, sent: Tally, got: Tally, nccl: bool) -> String {
    let size = |t: Tally| match t.messages {
        1 => human_bytes(t.bytes as usize),
        n => format!("{n} messages ({})", human_bytes(t.bytes as usize)),
    };
    if sent.messages > got.messages && sent.bytes >= got.bytes {
        let extra = Tally {
            messages: sent.messages - got.messages,
            bytes: sent.bytes - got.bytes,
        };
        let of = match got.messages {
            0 => String::new(),
            _ => format!(" (of {} sent, it received {})", size(sent), size(got)),
        };
        let verb = if extra.messages == 1 { "a send" } else { "sends" };
        let hang = if nccl {
            "NCCL hangs here"
        } else {
            "NCCL would hang here"
        };
        return format!(
            "rank {from} sent {} to rank {to} that rank {to} never received{of} ({verb} with no matching recv: {hang})",
            size(extra)
        );
    }
    if got.messages > sent.messages {
        return format!(
            "rank {to} received {} from rank {from}, which sent it {}: a recv with no matching send",
            size(got),
            size(sent)
        );
    }
    format!(
        "rank {from} sent {} to rank {to}, and rank {to} received {}: the sizes of a send and its recv differ",
        size(sent),
        size(got)
    )
}

impl Session {
    /// The end of the job: every rank's accounts, shared through the store (which is also
    /// the job's last meeting, bounded by `--timeout` as every meeting is), and the lines
    /// that this rank must say as the sender of a message nobody received.
    pub(super) fn settle_p2p(&mut self) -> Result<Vec<Unmatched>> {
        self.say_p2p()?;
        let (rank, world) = (self.rank(), self.world_size());
        let all: Vec<Ledger> =
            self.store
                .share_json("end", rank, world, &self.ledger, "every rank to reach the end")?;
        let all: Vec<Option<Ledger>> = all.into_iter().map(Some).collect();
        Ok(unmatched(&all, false, self.backend_name() == "nccl")
            .into_iter()
            .filter(|u| u.from == rank)
            .collect())
    }

    /// Before a meeting in the store (a table, a check, a barrier), where a rank may wait
    /// for long: this rank's accounts, said in the store if they changed since the last
    /// meeting (a `set`, outside any timing). A rank stuck in a send to a rank that went on
    /// to a meeting without receiving reads them there when it fails.
    pub(super) fn say_p2p(&mut self) -> Result<()> {
        if !self.ledger.unsaid {
            return Ok(());
        }
        self.ledger.unsaid = false;
        let key = format!("p2p/{}", self.rank());
        self.store.set(&key, &serde_json::to_vec(&self.ledger)?)
    }

    /// After a failure: says this rank's accounts in the store and, if it had sent
    /// anything, reads those of the ranks it sent to (as each said them last: at its last
    /// meeting, or at its own failure), to tell whether it was a message that one of them
    /// never received because it went on without it (a send that never returns on NCCL, or
    /// once it outgrows the CPU backend's buffers). Then the first such line, to put
    /// before the failure; else nothing. Each look at the store gives up within a second.
    /// With the line, the rank that never received this rank's message, if that is what it says.
    pub(super) fn unreceived_at_failure(&mut self) -> Option<(String, Option<usize>)> {
        let rank = self.rank();
        let mut store = self.store.watcher(Duration::from_secs(1)).ok()?;
        self.ledger.failed = true;
        let mine = serde_json::to_vec(&self.ledger).ok()?;
        store.set(&format!("p2p/{rank}"), &mine).ok()?;
        if self.ledger.sent.iter().all(|t| t.messages == 0) {
            return None;
        }
        // Stuck in a send whose receiver waits in a send or receive of its own: a deadlock.
        if let Some(w) = self.ledger.waits.filter(|w| w.send && self.ledger.inside)
            && let Some(line) = self.stuck_send(&mut store, w)
        {
            return Some((line, None));
        }
        // A peer's accounts are current if it said them failing, or if it waits in the
        // store now (it said them on its way into that meeting).
        let meeting = store.waiting().ok()?;
        let mut known: Vec<Option<Ledger>> = vec![None; self.world_size()];
        for (peer, sent) in self.ledger.sent.iter().enumerate() {
            if sent.messages > 0
                && let Ok(Some(v)) = store.get(&format!("p2p/{peer}"))
            {
                known[peer] = serde_json::from_slice::<Ledger>(&v)
                    .ok()
                    .filter(|l| l.failed || meeting.contains(&peer));
            }
        }
        known[rank] = Some(self.ledger.clone());
        unmatched(&known, true, self.backend_name() == "nccl")
            .into_iter()
            .find(|u| u.from == rank)
            .map(|u| (u.line, u.unreceived.then_some(u.to)))
    }
}

impl Session {
    /// This rank failed inside its send `w`: what its receiver was doing meanwhile, as its
    /// accounts say once it has failed too (or waits at a meeting), asked for up to a
    /// second. One line: which send waits for which rank, and what that rank waits in.
    /// `None` when the receiver is in no send or receive (it went on without receiving:
    /// the caller's story), or its accounts do not say (it is gone, or still running).
    fn stuck_send(&self, store: &mut workbook_runtime::rendezvous::Store, w: Wait) -> Option<String> {
        let rank = self.rank();
        let since = std::time::Instant::now();
        let peer = loop {
            let meeting = store.waiting().ok()?;
            let said = store
                .get(&format!("p2p/{}", w.peer))
                .ok()
                .flatten()
                .and_then(|v| serde_json::from_slice::<Ledger>(&v).ok())
                .filter(|l| l.failed || meeting.contains(&w.peer));
            match said {
                Some(l) => break l,
                None if since.elapsed() < Duration::from_secs(1) => thread::sleep(Duration::from_millis(20)),
                None => return None,
            }
        };
        let p = w.peer;
        let doing = match (peer.inside, peer.waits) {
            (
                true,
                Some(Wait {
                    send: true, peer: q, ..
                }),
            ) => format!("rank {p} is in a send too, to rank {q}"),
            (
                true,
                Some(Wait {
                    send: false, peer: q, ..
                }),
            ) if q != rank => {
                format!("rank {p} waits in a receive from rank {q}")
            }
            _ => return None,
        };
        let why = match self.backend_name() {
            "nccl" => "past NCCL's eager size a send returns only once its receiver takes it",
            _ => {
                "past the link's buffer a send returns only once its receiver takes it, as NCCL's does past its eager size"
            }
        };
        Some(format!(
            "its send of {} to rank {p} is not received: {doing} (a deadlock: {why}; issue the sends and \
             receives together, in one group: session.group())",
            human_bytes(w.bytes as usize)
        ))
    }
}

/// What happens to elements that arrive: they replace the buffer's, or are added to them.
#[derive(Clone, Copy, PartialEq)]
enum Arrive {
    Replace,
    Add,
}

impl Session {
    /// A buffer of `--count` (or `--size`) elements where element `i` is `value(i)`, placed
    /// where the backend computes. Like [`Session::buffer`], it also takes `--show`.
    pub fn buffer_with<T: Element>(&mut self, data: &DataArgs, value: impl Fn(usize) -> T) -> Result<Buffer<T>> {
        self.lesson_buffer(data, 1, value)
    }

    /// A buffer of one block of `--count` elements per rank (all-gather's receive buffer,
    /// reduce-scatter's send buffer, all-to-all's), every element of block b equal to
    /// `value(b)`. Like [`Session::buffer`], it also takes `--show` (per block).
    pub fn blocks<T: Element>(&mut self, data: &DataArgs, value: impl Fn(usize) -> T) -> Result<Buffer<T>> {
        let count = data.count();
        // One block per rank of the communicator the calls run on (a split's, inside Session::on).
        self.lesson_buffer(data, self.comm.world(), |i| value(i / count))
    }

    /// `blocks` blocks of `--count` elements, element i being `value(i)`, once the memory
    /// for them (and for the copy their check reads back) is known to be there; the
    /// tables show `--show` elements of each block.
    fn lesson_buffer<T: Element>(
        &mut self,
        data: &DataArgs,
        blocks: usize,
        value: impl Fn(usize) -> T,
    ) -> Result<Buffer<T>> {
        let count = data.count();
        self.ensure_memory(2 * (blocks * count * size_of::<T>()) as u64, &data.what())?;
        self.show = Some(data.show.unwrap_or(count.min(8)).min(count));
        self.report.count = Some(count);
        let what = format!("{}: the buffer", data.what());
        self.comm
            .upload(workbook_runtime::limits::try_collect(blocks * count, &what, value)?)
    }

    /// A buffer holding `data`, placed where the backend computes (on NCCL, copied to the GPU).
    pub fn from_host<T: Element>(&mut self, data: Vec<T>) -> Result<Buffer<T>> {
        self.comm.upload(data)
    }

    /// Every element of `buf`, copied to host memory (on NCCL, after queued work is done).
    pub fn to_host<T: Element>(&self, buf: &Buffer<T>) -> Result<Vec<T>> {
        self.comm.download(buf, buf.len())
    }

    /// Sends elements `range` of `buf` to rank `peer`, which must receive as many.
    pub fn send_part<T: Element>(&mut self, buf: &Buffer<T>, range: Range<usize>, peer: usize) -> Result<()> {
        self.ensure_peer(peer)?;
        check_range(&range, buf.len())?;
        let rank = self.rank();
        self.ledger
            .enter(Some((self.world_rank_of(peer), range.len() * size_of::<T>())), None);
        let sent = match (&self.comm, &buf.storage) {
            (Communicator::Cpu(c), Storage::Host(v)) => {
                record::watch(record::P2P, v, None, false);
                let t = record::clock();
                let part = &v[range];
                c.send(part, peer)
                    .map(|()| record::op(t, "send_part", &[(Dir::Send, peer, as_bytes(part), How::Copy)]))
            }
            _ => self.staged(buf, Some((range, peer)), None).map(|_| ()),
        };
        self.ledger.leave(sent).with_context(|| format!("rank {rank}"))
    }

    /// Receives elements `range` of `buf` from rank `peer`, replacing what was there.
    pub fn recv_part<T: Element>(&mut self, buf: &mut Buffer<T>, range: Range<usize>, peer: usize) -> Result<()> {
        self.receive(buf, range, peer, Arrive::Replace)
    }

    /// Receives `range.len()` elements from rank `peer` and adds them, element by element,
    /// to elements `range` of `buf` (what a reduction does with what arrives).
    pub fn recv_add_part<T: Element>(&mut self, buf: &mut Buffer<T>, range: Range<usize>, peer: usize) -> Result<()> {
        self.receive(buf, range, peer, Arrive::Add)
    }

    /// Sends elements `send` of `buf` to rank `to` while receiving elements `recv` from
    /// rank `from`, replacing them. Both happen at once, so a ring of ranks that all call
    /// it never deadlocks. `send` and `recv` must not overlap.
    pub fn send_recv<T: Element>(
        &mut self,
        buf: &mut Buffer<T>,
        send: Range<usize>,
        to: usize,
        recv: Range<usize>,
        from: usize,
    ) -> Result<()> {
        self.exchange(buf, (send, to), (recv, from), Arrive::Replace)
    }

    /// Like [`Session::send_recv`], but the elements that arrive are added to elements
    /// `recv` of `buf`: one step of a reduce-scatter.
    pub fn send_recv_add<T: Element>(
        &mut self,
        buf: &mut Buffer<T>,
        send: Range<usize>,
        to: usize,
        recv: Range<usize>,
        from: usize,
    ) -> Result<()> {
        self.exchange(buf, (send, to), (recv, from), Arrive::Add)
    }

    /// Checks every element of every rank's buffer against `expected` (one value per
    /// element), as [`Session::check`] does for a single value; rank 0 reports, and the
    /// run fails at the end if any element is wrong.
    pub fn check_each<T: Element>(&mut self, buf: &Buffer<T>, expected: &[T]) -> Result<()> {
        if expected.len() != buf.len() {
            return Err(anyhow!(
                "check_each: {} expected values for a buffer of {} elements",
                expected.len(),
                buf.len()
            ));
        }
        self.check_by(buf, "the expected values", |i| expected[i])
    }

    /// Times `iters` runs of `op`, a collective built by hand from point-to-point calls,
    /// as [`Session::time`] does, counting each run as one `kind` (e.g.
    /// `&collective::ALL_REDUCE`) of `bytes` for algbw and busbw.
    pub fn time_as(
        &mut self,
        kind: &'static Collective,
        bytes: usize,
        iters: u32,
        mut op: impl FnMut(&mut Session) -> Result<()>,
    ) -> Result<Timing> {
        // The Time: line names what ran: the program's own calls, not an algorithm.
        self.hand_written = true;
        let timed = self.time(iters, |s| {
            op(s)?;
            // time() reads the last collective when the runs are over: this one.
            s.last_op = Some((kind, bytes));
            Ok(())
        });
        self.hand_written = false;
        timed
    }

    fn receive<T: Element>(
        &mut self,
        buf: &mut Buffer<T>,
        range: Range<usize>,
        peer: usize,
        how: Arrive,
    ) -> Result<()> {
        self.ensure_peer(peer)?;
        check_range(&range, buf.len())?;
        let rank = self.rank();
        self.ledger
            .enter(None, Some((self.world_rank_of(peer), range.len() * size_of::<T>())));
        let got = if let (Communicator::Cpu(c), Storage::Host(v)) = (&self.comm, &mut buf.storage) {
            let (name, noted) = match how {
                Arrive::Replace => ("recv_part", How::Copy),
                Arrive::Add => ("recv_add_part", How::Reduce),
            };
            record::watch(record::P2P, v, None, false);
            let t = record::clock();
            let dst = &mut v[range];
            let got = match how {
                Arrive::Replace => c.recv(dst, peer),
                Arrive::Add => {
                    let what = format!("recv_add_part from rank {peer}: room to receive");
                    workbook_runtime::limits::try_collect(dst.len(), &what, |_| T::default())
                        .and_then(|mut tmp| c.recv(&mut tmp, peer).map(|()| add(dst, &tmp)))
                }
            };
            got.map(|()| record::op(t, name, &[(Dir::Recv, peer, as_bytes(dst), noted)]))
        } else {
            self.staged(buf, None, Some((range, peer, how)))
                .map(|b| *buf = b.expect("a received buffer"))
        };
        self.ledger.leave(got).with_context(|| format!("rank {rank}"))
    }

    fn exchange<T: Element>(
        &mut self,
        buf: &mut Buffer<T>,
        (send, to): (Range<usize>, usize),
        (recv, from): (Range<usize>, usize),
        how: Arrive,
    ) -> Result<()> {
        self.ensure_peer(to)?;
        self.ensure_peer(from)?;
        check_range(&send, buf.len())?;
        check_range(&recv, buf.len())?;
        if send.start < recv.end && recv.start < send.end {
            return Err(usage(format!(
                "send_recv: the part sent ({send:?}) and the part received ({recv:?}) overlap"
            )));
        }
        let rank = self.rank();
        let size = size_of::<T>();
        let (to_w, from_w) = (self.world_rank_of(to), self.world_rank_of(from));
        self.ledger
            .enter(Some((to_w, send.len() * size)), Some((from_w, recv.len() * size)));
        let done = if let (Communicator::Cpu(c), Storage::Host(v)) = (&self.comm, &mut buf.storage) {
            let (name, noted) = match how {
                Arrive::Replace => ("send_recv", How::Copy),
                Arrive::Add => ("send_recv_add", How::Reduce),
            };
            record::watch(record::P2P, v, None, false);
            let t = record::clock();
            let (out, dst) = split_two(v, send, recv);
            let done = match how {
                Arrive::Replace => cpu_exchange(c, out, to, dst, from),
                Arrive::Add => {
                    let what = format!("exchange with rank {from}: room to receive");
                    workbook_runtime::limits::try_collect(dst.len(), &what, |_| T::default())
                        .and_then(|mut tmp| cpu_exchange(c, out, to, &mut tmp, from).map(|()| add(dst, &tmp)))
                }
            };
            let parts = [
                (Dir::Send, to, as_bytes(out), How::Copy),
                (Dir::Recv, from, as_bytes(dst), noted),
            ];
            done.map(|()| record::op(t, name, &parts))
        } else {
            self.staged(buf, Some((send, to)), Some((recv, from, how)))
                .map(|b| *buf = b.expect("a received buffer"))
        };
        self.ledger.leave(done).with_context(|| format!("rank {rank}"))
    }

    /// Point-to-point through host memory, for buffers on the GPU: the part to send goes
    /// up as a buffer of its own, what arrives comes back down and is written (or added)
    /// into a copy of the whole buffer, returned to replace it. A send and a receive
    /// together form one NCCL group, so that they progress together, as NCCL requires.
    fn staged<T: Element>(
        &mut self,
        buf: &Buffer<T>,
        send: Option<(Range<usize>, usize)>,
        recv: Option<(Range<usize>, usize, Arrive)>,
    ) -> Result<Option<Buffer<T>>> {
        let mut host = self.to_host(buf)?;
        // NCCL moves nothing for an empty part; neither do we (no zero-sized allocations).
        let out = match &send {
            Some((r, to)) if !r.is_empty() => Some((
                self.comm.upload(workbook_runtime::limits::try_copy(
                    &host[r.clone()],
                    "the part to send",
                )?)?,
                *to,
            )),
            _ => None,
        };
        let mut inp = match &recv {
            Some((r, from, _)) if !r.is_empty() => Some((
                self.comm.upload(workbook_runtime::limits::try_collect(
                    r.len(),
                    "room to receive",
                    |_| T::default(),
                )?)?,
                *from,
            )),
            _ => None,
        };
        let grouped = out.is_some() && inp.is_some();
        if grouped {
            self.comm.group_start()?;
        }
        let mut moved = Ok(());
        if let Some((b, to)) = &out {
            moved = self.comm.send(b, *to);
        }
        if let (Ok(()), Some((b, from))) = (&moved, &mut inp) {
            moved = self.comm.recv(b, *from);
        }
        if grouped {
            moved = moved.and(self.comm.group_end());
        }
        moved?;
        let Some((range, _, how)) = recv else {
            return Ok(None);
        };
        if let Some((b, _)) = &inp {
            let got = self.to_host(b)?;
            match how {
                Arrive::Replace => host[range].copy_from_slice(&got),
                Arrive::Add => add(&mut host[range], &got),
            }
        }
        Ok(Some(self.comm.upload(host)?))
    }
}

/// Sends `out` to `to` while receiving `into` from `from`: on a helper thread when the
/// part is too large for the socket's buffers to hold while this rank receives.
fn cpu_exchange<T: Element>(c: &Cpu, out: &[T], to: usize, into: &mut [T], from: usize) -> Result<()> {
    if size_of_val(out) <= INLINE_SEND {
        return c.send(out, to).and_then(|()| c.recv(into, from));
    }
    thread::scope(|s| {
        let sender = s.spawn(|| c.send(out, to));
        let got = c.recv(into, from);
        let sent = sender
            .join()
            .unwrap_or_else(|_| Err(anyhow!("the sending thread panicked")));
        got.and(sent)
    })
}

fn check_range(range: &Range<usize>, len: usize) -> Result<()> {
    if range.start > range.end || range.end > len {
        return Err(SharedError {
            message: format!("the part {range:?} is not inside the buffer of {len} elements (0..{len})"),
            usage: true,
        }
        .into());
    }
    Ok(())
}

fn add<T: Element>(acc: &mut [T], more: &[T]) {
    for (a, b) in acc.iter_mut().zip(more) {
        *a = a.combine(*b, ReduceOp::Sum);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger(world: usize, sent: &[(usize, usize)], received: &[(usize, usize)]) -> Option<Ledger> {
        let mut l = Ledger::new(world);
        for (peer, bytes) in sent {
            l.enter(Some((*peer, *bytes)), None);
        }
        for (peer, bytes) in received {
            l.enter(None, Some((*peer, *bytes)));
        }
        l.inside = false;
        Some(l)
    }

    #[test]
    fn a_message_nobody_received_is_one_line_naming_sender_receiver_and_size() {
        // A chain 0 → 1 → 2 of 64 B whose last rank also sends to the root.
        let all = [
            ledger(3, &[(1, 64)], &[]),
            ledger(3, &[(2, 64)], &[(0, 64)]),
            ledger(3, &[(0, 64)], &[(1, 64)]),
        ];
        let lines = unmatched(&all, false, false);
        assert_eq!(
            lines,
            [Unmatched {
                from: 2,
                to: 0,
                unreceived: true,
                line: "rank 2 sent 64 B to rank 0 that rank 0 never received (a send with no matching recv: NCCL \
                       would hang here)"
                    .to_string()
            }]
        );
        // Accounts that match say nothing; a receiver not known says nothing either.
        assert!(unmatched(&all[..2], false, false).is_empty());
        assert!(unmatched(&[all[0].clone(), all[1].clone(), None], false, true).is_empty());
        // Two of three received: the rest, and how many there were.
        let all = [ledger(2, &[(1, 8), (1, 8), (1, 8)], &[]), ledger(2, &[], &[(0, 8)])];
        assert_eq!(
            unmatched(&all, false, true)[0].line,
            "rank 0 sent 2 messages (16 B) to rank 1 that rank 1 never received (of 3 messages (24 B) sent, it \
             received 8 B) (sends with no matching recv: NCCL hangs here)"
        );
        // At a failure, a receiver stuck in a send or receive of its own is a deadlock, not this.
        let mut stuck = ledger(2, &[], &[]).unwrap();
        stuck.inside = true;
        assert!(unmatched(&[ledger(2, &[(1, 8)], &[]), Some(stuck)], true, false).is_empty());
    }
}
