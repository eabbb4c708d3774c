//! Groups: many collectives, sends and receives issued together, as NCCL's
//! `ncclGroupStart` ... `ncclGroupEnd`.
//!
//! ```ignore
//! let mut g = session.group()?;
//! g.broadcast(&mut a, 0)?;
//! g.broadcast(&mut b, 0)?;
//! g.send(&x, peer)?;
//! g.recv(&mut y, peer)?;
//! g.end()?;
//! ```
//!
//! A [`Group`] holds the session and every buffer given to it until [`Group::end`]: the
//! calls of a group have no order between them, so none of their buffers may be read or
//! written by anything else before the group ends, and no other call of the session can
//! be made inside it (NCCL's own rules, which the borrows enforce here).
//!
//! On NCCL, [`Session::group`] is `ncclGroupStart`, each call is issued into the group at
//! once (checked, and shown by `--show-calls`, as it is made), and [`Group::end`] is
//! `ncclGroupEnd`, polled until NCCL has queued the group: NCCL launches its calls
//! together, and its sends and receives progress together, whatever their order.
//!
//! On the CPU backend the calls are kept, and [`Group::end`] runs them together: the
//! collectives of one kind with the same root, operator, type and placement (in place or
//! not) and under [`PACK_BELOW`] are packed into one buffer and run as one collective
//! ([`workbook_cpu::collective::packed`]), then unpacked, and the larger ones run as they are;
//! then the sends and receives progress together: the sends to each peer on a thread of
//! their own (or first, on this one, when the link's buffer holds them), while this thread
//! receives, in the order they were issued. So an all-to-all written as n - 1 sends and
//! n - 1 receives in one group never deadlocks, whatever the size of its messages and the
//! order of its calls. What ran is said once per shape of group (rank 0, text output:
//! `Group: 292 broadcasts (float, root 0) packed into one broadcast of 121.1 KiB`);
//! `--steps` shows the packed collectives' steps under that name and the group's messages,
//! and `--trace` the group, its packed collectives and each message with its arrow.
//!
//! Without the group, blocking sends wait for their receiver (NCCL's beyond its eager
//! size, the CPU backend's once a message outgrows the link's buffer): an all-to-all in
//! which every rank sends first deadlocks, and each rank's failure says which send waits
//! for which rank ([`super::p2p`]'s accounts).

use super::Session;
use crate::Communicator;
use crate::backend::{Buffer, host, host_mut};
use crate::collective::{ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, BROADCAST, Collective, REDUCE, REDUCE_SCATTER};
use anyhow::{Context, Result, anyhow};
use std::any::Any;
use std::collections::{BTreeMap, BTreeSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;
use std::thread;
use workbook_cpu::Cpu;
use workbook_cpu::collective::packed;
use workbook_runtime::element::{DataType, Element, ReduceOp, as_bytes, as_bytes_mut};
use workbook_runtime::record::{self, Dir, How};
use workbook_runtime::units::human_bytes;

/// A group of calls, from [`Session::group`] to [`Group::end`]: see the [module's
/// documentation](self).
#[must_use = "a group's calls run (CPU) or are launched (NCCL) at its end(): call .end()?"]
pub struct Group<'a> {
    s: &'a mut Session,
    /// The CPU backend's collectives, run at the end (NCCL's are issued at once).
    colls: Vec<Coll<'a>>,
    /// The CPU backend's sends and receives, in the order they were issued.
    p2p: Vec<P2p<'a>>,
    /// On NCCL, the calls issued into the group, by NCCL's name, in order of first use.
    issued: Vec<(&'static str, usize)>,
    ended: bool,
}

/// A collective kept for the end of a CPU group. Its buffers are `Buffer<T>` for the `T`
/// `run` was made for.
struct Coll<'a> {
    coll: &'static Collective,
    send: Option<&'a dyn Any>,
    recv: &'a mut dyn Any,
    count: usize,
    root: usize,
    op: ReduceOp,
    dtype: DataType,
    /// Runs calls that pack together (this one's kind, root, op, type and placement).
    run: fn(&mut Session, &mut [Coll<'_>], &str) -> Result<()>,
}

/// A collective of this size or more runs as it is in a CPU group, not packed: its fixed
/// cost (α: a few microseconds over shared memory, tens over TCP) is small beside the time
/// its bytes take, and packing would copy them twice more (in and out of the packed
/// buffer, at about the speed the transport itself moves them).
pub const PACK_BELOW: usize = 64 << 10;

impl Coll<'_> {
    /// Whether this call runs as it is rather than packed ([`PACK_BELOW`]).
    fn alone(&self, world: usize) -> bool {
        bytes_of(self, world) >= PACK_BELOW
    }

    /// Whether `other` packs with this call into one collective.
    fn packs_with(&self, other: &Coll) -> bool {
        std::ptr::eq(self.coll, other.coll)
            && self.send.is_some() == other.send.is_some()
            && (self.root, self.op, self.dtype) == (other.root, other.op, other.dtype)
    }
}

/// A send or a receive kept for the end of a CPU group.
enum P2p<'a> {
    Send {
        data: &'a [u8],
        peer: usize,
        elems: usize,
    },
    Recv {
        data: &'a mut [u8],
        peer: usize,
        elems: usize,
    },
}

