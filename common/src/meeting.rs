//! For a lesson that calls NCCL itself (`08-cudarc-allreduce`): the harness launches the
//! ranks and lets them meet through the store, and does nothing more. No backend, no
//! tables: the lesson makes its own context, communicator and buffers with cudarc, as a
//! program outside the workbook would. What here touches CUDA is the NCCL backend's
//! (`workbook_nccl::device::gpu::OpenGpu`, [`NcclResult`]): this crate names no cudarc.

use crate::args::RunArgs;
use anyhow::{Context, Result};
use std::time::Duration;
use workbook_nccl::device;
use workbook_nccl::device::gpu::OpenGpu;
use workbook_runtime::launch::Identity;
use workbook_runtime::rendezvous::{Store, StoreServer};

/// cudarc's NCCL errors named by call and result code (the NCCL backend's, where cudarc is):
/// `use common::meeting::NcclResult` gives a lesson `.nccl("ncclAllReduce")`.
pub use workbook_nccl::nccl::NcclResult;

/// One rank, met with the others: who it is, and the store they share.
pub struct Meeting {
    rank: usize,
    world: usize,
    device: usize,
    /// This rank's GPU, held open from the check that no other rank shares it until the
    /// end (the lesson's `CudaContext::new` takes the same primary context).
    _context: OpenGpu,
    store: Store,
    server: Option<StoreServer>,
    timeout: Duration,
}

impl Meeting {
    /// This rank's number, 0 to world size - 1.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// How many ranks there are.
    pub fn world_size(&self) -> usize {
        self.world
    }

    /// The GPU this rank uses, by the course's rule `rank % GPUs on the node` (or
    /// `local_rank % GPUs` with `--device-rule local-rank`), checked to be no other
    /// rank's.
    pub fn device(&self) -> usize {
        self.device
    }

    /// Bytes that rank 0 makes (`make` runs there only) and every rank gets: how NCCL's
    /// unique id travels. The store is the only channel the ranks have before NCCL.
    pub fn from_rank0(&mut self, key: &str, make: impl FnOnce() -> Result<Vec<u8>>) -> Result<Vec<u8>> {
        if self.rank == 0 {
            let bytes = make()?;
            self.store.set(key, &bytes)?;
            return Ok(bytes);
        }
        let mut got = self.store.wait(&[(key.to_string(), 0)], &format!("rank 0's {key}"))?;
        Ok(got.remove(0))
    }

    /// Prints `line` as this rank's, in one write (the ranks' lines never mix).
    pub fn say(&self, line: &str) {
        use std::io::Write;
        let _ = writeln!(std::io::stdout(), "rank {}: {line}", self.rank);
    }

    /// Waits until every rank is done, so that none leaves while another still needs it.
    fn finish(mut self) -> Result<()> {
        self.store.barrier("end", self.rank, self.world)?;
        workbook_runtime::rendezvous::leave(&mut self.store, self.server.as_ref(), self.timeout);
        Ok(())
    }
}

/// The rank's part of [`crate::meet`]: find the GPUs, meet the others, run `lesson`.
pub(crate) fn run(id: Identity, run: &RunArgs, lesson: impl FnOnce(&mut Meeting) -> Result<()>) -> Result<()> {
    let rank = id.rank;
    // Probe first: cudarc panics when it calls a library that is not there.
    let probe = device::probe();
    let (kind, reason) = device::choose(crate::args::BackendChoice::Nccl, &probe)?;
    crate::session::check_nccl_tuning(&probe)?;
    if kind != device::Kind::Nccl {
        return Err(workbook_runtime::error::usage(format!(
            "this lesson calls NCCL itself, and {reason}"
        )));
    }
    if let Some(shown) = run.show_calls {
        shown
            .check(id.world_size)
            .map_err(|message| workbook_runtime::error::SharedError { message, usage: true })?;
    }
    if rank == 0 {
        println!("{reason}");
        if let Some(shown) = run.show_calls {
            let whose = match shown {
                crate::args::ShowCalls::All => "every rank".to_string(),
                crate::args::ShowCalls::Rank(r) => format!("rank {r}"),
            };
            let simulated = match workbook_nccl::simulate::gpus() {
                Some(_) => "; on --simulate-gpus the simulator prints them as NCCL does",
                None => "",
            };
            println!(
                "--show-calls: this lesson calls NCCL itself (through cudarc), so NCCL reports its calls: \
                 NCCL_DEBUG=INFO and NCCL_DEBUG_SUBSYS=COLL are set for {whose}, and NCCL prints one line per \
                 call, `host:pid:thread [GPU] NCCL INFO AllReduce: opCount … count … datatype 7 op 0 …` \
                 (datatype 7 is ncclFloat32, op 0 ncclSum{simulated}); its CUDA calls are main.rs, line by line"
            );
        }
    }
    let (mut store, server) = workbook_runtime::rendezvous::meet(&id, run.timeout)?;
    // The device by the same rule as every lesson's, and no GPU shared by two ranks:
    // the check the workbook's NCCL backend makes, before the lesson makes its communicator.
    let place = device::place(&mut store, &id)?;
    let dev = device::device_for(run.device_rule, rank, place.local_rank, probe.gpus);
    let context = OpenGpu::open(dev).with_context(|| format!("rank {rank}: opening CUDA device {dev}"))?;
    let gpu = context
        .identify(&place.host)
        .with_context(|| format!("rank {rank}: reading device {dev}'s identity"))?;
    device::gpu::one_rank_per_gpu(&mut store, (rank, id.world_size), &gpu)?;
    if run.show_calls.is_some_and(|s| s.shows(rank)) {
        println!(
            "rank {rank}: NCCL's lines for this rank are those of process {} on GPU [{dev}]",
            std::process::id()
        );
    }
    let mut meeting = Meeting {
        rank,
        world: id.world_size,
        device: dev,
        _context: context,
        store,
        server,
        timeout: run.timeout,
    };
    // cudarc's calls block, and NCCL waits for a lost peer for ever: the whole lesson
    // gets one deadline (the workbook's own backend polls instead: backend-nccl/src/nccl/)
    // When it passes, the deadline's watcher ends the process at once, without
    // destructors: the CUDA runtime's would wait for the lesson's thread, stuck in NCCL.
    let limit = run.timeout;
    let _deadline = workbook_runtime::deadline::arm(
        limit,
        format!(
            "error: rank {rank}: not done after --timeout {}: cudarc's NCCL calls block with no deadline of their \
             own, so a rank stuck in NCCL (or waiting for a lost peer) is stopped here",
            workbook_runtime::units::human_duration(limit)
        ),
    );
    lesson(&mut meeting)?;
    meeting.finish()
}

