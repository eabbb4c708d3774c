//! The recorder: what this rank's collectives and point-to-point calls did, noted once
//! and read by two views: `--steps` (`common::steps`: every step of a small collective,
//! per rank, as text) and `--trace FILE` (`common::trace`: a Chrome trace timeline).
//!
//! Each rank is a process of its own, so the log is one per process. The CPU backend's
//! algorithms note each *operation* (a send, a receive, or both at once: one step of a
//! ring) with its parts: which peer, how many bytes, and where in the rank's buffer the
//! part lies (a slice's place is found from its address against the buffer's). Off, a
//! note costs one branch: [`clock`] returns `None` and every note is skipped.
//!
//! The NCCL backend cannot be seen inside. The session already times each collective
//! (on both backends) and names it with an NVTX range; each NCCL call can be timed too,
//! with [`span`], and named for Nsight with `workbook_nccl::nvtx::range`, as `Nccl::call` may
//! do around the call itself:
//!
//! ```ignore
//! let what = call.what(); // "all-reduce (ncclAllReduce)"
//! let _span = crate::record::span(&what, bytes); // a `call` span on --trace, noted when dropped
//! let _range = workbook_nccl::nvtx::range(&what); // an NVTX range, popped when dropped
//! let r = f(comm, stream);
//! ```
//!
//! Both cost a branch when nothing records and no profiler is there. NCCL's calls are
//! asynchronous: such a span is the launch; the GPU's work shows in the session's
//! `synchronize` wait.

use crate::element::Element;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

/// The name under which the session's point-to-point calls watch their buffer.
pub const P2P: &str = "the point-to-point calls";

/// The name of an operation in which this rank reads another rank's buffer where it lies
/// (the single copy): its receive parts have no send on the other side.
pub const READ: &str = "read";

/// The largest buffer `--steps` shows, in elements.
pub const STEPS_MAX: usize = 64;
/// The most events one rank keeps (a long timed loop under `--trace`); later ones are
/// counted, not kept.
pub const MAX_EVENTS: usize = 20_000;

static ON: AtomicBool = AtomicBool::new(false);
static LOG: Mutex<Option<Log>> = Mutex::new(None);

/// What kind of span an event is.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cat {
    /// A buffer starts being watched: `values` holds its elements before anything moved.
    Watch,
    /// One collective, from the session's call to its return.
    Collective,
    /// One operation of an algorithm: a ring step, or a point-to-point call.
    Op,
    /// Waiting for the other ranks (a barrier).
    Wait,
    /// A call into a library (NCCL), timed from outside.
    Call,
    /// Computation (a layer of lesson 10), on a track of its own beside the rank's
    /// collectives: what the collectives of a stream run behind.
    Compute,
}

/// Which way a part of an operation goes.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    /// Out of this rank, to the peer.
    Send,
    /// Into this rank, from the peer.
    Recv,
}

/// What happens to what a part moves.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum How {
    /// Sent as it is, or received in place of what the buffer held.
    Copy,
    /// Received and reduced into the buffer (added, for a sum).
    Reduce,
    /// Received, reduced with this rank's own elements, and sent on without being kept:
    /// a partial result (or sent: a partial result going on).
    Partial,
}

/// One part of an operation.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Part {
    /// Sent or received.
    pub dir: Dir,
    /// The other rank (the world's rank, for a split communicator's call).
    pub peer: usize,
    /// How many bytes it moved.
    pub bytes: u64,
    /// The elements of the watched buffer it lies over (`None`: elsewhere).
    pub range: Option<(usize, usize)>,
    /// Whether `range` counts in the send buffer (out of place) rather than the buffer.
    #[serde(default)]
    pub in_send: bool,
    /// What became of it: copied, reduced, or passed on as a partial result.
    pub how: How,
    /// The message's number on its link: the k-th message this rank sent to `peer`, or
    /// received from it (counted from 0 over the whole run, noted or not). A send and the
    /// receive with the same sender, receiver and number are one message: `--trace` draws
    /// an arrow between them. `None` for a one-sided read ([`READ`]): nothing was sent.
    #[serde(default)]
    pub seq: Option<u64>,
}

