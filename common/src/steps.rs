//! `--steps`: every step of a small collective, rank by rank, as text, from what each
//! rank's recorder ([`workbook_runtime::record`]) noted.
//!
//! A *step* is one message on every link at once: at step t a rank sends its t-th
//! message and receives its left neighbour's t-th. Each rank notes its operations in
//! order; here they are numbered into steps across ranks: a receive belongs to the step
//! of the send it matches (the k-th message from a to b), and a send that follows a
//! receive opens the next step. The ring's steps come out as the lesson draws them, and
//! so do a student's own point-to-point calls.

use colored::Colorize;
use std::collections::{BTreeMap, BTreeSet};
use workbook_runtime::record::{Cat, Dir, Event, How, Part};

/// One rank's operations within one collective (or one batch of point-to-point calls).
pub(crate) struct Segment<'a> {
    pub(crate) name: &'a str,
    pub(crate) algorithm: Option<&'a str>,
    pub(crate) op: Option<&'a str>,
    pub(crate) start: Option<&'a [f64]>,
    pub(crate) ops: Vec<&'a Event>,
    /// Where each of `ops` lies in the rank's events.
    at: Vec<usize>,
}

/// Cuts a rank's events where a buffer starts being watched.
pub(crate) fn segments(events: &[Event]) -> Vec<Segment<'_>> {
    let mut out: Vec<Segment> = vec![];
    for (i, e) in events.iter().enumerate() {
        match e.cat {
            Cat::Watch => out.push(Segment {
                name: &e.name,
                algorithm: None,
                op: e.op.as_deref(),
                start: e.values.as_deref(),
                ops: vec![],
                at: vec![],
            }),
            Cat::Op => {
                if let Some(s) = out.last_mut() {
                    s.ops.push(e);
                    s.at.push(i);
                }
            }
            Cat::Collective => {
                if let Some(s) = out.last_mut() {
                    s.algorithm = e.algorithm.as_deref();
                }
            }
            _ => {}
        }
    }
    out
}

/// The step of every part of every rank's operations: `steps[r][op][part]`. `ranks[r]`
/// is the world rank of row r: parts name their peers by world rank (a split
/// communicator's too), and a receive is matched with its send through them.
fn number(ops: &[Vec<&Event>], ranks: &[usize]) -> Vec<Vec<Vec<usize>>> {
    let world = ops.len();
    // The row of a peer named by its world rank (none: a peer outside these rows).
    let row = |peer: usize| ranks.iter().position(|&w| w == peer).unwrap_or(usize::MAX);
    let mut steps: Vec<Vec<Vec<usize>>> = ops
        .iter()
        .map(|o| o.iter().map(|e| vec![0; e.parts.len()]).collect())
        .collect();
    // Every rank's parts in order: (op, part).
    let flat: Vec<Vec<(usize, usize)>> = ops
        .iter()
        .map(|o| {
            o.iter()
                .enumerate()
                .flat_map(|(i, e)| (0..e.parts.len()).map(move |p| (i, p)))
                .collect()
        })
        .collect();
    let mut next = vec![0usize; world];
    let mut cursor = vec![(0usize, false); world]; // (step, received in it)
    let mut sent: BTreeMap<(usize, usize), Vec<usize>> = BTreeMap::new();
    let mut got: BTreeMap<(usize, usize), usize> = BTreeMap::new();
    loop {
        let mut moved = false;
        for r in 0..world {
            while let Some(&(i, p)) = flat[r].get(next[r]) {
                let part: &Part = &ops[r][i].parts[p];
                let (step, received) = &mut cursor[r];
                match part.dir {
                    Dir::Send => {
                        if *received || *step == 0 {
                            *step += 1;
                            *received = false;
                        }
                        sent.entry((r, row(part.peer))).or_default().push(*step);
                    }
                    Dir::Recv => {
                        let k = got.entry((row(part.peer), r)).or_default();
                        let Some(&theirs) = sent.get(&(row(part.peer), r)).and_then(|s| s.get(*k)) else {
                            break; // its send is not numbered yet
                        };
                        *k += 1;
                        *step = (*step).max(1).max(theirs);
                        *received = true;
                    }
                }
                steps[r][i][p] = *step;
                next[r] += 1;
                moved = true;
            }
        }
        if !moved {
            break;
        }
    }
    // Receives no send matches (not expected: every one of them ran): after the rest.
    for r in 0..world {
        while let Some(&(i, p)) = flat[r].get(next[r]) {
            cursor[r].0 += 1;
            steps[r][i][p] = cursor[r].0;
            next[r] += 1;
        }
    }
    steps
}

