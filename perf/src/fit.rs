//! `--fit`: the simplest model of a collective's time, fitted to a sweep and set beside
//! it: time ≈ α + size/β. α is what every call pays whatever its size (the latency of the
//! algorithm's steps: NCCL's model counts 2(n − 1) steps for the ring's all-reduce,
//! 2·log₂(nodes) for the tree's, each a link's latency); β is the rate at which time
//! grows with the size (the links' bandwidth over the bytes each rank moves: busbw, for
//! the ring). Two algorithms' fits cross where the one with the smaller α stops winning:
//! `-A ring,tree --fit` predicts that size, which the sweep's rows then show or not.
//!
//! The fit minimises the relative errors, so that a 4 B row and a 4 MiB row weigh alike.
//! On the CPU backend it follows each size's median call (a mean moves with one call the
//! machine interrupted), and it fits apart the sizes whose buffers reach 3/4 of a rank's
//! share of the last-level cache (the rest holds other lines): from there β is memory's,
//! not the cache's, and one line through both misses both. So too the sizes whose
//! buffers fit in a rank's share of its core's own cache (an L2), where an all-reduce's
//! β is lower: each rank's piece of the result is still in the other cores' caches,
//! which copied it in the last call, and each store waits to take its line back (2 ranks
//! on a 2-core VM: 12-15 GB/s there against 26-32 in the shared cache; the other
//! collectives' β moves little there).

use common::report::{AlgoFit, CacheSide, Fit, Perf, PerfRow};
use workbook_runtime::units::human_bytes;

/// A run of a sweep's sizes that one line should follow: one algorithm, and one side of
/// the cache (`None` where the sweep's sizes stay on one side).
#[derive(PartialEq, Clone)]
struct Key {
    algo: String,
    cache: Option<CacheSide>,
}

/// The key of each of `p`'s rows: its out-of-place algorithm and, where the sweep
/// crosses a rank's share of its core's cache or of the last-level cache, which side
/// the row is on.
fn key(p: &Perf, r: &PerfRow) -> Key {
    Key {
        algo: r.out_of_place.algo.clone(),
        cache: side(p, r.size),
    }
}

/// Where a `size`'s buffers are, where `p`'s sweep crosses a cache's share: in the core's
/// own cache (below `out_of_core_cache_from`), from memory (from `out_of_cache_from`), in
/// the shared cache between.
fn side(p: &Perf, size: usize) -> Option<CacheSide> {
    let (core, memory) = (p.out_of_core_cache_from, p.out_of_cache_from);
    if core.is_none() && memory.is_none() {
        return None;
    }
    Some(match (core, memory) {
        (_, Some(from)) if size >= from => CacheSide::Memory,
        (Some(from), _) if size < from => CacheSide::Core,
        _ => CacheSide::Shared,
    })
}

/// Whether every row has a median call to fit: the single calls the CPU backend times one
/// by one (a mean moves with one call the machine interrupted, a median does not). On
/// NCCL, the fit follows the mean of the timed loop.
fn medians(p: &Perf) -> bool {
    p.rows.iter().all(|r| r.out_of_place.median_us.is_some())
}

/// Sizes in a row of a sweep that one line follows, and their `(size, µs)` points.
struct Run {
    key: Key,
    from_bytes: usize,
    to_bytes: usize,
    points: Vec<(f64, f64)>,
}

/// `p`'s rows in runs of one key, in order.
fn runs(p: &Perf) -> Vec<Run> {
    let use_medians = medians(p);
    let mut runs: Vec<Run> = vec![];
    for r in &p.rows {
        let key = key(p, r);
        let point = match (use_medians, r.out_of_place.median_us) {
            (true, Some(median)) => (r.size as f64, median),
            _ => (r.size as f64, r.out_of_place.time_us),
        };
        match runs.last_mut() {
            Some(run) if run.key == key => {
                run.to_bytes = r.size;
                run.points.push(point);
            }
            _ => runs.push(Run {
                key,
                from_bytes: r.size,
                to_bytes: r.size,
                points: vec![point],
            }),
        }
    }
    runs
}

