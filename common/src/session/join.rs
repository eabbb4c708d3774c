//! Joining the job: the rendezvous, who else is there, the device and the backend, and
//! the checks that every rank runs the same command on the same backend.

use super::{Choice, Member, Session, p2p, print_out};
use crate::Communicator;
use crate::args::{Format, RunArgs};
use crate::report::{RankReport, Report};
use anyhow::Result;
use std::collections::BTreeMap;
use workbook_nccl::device::{self, Kind};
use workbook_runtime::error::SharedError;
use workbook_runtime::launch::Identity;
use workbook_runtime::rendezvous::Store;

/// Every rank must run the same backend, and on NCCL the same version: a rank on a node
/// without GPUs (or with another NCCL) would otherwise hang or corrupt the others.
pub(super) fn same_backend(store: &mut Store, rank: usize, world: usize, mine: &Choice) -> Result<()> {
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
pub(super) fn job_command() -> String {
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
pub(super) fn same_command(store: &mut Store, rank: usize, world: usize) -> Result<()> {
    let mine = job_command();
    let all = store.share("command", rank, world, mine.as_bytes(), "every rank's command")?;
    let all: Vec<String> = all.iter().map(|c| String::from_utf8_lossy(c).into_owned()).collect();
    match all.iter().enumerate().find(|(_, c)| **c != all[0]) {
        None => Ok(()),
        Some((r, other)) => Err(SharedError {
            message: format!(
                "rank 0 runs `{}` but rank {r} runs `{}`: every rank of a job runs the same command (is it \
                 another job on this port? give each job its own --job-id or --master-port)",
                workbook_runtime::error::cut(&all[0], 200),
                workbook_runtime::error::cut(other, 200)
            ),
            usage: true,
        }
        .into()),
    }
}

impl Session {
    /// Joins the job as the rank `id` describes: rendezvous, device, backend.
    #[doc(hidden)]
    pub fn init(id: Identity, run: &RunArgs) -> Result<Session> {
        let (rank, world) = (id.rank, id.world_size);
        // The backend: asked for, or what the probe finds (and why).
        let probe = if run.backend == crate::args::BackendChoice::Cpu {
            device::Probe::default()
        } else {
            device::probe()
        };
        let (kind, reason) = device::choose(run.backend, &probe)?;
        if kind == Kind::Nccl {
            check_nccl_tuning(&probe)?;
        }
        // The CPU backend, as this command line can ask for it.
        let cpu = match run.simulate_gpus {
            Some(_) => "leave out --simulate-gpus",
            None => "add --backend cpu",
        };
        if let (Some(path), Kind::Nccl) = (&run.draw, kind) {
            return Err(SharedError {
                message: format!(
                    "--draw {}: NCCL runs its collectives inside its own kernels, where this program cannot see \
                     them; the CPU backend runs the same collectives where it can draw them: {cpu}",
                    path.display()
                ),
                usage: true,
            }
            .into());
        }
        if let (Some(net), Kind::Nccl) = (run.link, kind) {
            return Err(SharedError {
                message: format!(
                    "--link ({}) simulates the CPU backend's TCP links; NCCL uses this machine's own network: \
                     leave --link out, or {cpu}",
                    net.describe()
                ),
                usage: true,
            }
            .into());
        }
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
        let (mut store, server) = workbook_runtime::rendezvous::meet(&id, run.timeout)?;
        same_command(&mut store, rank, world)?;

        // Who is where: local ranks come from the launcher, or from comparing hosts.
        let device::Place {
            host,
            local_rank,
            local_world,
        } = device::place(&mut store, &id)?;
        let backend_name = if kind == Kind::Nccl { "nccl" } else { "cpu" };
        let _ = crate::BACKEND.set(backend_name);
        let choice = Choice {
            backend: backend_name.into(),
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
                let setup = cpu_setup(run, rank)?;
                let (cpu, transports) = workbook_cpu::Cpu::connect(&mut store, &id, &host, setup)?;
                (Communicator::Cpu(Box::new(cpu)), format!("cpu:{dev}"), None, transports)
            }
            Kind::Nccl => {
                // With one GPU per Slurm task, every rank's device 0 is a GPU of its own:
                // the backend compares the GPUs themselves, not their numbers.
                let shown = workbook_nccl::calls::Shown::new(
                    rank,
                    run.show_calls.is_some_and(|s| s.shows(rank)),
                    run.format == Format::Json,
                );
                let nccl = workbook_nccl::nccl::Nccl::init(&mut store, &id, dev, &host, run.timeout, shown)?;
                let name = nccl.device_name();
                (
                    Communicator::Nccl(Box::new(nccl)),
                    format!("cuda:{dev}"),
                    Some(name),
                    BTreeMap::new(),
                )
            }
        };

        if let Some(net) = run.link.filter(|_| rank == 0 && run.format == Format::Text) {
            print_out(&format!(
                "network: simulated (--link): each TCP link sends at {} and delivers a message {} after its last \
                 byte leaves; shared memory is this machine's",
                net.bandwidth_text(),
                net.latency_text()
            ));
        }

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
            simulated_gpus: workbook_nccl::simulate::gpus().filter(|_| kind == Kind::Nccl),
            simulated_link: run.link.map(|n| n.describe()),
            split: None,
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
            comm: backend,
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
            draw: run.draw.clone().filter(|_| kind == Kind::Cpu),
            trace: run.trace.clone(),
            issued: 0.0,
            ledger: p2p::Ledger::new(world),
            scope: None,
            splits: 0,
            hand_written: false,
            explained: false,
        };
        session.say_transports();
        // Every rank leaves the rendezvous at about the same moment: the traces' common start.
        workbook_runtime::record::start(session.steps || session.draw.is_some(), session.trace.is_some());
        if session.trace.is_some() {
            crate::trace::start(&mut session.store, session.id.rank)?;
        }
        Ok(session)
    }
}

