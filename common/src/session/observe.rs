//! What the job leaves to look at afterwards: `--steps` (rank 0 prints every rank's
//! steps), `--trace` (every rank's timeline gathered into one file) and NVTX ranges.

use super::Session;
use crate::args::Format;
use anyhow::{Context, Result};

impl Session {
    /// An NVTX range named `name`, on the NCCL backend (Nsight Systems shows it).
    pub(super) fn nvtx(&self, name: &str) -> Option<workbook_nccl::nvtx::Range> {
        (self.comm.name() == "nccl").then(|| workbook_nccl::nvtx::range(name))
    }

    /// `--steps`: gathers on rank 0 what every rank recorded since the last time, and
    /// prints its steps. Every rank calls it at the same points (tables, checks, the
    /// timed runs, the end), whatever it recorded; `last` at the timed runs and the end,
    /// where a run that showed nothing says so.
    pub(super) fn flush_steps(&mut self, last: bool) -> Result<()> {
        if !self.steps && self.draw.is_none() {
            return Ok(());
        }
        let (events, too_big) = workbook_runtime::record::take_steps();
        if let Some(n) = too_big {
            let flag = if self.steps { "--steps" } else { "--draw" };
            // A lesson's buffer has --count elements; others (lesson 10's model) their own flags.
            let try_count = if self.report.count.is_some() {
                " (try --count 6)"
            } else {
                ""
            };
            self.say(&format!(
                "{flag}: the buffer has {n} elements; steps are shown for buffers of at most {}{try_count}",
                workbook_runtime::record::STEPS_MAX
            ));
            (self.steps, self.draw) = (false, None);
            workbook_runtime::record::stop_steps();
            return Ok(());
        }
        self.say_p2p()?;
        let key = self.next_key("steps");
        let world = self.world_size();
        // Shared with every rank, so that all decide alike whether steps were shown
        // (inside Session::on, every rank of the split: a rank with no color shows none).
        let said: Vec<Vec<workbook_runtime::record::Event>> = self
            .share_here(&key, &serde_json::to_vec(&events)?, "every rank's steps")?
            .iter()
            .map(|v| serde_json::from_slice(v))
            .collect::<Result<_, _>>()?;
        let mut all = vec![vec![]; world];
        for (r, events) in self.participants().into_iter().zip(said) {
            all[r] = events;
        }
        // The world's ranks together, or inside Session::on each communicator of the
        // split on its own: its ranks in their order in it.
        let groups: Vec<(Option<i32>, Vec<usize>)> = match &self.scope {
            Some(scope) => scope.groups.iter().map(|(c, m)| (Some(*c), m.clone())).collect(),
            None => vec![(None, (0..world).collect())],
        };
        let (mut lines, mut panels) = (vec![], vec![]);
        for (color, members) in groups {
            let theirs: Vec<Vec<workbook_runtime::record::Event>> =
                members.iter().map(|&r| std::mem::take(&mut all[r])).collect();
            let labels: Vec<String> = members.iter().map(|r| format!("CPU {r}")).collect();
            let steps = crate::steps::render(&theirs, &members, &labels);
            let on =
                color.map(|c| format!("On the communicator of color {c} (world ranks in its order: {members:?}):"));
            if let (Some(on), false) = (&on, steps.is_empty()) {
                lines.push(on.clone());
            }
            lines.extend(steps);
            if self.draw.is_some() {
                let caption = color
                    .map(|c| format!("color {c}, world ranks {members:?}: "))
                    .unwrap_or_default();
                let labels: Vec<String> = members.iter().map(|r| format!("rank {r}")).collect();
                panels.extend(crate::drawing::panels(&theirs, &members, &labels, &caption));
            }
        }
        if lines.is_empty() {
            if last {
                let flag = if self.steps { "--steps" } else { "--draw" };
                self.say(&format!(
                    "{flag}: no rank sent or received anything, so there is no step to show"
                ));
            }
            return Ok(());
        }
        if self.steps {
            self.say(&format!("{}\n", lines.join("\n")));
        }
        if let Some(path) = self.draw.take() {
            self.draw_picture(&path, &panels)?;
        }
        // The first steps shown are the last: a lesson's checked collective, not what follows.
        self.steps = false;
        workbook_runtime::record::stop_steps();
        Ok(())
    }

    /// `--draw FILE.svg` (or `.html`), on rank 0: the panels drawn, written whole, and said.
    fn draw_picture(&self, path: &std::path::Path, panels: &[workbook_draw::Panel]) -> Result<()> {
        if self.rank() != 0 {
            return Ok(());
        }
        let Some(first) = panels.first() else {
            self.say("--draw: the collective moved no element of a buffer (a group's messages): nothing to draw");
            return Ok(());
        };
        let title = "What each rank's buffer holds, step by step (nccl-workbook --draw)";
        let drawn = match path.extension().is_some_and(|e| e == "html") {
            true => workbook_draw::html(title, panels),
            false => workbook_draw::svg(title, panels),
        };
        let steps: usize = panels.iter().map(|p| p.steps.len()).max().unwrap_or(0);
        let what = format!(
            "{} ({steps} steps, {} messages)",
            first.caption,
            panels.iter().map(|p| p.moves.len()).sum::<usize>(),
        );
        self.put_picture(path, drawn, &what)
    }

    /// `--draw` taken by a lesson that draws a picture of its own (lesson 10's timeline):
    /// no collective is drawn step by step. The path was checked before the run.
    pub fn draw_own(&mut self) -> Option<std::path::PathBuf> {
        let path = self.draw.take();
        if path.is_some() && !self.steps {
            workbook_runtime::record::stop_steps();
        }
        path
    }

