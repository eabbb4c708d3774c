//! The session: one rank's view of the job, and the handful of calls a lesson makes.
//!
//! [`Session::init`] does what every distributed program does before its first
//! collective: join the rendezvous, learn who else is there, pick a device, and set up
//! the backend. The lesson then makes buffers, shows them, runs collectives, checks the
//! result and times it; rank 0 gathers and prints every table.

mod collectives;
mod p2p;
mod single_calls;

pub use single_calls::MAX_CALLS as SINGLE_CALLS_MAX;

use crate::args::{DataArgs, Format, RunArgs};
use crate::backend::{self, Backend, Buffer, host, host_mut};
use crate::collective::{Collective, DeviceCall, HostCall};
use crate::device::{self, Kind};
use crate::element::{Element, ReduceOp, Reduction, as_bytes, as_bytes_mut};
use crate::error::SharedError;
use crate::launch::Identity;
use crate::rendezvous::{Join, Store, StoreServer};
use crate::report::{Check, RankReport, Report, SingleCalls, Timing};
use crate::table;
use crate::transport::Via;
use crate::units::human_bytes;
use anyhow::{Context, Result, anyhow};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::ToSocketAddrs;
use std::time::{Duration, Instant};

/// What each rank tells the others about itself at the rendezvous.
#[derive(Serialize, Deserialize, Clone, Debug)]
struct Member {
    rank: usize,
    local_rank: usize,
    host: String,
    pid: u32,
    device: String,
    device_name: Option<String>,
}

/// Which backend a rank picked and why, and on NCCL which library: compared across ranks.
#[derive(Serialize, Deserialize, Clone, Debug)]
struct Choice {
    /// "nccl" or "cpu".
    backend: String,
    /// The backend line.
    reason: String,
    /// NCCL's version and file.
    nccl: Option<(String, String)>,
}

/// Every rank must run the same backend, and on NCCL the same version: a rank on a node
/// without GPUs (or with another NCCL) would otherwise hang or corrupt the others.
fn same_backend(store: &mut Store, rank: usize, world: usize, mine: &Choice) -> Result<()> {
    let all: Vec<Choice> = store.share_json("backend", rank, world, mine, "every rank's backend")?;
    let refuse = |message: String| -> Result<()> { Err(SharedError { message, usage: true }.into()) };
    if let Some((r, other)) = all.iter().enumerate().find(|(_, c)| c.backend != all[0].backend) {
        return refuse(format!(
            "rank 0 runs the {} backend ({}) but rank {r} the {} backend ({}): every rank must run the same one; \
             give every node GPUs and NCCL, or say --backend cpu",
            all[0].backend, all[0].reason, other.backend, other.reason
        ));
    }
    let version = |c: &Choice| c.nccl.as_ref().map(|(v, p)| format!("NCCL {v} ({p})"));
    if let Some((r, other)) = all
        .iter()
        .enumerate()
        .find(|(_, c)| c.nccl.as_ref().map(|n| &n.0) != all[0].nccl.as_ref().map(|n| &n.0))
    {
        return refuse(format!(
            "rank 0 loads {} but rank {r} loads {}: every rank must use the same NCCL version (point NCCL_LIBRARY \
             at one libnccl.so.2 on every node)",
            version(&all[0]).unwrap_or_default(),
            version(other).unwrap_or_default()
        ));
    }
    Ok(())
}

/// This process's command as every rank of one job must share it: the program and its
/// arguments, less those that may differ between ranks (who it is, where the store is,
/// how it prints and waits).
fn job_command() -> String {
    const PER_RANK: [&str; 8] = [
        "--rank",
        "--node-rank",
        "--world-size",
        "--master-addr",
        "--master-port",
        "--job-id",
        "--format",
        "--color",
    ];
    let mut words = vec![crate::example_name()];
    let mut args = std::env::args_os().skip(1).map(|a| a.to_string_lossy().into_owned());
    while let Some(a) = args.next() {
        let flag = a.split('=').next().unwrap_or(&a);
        if PER_RANK.contains(&flag) || flag == "--timeout" {
            if !a.contains('=') {
                args.next();
            }
            continue;
        }
        words.push(a);
    }
    words.join(" ")
}

/// Every rank must run the same command: two jobs started by hand on one address and
/// port would otherwise pair their ranks (wrong results, or a mismatch deep inside a
/// collective), and a rank started with another `--count` would fail far from the cause.
fn same_command(store: &mut Store, rank: usize, world: usize) -> Result<()> {
    let mine = job_command();
    let all = store.share("command", rank, world, mine.as_bytes(), "every rank's command")?;
    let all: Vec<String> = all.iter().map(|c| String::from_utf8_lossy(c).into_owned()).collect();
    match all.iter().enumerate().find(|(_, c)| **c != all[0]) {
        None => Ok(()),
        Some((r, other)) => Err(SharedError {
            message: format!(
                "rank 0 runs `{}` but rank {r} runs `{}`: every rank of a job runs the same command (is it \
                 another job on this port? give each job its own --job-id or --master-port)",
                crate::error::cut(&all[0], 200),
                crate::error::cut(other, 200)
            ),
            usage: true,
        }
        .into()),
    }
}

