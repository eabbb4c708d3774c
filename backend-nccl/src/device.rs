//! Devices: which device each rank uses, and what this machine has.
//!
//! The course's rule is `device = rank % device_count`: with 4 GPUs per node and ranks
//! placed node by node, ranks 0-3 take GPUs 0-3 of the first node, ranks 4-7 GPUs 0-3 of
//! the second. On the CPU backend the "devices" are host buffers, `cpu:0`, `cpu:1`...,
//! one per rank of the node. `--device-rule local-rank` uses the local rank instead,
//! right for any placement (`srun --distribution=cyclic` deals ranks out like cards, and
//! then `rank % device_count` puts two ranks of a node on one GPU). Every lesson picks its
//! device here, by [`device_for`].
//!
//! The probe asks, in order, for the CUDA driver library, its GPUs and libnccl, checking
//! each library is there before cudarc touches it (cudarc panics on a missing library).
//!
//! "Its GPUs" are the ones `CUDA_VISIBLE_DEVICES` lets this process see: Slurm's
//! `--gpus-per-task=1` gives every task its own GPU as its device 0, so that
//! `rank % device_count` is 0 everywhere and yet every rank has a GPU of its own. The
//! ranks then compare the GPUs themselves ([`gpu`]), as NCCL does.

pub mod gpu;

use crate::error::usage;
use crate::launch::Identity;
use crate::nccl_library::{Loaded, OLDEST};
use crate::rendezvous::Store;
use anyhow::{Result, bail};

/// Which backend to use (`--backend`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendChoice {
    /// NCCL when it can run here, else the CPU backend (and say why).
    Auto,
    /// Ring algorithms between processes (shared memory, TCP): runs anywhere.
    Cpu,
    /// NVIDIA's NCCL on GPUs, through cudarc.
    Nccl,
}

/// Which number picks a rank's device among its node's (`--device-rule`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DeviceRule {
    /// The course's rule, device = rank % device_count: right when ranks are placed node
    /// by node, in blocks of device_count.
    #[default]
    Rank,
    /// device = local_rank % device_count: right for any placement (e.g. `srun
    /// --distribution=cyclic`).
    LocalRank,
}

impl DeviceRule {
    /// The rule as a formula, for messages: `rank % device_count`.
    pub fn formula(self) -> &'static str {
        match self {
            DeviceRule::Rank => "rank % device_count",
            DeviceRule::LocalRank => "local_rank % device_count",
        }
    }
}

/// The flag that picks the local rank's rule, as messages name it.
pub const LOCAL_RANK_RULE: &str = "--device-rule local-rank (or NCCL_WORKBOOK_DEVICE_RULE=local-rank)";

/// The device a rank uses, by `rule`: `rank % device_count` (the course's rule) or
/// `local_rank % device_count`.
pub fn device_for(rule: DeviceRule, rank: usize, local_rank: usize, device_count: usize) -> usize {
    let n = match rule {
        DeviceRule::Rank => rank,
        DeviceRule::LocalRank => local_rank,
    };
    n % device_count.max(1)
}

/// Where a rank runs: its host, and its place among the ranks of that host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    /// The host's name ([`crate::launch::hostname`]).
    pub host: String,
    /// The rank's index among the ranks of its host.
    pub local_rank: usize,
    /// How many ranks its host runs.
    pub local_world: usize,
}

/// This rank's place. The launcher's word when it gave it (torchrun's `LOCAL_RANK`,
/// Slurm's `SLURM_LOCALID`), else found by comparing every rank's host name through the
/// store: the local rank is the rank's position among those of its host, in rank order
/// (as Slurm and torchrun number them).
pub fn place(store: &mut Store, id: &Identity) -> Result<Place> {
    let host = crate::launch::hostname();
    let hosts = store.share(
        "host",
        id.rank,
        id.world_size,
        host.as_bytes(),
        "every rank's host name",
    )?;
    let same_host: Vec<usize> = (0..id.world_size).filter(|r| hosts[*r] == host.as_bytes()).collect();
    let local_rank = id
        .local_rank
        .unwrap_or_else(|| same_host.iter().position(|r| *r == id.rank).unwrap_or(0));
    let local_world = id.local_world_size.unwrap_or(same_host.len());
    Ok(Place {
        host,
        local_rank,
        local_world,
    })
}

