//! What a lesson shows: the roll call, its buffers as tables (rank 0 gathers every
//! rank's elements and prints them), and its own lines.

use super::Session;
use crate::args::{DataArgs, Format};
use crate::backend::Buffer;
use crate::table;
use anyhow::Result;
use workbook_cpu::transport::Via;
use workbook_nccl::device::{self};
use workbook_runtime::element::Element;

/// Every rank's shown elements, gathered on rank 0 for one table.
pub(super) struct Rows {
    /// The table's title, ending with ':'.
    title: String,
    /// "CPU 0", "GPU 1": one per row.
    labels: Vec<String>,
    /// The cells, one row per rank.
    cells: Vec<Vec<String>>,
    /// Which cells differ from the previous table's (when it had the same shape).
    changed: Option<Vec<Vec<bool>>>,
}

/// A JSON number as a table shows it: `42`, not `42.0`.
pub(super) fn cell(v: &serde_json::Value) -> String {
    match v.as_f64() {
        Some(f) => crate::table::number(f),
        None => v.to_string(),
    }
}

/// Prints a line on stdout; a reader that went away (`| head`) is not an error.
pub(super) fn print_out(line: &str) {
    workbook_runtime::error::print_line(line, workbook_runtime::error::OnClosed::Drop);
}

impl Session {
    /// Prints a line of text output, on rank 0 only.
    pub fn say(&self, line: &str) {
        if self.rank() == self.printer() && self.format == Format::Text {
            print_out(line);
        }
    }

    /// With `NCCL_DEBUG=INFO`, as NCCL prints each channel's transport: how every pair
    /// of ranks exchanges data on the CPU backend, and why.
    pub(super) fn say_transports(&self) {
        if !workbook_cpu::comm::debug_info() {
            return;
        }
        for (pair, via) in &self.report.transports {
            let Some((a, b)) = pair
                .split_once('-')
                .and_then(|(a, b)| Some((a.parse::<usize>().ok()?, b.parse::<usize>().ok()?)))
            else {
                continue;
            };
            let (ha, hb) = (&self.members[a].host, &self.members[b].host);
            let how = match via {
                Via::Shm => "SHM/shared memory (same host)",
                Via::Tcp if ha == hb => "NET/TCP (--transport tcp)",
                Via::Tcp => "NET/TCP (different hosts)",
            };
            self.say(&format!("cpu INFO {a}[{ha}] <-> {b}[{hb}] via {how}"));
        }
        if self.single_copy() {
            self.say("cpu INFO P2P/single copy: every rank maps the others' buffers (NCCL_P2P_DISABLE=1 turns it off)");
        }
        // Every rank of a one-host job decides alike: rank 0's binding stands for all.
        if let Some(core) = workbook_cpu::transport::shm::bound_core() {
            self.say(&format!(
                "cpu INFO each rank bound to a core of its own (rank 0 on core {core}), as Open MPI binds ranks; \
                 NCCL_WORKBOOK_BIND=none leaves them to the scheduler"
            ));
        }
    }

    /// Hello world's roll call: every rank's rank, local rank, host, pid, device and
    /// backend, in one table on rank 0, in rank order.
    pub fn roll_call(&mut self) -> Result<()> {
        let rows: Vec<Vec<String>> = self
            .members
            .iter()
            .map(|m| {
                let dev = match &m.device_name {
                    Some(name) => format!("{} ({name})", m.device),
                    None => m.device.clone(),
                };
                vec![
                    m.rank.to_string(),
                    m.local_rank.to_string(),
                    m.host.clone(),
                    m.pid.to_string(),
                    dev,
                    self.comm.name().into(),
                ]
            })
            .collect();
        let n = self.world_size();
        self.say(&format!("Hello from {n} rank{}:", if n == 1 { "" } else { "s" }));
        self.say(&table::with_header(
            &["rank", "local rank", "host", "pid", "device", "backend"],
            &rows,
        ));
        self.say(&format!(
            "Each rank uses device = {}{}, with device_count = {}.",
            self.device_rule.formula(),
            match self.device_rule {
                device::DeviceRule::Rank => "",
                device::DeviceRule::LocalRank => " (--device-rule local-rank)",
            },
            self.device_count
        ));
        Ok(())
    }

    /// A buffer of `--count` (or `--size`) elements, all equal to `value`, placed where
    /// the backend computes (GPU memory on NCCL). Also takes `--show` for the tables.
    pub fn buffer<T: Element>(&mut self, data: &DataArgs, value: T) -> Result<Buffer<T>> {
        self.buffer_with(data, |_| value)
    }

