//! For a lesson that calls NCCL itself (`08-cudarc-allreduce`): the harness launches the
//! ranks and lets them meet through the store, and does nothing more. No backend, no
//! tables: the lesson makes its own context, communicator and buffers with cudarc, as a
//! program outside the workbook would.

use crate::args::RunArgs;
use crate::device;
use crate::launch::Identity;
use crate::rendezvous::{Join, Store, StoreServer};
use anyhow::{Context, Result, anyhow};
use cudarc::driver::CudaContext;
use std::net::ToSocketAddrs;
use std::sync::Arc;
use std::time::Duration;

/// One rank, met with the others: who it is, and the store they share.
pub struct Meeting {
    rank: usize,
    world: usize,
    device: usize,
    /// This rank's GPU, held open from the check that no other rank shares it until the
    /// end (the lesson's `CudaContext::new` takes the same primary context).
    _context: Arc<CudaContext>,
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
        self.store.bye();
        if let Some(server) = &self.server {
            server.drain(self.timeout.min(Duration::from_secs(5)));
        }
        Ok(())
    }
}

/// cudarc's NCCL errors say only "NcclError": this names the call and NCCL's result code.
pub trait NcclResult<T> {
    /// The error as "NCCL failed in `what` with ncclInvalidUsage".
    fn nccl(self, what: &str) -> Result<T>;
}

impl<T> NcclResult<T> for std::result::Result<T, cudarc::nccl::result::NcclError> {
    fn nccl(self, what: &str) -> Result<T> {
        self.map_err(|e| anyhow!("NCCL failed in {what} with {:?}", e.0))
    }
}

/// The rank's part of [`crate::meet`]: find the GPUs, meet the others, run `lesson`.
pub(crate) fn run(id: Identity, run: &RunArgs, lesson: impl FnOnce(&mut Meeting) -> Result<()>) -> Result<()> {
    let rank = id.rank;
    // Probe first: cudarc panics when it calls a library that is not there.
    let probe = device::probe();
    let (kind, reason) = device::choose(crate::args::BackendChoice::Nccl, &probe)?;
    if kind != device::Kind::Nccl {
        return Err(crate::error::usage(format!(
            "this lesson calls NCCL itself, and {reason}"
        )));
    }
    if rank == 0 {
        println!("{reason}");
        if run.show_calls {
            println!(
                "--show-calls: this lesson makes its NCCL and CUDA calls itself: they are its main.rs, line by line"
            );
        }
    }
    let server = match rank {
        0 => {
            let addr = (id.master_addr.as_str(), id.store_port)
                .to_socket_addrs()
                .with_context(|| format!("resolving the master address {}", id.master_addr))?
                .next()
                .ok_or_else(|| anyhow!("the master address {} resolves to nothing", id.master_addr))?;
            Some(StoreServer::start(addr, &id.job_id, id.world_size)?)
        }
        _ => None,
    };
    let join = Join {
        job_id: id.job_id.clone(),
        world_size: id.world_size,
        rank,
    };
    let mut store = Store::connect(&id.master_addr, id.store_port, &join, run.timeout)?;
    // The device by the same rule as every lesson's, and no GPU shared by two ranks:
    // the check the workbook's NCCL backend makes, before the lesson makes its communicator.
    let place = device::place(&mut store, &id)?;
    let dev = device::device_for(run.device_rule, rank, place.local_rank, probe.gpus);
    let context = CudaContext::new(dev).with_context(|| format!("rank {rank}: opening CUDA device {dev}"))?;
    let gpu = device::gpu::identify(&context, &place.host)
        .with_context(|| format!("rank {rank}: reading device {dev}'s identity"))?;
    device::gpu::one_rank_per_gpu(&mut store, (rank, id.world_size), &gpu)?;
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
    // gets one deadline (the workbook's own backend polls instead: backend/nccl.rs).
    // When it passes, the deadline's watcher ends the process at once, without
    // destructors: the CUDA runtime's would wait for the lesson's thread, stuck in NCCL.
    let limit = run.timeout;
    let _deadline = crate::deadline::arm(
        limit,
        format!(
            "error: rank {rank}: not done after --timeout {}: cudarc's NCCL calls block with no deadline of their \
             own, so a rank stuck in NCCL (or waiting for a lost peer) is stopped here",
            crate::units::human_duration(limit)
        ),
    );
    lesson(&mut meeting)?;
    meeting.finish()
}
