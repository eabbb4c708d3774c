//! The session: one rank's view of the job, and the handful of calls a lesson makes.
//!
//! [`Session::init`] does what every distributed program does before its first
//! collective: join the rendezvous, learn who else is there, pick a device, and set up
//! the backend. The lesson then makes buffers, shows them, runs collectives, checks the
//! result and times it; rank 0 gathers and prints every table.
//!
//! One file per job: `join.rs` (the rendezvous, the device, the backend), `show.rs` (the
//! roll call, the tables), `collectives.rs` and `p2p.rs` (what a lesson calls to move
//! data), `check.rs`, `time.rs` (with `single_calls.rs`), `observe.rs` (`--steps`,
//! `--trace`, NVTX), and `harness.rs`: what `common::main` and the benchmark call, hidden
//! from the session's documentation with the few other harness-only calls.

mod check;
mod collectives;
mod group;
mod harness;
mod join;
pub(crate) use join::check_nccl_tuning;
mod observe;
mod overlap;
mod p2p;
mod show;
mod single_calls;
mod split;
mod time;

// Public for the benchmark's crate (workbook-perf) alone: no lesson calls it.
#[doc(hidden)]
pub use check::corrupt_for_tests;
pub use group::Group;
pub use overlap::{Span, Stream, StreamReport, Work};
use show::print_out;
pub use single_calls::MAX_CALLS as SINGLE_CALLS_MAX;
pub use split::{SPLIT_NOCOLOR, Split};
pub use time::Runs;

use crate::Communicator;
use crate::args::Format;
use crate::backend::Buffer;
use crate::collective::Collective;
use crate::report::Report;
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::time::Duration;
use workbook_nccl::device;
use workbook_runtime::element::{Element, ReduceOp};
use workbook_runtime::error::SharedError;
use workbook_runtime::launch::Identity;
use workbook_runtime::rendezvous::{Store, StoreServer};

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

/// One rank's session: who it is, its store connection and its backend.
pub struct Session {
    /// The world's communicator, through which every call runs.
    // Fields drop in this order. On a failure, the links to the peers close first (so
    // that blocked peers fail at once), then this rank's store connection, and rank 0's
    // store itself last, once the others have asked it who failed first.
    comm: Communicator,
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
    /// `--draw FILE.svg` on the CPU backend, until the first collective is drawn.
    draw: Option<std::path::PathBuf>,
    /// `--trace FILE`: rank 0 writes every rank's timeline there at the end.
    trace: Option<std::path::PathBuf>,
    /// Seconds per call the last timed loop took to issue its calls.
    issued: f64,
    /// What this rank sent to and received from each peer point-to-point: compared with
    /// the others' at the end of the job.
    ledger: p2p::Ledger,
    /// Inside [`Session::on`]: the split whose communicator `comm` is now.
    scope: Option<split::Scope>,
    /// How many splits this session made (each names its keys in the store).
    splits: u64,
    /// Inside [`Session::time_as`]: what is timed is the program's own calls.
    hand_written: bool,
    /// The rank's failure was explained already ([`Session::explain`]): a rank fails once,
    /// and a split's failure is explained where it happened, before its communicator goes.
    explained: bool,
}

impl Session {
    /// This rank, from 0 to `world_size() - 1`.
    pub fn rank(&self) -> usize {
        self.id.rank
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.id.world_size
    }

    /// How many ranks run on rank 0's machine (its node): where a lesson lays its groups
    /// out a node at a time.
    pub fn ranks_per_node(&self) -> usize {
        // Each emulated node has a host name of its own (SLURMD_NODENAME).
        let first = &self.members[0].host;
        self.members.iter().filter(|m| &m.host == first).count()
    }

    /// The communicator this session runs every collective on: the world's, holding
    /// every rank ([`Communicator::rank`], [`Communicator::world`], its backend).
    pub fn communicator(&self) -> &Communicator {
        &self.comm
    }