/// The shapes of the groups this process has said it ran: each is said once.
static SAID: Mutex<BTreeSet<u64>> = Mutex::new(BTreeSet::new());

/// The packed buffers of the last groups (`Buffer<T>`s), kept for the next: a training
/// loop packs the same tensors every step, and a buffer used again costs neither an
/// allocation nor the first touch of its pages. At most [`KEEP`] of them.
static KEPT: Mutex<Vec<Box<dyn Any + Send>>> = Mutex::new(Vec::new());
const KEEP: usize = 4;

fn hash(v: &impl Hash) -> u64 {
    let mut h = DefaultHasher::new();
    v.hash(&mut h);
    h.finish()
}

/// What a group's line says, in a number: its calls' kinds and sizes, its sends' and
/// receives' peers and sizes.
fn shape_of(colls: &[Coll], p2p: &[P2p]) -> u64 {
    let mut h = DefaultHasher::new();
    for c in colls {
        (
            c.coll.name(),
            c.send.is_some(),
            c.root,
            c.op.name(),
            c.dtype.name(),
            c.count,
        )
            .hash(&mut h);
    }
    for p in p2p {
        match p {
            P2p::Send { data, peer, .. } => (0, *peer, data.len()).hash(&mut h),
            P2p::Recv { data, peer, .. } => (1, *peer, data.len()).hash(&mut h),
        }
    }
    h.finish()
}

/// A buffer of `len` elements for a packed collective: one kept from an earlier group
/// if one has that type and length (its contents are overwritten), else a new one.
fn packed_buffer<T: Element>(s: &mut Session, len: usize, what: &str) -> Result<Buffer<T>> {
    let mut kept = KEPT.lock().unwrap_or_else(|p| p.into_inner());
    let fits = |b: &Box<dyn Any + Send>| b.downcast_ref::<Buffer<T>>().is_some_and(|b| b.len() == len);
    if let Some(i) = kept.iter().position(fits)
        && let Ok(b) = kept.swap_remove(i).downcast::<Buffer<T>>()
    {
        return Ok(*b);
    }
    drop(kept);
    s.comm
        .upload(workbook_runtime::limits::try_collect(len, what, |_| T::default())?)
}

/// Keeps `buf` for a later group ([`KEPT`]).
fn keep<T: Element>(buf: Buffer<T>) {
    let mut kept = KEPT.lock().unwrap_or_else(|p| p.into_inner());
    if kept.len() >= KEEP {
        kept.remove(0);
    }
    kept.push(Box::new(buf));
}