/// One noted event.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Event {
    /// What kind of span it is.
    pub cat: Cat,
    /// "all-reduce", "send_recv_add", "recvReduceSend", "ncclAllReduce", "barrier".
    pub name: String,
    /// When it began: microseconds since this rank's start ([`start`]).
    pub t0: f64,
    /// How long it lasted, in microseconds.
    pub dur: f64,
    /// The phase of the algorithm it belongs to ("reduce-scatter"), if the algorithm said.
    pub phase: Option<String>,
    /// Collectives: how the CPU backend ran it ("ring, step by step").
    pub algorithm: Option<String>,
    /// Bytes of a collective or a call.
    pub bytes: u64,
    /// Operations: what moved, in the order it moved.
    pub parts: Vec<Part>,
    /// `--steps`: the watched buffer's elements afterwards (a `Watch`: before).
    pub values: Option<Vec<f64>>,
    /// A `Watch` of a collective that reduces: how ("sum", "max": [`ReduceOp::name`]).
    ///
    /// [`ReduceOp::name`]: crate::element::ReduceOp::name
    #[serde(default)]
    pub op: Option<String>,
}

/// The buffer operations are placed against.
struct Watched {
    base: usize,
    len: usize,
    send: Option<(usize, usize)>,
    elem: usize,
    /// `--steps`: a copy kept up to date from every noted write.
    shadow: Option<Vec<u8>>,
    decode: fn(&[u8]) -> Vec<f64>,
}

struct Log {
    origin: Instant,
    /// `origin` on the kernel's monotonic clock, in µs, and how far off that may be.
    origin_clock: (f64, f64),
    /// Messages sent to each peer, and received from each, so far: the next [`Part::seq`].
    sent: BTreeMap<usize, u64>,
    got: BTreeMap<usize, u64>,
    steps: bool,
    trace: bool,
    events: Vec<Event>,
    /// Where the events not yet shown by `--steps` begin.
    shown: usize,
    dropped: usize,
    phase: Option<&'static str>,
    algorithm: Option<&'static str>,
    watched: Option<Watched>,
    /// `--steps` met a buffer larger than [`STEPS_MAX`] elements: how large.
    too_big: Option<usize>,
    /// On a split communicator: the world's rank of each of its ranks ([`peers_are`]).
    peers: Option<Vec<usize>>,
}

fn log() -> MutexGuard<'static, Option<Log>> {
    LOG.lock().unwrap_or_else(|p| p.into_inner())
}

/// Starts recording on this rank: `steps` keeps the buffer's values after each
/// operation; `trace` keeps every event, timed runs included. Times count from now.
pub fn start(steps: bool, trace: bool) {
    *log() = (steps || trace).then(|| {
        // The origin read between two readings of the kernel's clock: the same clock (on
        // Linux `Instant` is CLOCK_MONOTONIC), to within half their gap.
        let before = crate::clock::monotonic_ns();
        let origin = Instant::now();
        let after = crate::clock::monotonic_ns();
        let origin_clock = ((before + after) as f64 / 2e3, (after - before) as f64 / 2e3);
        Log {
            origin,
            origin_clock,
            sent: BTreeMap::new(),
            got: BTreeMap::new(),
            steps,
            trace,
            events: vec![],
            shown: 0,
            dropped: 0,
            phase: None,
            algorithm: None,
            watched: None,
            too_big: None,
            peers: None,
        }
    });
    ON.store(steps || trace, Ordering::Relaxed);
}

/// From now on, operations name their peers as the world's ranks `world[peer]` (the
/// ranks of a split communicator), or as they are (`None`): `--steps` and the trace
/// show every rank by its world rank.
pub fn peers_are(world: Option<Vec<usize>>) {
    if let Some(l) = log().as_mut() {
        l.peers = world;
    }
}