/// A step's name: its phase and its place in it, "reduce-scatter step 1 of 2" (or
/// "step 3 of 4", of the whole collective, where the algorithm named no phase).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// The algorithm's phase ("reduce-scatter"), or `None` where it named none.
    pub phase: Option<String>,
    /// Its place in the phase, from 1.
    pub index: usize,
    /// How many steps the phase has.
    pub of: usize,
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match &self.phase {
            Some(p) => write!(f, "{p} step {} of {}", self.index, self.of),
            None => write!(f, "step {} of {}", self.index, self.of),
        }
    }
}

impl Step {
    /// The steps an operation spans (`steps`: its parts', in order) in one name:
    /// "reduce-scatter steps 1–2 of 2", "reduce-scatter step 2 of 2 + all-gather step 1 of 2".
    pub fn span(steps: &[Step]) -> String {
        let mut runs: Vec<(&Step, &Step)> = vec![];
        for s in steps {
            match runs.last_mut() {
                Some((first, last)) if first.phase == s.phase && first.of == s.of => {
                    *first = if s.index < first.index { s } else { first };
                    *last = if s.index > last.index { s } else { last };
                }
                _ => runs.push((s, s)),
            }
        }
        let said: Vec<String> = runs
            .iter()
            .map(|(a, b)| match a.index == b.index {
                true => a.to_string(),
                false => {
                    let phase = a.phase.as_ref().map(|p| format!("{p} ")).unwrap_or_default();
                    format!("{phase}steps {}–{} of {}", a.index, b.index, a.of)
                }
            })
            .collect();
        said.join(" + ")
    }
}

/// The steps of one collective on every rank: the step of every part of every rank's
/// operations (`steps[r][op][part]`, from 1), and each step's name (step `s`'s at `[s - 1]`).
pub(crate) struct Numbered {
    pub(crate) steps: Vec<Vec<Vec<usize>>>,
    pub(crate) names: Vec<Step>,
}

/// Numbers and names the steps of one collective (`ops[r]`: rank r's operations in it):
/// the one naming that `--steps` prints and `--trace` writes; `ranks[r]`: row r's world rank.
pub(crate) fn numbered(ops: &[Vec<&Event>], ranks: &[usize]) -> Numbered {
    let world = ops.len();
    let steps = number(ops, ranks);
    let last = steps.iter().flatten().flatten().copied().max().unwrap_or(0);
    // Each step's phase: that of the operations receiving in it (or sending, if none does).
    let phase_of = |step: usize| -> Option<String> {
        let mut sending = None;
        for r in 0..world {
            for (i, e) in ops[r].iter().enumerate() {
                for (p, part) in e.parts.iter().enumerate() {
                    if steps[r][i][p] == step {
                        match part.dir {
                            Dir::Recv => return e.phase.clone(),
                            Dir::Send => sending = sending.or(Some(e.phase.clone())),
                        }
                    }
                }
            }
        }
        sending.flatten()
    };
    let of: Vec<Option<String>> = (1..=last).map(phase_of).collect();
    let mut names = vec![];
    for step in 1..=last {
        let phase = &of[step - 1];
        let same: Vec<usize> = (1..=last).filter(|s| of[s - 1] == *phase).collect();
        let i = same.iter().position(|s| *s == step).unwrap_or(0) + 1;
        names.push(match phase {
            Some(_) => Step {
                phase: phase.clone(),
                index: i,
                of: same.len(),
            },
            None => Step {
                phase: None,
                index: step,
                of: last,
            },
        });
    }
    Numbered { steps, names }
}