/// Every rank's shown elements, gathered on rank 0 for one table.
struct Rows {
    /// The table's title, ending with ':'.
    title: String,
    /// "CPU 0", "GPU 1": one per row.
    labels: Vec<String>,
    /// The cells, one row per rank.
    cells: Vec<Vec<String>>,
    /// Which cells differ from the previous table's (when it had the same shape).
    changed: Option<Vec<Vec<bool>>>,
}

/// What a timing loop measured ([`Session::time_runs`]).
#[derive(Debug, Clone)]
pub struct Runs {
    /// Every rank's mean seconds per call, the calls back to back, in rank order.
    pub means: Vec<f64>,
    /// The same calls one by one (CPU backend): median, p99 and how many slept.
    pub single: Option<SingleCalls>,
}

/// One rank's session: who it is, its store connection and its backend.
pub struct Session {
    // Fields drop in this order. On a failure, the links to the peers close first (so
    // that blocked peers fail at once), then this rank's store connection, and rank 0's
    // store itself last, once the others have asked it who failed first.
    backend: Backend,
    store: Store,
    server: Option<StoreServer>,
    id: Identity,
    format: Format,
    timeout: Duration,
    members: Vec<Member>,
    report: Report,
    /// The elements of the last table, to mark what changed in the next one.
    last_rows: Option<Vec<Vec<String>>>,
    /// How many elements the tables show.
    show: Option<usize>,
    /// The last collective run and its size in bytes (its larger buffer, as nccl-tests
    /// sizes it), for timing.
    last_op: Option<(&'static Collective, usize)>,
    /// Numbers the keys of successive tables, checks and timings.
    seq: u64,
    /// Devices per node: GPUs on NCCL, ranks of the node on the CPU backend.
    device_count: usize,
    /// Which number picked the device (`--device-rule`).
    device_rule: device::DeviceRule,
    /// Why a check failed: the session still finishes, then fails.
    failed: Option<String>,
    /// `--steps` on the CPU backend, until the timed runs: rank 0 prints the steps.
    steps: bool,
    /// `--trace FILE`: rank 0 writes every rank's timeline there at the end.
    trace: Option<std::path::PathBuf>,
    /// Seconds per call the last timed loop took to issue its calls.
    issued: f64,
    /// What this rank sent to and received from each peer point-to-point: compared with
    /// the others' at the end of the job.
    ledger: p2p::Ledger,
}

impl Session {
    /// Joins the job as the rank `id` describes: rendezvous, device, backend.
    pub fn init(id: Identity, run: &RunArgs) -> Result<Session> {
        let (rank, world) = (id.rank, id.world_size);
        // The backend: asked for, or what the probe finds (and why).
        let probe = if run.backend == crate::args::BackendChoice::Cpu {
            device::Probe::default()
        } else {
            device::probe()
        };
        let (kind, reason) = device::choose(run.backend, &probe)?;
        if let Some(shown) = run.show_calls {
            shown
                .check(world)
                .map_err(|message| SharedError { message, usage: true })?;
        }
        // Said first, before anything can fail: which backend, and on NCCL which library.
        if rank == 0 && run.format == Format::Text {
            print_out(&reason);
            if run.show_calls.is_some() && kind == Kind::Cpu {
                print_out(
                    "--show-calls: the CPU backend makes no NCCL or CUDA call (it runs NCCL's ring algorithms \
                     itself); to see NCCL's calls on a machine with no GPU, add --simulate-gpus N",
                );
            }
            if run.steps && kind == Kind::Nccl {
                print_out(
                    "--steps: NCCL runs a collective's steps inside its own kernels, where this program cannot \
                     see them; --show-calls shows the NCCL calls each rank makes, and --backend cpu runs the same \
                     ring step by step where --steps shows it",
                );
            }
        }

        // Rendezvous: rank 0 hosts the store on the master address; everyone joins it.
        let server = if rank == 0 {
            let addr = (id.master_addr.as_str(), id.store_port)
                .to_socket_addrs()
                .with_context(|| format!("resolving the master address {}", id.master_addr))?
                .next()
                .ok_or_else(|| anyhow!("the master address {} resolves to nothing", id.master_addr))?;
            Some(StoreServer::start(addr, &id.job_id, world)?)
        } else {
            None
        };
        let join = Join {
            job_id: id.job_id.clone(),
            world_size: world,
            rank,
        };
        let mut store = Store::connect(&id.master_addr, id.store_port, &join, run.timeout)?;
        same_command(&mut store, rank, world)?;

        // Who is where: local ranks come from the launcher, or from comparing hosts.
        let device::Place {
            host,
            local_rank,
            local_world,
        } = device::place(&mut store, &id)?;
        let choice = Choice {
            backend: if kind == Kind::Nccl { "nccl" } else { "cpu" }.into(),
            reason: reason.clone(),
            nccl: probe
                .nccl
                .clone()
                .filter(|_| kind == Kind::Nccl)
                .map(|l| (l.version, l.path.map(|p| p.display().to_string()).unwrap_or_default())),
        };
        same_backend(&mut store, rank, world, &choice)?;

        // The device, by the course's rule (or --device-rule's), and the backend on it.
        let device_count = if kind == Kind::Cpu { local_world } else { probe.gpus };
        let dev = device::device_for(run.device_rule, rank, local_rank, device_count);
        let (backend, device, device_name, transports) = match kind {
            Kind::Cpu => {
                let (cpu, transports) =
                    backend::cpu::Cpu::connect(&mut store, &id, &host, run, crate::collective::named)?;
                (Backend::Cpu(cpu), format!("cpu:{dev}"), None, transports)
            }
            Kind::Nccl => {
                // With one GPU per Slurm task, every rank's device 0 is a GPU of its own:
                // the backend compares the GPUs themselves, not their numbers.
                let shown = backend::calls::Shown::new(
                    rank,
                    run.show_calls.is_some_and(|s| s.shows(rank)),
                    run.format == Format::Json,
                );
                let nccl = backend::nccl::Nccl::init(&mut store, (rank, world), dev, &host, run.timeout, shown)?;
                let name = nccl.device_name();
                (
                    Backend::Nccl(Box::new(nccl)),
                    format!("cuda:{dev}"),
                    Some(name),
                    BTreeMap::new(),
                )
            }
        };

        let me = Member {
            rank,
            local_rank,
            host,
            pid: std::process::id(),
            device,
            device_name,
        };
        let members: Vec<Member> = store.share_json("member", rank, world, &me, "every rank's registration")?;

        let report = Report {
            example: crate::example_name(),
            backend: backend.name().into(),
            backend_reason: reason.clone(),
            nccl_version: choice.nccl.as_ref().map(|(v, _)| v.clone()),
            nccl_library: choice.nccl.as_ref().map(|(_, p)| p.clone()).filter(|p| !p.is_empty()),
            simulated_gpus: crate::simulate::gpus().filter(|_| kind == Kind::Nccl),
            transports,
            world_size: world,
            ranks: members
                .iter()
                .map(|m| RankReport {
                    rank: m.rank,
                    local_rank: m.local_rank,
                    host: m.host.clone(),
                    pid: m.pid,
                    device: m.device.clone(),
                    device_name: m.device_name.clone(),
                    ..RankReport::default()
                })
                .collect(),
            ..Report::default()
        };
        let mut session = Session {
            backend,
            store,
            server,
            id,
            format: run.format,
            timeout: run.timeout,
            members,
            report,
            last_rows: None,
            show: None,
            last_op: None,
            seq: 0,
            device_count,
            device_rule: run.device_rule,
            failed: None,
            // Recorded and gathered alike on every rank (whatever each prints): rank 0 prints.
            steps: run.steps && kind == Kind::Cpu,
            trace: run.trace.clone(),
            issued: 0.0,
            ledger: p2p::Ledger::new(world),
        };
        session.say_transports();
        // Every rank leaves the rendezvous at about the same moment: the traces' common start.
        crate::record::start(session.steps, session.trace.is_some());
        if session.trace.is_some() {
            crate::trace::start(&mut session.store, session.id.rank)?;
        }
        Ok(session)
    }