/// What the probe found on this machine.
#[derive(Debug, Clone, Default)]
pub struct Probe {
    /// The CUDA driver library (libcuda.so) loads.
    pub driver: bool,
    /// GPUs the driver reports (0 when the driver is missing or fails).
    pub gpus: usize,
    /// Why the driver reported no GPU, when it failed.
    pub driver_error: Option<String>,
    /// The libnccl that loads: its version and file.
    pub nccl: Option<Loaded>,
    /// Why libnccl is there but could not say its version.
    pub nccl_error: Option<String>,
    /// `CUDA_VISIBLE_DEVICES`, when set.
    pub visible: Option<String>,
    /// Where libnccl was looked for, when none was found
    /// ([`crate::nccl_library::looked_in`]).
    pub nccl_looked: Option<String>,
}

/// Looks for the driver, its GPUs and NCCL, without ever letting cudarc panic.
pub fn probe() -> Probe {
    // SAFETY: only tries to load the library by name.
    let mut p = Probe {
        driver: unsafe { cudarc::driver::sys::is_culib_present() },
        visible: std::env::var("CUDA_VISIBLE_DEVICES").ok(),
        ..Probe::default()
    };
    if p.driver {
        match cudarc::driver::CudaContext::device_count() {
            Ok(n) => p.gpus = n.max(0) as usize,
            Err(e) => p.driver_error = Some(format!("{e:?}")),
        }
    }
    if crate::nccl_library::cudarc_finds_nccl() {
        match crate::nccl_library::loaded() {
            Ok(lib) => p.nccl = Some(lib),
            Err(e) => p.nccl_error = Some(e.to_string()),
        }
    // SAFETY: only tries to load the library by name.
    } else if unsafe { cudarc::nccl::sys::is_culib_present() } {
        // What cudarc loads is not NCCL (a plugin named libnccl.so?): never call into it.
        p.nccl_error =
            Some("the libnccl.so cudarc loads by its own names is not NCCL (it has no ncclGetVersion)".into());
    } else {
        p.nccl_looked = Some(crate::nccl_library::looked_in(&|name| std::env::var_os(name)));
    }
    p
}

/// The backend that will run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The CPU backend.
    Cpu,
    /// NCCL.
    Nccl,
}

/// Picks the backend for `choice` from what `probe` found, and says why in one line.
/// Asking for NCCL where it cannot run is an error naming the missing piece; a
/// `CUDA_VISIBLE_DEVICES` that names GPUs the driver does not have is bad input.
pub fn choose(choice: BackendChoice, p: &Probe) -> Result<(Kind, String)> {
    if choice != BackendChoice::Cpu && p.driver {
        check_visible(p)?;
    }
    // An NCCL too old is a setup to change, not a machine without GPUs: bad input.
    let too_old = p.nccl.as_ref().filter(|l| !l.supported);
    let missing = if !p.driver {
        Some("the CUDA driver (libcuda.so) is not on this machine: there is no NVIDIA GPU here, or its driver is not installed".to_string())
    } else if p.gpus == 0 {
        let why = p.driver_error.as_deref().map(|e| format!(" ({e})")).unwrap_or_default();
        Some(format!(
            "the CUDA driver sees no GPU{why}: on a cluster, ask for one (e.g. --gres=gpu:1)"
        ))
    } else if let Some(e) = &p.nccl_error {
        Some(format!("found {} but libnccl failed: {e}", gpus(p.gpus)))
    } else if let Some(lib) = too_old {
        Some(format!(
            "found {} but {} is older than NCCL {OLDEST}, the oldest this workbook supports: \
             load a newer NCCL: `pip install nvidia-nccl-cu12` in an active virtual or conda environment \
             (searched before the libnccl.so the loader finds), or NCCL_LIBRARY=<a newer libnccl.so.2>",
            gpus(p.gpus),
            lib.describe()
        ))
    } else if p.nccl.is_none() {
        let looked = p.nccl_looked.as_deref().map(|l| format!("; {l}")).unwrap_or_default();
        Some(format!(
            "found {} but no libnccl: install NCCL (e.g. `pip install nvidia-nccl-cu12`), or point NCCL_LIBRARY at \
             libnccl.so.2{looked}",
            gpus(p.gpus)
        ))
    } else {
        None
    };
    match (choice, missing) {
        (BackendChoice::Cpu, _) => Ok((
            Kind::Cpu,
            "backend: cpu, as asked (--backend cpu): ring algorithms over shared memory and TCP".into(),
        )),
        (BackendChoice::Nccl, Some(why)) if too_old.is_some() => {
            Err(usage(format!("--backend nccl cannot run here: {why}")))
        }
        (BackendChoice::Nccl, Some(why)) if !p.driver => bail!(
            "--backend nccl cannot run here: {why} (with no GPU, --simulate-gpus N runs the same NCCL calls on \
             a simulator)"
        ),
        (BackendChoice::Nccl, Some(why)) => bail!("--backend nccl cannot run here: {why}"),
        (BackendChoice::Auto, Some(why)) => Ok((Kind::Cpu, format!("backend: cpu, because {why}"))),
        (_, None) if let Some(n) = crate::simulate::gpus() => Ok((
            Kind::Nccl,
            format!(
                "backend: nccl on {n} simulated GPUs (--simulate-gpus: the workbook's CUDA and NCCL simulator, \
                 nccl-double, in host memory: the calls are NCCL's, no figure is a GPU's)"
            ),
        )),
        (_, None) => Ok((
            Kind::Nccl,
            format!(
                "backend: nccl, found {} and {}",
                gpus(p.gpus),
                p.nccl.as_ref().map(Loaded::describe).unwrap_or_default()
            ),
        )),
    }
}

