//! The limits a process runs under (`ulimit -v`, `ulimit -n`), and buffers made without
//! aborting: an allocation the system refuses is an error of one line naming its size
//! and the limit, never Rust's "memory allocation failed" abort and its backtrace.

use crate::units::human_bytes;
use anyhow::{Result, anyhow};

/// The address space this process may still take under its `RLIMIT_AS` (`ulimit -v`):
/// `Some((limit, left))` in bytes, `None` when there is no such limit (or it is unknown).
pub fn address_space_left() -> Option<(u64, u64)> {
    let limit = limit(libc::RLIMIT_AS)?.0;
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let used_kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmSize:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some((limit, limit.saturating_sub(used_kb * 1024)))
}

/// The soft and hard values of `resource`; `None` when the soft one is unlimited.
fn limit(resource: libc::__rlimit_resource_t) -> Option<(u64, u64)> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit, which `lim` is.
    if unsafe { libc::getrlimit(resource, &mut lim) } != 0 || lim.rlim_cur == libc::RLIM_INFINITY {
        return None;
    }
    Some((lim.rlim_cur, lim.rlim_max))
}

/// The open files this process may hold (`ulimit -n`, once raised to the hard limit at
/// start), `None` when unlimited.
pub fn open_files() -> Option<u64> {
    limit(libc::RLIMIT_NOFILE).map(|(soft, _)| soft)
}

/// About how many descriptors a rank of a job of `world` ranks holds at most: two per
/// peer (pairs connect on first use, a TCP connection or a shared-memory channel each
/// way, so an all-to-all holds both), two more per rank for the one that hosts the store
/// (rank 0: its clients, each with its heartbeat's connection) and 64 for the connections
/// joining the store at once (past them, the store refuses newcomers as they come:
/// [`crate::rendezvous`]), and 16 of its own (arena, streams, the store's listener).
/// Measured on the CPU backend, one host of 16 ranks, when every pair shared one
/// connection: rank 0 held 3 × world + 9, the others world + 10.
pub fn files_needed(world: usize, hosts_store: bool) -> u64 {
    match hosts_store {
        true => 4 * world as u64 + crate::rendezvous::MAX_STRANGERS as u64 + 16,
        false => 2 * world as u64 + 16,
    }
}

/// Refuses, before anything starts, a job whose ranks would run out of descriptors:
/// `None` when the limit (already raised to the hard one) suffices, else the line to say.
/// `hosts_store`: whether rank 0 (which holds the most) is among this process's ranks.
pub fn open_files_short(world: usize, hosts_store: bool) -> Option<String> {
    let have = open_files()?;
    let need = files_needed(world, hosts_store);
    let who = if hosts_store { "rank 0" } else { "a rank" };
    let per = if hosts_store {
        "4 per rank: a connection each way, and the store's and heartbeat's, as it hosts them; 64 joining the store"
    } else {
        "2 per rank: a connection each way"
    };
    (have < need).then(|| {
        format!(
            "ulimit -n: a process here may hold {have} open files (its hard limit, which the soft one is raised \
             to at start), and {who} of a job of {world} ranks needs about {need} ({per}, and 16): raise the hard \
             limit (ulimit -Hn as root, /etc/security/limits.conf, or your scheduler's settings), or start fewer \
             ranks"
        )
    })
}

/// A vector with room for `len` elements, or an error of one line naming the size, what
/// it is for, and the limit that refused it (`ulimit -v`, else the memory available).
pub fn try_vec<T>(len: usize, what: &str) -> Result<Vec<T>> {
    let mut v = Vec::new();
    match v.try_reserve_exact(len) {
        Ok(()) => Ok(v),
        Err(_) => Err(anyhow!(
            "{what}: could not allocate {} ({len} elements): {}",
            human_bytes(len.saturating_mul(size_of::<T>())),
            why_refused()
        )),
    }
}

/// `len` elements, element `i` being `value(i)`, made as [`try_vec`] makes room.
pub fn try_collect<T>(len: usize, what: &str, value: impl Fn(usize) -> T) -> Result<Vec<T>> {
    let mut v = try_vec(len, what)?;
    v.extend((0..len).map(value));
    Ok(v)
}

/// A copy of `from`, made as [`try_vec`] makes room.
pub fn try_copy<T: Clone>(from: &[T], what: &str) -> Result<Vec<T>> {
    let mut v = try_vec(from.len(), what)?;
    v.extend_from_slice(from);
    Ok(v)
}

/// What limits this process's memory, for an allocation it was refused.
fn why_refused() -> String {
    match address_space_left() {
        Some((limit, left)) => format!(
            "this process's address space is limited to {} (ulimit -v, RLIMIT_AS), {} of it left: raise the \
             limit, or ask for less",
            human_bytes(limit as usize),
            human_bytes(left as usize)
        ),
        None => "the system refused it (out of memory): ask for less, or start fewer ranks per host".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_allocation_is_an_error_not_an_abort() {
        let e = try_vec::<u64>(usize::MAX / 8, "a test buffer").unwrap_err().to_string();
        assert!(e.starts_with("a test buffer: could not allocate"), "{e}");
        assert_eq!(try_collect(3, "three", |i| i * 2).unwrap(), [0, 2, 4]);
        assert_eq!(try_copy(&[1, 2], "two").unwrap(), [1, 2]);
    }
}
