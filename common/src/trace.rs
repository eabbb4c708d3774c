//! `--trace FILE`: the run as a timeline, in the Chrome trace event format (the JSON
//! PyTorch's profiler exports). Open it in <https://ui.perfetto.dev> or
//! `chrome://tracing`: one track per rank; on it each collective, each step of its
//! algorithm inside it, and inside each step its sends and receives (a receive that is
//! reduced into the buffer is a `reduce`), with their bytes and peers; waits for the
//! other ranks; on NCCL, the calls into NCCL.
//!
//! Every rank notes its own events ([`crate::record`]), timed from the end of the
//! rendezvous, which every rank leaves at the same moment (to within a round trip to the
//! store): that is the common start of the tracks. At the end, rank 0 gathers every
//! rank's events through the store and writes the one file.

use crate::record::{Cat, Dir, Event, How};
use anyhow::Result;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::Path;

/// What each rank sends rank 0 at the end.
#[derive(Serialize, Deserialize)]
pub struct RankTrace {
    pub host: String,
    pub events: Vec<Event>,
    /// Events not kept (past [`crate::record::MAX_EVENTS`]).
    pub dropped: usize,
}

/// Refuses, before any rank starts, a FILE that cannot be written: its folder missing,
/// or a folder itself.
pub fn check_path(path: &Path) -> Result<()> {
    let shown = path.display();
    if path.is_dir() {
        return Err(crate::error::usage(format!(
            "--trace {shown}: that is a folder; give a file name"
        )));
    }
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !parent.is_dir() {
        return Err(crate::error::usage(format!(
            "--trace {shown}: the folder {} does not exist",
            parent.display()
        )));
    }
    Ok(())
}

/// The Chrome trace of every rank's events (`ranks[r]`).
pub fn chrome(ranks: &[RankTrace]) -> Value {
    let mut out = vec![];
    for (r, rank) in ranks.iter().enumerate() {
        let name = format!("rank {r} ({})", rank.host);
        out.push(json!({"name": "process_name", "ph": "M", "pid": r, "tid": r, "args": {"name": name}}));
        out.push(json!({"name": "process_sort_index", "ph": "M", "pid": r, "tid": r, "args": {"sort_index": r}}));
        out.push(json!({"name": "thread_name", "ph": "M", "pid": r, "tid": r, "args": {"name": name}}));
        if rank.dropped > 0 {
            out.push(
                json!({"name": format!("{} more events not kept", rank.dropped), "ph": "i", "s": "t",
                "pid": r, "tid": r, "ts": rank.events.last().map_or(0.0, |e| e.t0 + e.dur)}),
            );
        }
        // Steps are numbered per phase, from each collective's start.
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        let span = |name: String, cat: &str, e: &Event, args: Value| json!({"name": name, "cat": cat, "ph": "X", "ts": e.t0, "dur": e.dur, "pid": r, "tid": r, "args": args});
        for e in &rank.events {
            match e.cat {
                Cat::Watch => counts.clear(),
                Cat::Collective => {
                    let mut args = json!({"bytes": e.bytes});
                    if let Some(a) = &e.algorithm {
                        args["algorithm"] = json!(a);
                    }
                    out.push(span(e.name.clone(), "collective", e, args));
                }
                Cat::Wait => out.push(span(e.name.clone(), "wait", e, json!({}))),
                Cat::Call => out.push(span(e.name.clone(), "call", e, json!({"bytes": e.bytes}))),
                Cat::Op => {
                    let title = match &e.phase {
                        Some(p) => {
                            let k = counts.entry(p.clone()).or_default();
                            *k += 1;
                            format!("{p} step {k} ({})", e.name)
                        }
                        None => e.name.clone(),
                    };
                    let moved = |d: Dir| e.parts.iter().filter(|p| p.dir == d).map(|p| p.bytes).sum::<u64>();
                    let args = json!({"op": e.name, "sent": moved(Dir::Send), "received": moved(Dir::Recv)});
                    out.push(span(title, "step", e, args));
                    for p in &e.parts {
                        let (name, cat) = match (p.dir, p.how) {
                            (Dir::Send, _) => (format!("send → rank {}", p.peer), "send"),
                            (Dir::Recv, How::Copy) => (format!("recv ← rank {}", p.peer), "recv"),
                            (Dir::Recv, _) => (format!("recv + reduce ← rank {}", p.peer), "reduce"),
                        };
                        let mut args = json!({"bytes": p.bytes, "peer": p.peer});
                        if let Some((a, b)) = p.range {
                            args["elements"] = json!(format!("{a}..{b}"));
                        }
                        out.push(span(name, cat, e, args));
                    }
                }
            }
        }
    }
    json!({"traceEvents": out, "displayTimeUnit": "ns"})
}

/// Writes the trace of `ranks` to `path`.
pub fn write(path: &Path, ranks: &[RankTrace]) -> std::io::Result<()> {
    let text = serde_json::to_string(&chrome(ranks)).map_err(std::io::Error::other)?;
    std::fs::write(path, text)
}