/// `--show-calls` for a lesson that calls NCCL itself: its calls are NCCL's, so NCCL
/// reports them. If `--show-calls` shows this process's rank, sets `NCCL_DEBUG=INFO` and
/// adds `COLL` to `NCCL_DEBUG_SUBSYS` (what the user set is kept, only widened): NCCL then
/// prints one INFO line per collective, send and receive. A launcher sets nothing (it never
/// calls NCCL); each rank it starts decides for itself. Runs first in [`crate::meet`],
/// before NCCL is loaded (it reads the variables when it first logs).
pub(crate) fn show_nccl_calls(run: &RunArgs) {
    let Some(shown) = run.show_calls else {
        return;
    };
    let role = workbook_runtime::launch::resolve(&run.launch(), &|name| std::env::var(name).ok());
    let Ok(workbook_runtime::launch::Role::Rank(id)) = role else {
        return;
    };
    if !shown.shows(id.rank) {
        return;
    }
    let set = nccl_debug_env(
        std::env::var("NCCL_DEBUG").ok().as_deref(),
        std::env::var("NCCL_DEBUG_SUBSYS").ok().as_deref(),
    );
    for (name, value) in set {
        // SAFETY: `meet` calls this first thing in `main`, after parsing the arguments
        // only: the main thread is the process's only thread, so nothing reads or writes
        // the environment at the same time (what `set_var` requires).
        unsafe { std::env::set_var(name, value) };
    }
}

/// The variables to set so that NCCL prints its COLL lines, given what `NCCL_DEBUG` and
/// `NCCL_DEBUG_SUBSYS` are now: the level raised to INFO (TRACE kept), `COLL` added to a
/// list of subsystems (or taken out of a `^`-list that excludes it), as NCCL's debug.cc
/// reads them.
fn nccl_debug_env(level: Option<&str>, subsys: Option<&str>) -> Vec<(&'static str, String)> {
    let mut set = Vec::new();
    let verbose = level.is_some_and(workbook_cpu::comm::info_level);
    if !verbose {
        set.push(("NCCL_DEBUG", "INFO".to_string()));
    }
    let named = |list: &str, what: &str| list.split(',').any(|s| s.trim().eq_ignore_ascii_case(what));
    match subsys {
        None => set.push(("NCCL_DEBUG_SUBSYS", "COLL".to_string())),
        Some(s) => match s.strip_prefix('^') {
            Some(excluded) if named(excluded, "COLL") || named(excluded, "ALL") => {
                let kept: Vec<&str> = excluded
                    .split(',')
                    .filter(|e| !e.trim().eq_ignore_ascii_case("COLL") && !e.trim().eq_ignore_ascii_case("ALL"))
                    .collect();
                set.push(("NCCL_DEBUG_SUBSYS", format!("^{}", kept.join(","))));
            }
            Some(_) => {}
            None if named(s, "COLL") || named(s, "ALL") => {}
            None => set.push(("NCCL_DEBUG_SUBSYS", format!("{s},COLL"))),
        },
    }
    set
}

#[cfg(test)]
mod tests {
    use super::nccl_debug_env;

    #[test]
    fn show_calls_widens_what_nccl_debug_already_asks_for() {
        let set = |l, s| nccl_debug_env(l, s);
        let both = |s: &str| vec![("NCCL_DEBUG", "INFO".to_string()), ("NCCL_DEBUG_SUBSYS", s.to_string())];
        assert_eq!(set(None, None), both("COLL"));
        assert_eq!(set(Some("WARN"), Some("INIT")), both("INIT,COLL"));
        assert_eq!(set(Some("info"), Some("INIT,coll")), vec![]);
        assert_eq!(set(Some("TRACE"), Some("ALL")), vec![]);
        assert_eq!(set(Some("INFO"), Some("^INIT")), vec![]);
        assert_eq!(
            set(Some("INFO"), Some("^INIT,COLL")),
            vec![("NCCL_DEBUG_SUBSYS", "^INIT".to_string())]
        );
    }
}
