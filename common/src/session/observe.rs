//! What the job leaves to look at afterwards: `--steps` (rank 0 prints every rank's
//! steps), `--trace` (every rank's timeline gathered into one file) and NVTX ranges.

use super::Session;
use anyhow::Result;

impl Session {
    /// An NVTX range named `name`, on the NCCL backend (Nsight Systems shows it).
    pub(super) fn nvtx(&self, name: &str) -> Option<crate::nvtx::Range> {
        (self.comm.name() == "nccl").then(|| crate::nvtx::range(name))
    }

    /// `--steps`: gathers on rank 0 what every rank recorded since the last time, and
    /// prints its steps. Every rank calls it at the same points (tables, checks, the
    /// timed runs, the end), whatever it recorded; `last` at the timed runs and the end,
    /// where a run that showed nothing says so.
    pub(super) fn flush_steps(&mut self, last: bool) -> Result<()> {
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
    pub(super) fn gather_trace(&mut self) -> Result<Option<Vec<crate::trace::RankTrace>>> {
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
}