    /// This rank, from 0 to `world_size() - 1`.
    pub fn rank(&self) -> usize {
        self.id.rank
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.id.world_size
    }

    /// Prints a line of text output, on rank 0 only.
    pub fn say(&self, line: &str) {
        if self.rank() == 0 && self.format == Format::Text {
            print_out(line);
        }
    }

    /// With `NCCL_DEBUG=INFO`, as NCCL prints each channel's transport: how every pair
    /// of ranks exchanges data on the CPU backend, and why.
    fn say_transports(&self) {
        if !crate::backend::cpu::debug_info() {
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
        if let Some(core) = crate::transport::shm::bound_core() {
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
                    self.backend.name().into(),
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
        let mine = self.backend.download(buf, n)?;
        let Some(Rows {
            title,
            labels,
            cells,
            changed,
        }) = self.gather_rows(title, &mine)?
        else {
            return Ok(());
        };
        self.say(&table::stage(
            &title,
            &labels,
            &cells,
            changed.as_deref(),
            buf.len() - n,
        ));
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
        let world = self.world_size();
        let block = buf.len() / world;
        let k = self.show.unwrap_or(8).min(block);
        let mut mine = vec![];
        for b in 0..world {
            mine.extend(self.backend.download_range(buf, b * block..b * block + k)?);
        }
        let Some(Rows {
            title,
            labels,
            cells,
            changed,
        }) = self.gather_rows(title, &mine)?
        else {
            return Ok(());
        };
        let names: Vec<String> = (0..world)
            .map(|b| match block - k {
                0 => label(b),
                more => format!("{} (+{more})", label(b)),
            })
            .collect();
        self.say(&table::blocks(&title, &labels, &names, &cells, changed.as_deref(), k));
        Ok(())
    }

    /// Gathers every rank's shown elements on rank 0 (recorded in the JSON report under
    /// the title's first word), with the rows' labels and which cells changed since the
    /// last table: `None` on the other ranks.
    fn gather_rows<T: Element>(&mut self, title: &str, mine: &[T]) -> Result<Option<Rows>> {
        self.flush_steps(false)?;
        let mine: Vec<f64> = mine.iter().map(|v| v.to_f64()).collect();
        let key = self.next_key("show");
        self.say_p2p()?;
        self.store
            .set(&format!("{key}/{}", self.rank()), &serde_json::to_vec(&mine)?)?;
        if self.rank() != 0 {
            return Ok(None);
        }
        let keys: Vec<_> = (0..self.world_size()).map(|r| (format!("{key}/{r}"), r)).collect();
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
        for (r, row) in rows.iter().enumerate() {
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
        let label = if self.backend.name() == "nccl" { "GPU" } else { "CPU" };
        let labels: Vec<String> = (0..self.world_size()).map(|r| format!("{label} {r}")).collect();
        let title = if title.ends_with(':') {
            title.to_string()
        } else {
            format!("{title}:")
        };
        Ok(Some(Rows {
            title,
            labels,
            cells,
            changed,
        }))
    }

    /// Checks, before anything is allocated, that `bytes` per rank (its buffers at their
    /// peak) fit in the memory this host has available, every rank of the host taking as
    /// much; `what` names the flag that asked for them. Without it a too large `--size`
    /// ends as "killed by signal 9" (the out-of-memory killer). CPU backend only: NCCL's
    /// buffers live on the GPU.
    pub fn ensure_memory(&self, bytes: u64, what: &str) -> Result<()> {
        if self.backend.name() != "cpu" {
            return Ok(());
        }
        let host = &self.members[self.rank()].host;
        let local = self.members.iter().filter(|m| &m.host == host).count() as u64;
        let need = bytes.saturating_mul(local);
        match device::available_memory() {
            Some(free) if need > free => Err(crate::error::usage(format!(
                "rank {}: {what}: {local} rank(s) on this host would hold {} in buffers, and it has {} of memory \
                 available: ask for less, or start fewer ranks per host",
                self.rank(),
                human_bytes(need as usize),
                human_bytes(free as usize)
            ))),
            _ => Ok(()),
        }
    }

    /// Checks that `rank`, given by the user as `flag`, is one of the ranks; every rank
    /// finds the same, so only rank 0 says so. Call it before any rank waits on another.
    pub fn ensure_rank(&self, rank: usize, flag: &str) -> Result<usize> {
        crate::rank::check(rank, self.world_size(), flag).map_err(|message| SharedError { message, usage: true })?;
        Ok(rank)
    }

    /// Checks that `peer` is another rank, before anything is sent to it or awaited from
    /// it: the one check of every point-to-point call.
    pub(crate) fn ensure_peer(&self, peer: usize) -> Result<()> {
        let rank = self.rank();
        crate::rank::check(peer, self.world_size(), "peer")
            .map_err(|m| crate::error::usage(format!("rank {rank}: {m}")))?;
        if peer == rank {
            return Err(crate::error::usage(format!(
                "rank {rank} cannot send to or receive from itself"
            )));
        }
        Ok(())
    }

    /// Sends the whole buffer to rank `peer`, which must `recv` as many elements.
    pub fn send<T: Element>(&mut self, buf: &Buffer<T>, peer: usize) -> Result<()> {
        self.ensure_peer(peer)?;
        let rank = self.rank();
        self.ledger.enter(Some((peer, buf.len() * size_of::<T>())), None);
        let sent = self.backend.send(buf, peer);
        self.ledger.leave(sent).with_context(|| format!("rank {rank}"))
    }

    /// Receives a whole buffer from rank `peer`.
    pub fn recv<T: Element>(&mut self, buf: &mut Buffer<T>, peer: usize) -> Result<()> {
        self.ensure_peer(peer)?;
        let rank = self.rank();
        self.ledger.enter(None, Some((peer, buf.len() * size_of::<T>())));
        let got = self.backend.recv(buf, peer);
        self.ledger.leave(got).with_context(|| format!("rank {rank}"))
    }

    /// Runs `coll` on this rank, as every rank must: out of place from `send` into
    /// `recv`, or in place in `recv` alone (`send` is `None`, and the send region lies
    /// in `recv` where NCCL's in-place layout puts it). `root` counts for broadcast and
    /// reduce, `op` for the reductions. The lessons call it through the named methods
    /// ([`Session::all_gather_into`], ...). The buffers' sizes and the root are checked
    /// here, once, before anything moves.
    pub fn run<T: Element>(
        &mut self,
        coll: &'static Collective,
        send: Option<&Buffer<T>>,
        recv: &mut Buffer<T>,
        root: usize,
        op: ReduceOp,
    ) -> Result<()> {
        let (rank, world) = (self.rank(), self.world_size());
        let root = match coll.rooted {
            true => self.ensure_rank(root, "root")?,
            false => 0,
        };
        let count = coll
            .count_of(send.map(|s| s.len()), recv.len(), world)
            .map_err(|why| crate::error::usage(format!("rank {rank}: {why}")))?;
        let (send_len, recv_len) = (coll.counts)(count, world);
        let bytes = send_len.max(recv_len) * size_of::<T>();
        self.last_op = Some((coll, bytes));
        crate::fault::late(rank);
        let _span = crate::record::collective(coll.title, bytes as u64);
        let _range = self.nvtx(coll.nccl_name);
        let done = match &mut self.backend {
            Backend::Cpu(cpu) => {
                crate::record::watch(coll.title, host(recv), send.map(host), true);
                if coll.reduces {
                    crate::record::combining(op.name());
                }
                (coll.cpu)(
                    cpu,
                    HostCall {
                        send: send.map(|s| as_bytes(host(s))),
                        buf: as_bytes_mut(host_mut(recv)),
                        count,
                        root,
                        reduction: Reduction::of::<T>(op),
                    },
                )
            }
            Backend::Nccl(nccl) => {
                let layout = (coll.in_place)(count, world, rank);
                nccl.with_pointers(send, recv, layout, |send, recv| {
                    let call = DeviceCall {
                        send,
                        recv,
                        count,
                        elem: size_of::<T>(),
                        datatype: T::TYPE.nccl(),
                        op,
                        root: root as std::ffi::c_int,
                    };
                    // SAFETY: with_pointers gives the device pointers of `send` and `recv`,
                    // this rank's buffers on its GPU, whose lengths were checked against
                    // `count` at the API's edge (Collective::count_of); it records them as
                    // used by the stream, and cudarc frees device memory in stream order, so
                    // they outlive the queued call.
                    unsafe { (coll.nccl)(nccl, &call) }
                })
            }
        };
        done.with_context(|| format!("rank {rank}"))
    }

    /// Waits until every rank gets here (through the store, so it costs a round trip).
    pub fn barrier(&mut self) -> Result<()> {
        self.say_p2p()?;
        let key = self.next_key("barrier");
        let (rank, world) = (self.rank(), self.world_size());
        let _span = crate::record::wait("barrier");
        self.store.barrier(&key, rank, world)
    }

    /// Waits until every operation this rank queued has finished (NCCL runs them
    /// asynchronously; the CPU backend's are done when they return).
    pub fn synchronize(&self) -> Result<()> {
        let _span = (self.backend.name() == "nccl").then(|| crate::record::wait("synchronize (the GPU's queue)"));
        self.backend.synchronize()
    }

    /// Every rank's `value`, in rank order, on every rank (`what` names it in errors).
    pub fn share_f64(&mut self, value: f64, what: &str) -> Result<Vec<f64>> {
        self.say_p2p()?;
        let key = self.next_key("gather");
        let (rank, world) = (self.rank(), self.world_size());
        let all = self.store.share(&key, rank, world, &value.to_le_bytes(), what)?;
        all.iter()
            .enumerate()
            .map(|(r, b)| {
                b.as_slice()
                    .try_into()
                    .map(f64::from_le_bytes)
                    .map_err(|_| anyhow!("rank {r} sent a malformed {what}"))
            })
            .collect()
    }

    /// The name of this session's backend: `cpu` or `nccl`.
    pub fn backend_name(&self) -> &'static str {
        self.backend.name()
    }

    /// One line per rank saying where it runs, as nccl-tests' `#  Rank  0 Pid ... on
    /// host device ...` lines.
    pub fn rank_lines(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| {
                let name = m.device_name.as_deref().map(|n| format!(" [{n}]")).unwrap_or_default();
                format!(
                    "#  Rank {:>2} Pid {:>7} on {:>10} device {}{name}",
                    m.rank, m.pid, m.host, m.device
                )
            })
            .collect()
    }

    /// How pairs of ranks exchange data on the CPU backend ("0-1": shm), for headers.
    pub fn transports(&self) -> &BTreeMap<String, Via> {
        &self.report.transports
    }

    /// Whether this rank's large collectives read the other ranks' buffers where they lie
    /// (CPU backend, one host: [`crate::backend::host_memory`]).
    pub fn single_copy(&self) -> bool {
        matches!(&self.backend, Backend::Cpu(c) if c.reads_peers())
    }

    /// Which algorithm ran the last collective: the tuner's name on the CPU backend
    /// ([`crate::collective::tuner`]); on NCCL, NCCL chooses (`NCCL_DEBUG=INFO` shows it).
    pub fn algorithm(&self) -> &'static str {
        match &self.backend {
            Backend::Cpu(c) => c.last_algorithm().map_or("?", |a| a.name()),
            Backend::Nccl(_) => "NCCL's choice",
        }
    }