impl Session {
    /// Opens a group (NCCL's `ncclGroupStart`): the calls made on it until
    /// [`Group::end`] are issued together. On NCCL they are launched together; on the CPU
    /// backend, the small collectives of one kind are packed into one, and sends and
    /// receives progress together, so that no order of them can deadlock. See [`Group`].
    pub fn group(&mut self) -> Result<Group<'_>> {
        if let Communicator::Nccl(n) = &self.comm {
            let who = self.who();
            n.group_start().with_context(|| who)?;
        }
        Ok(Group {
            s: self,
            colls: Vec::new(),
            p2p: Vec::new(),
            issued: Vec::new(),
            ended: false,
        })
    }
}

impl<'a> Group<'a> {
    /// Broadcast (`ncclBroadcast`) in the group: `root`'s buffer into every rank's.
    pub fn broadcast<T: Element>(&mut self, buf: &'a mut Buffer<T>, root: usize) -> Result<()> {
        self.collective(&BROADCAST, None, buf, root, ReduceOp::Sum)
    }

    /// Broadcast out of place in the group: `root`'s `send` into every rank's `recv`.
    pub fn broadcast_into<T: Element>(
        &mut self,
        send: &'a Buffer<T>,
        recv: &'a mut Buffer<T>,
        root: usize,
    ) -> Result<()> {
        self.collective(&BROADCAST, Some(send), recv, root, ReduceOp::Sum)
    }

    /// Reduce (`ncclReduce`) in the group: the root's buffer gets the `op` of all of them.
    pub fn reduce<T: Element>(&mut self, buf: &'a mut Buffer<T>, root: usize, op: ReduceOp) -> Result<()> {
        self.collective(&REDUCE, None, buf, root, op)
    }

    /// Reduce out of place in the group: the root's `recv` gets the `op` of every `send`.
    pub fn reduce_into<T: Element>(
        &mut self,
        send: &'a Buffer<T>,
        recv: &'a mut Buffer<T>,
        root: usize,
        op: ReduceOp,
    ) -> Result<()> {
        self.collective(&REDUCE, Some(send), recv, root, op)
    }

    /// All-reduce (`ncclAllReduce`) in the group: every buffer gets the `op` of all of them.
    pub fn all_reduce<T: Element>(&mut self, buf: &'a mut Buffer<T>, op: ReduceOp) -> Result<()> {
        self.collective(&ALL_REDUCE, None, buf, 0, op)
    }

    /// All-reduce out of place in the group: every `recv` gets the `op` of every `send`.
    pub fn all_reduce_into<T: Element>(
        &mut self,
        send: &'a Buffer<T>,
        recv: &'a mut Buffer<T>,
        op: ReduceOp,
    ) -> Result<()> {
        self.collective(&ALL_REDUCE, Some(send), recv, 0, op)
    }

    /// All-gather in place in the group ([`Session::all_gather`]).
    pub fn all_gather<T: Element>(&mut self, buf: &'a mut Buffer<T>) -> Result<()> {
        self.collective(&ALL_GATHER, None, buf, 0, ReduceOp::Sum)
    }

    /// All-gather in the group ([`Session::all_gather_into`]).
    pub fn all_gather_into<T: Element>(&mut self, send: &'a Buffer<T>, recv: &'a mut Buffer<T>) -> Result<()> {
        self.collective(&ALL_GATHER, Some(send), recv, 0, ReduceOp::Sum)
    }

    /// Reduce-scatter in place in the group ([`Session::reduce_scatter`]).
    pub fn reduce_scatter<T: Element>(&mut self, buf: &'a mut Buffer<T>, op: ReduceOp) -> Result<()> {
        self.collective(&REDUCE_SCATTER, None, buf, 0, op)
    }

    /// Reduce-scatter in the group ([`Session::reduce_scatter_into`]).
    pub fn reduce_scatter_into<T: Element>(
        &mut self,
        send: &'a Buffer<T>,
        recv: &'a mut Buffer<T>,
        op: ReduceOp,
    ) -> Result<()> {
        self.collective(&REDUCE_SCATTER, Some(send), recv, 0, op)
    }