/// Refuses a `CUDA_VISIBLE_DEVICES` that hides GPUs by mistake. The driver reads the list
/// up to its first entry that names no GPU (or one already listed), so when it sees
/// fewer GPUs than the list has entries, the entry at that position is the culprit.
fn check_visible(p: &Probe) -> Result<()> {
    let Some(value) = &p.visible else { return Ok(()) };
    let to_cpu = "to run without GPUs, say --backend cpu";
    if value.trim().is_empty() {
        return Err(usage(format!(
            "CUDA_VISIBLE_DEVICES is set but empty, which hides every GPU from CUDA: unset it, or list the GPUs \
             to use (e.g. CUDA_VISIBLE_DEVICES=0,1); {to_cpu}"
        )));
    }
    let entries: Vec<&str> = value.split(',').map(str::trim).collect();
    let Some(bad) = entries.get(p.gpus) else { return Ok(()) };
    let seen = match p.gpus {
        0 => "no GPU is visible".to_string(),
        1 => "only 1 GPU is visible".to_string(),
        n => format!("only {n} GPUs are visible"),
    };
    Err(usage(format!(
        "CUDA_VISIBLE_DEVICES={}: the CUDA driver stops at {:?}, which is not a GPU of this node (an index from 0, \
         or a UUID as `nvidia-smi -L` shows it, each GPU once), so {seen}; list only GPUs that exist; {to_cpu}",
        crate::error::cut(value, 80),
        crate::error::cut(bad, 40)
    )))
}

fn gpus(n: usize) -> String {
    if n == 1 { "1 GPU".into() } else { format!("{n} GPUs") }
}