/// The fit to `p`'s out-of-place times, if it has two sizes or more, they ran one
/// algorithm on one side of the cache, and they say something (a time that grows with
/// the size).
pub fn fit(p: &Perf) -> Option<Fit> {
    let mut runs = runs(p);
    if runs.len() != 1 {
        return None;
    }
    fit_points(runs.remove(0).points, medians(p))
}

/// When `p`'s sizes ran several algorithms (the tuner's choice), or ran from the cache
/// then from memory: a fit to each run of sizes that did one, in order; empty otherwise.
pub fn by_run(p: &Perf) -> Vec<AlgoFit> {
    let runs = runs(p);
    if runs.len() < 2 {
        return vec![];
    }
    let use_medians = medians(p);
    runs.into_iter()
        .map(|run| AlgoFit {
            algo: run.key.algo,
            cache: run.key.cache,
            from_bytes: run.from_bytes,
            to_bytes: run.to_bytes,
            fit: fit_points(run.points, use_medians),
        })
        .collect()
}

/// The line through `(size, µs)` points, if they make one.
fn fit_points(points: Vec<(f64, f64)>, medians: bool) -> Option<Fit> {
    let points: Vec<(f64, f64)> = points.into_iter().filter(|(_, t)| *t > 0.0).collect();
    let (a, b) = weighted_line(&points)?;
    // A time that does not grow with the size has no bandwidth to say.
    if b <= 0.0 {
        return None;
    }
    let worst = points
        .iter()
        .map(|(x, t)| ((a + b * x) - t).abs() / t)
        .fold(0.0, f64::max);
    Some(Fit {
        alpha_us: a.max(0.0),
        // b is µs per byte: 1 / b bytes per µs, 1e-3 / b GB/s.
        beta_gbps: 1e-3 / b,
        worst_error: worst,
        medians,
    })
}

/// The line t = a + b·x minimising Σ ((a + b·x − t) / t)² (weights 1/t²), or `None` with
/// fewer than two distinct sizes.
fn weighted_line(points: &[(f64, f64)]) -> Option<(f64, f64)> {
    let (mut sw, mut swx, mut swxx, mut swt, mut swxt) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for &(x, t) in points {
        let w = 1.0 / (t * t);
        sw += w;
        swx += w * x;
        swxx += w * x * x;
        swt += w * t;
        swxt += w * x * t;
    }
    let det = sw * swxx - swx * swx;
    if points.len() < 2 || det.abs() <= f64::EPSILON * sw * swxx {
        return None;
    }
    let b = (sw * swxt - swx * swt) / det;
    let a = (swt - b * swx) / sw;
    Some((a, b))
}

/// `time ≈ 12.3 us + size / 4.56 GB/s (every size's median call within 8% of it)`.
fn model(f: &Fit) -> String {
    let rows = match f.medians {
        true => "every size's median call",
        false => "every row",
    };
    format!(
        "time ≈ {:.1} us + size / {:.2} GB/s ({rows} within {:.0}% of it)",
        f.alpha_us,
        f.beta_gbps,
        f.worst_error * 100.0
    )
}