    /// All-to-all in place in the group ([`Session::all_to_all`]).
    pub fn all_to_all<T: Element>(&mut self, buf: &'a mut Buffer<T>) -> Result<()> {
        self.collective(&ALL_TO_ALL, None, buf, 0, ReduceOp::Sum)
    }

    /// All-to-all in the group ([`Session::all_to_all_into`]).
    pub fn all_to_all_into<T: Element>(&mut self, send: &'a Buffer<T>, recv: &'a mut Buffer<T>) -> Result<()> {
        self.collective(&ALL_TO_ALL, Some(send), recv, 0, ReduceOp::Sum)
    }

    /// Sends the whole buffer to rank `peer` (`ncclSend` in the group), which must receive
    /// as many elements. It progresses together with the group's receives: it never waits
    /// for them, nor they for it.
    pub fn send<T: Element>(&mut self, buf: &'a Buffer<T>, peer: usize) -> Result<()> {
        if self.nccl() {
            self.note("ncclSend");
            return self.s.send(buf, peer);
        }
        self.s.ensure_peer(peer)?;
        self.s.fits_wire(buf.len() * size_of::<T>())?;
        self.p2p.push(P2p::Send {
            data: as_bytes(host(buf)),
            peer,
            elems: buf.len(),
        });
        Ok(())
    }

    /// Receives a whole buffer from rank `peer` (`ncclRecv` in the group).
    pub fn recv<T: Element>(&mut self, buf: &'a mut Buffer<T>, peer: usize) -> Result<()> {
        if self.nccl() {
            self.note("ncclRecv");
            return self.s.recv(buf, peer);
        }
        self.s.ensure_peer(peer)?;
        self.s.fits_wire(buf.len() * size_of::<T>())?;
        let elems = buf.len();
        self.p2p.push(P2p::Recv {
            data: as_bytes_mut(host_mut(buf)),
            peer,
            elems,
        });
        Ok(())
    }

    /// Ends the group (`ncclGroupEnd`): on NCCL, polled until NCCL has queued its calls;
    /// on the CPU backend, runs them (packed, and progressing together) and returns when
    /// they are done. What ran is said once per kind of group.
    pub fn end(mut self) -> Result<()> {
        self.ended = true;
        let who = self.s.who();
        if self.nccl() {
            let said = self.said_nccl();
            self.say_once(said);
            let Communicator::Nccl(n) = &self.s.comm else {
                unreachable!("checked above")
            };
            return n.group_end().with_context(|| who);
        }
        let mut colls = std::mem::take(&mut self.colls);
        let p2p = std::mem::take(&mut self.p2p);
        let world = self.s.comm.world();
        // The collectives that pack together, in the order each kind was first issued
        // (the same on every rank, since every rank issues the same collectives), the
        // small ones of a kind first, then those that run as they are.
        let mut kinds: Vec<usize> = Vec::new();
        let key: Vec<(usize, bool)> = (0..colls.len())
            .map(|i| {
                let kind = match kinds.iter().position(|&k| colls[k].packs_with(&colls[i])) {
                    Some(k) => k,
                    None => {
                        kinds.push(i);
                        kinds.len() - 1
                    }
                };
                (kind, colls[i].alone(world))
            })
            .collect();
        let mut order: Vec<((usize, bool), Coll)> = key.into_iter().zip(colls.drain(..)).collect();
        order.sort_by_key(|(k, _)| *k);
        let mut colls: Vec<Coll> = order.into_iter().map(|(_, c)| c).collect();
        // What ran is said once per shape of group: the words are made only for a new
        // shape, or for --steps and --trace (a training loop's groups cost no formatting).
        let shape = shape_of(&colls, &p2p);
        let new = SAID.lock().unwrap_or_else(|p| p.into_inner()).insert(shape);
        let mut lines: Vec<String> = Vec::new();
        if new || record::on() {
            lines = colls
                .chunk_by(|a, b| a.packs_with(b))
                .map(|kind| describe_kind(kind, world))
                .collect();
            let Communicator::Cpu(cpu) = &self.s.comm else {
                unreachable!("the CPU backend's group")
            };
            lines.extend(p2p_line(&p2p, |peer| cpu.link(peer).eager_limit()));
        }
        if new && !lines.is_empty() {
            self.s.say(&format!("Group: {}", lines.join("; ")));
        }
        let bytes: usize = colls.iter().map(|c| bytes_of(c, world)).sum::<usize>()
            + p2p
                .iter()
                .map(|p| match p {
                    P2p::Send { data, .. } => data.len(),
                    P2p::Recv { data, .. } => data.len(),
                })
                .sum::<usize>();
        let _span = record::on().then(|| record::span(&format!("group: {}", lines.join("; ")), bytes as u64));
        let same = |a: &Coll, b: &Coll| a.packs_with(b) && a.alone(world) == b.alone(world);
        for calls in colls.chunk_by_mut(same) {
            let run = calls[0].run;
            match calls[0].alone(world) {
                true => {
                    for call in calls.iter_mut() {
                        run(self.s, std::slice::from_mut(call), "")?;
                    }
                }
                false => {
                    let title = match record::on() {
                        true => packed_title(calls, world),
                        false => String::new(),
                    };
                    run(self.s, calls, &title)?;
                }
            }
        }
        if !p2p.is_empty() {
            self.exchange(p2p)?;
        }
        Ok(())
    }

