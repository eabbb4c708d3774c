//! Launch: how a process learns which rank it is, and where the master is.
//!
//! Four ways, tried in this order (the most explicit wins):
//! 1. flags: `--world-size W --rank R [--master-addr A --master-port P]`, one process per
//!    rank started by hand, as in the multi-node Gloo/NCCL examples;
//! 2. torchrun's variables: `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`,
//!    `MASTER_ADDR`, `MASTER_PORT` (also what this program's own launcher sets);
//! 3. Slurm's: `SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`, `SLURM_NODEID`, with the
//!    master on the first host of the step (`SLURM_STEP_NODELIST`: a step may run on
//!    part of the allocation, and rank 0 is on the step's first node), else of the job
//!    (`SLURM_JOB_NODELIST`);
//! 4. none: the process becomes the launcher and starts the ranks itself (see
//!    [`crate::launcher`]).

pub mod hostlist;

use crate::error::usage;
pub use crate::secret::ENV_SECRET;
use crate::secret::Secret;
use anyhow::Result;

/// Set by this program's launcher for its ranks: the job's identity.
pub const ENV_JOB_ID: &str = "NCCL_WORKBOOK_JOB_ID";
/// Set by this program's launcher for its ranks, so they know who started them.
pub const ENV_LAUNCHED: &str = "NCCL_WORKBOOK_LAUNCHED";
/// torchrun's default master port, used when nothing names one.
pub const DEFAULT_PORT: u16 = 29500;

/// The command line's launch flags, the part of it [`resolve`] reads besides the
/// environment (`common::RunArgs::launch` gives them): no layer below the lessons' API
/// takes the whole command line.
#[derive(Debug, Clone, Default)]
pub struct Flags {
    /// `--nproc-per-node`: ranks to start on this machine.
    pub nproc_per_node: Option<u32>,
    /// `--nnodes`: machines, each running the same command.
    pub nnodes: u32,
    /// `--node-rank`: this machine's index among them.
    pub node_rank: u32,
    /// `--world-size`: with `--rank`, run as one rank of a world this size.
    pub world_size: Option<u32>,
    /// `--rank`: this process's rank.
    pub rank: Option<u32>,
    /// `--master-addr`: the host of rank 0 and its store.
    pub master_addr: Option<String>,
    /// `--master-port`: the store's port.
    pub master_port: Option<u16>,
    /// `--job-id`: the job's identity.
    pub job_id: Option<String>,
}

/// What this process is: the launcher of several ranks, or one rank.
#[derive(Debug, Clone, PartialEq)]
pub enum Role {
    /// Start `nproc_per_node` ranks on this machine and watch them.
    Launcher(Plan),
    /// Be one rank.
    Rank(Identity),
}

/// A launcher's plan: the ranks of this node, and where they meet.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Ranks on this node (`None`: the default of the backend).
    pub nproc_per_node: Option<usize>,
    /// Nodes in the job.
    pub nnodes: usize,
    /// This node's index.
    pub node_rank: usize,
    /// The master's address.
    pub master_addr: String,
    /// The master port (`None`: pick a free one; only when this is the only node).
    pub master_port: Option<u16>,
    /// The job's identity (`None`: make one up; only when this is the only node).
    pub job_id: Option<String>,
}

/// Who a rank is and where it meets the others.
#[derive(Debug, Clone, PartialEq)]
pub struct Identity {
    /// This rank, from 0 to `world_size - 1`.
    pub rank: usize,
    /// Number of ranks in the job.
    pub world_size: usize,
    /// Index among the ranks of this node, when the launcher said (else found at rendezvous).
    pub local_rank: Option<usize>,
    /// Ranks on this node, when the launcher said (else found at rendezvous).
    pub local_world_size: Option<usize>,
    /// The host of rank 0, where the store is.
    pub master_addr: String,
    /// The store's port.
    pub store_port: u16,
    /// The job's identity, checked when joining the store.
    pub job_id: String,
    /// The job's secret, asked of every join by the store when rank 0 has one: this
    /// program's launcher makes one for the ranks of one node, else the user may give one
    /// in [`ENV_SECRET`] ([`crate::secret`]).
    pub secret: Option<Secret>,
    /// Who started this rank.
    pub source: Source,
}

/// Who started a rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// `--rank`/`--world-size` flags.
    Flags,
    /// This program's own launcher.
    Launcher,
    /// torchrun (or anything else that sets its variables).
    Torchrun,
    /// Slurm's `srun`.
    Slurm,
}

impl Source {
    /// Whether every rank's output lands in one place (a terminal or a Slurm `.out`
    /// file), so that an error every rank hits alike need only be said by rank 0.
    pub fn shared_output(self) -> bool {
        !matches!(self, Source::Flags)
    }
}

/// Decides this process's role from the flags and the environment (`env` reads a variable).
pub fn resolve(args: &Flags, env: &dyn Fn(&str) -> Option<String>) -> Result<Role> {
    let role = resolve_unchecked(args, env)?;
    if let Role::Rank(id) = &role {
        let from = match id.source {
            Source::Flags => "--world-size",
            Source::Torchrun | Source::Launcher => "WORLD_SIZE",
            Source::Slurm => "SLURM_NTASKS",
        };
        crate::rank::check_world(id.world_size, from).map_err(usage)?;
    }
    Ok(role)
}

