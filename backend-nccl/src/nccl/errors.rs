//! Failures in words: an NCCL failure with the rank, what it was doing, NCCL's result
//! code and its own last error text; a CUDA driver error by name, running out of GPU
//! memory with what to do about it.

use super::Nccl;
use anyhow::anyhow;
use cudarc::nccl::sys::{self, ncclResult_t};
use std::ffi::CStr;

impl Nccl {
    /// An NCCL failure as a person needs it: which rank, doing what, NCCL's result code
    /// and NCCL's own last error text.
    pub(super) fn error(&self, r: ncclResult_t, what: impl std::fmt::Display) -> anyhow::Error {
        let text = last_error_text(self.comm.get());
        let text = if text.is_empty() {
            String::new()
        } else {
            format!(": {text}")
        };
        // 8 is ncclNumResults in the 2.24 bindings cudarc uses, ncclTimeout in NCCL 2.30.
        let code = match r {
            ncclResult_t::ncclNumResults => "result code 8 (ncclTimeout in NCCL 2.30)".to_string(),
            r => format!("{r:?}"),
        };
        anyhow!("rank {}: NCCL failed in {what} with {code}{text}", self.rank)
    }
}

/// NCCL's own text for the last error (`ncclGetLastError`).
fn last_error_text(comm: sys::ncclComm_t) -> String {
    // SAFETY: the library is loaded (we are reporting its error); a null communicator is allowed.
    let p = unsafe { sys::ncclGetLastError(comm) };
    if p.is_null() {
        return String::new();
    }
    // SAFETY: NCCL returns a NUL-terminated string it owns.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().trim().to_string()
}

/// A CUDA driver error in words, `out of memory (CUDA_ERROR_OUT_OF_MEMORY)`, instead of
/// cudarc's debug form; running out of GPU memory says what to do about it.
pub fn cuda_error(e: cudarc::driver::DriverError) -> anyhow::Error {
    use cudarc::driver::sys::CUresult;
    let words = e
        .error_string()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "an error cuGetErrorString does not name".into());
    // On a GPU node the other tenant is the usual cause (nvidia-smi shows it); simulated
    // GPUs keep their memory in the host's, where the usual cause is `ulimit -v`.
    let hint = match (e.0, crate::simulate::gpus()) {
        (CUresult::CUDA_ERROR_OUT_OF_MEMORY, None) => {
            ": the GPU has no room for the buffer (ask for less, or leave the GPU to this job: nvidia-smi \
             shows what else holds its memory)"
        }
        (CUresult::CUDA_ERROR_OUT_OF_MEMORY, Some(_)) => {
            ": the simulated GPU has no room for the buffer (simulated GPUs keep theirs in the host's memory: \
             ask for less, or raise ulimit -v)"
        }
        _ => "",
    };
    anyhow!("{words} ({:?}){hint}", e.0)
}

/// cudarc's NCCL errors say only "NcclError": this names the call and NCCL's result code.
/// For a lesson that calls NCCL through cudarc itself (`08-cudarc-allreduce`, through
/// `common::meeting::NcclResult`): here, beside the backend's own NCCL errors, so that
/// `common` never names cudarc.
pub trait NcclResult<T> {
    /// The error as "NCCL failed in `what` with ncclInvalidUsage".
    fn nccl(self, what: &str) -> anyhow::Result<T>;
}

impl<T> NcclResult<T> for std::result::Result<T, cudarc::nccl::result::NcclError> {
    fn nccl(self, what: &str) -> anyhow::Result<T> {
        self.map_err(|e| anyhow!("NCCL failed in {what} with {:?}", e.0))
    }
}