/// The variables that would override the workbook's communicator configs
/// (`NCCL_COMM_BLOCKING`, …: [`workbook_nccl::nccl::check_config_env`]), then
/// `NCCL_ALGO` and `NCCL_PROTO` against the NCCL that loads
/// ([`workbook_nccl::device::Probe::nccl`]): a name it does not know is the user's mistake, said
/// once, in one line (exit 2), before NCCL starts. The user's values first, then the
/// first sweep's where the benchmark's `-A` or `-P` set them
/// ([`workbook_nccl::per_sweep`]), named by their flag.
pub(crate) fn check_nccl_tuning(probe: &device::Probe) -> Result<()> {
    use workbook_nccl::per_sweep;
    let Some(version) = probe.nccl.as_ref().map(|l| l.version.clone()) else {
        return Ok(());
    };
    let usage = |message: String| SharedError { message, usage: true };
    workbook_nccl::nccl::check_config_env(&workbook_nccl::nccl_env::param).map_err(usage)?;
    workbook_nccl::tuning::check(&version, &per_sweep::user_var).map_err(usage)?;
    for (name, flag) in [("NCCL_ALGO", "-A"), ("NCCL_PROTO", "-P")] {
        let now = std::env::var(name).ok();
        if per_sweep::prepared(name) && now != per_sweep::user_var(name) {
            let value = now.unwrap_or_default();
            workbook_nccl::tuning::check_one(&version, name, &value)
                .map_err(|why| usage(format!("{flag} {value}: {why}")))?;
        }
    }
    Ok(())
}

/// How a rank of the CPU backend connects and chooses: its flags, and what the user's
/// `NCCL_ALGO` and `NCCL_PROTO` allow, read before anything connects (a name the CPU
/// backend lacks is the user's error, said in one line).
fn cpu_setup(run: &RunArgs, rank: usize) -> Result<workbook_cpu::cpu::Setup> {
    use workbook_cpu::tuner::{Allowed, Protocols};
    let usage = |message| SharedError { message, usage: true };
    let user = workbook_nccl::per_sweep::user_var;
    Ok(workbook_cpu::cpu::Setup {
        transport: run.transport,
        timeout: run.timeout,
        link: run.link,
        debug: rank == 0 && run.format == Format::Text && workbook_cpu::comm::debug_info(),
        allowed: Allowed::from_user(user("NCCL_ALGO")).map_err(usage)?,
        protos: (
            Protocols::from_user(user("NCCL_PROTO")).map_err(usage)?,
            user("NCCL_PROTO").unwrap_or_default(),
        ),
    })
}