/// The name of the step of every part of every rank's operations, as `--steps` heads it
/// (`names[r][i][p]`: part p of rank r's event i; no names for events that are not
/// operations, or that lie past what every rank kept): `--trace` names its slices so.
pub fn step_names(all: &[&[Event]]) -> Vec<Vec<Vec<Step>>> {
    let mut out: Vec<Vec<Vec<Step>>> = all.iter().map(|e| vec![vec![]; e.len()]).collect();
    let segs: Vec<Vec<Segment>> = all.iter().map(|e| segments(e)).collect();
    let count = segs.iter().map(Vec::len).min().unwrap_or(0);
    for k in 0..count {
        let ops: Vec<Vec<&Event>> = segs.iter().map(|s| s[k].ops.clone()).collect();
        // Every rank of the world, in order: row r is world rank r.
        let n = numbered(&ops, &(0..all.len()).collect::<Vec<_>>());
        for (r, seg) in segs.iter().enumerate() {
            for (i, at) in seg[k].at.iter().enumerate() {
                out[r][*at] = n.steps[r][i].iter().map(|s| n.names[s - 1].clone()).collect();
            }
        }
    }
    out
}

/// What happens in a phase of the ring on `world` ranks, said under its first step.
fn explain(phase: &str, world: usize, how: &Combine) -> Option<String> {
    let steps = world.saturating_sub(1);
    let Combine { word, verb, .. } = how;
    let after = match steps {
        1 => "one step".to_string(),
        n => format!("{n} steps"),
    };
    match phase {
        "reduce-scatter" => Some(format!(
            "each rank sends a chunk to its right neighbour and {verb} the chunk arriving from its left; after \
             {after} (n - 1 on n ranks) each rank holds the full {word} of one chunk"
        )),
        "all-gather" => Some(
            "each rank passes a finished chunk to its right; what arrives from the left replaces its own, until \
             every rank holds every chunk"
                .into(),
        ),
        _ => None,
    }
}

/// A line naming the chunks above a row drawn by [`row`]: `chunk 0` centred over each,
/// or its number alone where the name does not fit.
fn chunk_names(chunks: &Chunks, width: usize) -> String {
    let mut out = String::from(" ");
    for (k, w) in chunks.bounds.windows(2).enumerate() {
        let seg = (w[1] - w[0]) * (width + 2) + 1;
        let name = [format!("chunk {k}"), k.to_string()]
            .into_iter()
            .find(|n| n.len() <= seg)
            .unwrap_or_default();
        out.push_str(&format!("{name:^seg$} "));
    }
    out.trim_end().to_string()
}

/// How a collective combines what comes in with a rank's own elements, in words: a sum
/// unless the recorder said otherwise (`--op max`).
struct Combine {
    /// The mark after a receive that combined: `(+)`.
    mark: &'static str,
    /// "sum": a partial sum, the full sum.
    word: &'static str,
    /// "adds its own part to": what a rank does to the chunk arriving.
    verb: &'static str,
    /// "added to this rank's own": the legend of the mark.
    legend: &'static str,
}

impl Combine {
    fn of(op: Option<&str>) -> Combine {
        let (mark, word, verb, legend) = match op {
            Some("prod") => (
                "(×)",
                "product",
                "multiplies its own part into",
                "multiplied by this rank's own",
            ),
            Some("max") => (
                "(max)",
                "maximum",
                "keeps the larger of its own part and",
                "compared with this rank's own, the larger of each pair kept",
            ),
            Some("min") => (
                "(min)",
                "minimum",
                "keeps the smaller of its own part and",
                "compared with this rank's own, the smaller of each pair kept",
            ),
            Some("avg") => (
                "(+)",
                "sum",
                "adds its own part to",
                "added to this rank's own (avg: the full sum is divided by n at the end)",
            ),
            _ => ("(+)", "sum", "adds its own part to", "added to this rank's own"),
        };
        Combine {
            mark,
            word,
            verb,
            legend,
        }
    }
}