    /// Puts the benchmark's sweeps in the JSON report.
    pub fn set_perf(&mut self, mut sweeps: Vec<crate::report::Perf>) {
        match sweeps.len() {
            1 => self.report.perf = sweeps.pop(),
            _ => self.report.sweeps = sweeps,
        }
    }

    /// Makes the run fail at the end with `message` (after the report is printed), as
    /// a failed check does; the first such message wins.
    pub fn fail_at_end(&mut self, message: String) {
        self.failed.get_or_insert(message);
    }

    /// Checks every element of every rank's buffer against `expected`, as nccl-tests
    /// counts `#wrong`; rank 0 reports. Fails on every rank if any element is wrong.
    pub fn check<T: Element>(&mut self, buf: &Buffer<T>, expected: T) -> Result<()> {
        self.check_by(buf, &expected.to_string(), |_| expected)
    }

    /// The check itself: element i of every rank's buffer must match `expected(i)`;
    /// `holds` is what the OK line says the ranks hold.
    pub(crate) fn check_by<T: Element>(
        &mut self,
        buf: &Buffer<T>,
        holds: &str,
        expected: impl Fn(usize) -> T,
    ) -> Result<()> {
        self.flush_steps(false)?;
        let _range = self.nvtx("check");
        let mut all = self.backend.download(buf, buf.len())?;
        corrupt_for_tests(self.rank(), &mut all);
        let bad = |i: &usize| !all[*i].matches(expected(*i));
        let wrong = (0..all.len()).filter(bad).count();
        let first = (0..all.len())
            .find(bad)
            .map(|i| format!("element {i} is {} instead of {}", all[i], expected(i)));
        let key = self.next_key("check");
        let mine = serde_json::to_vec(&(wrong, first))?;
        let (rank, world) = (self.rank(), self.world_size());
        self.say_p2p()?;
        let replies = self.store.share(&key, rank, world, &mine, "every rank's check")?;
        let results: Vec<(usize, Option<String>)> = replies
            .iter()
            .map(|r| serde_json::from_slice(r))
            .collect::<Result<_, _>>()?;
        let total: usize = results.iter().map(|(w, _)| w).sum();
        self.report.check = Some(Check {
            ok: total == 0,
            wrong: total as u64,
        });
        if total == 0 {
            let who = match world {
                1 => "the one rank holds".to_string(),
                n => format!("all {n} ranks hold"),
            };
            let elements = match (all.len(), world) {
                (1, 1) => "its one element".to_string(),
                (1, _) => "their one element".to_string(),
                (n, _) => format!("all {n} elements"),
            };
            self.say(&format!("Check: OK, {who} {holds} in {elements}"));
            return Ok(());
        }
        let bad: Vec<String> = results
            .iter()
            .enumerate()
            .filter(|(_, (w, _))| *w > 0)
            .map(|(r, (w, first))| format!("rank {r}: {w} wrong ({})", first.as_deref().unwrap_or("?")))
            .collect();
        let plural = if total == 1 { "" } else { "s" };
        let message = format!("check FAILED, {total} wrong element{plural}: {}", bad.join("; "));
        self.say(&format!("Check: {}", message.replace("check FAILED", "FAILED")));
        // Like nccl-tests, carry on (timing, the report) and fail at the end, with the first failure.
        self.failed.get_or_insert(message);
        Ok(())
    }

