//! `ncclConfig_t`, read as NCCL reads it (`parseCommConfig` in `init.cc`, tags v2.18.3 to
//! v2.30.7): the caller's first 8 bytes say how many bytes to copy (`size`, at most
//! NCCL's own `sizeof(ncclConfig_t)`); they are copied over NCCL's own
//! `NCCL_CONFIG_INITIALIZER`; the magic must be `0xcafebeef`; then fields newer than the
//! caller's `version` are put back to their defaults, by the guards that NCCL of the
//! played version has.
//!
//! The layout grew by versions (offsets on 64-bit Linux):
//!
//! | field | offset | in NCCL | reset when the caller's version is older than |
//! |---|---|---|---|
//! | `size`, `magic`, `version` | 0, 8, 12 | all | |
//! | `blocking` | 16 | 2.14 | 2.14 |
//! | `cgaClusterSize`, `minCTAs`, `maxCTAs`, `netName` | 20, 24, 28, 32 | 2.17 | 2.17 |
//! | `splitShare` | 40 | 2.18 | (never) |
//! | `trafficClass` | 44 | 2.26 | 2.25, but only from NCCL 2.27 on: **2.26 has no guard** |
//! | `commName`, `collnetEnable`, `CTAPolicy`, `shrinkShare`, `nvlsCTAs` | 48 to 68 | 2.27 | 2.27 |
//! | `nChannelsPerNetPeer`, `nvlinkCentricSched` | 72, 76 | 2.28 | 2.28 |
//! | `graphUsageMode`, `numRmaCtx` | 80, 84 | 2.29 | 2.29 |
//! | `maxP2pPeers` | 88 | 2.30 | 2.30 |
//! | `graphStreamOrdering` | 92 | 2.30.5 | 2.30.5 |
//!
//! Up to 2.25, `sizeof(ncclConfig_t)` is 48: 44 bytes of fields and 4 of padding. A
//! program built against those headers that sets `size = sizeof` hands NCCL 2.26 its
//! padding as `trafficClass` (the InfiniBand traffic class of every connection), whatever
//! bytes sit there. The double plays that (with `NCCL_DOUBLE_VERSION` 2.26.x it reads
//! offset 44), and refuses any config whose bytes past the fields of its declared
//! version, where the played NCCL reads a field, are not what NCCL's initializer puts
//! there: real NCCL would take them as settings.

use super::INVALID_ARGUMENT;
use crate::exchange::Failure;
use crate::version::version;

/// `NCCL_CONFIG_UNDEF_INT`: "NCCL decides".
pub const UNDEF_INT: i32 = i32::MIN;
/// `NCCL_CONFIG_INITIALIZER`'s magic number.
pub const MAGIC: u32 = 0xcafe_beef;

/// A field past `version`: its name, offset and size, the NCCL version that has it, and
/// the caller's version below which NCCL puts it back to its default (with the NCCL
/// version from which that guard exists).
struct Field {
    name: &'static str,
    offset: usize,
    size: usize,
    since: u32,
    reset_below: Option<(u32, u32)>,
}

const fn int(name: &'static str, offset: usize, since: u32, reset_below: Option<(u32, u32)>) -> Field {
    Field {
        name,
        offset,
        size: 4,
        since,
        reset_below,
    }
}

const fn ptr(name: &'static str, offset: usize, since: u32, reset_below: Option<(u32, u32)>) -> Field {
    Field {
        name,
        offset,
        size: 8,
        since,
        reset_below,
    }
}

