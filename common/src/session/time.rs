//! Timing: the calls back to back, as nccl-tests times them, with a warm-up, every
//! rank's mean gathered, and the lesson's `Time:` line.

use super::{Session, single_calls};
use crate::Communicator;
use crate::report::{SingleCalls, Timing};
use anyhow::{Context, Result, anyhow};
use std::time::Instant;
use workbook_cpu::transport::Via;
use workbook_runtime::units::human_bytes;

/// What a timing loop measured ([`Session::time_runs`]).
#[derive(Debug, Clone)]
pub struct Runs {
    /// Every rank's mean seconds per call, the calls back to back, in rank order.
    pub means: Vec<f64>,
    /// The same calls one by one (CPU backend): median, p99 and how many slept.
    pub single: Option<SingleCalls>,
}

impl Session {
    /// Times `iters` runs of `op` (a collective on this session): a barrier first, then
    /// the runs back to back; the time of the slowest rank counts. Rank 0 prints it with
    /// nccl-tests' algbw and busbw.
    pub fn time(&mut self, iters: u32, op: impl FnMut(&mut Session) -> Result<()>) -> Result<Timing> {
        let (world, ranks) = (self.comm.world(), self.participants().len());
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
        self.report.proto = self.protocol().map(|p| p.name().into());
        let overlap = single_calls::overlap(coll, world, iters);
        self.report.single_calls = runs.single;
        self.report.calls_overlap = overlap.map(str::to_string);
        let factor = match (coll.bus_factor)(world) {
            1.0 => "= algbw".to_string(),
            f => format!(
                "= algbw × {f:.2}, nccl-tests' factor for {} on {world} ranks",
                coll.name()
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
            "Time: {:.1} us per {} of {} via {}{} (slowest of {ranks} ranks, {runs_text}{overlap}): algbw {:.2} GB/s, busbw {:.2} GB/s (busbw {factor})",
            t.seconds * 1e6,
            coll.title(),
            human_bytes(bytes),
            self.algorithm_said(),
            // The protocol when it is not Simple, as NCCL's tuner names its choice.
            match self.protocol() {
                Some(p) if p != workbook_cpu::tuner::Protocol::Simple => format!(" proto {}", p.name()),
                _ => String::new(),
            },
            t.algbw,
            t.busbw,
        ));
        if let Some(single) = runs.single.filter(|s| s.calls > 1) {
            self.say(&format!("      {}", single_calls::line(&single)));
        }
        if self.report.simulated_gpus.is_some() {
            self.say(&format!("      ({})", workbook_nccl::simulate::NOTE));
        }
        if let Some(link) = &self.report.simulated_link {
            self.say(&format!(
                "      (TCP links simulated at {link} (--link): not this machine's network)"
            ));
        }
        Ok(t)
    }

    /// The timing loop of every measurement (the lessons' `time` and the benchmark's
    /// sweep): finish what is queued, run `op` `warmup` times untimed, meet at a barrier
    /// (see [`Session::timed`] for the untimed run each backend adds), run `op` `iters`
    /// times back to back, wait for the last run. Returns every rank's mean seconds per
    /// run, in rank order, and on the CPU backend the spread of the single calls of the
    /// same loop (each stamped: [`single_calls`]).
    #[doc(hidden)]
    pub fn time_runs(
        &mut self,
        iters: u32,
        warmup: u32,
        mut op: impl FnMut(&mut Session) -> Result<()>,
    ) -> Result<Runs> {
        // --steps shows the first, checked runs; the timed ones are not recorded.
        self.flush_steps(true)?;
        self.steps = false;
        workbook_runtime::record::stop_steps();
        let _range = self.nvtx("timed runs");
        self.synchronize()?;
        self.comm.timing(true)?;
        let ran = self.timed(iters, warmup, &mut op);
        self.comm.timing(false)?;
        let (mine, stamps) = ran?;
        let means = self.share_f64(mine, "every rank's timing")?;
        let single = match stamps {
            Some(stamps) => {
                let key = self.next_key("single");
                let all = self.share_here(&key, &stamps.encode(), "every rank's single calls")?;
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
    pub(super) fn timed(
        &mut self,
        iters: u32,
        warmup: u32,
        op: &mut impl FnMut(&mut Session) -> Result<()>,
    ) -> Result<(f64, Option<single_calls::Stamps>)> {
        match self.comm {
            // NCCL: the warm-up (at least one run: NCCL connects the peers at the first
            // call of the timed loop's communicator), finished, then the barrier, as
            // nccl-tests does.
            Communicator::Nccl(_) if iters > 0 => {
                for _ in 0..warmup.max(1) {
                    op(self)?;
                }
                self.synchronize()?;
                self.barrier()?;
            }
            // The store's barrier lets the ranks go up to a millisecond apart (each wakes
            // on its own socket); one more run, untimed, and a token round the ring twice
            // line them up to within a few message times.
            Communicator::Cpu(_) if iters > 0 => {
                for _ in 0..warmup {
                    op(self)?;
                }
                self.barrier()?;
                op(self)?;
                if let Communicator::Cpu(cpu) = &self.comm {
                    cpu.line_up().context("lining the ranks up for the timed runs")?;
                }
            }
            _ => self.barrier()?,
        }
        // NCCL's calls return once queued: stamping them would time the queue, not the calls.
        let mut stamps = matches!(self.comm, Communicator::Cpu(_)).then(|| single_calls::Stamps::new(iters));
        let (start, waited) = (Instant::now(), self.comm.waited());
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
        let issuing = start.elapsed().saturating_sub(self.comm.waited() - waited);
        self.issued = issuing.as_secs_f64() / iters.max(1) as f64;
        self.synchronize()?;
        Ok((start.elapsed().as_secs_f64() / iters.max(1) as f64, stamps))
    }

    /// How long this rank's last timed loop took to issue each call (before waiting for
    /// them: nccl-tests' cputime), in seconds.
    #[doc(hidden)]
    pub fn issue_time(&self) -> f64 {
        self.issued
    }
}