/// Names element ranges: "chunk 2" when the range is one of the chunks that every
/// range seen cuts the buffer into, "the buffer" when there is only one.
struct Chunks {
    bounds: Vec<usize>,
}

impl Chunks {
    fn name(&self, part: &Part, how: &Combine) -> String {
        let Some((a, b)) = part.range else {
            return format!("a partial {}", how.word);
        };
        if part.in_send {
            return match b - a {
                0 => "an empty block of its send buffer".into(),
                n if a % n == 0 => format!("block {} of its send buffer", a / n),
                _ => format!("elements {a}..{b} of its send buffer"),
            };
        }
        if a == b {
            return "an empty chunk".into();
        }
        let i = self.bounds.iter().position(|x| *x == a);
        match i {
            Some(i) if self.bounds.get(i + 1) == Some(&b) && self.bounds.len() == 2 => "the buffer".into(),
            Some(i) if self.bounds.get(i + 1) == Some(&b) => format!("chunk {i}"),
            _ => format!("elements {a}..{b}"),
        }
    }
}

/// What a rank did in one step, in words.
fn said(parts: &[&Part], chunks: &Chunks, how: &Combine) -> String {
    let Combine { mark, word, .. } = how;
    let words: Vec<String> = parts
        .iter()
        .map(|p| {
            let what = chunks.name(p, how);
            match (p.dir, p.how) {
                (Dir::Send, _) if p.range.is_none() => format!("sent its partial {word} → rank {}", p.peer),
                (Dir::Send, How::Partial) => format!("sent that partial {word} of {what} → rank {}", p.peer),
                (Dir::Send, _) => format!("sent {what} → rank {}", p.peer),
                (Dir::Recv, How::Copy) => format!("got {what} from rank {}", p.peer),
                (Dir::Recv, How::Reduce) => format!("got {what} from rank {} {mark}", p.peer),
                (Dir::Recv, How::Partial) => {
                    format!(
                        "got {what} from rank {} {mark}, a partial {word} sent on next step, not kept",
                        p.peer
                    )
                }
            }
        })
        .collect();
    match words.is_empty() {
        true => "-".into(),
        false => words.join(", "),
    }
}

/// A rank's buffer as one line: chunk boundaries as `|`, changed cells in colour (on a
/// terminal) or in brackets.
fn row(values: &[f64], before: Option<&[f64]>, chunks: &Chunks, width: usize) -> String {
    let colour = colored::control::SHOULD_COLORIZE.should_colorize();
    let mut out = String::from("|");
    for (i, v) in values.iter().enumerate() {
        if i > 0 && chunks.bounds.contains(&i) {
            out.push_str(" |");
        }
        let text = format!("{:>width$}", crate::table::number(*v));
        let changed = before.is_some_and(|b| b.get(i).is_some_and(|w| w.to_bits() != v.to_bits()));
        out.push_str(&match (changed, colour) {
            (true, true) => format!(" {} ", text.green().bold()),
            (true, false) => format!("{:>w$}", format!("[{}]", crate::table::number(*v)), w = width + 2),
            (false, _) => format!(" {text} "),
        });
    }
    out.push_str(" |");
    out
}

/// The steps of every segment, from every rank's events (`all[r]`), as lines for rank
/// 0 to print; `ranks[r]` is row r's world rank (a split communicator's rows are some of
/// the world's), `labels[r]` names its row ("CPU 0"). Empty when nothing moved.
pub fn render(all: &[Vec<Event>], ranks: &[usize], labels: &[String]) -> Vec<String> {
    let segs: Vec<Vec<Segment>> = all.iter().map(|e| segments(e)).collect();
    let count = segs.iter().map(Vec::len).min().unwrap_or(0);
    let mut out = vec![];
    let mut shown = BTreeSet::new();
    for k in 0..count {
        let rows: Vec<&Segment> = segs.iter().map(|s| &s[k]).collect();
        // A collective run again (a warm-up, a benchmark's runs) is shown once.
        if rows.iter().all(|s| s.ops.is_empty()) || !shown.insert(rows[0].name) {
            continue;
        }
        // Messages watched against no buffer (a group's sends and receives): the messages.
        match rows.iter().all(|s| s.start.is_some_and(<[f64]>::is_empty)) {
            true => out.extend(render_messages(&rows, ranks, labels)),
            false => out.extend(render_segment(&rows, ranks, labels)),
        }
    }
    out
}