/// Every field past `version`, by the table above (guards are written (caller's version,
/// from which NCCL)).
const FIELDS: &[Field] = &[
    int("blocking", 16, 21400, Some((21400, 21400))),
    int("cgaClusterSize", 20, 21700, Some((21700, 21700))),
    int("minCTAs", 24, 21700, Some((21700, 21700))),
    int("maxCTAs", 28, 21700, Some((21700, 21700))),
    ptr("netName", 32, 21700, Some((21700, 21700))),
    int("splitShare", 40, 21800, None),
    int("trafficClass", 44, 22600, Some((22500, 22700))),
    ptr("commName", 48, 22700, Some((22700, 22700))),
    int("collnetEnable", 56, 22700, Some((22700, 22700))),
    int("CTAPolicy", 60, 22700, Some((22700, 22700))),
    int("shrinkShare", 64, 22700, Some((22700, 22700))),
    int("nvlsCTAs", 68, 22700, Some((22700, 22700))),
    int("nChannelsPerNetPeer", 72, 22800, Some((22800, 22800))),
    int("nvlinkCentricSched", 76, 22800, Some((22800, 22800))),
    int("graphUsageMode", 80, 22900, Some((22900, 22900))),
    int("numRmaCtx", 84, 22900, Some((22900, 22900))),
    int("maxP2pPeers", 88, 23000, Some((23000, 23000))),
    int("graphStreamOrdering", 92, 23005, Some((23005, 23005))),
];

/// The fields NCCL `v` has.
fn fields(v: u32) -> impl Iterator<Item = &'static Field> {
    FIELDS.iter().filter(move |f| f.since <= v)
}

/// `sizeof(ncclConfig_t)` in NCCL `v`: its last field's end, rounded up to 8.
pub fn size_of(v: u32) -> usize {
    let end = fields(v).map(|f| f.offset + f.size).max().unwrap_or(16);
    end.div_ceil(8) * 8
}

/// The bytes of NCCL `v`'s `NCCL_CONFIG_INITIALIZER` (padding zero).
fn initializer(v: u32) -> Vec<u8> {
    let mut b = vec![0u8; size_of(v)];
    b[..8].copy_from_slice(&(size_of(v) as u64).to_ne_bytes());
    b[8..12].copy_from_slice(&MAGIC.to_ne_bytes());
    b[12..16].copy_from_slice(&v.to_ne_bytes());
    for f in fields(v).filter(|f| f.size == 4) {
        b[f.offset..f.offset + 4].copy_from_slice(&UNDEF_INT.to_ne_bytes());
    }
    b
}

/// What the double takes from a config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// `blocking`: `None` when left to NCCL (`NCCL_CONFIG_UNDEF_INT`: blocking).
    pub blocking: Option<bool>,
    /// `splitShare` (0 when left to NCCL).
    pub split_share: bool,
    /// `trafficClass`, as the played NCCL reads it (`None`: undefined, or no such field).
    pub traffic_class: Option<i32>,
}

/// Reads the `size`-prefixed config at `raw` as NCCL `version()` would.
///
/// # Safety
/// `raw` points to a config whose first 8 bytes (its `size`) and then `min(size, NCCL's
/// sizeof)` bytes are readable, as NCCL itself requires.
pub unsafe fn read(raw: *const u8, call: &str) -> Result<Config, Failure> {
    let v = version();
    // SAFETY: the caller's config starts with its size (8 bytes), as NCCL reads it.
    let size = unsafe { std::ptr::read_unaligned(raw as *const u64) } as usize;
    let real = size.min(size_of(v));
    // SAFETY: NCCL copies `min(size, sizeof)` bytes: the caller promises them.
    let given = unsafe { std::slice::from_raw_parts(raw, real) };
    parse(v, size, given, call)
}

