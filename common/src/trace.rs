//! `--trace FILE`: the run as a timeline, in the Chrome trace event format (the JSON
//! PyTorch's profiler exports). Open it in <https://ui.perfetto.dev> or
//! `chrome://tracing`: one process per rank. On the rank's own track, each collective,
//! each step of its algorithm inside it (named as `--steps` names it: one helper,
//! [`crate::steps::step_names`]), the waits for the other ranks and, on NCCL, the calls
//! into NCCL. Each send and each receive (a receive reduced into the buffer is a
//! `reduce`) lies on a track of its own link (`rank 0 → rank 1`, `rank 1 ← rank 0`),
//! with its bytes, and an arrow (a flow event) goes from each send to its receive.
//!
//! Every rank notes its own events ([`workbook_runtime::record`]) on its own clock. At the start and
//! at the end each rank measures how its clock stands against the store's (rank 0's), as
//! NCCL's profiler and PyTorch's distributed trace do (Cristian's algorithm,
//! [`Clock::measure`]); rank 0 gathers every rank's events through the store, moves them
//! onto its own clock and writes the one file, with how far off each rank's times may be
//! in its metadata (`otherData.clocks`). Ranks on one machine read one clock: they line
//! up exactly.
//!
//! A trace is bounded, so that it never fails a run and a viewer can open it: each rank
//! keeps its first [`cap`] events (20,000, or its share of 200,000 for the whole job when
//! that is fewer), and sends them to rank 0 in pieces of at most [`PIECE_BYTES`] (the
//! store takes no message over 16 MiB); rank 0 streams the file out entry by entry. What
//! was not kept is counted, per rank, in the file and on the terminal.

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
pub use workbook_runtime::clock::{boot_id, monotonic_ns};
use workbook_runtime::record::{Cat, Dir, Event, How};
use workbook_runtime::rendezvous::Store;

/// Round trips to the store per measurement: the quickest one is kept.
const ROUNDS: usize = 16;

/// The most events one rank keeps: what the recorder keeps ([`workbook_runtime::record::MAX_EVENTS`]).
pub const PER_RANK: usize = workbook_runtime::record::MAX_EVENTS;
/// The most events the whole job keeps: each of `world` ranks keeps its share when that
/// is less than [`PER_RANK`]. Each event is one to a few entries of the file (a step's
/// sends and receives, their arrows): about 600,000 entries, 100 MB, which
/// <https://ui.perfetto.dev> opens.
pub const PER_JOB: usize = 200_000;
/// The largest piece of a rank's events sent to rank 0 in one message of the store (whose
/// limit is 16 MiB): a rank sends as many pieces as it needs.
pub const PIECE_BYTES: usize = 4 << 20;

/// The events each of `world` ranks keeps: [`PER_RANK`], or its share of [`PER_JOB`].
pub fn cap(world: usize) -> usize {
    PER_RANK.min(PER_JOB / world.max(1)).max(1)
}

/// What each rank sends rank 0 at the end.
#[derive(Serialize, Deserialize)]
pub struct RankTrace {
    /// The rank's host name, as its track in the viewer says.
    pub host: String,
    /// What the rank recorded, in time order ([`cap`] at most).
    pub events: Vec<Event>,
    /// Events not kept: past the [`cap`] (the later ones), or one alone larger than a
    /// piece ([`PIECE_BYTES`]).
    pub dropped: usize,
    /// Where `events`' times count from: the rank's monotonic clock, in µs, and how far
    /// off that reading may be.
    pub origin: (f64, f64),
    /// How the rank's clock stood against the store's at the start of the run (when
    /// measured: a rank that shares the store's clock has nothing to measure) and at
    /// the end: in between, the offset is taken to change evenly (clocks of two
    /// machines drift apart, some µs a second).
    pub start: Option<Clock>,
    /// How the rank's clock stood against the store's at the end of the run.
    pub clock: Clock,
    /// How many pieces of events follow ([`pieces`]): the rank's events travel apart
    /// from this, its header.
    #[serde(default)]
    pub pieces: usize,
}