/// [`resolve`], before the world's size is checked against [`crate::rank::MAX_WORLD`].
fn resolve_unchecked(args: &Flags, env: &dyn Fn(&str) -> Option<String>) -> Result<Role> {
    let num = |name: &str| -> Result<Option<usize>> {
        env(name)
            .map(|v| {
                v.trim()
                    .parse::<usize>()
                    .map_err(|_| usage(format!("{name}={v:?} is not a number")))
            })
            .transpose()
    };
    // An IPv6 address may come bracketed, as in a URL (`[::1]`): the bare address is what
    // every later step (resolve, bind, connect) takes.
    let master_addr = || {
        let addr = args.master_addr.clone().or_else(|| env("MASTER_ADDR"))?;
        Some(match addr.strip_prefix('[').and_then(|a| a.strip_suffix(']')) {
            Some(bare) => bare.to_string(),
            None => addr,
        })
    };
    let master_port = || -> Result<Option<u16>> {
        match args.master_port {
            Some(p) => Ok(Some(p)),
            None => env("MASTER_PORT")
                .map(|v| {
                    v.trim()
                        .parse::<u16>()
                        .ok()
                        .filter(|p| *p > 0)
                        .ok_or_else(|| usage(format!("MASTER_PORT={v:?} is not a port")))
                })
                .transpose(),
        }
    };
    let launching = args.nproc_per_node.is_some() || args.nnodes > 1;
    // Read only where this process is a rank: a launcher hands its ranks their own.
    let secret = || -> Result<Option<Secret>> { env(ENV_SECRET).map(|v| Secret::given(&v).map_err(usage)).transpose() };

    // 1. Flags: one rank, started by hand.
    if let (Some(world), Some(rank)) = (args.world_size, args.rank) {
        let (world, rank) = (world as usize, rank as usize);
        check_rank(rank, world, "--rank")?;
        let addr = master_addr().unwrap_or_else(|| "127.0.0.1".into());
        let port = master_port()?.unwrap_or(DEFAULT_PORT);
        return Ok(Role::Rank(Identity {
            rank,
            world_size: world,
            local_rank: None,
            local_world_size: None,
            job_id: args
                .job_id
                .clone()
                .or_else(|| env(ENV_JOB_ID))
                .unwrap_or_else(|| format!("manual@{addr}:{port}")),
            secret: secret()?,
            master_addr: addr,
            store_port: port,
            source: Source::Flags,
        }));
    }

    // 2. torchrun's variables (or this program's launcher, which sets the same ones).
    match (num("RANK")?, num("WORLD_SIZE")?) {
        (Some(_), None) => {
            return Err(usage(
                "RANK is set but WORLD_SIZE is not: torchrun sets both (set WORLD_SIZE, or unset RANK)",
            ));
        }
        (None, Some(_)) => {
            return Err(usage(
                "WORLD_SIZE is set but RANK is not: torchrun sets both (set RANK, or unset WORLD_SIZE)",
            ));
        }
        _ => {}
    }
    if let (Some(rank), Some(world)) = (num("RANK")?, num("WORLD_SIZE")?) {
        if world == 0 {
            return Err(usage("WORLD_SIZE=0: a world needs at least one rank"));
        }
        check_rank(rank, world, "RANK")?;
        let ours = env(ENV_LAUNCHED).is_some();
        if let (false, Some(n)) = (ours, args.nproc_per_node) {
            return Err(usage(format!(
                "--nproc-per-node {n} with torchrun's RANK and WORLD_SIZE set: torchrun started this rank \
                 (its --nproc-per-node counts); drop the flag, or run without torchrun"
            )));
        }
        let addr = master_addr().unwrap_or_else(|| "127.0.0.1".into());
        let port = master_port()?.unwrap_or(DEFAULT_PORT);
        // torchrun's own agent already listens on MASTER_PORT: meet on the next port.
        let agent = env("TORCHELASTIC_USE_AGENT_STORE").is_some_and(|v| v.eq_ignore_ascii_case("true"));
        let store_port = if agent {
            port.checked_add(1)
                .ok_or_else(|| usage("MASTER_PORT=65535 leaves no port for the store (it uses MASTER_PORT+1)"))?
        } else {
            port
        };
        let run_id = env("TORCHELASTIC_RUN_ID").unwrap_or_else(|| "env".into());
        return Ok(Role::Rank(Identity {
            rank,
            world_size: world,
            local_rank: local_rank(num("LOCAL_RANK")?, num("LOCAL_WORLD_SIZE")?)?,
            local_world_size: num("LOCAL_WORLD_SIZE")?,
            job_id: args
                .job_id
                .clone()
                .or_else(|| env(ENV_JOB_ID))
                .unwrap_or_else(|| format!("torchrun:{run_id}@{addr}:{port}")),
            secret: secret()?,
            master_addr: addr,
            store_port,
            source: if ours { Source::Launcher } else { Source::Torchrun },
        }));
    }

    // 3. Slurm: one task per rank, started by srun (unless asked to launch per node).
    if let (Some(rank), Some(world), false) = (num("SLURM_PROCID")?, num("SLURM_NTASKS")?, launching) {
        check_rank(rank, world, "SLURM_PROCID")?;
        let job = env("SLURM_JOB_ID").unwrap_or_else(|| "0".into());
        let step = env("SLURM_STEP_ID").unwrap_or_else(|| "0".into());
        let addr = match master_addr() {
            Some(a) => a,
            None => {
                let (name, list) = ["SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"]
                    .into_iter()
                    .find_map(|name| env(name).map(|list| (name, list)))
                    .ok_or_else(|| usage("SLURM_PROCID is set but SLURM_JOB_NODELIST is not: set MASTER_ADDR"))?;
                // A malformed list is the environment's input being wrong: exit 2.
                hostlist::first(&list).map_err(|e| usage(format!("reading {name}: {e:#}")))?
            }
        };
        let port = match master_port()? {
            Some(p) => p,
            None => slurm_port(&job, &step),
        };
        // The step's own layout first, as for the nodes (SLURM_NODEID counts the step's nodes).
        let per_node = env("SLURM_STEP_TASKS_PER_NODE").or_else(|| env("SLURM_TASKS_PER_NODE"));
        let local_world_size = match (per_node, num("SLURM_NODEID")?) {
            (Some(spec), Some(node)) => hostlist::tasks_per_node(&spec)
                .map_err(|e| {
                    usage(format!(
                        "reading SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE: {e:#}"
                    ))
                })?
                .get(node)
                .copied(),
            _ => None,
        };
        return Ok(Role::Rank(Identity {
            rank,
            world_size: world,
            local_rank: num("SLURM_LOCALID")?,
            local_world_size,
            job_id: args.job_id.clone().unwrap_or_else(|| format!("slurm-{job}.{step}")),
            secret: secret()?,
            master_addr: addr,
            store_port: port,
            source: Source::Slurm,
        }));
    }

    // 4. Nothing says who we are: be the launcher, like `torchrun --nproc-per-node`.
    let (nnodes, node_rank) = (args.nnodes as usize, args.node_rank as usize);
    if node_rank >= nnodes {
        return Err(usage(format!(
            "--node-rank {node_rank} is outside --nnodes {nnodes} (0 to {})",
            nnodes - 1
        )));
    }
    let port = master_port()?;
    if nnodes > 1 && (port.is_none() || master_addr().is_none()) {
        return Err(usage(format!(
            "with --nnodes {nnodes}, every node needs the same --master-addr and --master-port \
             (the address of node 0 and a free port on it)"
        )));
    }
    Ok(Role::Launcher(Plan {
        nproc_per_node: args.nproc_per_node.map(|n| n as usize),
        nnodes,
        node_rank,
        master_addr: master_addr().unwrap_or_else(|| "127.0.0.1".into()),
        master_port: port,
        job_id: args.job_id.clone(),
    }))
}

