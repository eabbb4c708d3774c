//! Failures: how a CUDA or NCCL call that went wrong is said, in one line.

use cudarc::driver::DriverError;
use cudarc::nccl::result::{NcclError, NcclStatus};
use cudarc::nccl::sys;
use std::ffi::{CStr, c_char};

/// A failure, said as one line.
pub struct Fail(pub String);

impl From<DriverError> for Fail {
    fn from(e: DriverError) -> Self {
        Fail(format!("CUDA driver: {e:?}"))
    }
}

/// The CUDA driver's error of the call `what`, as a failure.
pub fn cuda(what: &str) -> impl FnOnce(DriverError) -> Fail + '_ {
    move |e| Fail(format!("{what} failed: {e:?}"))
}

/// NCCL's error with its name, NCCL's string for it and `ncclGetLastError`, read through
/// cudarc's `sys` bindings as the workbook does.
pub fn nccl(what: &str) -> impl FnOnce(NcclError) -> Fail + '_ {
    move |e| {
        let text = |p: *const c_char| {
            if p.is_null() {
                String::new()
            } else {
                // SAFETY: NCCL returns NUL-terminated strings that stay valid.
                unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
            }
        };
        // SAFETY: plain C calls; ncclGetLastError accepts a NULL communicator.
        let (s, last) = unsafe {
            (
                text(sys::ncclGetErrorString(e.0)),
                text(sys::ncclGetLastError(std::ptr::null_mut())),
            )
        };
        Fail(format!("{what} failed: {:?} ({s}): {last}", e.0))
    }
}

/// How an NCCL call ended, by name (`ncclSuccess`, `ncclInProgress`, `ncclInvalidUsage`...).
pub fn status(r: Result<NcclStatus, NcclError>) -> String {
    match r {
        Ok(NcclStatus::Success) => "ncclSuccess".into(),
        Ok(NcclStatus::InProgress) => "ncclInProgress".into(),
        Ok(NcclStatus::NumResults) => "ncclNumResults".into(),
        Err(e) => format!("{:?}", e.0),
    }
}

/// A call of cudarc's safe NCCL API named `what`, its value dropped and its error said as
/// [`nccl`] says it: the one wrapper of the safe API's calls.
pub fn checked<V>(what: &str, r: Result<V, NcclError>) -> Result<(), Fail> {
    r.map(drop).map_err(nccl(what))
}