impl RankTrace {
    /// This rank's trace, one of `world`: what it recorded ([`workbook_runtime::record::take_all`]),
    /// its first [`cap`] events kept and the others counted, and its clock, measured now
    /// through `store`.
    pub(crate) fn new(store: &mut Store, rank: usize, world: usize, host: String) -> Result<RankTrace> {
        let (mut events, mut dropped, (origin, origin_error)) = workbook_runtime::record::take_all();
        let keep = cap(world);
        if events.len() > keep {
            dropped += events.len() - keep;
            events.truncate(keep);
        }
        let mut clock = Clock::measure(store, rank).with_context(|| format!("rank {rank}: measuring its clock"))?;
        let start = START.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(why) = start
            .as_ref()
            .and_then(|s| s.failed.clone().or_else(|| drifted(s, &clock)))
        {
            clock.failed.get_or_insert(why);
        }
        Ok(RankTrace {
            host,
            events,
            dropped,
            origin: (origin + skew_ns(rank) as f64 / 1e3, origin_error),
            start: start.filter(|s| !s.shared && !clock.shared),
            clock,
            pieces: 0,
        })
    }

    /// Where a time of this rank's (µs from its start) lies on the store's clock.
    fn on_store_clock(&self, t: f64) -> f64 {
        let at = self.origin.0 + t;
        let offset = match &self.start {
            Some(s) if self.clock.at_us > s.at_us => {
                let f = ((at - s.at_us) / (self.clock.at_us - s.at_us)).clamp(0.0, 1.0);
                s.offset_us + f * (self.clock.offset_us - s.offset_us)
            }
            _ => self.clock.offset_us,
        };
        at + offset
    }

    /// Why this rank's times could not be aligned on the store's clock, if they could not.
    pub fn alignment_failed(&self) -> Option<&str> {
        self.clock.failed.as_deref()
    }

    /// How far off this rank's times on the store's clock may be, in µs.
    fn error_us(&self) -> f64 {
        let start = self.start.as_ref().map_or(0.0, |s| s.error_us);
        self.clock.error_us.max(start) + self.origin.1
    }
}

/// Why the offsets measured at the start and at the end of the run cannot both be right:
/// two clocks drift apart by some µs a second (crystals are good to 50 ppm; 1,000 ppm is
/// allowed), so an offset that moved further (a clock stepped, a store that lies) leaves
/// the rank's times unaligned. `None` when they agree, or both read the store's clock.
fn drifted(start: &Clock, end: &Clock) -> Option<String> {
    if start.shared && end.shared {
        return None;
    }
    let moved = (end.offset_us - start.offset_us).abs();
    let allowed = start.error_us + end.error_us + 1e-3 * (end.at_us - start.at_us).abs() + 1.0;
    (moved > allowed).then(|| {
        format!(
            "its offset moved by {} between the start and the end of the run, more than two clocks drift",
            workbook_runtime::units::human_duration(std::time::Duration::from_secs_f64(moved / 1e6))
        )
    })
}

/// The clock measured at the start of the run ([`start`]), until the end takes it.
static START: std::sync::Mutex<Option<Clock>> = std::sync::Mutex::new(None);

/// `--trace`, at the start of the run: measures this rank's clock against the store's,
/// for the trace to follow two machines' clocks drifting apart during the run.
pub(crate) fn start(store: &mut Store, rank: usize) -> Result<()> {
    let clock = Clock::measure(store, rank).with_context(|| format!("rank {rank}: measuring its clock"))?;
    *START.lock().unwrap_or_else(|p| p.into_inner()) = Some(clock);
    Ok(())
}

/// How a rank's clock stands against the store's (rank 0's).
#[derive(Serialize, Deserialize, Clone, Debug, Default)]
pub struct Clock {
    /// µs to add to a reading of this rank's clock for the store's at the same moment.
    pub offset_us: f64,
    /// How far off `offset_us` may be, in µs: half the quickest round trip (0 on one clock).
    pub error_us: f64,
    /// The quickest round trip to the store, in µs.
    pub rtt_us: f64,
    /// Round trips made.
    pub rounds: usize,
    /// This rank reads the store's own clock (one kernel): nothing to correct.
    pub shared: bool,
    /// When it was measured: this rank's clock in the middle of the quickest round trip, µs.
    pub at_us: f64,
    /// Why the offset cannot be trusted (the rounds disagree beyond their round trips): the
    /// rank's times are then placed by it, but no error bound is claimed for them.
    #[serde(default)]
    pub failed: Option<String>,
}