/// A segment of messages with no buffer watched (a group's sends and receives, each of a
/// buffer of its own): what each rank sent and got, in the order it happened.
fn render_messages(ranks: &[&Segment], world_ranks: &[usize], labels: &[String]) -> Vec<String> {
    let width = labels.iter().map(|l| l.chars().count()).max().unwrap_or(0);
    let mut out = vec![format!(
        "Messages of {} on {} ranks (each from or into a buffer of its own, not shown):",
        ranks[0].name,
        ranks.len()
    )];
    for (row, s) in ranks.iter().enumerate() {
        let words: Vec<String> = s
            .ops
            .iter()
            .flat_map(|e| &e.parts)
            .map(|p| {
                let size = workbook_runtime::units::human_bytes(p.bytes as usize);
                match p.dir {
                    Dir::Send => format!("sent {size} → rank {}", p.peer),
                    Dir::Recv => format!("got {size} from rank {}", p.peer),
                }
            })
            .collect();
        let said = match words.is_empty() {
            true => "-".to_string(),
            false => words.join(", "),
        };
        out.push(format!(
            "    {}  {said}",
            name_of(&labels[row], world_ranks[row], width)
        ));
    }
    out
}

/// A row's name, right-aligned to `width`, in its rank's colour on a terminal (the colour
/// `--draw` gives that rank's lane).
fn name_of(label: &str, world_rank: usize, width: usize) -> String {
    painted(
        label,
        world_rank,
        width,
        colored::control::SHOULD_COLORIZE.should_colorize(),
    )
}

/// `label` padded to `width`, then (when `colour`) bold in world rank `world_rank`'s
/// colour as a 24-bit escape (written here: `colored` would ask the terminal again).
fn painted(label: &str, world_rank: usize, width: usize, colour: bool) -> String {
    let text = format!("{label:>width$}");
    match colour {
        true => {
            let (r, g, b) = workbook_draw::palette::rank(world_rank);
            format!("\x1b[1;38;2;{r};{g};{b}m{text}\x1b[0m")
        }
        false => text,
    }
}

/// How many chunks a buffer is cut into, in words: "one piece", "3 chunks".
pub(crate) fn pieces(n: usize) -> String {
    match n {
        1 => "one piece".to_string(),
        n => format!("{n} chunks"),
    }
}

/// The buffer's length, and the chunks every range seen cuts it into (their bounds).
pub(crate) fn chunking(ranks: &[&Segment], ops: &[Vec<&Event>]) -> (usize, Vec<usize>) {
    let len = ranks
        .iter()
        .filter_map(|s| s.start.map(<[f64]>::len))
        .max()
        .unwrap_or(0);
    let mut bounds: BTreeSet<usize> = [0, len].into();
    for e in ops.iter().flatten() {
        for p in e.parts.iter().filter(|p| !p.in_send) {
            if let Some((a, b)) = p.range {
                bounds.extend([a.min(len), b.min(len)]);
            }
        }
    }
    (len, bounds.into_iter().collect())
}