    /// Prints a table of every rank's first elements, titled `title` ("Before
    /// broadcast:"), on rank 0. Cells that changed since the previous table stand out.
    pub fn show<T: Element>(&mut self, title: &str, buf: &Buffer<T>) -> Result<()> {
        let n = self.show.unwrap_or(buf.len().min(8)).min(buf.len());
        let mine = self.comm.download(buf, n)?;
        for Rows {
            title,
            labels,
            cells,
            changed,
        } in self.gather_rows(title, &mine)?.unwrap_or_default()
        {
            self.say(&table::stage(
                &title,
                &labels,
                &cells,
                changed.as_deref(),
                buf.len() - n,
            ));
        }
        Ok(())
    }

    /// Like [`Session::show`], for a buffer of one block per rank (all-gather's receive
    /// buffer, all-to-all's buffers): a header row names block b with `label(b)` ("from
    /// rank 2"), and each block shows its first elements (`--show`, default up to 8).
    pub fn show_blocks<T: Element>(
        &mut self,
        title: &str,
        buf: &Buffer<T>,
        label: impl Fn(usize) -> String,
    ) -> Result<()> {
        let world = self.comm.world();
        let block = buf.len() / world;
        let k = self.show.unwrap_or(8).min(block);
        let mut mine = vec![];
        for b in 0..world {
            mine.extend(self.comm.download_range(buf, b * block..b * block + k)?);
        }
        let names: Vec<String> = (0..world)
            .map(|b| match block - k {
                0 => label(b),
                more => format!("{} (+{more})", label(b)),
            })
            .collect();
        for Rows {
            title,
            labels,
            cells,
            changed,
        } in self.gather_rows(title, &mine)?.unwrap_or_default()
        {
            self.say(&table::blocks(&title, &labels, &names, &cells, changed.as_deref(), k));
        }
        Ok(())
    }

    /// Gathers every rank's shown elements on the printing rank (recorded in the JSON
    /// report under the title's first word), with the rows' labels and which cells changed
    /// since the last table: one table, or inside [`Session::on`] one per communicator of
    /// the split, titled with its color, its rows in its ranks' order; `None` on the other
    /// ranks.
    pub(super) fn gather_rows<T: Element>(&mut self, title: &str, mine: &[T]) -> Result<Option<Vec<Rows>>> {
        self.flush_steps(false)?;
        let mine: Vec<f64> = mine.iter().map(|v| v.to_f64()).collect();
        let key = self.next_key("show");
        self.say_p2p()?;
        self.store
            .set(&format!("{key}/{}", self.rank()), &serde_json::to_vec(&mine)?)?;
        if self.rank() != self.printer() {
            return Ok(None);
        }
        let participants = self.participants();
        let keys: Vec<_> = participants.iter().map(|&r| (format!("{key}/{r}"), r)).collect();
        let rows: Vec<Vec<serde_json::Value>> = self
            .store
            .wait(&keys, &format!("every rank's row of '{title}'"))?
            .iter()
            .map(|v| serde_json::from_slice(v))
            .collect::<Result<_, _>>()?;
        let stage = title
            .split_whitespace()
            .next()
            .unwrap_or(title)
            .trim_end_matches(':')
            .to_lowercase();
        for (&r, row) in participants.iter().zip(&rows) {
            self.report.ranks[r].stages.insert(stage.clone(), row.clone());
        }
        let cells: Vec<Vec<String>> = rows.iter().map(|row| row.iter().map(cell).collect()).collect();
        // Cells are compared with the previous table's only when the tables have one shape.
        let same_shape = |prev: &&Vec<Vec<String>>| prev.iter().map(Vec::len).eq(cells.iter().map(Vec::len));
        let changed: Option<Vec<Vec<bool>>> = self.last_rows.as_ref().filter(same_shape).map(|prev| {
            cells
                .iter()
                .zip(prev)
                .map(|(now, was)| now.iter().zip(was).map(|(a, b)| a != b).collect())
                .collect()
        });
        self.last_rows = Some(cells.clone());
        let label = if self.comm.name() == "nccl" { "GPU" } else { "CPU" };
        let title = title.trim_end_matches(':');
        let Some(scope) = &self.scope else {
            return Ok(Some(vec![Rows {
                title: format!("{title}:"),
                labels: participants.iter().map(|r| format!("{label} {r}")).collect(),
                cells,
                changed,
            }]));
        };
        // One table per communicator: its ranks in their order in it, each labelled with
        // its world rank and its rank in the communicator.
        let at = |r: usize| participants.iter().position(|&p| p == r).expect("a rank with a color");
        Ok(Some(
            scope
                .groups
                .iter()
                .map(|(color, members)| Rows {
                    title: format!(
                        "{title}, color {color} ({} rank{}):",
                        members.len(),
                        plural(members.len())
                    ),
                    labels: members
                        .iter()
                        .enumerate()
                        .map(|(i, &r)| format!("{label} {r}, rank {i}"))
                        .collect(),
                    cells: members.iter().map(|&r| cells[at(r)].clone()).collect(),
                    changed: changed
                        .as_ref()
                        .map(|c| members.iter().map(|&r| c[at(r)].clone()).collect()),
                })
                .collect(),
        ))
    }
}

/// "s" but for one.
fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}
