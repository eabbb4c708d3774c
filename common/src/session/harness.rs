//! What the harness calls (`common::main`, the benchmark), not a lesson: hidden from the
//! session's documentation, so that a student's page holds what a lesson calls.

use super::{Session, print_out};
use crate::Communicator;
use crate::args::Format;
use anyhow::{Result, anyhow};
use std::collections::BTreeMap;
use std::time::Duration;
use workbook_cpu::transport::Via;
use workbook_nccl::device::{self};
use workbook_runtime::error::SharedError;
use workbook_runtime::failure::{self, Fact};
use workbook_runtime::units::human_bytes;

impl Session {
    /// Checks, before anything is allocated, that `bytes` per rank (its buffers at their
    /// peak) fit in the memory this host has available, every rank of the host taking as
    /// much; `what` names the flag that asked for them. Without it a too large `--size`
    /// ends as "killed by signal 9" (the out-of-memory killer). This process's own limit
    /// of address space (`ulimit -v`) counts too: past it an allocation fails. On the CPU
    /// backend and on simulated GPUs (whose device memory is this host's, half as much
    /// again), not on real GPUs: NCCL's buffers live there. Every rank calls it at the
    /// same point, and the ranks decide together: one that is short refuses for all, in
    /// one line said once, rather than each saying its own or the others failing on it.
    #[doc(hidden)]
    pub fn ensure_memory(&mut self, bytes: u64, what: &str) -> Result<()> {
        let simulated = workbook_nccl::simulate::gpus().is_some();
        if self.comm.name() != "cpu" && !simulated {
            return Ok(());
        }
        // The test hook `NCCL_WORKBOOK_FAULT=no-memory-check`: buffers are made unchecked,
        // so that a refused allocation can be seen failing as it must (in one line).
        if workbook_runtime::fault::asked("no-memory-check", None).is_some() {
            return Ok(());
        }
        let bytes = if simulated {
            bytes.saturating_add(bytes / 2)
        } else {
            bytes
        };
        let short = self.memory_short(bytes, what).unwrap_or_default();
        let key = self.next_key("memory");
        let all = self.share_here(&key, short.as_bytes(), "whether every rank has the memory")?;
        match all.iter().find(|said| !said.is_empty()) {
            Some(said) => Err(SharedError {
                message: String::from_utf8_lossy(said).into_owned(),
                usage: true,
            }
            .into()),
            None => Ok(()),
        }
    }

    /// Why this rank cannot hold `bytes` (see [`Session::ensure_memory`]), if it cannot.
    fn memory_short(&self, bytes: u64, what: &str) -> Option<String> {
        let rank = self.rank();
        if let Some((limit, left)) = workbook_runtime::limits::address_space_left()
            && bytes > left
        {
            return Some(format!(
                "{what}: rank {rank} would hold {} in buffers, and its address space is limited to {} \
                 (ulimit -v, RLIMIT_AS), {} of it left: ask for less, or raise the limit",
                human_bytes(bytes as usize),
                human_bytes(limit as usize),
                human_bytes(left as usize)
            ));
        }
        let host = &self.members[rank].host;
        let local = self.members.iter().filter(|m| &m.host == host).count() as u64;
        let need = bytes.saturating_mul(local);
        let free = device::available_memory()?;
        (need > free).then(|| {
            format!(
                "{what}: {local} rank(s) on {host} would hold {} in buffers, and it has {} of memory available: \
                 ask for less, or start fewer ranks per host",
                human_bytes(need as usize),
                human_bytes(free as usize)
            )
        })
    }

    /// Every rank's `value`, in rank order, on every rank (`what` names it in errors).
    #[doc(hidden)]
    pub fn share_f64(&mut self, value: f64, what: &str) -> Result<Vec<f64>> {
        self.say_p2p()?;
        let key = self.next_key("gather");
        let all = self.share_here(&key, &value.to_le_bytes(), what)?;
        let participants = self.participants();
        all.iter()
            .zip(participants)
            .map(|(b, r)| {
                b.as_slice()
                    .try_into()
                    .map(f64::from_le_bytes)
                    .map_err(|_| anyhow!("rank {r} sent a malformed {what}"))
            })
            .collect()
    }

