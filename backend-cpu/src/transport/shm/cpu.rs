//! What the link asks of the CPU: which core this thread runs on, a rank bound to a core
//! of its own, cache lines asked for ahead (`prefetch`, and `prefetchw` where CPUID says
//! the CPU has it), and copies whose stores go around the cache (non-temporal).

use std::sync::atomic::Ordering::*;

/// Asks the CPU to bring the cache line at `line` into this core's cache, without waiting
/// for it: a hint, which never faults and changes no memory.
#[inline]
pub(super) fn prefetch(line: *const i8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing into a register and cannot fault, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(line)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = line;
}

/// Asks the CPU to bring the cache line at `line` into this core's cache for writing
/// (`prefetchw`: taking it from the other cores' caches), without waiting for it: a
/// hint, which never faults and changes no memory. Only where the CPU has the
/// instruction ([`has_prefetch_for_write`]).
#[inline]
pub(super) fn prefetch_for_write(line: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the caller checked that the CPU has `prefetchw` (has_prefetch_for_write),
    // which reads nothing into a register, writes no memory and cannot fault, whatever
    // the address.
    unsafe {
        std::arch::asm!("prefetchw [{0}]", in(reg) line, options(nostack, preserves_flags, readonly))
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = line;
}

/// Whether this CPU has `prefetchw` (CPUID leaf 0x8000_0001, ECX bit 8: every AMD
/// x86-64 CPU, Intel's since Broadwell).
pub(super) fn has_prefetch_for_write() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::__cpuid;
        // A safe function in recent Rust, an unsafe one in older.
        // SAFETY: CPUID exists on every x86-64 CPU and only reads registers; a leaf past the
        // highest one returns other data, not a fault, and `max` decides whether ECX counts.
        #[allow(unused_unsafe)]
        let (max, ecx) = unsafe { (__cpuid(0x8000_0000).eax, __cpuid(0x8000_0001).ecx) };
        max >= 0x8000_0001 && ecx & (1 << 8) != 0
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The core this thread runs on, plus one (0 when the system cannot say).
pub(super) fn current_cpu() -> u32 {
    // SAFETY: no arguments; returns -1 on failure.
    let cpu = unsafe { libc::sched_getcpu() };
    u32::try_from(cpu).map_or(0, |c| c + 1)
}

/// Binds this thread (the rank's main thread, and the threads it starts from now on) to
/// the `index`-th of the cores it may run on, when there are at least `ranks` of them:
/// each of a host's ranks on a core of its own, as Open MPI binds ranks to cores by
/// default. Left to itself the scheduler may put two ranks on one core (it wakes a process
/// where its waker runs, and leaves recently run processes where they are, for their
/// caches), where they take turns instead of answering each other within a fraction of
/// a microsecond: small collectives then cost 10 to 30 times more, for a whole run. A
/// rank that was given fewer cores (by `taskset`, Slurm or mpirun) is left as it is.
pub(super) fn bind_to_own_core(index: usize, ranks: usize) {
    if let Some(core) = bind(index, ranks) {
        BOUND.store(core as i64, Relaxed);
    }
}

/// The core this rank bound itself to ([`bind_to_own_core`]), if it did: what
/// `NCCL_DEBUG=INFO` says, as NCCL prints a rank's CPU affinity.
pub fn bound_core() -> Option<usize> {
    usize::try_from(BOUND.load(Relaxed)).ok()
}

/// The core of [`bound_core`], -1 when none.
static BOUND: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(-1);

/// Binds this thread to the `index`-th of the cores it may run on, when there are at
/// least `ranks` of them; returns that core.
fn bind(index: usize, ranks: usize) -> Option<usize> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity/sched_setaffinity read and write
    // only the set we pass, of the size we pass; failures leave the affinity unchanged.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return None;
        }
        let allowed: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
            .filter(|c| libc::CPU_ISSET(*c, &set))
            .collect();
        if allowed.len() < ranks {
            return None;
        }
        let core = *allowed.get(index)?;
        let mut mine: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(core, &mut mine);
        (libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &mine) == 0).then_some(core)
    }
}

/// `dst.copy_from_slice(src)` with non-temporal (streaming) stores where the CPU has
/// them: the destination's lines are written straight to memory, not read into the cache
/// first and written back later.
pub fn copy_around_cache(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len());
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
        // The part of dst that starts on a 16-byte boundary and spans whole 64-byte blocks.
        let head = dst.as_ptr().align_offset(16).min(dst.len());
        let body = (dst.len() - head) / 64 * 64;
        dst[..head].copy_from_slice(&src[..head]);
        // SAFETY: SSE2 is part of x86_64. Every access is within dst[head..head + body]
        // and src[head..head + body]; stores are 16-byte aligned; loads may be unaligned.
        unsafe {
            let (d, s) = (dst.as_mut_ptr().add(head), src.as_ptr().add(head));
            for i in (0..body).step_by(64) {
                for k in (0..64).step_by(16) {
                    let v = _mm_loadu_si128(s.add(i + k).cast::<__m128i>());
                    _mm_stream_si128(d.add(i + k).cast::<__m128i>(), v);
                }
            }
            _mm_sfence(); // streaming stores are weakly ordered: finish them before going on
        }
        dst[head + body..].copy_from_slice(&src[head + body..]);
    }
    #[cfg(not(target_arch = "x86_64"))]
    dst.copy_from_slice(src);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streaming_copies_are_exact_at_every_alignment() {
        let src: Vec<u8> = (0..1000).map(|i| (i * 7) as u8).collect();
        let mut dst = vec![0u8; 1100];
        for start in 0..20 {
            for len in [0, 1, 15, 16, 63, 64, 65, 200, 999 - start] {
                dst.fill(0);
                copy_around_cache(&mut dst[start..start + len], &src[..len]);
                assert_eq!(&dst[start..start + len], &src[..len], "at {start}, {len} bytes");
                assert!(dst[..start].iter().chain(&dst[start + len..]).all(|b| *b == 0));
            }
        }
    }
}