/// The memory this process may still take, in bytes: the kernel's `MemAvailable`, or less
/// when a cgroup (Slurm's, a container's) caps this process lower. `None` if unknown.
pub fn available_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    let host = kb * 1024;
    let read = |f: &str| std::fs::read_to_string(format!("/sys/fs/cgroup/{f}")).ok();
    let cap = read("memory.max")
        .and_then(|m| m.trim().parse::<u64>().ok())
        .map(|max| max.saturating_sub(read("memory.current").and_then(|c| c.trim().parse().ok()).unwrap_or(0)));
    Some(cap.map_or(host, |c| c.min(host)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_course_rule_and_the_local_ranks() {
        let devices: Vec<usize> = (0..6).map(|r| device_for(DeviceRule::Rank, r, 0, 4)).collect();
        assert_eq!(devices, [0, 1, 2, 3, 0, 1]);
        // Cyclic placement on 2 nodes of 2 GPUs: ranks 0, 2 on the first (local ranks 0, 1).
        let cyclic = [(0, 0), (1, 0), (2, 1), (3, 1)];
        let by_rank: Vec<usize> = cyclic
            .iter()
            .map(|&(r, l)| device_for(DeviceRule::Rank, r, l, 2))
            .collect();
        let by_local: Vec<usize> = cyclic
            .iter()
            .map(|&(r, l)| device_for(DeviceRule::LocalRank, r, l, 2))
            .collect();
        assert_eq!((by_rank, by_local), (vec![0, 1, 0, 1], vec![0, 0, 1, 1]));
    }

    #[test]
    fn auto_says_why_it_picked_the_cpu() {
        let none = Probe::default();
        let (kind, why) = choose(BackendChoice::Auto, &none).unwrap();
        assert_eq!(kind, Kind::Cpu);
        assert!(why.contains("CUDA driver (libcuda.so) is not on this machine"), "{why}");
        let e = choose(BackendChoice::Nccl, &none).unwrap_err().to_string();
        assert!(e.starts_with("--backend nccl cannot run here"), "{e}");
        let no_nccl = Probe {
            driver: true,
            gpus: 2,
            ..Probe::default()
        };
        let e = choose(BackendChoice::Nccl, &no_nccl).unwrap_err().to_string();
        assert!(e.contains("found 2 GPUs but no libnccl"), "{e}");
        let all = Probe {
            driver: true,
            gpus: 4,
            nccl: Some(nccl("2.18.3", true)),
            ..Probe::default()
        };
        let (kind, why) = choose(BackendChoice::Auto, &all).unwrap();
        assert_eq!(
            (kind, why.as_str()),
            (
                Kind::Nccl,
                "backend: nccl, found 4 GPUs and NCCL 2.18.3 (/lib/libnccl.so.2)"
            )
        );
    }

    fn nccl(version: &str, supported: bool) -> Loaded {
        Loaded {
            version: version.into(),
            supported,
            path: Some("/lib/libnccl.so.2".into()),
        }
    }

    #[test]
    fn an_nccl_too_old_is_refused_naming_both_versions() {
        let old = Probe {
            driver: true,
            gpus: 2,
            nccl: Some(nccl("2.17.1", false)),
            ..Probe::default()
        };
        let e = choose(BackendChoice::Nccl, &old).unwrap_err();
        assert!(crate::error::is_usage(&e), "{e}");
        let e = e.to_string();
        assert!(
            e.contains("NCCL 2.17.1 (/lib/libnccl.so.2) is older than NCCL 2.18.0")
                && e.contains("in an active virtual or conda environment (searched before the libnccl.so"),
            "{e}"
        );
        let (kind, why) = choose(BackendChoice::Auto, &old).unwrap();
        assert_eq!(kind, Kind::Cpu, "{why}");
    }

    #[test]
    fn cuda_visible_devices_naming_no_gpu_is_bad_input() {
        let with = |visible: &str, gpus: usize| Probe {
            driver: true,
            gpus,
            nccl: Some(nccl("2.18.3", true)),
            visible: Some(visible.into()),
            ..Probe::default()
        };
        for (visible, gpus, says) in [
            ("", 0, "CUDA_VISIBLE_DEVICES is set but empty"),
            ("-1", 0, "stops at \"-1\""),
            (
                "0,7",
                1,
                "stops at \"7\", which is not a GPU of this node (an index from 0, or a UUID as `nvidia-smi -L` shows it, each GPU once), so only 1 GPU is visible",
            ),
            ("GPU-0000dead", 0, "stops at \"GPU-0000dead\""),
        ] {
            for choice in [BackendChoice::Auto, BackendChoice::Nccl] {
                let e = choose(choice, &with(visible, gpus)).unwrap_err();
                assert!(crate::error::is_usage(&e), "{e}");
                assert!(e.to_string().contains(says), "{visible:?}: {e}");
            }
            // The CPU backend never looks.
            assert_eq!(choose(BackendChoice::Cpu, &with(visible, gpus)).unwrap().0, Kind::Cpu);
        }
        assert_eq!(choose(BackendChoice::Nccl, &with("2,0", 2)).unwrap().0, Kind::Nccl);
    }
}