/// The lines under a sweep: `# fit (out of place): time ≈ ...`; for a sweep that ran
/// several algorithms, or from the cache then from memory, one per run of sizes and,
/// between two that follow each other, where the tuner switched and where their fits
/// cross, or what leaving the cache did to β; or why there is none.
pub fn lines(p: &Perf) -> Vec<String> {
    if let Some(f) = &p.fit {
        return vec![format!("# fit (out of place): {}", model(f))];
    }
    if p.fits.is_empty() {
        return vec!["# fit: none (two sizes or more, whose time grows with the size, make one)".into()];
    }
    let algos = p.fits.windows(2).any(|w| w[0].algo != w[1].algo);
    // Where the sweep left each cache: "from 8.0 MiB a rank's buffers reach 3/4 of its 16.0 MiB
    // share of the last-level cache", the core's own cache first.
    let mut reach = vec![];
    if let (Some(from), Some(share)) = (p.out_of_core_cache_from, p.core_cache_share_bytes) {
        reach.push(format!(
            "from {} a rank's buffers outgrow its {} share of its core's own cache",
            human_bytes(from),
            human_bytes(share)
        ));
    }
    if let (Some(from), Some(share)) = (p.out_of_cache_from, p.cache_share_bytes) {
        let whose = match reach.is_empty() {
            true => "a rank's buffers reach",
            false => "they reach",
        };
        reach.push(format!(
            "from {} {whose} 3/4 of its {} share of the last-level cache",
            human_bytes(from),
            human_bytes(share)
        ));
    }
    let mut out = vec![match (algos, reach.is_empty()) {
        (false, false) => format!(
            "# fit (out of place), one per side of the cache ({}):",
            reach.join(", ")
        ),
        (true, false) => format!(
            "# fit (out of place), one per algorithm the tuner chose and side of the cache ({}):",
            reach.join(", ")
        ),
        _ => "# fit (out of place), one per algorithm the tuner chose:".to_string(),
    }];
    let three_sides = p.out_of_core_cache_from.is_some();
    for (i, run) in p.fits.iter().enumerate() {
        let sizes = match run.from_bytes == run.to_bytes {
            true => human_bytes(run.from_bytes),
            false => format!("{} to {}", human_bytes(run.from_bytes), human_bytes(run.to_bytes)),
        };
        let side = match run.cache {
            Some(CacheSide::Core) => ", in the core's cache",
            Some(CacheSide::Shared) if three_sides => ", in the shared cache",
            Some(CacheSide::Shared) => ", in cache",
            Some(CacheSide::Memory) => ", from memory",
            None => "",
        };
        let what = match &run.fit {
            Some(f) => model(f),
            None => "no fit (one size, or a time that does not grow)".into(),
        };
        out.push(format!("#   {}{side} ({sizes}): {what}", run.algo));
        let Some(next) = p.fits.get(i + 1) else { continue };
        let (Some(a), Some(b)) = (&run.fit, &next.fit) else {
            continue;
        };
        let between = format!(
            "between {} and {}",
            human_bytes(run.to_bytes),
            human_bytes(next.from_bytes)
        );
        match (run.algo == next.algo, next.cache) {
            (true, Some(CacheSide::Shared)) => out.push(format!(
                "#   past the core's cache {between}: β {:.2} → {:.2} GB/s",
                a.beta_gbps, b.beta_gbps
            )),
            (true, _) => out.push(format!(
                "#   out of the cache {between}: β {:.2} → {:.2} GB/s",
                a.beta_gbps, b.beta_gbps
            )),
            (false, _) => out.push(format!(
                "#   {} → {} {between} (the tuner); the fits: {}",
                run.algo,
                next.algo,
                crossing(a, b, &run.algo, &next.algo)
            )),
        }
    }
    out
}

/// `--fit` on NCCL: NCCL's own model beside the fit, one line per algorithm and protocol
/// its TUNING table lets run (`nccl_costs`: `None` off NCCL), with the sizes the sweep's
/// rows say NCCL chose it for. NCCL's estimate is `latency + size / (1000·bandwidth)` µs
/// (`ncclTopoGetAlgoTime`), before its corrections by size.
/// `why_none` says why there is no table, where there is none.
pub fn nccl_lines(p: &Perf, on_nccl: bool, why_none: &str) -> Vec<String> {
    if !on_nccl {
        return vec![];
    }
    if p.nccl_costs.is_empty() {
        return vec![format!("# NCCL's own model: none ({why_none})")];
    }
    let mut out = vec![
        "# NCCL's own model (its TUNING table, rank 0): time = latency + size / bandwidth, per algorithm and \
         protocol:"
            .to_string(),
    ];
    for c in &p.nccl_costs {
        let chosen: Vec<usize> = p
            .rows
            .iter()
            .filter(|r| r.out_of_place.algo == c.algo && r.out_of_place.proto == c.proto)
            .map(|r| r.size)
            .collect();
        let when = match (chosen.first(), chosen.last()) {
            (Some(a), Some(b)) if a == b => format!("; NCCL chose it at {}", human_bytes(*a)),
            (Some(a), Some(b)) => format!("; NCCL chose it from {} to {}", human_bytes(*a), human_bytes(*b)),
            _ => String::new(),
        };
        out.push(format!(
            "#   {} {}: {:.1} us + size / {:.2} GB/s{when}",
            c.algo, c.proto, c.latency_us, c.bandwidth_gbs
        ));
    }
    out
}

