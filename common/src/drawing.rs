//! `--draw FILE.svg`: the record `--steps` prints, as the plain data the draw crate
//! pictures ([`workbook_draw::Panel`]): each message matched to its send, in its step.

use crate::steps::{Step, chunking, numbered, pieces, segments};
use std::collections::{BTreeSet, HashMap};
use workbook_draw::{How, Move, Panel, Source};
use workbook_runtime::record::{self, Dir, Event, Part};

/// The panels of one communicator's record (`all[r]`: row r's events; `ranks[r]`: its world
/// rank; `labels[r]`: its name): its first collective, as `--steps` shows first.
/// `caption` is said before what ran ("On the communicator of color 1: ").
pub fn panels(all: &[Vec<Event>], ranks: &[usize], labels: &[String], caption: &str) -> Vec<Panel> {
    let segs: Vec<Vec<_>> = all.iter().map(|e| segments(e)).collect();
    let count = segs.iter().map(Vec::len).min().unwrap_or(0);
    let mut out = vec![];
    let mut shown = BTreeSet::new();
    for k in 0..count {
        let rows: Vec<_> = segs.iter().map(|s| &s[k]).collect();
        // As --steps: a collective run again is shown once; messages with no buffer
        // watched (a group's) have no cells to draw.
        if rows.iter().all(|s| s.ops.is_empty())
            || rows.iter().all(|s| s.start.is_some_and(<[f64]>::is_empty))
            || !shown.insert(rows[0].name)
        {
            continue;
        }
        let ops: Vec<Vec<&Event>> = rows.iter().map(|s| s.ops.clone()).collect();
        let n = numbered(&ops, ranks);
        let (len, bounds) = chunking(&rows, &ops);
        let row_of = |world: usize| ranks.iter().position(|&w| w == world);
        // Every send, by (sender row, receiver row, its number on the link).
        let mut sends: HashMap<(usize, usize, u64), &Part> = HashMap::new();
        for (r, events) in ops.iter().enumerate() {
            for p in events.iter().flat_map(|e| &e.parts).filter(|p| p.dir == Dir::Send) {
                if let (Some(to), Some(seq)) = (row_of(p.peer), p.seq) {
                    sends.insert((r, to, seq), p);
                }
            }
        }
        let mut moves = vec![];
        for (r, events) in ops.iter().enumerate() {
            for (i, e) in events.iter().enumerate() {
                for (j, p) in e.parts.iter().enumerate().filter(|(_, p)| p.dir == Dir::Recv) {
                    let Some(from) = row_of(p.peer) else { continue };
                    let read = e.name == record::READ;
                    let source = match (read, p.seq.and_then(|seq| sends.get(&(from, r, seq)).copied())) {
                        (true, _) => source(p),
                        (false, Some(sent)) => source(sent),
                        (false, None) => continue,
                    };
                    moves.push(Move {
                        step: n.steps[r][i][j],
                        from,
                        to: r,
                        source,
                        into: p.range.filter(|_| !p.in_send),
                        how: match p.how {
                            record::How::Copy => How::Copy,
                            record::How::Reduce => How::Reduce,
                            record::How::Partial => How::Partial,
                        },
                        read,
                    });
                }
            }
        }
        let how = rows[0].algorithm.map(|a| format!(", {a}")).unwrap_or_default();
        let chunks = pieces(bounds.len() - 1);
        out.push(Panel {
            caption: format!(
                "{caption}{} on {} ranks{how}: {len} elements in {chunks}, {} steps",
                rows[0].name,
                rows.len(),
                n.names.len()
            ),
            labels: labels.to_vec(),
            ranks: ranks.to_vec(),
            len,
            bounds,
            steps: n.names.iter().map(short).collect(),
            reducing: rows[0].op.is_some(),
            moves,
        });
        // The first collective only: a lesson's checked one.
        break;
    }
    out
}

/// Where a part's elements lie, as the draw crate names it.
fn source(p: &Part) -> Source {
    match (p.range, p.in_send, p.how) {
        (None, _, _) => Source::Partial,
        (Some((a, b)), true, _) => Source::SendBuffer(a, b),
        (Some((a, b)), false, record::How::Partial) => Source::PartialOf(a, b),
        (Some((a, b)), false, _) => Source::Buffer(a, b),
    }
}

/// A step's name short enough for a column: "reduce-scatter 1/3".
fn short(step: &Step) -> String {
    match &step.phase {
        Some(p) => format!("{p} {}/{}", step.index, step.of),
        None => format!("step {}/{}", step.index, step.of),
    }
}
