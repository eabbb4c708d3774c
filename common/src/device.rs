//! Devices: which device each rank uses, and what this machine has.
//!
//! The course's rule is `device = rank % device_count`: with 4 GPUs per node and ranks
//! placed node by node, ranks 0-3 take GPUs 0-3 of the first node, ranks 4-7 GPUs 0-3 of
//! the second. On the CPU backend the "devices" are host buffers, `cpu:0`, `cpu:1`...,
//! one per rank of the node.
//!
//! The probe asks, in order, for the CUDA driver library, its GPUs and libnccl, checking
//! each library is there before cudarc touches it (cudarc panics on a missing library).

use crate::args::BackendChoice;
use anyhow::{Result, bail};

/// The course's rule: the device a rank uses.
pub fn device_for(rank: usize, device_count: usize) -> usize {
    rank % device_count.max(1)
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
    /// libnccl loads, and its version.
    pub nccl: Option<String>,
}

/// Looks for the driver, its GPUs and NCCL, without ever letting cudarc panic.
pub fn probe() -> Probe {
    // SAFETY: only tries to load the library by name.
    let mut p = Probe {
        driver: unsafe { cudarc::driver::sys::is_culib_present() },
        ..Probe::default()
    };
    if p.driver {
        match cudarc::driver::CudaContext::device_count() {
            Ok(n) => p.gpus = n.max(0) as usize,
            Err(e) => p.driver_error = Some(format!("{e:?}")),
        }
    }
    // SAFETY: only tries to load the library by name.
    if unsafe { cudarc::nccl::sys::is_culib_present() } {
        p.nccl = Some(crate::backend::nccl::version().unwrap_or_else(|e| format!("unknown version ({e})")));
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
/// Asking for NCCL where it cannot run is an error naming the missing piece.
pub fn choose(choice: BackendChoice, p: &Probe) -> Result<(Kind, String)> {
    let missing = if !p.driver {
        Some("the CUDA driver (libcuda.so) is not on this machine: there is no NVIDIA GPU here, or its driver is not installed".to_string())
    } else if p.gpus == 0 {
        let why = p.driver_error.as_deref().map(|e| format!(" ({e})")).unwrap_or_default();
        Some(format!(
            "the CUDA driver sees no GPU{why}: on a cluster, ask for one (e.g. --gres=gpu:1)"
        ))
    } else if p.nccl.is_none() {
        Some(format!(
            "found {} but no libnccl: install NCCL (e.g. `pip install nvidia-nccl-cu12`), or point NCCL_LIBRARY at libnccl.so.2",
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
        (BackendChoice::Nccl, Some(why)) => bail!("--backend nccl cannot run here: {why}"),
        (BackendChoice::Auto, Some(why)) => Ok((Kind::Cpu, format!("backend: cpu, because {why}"))),
        (_, None) => Ok((
            Kind::Nccl,
            format!(
                "backend: nccl, found {} and NCCL {}",
                gpus(p.gpus),
                p.nccl.as_deref().unwrap_or("?")
            ),
        )),
    }
}

fn gpus(n: usize) -> String {
    if n == 1 { "1 GPU".into() } else { format!("{n} GPUs") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_course_rule() {
        let devices: Vec<usize> = (0..6).map(|r| device_for(r, 4)).collect();
        assert_eq!(devices, [0, 1, 2, 3, 0, 1]);
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
            nccl: Some("2.18.3".into()),
            ..Probe::default()
        };
        let (kind, why) = choose(BackendChoice::Auto, &all).unwrap();
        assert_eq!(
            (kind, why.as_str()),
            (Kind::Nccl, "backend: nccl, found 4 GPUs and NCCL 2.18.3")
        );
    }
}