    /// The name of this session's backend: `cpu` or `nccl`.
    #[doc(hidden)]
    pub fn backend_name(&self) -> &'static str {
        self.comm.name()
    }

    /// One line per rank saying where it runs, as nccl-tests' `#  Rank  0 Pid ... on
    /// host device ...` lines.
    #[doc(hidden)]
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

    /// The run's report so far: who runs where, the backend, NCCL's version (for the
    /// benchmark's `-J`, which writes them in nccl-tests' layout).
    #[doc(hidden)]
    pub fn run_report(&self) -> &crate::report::Report {
        &self.report
    }

    /// `--link`: the simulated network the TCP links take the time of ("5 µs, 10 Gbit/s").
    #[doc(hidden)]
    pub fn simulated_link(&self) -> Option<&str> {
        self.report.simulated_link.as_deref()
    }

    /// How pairs of ranks exchange data on the CPU backend ("0-1": shm), for headers.
    #[doc(hidden)]
    pub fn transports(&self) -> &BTreeMap<String, Via> {
        &self.report.transports
    }

    /// Whether this rank's large collectives read the other ranks' buffers where they lie
    /// (CPU backend, one host: [`workbook_cpu::host_memory`]).
    #[doc(hidden)]
    pub fn single_copy(&self) -> bool {
        matches!(&self.comm, Communicator::Cpu(c) if c.reads_peers())
    }

    /// On the CPU backend, this rank's share of its host's last-level cache, in bytes
    /// ([`workbook_cpu::Comm::cache_share`]); `None` on NCCL (GPU memory).
    #[doc(hidden)]
    pub fn cache_share(&self) -> Option<usize> {
        match &self.comm {
            Communicator::Cpu(c) => Some(c.cache_share()),
            Communicator::Nccl(_) => None,
        }
    }

    /// On the CPU backend, this rank's share of its core's own cache, where it is smaller
    /// than 3/4 of the last-level share ([`workbook_cpu::Comm::core_cache_share`]).
    #[doc(hidden)]
    pub fn core_cache_share(&self) -> Option<usize> {
        match &self.comm {
            Communicator::Cpu(c) => c.core_cache_share(),
            Communicator::Nccl(_) => None,
        }
    }

    /// Which algorithm ran the last collective: the tuner's name on the CPU backend
    /// ([`workbook_cpu::tuner`]); on NCCL, NCCL's own choice as it printed it
    /// (`ring`, `tree`, ...: [`workbook_nccl::nccl_log`], on rank 0), else "NCCL's choice".
    #[doc(hidden)]
    pub fn algorithm(&self) -> &'static str {
        if self.hand_written {
            return "hand-written calls";
        }
        match &self.comm {
            Communicator::Cpu(c) => c.last_algorithm().map_or("?", |a| a.name()),
            Communicator::Nccl(n) => n.choice().map_or("NCCL's choice", |(algo, _)| algo),
        }
    }

    /// The protocol of the last collective (LL, LL128, Simple): the tuner's on the CPU
    /// backend, NCCL's own where it printed it (as for [`Session::algorithm`]).
    #[doc(hidden)]
    pub fn protocol(&self) -> Option<workbook_cpu::tuner::Protocol> {
        use workbook_cpu::tuner::Protocol;
        match &self.comm {
            Communicator::Cpu(c) => c.last_protocol(),
            Communicator::Nccl(n) => {
                let (_, proto) = n.choice()?;
                Protocol::ALL.into_iter().find(|p| p.name() == proto)
            }
        }
    }

    /// NCCL's cost model for `coll`, from its TUNING table (see
    /// [`workbook_nccl::nccl_log`]): `None` off NCCL, empty where NCCL printed none here.
    #[doc(hidden)]
    pub fn nccl_costs(&self, coll: &crate::collective::Collective) -> Option<Vec<workbook_nccl::nccl_log::Cost>> {
        match &self.comm {
            Communicator::Nccl(_) => Some(workbook_nccl::nccl_log::costs(
                coll.nccl_name().trim_start_matches("nccl"),
            )),
            Communicator::Cpu(_) => None,
        }
    }

    /// [`Session::algorithm`] as the `Time:` line says it: on NCCL, whose choice it was.
    pub(crate) fn algorithm_said(&self) -> String {
        match (&self.comm, self.algorithm()) {
            (Communicator::Nccl(_), "NCCL's choice") => "NCCL's choice".into(),
            (Communicator::Nccl(_), algo) => format!("NCCL's {algo}"),
            (_, algo) => algo.into(),
        }
    }

    /// Runs the collectives from now on as `NCCL_PROTO=nccl_proto` would (`None`: as the
    /// environment says): the benchmark's `-P`, one value per sweep, as
    /// [`Session::allow_algorithms`] for `-A`. A value that names no protocol, or leaves
    /// out Simple where some ranks talk over TCP, is the user's mistake, said in one line.
    #[doc(hidden)]
    pub fn allow_protocols(&mut self, nccl_proto: Option<&str>) -> Result<()> {
        use workbook_cpu::tuner::Protocols;
        let usage = |message: String| SharedError { message, usage: true };
        let cpu = match &mut self.comm {
            Communicator::Cpu(cpu) => cpu,
            Communicator::Nccl(_) => return self.run_as(None, nccl_proto),
        };
        let (protos, said) = match nccl_proto {
            Some(text) => (
                Protocols::parse(text).map_err(|why| usage(format!("-P {text}: {why}")))?,
                format!("-P {text}"),
            ),
            None => (
                Protocols::from_user(workbook_nccl::per_sweep::user_var("NCCL_PROTO")).map_err(usage)?,
                format!(
                    "NCCL_PROTO={}",
                    workbook_nccl::per_sweep::user_var("NCCL_PROTO").unwrap_or_default()
                ),
            ),
        };
        cpu.allow_protocols(protos, &said).map_err(usage)?;
        Ok(())
    }

    /// Runs the collectives from now on as `NCCL_ALGO=nccl_algo` would (`None`: as the
    /// environment says): the benchmark's `-A`, one value per sweep. A value the backend
    /// cannot run is the user's mistake, said in one line. On NCCL, which reads `NCCL_ALGO`
    /// only when a communicator starts, the variable is set and the communicator
    /// replaced by one split from it ([`Session::run_as`]; `None` leaves both as they are:
    /// nothing runs after the sweeps).
    #[doc(hidden)]
    pub fn allow_algorithms(&mut self, nccl_algo: Option<&str>) -> Result<()> {
        use workbook_cpu::tuner::Allowed;
        let usage = |message: String| SharedError { message, usage: true };
        let cpu = match &mut self.comm {
            Communicator::Cpu(cpu) => cpu,
            Communicator::Nccl(_) => return self.run_as(nccl_algo, None),
        };
        let allowed = match nccl_algo {
            Some(text) => Allowed::parse(text).map_err(|why| usage(format!("-A {text}: {why}")))?,
            None => Allowed::from_user(workbook_nccl::per_sweep::user_var("NCCL_ALGO")).map_err(usage)?,
        };
        cpu.allow(allowed);
        Ok(())
    }

    /// Checks one value of `-A` (`algo`) or `-P` (`proto`) before any sweep runs: on the
    /// CPU backend by allowing it ([`Session::allow_algorithms`], which the sweep does
    /// again); on NCCL against the NCCL that loaded, without starting anything.
    #[doc(hidden)]
    pub fn check_per_sweep(&mut self, algo: Option<&str>, proto: Option<&str>) -> Result<()> {
        if let Communicator::Cpu(_) = &self.comm {
            return self.run_as(algo, proto);
        }
        per_sweep_values(algo, proto).try_for_each(|(name, flag, value)| self.nccl_value_ok(name, flag, value))
    }

    /// Whether NCCL can take `value` for `name` per sweep: the variable was made ready
    /// before NCCL loaded ([`workbook_nccl::per_sweep`]), and the NCCL that loaded knows
    /// the value's names. Else the user's mistake, in one line.
    fn nccl_value_ok(&self, name: &str, flag: &str, value: &str) -> Result<()> {
        let usage = |message: String| SharedError { message, usage: true };
        workbook_nccl::per_sweep::can_set(name, value).map_err(|why| usage(format!("{flag} {value}: {why}")))?;
        if let Some(version) = self.report.nccl_version.as_deref() {
            workbook_nccl::tuning::check_one(version, name, value)
                .map_err(|why| usage(format!("{flag} {value}: {why}")))?;
        }
        Ok(())
    }

    /// Runs the sweeps from now on as `NCCL_ALGO=algo` and `NCCL_PROTO=proto` would (each
    /// `None`: left as it is): the benchmark's `-A` and `-P`, one pair per pass. On the CPU
    /// backend the tuner is told ([`Session::allow_algorithms`],
    /// [`Session::allow_protocols`]). On NCCL, which reads both only when a communicator
    /// starts, both variables are set, then, where the communicator started under other
    /// values, it is replaced by one split from it, which NCCL tunes anew (the old one is
    /// then closed): one communicator per pass. Every rank of the communicator calls it at
    /// the same point.
    #[doc(hidden)]
    pub fn run_as(&mut self, algo: Option<&str>, proto: Option<&str>) -> Result<()> {
        if let Communicator::Cpu(_) = &self.comm {
            if algo.is_some() {
                self.allow_algorithms(algo)?;
            }
            if proto.is_some() {
                self.allow_protocols(proto)?;
            }
            return Ok(());
        }
        let asked = per_sweep_values(algo, proto);
        for (name, flag, value) in asked.clone() {
            self.nccl_value_ok(name, flag, value)?;
            workbook_nccl::per_sweep::set(name, value).map_err(|message| SharedError { message, usage: true })?;
        }
        let (rank, world, timeout) = (self.rank(), self.world_size(), self.timeout);
        let Communicator::Nccl(nccl) = &mut self.comm else {
            return Ok(());
        };
        if asked
            .clone()
            .all(|(name, _, value)| nccl.started_under(name) == Some(value))
        {
            return Ok(());
        }
        let said: Vec<String> = asked.map(|(_, flag, value)| format!("{flag} {value}")).collect();
        let said = said.join(" ");
        let watchdog = workbook_nccl::watchdog::Watchdog::new(&self.store, rank, world, timeout)?;
        let renewed = nccl
            .renewed(watchdog)
            .map_err(|e| e.context(format!("rank {rank}: {said}: a communicator started under it")))?;
        let mut old = std::mem::replace(nccl, Box::new(renewed));
        old.close().map_err(|e| {
            e.context(format!(
                "rank {rank}: {said}: closing the communicator of the pass before"
            ))
        })
    }

    /// Puts the benchmark's sweeps in the JSON report.
    #[doc(hidden)]
    pub fn set_perf(&mut self, mut sweeps: Vec<crate::report::Perf>) {
        match sweeps.len() {
            1 => self.report.perf = sweeps.pop(),
            _ => self.report.sweeps = sweeps,
        }
    }

    /// Names the split the benchmark ran on (`NCCL_TESTS_SPLIT`) in the JSON report.
    #[doc(hidden)]
    pub fn set_split(&mut self, split: serde_json::Value) {
        self.report.split = Some(split);
    }

    /// Adds one way of running a step to the JSON report (lesson 10).
    #[doc(hidden)]
    pub fn report_way(&mut self, way: serde_json::Value) {
        self.report.overlap.push(way);
    }

    /// Makes the run fail at the end with `message` (after the report is printed), as
    /// a failed check does; the first such message wins.
    #[doc(hidden)]
    pub fn fail_at_end(&mut self, message: String) {
        self.failed.get_or_insert(message);
    }

    /// Ends the session: waits until every rank is done (so none exits while another
    /// still needs it), then rank 0 prints the JSON report.
    #[doc(hidden)]
    pub fn finish(mut self) -> Result<()> {
        let rank = self.rank();
        self.flush_steps(true)?;
        self.send_trace()?;
        // The last meeting: every rank's point-to-point accounts, compared.
        let unreceived = self.settle_p2p()?;
        self.comm.close()?;
        // Rank 0 reads every rank's trace from its store: every rank put it there before
        // the last meeting, and none waits for rank 0 any more.
        let trace = self.gather_trace();
        workbook_runtime::rendezvous::leave(&mut self.store, self.server.as_ref(), self.timeout);
        // Written once the others are done: a file that cannot be written is the trace's
        // failure alone, said in one line; it never fails the run.
        self.write_trace(trace);
        if rank == 0 && self.format == Format::Json {
            print_out(&serde_json::to_string_pretty(&self.report)?);
        }
        // A message sent and never received: one line each, said by its sender.
        let mut said = unreceived.into_iter().map(|u| u.error()).collect::<Vec<_>>();
        let last = match self.failed {
            Some(message) => Some(SharedError { message, usage: false }.into()),
            None => said.pop(),
        };
        for line in said {
            workbook_runtime::error::say_line(&workbook_runtime::error::line(Some(rank), &line));
        }
        match last {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Adds to a failure the rank at fault, when that is another rank, and tells this
    /// rank's launcher (if any) whom it blames (`workbook_runtime::blame`), so that every launcher
    /// names the same rank. The store judges for every rank alike
    /// ([`workbook_runtime::rendezvous::Store::blame`]): the first rank lost (killed, crashed), else
    /// the rank whose heartbeat stopped (stopped or frozen), else the first rank that gave up
    /// (its own wait timed out; this rank says so too when its own wait did). A rank whose
    /// neighbour gave up waiting for a third one then names the third, not its neighbour.
    #[doc(hidden)]
    pub fn explain(&mut self, err: anyhow::Error) -> anyhow::Error {
        use workbook_runtime::blame::{named_in, tell_launcher};
        const STORE_GONE: &str = "which hosts the store, stopped answering or is gone";
        if workbook_runtime::error::is_shared(&err) || std::mem::replace(&mut self.explained, true) {
            return err;
        }
        let me = self.rank();
        // The store itself is lost: asking it anything would wait for nothing.
        if workbook_runtime::rendezvous::lost_the_store(&err) {
            return match me {
                0 => err,
                _ => {
                    tell_launcher(0, STORE_GONE);
                    failure::attach(err.context(format!("rank 0, {STORE_GONE}")), Fact::PeerLost(0))
                }
            };
        }
        // This rank's own wait timed out (nothing moved between it and this peer): it gives
        // up, and tells the store so once it knows what to say, so that its exit is no
        // crash in the others' eyes.
        let timed_out = workbook_runtime::error::link_failed(&err)
            .filter(|l| l.timed_out && l.peer != me)
            .map(|l| l.peer);
        // A message this rank sent and a peer went on without receiving: the cause.
        if let Some((line, unreceived)) = self.unreceived_at_failure() {
            if let Ok(mut store) = self.store.watcher(Duration::from_secs(1)) {
                give_up(&mut store, timed_out);
            }
            let err = err.context(line);
            return match unreceived {
                Some(to) => failure::attach(err, Fact::Unreceived { to }),
                None => err,
            };
        }
        // Already named (the NCCL backend's watchdog): the launcher hears it too.
        if workbook_runtime::error::names_culprit(&err) {
            let named = err
                .chain()
                .find_map(|e| e.downcast_ref::<workbook_runtime::error::Culprit>())
                .and_then(|c| named_in(&c.0));
            if let Some((r, why)) = named.filter(|(r, _)| *r != me) {
                tell_launcher(r, &why);
            }
            return err;
        }
        // This rank's own failure (a full /dev/shm, a refused allocation): another rank that
        // failed too, or first, is no cause of it. On the CPU backend, a failure that other
        // ranks caused comes from a link or from the store.
        let caused_by_others = workbook_runtime::error::link_failed(&err).is_some()
            || workbook_runtime::rendezvous::store_said(&err)
            || !matches!(self.comm, Communicator::Cpu(_));
        if !caused_by_others {
            return err;
        }
        // A peer's end closed: the store may learn that a killed rank's connection closed a
        // moment after its peers do. Ask it again for up to a second (a frozen rank 0 must
        // not hold this rank's exit back: each question waits a second at most).
        let patience = match workbook_runtime::error::link_failed(&err) {
            Some(link) if !link.timed_out => Duration::from_secs(1),
            _ => Duration::from_millis(100),
        };
        let quiet = workbook_runtime::heartbeat::quiet(self.timeout);
        let asked_at = std::time::Instant::now();
        let mut store = match self.store.watcher(Duration::from_secs(1)) {
            Ok(s) => s,
            Err(_) => return err,
        };
        let in_group = err.downcast_ref::<super::group::InGroup>().is_some();
        let err = loop {
            match store.blame(quiet) {
                // A rank that only gave up is no cause of a wait in a group that timed out
                // itself: the group's peer is nearer (below).
                Ok(Some(v)) if v.rank != me && !(v.gave_up && in_group && timed_out.is_some()) => {
                    tell_launcher(v.rank, &v.why);
                    let said = format!("rank {} {}", v.rank, v.why);
                    break failure::attach(err.context(said), Fact::Awaited(vec![v.rank]));
                }
                Ok(Some(v)) if v.rank == me => break err,
                Ok(_) if asked_at.elapsed() < patience => std::thread::sleep(Duration::from_millis(50)),
                // Nobody stopped: in a group, whose sends and receives progress together, the
                // peer that moved nothing is alive and waits elsewhere (a send or a receive
                // missing from its group). Outside one, a deadlock is as likely: the checker
                // and the lines of the ranks name it.
                Ok(_) => {
                    break match timed_out.filter(|_| in_group) {
                        Some(peer) => err.context(format!(
                            "rank {peer} is alive (the store hears from it) and waits elsewhere: nothing it sent or \
                                 received matched this rank's call for the whole --timeout (is a send or a receive \
                                 missing from its group, or are the calls in another order?)"
                        )),
                        None => err,
                    };
                }
                Err(_) if me != 0 => {
                    tell_launcher(0, STORE_GONE);
                    return failure::attach(err.context(format!("rank 0, {STORE_GONE}")), Fact::PeerLost(0));
                }
                Err(_) => return err,
            }
        };
        give_up(&mut store, timed_out);
        err
    }
}

/// Tells the store that this rank gives up, if its own wait timed out (nothing moved
/// between it and `peer`), whatever else it says of its failure: its exit is then no crash
/// to the ranks that lose it ([`workbook_runtime::rendezvous::Store::give_up`]).
fn give_up(store: &mut workbook_runtime::rendezvous::Store, timed_out: Option<usize>) {
    if let Some(peer) = timed_out {
        let _ = store.give_up(&format!(
            "nothing moved between it and rank {peer} for the whole --timeout"
        ));
    }
}

/// The `-A` and `-P` values given, each as (its variable, its flag, the value).
fn per_sweep_values<'v>(
    algo: Option<&'v str>,
    proto: Option<&'v str>,
) -> impl Iterator<Item = (&'static str, &'static str, &'v str)> + Clone {
    [("NCCL_ALGO", "-A", algo), ("NCCL_PROTO", "-P", proto)]
        .into_iter()
        .filter_map(|(name, flag, value)| Some((name, flag, value?)))
}
