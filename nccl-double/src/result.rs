//! NCCL's results as the double reports them: the result codes, and a failure (a code
//! and a sentence). A leaf: the driver, the meeting folder and the NCCL half all use it,
//! and it uses none of them.

/// `ncclResult_t`. Only codes of NCCL 2.18's enum (0..=7) are ever returned: cudarc
/// turns the number into a Rust enum (with the 2.22 to 2.29 bindings, 8 is `ncclNumResults`,
/// which cudarc takes for success).
pub type NcclResult = std::ffi::c_uint;
pub const SUCCESS: NcclResult = 0;
pub const SYSTEM_ERROR: NcclResult = 2;
pub const INTERNAL_ERROR: NcclResult = 3;
pub const INVALID_ARGUMENT: NcclResult = 4;
pub const INVALID_USAGE: NcclResult = 5;
pub const REMOTE_ERROR: NcclResult = 6;
pub const IN_PROGRESS: NcclResult = 7;

/// Why an operation failed: the NCCL result and a sentence.
#[derive(Debug)]
pub struct Failure {
    pub code: NcclResult,
    pub why: String,
}

impl Failure {
    /// A failure with `code` saying `why`.
    pub fn new(code: NcclResult, why: impl Into<String>) -> Self {
        Self { code, why: why.into() }
    }
}