/// With `-A`, for every collective, type and operator run by two algorithms or more:
/// where their fits cross, and which is faster below.
pub fn crossings(sweeps: &[Perf]) -> Vec<String> {
    let mut lines = vec![];
    for (i, a) in sweeps.iter().enumerate() {
        for b in &sweeps[i + 1..] {
            let same = a.op == b.op && a.datatype == b.datatype && a.redop == b.redop;
            let (Some(fa), Some(fb), Some(na), Some(nb)) = (small(a), small(b), &a.nccl_algo, &b.nccl_algo) else {
                continue;
            };
            if !same || na == nb {
                continue;
            }
            lines.push(format!(
                "# fit: {} {}, {na} against {nb}: {}",
                a.op,
                a.datatype,
                crossing(&fa, &fb, na, nb)
            ));
        }
    }
    lines
}

/// The fit that says where a sweep's algorithm stands against another's: its one fit, or,
/// where the one algorithm ran from the cache then from memory, the fit of its smaller
/// sizes (where latencies decide, and algorithms cross).
fn small(p: &Perf) -> Option<Fit> {
    match (p.fit, p.fits.first()) {
        (Some(f), _) => Some(f),
        (None, Some(first)) if p.fits.iter().all(|r| r.algo == first.algo) => first.fit,
        _ => None,
    }
}

