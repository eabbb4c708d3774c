//! The NCCL version the double plays (`NCCL_DOUBLE_VERSION`), read once. A leaf: it uses
//! nothing of the crate but the root's `env_number` and `warn` (which use nothing of the
//! crate's modules), so that the modules that ask for the version (the exchange's cards,
//! the NCCL half's rules by version) do not reach each other through it.

use crate::warn;
use std::sync::OnceLock;

/// The NCCL version this process plays: `NCCL_DOUBLE_VERSION` (an NCCL version code such
/// as 21803 for 2.18.3, or 22105 for 2.21.5), by default 21803.
pub fn version() -> u32 {
    static V: OnceLock<u32> = OnceLock::new();
    *V.get_or_init(|| {
        let v = crate::env_number("NCCL_DOUBLE_VERSION", 21803);
        u32::try_from(v)
            .ok()
            .filter(|&v| v > 0 && v <= i32::MAX as u32)
            .unwrap_or_else(|| {
                warn(
                    None,
                    &format!("NCCL_DOUBLE_VERSION={v} is not a version code: using 21803"),
                );
                21803
            })
    })
}