    /// Times `iters` runs of `op` (a collective on this session): a barrier first, then
    /// the runs back to back; the time of the slowest rank counts. Rank 0 prints it with
    /// nccl-tests' algbw and busbw.
    pub fn time(&mut self, iters: u32, op: impl FnMut(&mut Session) -> Result<()>) -> Result<Timing> {
        let world = self.world_size();
        let runs = self.time_runs(iters, 0, op)?;
        let slowest = runs.means.iter().copied().fold(0.0, f64::max);
        let (coll, bytes) = self
            .last_op
            .ok_or_else(|| anyhow!("time() needs a collective to time"))?;
        let t = Timing::new((coll.bus_factor)(world), bytes, slowest);
        self.report.time_us = Some(t.seconds * 1e6);
        self.report.algbw_gbps = Some(t.algbw);
        self.report.busbw_gbps = Some(t.busbw);
        self.report.algo = Some(self.algorithm().into());
        let overlap = single_calls::overlap(coll, world, iters);
        self.report.single_calls = runs.single;
        self.report.calls_overlap = overlap.map(str::to_string);
        let factor = match (coll.bus_factor)(world) {
            1.0 => "= algbw".to_string(),
            f => format!(
                "= algbw × {f:.2}, nccl-tests' factor for {} on {world} ranks",
                coll.name
            ),
        };
        let runs_text = match iters {
            1 => "one run".to_string(),
            n => format!("mean of {n} runs back to back"),
        };
        let overlap = overlap
            .map(|why| format!("; calls may overlap: {why}"))
            .unwrap_or_default();
        self.say(&format!(
            "Time: {:.1} us per {} of {} via {} (slowest of {world} ranks, {runs_text}{overlap}): algbw {:.2} GB/s, busbw {:.2} GB/s (busbw {factor})",
            t.seconds * 1e6,
            coll.title,
            human_bytes(bytes),
            self.algorithm(),
            t.algbw,
            t.busbw,
        ));
        if let Some(single) = runs.single.filter(|s| s.calls > 1) {
            self.say(&format!("      {}", single_calls::line(&single)));
        }
        if self.report.simulated_gpus.is_some() {
            self.say(&format!("      ({})", crate::simulate::NOTE));
        }
        Ok(t)
    }