/// Whether anything is being recorded. Every hook below is an inlined test of this flag,
/// its work in a function of its own out of line (`watch_now`, `op_now`...): where
/// nothing records, a hook costs a load and a branch, not a call into this crate (which
/// was a quarter of a small collective's cost in the harness).
#[inline]
pub fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Whether `--steps` is still recording (before the timed runs).
#[inline]
pub fn steps_on() -> bool {
    on() && log().as_ref().is_some_and(|l| l.steps)
}

/// Whether `--trace` is recording.
pub fn trace_on() -> bool {
    on() && log().as_ref().is_some_and(|l| l.trace)
}

/// `--steps` is done (the timed runs start): no more values; recording goes on only
/// for `--trace`.
pub fn stop_steps() {
    let mut g = log();
    if let Some(l) = g.as_mut() {
        l.steps = false;
        if let Some(w) = l.watched.as_mut() {
            w.shadow = None;
        }
        if !l.trace {
            *g = None;
            ON.store(false, Ordering::Relaxed);
        }
    }
}

/// The start of something to note, when recording.
#[inline]
pub fn clock() -> Option<Instant> {
    on().then(Instant::now)
}

fn micros(l: &Log, t: Instant) -> f64 {
    t.saturating_duration_since(l.origin).as_secs_f64() * 1e6
}

fn push(l: &mut Log, e: Event) {
    if l.events.len() - l.shown.min(l.events.len()) >= MAX_EVENTS {
        l.dropped += 1;
    } else {
        l.events.push(e);
    }
}

fn event(l: &Log, cat: Cat, name: &str, t: Instant) -> Event {
    Event {
        cat,
        name: name.to_string(),
        t0: micros(l, t),
        dur: t.elapsed().as_secs_f64() * 1e6,
        phase: l.phase.map(str::to_string),
        algorithm: None,
        bytes: 0,
        parts: vec![],
        values: None,
        op: None,
    }
}

fn decode<T: Element>(bytes: &[u8]) -> Vec<f64> {
    bytes
        .chunks_exact(size_of::<T>())
        // SAFETY: `chunk` holds exactly one T's bytes; T is a plain number (any bits are valid).
        .map(|chunk| unsafe { std::ptr::read_unaligned(chunk.as_ptr().cast::<T>()) }.to_f64())
        .collect()
}

fn span_of(s: &[u8]) -> (usize, usize) {
    (s.as_ptr() as usize, s.len())
}

/// The buffer of what follows (a collective's receive buffer, or the buffer of a
/// point-to-point call), and its send buffer if any. A buffer other than the one
/// watched (or `fresh`: a new collective) is noted with its values as they are now.
#[inline]
pub fn watch<T: Element>(name: &str, recv: &[T], send: Option<&[T]>, fresh: bool) {
    if on() {
        watch_now(name, recv, send, fresh);
    }
}

#[inline(never)]
fn watch_now<T: Element>(name: &str, recv: &[T], send: Option<&[T]>, fresh: bool) {
    let mut g = log();
    let Some(l) = g.as_mut() else { return };
    let bytes = crate::element::as_bytes(recv);
    let (base, len) = span_of(bytes);
    let same = l.watched.as_ref().is_some_and(|w| w.base == base && w.len == len);
    let steps = l.steps && recv.len() <= STEPS_MAX;
    if l.steps && recv.len() > STEPS_MAX {
        l.too_big.get_or_insert(recv.len());
    }
    let shadow = steps.then(|| bytes.to_vec());
    if same && !fresh {
        // The same buffer again (the next call of an exercise): take what the program
        // itself did to it in between.
        if let Some(w) = l.watched.as_mut() {
            w.shadow = shadow;
        }
        return;
    }
    l.watched = Some(Watched {
        base,
        len,
        send: send.map(|s| span_of(crate::element::as_bytes(s))),
        elem: size_of::<T>(),
        shadow,
        decode: decode::<T>,
    });
    if !fresh {
        l.phase = None;
        l.algorithm = None;
    }
    let mut e = event(l, Cat::Watch, name, Instant::now());
    e.dur = 0.0;
    e.values = steps.then(|| decode::<T>(bytes));
    push(l, e);
}