/// [`read`] on bytes: `size` the caller's, `given` the first `min(size, sizeof)` bytes.
fn parse(v: u32, size: usize, given: &[u8], call: &str) -> Result<Config, Failure> {
    let mut b = initializer(v);
    b[..given.len()].copy_from_slice(given);
    let u32_at = |b: &[u8], at: usize| u32::from_ne_bytes(b[at..at + 4].try_into().unwrap_or_default());
    let i32_at = |b: &[u8], at: usize| i32::from_ne_bytes(b[at..at + 4].try_into().unwrap_or_default());
    let magic = if b.len() >= 12 { u32_at(&b, 8) } else { 0 };
    if given.len() < 12 || magic != MAGIC {
        return Err(Failure::new(
            INVALID_ARGUMENT,
            format!(
                "{call}: ncclConfig_t argument not initialized via NCCL_CONFIG_INITIALIZER (its magic is {magic:#x}, \
                 not {MAGIC:#x})"
            ),
        ));
    }
    let declared = u32_at(&b, 12);
    let init = initializer(v);
    // What the double adds: a field the caller's header does not declare, read by this
    // NCCL (inside `size`, and not put back by a guard), must hold the initializer's bytes.
    for f in fields(v) {
        let reset = f.reset_below.is_some_and(|(below, from)| v >= from && declared < below);
        if reset {
            b[f.offset..f.offset + f.size].copy_from_slice(&init[f.offset..f.offset + f.size]);
            continue;
        }
        let in_declared = fields(declared.max(21800)).any(|d| d.offset == f.offset);
        let read = f.offset + f.size <= given.len();
        if !in_declared && read && b[f.offset..f.offset + f.size] != init[f.offset..f.offset + f.size] {
            let end = fields(declared.max(21800))
                .map(|d| d.offset + d.size)
                .max()
                .unwrap_or(16);
            let held: Vec<String> = b[f.offset..f.offset + f.size]
                .iter()
                .map(|x| format!("{x:02x}"))
                .collect();
            return Err(Failure::new(
                INVALID_ARGUMENT,
                format!(
                    "{call}: config.size is {size}, but the config declares version {declared}, whose fields end at \
                     byte {end}: NCCL {} reads bytes {}..{} as {} and they hold {} (not the initializer's value): real \
                     NCCL would use them as that setting. Give size = the declared fields' size ({end}), or fill the \
                     struct with NCCL_CONFIG_INITIALIZER of the NCCL you run",
                    dotted(v),
                    f.offset,
                    f.offset + f.size,
                    f.name,
                    held.join(" ")
                ),
            ));
        }
    }
    let blocking = match i32_at(&b, 16) {
        0 => Some(false),
        1 => Some(true),
        UNDEF_INT => None,
        x => {
            return Err(Failure::new(
                INVALID_ARGUMENT,
                format!("{call}: Invalid config blocking attribute value {x} (it must be 0 or 1)"),
            ));
        }
    };
    let split_share = match i32_at(&b, 40) {
        0 | UNDEF_INT => false,
        1 => true,
        x => {
            return Err(Failure::new(
                INVALID_ARGUMENT,
                format!("{call}: Invalid config splitShare attribute value {x} (it must be 0 or 1)"),
            ));
        }
    };
    let traffic_class = (v >= 22600).then(|| i32_at(&b, 44)).filter(|&t| t != UNDEF_INT);
    Ok(Config {
        blocking,
        split_share,
        traffic_class,
    })
}

/// What a communicator's config becomes once NCCL has read the environment over it
/// (`envConfigOverride` in `init.cc`, 2.18.1 to 2.30.7, run for every init and split,
/// with a config or without): `NCCL_COMM_BLOCKING` of 0 or 1 replaces `blocking`, and
/// `NCCL_COMM_SPLIT_SHARE_RESOURCES`, set to anything, replaces `splitShare` (a value but
/// 0 or 1 then becomes 0). The variables are read as `NCCL_PARAM` reads them: an integer
/// (`strtoll`), an empty value as unset.
pub fn env_override(blocking: bool, split_share: bool) -> (bool, bool) {
    let param = |name: &str| -> Option<i64> {
        let v = std::env::var(name).ok()?;
        let v = v.trim();
        if v.is_empty() {
            return None;
        }
        // strtoll: the leading integer, 0 if none.
        let end = v
            .char_indices()
            .find(|&(i, c)| !(c.is_ascii_digit() || (i == 0 && (c == '-' || c == '+'))))
            .map_or(v.len(), |(i, _)| i);
        Some(v[..end].parse().unwrap_or(0))
    };
    let blocking = match param("NCCL_COMM_BLOCKING") {
        Some(0) => false,
        Some(1) => true,
        _ => blocking,
    };
    let split_share = match param("NCCL_COMM_SPLIT_SHARE_RESOURCES") {
        Some(v) if v != i64::from(UNDEF_INT) => v == 1,
        _ => split_share,
    };
    (blocking, split_share)
}

