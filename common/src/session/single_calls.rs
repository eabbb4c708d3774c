//! Single calls: the timed loop also stamps each call, as nccl-tests' `-I` (per-iteration
//! timing) does, so that the spread of the calls shows beside their mean. A call's time is
//! its slowest rank's (the ranks' times for call i, the maximum); the report gives the
//! median and the 99th percentile of those, and how many calls slept: calls during which
//! some rank stopped waiting on its core and slept on the shared-memory futex.
//!
//! The stamps are the CPU's time-stamp counter where it has one (a few nanoseconds, not
//! the 20 of a clock read, so that the mean of the same loop hardly moves), converted to
//! seconds by the loop's own clock.

use crate::collective::Collective;
use crate::report::SingleCalls;
use std::time::Instant;

/// Calls stamped at most per loop: enough for a median and a p99, and few enough that
/// every rank's stamps travel through the store at once.
pub const MAX_CALLS: usize = 10_000;

/// One rank's stamps over a timed loop: one before each call, one after the last.
pub struct Stamps {
    ticks: Vec<u64>,
    slept: Vec<u64>,
    /// Stamps wanted: the calls stamped, plus one.
    wanted: usize,
    first: Option<Instant>,
    last: Option<Instant>,
}

impl Stamps {
    /// Room for the stamps of a loop of `iters` calls (the first [`MAX_CALLS`]).
    pub fn new(iters: u32) -> Stamps {
        let wanted = (iters as usize).min(MAX_CALLS) + 1;
        Stamps {
            ticks: Vec::with_capacity(wanted),
            slept: Vec::with_capacity(wanted),
            wanted,
            first: None,
            last: None,
        }
    }

    /// Stamps the moment between two calls (before the first, after the last).
    #[inline]
    pub fn mark(&mut self) {
        let n = self.ticks.len();
        if n >= self.wanted {
            return;
        }
        if n == 0 {
            self.first = Some(Instant::now());
        }
        self.ticks.push(ticks());
        self.slept.push(workbook_cpu::transport::shm::waits_slept());
        if n + 1 == self.wanted {
            self.last = Some(Instant::now());
        }
    }

    /// Each stamped call's seconds and whether it slept, as bytes to share: per call an
    /// f32 and a byte.
    pub fn encode(&self) -> Vec<u8> {
        let (Some(first), Some(last)) = (self.first, self.last) else {
            return vec![];
        };
        let span = self.ticks.last().unwrap_or(&0) - self.ticks.first().unwrap_or(&0);
        let per_tick = match span {
            0 => 0.0,
            n => (last - first).as_secs_f64() / n as f64,
        };
        let mut out = Vec::with_capacity(5 * self.ticks.len());
        for (t, s) in self.ticks.windows(2).zip(self.slept.windows(2)) {
            out.extend((((t[1] - t[0]) as f64 * per_tick) as f32).to_le_bytes());
            out.push((s[1] > s[0]) as u8);
        }
        out
    }
}

/// The time-stamp counter (x86_64), or nanoseconds of the clock elsewhere.
#[inline]
fn ticks() -> u64 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: RDTSC exists on every x86_64 CPU and only reads a counter.
    #[allow(unused_unsafe)]
    unsafe {
        std::arch::x86_64::_rdtsc()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        START.get_or_init(Instant::now).elapsed().as_nanos() as u64
    }
}