/// Says how the collective just watched combines its buffers (`op`: "sum", "max"), for
/// `--steps` to word its steps ("added", "kept the larger").
#[inline]
pub fn combining(op: &'static str) {
    if on() {
        combining_now(op);
    }
}

#[inline(never)]
fn combining_now(op: &'static str) {
    if let Some(l) = log().as_mut()
        && let Some(e) = l.events.last_mut().filter(|e| e.cat == Cat::Watch)
    {
        e.op = Some(op.to_string());
    }
}

/// Names the phase of the algorithm the next operations belong to ("reduce-scatter").
#[inline]
pub fn phase(name: &'static str) {
    if on() {
        phase_now(name);
    }
}

#[inline(never)]
fn phase_now(name: &'static str) {
    if let Some(l) = log().as_mut() {
        l.phase = Some(name);
    }
}

/// Names how the CPU backend runs the current collective ("ring, step by step").
#[inline]
pub fn algorithm(name: &'static str) {
    if on() {
        algorithm_now(name);
    }
}

#[inline(never)]
fn algorithm_now(name: &'static str) {
    if let Some(l) = log().as_mut() {
        l.algorithm = Some(name);
    }
}

/// Where `s` lies in the watched buffers: elements of the receive buffer, or of the
/// send buffer (`true`).
fn place(w: &Watched, s: &[u8]) -> Option<((usize, usize), bool)> {
    let (p, n) = span_of(s);
    let within = |(base, len): (usize, usize)| {
        (p >= base && p + n <= base + len).then(|| ((p - base) / w.elem, (p - base + n) / w.elem))
    };
    match within((w.base, w.len)) {
        Some(r) => Some((r, false)),
        None => w.send.and_then(within).map(|r| (r, true)),
    }
}

/// Notes one operation, begun at `t` (from [`clock`]): its parts, in the order they
/// moved, each a direction, a peer, the slice it moved (or, for a partial result, the
/// slice of the buffer it is the result for) and what became of it. The slices of
/// received parts that land in the buffer are read for `--steps`.
#[inline]
pub fn op(t: Option<Instant>, name: &str, parts: &[(Dir, usize, &[u8], How)]) {
    if let Some(t) = t {
        op_now(t, name, parts);
    }
}

#[inline(never)]
fn op_now(t: Instant, name: &str, parts: &[(Dir, usize, &[u8], How)]) {
    let mut g = log();
    let Some(l) = g.as_mut() else { return };
    let mut e = event(l, Cat::Op, name, t);
    for (dir, peer, slice, how) in parts {
        let peer = &l.peers.as_ref().map_or(*peer, |w| w[*peer]);
        let placed = l.watched.as_ref().and_then(|w| place(w, slice));
        let link = match dir {
            Dir::Send => Some(&mut l.sent),
            Dir::Recv if name != READ => Some(&mut l.got),
            Dir::Recv => None,
        };
        let seq = link.map(|counts| {
            let k = counts.entry(*peer).or_default();
            *k += 1;
            *k - 1
        });
        e.parts.push(Part {
            seq,
            dir: *dir,
            peer: *peer,
            bytes: slice.len() as u64,
            range: placed.map(|(r, _)| r),
            in_send: placed.is_some_and(|(_, s)| s),
            how: *how,
        });
        if *dir == Dir::Recv && *how != How::Partial {
            copy_in(l, slice);
        }
    }
    e.values = values(l);
    push(l, e);
}

/// Notes a change the algorithm made to the buffer by itself (a finished average, the
/// root's own copy): `--steps` shows it with the next operation.
#[inline]
pub fn wrote(slice: &[u8]) {
    if on() {
        wrote_now(slice);
    }
}

#[inline(never)]
fn wrote_now(slice: &[u8]) {
    if let Some(l) = log().as_mut() {
        copy_in(l, slice);
        // Before the first operation: part of where the collective starts from.
        let now = values(l);
        if let Some(e) = l.events.last_mut().filter(|e| e.cat == Cat::Watch && now.is_some()) {
            e.values = now;
        }
    }
}