/// Where two fits cross, in words.
fn crossing(a: &Fit, b: &Fit, na: &str, nb: &str) -> String {
    // Time per byte, µs: 1e-3 / GB/s.
    let (pa, pb) = (1e-3 / a.beta_gbps, 1e-3 / b.beta_gbps);
    let (fast_small, fast_large) = match a.alpha_us <= b.alpha_us {
        true => (na, nb),
        false => (nb, na),
    };
    let x = (b.alpha_us - a.alpha_us) / (pa - pb);
    match x.is_finite() && x > 0.0 {
        true => format!(
            "they cross at {} ({fast_small} faster below, {fast_large} above)",
            human_bytes(x as usize)
        ),
        false => format!("they do not cross ({fast_small} faster at every size)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::report::{PerfRow, Placement};

    fn sweep(algo: &str, alpha: f64, gbps: f64) -> Perf {
        let rows = [4096usize, 65536, 1 << 20, 16 << 20]
            .iter()
            .map(|&size| PerfRow {
                size,
                out_of_place: Placement {
                    time_us: alpha + size as f64 * 1e-3 / gbps,
                    algo: algo.into(),
                    ..Placement::default()
                },
                ..PerfRow::default()
            })
            .collect();
        Perf {
            op: "all_reduce".into(),
            datatype: "float".into(),
            redop: "sum".into(),
            rows,
            nccl_algo: Some(algo.into()),
            ..Perf::default()
        }
    }

    #[test]
    fn a_sweep_on_the_model_gives_the_model_back() {
        let f = fit(&sweep("ring", 40.0, 5.0)).unwrap();
        assert!(
            (f.alpha_us - 40.0).abs() < 1e-6 && (f.beta_gbps - 5.0).abs() < 1e-9,
            "{f:?}"
        );
        assert!(f.worst_error < 1e-9);
        let mut p = sweep("ring", 40.0, 5.0);
        p.fit = Some(f);
        assert_eq!(
            lines(&p),
            ["# fit (out of place): time ≈ 40.0 us + size / 5.00 GB/s (every row within 0% of it)"]
        );
        // Rows that ran two algorithms fit no one line: a line each.
        p.rows[3].out_of_place.algo = "ring-pipelined".into();
        p.fit = fit(&p);
        assert_eq!(p.fit, None);
        assert!(by_run(&sweep("ring", 40.0, 5.0)).is_empty());
    }

    #[test]
    fn a_sweep_of_two_algorithms_gets_a_fit_each_and_where_they_cross() {
        // direct: α 1 µs, 1 GB/s up to 64 KiB; ring: α 40 µs, 5 GB/s from 1 MiB.
        let mut p = sweep("direct", 1.0, 1.0);
        p.rows.truncate(2);
        let ring = sweep("ring", 40.0, 5.0);
        p.rows.extend(ring.rows[2..].iter().cloned());
        p.fit = fit(&p);
        p.fits = by_run(&p);
        assert_eq!(p.fits.len(), 2);
        assert_eq!((p.fits[0].from_bytes, p.fits[0].to_bytes), (4096, 65536));
        let d = p.fits[0].fit.unwrap();
        assert!(
            (d.alpha_us - 1.0).abs() < 1e-6 && (d.beta_gbps - 1.0).abs() < 1e-9,
            "{d:?}"
        );
        // Equal where 1 + x/1000 = 40 + x/5000: x = 48,750 B.
        assert_eq!(
            lines(&p),
            [
                "# fit (out of place), one per algorithm the tuner chose:",
                "#   direct (4.0 KiB to 64.0 KiB): time ≈ 1.0 us + size / 1.00 GB/s (every row within 0% of it)",
                "#   direct → ring between 64.0 KiB and 1.0 MiB (the tuner); the fits: they cross at 47.6 KiB \
                 (direct faster below, ring above)",
                "#   ring (1.0 MiB to 16.0 MiB): time ≈ 40.0 us + size / 5.00 GB/s (every row within 0% of it)",
            ]
        );
    }

    #[test]
    fn sizes_out_of_the_cache_get_a_fit_of_their_own_to_the_median_calls() {
        // single-copy: 2 µs + 16 GB/s in the cache, up to 1 MiB; from memory, 5 GB/s.
        let mut p = sweep("single-copy", 2.0, 16.0);
        p.rows.truncate(3);
        p.rows.extend(sweep("single-copy", 2.0, 5.0).rows[3..].iter().cloned());
        p.rows.push(PerfRow {
            size: 64 << 20,
            ..sweep("single-copy", 2.0, 5.0).rows[3].clone()
        });
        p.rows[4].out_of_place.time_us = 2.0 + (64 << 20) as f64 * 1e-3 / 5.0;
        // The means: one call the machine interrupted at 64 KiB; the medians: the model.
        for r in &mut p.rows {
            r.out_of_place.median_us = Some(r.out_of_place.time_us);
        }
        p.rows[1].out_of_place.time_us *= 10.0;
        p.out_of_cache_from = Some(16 << 20);
        p.cache_share_bytes = Some(16 << 20);
        p.fit = fit(&p);
        p.fits = by_run(&p);
        assert_eq!(p.fit, None);
        let sides: Vec<_> = p.fits.iter().map(|r| (r.cache, r.from_bytes, r.to_bytes)).collect();
        let (shared, memory) = (Some(CacheSide::Shared), Some(CacheSide::Memory));
        assert_eq!(sides, [(shared, 4096, 1 << 20), (memory, 16 << 20, 64 << 20)]);
        let (cache, memory) = (p.fits[0].fit.unwrap(), p.fits[1].fit.unwrap());
        assert!((cache.beta_gbps - 16.0).abs() < 1e-6 && cache.medians, "{cache:?}");
        assert!((memory.beta_gbps - 5.0).abs() < 1e-6, "{memory:?}");
        assert_eq!(
            lines(&p),
            [
                "# fit (out of place), one per side of the cache (from 16.0 MiB a rank's buffers reach 3/4 of its \
                 16.0 MiB share of the last-level cache):",
                "#   single-copy, in cache (4.0 KiB to 1.0 MiB): time ≈ 2.0 us + size / 16.00 GB/s (every size's \
                 median call within 0% of it)",
                "#   out of the cache between 1.0 MiB and 16.0 MiB: β 16.00 → 5.00 GB/s",
                "#   single-copy, from memory (16.0 MiB to 64.0 MiB): time ≈ 2.0 us + size / 5.00 GB/s (every size's \
                 median call within 0% of it)",
            ]
        );
        // Against another algorithm, the sweep stands by its smaller sizes' fit: 2 + x/16000
        // = 1 + x/2000 µs at x = 2,286 B.
        p.nccl_algo = Some("ring".into());
        let mut tree = sweep("tree", 1.0, 2.0);
        tree.fit = fit(&tree);
        assert_eq!(
            crossings(&[p, tree]),
            ["# fit: all_reduce float, ring against tree: they cross at 2.2 KiB (tree faster below, ring above)"]
        );
    }

    #[test]
    fn two_algorithms_cross_where_the_latency_stops_paying() {
        // tree: α 10 µs, 2.5 GB/s; ring: α 40 µs, 5 GB/s: equal at 30 µs = x·(0.4 − 0.2) ns/B,
        // x = 150,000 B.
        let mut sweeps = vec![sweep("ring", 40.0, 5.0), sweep("tree", 10.0, 2.5)];
        for s in &mut sweeps {
            s.fit = fit(s);
        }
        let lines = crossings(&sweeps);
        assert_eq!(
            lines,
            ["# fit: all_reduce float, ring against tree: they cross at 146.5 KiB (tree faster below, ring above)"]
        );
        assert!(fit(&Perf::default()).is_none());
    }

    #[test]
    fn sizes_in_the_cores_cache_get_a_fit_of_their_own_too() {
        // 1 µs + 10 GB/s while the buffers fit a core's cache (4 and 64 KiB), 20 µs + 40 GB/s
        // in the shared cache (1 MiB to 16 MiB), 5 GB/s from memory (64, 128 MiB).
        let at = |size: usize, alpha: f64, gbps: f64| PerfRow {
            size,
            out_of_place: Placement {
                time_us: alpha + size as f64 * 1e-3 / gbps,
                median_us: Some(alpha + size as f64 * 1e-3 / gbps),
                algo: "single-copy".into(),
                ..Placement::default()
            },
            ..PerfRow::default()
        };
        let mut p = sweep("single-copy", 1.0, 10.0);
        p.rows = vec![
            at(4 << 10, 1.0, 10.0),
            at(64 << 10, 1.0, 10.0),
            at(1 << 20, 20.0, 40.0),
            at(4 << 20, 20.0, 40.0),
            at(16 << 20, 20.0, 40.0),
            at(64 << 20, 0.0, 5.0),
            at(128 << 20, 0.0, 5.0),
        ];
        p.out_of_core_cache_from = Some(1 << 20);
        p.core_cache_share_bytes = Some(1 << 20);
        p.out_of_cache_from = Some(64 << 20);
        p.cache_share_bytes = Some(32 << 20);
        p.fit = fit(&p);
        p.fits = by_run(&p);
        assert_eq!(p.fit, None);
        let sides: Vec<_> = p.fits.iter().map(|r| r.cache).collect();
        assert_eq!(
            sides,
            [Some(CacheSide::Core), Some(CacheSide::Shared), Some(CacheSide::Memory)]
        );
        let lines = lines(&p);
        assert_eq!(
            lines[..4],
            [
                "# fit (out of place), one per side of the cache (from 1.0 MiB a rank's buffers outgrow its 1.0 MiB \
                 share of its core's own cache, from 64.0 MiB they reach 3/4 of its 32.0 MiB share of the \
                 last-level cache):",
                "#   single-copy, in the core's cache (4.0 KiB to 64.0 KiB): time ≈ 1.0 us + size / 10.00 GB/s \
                 (every size's median call within 0% of it)",
                "#   past the core's cache between 64.0 KiB and 1.0 MiB: β 10.00 → 40.00 GB/s",
                "#   single-copy, in the shared cache (1.0 MiB to 16.0 MiB): time ≈ 20.0 us + size / 40.00 GB/s \
                 (every size's median call within 0% of it)",
            ]
        );
        assert_eq!(
            lines[4],
            "#   out of the cache between 16.0 MiB and 64.0 MiB: β 40.00 → 5.00 GB/s"
        );
        assert!(
            lines[5].starts_with("#   single-copy, from memory (64.0 MiB to 128.0 MiB): "),
            "{lines:?}"
        );
    }
}