    fn nccl(&self) -> bool {
        matches!(self.s.comm, Communicator::Nccl(_))
    }

    /// Counts an NCCL call issued into the group.
    fn note(&mut self, function: &'static str) {
        match self.issued.iter_mut().find(|(f, _)| *f == function) {
            Some((_, n)) => *n += 1,
            None => self.issued.push((function, 1)),
        }
    }

    /// "Group: 292 ncclBroadcast between ncclGroupStart and ncclGroupEnd", for NCCL.
    fn said_nccl(&self) -> String {
        let calls: Vec<String> = self.issued.iter().map(|(f, n)| format!("{n} × {f}")).collect();
        let calls = match calls.is_empty() {
            true => "no call".to_string(),
            false => calls.join(", "),
        };
        format!("Group: {calls} between ncclGroupStart and ncclGroupEnd, launched together by NCCL")
    }

    /// Says `line` (rank 0, text output) unless this process said it already.
    fn say_once(&self, line: String) {
        let mut said = SAID.lock().unwrap_or_else(|p| p.into_inner());
        if said.insert(hash(&line)) {
            self.s.say(&line);
        }
    }

    /// A collective in the group: on NCCL, issued now; on the CPU backend, checked now
    /// (its root and its buffers' sizes) and kept for the end.
    fn collective<T: Element>(
        &mut self,
        coll: &'static Collective,
        send: Option<&'a Buffer<T>>,
        recv: &'a mut Buffer<T>,
        root: usize,
        op: ReduceOp,
    ) -> Result<()> {
        if self.nccl() {
            self.note(coll.nccl_name());
            return self.s.run(coll, send, recv, root, op);
        }
        let world = self.s.comm.world();
        let root = match coll.rooted() {
            true => self.s.ensure_rank(root, "root")?,
            false => 0,
        };
        let count = coll
            .count_of(send.map(|s| s.len()), recv.len(), world)
            .map_err(|why| workbook_runtime::error::usage(format!("{}: {why}", self.s.who())))?;
        self.colls.push(Coll {
            coll,
            send: send.map(|s| s as &dyn Any),
            recv,
            count,
            root,
            op: if coll.reduces() { op } else { ReduceOp::Sum },
            dtype: T::TYPE,
            run: run_pack::<T>,
        });
        Ok(())
    }