fn copy_in(l: &mut Log, slice: &[u8]) {
    if let Some(w) = l.watched.as_mut()
        && let Some(shadow) = w.shadow.as_mut()
    {
        let (p, n) = span_of(slice);
        if p >= w.base && p + n <= w.base + w.len {
            shadow[p - w.base..p - w.base + n].copy_from_slice(slice);
        }
    }
}

fn values(l: &Log) -> Option<Vec<f64>> {
    let w = l.watched.as_ref()?;
    w.shadow.as_ref().map(|s| (w.decode)(s))
}

/// A span noted when dropped: a collective, a wait, or a library call. Boxed, so that
/// where nothing records the guard is one word, and dropping it one test.
#[must_use = "the span is noted when this guard is dropped"]
pub struct Span {
    start: Option<Box<(Instant, Cat, String, u64)>>,
}

impl Drop for Span {
    #[inline]
    fn drop(&mut self) {
        if let Some(start) = self.start.take() {
            note_span(*start);
        }
    }
}

#[inline(never)]
fn note_span((t, cat, name, bytes): (Instant, Cat, String, u64)) {
    let mut g = log();
    let Some(l) = g.as_mut() else { return };
    let mut e = event(l, cat, &name, t);
    e.bytes = bytes;
    if cat == Cat::Collective {
        e.phase = None;
        e.algorithm = l.algorithm.map(str::to_string);
    }
    push(l, e);
}

#[inline]
fn open(cat: Cat, name: &str, bytes: u64) -> Span {
    Span {
        start: match on() {
            true => Some(open_now(cat, name, bytes)),
            false => None,
        },
    }
}

#[inline(never)]
fn open_now(cat: Cat, name: &str, bytes: u64) -> Box<(Instant, Cat, String, u64)> {
    Box::new((Instant::now(), cat, name.to_string(), bytes))
}

/// Times a call into a library (NCCL) of `bytes`, as a span named `name` on this rank's
/// track of `--trace`: noted when the guard is dropped. Costs one branch when nothing
/// is recorded.
#[inline]
pub fn span(name: &str, bytes: u64) -> Span {
    open(Cat::Call, name, bytes)
}

/// Times a collective of `bytes` (the session, around each collective).
#[inline]
pub fn collective(name: &str, bytes: u64) -> Span {
    if on() {
        forget_phase();
    }
    open(Cat::Collective, name, bytes)
}

#[inline(never)]
fn forget_phase() {
    if let Some(l) = log().as_mut() {
        l.phase = None;
        l.algorithm = None;
    }
}

/// Times a wait for the other ranks.
#[inline]
pub fn wait(name: &str) -> Span {
    open(Cat::Wait, name, 0)
}

/// Times computation (a layer's forward or backward, lesson 10): `--trace` draws it on a
/// track of its own, beside the collectives.
#[inline]
pub fn compute(name: &str) -> Span {
    open(Cat::Compute, name, 0)
}

/// The events `--steps` has not shown yet (they are kept for `--trace`, else dropped),
/// and the size of a buffer too large to show, if one was met.
pub fn take_steps() -> (Vec<Event>, Option<usize>) {
    let mut g = log();
    let Some(l) = g.as_mut() else { return (vec![], None) };
    let new = l.events[l.shown.min(l.events.len())..].to_vec();
    if l.trace {
        l.shown = l.events.len();
    } else {
        l.events.clear();
        l.shown = 0;
    }
    (new, l.too_big.take())
}

/// Every event kept for `--trace`, how many were not kept, and where the events' times
/// count from: the kernel's monotonic clock at the origin, in µs, and how far off that
/// may be (`common::trace::Clock` aligns the ranks' clocks from it).
pub fn take_all() -> (Vec<Event>, usize, (f64, f64)) {
    let mut g = log();
    match g.as_mut() {
        Some(l) => (
            std::mem::take(&mut l.events),
            std::mem::take(&mut l.dropped),
            l.origin_clock,
        ),
        None => (vec![], 0, (0.0, 0.0)),
    }
}

/// Stops recording and forgets everything (the end of a session).
pub fn stop() {
    ON.store(false, Ordering::Relaxed);
    *log() = None;
}