    /// Writes a picture drawn for `--draw` (on rank 0: the others return at once), whole or
    /// not at all, and says so: "Drawn: WHAT written to PATH".
    pub fn put_picture(&self, path: &std::path::Path, drawn: Result<String, String>, what: &str) -> Result<()> {
        if self.rank() != 0 {
            return Ok(());
        }
        let drawn = drawn.map_err(|why| anyhow::anyhow!("--draw: {why}"))?;
        crate::output_file::replace(path, drawn.as_bytes())
            .map_err(|why| anyhow::anyhow!("--draw {}: {why}", path.display()))?;
        self.say(&format!(
            "Drawn: {what} written to {}: open it in a browser",
            path.display()
        ));
        Ok(())
    }

    /// `--trace FILE`, on every rank before the last meeting: puts this rank's events in
    /// the store, in pieces ([`crate::trace::pieces`], each far under the store's limit
    /// of a message), then a header that counts them. No message grows with the run's
    /// length or the number of ranks.
    pub(super) fn send_trace(&mut self) -> Result<()> {
        use crate::trace::{PIECE_BYTES, RankTrace, pieces};
        if self.trace.is_none() {
            return Ok(());
        }
        self.say_p2p()?;
        let (rank, world) = (self.rank(), self.world_size());
        let mut mine = RankTrace::new(&mut self.store, rank, world, self.members[rank].host.clone())?;
        let (parts, too_big) =
            pieces(&mine.events, PIECE_BYTES).with_context(|| format!("rank {rank}: writing down its trace"))?;
        mine.events.clear();
        mine.dropped += too_big;
        mine.pieces = parts.len();
        for (i, piece) in parts.iter().enumerate() {
            self.store.set(&format!("trace/{rank}/{i}"), piece)?;
        }
        // The header last: once it is there, every piece is.
        self.store.set(&format!("trace/{rank}"), &serde_json::to_vec(&mine)?)
    }

    /// `--trace FILE`: every rank's events, read on rank 0 from its own store after the
    /// last meeting (so that no rank waits on it meanwhile), `None` elsewhere or without
    /// `--trace`. The headers are read in batches and each piece alone. The run is over:
    /// whatever goes wrong here is the trace's alone (`Some(Err)`, said in one line at
    /// the end, the run's verdict unchanged).
    pub(super) fn gather_trace(&mut self) -> Option<Result<Vec<crate::trace::RankTrace>>> {
        use crate::trace::RankTrace;
        let (rank, world) = (self.rank(), self.world_size());
        if self.trace.is_none() || rank != 0 {
            return None;
        }
        let store = &mut self.store;
        let mut all: Vec<RankTrace> = Vec::with_capacity(world);
        // Headers are small (a host name, clocks): a batch's fits one message many times over.
        const BATCH: usize = 1024;
        let mut read = || -> Result<()> {
            for first in (0..world).step_by(BATCH) {
                let keys: Vec<_> = (first..world.min(first + BATCH))
                    .map(|r| (format!("trace/{r}"), r))
                    .collect();
                for (r, head) in (first..).zip(store.wait(&keys, "every rank's trace")?) {
                    let mut t: RankTrace = serde_json::from_slice(&head)
                        .with_context(|| format!("rank {r} sent a trace that does not parse"))?;
                    for i in 0..t.pieces {
                        let piece = store
                            .wait(&[(format!("trace/{r}/{i}"), r)], "every rank's trace")?
                            .pop()
                            .unwrap_or_default();
                        let events: Vec<workbook_runtime::record::Event> = serde_json::from_slice(&piece)
                            .with_context(|| format!("piece {i} of rank {r}'s trace does not parse"))?;
                        t.events.extend(events);
                    }
                    all.push(t);
                }
            }
            Ok(())
        };
        Some(read().map(|()| all))
    }

    /// `--trace FILE`, on rank 0 at the very end (the other ranks are done): writes what
    /// [`Session::gather_trace`] gathered, and says so; says what was not kept. A trace
    /// that could not be gathered or written is one line naming the file, on stderr: the
    /// run itself went as its own output says, and its exit status stays what it is.
    pub(super) fn write_trace(&self, gathered: Option<Result<Vec<crate::trace::RankTrace>>>) {
        let (Some(path), Some(gathered)) = (&self.trace, gathered) else {
            return;
        };
        let world = self.world_size();
        let written = gathered.and_then(|all| {
            let w = crate::trace::write(path, &all)?;
            Ok((w, crate::trace::dropped_line(&all)))
        });
        match written {
            Ok((w, dropped)) => {
                // The bound is claimed for the ranks whose clocks were aligned only.
                let clocks = match w.unaligned.as_slice() {
                    [] => format!("clocks on rank 0's within {:.1} µs", w.error_us),
                    bad => format!(
                        "clocks on rank 0's within {:.1} µs but rank{} {}'s, which could not be aligned: see its label",
                        w.error_us,
                        if bad.len() == 1 { "" } else { "s" },
                        bad.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(", ")
                    ),
                };
                self.say(&format!(
                    "Trace: {} events of {world} ranks ({} messages drawn send → receive, {clocks}) written to {}: \
                     open it in https://ui.perfetto.dev (or chrome://tracing)",
                    w.events,
                    w.flows,
                    path.display()
                ));
                if let Some(line) = dropped {
                    match self.format {
                        Format::Text => self.say(&line),
                        Format::Json => workbook_runtime::error::say_line(&line),
                    }
                }
            }
            Err(e) => workbook_runtime::error::say_line(&format!(
                "warning: --trace {}: the trace was not written ({}); the run itself is not affected",
                path.display(),
                workbook_runtime::error::line(None, &e).trim_start_matches("error: ")
            )),
        }
    }
}