    /// Checks that `rank`, given by the user as `flag`, is one of the ranks; every rank
    /// finds the same, so only rank 0 says so. Call it before any rank waits on another.
    #[inline]
    pub fn ensure_rank(&self, rank: usize, flag: &str) -> Result<usize> {
        self.rank_here(rank, flag)
            .map_err(|message| SharedError { message, usage: true })?;
        Ok(rank)
    }

    /// Whether `rank`, given as `what`, is a rank of the communicator the calls run on
    /// now: the world's, or inside [`Session::on`] the split one's, named by its color.
    #[inline]
    fn rank_here(&self, rank: usize, what: &str) -> Result<(), String> {
        match &self.scope {
            Some(s) => workbook_runtime::rank::check_in(
                rank,
                self.comm.world(),
                what,
                &format!("the communicator of color {}", s.color),
            ),
            None => workbook_runtime::rank::check(rank, self.comm.world(), what),
        }
    }

    /// Checks that `peer` is another rank, before anything is sent to it or awaited from
    /// it: the one check of every point-to-point call.
    pub(crate) fn ensure_peer(&self, peer: usize) -> Result<()> {
        let who = self.who();
        self.rank_here(peer, "peer")
            .map_err(|m| workbook_runtime::error::usage(format!("{who}: {m}")))?;
        if peer == self.comm.rank() {
            return Err(workbook_runtime::error::usage(format!(
                "{who} cannot send to or receive from itself"
            )));
        }
        Ok(())
    }

    /// Refuses (exit 2, one line) a message of `bytes` that `--link`'s simulated wire
    /// cannot carry within `--timeout`: checked before a collective or a send starts.
    pub(crate) fn fits_wire(&self, bytes: usize) -> Result<()> {
        match &self.comm {
            Communicator::Cpu(cpu) => fits_wire(cpu.wire_limit(), bytes),
            _ => Ok(()),
        }
    }

    /// The world's rank of `peer`, a rank of the communicator the calls run on now.
    pub(crate) fn world_rank_of(&self, peer: usize) -> usize {
        self.scope.as_ref().map_or(peer, |s| s.world_rank(peer))
    }

    /// Sends the whole buffer to rank `peer`, which must `recv` as many elements.
    pub fn send<T: Element>(&mut self, buf: &Buffer<T>, peer: usize) -> Result<()> {
        self.ensure_peer(peer)?;
        self.fits_wire(buf.len() * size_of::<T>())?;
        self.ledger
            .enter(Some((self.world_rank_of(peer), buf.len() * size_of::<T>())), None);
        let sent = self.comm.send(buf, peer);
        self.ledger.leave(sent).with_context(|| self.who())
    }

    /// Receives a whole buffer from rank `peer`.
    pub fn recv<T: Element>(&mut self, buf: &mut Buffer<T>, peer: usize) -> Result<()> {
        self.ensure_peer(peer)?;
        self.fits_wire(buf.len() * size_of::<T>())?;
        self.ledger
            .enter(None, Some((self.world_rank_of(peer), buf.len() * size_of::<T>())));
        let got = self.comm.recv(buf, peer);
        self.ledger.leave(got).with_context(|| self.who())
    }

    /// Runs `coll` on this rank, as every rank must: out of place from `send` into
    /// `recv`, or in place in `recv` alone (`send` is `None`, and the send region lies
    /// in `recv` where NCCL's in-place layout puts it). `root` counts for broadcast and
    /// reduce, `op` for the reductions. The lessons call it through the named methods
    /// ([`Session::all_gather_into`], ...). The buffers' sizes and the root are checked
    /// here, once, before anything moves.
    #[doc(hidden)]
    pub fn run<T: Element>(
        &mut self,
        coll: &'static Collective,
        send: Option<&Buffer<T>>,
        recv: &mut Buffer<T>,
        root: usize,
        op: ReduceOp,
    ) -> Result<()> {
        // Who this rank is is worded only for an error: a small call costs less than the
        // words would.
        let world = self.comm.world();
        let root = match coll.rooted() {
            true => self.ensure_rank(root, "root")?,
            false => 0,
        };
        let count = coll
            .count_of(send.map(|s| s.len()), recv.len(), world)
            .map_err(|why| workbook_runtime::error::usage(format!("{}: {why}", self.who())))?;
        self.run_checked(coll.title(), coll, send, recv, count, root, op)
    }

