//! The GPUs: the physical devices of the emulated machine, and which of them this
//! process sees, in which order (`CUDA_VISIBLE_DEVICES`).
//!
//! Physical device `p` (0 ≤ p < `NCCL_DOUBLE_DEVICES`, default 4) has:
//! - the name `simulated GPU <p> (host memory)`;
//! - the PCI bus id `0000:<bus>:00.0` with `bus = 0x1B + 0x10 * p` in upper-case hex (the
//!   carry goes to the domain past 0xFF), the same on every host, as on identical nodes;
//! - a 16-byte UUID hashed from (host, p), written `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`
//!   as `nvidia-smi -L` does, so that two emulated nodes on one machine have different
//!   GPUs (the host is [`host`]).
//!
//! Every driver call names a device by its *visible ordinal*; [`physical`] maps it.

use std::sync::OnceLock;

/// How many GPUs the machine has (`NCCL_DOUBLE_DEVICES`, default 4).
pub fn physical_count() -> usize {
    static COUNT: OnceLock<usize> = OnceLock::new();
    *COUNT.get_or_init(|| crate::env_number("NCCL_DOUBLE_DEVICES", 4) as usize)
}

/// This machine's name, as the kernel knows it.
pub fn real_host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

/// The node this process plays: `NCCL_DOUBLE_HOST` (tests emulate nodes with it), else
/// the node Slurm gave the task (emulated nodes share one real host), else the real one.
/// It decides the UUIDs and what counts as "one host" for NCCL's Duplicate GPU rule.
pub fn host() -> &'static str {
    static HOST: OnceLock<String> = OnceLock::new();
    HOST.get_or_init(|| {
        std::env::var("NCCL_DOUBLE_HOST")
            .or_else(|_| std::env::var("SLURMD_NODENAME"))
            .unwrap_or_else(|_| real_host())
    })
}

/// The name `cuDeviceGetName` gives physical device `p`.
pub fn name(p: usize) -> String {
    format!("simulated GPU {p} (host memory)")
}

/// The PCI bus id of physical device `p`, as `cuDeviceGetPCIBusId` writes it
/// (`domain:bus:device.function`, 12 characters).
pub fn bus_id(p: usize) -> String {
    let n = 0x1B + 0x10 * p;
    format!("{:04X}:{:02X}:00.0", n >> 8, n & 0xFF)
}

/// FNV-1a, 64 bits, starting from `seed`: a stable hash (std's is randomised per process).
fn fnv1a(seed: u64, bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(seed, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3))
}

/// SplitMix64's finaliser: spreads every input bit over the output (FNV alone leaves
/// the UUIDs of neighbouring devices looking alike).
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The UUID of physical device `p` on this host: the same in every process of the host,
/// different on another host.
pub fn uuid(p: usize) -> [u8; 16] {
    let text = format!("nccl-double\0{}\0{p}", host());
    let a = mix(fnv1a(0xcbf2_9ce4_8422_2325, text.as_bytes()));
    let b = mix(fnv1a(a ^ 0x9e37_79b9_7f4a_7c15, text.as_bytes()));
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&a.to_be_bytes());
    out[8..].copy_from_slice(&b.to_be_bytes());
    out
}

/// A UUID as `nvidia-smi -L` writes it: `GPU-` and 8-4-4-4-12 lower-case hex digits.
pub fn uuid_text(u: &[u8; 16]) -> String {
    let hex: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// The UUID (`GPU-...`) of this host's GPU with PCI bus id `bus`: what NCCL 2.30.7
/// compares (`cuDeviceGetUuid`) where older versions compare bus ids. Empty if none has it.
pub fn uuid_of_bus(bus: &str) -> String {
    (0..physical_count())
        .find(|&p| bus_id(p) == bus)
        .map(|p| uuid_text(&uuid(p)))
        .unwrap_or_default()
}

/// `NCCL_MULTI_RANK_GPU_ENABLE` as NCCL 2.30 reads it (`NCCL_PARAM(MultiRankGpuEnable,
/// "MULTI_RANK_GPU_ENABLE", 0)`, once per process): ranks may share a GPU when it is not 0.
pub fn multi_rank_gpu_enabled() -> bool {
    static ENABLED: OnceLock<bool> = OnceLock::new();
    *ENABLED.get_or_init(|| {
        std::env::var("NCCL_MULTI_RANK_GPU_ENABLE")
            .ok()
            .and_then(|v| nccl_param(&v))
            .is_some_and(|v| v != 0)
    })
}

/// A parameter's value as NCCL's `ncclLoadParam` reads it (`src/misc/param.cc`, 2.18 to
/// 2.30): `None` (the default) when empty or out of range, else `strtoll(value, NULL, 0)`:
/// leading spaces, a sign, then hex after `0x`, octal after `0`, else decimal, up to the
/// first other character (`"1x"` is 1, `"yes"` is 0).
pub fn nccl_param(value: &str) -> Option<i64> {
    if value.is_empty() {
        return None;
    }
    let t = value.trim_start_matches([' ', '\t', '\n', '\r', '\x0b', '\x0c']);
    let (negative, t) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let hex = t.len() > 2 && (t.starts_with("0x") || t.starts_with("0X")) && t.as_bytes()[2].is_ascii_hexdigit();
    let (radix, digits) = if hex {
        (16, &t[2..])
    } else if t.starts_with('0') {
        (8, t)
    } else {
        (10, t)
    };
    let mut v: i128 = 0;
    for d in digits.chars().map_while(|c| c.to_digit(radix)) {
        v = v * i128::from(radix) + i128::from(d);
        if v > 1 << 63 {
            return None;
        }
    }
    i64::try_from(if negative { -v } else { v }).ok()
}

/// The physical devices this process sees, in order: entry `i` is visible ordinal `i`.
pub fn visible() -> &'static [usize] {
    static VISIBLE: OnceLock<Vec<usize>> = OnceLock::new();
    VISIBLE.get_or_init(|| {
        let uuids: Vec<String> = (0..physical_count()).map(|p| uuid_text(&uuid(p))).collect();
        parse_visible(std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref(), &uuids)
    })
}