    /// The group's sends and receives on the CPU backend, progressing together: the sends
    /// to each peer in order, on a thread of their own unless the link's buffer holds them
    /// all (its eager limit: then first, on this thread); this thread receives, in the
    /// order issued. A send
    /// waits only for its own receiver, and a receive only for its sender's earlier
    /// messages to this rank, which this rank received before: no order can deadlock.
    fn exchange(&mut self, p2p: Vec<P2p<'_>>) -> Result<()> {
        let who = self.s.who();
        let mut to: BTreeMap<usize, Vec<(&[u8], usize)>> = BTreeMap::new();
        let mut from = Vec::new();
        let mut calls = Vec::new();
        for p in p2p {
            match p {
                P2p::Send { data, peer, elems } => {
                    calls.push((Some((self.s.world_rank_of(peer), data.len())), None));
                    to.entry(peer).or_default().push((data, elems));
                }
                P2p::Recv { data, peer, elems } => {
                    calls.push((None, Some((self.s.world_rank_of(peer), data.len()))));
                    from.push((data, peer, elems));
                }
            }
        }
        self.s.ledger.enter_all(calls);
        let Communicator::Cpu(cpu) = &self.s.comm else {
            unreachable!("the CPU backend's group")
        };
        // --steps shows the group's messages on their own (no buffer: each has its own).
        record::watch::<f32>("a group's sends and receives", &[], None, true);
        let done = progress(cpu, &to, &mut from);
        self.s.ledger.leave(done).with_context(|| who)
    }
}

/// What a group's send or receive was doing when it failed, typed so that the rank's
/// explanation knows a group's calls failed ([`Session::explain`]: they progress together,
/// so a peer that moved nothing lacks the matching call).
#[derive(Debug)]
pub(crate) struct InGroup(String);

impl std::fmt::Display for InGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Runs the sends of `to` and the receives of `from` together (see [`Group::exchange`]),
/// noted as one operation (its messages overlap in time: one span on the rank's track,
/// each message on its link's track, an arrow from each send to its receive).
fn progress(
    cpu: &Cpu,
    to: &BTreeMap<usize, Vec<(&[u8], usize)>>,
    from: &mut [(&mut [u8], usize, usize)],
) -> Result<()> {
    let t = record::clock();
    let send_all = |peer: usize, msgs: &[(&[u8], usize)]| -> Result<()> {
        for (data, elems) in msgs {
            cpu.send_tagged(workbook_cpu::SEND_RECV_TAG, data, peer)
                .with_context(|| {
                    InGroup(format!(
                        "sending {elems} elements ({}) to {} in a group",
                        human_bytes(data.len()),
                        cpu.peer_name(peer)
                    ))
                })?;
        }
        Ok(())
    };
    let send_all = &send_all;
    // What the link to a peer holds, its sender need not wait for: sent first, from here.
    let inline = |peer: usize, msgs: &[(&[u8], usize)]| {
        msgs.iter().map(|(d, _)| d.len()).sum::<usize>() <= cpu.link(peer).eager_limit()
    };
    for (peer, msgs) in to.iter().filter(|(p, m)| inline(**p, m)) {
        send_all(*peer, msgs)?;
    }
    thread::scope(|scope| {
        let senders: Vec<_> = to
            .iter()
            .filter(|(p, m)| !inline(**p, m))
            .map(|(peer, msgs)| scope.spawn(move || send_all(*peer, msgs)))
            .collect();
        let mut got = Ok(());
        for (data, peer, elems) in from.iter_mut() {
            let n = data.len();
            got = cpu
                .link(*peer)
                .recv_into(workbook_cpu::SEND_RECV_TAG, data)
                .map_err(|e| cpu.lost(e, *peer))
                .with_context(|| {
                    InGroup(format!(
                        "receiving {elems} elements ({}) from {} in a group",
                        human_bytes(n),
                        cpu.peer_name(*peer)
                    ))
                });
            if got.is_err() {
                break;
            }
        }
        let sent = senders.into_iter().try_for_each(|s| {
            s.join()
                .unwrap_or_else(|_| Err(anyhow!("a sending thread of the group panicked")))
        });
        got.and(sent)
    })?;
    if t.is_some() {
        let sends = to
            .iter()
            .flat_map(|(peer, msgs)| msgs.iter().map(move |(d, _)| (Dir::Send, *peer, *d, How::Copy)));
        let recvs = from.iter().map(|(d, peer, _)| (Dir::Recv, *peer, &**d, How::Copy));
        let parts: Vec<(Dir, usize, &[u8], How)> = sends.chain(recvs).collect();
        record::op(t, "group", &parts);
    }
    Ok(())
}

