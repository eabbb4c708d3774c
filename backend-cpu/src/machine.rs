//! What the CPU backend reads of the machine it runs on: how many cores a rank may use
//! (`NCCL_WORKBOOK_CORES`, else the system's answer), and its caches as `/sys` lists them
//! (`NCCL_WORKBOOK_LLC`, `NCCL_WORKBOOK_L2` where set): the last-level cache, a core's
//! own cache below it, and how much of a rank's share its buffers can fill.

use crate::units;
use std::thread;

/// The last-level cache assumed where the machine does not say (`/sys`): 32 MiB.
pub(crate) const LLC_DEFAULT: usize = 32 << 20;

/// The cores this rank may run on: `NCCL_WORKBOOK_CORES` where set (a test, or a
/// machine whose cores are shared with other work), else what the system lets this
/// process use. A value the variable cannot mean is the user's error, said in one line.
pub(crate) fn cores() -> Result<usize, String> {
    match std::env::var("NCCL_WORKBOOK_CORES") {
        Ok(text) => match text.trim().parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!("NCCL_WORKBOOK_CORES={text}: a number of cores, at least 1")),
        },
        Err(_) => Ok(thread::available_parallelism().map_or(1, |n| n.get())),
    }
}

/// The size of this machine's last-level cache: `NCCL_WORKBOOK_LLC` where set (`32M`: a
/// machine whose cache is shared with other guests, or a test), else the largest of the
/// highest-level caches `/sys` lists for CPU 0, else [`LLC_DEFAULT`]. A value the
/// variable cannot mean is the user's error, said in one line.
pub(crate) fn last_level_cache() -> Result<usize, String> {
    if let Ok(text) = std::env::var("NCCL_WORKBOOK_LLC") {
        return units::parse_size(&text)
            .map(|b| b as usize)
            .map_err(|why| format!("NCCL_WORKBOOK_LLC: {why}"));
    }
    let largest = sys_caches().into_iter().map(|c| (c.level, c.size)).max();
    Ok(largest.map_or(LLC_DEFAULT, |(_, size)| size))
}

/// How much of a rank's `share` of the last-level cache its buffers can fill and still
/// run from the cache: 3/4 (the rest holds other lines, and lines do not leave in the
/// order they came; glibc's `memcpy` goes around the cache from 3/4 of it too,
/// `__x86_shared_non_temporal_threshold`). The benchmark's `--fit` counts a size's rows
/// as from memory from there.
pub fn cache_room(share: usize) -> usize {
    share / 4 * 3
}

/// One cache `/sys` lists for CPU 0: its level, its size, and how many CPUs share it.
struct SysCache {
    level: u32,
    size: usize,
    sharing: usize,
}

/// The caches `/sys` lists for CPU 0 (none where it lists none, or is hidden), each
/// entry that cannot be read left out.
fn sys_caches() -> Vec<SysCache> {
    let Ok(dir) = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache") else {
        return vec![];
    };
    let read = |p: &std::path::Path, f: &str| std::fs::read_to_string(p.join(f)).ok();
    dir.flatten()
        .filter_map(|e| {
            let p = e.path();
            Some(SysCache {
                level: read(&p, "level")?.trim().parse().ok()?,
                size: units::parse_size(&read(&p, "size")?).ok()? as usize,
                sharing: read(&p, "shared_cpu_list").map_or(1, |l| cpu_count(l.trim()).max(1)),
            })
        })
        .collect()
}

/// This rank's share of its core's own cache, one of `local` ranks on a host where it
/// may run on `cores` CPUs ([`cores`]): `NCCL_WORKBOOK_L2` where set (`0`: none), else
/// the largest cache `/sys` lists for CPU 0 below the last level (an L2), over the ranks
/// that share it (the ranks spread over those CPUs, each pinned to its own where it can
/// be; a cache shared by several CPUs is shared by their ranks). `None` where `/sys` lists
/// one level or none.
pub(crate) fn core_cache(local: usize, cores: usize) -> Result<Option<usize>, String> {
    if let Ok(text) = std::env::var("NCCL_WORKBOOK_L2") {
        if text.trim() == "0" {
            return Ok(None);
        }
        return units::parse_size(&text)
            .map(|b| Some(b as usize))
            .map_err(|why| format!("NCCL_WORKBOOK_L2 (a size, or 0 for none): {why}"));
    }
    let caches = sys_caches();
    let Some(last) = caches.iter().map(|c| c.level).max() else {
        return Ok(None);
    };
    let Some(below) = caches
        .iter()
        .filter(|c| c.level < last)
        .max_by_key(|c| (c.level, c.size))
    else {
        return Ok(None);
    };
    let caches_in_use = (cores / below.sharing).max(1);
    Ok(Some(below.size / local.max(1).div_ceil(caches_in_use)))
}

/// How many CPUs a `/sys` CPU list names (`0-3,8`: 5); a part it cannot read counts
/// none.
fn cpu_count(list: &str) -> usize {
    let number = |t: &str| t.trim().parse::<usize>().ok();
    list.split(',')
        .filter_map(|part| match part.split_once('-') {
            Some((a, b)) => number(b)?.checked_sub(number(a)?).map(|d| d + 1),
            None => number(part).map(|_| 1),
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cpu_list_is_counted() {
        assert_eq!(cpu_count("0"), 1);
        assert_eq!(cpu_count("0-3,8"), 5);
        assert_eq!(cpu_count("0,64"), 2);
        assert_eq!(cpu_count(""), 0);
        assert_eq!(cpu_count("5-3,x,7"), 1, "a backwards range or a word counts none");
    }
}
