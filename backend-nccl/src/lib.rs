//! The NCCL backend: finding the driver and NCCL ([`nccl_library`]), the GPUs and which
//! rank gets which ([`device`]), the simulated GPUs of `--simulate-gpus` ([`simulate`]),
//! what killed processes left of either ([`leftovers`]), and a rank's NCCL
//! communicator ([`nccl::Nccl`]), whose every call is shown
//! ([`calls`]), polled ([`progress`]) and watched ([`watchdog`]) until it completes.
//! Names for Nsight Systems come from [`nvtx`]; `NCCL_ALGO` and `NCCL_PROTO` are checked
//! against the NCCL that loads by [`tuning`] (and changed between the benchmark's sweeps
//! by [`per_sweep`]); NCCL's other variables are read as NCCL reads them by [`nccl_env`];
//! what NCCL chose is read back from its own lines by [`nccl_log`]. Each collective's
//! NCCL call is in [`collectives`].

pub mod calls;
pub mod collectives;
pub mod device;
pub mod leftovers;
pub mod nccl;
pub mod nccl_env;
pub mod nccl_library;
pub mod nccl_log;
pub mod nvtx;
pub mod per_sweep;
pub mod progress;
pub mod simulate;
pub mod tuning;
pub mod watchdog;

use workbook_runtime::{deadline, element, error, heartbeat, launch, record, rendezvous, units};