/// Runs calls that pack together: one as it is; several packed into one buffer, run as
/// one collective named `title`, and unpacked.
fn run_pack<T: Element>(s: &mut Session, calls: &mut [Coll<'_>], title: &str) -> Result<()> {
    let typed = "a group's buffers are of the type its call was made for";
    let (coll, root, op, in_place) = (calls[0].coll, calls[0].root, calls[0].op, calls[0].send.is_none());
    if let [one] = calls {
        let send = one.send.map(|b| b.downcast_ref::<Buffer<T>>().expect(typed));
        let recv = one.recv.downcast_mut::<Buffer<T>>().expect(typed);
        return s.run_checked(coll.title(), coll, send, recv, one.count, root, op);
    }
    let world = s.comm.world();
    let (s1, r1) = (coll.counts)(1, world);
    let total: usize = calls.iter().map(|c| c.count).sum();
    let recv_blocks = if in_place { s1.max(r1) } else { r1 };
    let mut recv = packed_buffer::<T>(s, recv_blocks * total, "a group's packed buffer")?;
    let recvs: Vec<&[T]> = calls
        .iter()
        .map(|c| host(c.recv.downcast_ref::<Buffer<T>>().expect(typed)))
        .collect();
    // The receive buffers too: what a call leaves unwritten (a reduce's, but on its
    // root; an in-place collective's) must come back as it was.
    packed::pack(&recvs, recv_blocks, host_mut(&mut recv));
    let send = match in_place {
        true => None,
        false => {
            let mut send = packed_buffer::<T>(s, s1 * total, "a group's packed send buffer")?;
            let sends: Vec<&[T]> = calls
                .iter()
                .map(|c| host(c.send.and_then(|b| b.downcast_ref::<Buffer<T>>()).expect(typed)))
                .collect();
            packed::pack(&sends, s1, host_mut(&mut send));
            Some(send)
        }
    };
    let ran = s.run_checked(title, coll, send.as_ref(), &mut recv, total, root, op);
    if ran.is_ok() {
        let mut parts: Vec<&mut [T]> = calls
            .iter_mut()
            .map(|c| host_mut(c.recv.downcast_mut::<Buffer<T>>().expect(typed)))
            .collect();
        packed::unpack(host(&recv), recv_blocks, &mut parts);
    }
    keep(recv);
    if let Some(send) = send {
        keep(send);
    }
    ran
}

/// Bytes of a call as nccl-tests sizes it: its larger buffer.
fn bytes_of(c: &Coll, world: usize) -> usize {
    let (s, r) = (c.coll.counts)(c.count, world);
    s.max(r) * c.dtype.size()
}

/// "broadcast (float, root 0)": what the calls of a kind share.
fn kind_name(c: &Coll, world: usize) -> String {
    let mut how = vec![c.dtype.name().to_string()];
    if c.coll.rooted() {
        how.push(format!("root {}", c.root));
    }
    if c.coll.reduces() {
        how.push(c.op.name().to_string());
    }
    if c.send.is_none() && (c.coll.counts)(1, world) != (1, 1) {
        how.push("in place".into());
    }
    format!("({})", how.join(", "))
}

/// What ran of the calls of one kind: "292 broadcasts (float, root 0) packed into one
/// broadcast of 121.1 KiB"; "292 broadcasts (float, root 0): 244 under 64 KiB packed into
/// one of 35.3 KiB, 48 of 64 KiB or more run as they are (18.8 MiB)"; "1 all-reduce
/// (float, sum) of 16 B, run as it is".
fn describe_kind(calls: &[Coll], world: usize) -> String {
    let (c, n) = (&calls[0], calls.len());
    let (title, how) = (c.coll.title(), kind_name(c, world));
    let plural = |n: usize| match n {
        1 => format!("1 {title}"),
        n => format!("{n} {title}s"),
    };
    let (alone, packed): (Vec<&Coll>, Vec<&Coll>) = calls.iter().partition(|c| c.alone(world));
    let size = |cs: &[&Coll]| human_bytes(cs.iter().map(|c| bytes_of(c, world)).sum());
    let limit = human_bytes(PACK_BELOW);
    let all: Vec<&Coll> = calls.iter().collect();
    match (packed.len(), alone.len()) {
        _ if n == 1 => format!("1 {title} {how} of {}, run as it is", size(&all)),
        (p, 0) => format!("{} {how} packed into one {title} of {}", plural(p), size(&packed)),
        (0 | 1, _) => format!(
            "{} {how}, run as they are ({}: packing pays below {limit})",
            plural(n),
            size(&all)
        ),
        (p, a) => format!(
            "{} {how}: {p} under {limit} packed into one of {}, {a} of {limit} or more run as they are ({})",
            plural(n),
            size(&packed),
            size(&alone)
        ),
    }
}

/// The name `--steps` and `--trace` give a packed collective: "244 broadcasts (float,
/// root 0) packed into one".
fn packed_title(calls: &[Coll], world: usize) -> String {
    let c = &calls[0];
    format!(
        "{} {}s {} packed into one",
        calls.len(),
        c.coll.title(),
        kind_name(c, world)
    )
}

/// "3 sends and 3 receives progressed together (the sends to 3 ranks on threads of
/// their own while this one receives)", or nothing without any. `eager(peer)`: what the
/// link to `peer` holds without its receiver.
fn p2p_line(p2p: &[P2p], eager: impl Fn(usize) -> usize) -> Option<String> {
    let sends: Vec<(usize, usize)> = p2p
        .iter()
        .filter_map(|p| match p {
            P2p::Send { data, peer, .. } => Some((*peer, data.len())),
            P2p::Recv { .. } => None,
        })
        .collect();
    let recvs = p2p.len() - sends.len();
    if p2p.is_empty() {
        return None;
    }
    let mut per_peer: BTreeMap<usize, usize> = BTreeMap::new();
    for (peer, bytes) in &sends {
        *per_peer.entry(*peer).or_default() += bytes;
    }
    let threads = per_peer.iter().filter(|(p, b)| **b > eager(**p)).count();
    let plural = |n: usize, one: &str, many: &str| match n {
        1 => format!("1 {one}"),
        n => format!("{n} {many}"),
    };
    let how = match threads {
        0 => "the link's buffers hold the sends: sent first, then received".to_string(),
        t => format!(
            "the sends to {} on threads of their own while this one receives",
            plural(t, "rank", "ranks")
        ),
    };
    Some(format!(
        "{} and {} progressed together ({how})",
        plural(sends.len(), "send", "sends"),
        plural(recvs, "receive", "receives")
    ))
}

impl Drop for Group<'_> {
    /// A group dropped without [`Group::end`]: by an error inside it (the session fails
    /// with that error), or forgotten. On NCCL it is closed (NCCL's group is per thread,
    /// and must not stay open); on the CPU backend its calls never ran. Either way the
    /// run fails at its end, saying so.
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        if let Communicator::Nccl(n) = &self.s.comm {
            let _ = n.group_end();
        }
        let calls = self.colls.len() + self.p2p.len() + self.issued.iter().map(|(_, n)| n).sum::<usize>();
        let who = self.s.who();
        self.s.fail_at_end(format!(
            "{who}: a group of {calls} call(s) was dropped without .end(): end every group with g.end()?"
        ));
    }
}
