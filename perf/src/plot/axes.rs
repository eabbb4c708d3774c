//! The axes' scales and labels: the span of the values, widened to whole decades, the
//! labelled and faint lines (powers of two for sizes, of ten for values), and the labels
//! as people write them (`64 KiB`, `0.3`, `1e6`).

/// The smallest and largest of `values`, or around `fallback` when there are none.
pub(super) fn span(values: &[f64], fallback: f64) -> (f64, f64) {
    let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = values.iter().copied().fold(0.0, f64::max);
    match lo.is_finite() && hi > 0.0 {
        true if hi > lo => (lo, hi),
        true => (lo / 2.0, hi * 2.0),
        false => (fallback / 10.0, fallback * 10.0),
    }
}

/// `lo..hi` widened to whole decades: every power of ten is a labelled line.
pub(super) fn decades(lo: f64, hi: f64) -> (f64, f64) {
    (
        10f64.powf((lo.log10() + 1e-9).floor()),
        10f64.powf((hi.log10() - 1e-9).ceil()),
    )
}

/// The powers of `base` from `lo` to `hi`.
pub(super) fn powers(lo: f64, hi: f64, base: f64) -> Vec<f64> {
    // (A hair of slack: log10(1e-4) may come out as -3.9999999999999996.)
    let first = (lo.log(base) - 1e-9).ceil() as i32;
    let last = (hi.log(base) + 1e-9).floor() as i32;
    // Values are bounded when read (a petabyte at most): never an endless axis.
    (first..=last.min(first.saturating_add(4096)))
        .map(|k| base.powi(k))
        .collect()
}

/// 2, 3, ... 9 times each power of ten, for the faint lines.
pub(super) fn minor_ticks(lo: f64, hi: f64) -> Vec<f64> {
    powers(lo / 10.0, hi, 10.0)
        .into_iter()
        .flat_map(|d| (2..10).map(move |m| d * m as f64))
        .filter(|v| *v > lo && *v < hi)
        .collect()
}

/// Labelled sizes: every 2nd, 3rd, ... power of two, so that at most 9 are labelled.
pub(super) fn size_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let all = powers(lo, hi, 2.0);
    let step = all.len().div_ceil(9).max(1);
    all.into_iter().step_by(step).collect()
}

/// `4 B`, `32 KiB`, `64 MiB`.
pub(super) fn size_label(bytes: f64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < units.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{} {}", number_label(v), units[unit])
}

/// `0.01`, `3`, `1000`, `1e4`: short, and never `0.30000000000000004`.
pub(super) fn number_label(v: f64) -> String {
    if v >= 1e4 {
        return format!("1e{}", v.log10().round());
    }
    let rounded: f64 = format!("{v:.3e}").parse().unwrap_or(v);
    format!("{rounded}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_and_labels_read_as_people_write_them() {
        assert_eq!(size_label(4.0), "4 B");
        assert_eq!(size_label(65536.0), "64 KiB");
        assert_eq!(size_label(64.0 * 1048576.0), "64 MiB");
        assert_eq!(number_label(0.001), "0.001");
        assert_eq!(number_label(0.1 + 0.2), "0.3");
        assert_eq!(number_label(1e6), "1e6");
        assert_eq!(decades(0.03, 12.0), (0.01, 100.0));
        assert_eq!(decades(0.00014, 10.0), (1e-4, 10.0));
        assert_eq!(powers(1e-4, 1e-2, 10.0).len(), 3);
        assert_eq!(powers(3.0, 70.0, 2.0), [4.0, 8.0, 16.0, 32.0, 64.0]);
        assert!(size_ticks(4.0, 64.0 * 1048576.0).len() <= 9);
        assert_eq!(minor_ticks(1.0, 10.0).len(), 8);
    }
}