/// The physical device behind visible ordinal `ordinal`, if there is one.
pub fn physical(ordinal: usize) -> Option<usize> {
    visible().get(ordinal).copied()
}

/// `CUDA_VISIBLE_DEVICES` as the CUDA C Programming Guide (appendix "CUDA Environment
/// Variables", `CUDA_VISIBLE_DEVICES`) describes it, given the machine's UUIDs:
/// - unset: every device, in order; set but empty: no device;
/// - else a comma-separated sequence of entries, each an integer index of a device or a
///   UUID `GPU-...` as `nvidia-smi -L` prints it, or any prefix of one (including
///   `GPU-`) that names a single device; the devices are enumerated in the order listed;
/// - "if an invalid index is encountered, only devices with indices that appear before
///   the invalid index in the list are visible" (`0,2,-1,1` -> devices 0 and 2).
///
/// What the guide leaves open, decided here (strictly): an entry is invalid when it is
/// negative, out of range, empty, not all decimal digits (no sign, no spaces), a UUID
/// prefix matching no device or several, a `MIG-` id (not modelled), or a device
/// already listed; hex digits of a UUID compare case-insensitively.
pub fn parse_visible(spec: Option<&str>, uuids: &[String]) -> Vec<usize> {
    let Some(spec) = spec else {
        return (0..uuids.len()).collect();
    };
    let mut out = Vec::new();
    if spec.is_empty() {
        return out;
    }
    for entry in spec.split(',') {
        let device = if entry.starts_with("GPU-") {
            let entry = entry.to_ascii_lowercase();
            let mut matching = (0..uuids.len()).filter(|&p| uuids[p].to_ascii_lowercase().starts_with(&entry));
            match (matching.next(), matching.next()) {
                (Some(p), None) => Some(p),
                _ => None,
            }
        } else if !entry.is_empty() && entry.bytes().all(|b| b.is_ascii_digit()) {
            entry.parse::<usize>().ok().filter(|&p| p < uuids.len())
        } else {
            None
        };
        match device {
            Some(p) if !out.contains(&p) => out.push(p),
            _ => break,
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uuids() -> Vec<String> {
        ["aaaa1111", "aaaa2222", "bbbb0000", "cccc0000"]
            .iter()
            .map(|s| format!("GPU-{s}-0000-0000-0000-000000000000"))
            .collect()
    }

    #[test]
    fn visible_devices_follow_the_programming_guide() {
        let u = uuids();
        let v = |s: Option<&str>| parse_visible(s, &u);
        assert_eq!(v(None), [0, 1, 2, 3]);
        assert_eq!(v(Some("")), [] as [usize; 0]);
        assert_eq!(v(Some("2,0")), [2, 0]);
        assert_eq!(v(Some("0,2,-1,1")), [0, 2]);
        assert_eq!(v(Some("-1")), [] as [usize; 0]);
        assert_eq!(v(Some("1,4,0")), [1]);
        assert_eq!(v(Some("1,1,0")), [1]);
        assert_eq!(v(Some("0, 1")), [0]);
        assert_eq!(v(Some("0,,1")), [0]);
        assert_eq!(v(Some("GPU-bbbb0000-0000-0000-0000-000000000000,0")), [2, 0]);
        assert_eq!(v(Some("GPU-CCCC,GPU-aaaa2")), [3, 1]);
        // A prefix of two devices, or of none, is invalid.
        assert_eq!(v(Some("3,GPU-aaaa,0")), [3]);
        assert_eq!(v(Some("GPU-dead")), [] as [usize; 0]);
        assert_eq!(v(Some("0,GPU-aaaa1")), [0]);
        assert_eq!(v(Some("MIG-aaaa1111")), [] as [usize; 0]);
    }

    #[test]
    fn parameters_are_read_as_strtoll_with_base_0() {
        for (text, value) in [
            ("1", Some(1)),
            ("0", Some(0)),
            (" +7", Some(7)),
            ("-1", Some(-1)),
            ("0x10", Some(16)),
            ("010", Some(8)),
            ("1x", Some(1)),
            ("0x", Some(0)),
            ("yes", Some(0)),
            ("", None),
            ("9223372036854775808", None),
            ("-9223372036854775808", Some(i64::MIN)),
        ] {
            assert_eq!(nccl_param(text), value, "{text:?}");
        }
    }

    #[test]
    fn bus_ids_and_uuids_have_the_drivers_format() {
        assert_eq!(bus_id(0), "0000:1B:00.0");
        assert_eq!(bus_id(1), "0000:2B:00.0");
        assert_eq!(bus_id(15), "0001:0B:00.0");
        let t = uuid_text(&uuid(3));
        assert_eq!(t.len(), 40, "{t}");
        assert!(t.starts_with("GPU-") && t.matches('-').count() == 5, "{t}");
        assert_ne!(uuid(0), uuid(1));
        assert_eq!(uuid(2), uuid(2));
    }
}