    /// [`Session::run`] once the sizes and the root are checked (a group's calls, packed
    /// or not, come here too): noted for timing, shown by `--steps` and `--trace` as
    /// `title`, and run on the communicator the calls run on now.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn run_checked<T: Element>(
        &mut self,
        title: &str,
        coll: &'static Collective,
        send: Option<&Buffer<T>>,
        recv: &mut Buffer<T>,
        count: usize,
        root: usize,
        op: ReduceOp,
    ) -> Result<()> {
        // --draw pictures what --steps records: a small buffer, said before it runs.
        if let Some(path) = self
            .draw
            .as_ref()
            .filter(|_| recv.len() > workbook_runtime::record::STEPS_MAX)
        {
            return Err(workbook_runtime::error::SharedError {
                message: format!(
                    "--draw {}: the buffer has {} elements; pictures are drawn for buffers of at most {} (try \
                     --count 8)",
                    path.display(),
                    recv.len(),
                    workbook_runtime::record::STEPS_MAX
                ),
                usage: true,
            }
            .into());
        }
        let (rank, world) = (self.rank(), self.comm.world());
        let (send_len, recv_len) = (coll.counts)(count, world);
        let bytes = send_len.max(recv_len) * size_of::<T>();
        self.fits_wire(bytes)?;
        self.last_op = Some((coll, bytes));
        workbook_runtime::fault::late(rank);
        // The trace names the communicator a collective ran on, inside Session::on.
        let span = match &self.scope {
            Some(s) => std::borrow::Cow::Owned(format!("{title} (color {})", s.color)),
            None => std::borrow::Cow::Borrowed(title),
        };
        let _span = workbook_runtime::record::collective(&span, bytes as u64);
        let _range = self.nvtx(coll.nccl_name());
        let done = self.comm.collective(title, coll, send, recv, count, root, op);
        done.with_context(|| self.who())
    }

    /// Waits until every rank gets here (through the store, so it costs a round trip).
    pub fn barrier(&mut self) -> Result<()> {
        self.say_p2p()?;
        let key = self.next_key("barrier");
        let _span = workbook_runtime::record::wait("barrier");
        self.share_here(&format!("barrier/{key}"), &[], &format!("every rank to reach '{key}'"))
            .map(drop)
    }

    /// Waits until every operation this rank queued has finished (NCCL runs them
    /// asynchronously; the CPU backend's are done when they return).
    pub fn synchronize(&self) -> Result<()> {
        let _span =
            (self.comm.name() == "nccl").then(|| workbook_runtime::record::wait("synchronize (the GPU's queue)"));
        self.comm.synchronize()
    }

    /// The store's key of the next meeting: numbered in the session, or inside
    /// [`Session::on`] in the split (whose ranks with no color do not meet).
    fn next_key(&mut self, what: &str) -> String {
        if let Some(s) = self.scope.as_mut() {
            s.seq += 1;
            return format!("split{}/{what}/{}", s.id, s.seq);
        }
        self.seq += 1;
        format!("{what}/{}", self.seq)
    }
}

/// Refuses a message of `bytes` that a simulated wire (`--link` and `--timeout`, `None`:
/// no simulated link) cannot carry in time: one line, exit 2, the same on every rank of
/// the communicator (each has a simulated link), so said once.
pub(crate) fn fits_wire(
    wire: Option<(workbook_cpu::transport::simulated::Network, Duration)>,
    bytes: usize,
) -> Result<()> {
    workbook_cpu::comm::carries(wire, bytes)
        .map_err(|message| workbook_runtime::error::SharedError { message, usage: true }.into())
}