impl Clock {
    /// Cristian's algorithm: reads the store's clock [`ROUNDS`] times, each between two
    /// readings of this rank's; keeps the quickest round trip (the one that waited
    /// least), and takes the store's reading for the middle of it: offset =
    /// remote − (t0 + t1)/2, off by at most half the round trip. A rank under the
    /// store's kernel (same boot id) reads the very same clock: its offset is 0.
    pub fn measure(store: &mut Store, rank: usize) -> Result<Clock> {
        let skew = skew_ns(rank);
        let local = || monotonic_ns() as i128 + skew as i128;
        let boot = boot_id();
        let mut best: Option<(i128, i128, i128)> = None; // (round trip, offset ×2, t0 + t1), in ns
        let mut rounds = Vec::with_capacity(ROUNDS);
        let mut same_kernel = !boot.is_empty() && skew == 0;
        for _ in 0..ROUNDS {
            let t0 = local();
            let (remote, theirs) = store.clock()?;
            let t1 = local();
            same_kernel &= theirs == boot;
            let (rtt, offset2) = (t1 - t0, 2 * remote as i128 - t0 - t1);
            rounds.push((rtt as f64 / 1e3, offset2 as f64 / 2e3));
            if best.is_none_or(|(r, _, _)| rtt < r) {
                best = Some((rtt, offset2, t0 + t1));
            }
        }
        let (rtt, offset2, mid2) = best.unwrap_or_default();
        let failed = disagreement(&rounds).map(|by| {
            format!(
                "the store's {ROUNDS} readings disagree by {} beyond their round trips",
                workbook_runtime::units::human_duration(std::time::Duration::from_secs_f64(by / 1e6))
            )
        });
        let (rtt_us, offset_us) = (rtt as f64 / 1e3, offset2 as f64 / 2e3);
        // One kernel, one clock; the measurement agreeing is the check (a container
        // with a clock namespace of its own would not).
        let shared = same_kernel && offset_us.abs() <= rtt_us / 2.0 + 1.0 && failed.is_none();
        Ok(Clock {
            failed,
            offset_us: if shared { 0.0 } else { offset_us },
            error_us: if shared { 0.0 } else { rtt_us / 2.0 },
            rtt_us,
            rounds: ROUNDS,
            shared,
            at_us: mid2 as f64 / 2e3,
        })
    }
}

/// How far, in µs, some reading of the store's clock (`rounds`: each round trip and the
/// offset it gave, in µs) lies from the quickest one's beyond what their round trips allow
/// (each offset is off by at most half its round trip, so two may differ by half the sum):
/// `None` when they agree, as one store's honest clock must.
fn disagreement(rounds: &[(f64, f64)]) -> Option<f64> {
    let &(rtt, offset) = rounds.iter().min_by(|a, b| a.0.total_cmp(&b.0))?;
    let worst = rounds
        .iter()
        .map(|&(r, o)| (o - offset).abs() - (r + rtt) / 2.0)
        .fold(f64::NEG_INFINITY, f64::max);
    (worst > 1.0).then_some(worst)
}

/// Test hooks: `NCCL_WORKBOOK_FAULT=clock:RANK:US`: rank RANK's clock reads US µs ahead
/// (behind, if negative) and is not taken for the store's: the trace must measure it;
/// `clock-jump:RANK:US`: it jumps US µs further ahead at each measurement (after the
/// start's), as a clock stepped during the run, or a store that lies, would look.
fn skew_ns(rank: usize) -> i64 {
    static MEASURED: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);
    let us = |name| {
        workbook_runtime::fault::asked(name, Some(rank))
            .and_then(|v| v.first()?.parse::<f64>().ok())
            .map_or(0, |us| (us * 1e3) as i64)
    };
    let jump = us("clock-jump");
    let k = match jump {
        0 => 0,
        _ => MEASURED.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
    };
    us("clock") + jump * k
}

