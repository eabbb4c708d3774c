//! A test double for the CUDA driver (`libcuda.so`) and NCCL (`libnccl.so`), on host
//! memory, used only by the workbook's tests.
//!
//! No machine of this project has a GPU, yet the NCCL path must not be code that nobody
//! ran. The tests put a folder first on `LD_LIBRARY_PATH` in which this one library is
//! linked under the names cudarc loads (`libcuda.so`, `libnccl.so`, ...), so the examples
//! run `--backend nccl` through cudarc's real loading path, as real processes. Device
//! memory is host memory; ranks meet through files in `/dev/shm`, so the collectives
//! really work across processes.
//!
//! It enforces the rules the real libraries enforce and a program could break: a CUDA
//! context current on the thread that makes or uses a communicator; ranks in range and
//! agreeing on the world; two ranks of one host never on one device ("Duplicate GPU");
//! every rank calling the same collective with the same count, type and root; buffers
//! that are live device allocations of the communicator's device.
//!
//! Limits: collectives complete when called (real NCCL only queues them), so a read on
//! another stream without a wait cannot be caught; no kernels, no f16.
//!
//! Safety catch: unless `NCCL_DOUBLE=1` is set, it refuses to act (cuInit says there is
//! no device), so it can never stand in for a real GPU by accident.

#![allow(clippy::missing_safety_doc)]

mod driver;
mod nccl;

use std::sync::OnceLock;

/// Whether this process may use the double (`NCCL_DOUBLE=1`), said once if not.
fn allowed() -> bool {
    static ALLOWED: OnceLock<bool> = OnceLock::new();
    *ALLOWED.get_or_init(|| {
        let ok = std::env::var("NCCL_DOUBLE").is_ok_and(|v| v == "1");
        if !ok {
            eprintln!(
                "nccl-double: refusing to act as CUDA/NCCL: NCCL_DOUBLE=1 is not set (this library is a test double)"
            );
        }
        ok
    })
}

/// Runs an entry point's body, turning a panic into `failed` (a panic must never
/// cross into C).
fn guard<R: Copy>(failed: R, body: impl FnOnce() -> R) -> R {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)).unwrap_or(failed)
}
