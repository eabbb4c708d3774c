//! Sizes and durations, read from people and written for them: the one place that knows
//! that `64K` is 65,536 bytes (binary, as nccl-tests counts) and that a timeout reads
//! `60 s`. A leaf module: it uses nothing else of the workbook.

use std::time::Duration;

/// Parses a byte size with an optional binary suffix, as nccl-tests does: `4`, `64K`,
/// `100M`, `1G` (also `100MiB`, `100MB`: 1024-based all the same).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("'{text}' is not a size (try 4, 64K, 100M or 1G)"))?;
    let shift = match unit.to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        _ => return Err(format!("'{text}' has an unknown unit '{unit}' (use K, M or G)")),
    };
    let bytes = n
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("'{text}' is too large"))?;
    if bytes == 0 {
        return Err("a size of 0 bytes moves nothing: give at least 4".into());
    }
    if bytes > 16 << 30 {
        return Err(format!("'{text}' is over the 16G this workbook allows per buffer"));
    }
    Ok(bytes)
}

/// Parses a duration: seconds by default, or with `ms`, `s`, `m`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("'{text}' is not a duration (try 60, 10s, 500ms or 2m)"))?;
    let secs = match unit {
        "" | "s" => n,
        "ms" => n / 1000.0,
        "m" | "min" => n * 60.0,
        _ => return Err(format!("'{text}' has an unknown unit '{unit}' (use ms, s or m)")),
    };
    if !(secs > 0.0 && secs <= 86_400.0) {
        return Err(format!("'{text}' is out of range (more than 0, at most a day)"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// "16 B", "4.0 KiB", "100.0 MiB".
pub fn human_bytes(b: usize) -> String {
    match b {
        0..1024 => format!("{b} B"),
        1024..1_048_576 => format!("{:.1} KiB", b as f64 / 1024.0),
        1_048_576..1_073_741_824 => format!("{:.1} MiB", b as f64 / 1_048_576.0),
        _ => format!("{:.2} GiB", b as f64 / 1_073_741_824.0),
    }
}

/// A size as it was probably typed: `4K`, `100M`, `4`.
pub fn typed_size(b: u64) -> String {
    match b {
        _ if b >= 1 << 30 && b.is_multiple_of(1 << 30) => format!("{}G", b >> 30),
        _ if b >= 1 << 20 && b.is_multiple_of(1 << 20) => format!("{}M", b >> 20),
        _ if b >= 1 << 10 && b.is_multiple_of(1 << 10) => format!("{}K", b >> 10),
        _ => b.to_string(),
    }
}

/// "60 s", "500 ms", "2.5 s": a duration as people write it.
pub fn human_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        format!("{ms} ms")
    } else if ms.is_multiple_of(1000) {
        format!("{} s", ms / 1000)
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_for_people() {
        assert_eq!(human_bytes(16), "16 B");
        assert_eq!(human_bytes(100 << 20), "100.0 MiB");
        assert_eq!(
            (typed_size(4), typed_size(64 << 10), typed_size(3 << 30)),
            ("4".into(), "64K".into(), "3G".into())
        );
        assert_eq!(human_duration(Duration::from_millis(2500)), "2.5 s");
    }

    #[test]
    fn sizes_are_binary_like_nccl_tests() {
        assert_eq!(parse_size("4"), Ok(4));
        assert_eq!(parse_size("64K"), Ok(65536));
        assert_eq!(parse_size("100M"), Ok(100 << 20));
        assert_eq!(parse_size("100MiB"), Ok(100 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        for bad in [
            "",
            "M",
            "12X",
            "-4",
            "1.5M",
            "0",
            "99999999999999999999",
            "17G",
            "4 K K",
        ] {
            assert!(parse_size(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn sizes_round_trip_and_garbage_never_panics() {
        let mut rng = testkit::Xorshift(0x853c_49e6_748f_ea9b);
        let mut next = |n| rng.below(n);
        for _ in 0..5000 {
            let (n, unit) = (1 + next(1 << 20), ["", "K", "M", "G", "KiB", "mb"][next(6) as usize]);
            let shift = match unit.to_ascii_uppercase().chars().next() {
                Some('K') => 10,
                Some('M') => 20,
                Some('G') => 30,
                _ => 0,
            };
            let want = n.checked_mul(1 << shift).filter(|b| *b <= 16 << 30);
            assert_eq!(parse_size(&format!("{n}{unit}")).ok(), want, "{n}{unit}");
            let junk: String = (0..next(10))
                .map(|_| "0123456789KMGiBb -+.xé".chars().nth(next(22) as usize).unwrap())
                .collect();
            let _ = (parse_size(&junk), parse_duration(&junk));
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("60"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        for bad in ["", "0", "-1", "5h", "x"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} parsed");
        }
    }
}