/// 22602 as "2.26.2".
fn dotted(v: u32) -> String {
    format!("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A config as a program built against the 2.18-2.25 headers makes it: the fields
    /// through `splitShare`, then `tail` in the 4 bytes of padding; `size` as given.
    fn made(size: usize, blocking: i32, tail: [u8; 4]) -> Vec<u8> {
        let mut b = initializer(21803);
        b[..8].copy_from_slice(&(size as u64).to_ne_bytes());
        b[12..16].copy_from_slice(&21700u32.to_ne_bytes());
        b[16..20].copy_from_slice(&blocking.to_ne_bytes());
        b[44..48].copy_from_slice(&tail);
        b
    }

    fn parse_as(v: u32, bytes: &[u8]) -> Result<Config, Failure> {
        let size = u64::from_ne_bytes(bytes[..8].try_into().unwrap()) as usize;
        parse(
            v,
            size,
            &bytes[..size.min(size_of(v)).min(bytes.len())],
            "ncclCommInitRankConfig",
        )
    }

    #[test]
    fn sizes_are_nccls() {
        assert_eq!(size_of(21803), 48);
        assert_eq!(size_of(22602), 48);
        assert_eq!(size_of(22703), 72);
        assert_eq!(size_of(22803), 80);
        assert_eq!(size_of(23007), 96);
    }

    #[test]
    fn the_padding_of_older_headers_is_read_as_traffic_class_by_2_26_only() {
        let garbage = made(48, 0, [0x2a, 0x7f, 0x00, 0x00]);
        // 2.18 to 2.25: padding, not read.
        for v in [21803, 22203, 22304, 22501] {
            assert_eq!(parse_as(v, &garbage).unwrap().blocking, Some(false), "{v}");
        }
        // 2.26: trafficClass, no guard: refused, naming the field and the bytes.
        let e = parse_as(22602, &garbage).unwrap_err();
        assert_eq!(e.code, INVALID_ARGUMENT);
        assert!(
            e.why
                .contains("NCCL 2.26.2 reads bytes 44..48 as trafficClass and they hold 2a 7f 00 00"),
            "{}",
            e.why
        );
        // Zeroed padding is no better: 0 is a traffic class too.
        assert!(parse_as(22602, &made(48, 0, [0; 4])).is_err());
        // 2.27 on: the guard puts it back (the caller declared 2.17).
        for v in [22703, 22807, 23007] {
            let c = parse_as(v, &garbage).unwrap();
            assert_eq!(c.traffic_class, None, "{v}");
        }
        // The fix: size = the declared fields (44 bytes): NCCL keeps its own default.
        let right = made(44, 0, [0x2a, 0x7f, 0, 0]);
        for v in [21803, 22602, 22703, 23007] {
            let c = parse_as(v, &right).unwrap();
            assert_eq!((c.blocking, c.traffic_class), (Some(false), None), "{v}");
        }
    }

    #[test]
    fn magic_and_blocking_are_checked() {
        let mut b = made(44, 0, [0; 4]);
        b[8..12].copy_from_slice(&0u32.to_ne_bytes());
        assert!(parse_as(21803, &b).unwrap_err().why.contains("NCCL_CONFIG_INITIALIZER"));
        assert!(
            parse_as(21803, &made(44, 7, [0; 4]))
                .unwrap_err()
                .why
                .contains("blocking attribute value 7")
        );
        assert_eq!(parse_as(21803, &made(44, UNDEF_INT, [0; 4])).unwrap().blocking, None);
    }
}