/// `LOCAL_RANK`, checked against `LOCAL_WORLD_SIZE` when both are set.
fn local_rank(local: Option<usize>, local_world: Option<usize>) -> Result<Option<usize>> {
    match (local, local_world) {
        (Some(l), Some(w)) if l >= w => Err(usage(format!(
            "LOCAL_RANK {l} is not a local rank: LOCAL_WORLD_SIZE is {w}, so local ranks are 0 to {}",
            w.saturating_sub(1)
        ))),
        _ => Ok(local),
    }
}

fn check_rank(rank: usize, world: usize, what: &str) -> Result<()> {
    crate::rank::check(rank, world, what).map_err(usage)
}

/// The store's port for a Slurm step, derived from the job and step ids so that two
/// jobs sharing a node do not collide; it stays below Linux's ephemeral ports (32768+).
pub fn slurm_port(job: &str, step: &str) -> u16 {
    let job: u64 = job.parse().unwrap_or(0);
    let step: u64 = step.parse().unwrap_or(0);
    15000 + ((job.wrapping_mul(8).wrapping_add(step)) % 17000) as u16
}

/// Raises this process's soft limit of open files to its hard limit, as HPC programs do
/// at start (a rank holds a descriptor per peer and per shared-memory channel; a shell's
/// default soft limit, 1024 or less, runs out long before the hard one). Whatever this
/// process starts inherits it. Returns the soft limit now in force.
pub fn raise_open_files_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit, which `lim` is; RLIMIT_NOFILE always exists.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return 0;
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit reads one rlimit; raising the soft limit up to the hard one is
        // always allowed, and a refusal leaves the limit as it was.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            return raised.rlim_cur;
        }
    }
    lim.rlim_cur
}

/// This machine's name: the node name Slurm gave the task (the same as the hostname on
/// a cluster, and what tells emulated nodes apart), else the hostname.
pub fn hostname() -> String {
    std::env::var("SLURMD_NODENAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}