/// `events` as JSON arrays of at most `limit` bytes each, in order, and how many events
/// were left out because one alone is larger than that (an operation with thousands of
/// parts): what a rank sends rank 0, one message of the store each.
pub(crate) fn pieces(events: &[Event], limit: usize) -> Result<(Vec<Vec<u8>>, usize)> {
    let (mut out, mut piece, mut too_big) = (vec![], vec![b'['], 0);
    for e in events {
        let json = serde_json::to_vec(e)?;
        if json.len() + 2 > limit {
            too_big += 1;
            continue;
        }
        if piece.len() + json.len() + 2 > limit {
            piece.push(b']');
            out.push(std::mem::replace(&mut piece, vec![b'[']));
        }
        if piece.len() > 1 {
            piece.push(b',');
        }
        piece.extend_from_slice(&json);
    }
    if piece.len() > 1 {
        piece.push(b']');
        out.push(piece);
    }
    Ok((out, too_big))
}

/// `n` with its thousands grouped: 1,234,567.
pub fn grouped(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// What was not kept, in one line (`None`: everything was): how many events in all, past
/// which cap, and which ranks dropped how many.
pub fn dropped_line(ranks: &[RankTrace]) -> Option<String> {
    let dropped: Vec<(u64, usize)> = (0..ranks.len() as u64).zip(ranks.iter().map(|t| t.dropped)).collect();
    let total: usize = dropped.iter().map(|(_, n)| n).sum();
    if total == 0 {
        return None;
    }
    let who: Vec<u64> = dropped.iter().filter(|(_, n)| *n > 0).map(|(r, _)| *r).collect();
    let (least, most) = dropped
        .iter()
        .filter(|(_, n)| *n > 0)
        .fold((usize::MAX, 0), |(a, b), (_, n)| (a.min(*n), b.max(*n)));
    let each = match (who.len(), least == most) {
        (1, _) => grouped(most),
        (_, true) => format!("{} each", grouped(most)),
        _ => format!("{} to {} each", grouped(least), grouped(most)),
    };
    Some(format!(
        "Trace: past the cap of {} events per rank, {} later events were not kept: {each} on {}; the file \
         counts them per rank (otherData.kept, and each rank's label)",
        grouped(cap(ranks.len())),
        grouped(total),
        workbook_runtime::rank::list(&who),
    ))
}

/// Refuses, before any rank starts, a trace that cannot be written
/// ([`crate::output_file::check`]), in one line, exit 2.
pub fn check_path(path: &Path) -> Result<()> {
    crate::output_file::check(path, "a trace")
        .map_err(|why| workbook_runtime::error::usage(format!("--trace {}: {why}", path.display())))
}

/// The thread of a rank's computation ([`Cat::Compute`]): a track of its own, so that its
/// collectives on a stream (lesson 10) are seen running beside it.
const COMPUTE_TID: usize = 50_000;

/// The thread of a rank's sends to `peer` (`Dir::Send`) or receives from it.
fn link_tid(dir: Dir, peer: usize) -> usize {
    match dir {
        Dir::Send => 100_000 + peer,
        Dir::Recv => 200_000 + peer,
    }
}

/// Where a flow binds to the slice `(ts, dur)` (on rank 0's clock): just inside its
/// start (a send: the message may leave from then on) or its end (a receive: it has
/// arrived).
fn bind((ts, dur): (f64, f64), dir: Dir) -> f64 {
    let inside = dur / 1000.0;
    match dir {
        Dir::Send => ts + inside,
        Dir::Recv => ts + dur - inside,
    }
}

/// What [`chrome`] wrote, for the line that says so.
pub struct Written {
    /// Entries in `traceEvents`, every kind counted.
    pub events: usize,
    /// Sends drawn to their receives.
    pub flows: usize,
    /// How far off, at most, any aligned rank's times may be against rank 0's, in µs.
    pub error_us: f64,
    /// The ranks whose clocks could not be aligned ([`RankTrace::alignment_failed`]).
    pub unaligned: Vec<usize>,
}

/// The Chrome trace of every rank's events (`ranks[r]`), on rank 0's clock, as one
/// document (a test's size; [`write`] streams it out).
pub fn chrome(ranks: &[RankTrace]) -> Value {
    let mut all = vec![];
    let mut rest = entries(ranks, &mut |v| {
        all.push(v);
        Ok(())
    })
    .unwrap_or_else(|_| json!({}));
    rest["traceEvents"] = Value::Array(all);
    rest
}

/// Every entry of the trace of `ranks`, given to `emit` one by one (each rank's in turn,
/// so that only one event's entries are held at a time), then the rest of the document:
/// `displayTimeUnit` and `otherData`.
fn entries(ranks: &[RankTrace], emit: &mut dyn FnMut(Value) -> std::io::Result<()>) -> std::io::Result<Value> {
    let mut out = vec![];
    let names = crate::steps::step_names(&ranks.iter().map(|r| r.events.as_slice()).collect::<Vec<_>>());
    // Each rank's times (from its own start) onto rank 0's, and how far off that may be.
    let zero = ranks.first().map_or(0.0, |t| t.on_store_clock(0.0));
    let onto = |t: &RankTrace, e: &Event| {
        let ts = t.on_store_clock(e.t0) - zero;
        (ts, t.on_store_clock(e.t0 + e.dur) - zero - ts)
    };
    let error = |r: usize| match (r, ranks.first()) {
        (0, _) | (_, None) => 0.0,
        (_, Some(first)) => ranks[r].error_us() + first.error_us(),
    };
    // Receives by (sender, receiver, number): where their flows end.
    let mut receives: BTreeMap<(usize, usize, u64), f64> = BTreeMap::new();
    for (r, rank) in ranks.iter().enumerate() {
        for e in rank.events.iter().filter(|e| e.cat == Cat::Op) {
            for p in e.parts.iter().filter(|p| p.dir == Dir::Recv) {
                if let Some(k) = p.seq {
                    receives.insert((p.peer, r, k), bind(onto(rank, e), Dir::Recv));
                }
            }
        }
    }
    let mut flows = 0usize;
    for (r, rank) in ranks.iter().enumerate() {
        let name = format!("rank {r} ({})", rank.host);
        let m =
            |what: &str, tid: usize, args: Value| json!({"name": what, "ph": "M", "pid": r, "tid": tid, "args": args});
        out.push(m("process_name", r, json!({"name": name})));
        out.push(m("process_sort_index", r, json!({"sort_index": r})));
        let mut label = match (r, rank.clock.shared) {
            (0, _) => "rank 0's clock".to_string(),
            (_, true) => "one clock with rank 0".to_string(),
            _ => match rank.alignment_failed() {
                Some(why) => format!("clock NOT aligned ({why}): its times may be off by any amount"),
                None => format!("clock aligned ±{:.1} µs", error(r)),
            },
        };
        // The viewer colours slices itself (Perfetto ignores `cname`), so the rank's colour
        // in the other pictures is said in words.
        label += &format!("; {} in --draw and --steps", workbook_draw::palette::rank_name(r));
        if rank.dropped > 0 {
            label += &format!(
                "; {} events kept, {} later ones not kept (the cap: {} per rank)",
                grouped(rank.events.len()),
                grouped(rank.dropped),
                grouped(cap(ranks.len()))
            );
        }
        out.push(m("process_labels", r, json!({"labels": label})));
        out.push(m("thread_name", r, json!({"name": name})));
        out.push(m("thread_sort_index", r, json!({"sort_index": 0})));
        if rank.events.iter().any(|e| e.cat == Cat::Compute) {
            out.push(m("thread_name", COMPUTE_TID, json!({"name": "computing"})));
            out.push(m("thread_sort_index", COMPUTE_TID, json!({"sort_index": 1})));
        }
        if rank.dropped > 0 {
            out.push(
                json!({"name": format!("{} later events not kept (past the cap of {} per rank)", grouped(rank.dropped), grouped(cap(ranks.len()))), "ph": "i", "s": "t",
                "pid": r, "tid": r, "ts": rank.on_store_clock(rank.events.last().map_or(0.0, |e| e.t0 + e.dur)) - zero}),
            );
        }
        let mut links = BTreeSet::new();
        let span = |name: String, cat: &str, tid: usize, e: &Event, args: Value| {
            let (ts, dur) = onto(rank, e);
            json!({"name": name, "cat": cat, "ph": "X", "ts": ts, "dur": dur, "pid": r, "tid": tid, "args": args})
        };
        for (i, e) in rank.events.iter().enumerate() {
            match e.cat {
                Cat::Watch => {}
                Cat::Collective => {
                    let mut args = json!({"bytes": e.bytes});
                    if let Some(a) = &e.algorithm {
                        args["algorithm"] = json!(a);
                    }
                    out.push(span(e.name.clone(), "collective", r, e, args));
                }
                Cat::Wait => out.push(span(e.name.clone(), "wait", r, e, json!({}))),
                Cat::Compute => out.push(span(e.name.clone(), "compute", COMPUTE_TID, e, json!({}))),
                Cat::Call => out.push(span(e.name.clone(), "call", r, e, json!({"bytes": e.bytes}))),
                Cat::Op => {
                    // The steps its parts belong to.
                    let steps = &names[r][i];
                    let title = match (steps.is_empty(), &e.phase) {
                        (false, _) => format!("{} ({})", crate::steps::Step::span(steps), e.name),
                        (true, Some(p)) => format!("{p} ({})", e.name),
                        (true, None) => e.name.clone(),
                    };
                    let moved = |d: Dir| e.parts.iter().filter(|p| p.dir == d).map(|p| p.bytes).sum::<u64>();
                    let mut distinct: Vec<String> = steps.iter().map(ToString::to_string).collect();
                    distinct.dedup();
                    let args = json!({"op": e.name, "steps": distinct, "sent": moved(Dir::Send), "received": moved(Dir::Recv)});
                    out.push(span(title, "step", r, e, args));
                    for (k, p) in e.parts.iter().enumerate() {
                        let (name, cat) = match (p.dir, p.how) {
                            (Dir::Send, _) => (format!("send → rank {}", p.peer), "send"),
                            (Dir::Recv, How::Copy) => (format!("recv ← rank {}", p.peer), "recv"),
                            (Dir::Recv, _) => (format!("recv + reduce ← rank {}", p.peer), "reduce"),
                        };
                        let name = match (e.name.as_str(), p.dir) {
                            (workbook_runtime::record::READ, Dir::Recv) => format!("{name} (read where it lies)"),
                            _ => name,
                        };
                        let tid = link_tid(p.dir, p.peer);
                        links.insert((p.dir == Dir::Recv, p.peer));
                        let mut args = json!({"bytes": p.bytes, "peer": p.peer});
                        if let Some((a, b)) = p.range {
                            args["elements"] = json!(format!("{a}..{b}"));
                        }
                        if let Some(s) = steps.get(k) {
                            args["step"] = json!(s.to_string());
                        }
                        if let Some(n) = p.seq {
                            args["message"] = json!(n);
                        }
                        out.push(span(name, cat, tid, e, args));
                        // The arrow: from the start of the send to the end of its receive.
                        if p.dir == Dir::Send
                            && let Some(n) = p.seq
                            && let Some(&end) = receives.get(&(r, p.peer, n))
                        {
                            flows += 1;
                            let (name, id) = (format!("rank {r} → rank {}", p.peer), flows);
                            out.push(json!({"name": name, "cat": "message", "ph": "s", "id": id,
                                "ts": bind(onto(rank, e), Dir::Send), "pid": r, "tid": tid}));
                            out.push(json!({"name": name, "cat": "message", "ph": "f", "bp": "e", "id": id,
                                "ts": end, "pid": p.peer, "tid": link_tid(Dir::Recv, r)}));
                        }
                    }
                }
            }
            for v in out.drain(..) {
                emit(v)?;
            }
        }
        for (recv, peer) in links {
            let (dir, arrow) = if recv { (Dir::Recv, '←') } else { (Dir::Send, '→') };
            let tid = link_tid(dir, peer);
            out.push(m(
                "thread_name",
                tid,
                json!({"name": format!("rank {r} {arrow} rank {peer}")}),
            ));
            out.push(m("thread_sort_index", tid, json!({"sort_index": tid})));
        }
        for v in out.drain(..) {
            emit(v)?;
        }
    }
    // The bound holds for the ranks aligned; the others are named apart.
    let worst = (0..ranks.len())
        .filter(|&r| ranks[r].alignment_failed().is_none())
        .map(error)
        .fold(0.0, f64::max);
    let unaligned: Vec<usize> = (0..ranks.len())
        .filter(|&r| ranks[r].alignment_failed().is_some())
        .collect();
    let clocks: Vec<Value> = ranks
        .iter()
        .enumerate()
        .map(|(r, t)| {
            json!({"rank": r, "host": t.host, "shift_us": t.on_store_clock(0.0) - zero, "error_us": error(r),
                "aligned": t.alignment_failed().is_none(), "failed": t.alignment_failed(),
                "offset_us": t.clock.offset_us,
                "offset_at_start_us": t.start.as_ref().map(|s| s.offset_us),
                "how": match (r, t.clock.shared) {
                    (0, _) => "rank 0: the reference".to_string(),
                    (_, true) => "the same clock as rank 0 (one kernel)".to_string(),
                    _ => {
                        let start = t.start.as_ref().map(|s| format!("{:.1} µs at the start, ", s.rtt_us)).unwrap_or_default();
                        format!(
                            "measured through the store: the quickest of {} round trips took {start}{:.1} µs at the end",
                            t.clock.rounds, t.clock.rtt_us
                        )
                    }
                }})
        })
        .collect();
    let kept: Vec<Value> = ranks
        .iter()
        .enumerate()
        .map(|(r, t)| json!({"rank": r, "events": t.events.len(), "dropped": t.dropped}))
        .collect();
    Ok(json!({
        "displayTimeUnit": "ns",
        "otherData": {
            "clock": format!(
                "every rank's times on rank 0's clock, each rank's within error_us (at most {worst:.1} µs): ranks on \
                 rank 0's machine read its clock; another's offset is measured through the store at the start and \
                 the end of the run (Cristian's algorithm) and taken to change evenly in between"
            ),
            "clock_error_us": worst,
            "unaligned_ranks": unaligned,
            "clocks": clocks,
            "messages": flows,
            "events_per_rank_cap": cap(ranks.len()),
            "cap": format!(
                "each rank keeps its first {} events (collectives, steps of their algorithms, waits, calls): {} \
                 per rank, or its share of {} for the whole job when that is fewer; `kept` counts, per rank, the \
                 events kept and the later ones dropped",
                grouped(cap(ranks.len())),
                grouped(PER_RANK),
                grouped(PER_JOB)
            ),
            "kept": kept,
        },
    }))
}

/// Writes the trace of `ranks` to `path`, entry by entry (the file's size is never held
/// in memory), and says what it wrote. A write that fails (the disk full) removes what it
/// had written of a regular file: no half a trace is left for a viewer to choke on.
pub fn write(path: &Path, ranks: &[RankTrace]) -> std::io::Result<Written> {
    crate::output_file::write_with(path, |file| stream(file, ranks))
}

fn stream(file: &mut std::fs::File, ranks: &[RankTrace]) -> std::io::Result<Written> {
    use std::io::Write;
    let mut file = std::io::BufWriter::with_capacity(1 << 20, file);
    file.write_all(b"{\"traceEvents\":[")?;
    let mut events = 0usize;
    let rest = entries(ranks, &mut |v| {
        if events > 0 {
            file.write_all(b",\n")?;
        }
        events += 1;
        serde_json::to_writer(&mut file, &v).map_err(std::io::Error::other)
    })?;
    file.write_all(b"]")?;
    if let Value::Object(fields) = &rest {
        for (k, v) in fields {
            write!(file, ",{}:", Value::String(k.clone()))?;
            serde_json::to_writer(&mut file, v).map_err(std::io::Error::other)?;
        }
    }
    file.write_all(b"}\n")?;
    file.flush()?;
    Ok(Written {
        events,
        flows: rest["otherData"]["messages"].as_u64().unwrap_or(0) as usize,
        error_us: rest["otherData"]["clock_error_us"].as_f64().unwrap_or(0.0),
        unaligned: serde_json::from_value(rest["otherData"]["unaligned_ranks"].clone()).unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(parts: usize) -> Event {
        Event {
            cat: Cat::Op,
            name: "send_recv".into(),
            t0: 1.0,
            dur: 2.0,
            phase: None,
            algorithm: None,
            bytes: 0,
            parts: (0..parts)
                .map(|p| workbook_runtime::record::Part {
                    dir: Dir::Send,
                    peer: p,
                    bytes: 8,
                    range: None,
                    in_send: false,
                    how: How::Copy,
                    seq: Some(p as u64),
                })
                .collect(),
            values: None,
            op: None,
        }
    }

    #[test]
    fn readings_of_one_clock_agree_within_their_round_trips() {
        // (round trip, offset) in µs: honest readings lie within half their round trips.
        assert_eq!(disagreement(&[(10.0, 100.0), (20.0, 108.0), (12.0, 95.0)]), None);
        // One answer 12,514 s off: not one store's clock.
        let by = disagreement(&[(10.0, 100.0), (20.0, -12_514e6)]).unwrap();
        assert!(by > 12_000e6, "{by}");
        let honest = |offset_us, at_us| Clock {
            offset_us,
            error_us: 5.0,
            rtt_us: 10.0,
            rounds: 8,
            shared: false,
            at_us,
            failed: None,
        };
        // A second's run: 1,000 ppm is 1 ms of drift allowed, 5 s is not.
        assert_eq!(drifted(&honest(0.0, 0.0), &honest(900.0, 1e6)), None);
        assert!(
            drifted(&honest(0.0, 0.0), &honest(5e6, 1e6))
                .unwrap()
                .contains("moved by 5")
        );
    }

    #[test]
    fn pieces_stay_under_the_limit_and_hold_every_event_in_order() {
        let events: Vec<Event> = (0..1000).map(|i| op(1 + i % 5)).collect();
        let (pieces, too_big) = pieces(&events, 4096).unwrap();
        assert_eq!(too_big, 0);
        assert!(pieces.len() > 10, "{}", pieces.len());
        let mut back: Vec<Event> = vec![];
        for p in &pieces {
            assert!(p.len() <= 4096, "{}", p.len());
            back.extend(serde_json::from_slice::<Vec<Event>>(p).unwrap());
        }
        assert_eq!(back.len(), events.len());
        assert!(back.iter().zip(&events).all(|(a, b)| a.parts == b.parts));
        // One event larger than a piece is left out and counted, the others kept.
        let (pieces, too_big) = pieces_of(&[op(1), op(500), op(2)], 4096);
        assert_eq!((pieces, too_big), (2, 1));
        assert_eq!(super::pieces(&[], 4096).unwrap().0.len(), 0);
    }

    fn pieces_of(events: &[Event], limit: usize) -> (usize, usize) {
        let (p, n) = pieces(events, limit).unwrap();
        (
            p.iter()
                .map(|p| serde_json::from_slice::<Vec<Event>>(p).unwrap().len())
                .sum(),
            n,
        )
    }

    #[test]
    fn the_cap_is_per_rank_and_a_share_of_the_jobs() {
        assert_eq!(cap(1), PER_RANK);
        assert_eq!(cap(8), 20_000);
        assert_eq!(cap(16), 12_500);
        assert_eq!(cap(65_536), 3);
        assert_eq!(grouped(0), "0");
        assert_eq!(grouped(999), "999");
        assert_eq!(grouped(1_000), "1,000");
        assert_eq!(grouped(224_264), "224,264");
        assert_eq!(grouped(12_345_678), "12,345,678");
    }
}