    /// The timing loop of every measurement (the lessons' `time` and the benchmark's
    /// sweep): finish what is queued, run `op` `warmup` times untimed, meet at a barrier
    /// (see [`Session::timed`] for the untimed run each backend adds), run `op` `iters`
    /// times back to back, wait for the last run. Returns every rank's mean seconds per
    /// run, in rank order, and on the CPU backend the spread of the single calls of the
    /// same loop (each stamped: [`single_calls`]).
    pub fn time_runs(
        &mut self,
        iters: u32,
        warmup: u32,
        mut op: impl FnMut(&mut Session) -> Result<()>,
    ) -> Result<Runs> {
        // --steps shows the first, checked runs; the timed ones are not recorded.
        self.flush_steps(true)?;
        self.steps = false;
        crate::record::stop_steps();
        let _range = self.nvtx("timed runs");
        self.synchronize()?;
        self.backend.timing(true)?;
        let ran = self.timed(iters, warmup, &mut op);
        self.backend.timing(false)?;
        let (mine, stamps) = ran?;
        let means = self.share_f64(mine, "every rank's timing")?;
        let single = match stamps {
            Some(stamps) => {
                let key = self.next_key("single");
                let (rank, world) = (self.rank(), self.world_size());
                let all = self
                    .store
                    .share(&key, rank, world, &stamps.encode(), "every rank's single calls")?;
                // Shared memory counts the waits that slept; TCP's blocking reads are not counted.
                let counted = self.report.transports.values().all(|v| *v == Via::Shm);
                single_calls::combine(&all, counted)
            }
            None => None,
        };
        Ok(Runs { means, single })
    }