/// Every rank's encoded stamps, combined: each call's slowest rank, the median and p99 of
/// those (nearest rank, as nccl-tests), and how many calls slept on some rank (`None`
/// when `count_sleeps` is false: a transport that does not count them).
pub fn combine(all: &[Vec<u8>], count_sleeps: bool) -> Option<SingleCalls> {
    let calls = all.iter().map(|b| b.len() / 5).min()?;
    if calls == 0 {
        return None;
    }
    let mut slowest = vec![0f64; calls];
    let mut slept = vec![false; calls];
    for bytes in all {
        for (i, c) in bytes.chunks_exact(5).take(calls).enumerate() {
            let s = f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64;
            slowest[i] = slowest[i].max(s);
            slept[i] |= c[4] != 0;
        }
    }
    slowest.sort_by(f64::total_cmp);
    Some(SingleCalls {
        calls,
        median_us: percentile(&slowest, 50.0) * 1e6,
        p99_us: percentile(&slowest, 99.0) * 1e6,
        slept: count_sleeps.then(|| slept.iter().filter(|s| **s).count() as u64),
    })
}

/// Why calls of `coll` timed back to back may overlap, on `world` ranks, `iters` calls:
/// in a rooted collective some rank leaves once its own part is handed over (the slots
/// hold it), before the others are done, and starts its next call while they finish this
/// one. The mean per call is then a rate, less than one call's time from start to end.
/// Every rank of the other collectives needs every rank's data, so none leaves early.
pub fn overlap(coll: &Collective, world: usize, iters: u32) -> Option<&'static str> {
    if !coll.rooted() || world < 2 || iters < 2 {
        return None;
    }
    Some(match coll.name() {
        "broadcast" => "the root leaves once its data is handed over",
        _ => "every rank but the root leaves once its data is handed over",
    })
}

/// The single calls in a line, for a lesson's `Time:`: median, p99 and sleeps.
pub fn line(s: &SingleCalls) -> String {
    let slept = match s.slept {
        Some(n) => format!("{n} of {} slept", s.calls),
        None => "sleeps not counted over TCP".into(),
    };
    format!(
        "single calls (each its slowest rank): median {} us, p99 {} us, {slept}",
        us(s.median_us),
        us(s.p99_us)
    )
}

/// Microseconds with two decimals below 10, one below 1000, none above.
pub fn us(v: f64) -> String {
    match v {
        v if v < 10.0 => format!("{v:.2}"),
        v if v < 1000.0 => format!("{v:.1}"),
        v => format!("{v:.0}"),
    }
}

/// The nearest-rank percentile `p` of `sorted` (nccl-tests' `i_p99`): the smallest value
/// that at least p % of the values do not exceed.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(calls: &[(f32, bool)]) -> Vec<u8> {
        calls
            .iter()
            .flat_map(|(s, slept)| s.to_le_bytes().into_iter().chain([*slept as u8]))
            .collect()
    }

    #[test]
    fn each_call_counts_as_its_slowest_rank_and_any_sleep_counts() {
        let a = encoded(&[(1e-6, false), (5e-6, true), (2e-6, false)]);
        let b = encoded(&[(3e-6, false), (1e-6, false), (2e-6, false)]);
        let s = combine(&[a, b], true).unwrap();
        assert_eq!(s.calls, 3);
        assert!((s.median_us - 3.0).abs() < 1e-3, "{s:?}"); // slowest: 3, 5, 2
        assert!((s.p99_us - 5.0).abs() < 1e-3, "{s:?}");
        assert_eq!(s.slept, Some(1));
        assert_eq!(combine(&[encoded(&[(1e-6, true)])], false).unwrap().slept, None);
        assert!(combine(&[vec![]], true).is_none());
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!((percentile(&v, 50.0), percentile(&v, 99.0)), (50.0, 99.0));
        assert_eq!(percentile(&v[..20], 99.0), 20.0); // fewer than 100: p99 is the largest
        assert_eq!(percentile(&[7.0], 50.0), 7.0);
    }

    #[test]
    fn stamps_give_one_time_per_call() {
        let mut s = Stamps::new(3);
        for _ in 0..4 {
            s.mark();
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        s.mark(); // beyond the loop: ignored
        let bytes = s.encode();
        assert_eq!(bytes.len(), 15);
        let one = combine(&[bytes], true).unwrap();
        assert!(one.median_us > 1500.0 && one.median_us < 1e6, "{one:?}");
    }
}
