//! The clock every process under one kernel shares, and the kernel's identity: what the
//! recorder stamps events with and the store answers a rank's clock query with, so that a
//! trace can put every rank on one timeline.

/// The kernel's monotonic clock (CLOCK_MONOTONIC, which `std::time::Instant` reads on
/// Linux), in nanoseconds: one clock for every process under one kernel.
pub fn monotonic_ns() -> u64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `t` is a valid, writable timespec; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// This kernel's boot id (Linux): processes that share it share [`monotonic_ns`]'s
/// clock. Empty where there is none.
pub fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}