    /// [`Session::time_runs`]'s loop, with the backend in its timing mode: `warmup` runs,
    /// the ranks lined up, then `iters` runs back to back and the wait for the last; this
    /// rank's mean seconds per run, and (CPU backend, whose calls have finished when they
    /// return) each call's stamps.
    fn timed(
        &mut self,
        iters: u32,
        warmup: u32,
        op: &mut impl FnMut(&mut Session) -> Result<()>,
    ) -> Result<(f64, Option<single_calls::Stamps>)> {
        match self.backend {
            // NCCL: the warm-up (at least one run: NCCL connects the peers at the first
            // call of the timed loop's communicator), finished, then the barrier, as
            // nccl-tests does.
            Backend::Nccl(_) if iters > 0 => {
                for _ in 0..warmup.max(1) {
                    op(self)?;
                }
                self.synchronize()?;
                self.barrier()?;
            }
            // The store's barrier lets the ranks go up to a millisecond apart (each wakes
            // on its own socket); one more run, untimed, lines them up to within a message.
            Backend::Cpu(_) if iters > 0 => {
                for _ in 0..warmup {
                    op(self)?;
                }
                self.barrier()?;
                op(self)?;
            }
            _ => self.barrier()?,
        }
        // NCCL's calls return once queued: stamping them would time the queue, not the calls.
        let mut stamps = matches!(self.backend, Backend::Cpu(_)).then(|| single_calls::Stamps::new(iters));
        let (start, waited) = (Instant::now(), self.backend.waited());
        for _ in 0..iters {
            if let Some(s) = stamps.as_mut() {
                s.mark();
            }
            op(self)?;
        }
        if let Some(s) = stamps.as_mut() {
            s.mark();
        }
        // The host's time to issue the calls: without the waits for a full queue.
        let issuing = start.elapsed().saturating_sub(self.backend.waited() - waited);
        self.issued = issuing.as_secs_f64() / iters.max(1) as f64;
        self.synchronize()?;
        Ok((start.elapsed().as_secs_f64() / iters.max(1) as f64, stamps))
    }

    /// How long this rank's last timed loop took to issue each call (before waiting for
    /// them: nccl-tests' cputime), in seconds.
    pub fn issue_time(&self) -> f64 {
        self.issued
    }