fn render_segment(ranks: &[&Segment], world_ranks: &[usize], labels: &[String]) -> Vec<String> {
    let world = ranks.len();
    let ops: Vec<Vec<&Event>> = ranks.iter().map(|s| s.ops.clone()).collect();
    let Numbered { steps, names } = numbered(&ops, world_ranks);
    let combine = Combine::of(ranks[0].op);
    let last = names.len();
    let (len, bounds) = chunking(ranks, &ops);
    let chunks = Chunks { bounds };
    // Each rank's buffer after each step: after the last operation with a part in it.
    let start: Vec<Option<Vec<f64>>> = ranks.iter().map(|s| s.start.map(<[f64]>::to_vec)).collect();
    let after = |r: usize, step: usize| -> Option<Vec<f64>> {
        ops[r]
            .iter()
            .enumerate()
            .filter(|(i, _)| steps[r][*i].iter().min().is_some_and(|s| *s <= step))
            .filter_map(|(_, e)| e.values.clone())
            .next_back()
            .or_else(|| start[r].clone())
    };
    let width = ranks
        .iter()
        .filter_map(|s| s.start)
        .chain(ops.iter().flatten().filter_map(|e| e.values.as_deref()))
        .flatten()
        .map(|v| crate::table::number(*v).len())
        .max()
        .unwrap_or(1);
    let label_width = labels.iter().map(|l| l.chars().count()).max().unwrap_or(0);
    let name = ranks[0].name;
    let how = match (ranks[0].algorithm, name) {
        (Some(a), _) => format!(", {a}"),
        (None, workbook_runtime::record::P2P) => ", as this program called them".into(),
        (None, _) => String::new(),
    };
    let pieces = pieces(chunks.bounds.len() - 1);
    let elements = if len == 1 { "element" } else { "elements" };
    let colour = colored::control::SHOULD_COLORIZE.should_colorize();
    let mut legend = vec![match colour {
        true => format!("{} changed in that step", "green".green().bold()),
        false => "[x] changed in that step".to_string(),
    }];
    if chunks.bounds.len() > 2 {
        legend.insert(0, "| separates the chunks".into());
    }
    if ops.iter().flatten().flat_map(|e| &e.parts).any(|p| p.how != How::Copy) {
        legend.push(format!(
            "{} the chunk that came in was {}",
            combine.mark, combine.legend
        ));
    }
    let mut out = vec![
        format!("Steps of {name} on {world} ranks{how}: {len} {elements} in {pieces}."),
        format!("  ({})", legend.join("; ")),
    ];
    if ops
        .iter()
        .flatten()
        .flat_map(|e| &e.parts)
        .any(|p| p.how == How::Partial)
    {
        out.push(format!(
            "  (pipelined: a partial {} travels on in the next message and is never written to the buffer; a \
             rank's buffer changes only when a chunk is finished)",
            combine.word
        ));
    }
    let row_of = |values: Option<&Vec<f64>>, before: Option<&Vec<f64>>| match values {
        Some(v) => row(v, before.map(Vec::as_slice), &chunks, width),
        None => String::from("(values not recorded)"),
    };
    out.push("  start".into());
    if chunks.bounds.len() > 2 {
        out.push(format!("    {:>label_width$} {}", "", chunk_names(&chunks, width)));
    }
    for r in 0..world {
        out.push(format!(
            "    {} {}",
            name_of(&labels[r], world_ranks[r], label_width),
            row_of(start[r].as_ref(), None)
        ));
    }
    for step in 1..=last {
        let name = &names[step - 1];
        out.push(format!("  {name}"));
        if name.index == 1
            && let Some(what) = name.phase.as_deref().and_then(|p| explain(p, world, &combine))
        {
            out.push(format!("  ({what})"));
        }
        for r in 0..world {
            let mut parts: Vec<&Part> = vec![];
            for (i, e) in ops[r].iter().enumerate() {
                for (p, part) in e.parts.iter().enumerate() {
                    if steps[r][i][p] == step {
                        parts.push(part);
                    }
                }
            }
            let now = after(r, step);
            let before = after(r, step - 1);
            out.push(format!(
                "    {} {}  {}",
                name_of(&labels[r], world_ranks[r], label_width),
                row_of(now.as_ref(), before.as_ref()),
                said(&parts, &chunks, &combine)
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_is_named_in_its_ranks_colour_on_a_terminal_only() {
        // Rank 1's orange, as --draw paints its lane; padded before the colour.
        assert_eq!(painted("rank 1", 1, 8, false), "  rank 1");
        let (r, g, b) = workbook_draw::palette::rank(1);
        let shown = painted("rank 1", 1, 8, true);
        assert!(shown.contains(&format!("38;2;{r};{g};{b}m  rank 1")), "{shown:?}");
    }
    use workbook_runtime::record::{Cat, Event, Part};

    fn op(phase: &str, parts: Vec<Part>, values: Vec<f64>) -> Event {
        Event {
            cat: Cat::Op,
            name: "send/recv".into(),
            t0: 0.0,
            dur: 0.0,
            phase: Some(phase.into()),
            algorithm: None,
            bytes: 0,
            parts,
            values: Some(values),
            op: None,
        }
    }

    fn part(dir: Dir, peer: usize, range: (usize, usize), how: How) -> Part {
        Part {
            dir,
            peer,
            bytes: 4,
            range: Some(range),
            in_send: false,
            how,
            seq: None,
        }
    }

    #[test]
    fn an_operation_over_several_steps_is_named_by_their_range() {
        let step = |phase: Option<&str>, index, of| Step {
            phase: phase.map(str::to_string),
            index,
            of,
        };
        let rs = |i| step(Some("reduce-scatter"), i, 2);
        assert_eq!(Step::span(&[rs(1)]), "reduce-scatter step 1 of 2");
        assert_eq!(Step::span(&[rs(1), rs(2)]), "reduce-scatter steps 1–2 of 2");
        assert_eq!(
            Step::span(&[rs(2), step(Some("all-gather"), 1, 2)]),
            "reduce-scatter step 2 of 2 + all-gather step 1 of 2"
        );
        assert_eq!(Step::span(&[step(None, 1, 3), step(None, 2, 3)]), "steps 1–2 of 3");
    }

    #[test]
    fn a_send_after_a_receive_opens_the_next_step_and_a_receive_waits_for_its_send() {
        // A chain 0 → 1 → 2 (a broadcast): rank 1 receives in step 1 and sends in step 2.
        let send = |to| op("", vec![part(Dir::Send, to, (0, 2), How::Copy)], vec![1.0, 1.0]);
        let recv = |from| op("", vec![part(Dir::Recv, from, (0, 2), How::Copy)], vec![1.0, 1.0]);
        let (s0, r1, s1, r2) = (send(1), recv(0), send(2), recv(1));
        let ops = vec![vec![&s0], vec![&r1, &s1], vec![&r2]];
        assert_eq!(
            number(&ops, &[0, 1, 2]),
            vec![vec![vec![1]], vec![vec![1], vec![2]], vec![vec![2]]]
        );
    }

    #[test]
    fn two_ranks_exchanging_chunks_show_the_partial_sums_and_the_chunks() {
        // Two ranks, 2 elements, one chunk each: step 1 adds, step 2 copies.
        let mut all = vec![];
        for r in 0..2usize {
            let peer = 1 - r;
            let watch = Event {
                cat: Cat::Watch,
                name: "all-reduce".into(),
                values: Some(vec![(r + 1) as f64; 2]),
                ..op("", vec![], vec![])
            };
            let mine = ((r + 1) % 2, (r + 1) % 2 + 1);
            let theirs = (r, r + 1);
            let mut v = vec![(r + 1) as f64; 2];
            v[mine.0] = 3.0;
            let a = op(
                "reduce-scatter",
                vec![
                    part(Dir::Send, peer, theirs, How::Copy),
                    part(Dir::Recv, peer, mine, How::Reduce),
                ],
                v,
            );
            let b = op(
                "all-gather",
                vec![
                    part(Dir::Send, peer, mine, How::Copy),
                    part(Dir::Recv, peer, theirs, How::Copy),
                ],
                vec![3.0, 3.0],
            );
            all.push(vec![watch, a, b]);
        }
        colored::control::set_override(false);
        let lines = render(&all, &[0, 1], &["CPU 0".into(), "CPU 1".into()]);
        let text = lines.join("\n");
        assert!(text.contains("reduce-scatter step 1 of 1"), "{text}");
        assert!(text.contains("all-gather step 1 of 1"), "{text}");
        assert!(
            text.contains("CPU 0 | 1  |[3] |  sent chunk 0 → rank 1, got chunk 1 from rank 1 (+)"),
            "{text}"
        );
        assert!(text.contains("CPU 1 |[3] | 2  |"), "{text}");
    }
}