    /// Ends the session: waits until every rank is done (so none exits while another
    /// still needs it), then rank 0 prints the JSON report.
    pub fn finish(mut self) -> Result<()> {
        let (rank, world) = (self.rank(), self.world_size());
        self.flush_steps(true)?;
        let trace = self.gather_trace()?;
        // The last meeting: every rank's point-to-point accounts, compared.
        let unreceived = self.settle_p2p()?;
        self.backend.close()?;
        self.store.bye();
        if let Some(server) = &self.server {
            server.drain(self.timeout.min(Duration::from_secs(5)));
        }
        // Written once the others are done: a file that cannot be written fails rank 0 alone.
        if let (Some(path), Some(all)) = (&self.trace, trace) {
            let w =
                crate::trace::write(path, &all).with_context(|| format!("writing the trace to {}", path.display()))?;
            self.say(&format!(
                "Trace: {} events of {world} ranks ({} messages drawn send → receive, clocks on rank 0's within \
                 {:.1} µs) written to {}: open it in https://ui.perfetto.dev (or chrome://tracing)",
                w.events,
                w.flows,
                w.error_us,
                path.display()
            ));
        }
        if rank == 0 && self.format == Format::Json {
            print_out(&serde_json::to_string_pretty(&self.report)?);
        }
        // A message sent and never received: one line each, said by its sender.
        let mut said = unreceived.into_iter().map(|line| anyhow!(line)).collect::<Vec<_>>();
        let last = match self.failed {
            Some(message) => Some(SharedError { message, usage: false }.into()),
            None => said.pop(),
        };
        for line in said {
            crate::error::say_line(&crate::error::line(Some(rank), &line));
        }
        match last {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Adds to a failure which rank went first, when that is another rank: a rank whose
    /// neighbour exited because of a third rank's crash then names the crashed one.
    pub fn explain(&mut self, err: anyhow::Error) -> anyhow::Error {
        if crate::error::is_shared(&err) {
            return err;
        }
        // A message this rank sent and a peer went on without receiving: the cause.
        if let Some(line) = self.unreceived_at_failure() {
            return err.context(line);
        }
        if crate::error::is_shared(&err) || crate::error::names_culprit(&err) {
            return err;
        }
        // Give the store a moment to see the connection of a killed rank close; ask it
        // briefly (a frozen rank 0 must not hold this rank's exit back).
        std::thread::sleep(Duration::from_millis(50));
        let asked = self
            .store
            .watcher(Duration::from_secs(1))
            .and_then(|mut s| s.first_lost());
        match asked {
            Ok(Some((r, how))) if r != self.rank() => err.context(format!("rank {r} failed first ({how})")),
            Ok(_) => err,
            Err(_) if self.rank() != 0 => err.context("rank 0, which hosts the store, is gone too"),
            Err(_) => err,
        }
    }

    /// An NVTX range named `name`, on the NCCL backend (Nsight Systems shows it).
    fn nvtx(&self, name: &str) -> Option<crate::nvtx::Range> {
        (self.backend.name() == "nccl").then(|| crate::nvtx::range(name))
    }

    /// `--steps`: gathers on rank 0 what every rank recorded since the last time, and
    /// prints its steps. Every rank calls it at the same points (tables, checks, the
    /// timed runs, the end), whatever it recorded; `last` at the timed runs and the end,
    /// where a run that showed nothing says so.
    fn flush_steps(&mut self, last: bool) -> Result<()> {
        if !self.steps {
            return Ok(());
        }
        let (events, too_big) = crate::record::take_steps();
        if let Some(n) = too_big {
            self.say(&format!(
                "--steps: the buffer has {n} elements; steps are shown for buffers of at most {} (try --count 6)",
                crate::record::STEPS_MAX
            ));
            self.steps = false;
            crate::record::stop_steps();
            return Ok(());
        }
        self.say_p2p()?;
        let key = self.next_key("steps");
        let (rank, world) = (self.rank(), self.world_size());
        // Shared with every rank, so that all decide alike whether steps were shown.
        let all: Vec<Vec<crate::record::Event>> = self
            .store
            .share(&key, rank, world, &serde_json::to_vec(&events)?, "every rank's steps")?
            .iter()
            .map(|v| serde_json::from_slice(v))
            .collect::<Result<_, _>>()?;
        let labels: Vec<String> = (0..world).map(|r| format!("CPU {r}")).collect();
        let lines = crate::steps::render(&all, &labels);
        if lines.is_empty() {
            if last {
                self.say("--steps: no rank sent or received anything, so there is no step to show");
            }
            return Ok(());
        }
        self.say(&format!("{}\n", lines.join("\n")));
        // The first steps shown are the last: a lesson's checked collective, not what follows.
        self.steps = false;
        crate::record::stop_steps();
        Ok(())
    }

    /// `--trace FILE`: every rank's events, gathered on rank 0 (`None` elsewhere, or
    /// without `--trace`).
    fn gather_trace(&mut self) -> Result<Option<Vec<crate::trace::RankTrace>>> {
        if self.trace.is_none() {
            return Ok(None);
        }
        self.say_p2p()?;
        let (rank, world) = (self.rank(), self.world_size());
        let mine = crate::trace::RankTrace::new(&mut self.store, rank, self.members[rank].host.clone())?;
        self.store.set(&format!("trace/{rank}"), &serde_json::to_vec(&mine)?)?;
        if rank != 0 {
            return Ok(None);
        }
        let keys: Vec<_> = (0..world).map(|r| (format!("trace/{r}"), r)).collect();
        let all: Vec<crate::trace::RankTrace> = self
            .store
            .wait(&keys, "every rank's trace")?
            .iter()
            .map(|v| serde_json::from_slice(v))
            .collect::<Result<_, _>>()?;
        Ok(Some(all))
    }

    fn next_key(&mut self, what: &str) -> String {
        self.seq += 1;
        format!("{what}/{}", self.seq)
    }
}

/// Test hook: `NCCL_WORKBOOK_FAULT=corrupt:RANK:INDEX` doubles one element of one
/// rank's result before the check (tests corrupt non-zero results), so that tests can
/// prove a wrong result is caught, reported and fails the run. Every check calls it on
/// what it read back (the session's, and the benchmark's).
pub(crate) fn corrupt_for_tests<T: Element>(rank: usize, data: &mut [T]) {
    if let Some(at) = crate::fault::asked("corrupt", Some(rank))
        && let Some(v) = at
            .first()
            .and_then(|i| i.parse::<usize>().ok())
            .and_then(|i| data.get_mut(i))
    {
        *v = v.combine(*v, ReduceOp::Sum);
    }
}

/// A JSON number as a table shows it: `42`, not `42.0`.
fn cell(v: &serde_json::Value) -> String {
    match v.as_f64() {
        Some(f) if f.fract() == 0.0 && f.abs() < 1e15 => format!("{}", f as i64),
        Some(f) => format!("{f}"),
        None => v.to_string(),
    }
}

/// Prints a line on stdout; a reader that went away (`| head`) is not an error.
fn print_out(line: &str) {
    crate::error::print_line(line, crate::error::OnClosed::Drop);
}
