//! Reports: the result check, the timing with nccl-tests' bandwidth formulas, and the
//! JSON document that `--format json` prints for programs and tests.

use serde::Serialize;
use std::collections::BTreeMap;
use workbook_cpu::transport::Via;

/// The whole run, as one JSON document (printed by rank 0 at the end).
#[derive(Serialize, Default, Debug)]
pub struct Report {
    /// The example's name, e.g. `02-nccl-allreduce`.
    pub example: String,
    /// `cpu` or `nccl`.
    pub backend: String,
    /// Why that backend (the line text output prints).
    pub backend_reason: String,
    /// NCCL's version, on the NCCL backend.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nccl_version: Option<String>,
    /// The libnccl file every rank loaded (rank 0's; all ranks run the same version).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nccl_library: Option<String>,
    /// `--simulate-gpus`: how many GPUs were simulated in host memory (no time or
    /// bandwidth of the run is a GPU's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub simulated_gpus: Option<usize>,
    /// CPU backend: the transport of every pair of ranks ("0-1": "shm").
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub transports: BTreeMap<String, Via>,
    /// `--link`: the simulated network every TCP link took the time of ("5 µs, 10
    /// Gbit/s"); no time or bandwidth across nodes is this machine's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub simulated_link: Option<String>,
    /// The benchmark on sub-communicators (`NCCL_TESTS_SPLIT`): which variable split the
    /// world, how, and into which communicators.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub split: Option<serde_json::Value>,
    /// Lesson 10: each way of running a training step, with its times (rank 0's).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub overlap: Vec<serde_json::Value>,
    /// Rank 0's streams ([`crate::Session::overlap`]), in the order they were opened: each
    /// collective's times and the layers computed meanwhile.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub streams: Vec<crate::session::StreamReport>,
    /// Number of ranks.
    pub world_size: usize,
    /// Elements per buffer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub count: Option<usize>,
    /// One entry per rank, in rank order.
    pub ranks: Vec<RankReport>,
    /// The result check over every element of every rank.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub check: Option<Check>,
    /// Time of one collective, slowest rank, in microseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time_us: Option<f64>,
    /// Algorithm bandwidth: buffer bytes / time, in GB/s (1e9 B/s).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub algbw_gbps: Option<f64>,
    /// Bus bandwidth: algbw times nccl-tests' factor for the collective.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub busbw_gbps: Option<f64>,
    /// The algorithm of the timed collective: the tuner's name (`single-copy`), or on
    /// NCCL "NCCL's choice".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub algo: Option<String>,
    /// The protocol it ran with on the CPU backend: `ll`, `ll128` or `simple` (NCCL's
    /// LL, LL128, Simple).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proto: Option<String>,
    /// The same timed calls one by one: median, p99 and how many slept (CPU backend).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub single_calls: Option<SingleCalls>,
    /// Why the timed calls overlap, when they may: back to back, a rank of a rooted
    /// collective leaves before the others are done, and its next call starts early.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub calls_overlap: Option<String>,
    /// The benchmark's sweep when there is one (its fields at the top level, as before
    /// there were several).
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub perf: Option<Perf>,
    /// The benchmark's sweeps when there are several (`--coll all`, `-o all`, `-d all`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sweeps: Vec<Perf>,
}

/// A benchmark sweep, as nccl-tests prints it: one row per size.
#[derive(Serialize, Debug, Clone, Default)]
pub struct Perf {
    /// The collective, by nccl-tests' name (`all_gather`).
    pub op: String,
    /// `float`, `double`, `int32`, `half` or `bfloat16`.
    #[serde(rename = "type")]
    pub datatype: String,
    /// The reduction operator, or `none`.
    pub redop: String,
    /// Single-thread memcpy bandwidth of 100 MiB on rank 0 (in memory), GB/s: a
    /// reference for busbw on one machine, not a bound (several cores copy at once).
    pub memcpy_gbps: f64,
    /// One row per size.
    pub rows: Vec<PerfRow>,
    /// The mean of the busbw column(s), as nccl-tests' `# Avg bus bandwidth`.
    pub avg_busbw: f64,
    /// Wrong elements over every size, placement and rank.
    pub wrong: u64,
    /// The `NCCL_ALGO` value the sweep ran under (the benchmark's `-A`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nccl_algo: Option<String>,
    /// The `NCCL_PROTO` value the sweep ran under (the benchmark's `-P`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nccl_proto: Option<String>,
    /// On the CPU backend, the smallest size whose buffers (send and receive, per rank)
    /// reach 3/4 of a rank's share of its host's last-level cache: from there the rows run
    /// from memory, and `--fit` fits them apart. Absent when no size does, and on NCCL.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub out_of_cache_from: Option<usize>,
    /// The share 3/4 of which that size's buffers reach, in bytes (with
    /// `out_of_cache_from`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_share_bytes: Option<usize>,
    /// On the CPU backend, the smallest size whose buffers (send and receive, per rank)
    /// outgrow a rank's share of its core's own cache (an L2), where a smaller size's fit
    /// in it: in it, the other ranks' cores may still hold the lines a rank writes, from
    /// the last call, and `--fit` fits those sizes apart. Absent when no size does, and on
    /// NCCL.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub out_of_core_cache_from: Option<usize>,
    /// The share that size's buffers outgrow, in bytes (with `out_of_core_cache_from`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub core_cache_share_bytes: Option<usize>,
    /// The model fitted to its out-of-place times (the benchmark's `--fit`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fit: Option<Fit>,
    /// `--fit` on a sweep whose sizes ran several algorithms (the tuner's choice), or ran
    /// from the cache then from memory: one fit per algorithm and side of the cache, over
    /// the sizes it ran.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fits: Vec<AlgoFit>,
    /// `--fit` on NCCL: NCCL's own cost model for the collective, the cells of its TUNING
    /// table that can run (latency µs, bandwidth GB/s), as rank 0's NCCL printed them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub nccl_costs: Vec<workbook_nccl::nccl_log::Cost>,
}

/// One algorithm's rows of a sweep that ran several (or one, from the cache then from
/// memory), and the model fitted to them.
#[derive(Serialize, Debug, Clone, Default, PartialEq)]
pub struct AlgoFit {
    /// The algorithm, by the tuner's name.
    pub algo: String,
    /// Where its buffers were, where the sweep's sizes crossed a cache's share
    /// (`out_of_core_cache_from`, `out_of_cache_from`); absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache: Option<CacheSide>,
    /// The smallest and the largest size it ran, in bytes.
    pub from_bytes: usize,
    /// See `from_bytes`.
    pub to_bytes: usize,
    /// Its fit, if its rows make one (two sizes or more, a time that grows).
    #[serde(flatten)]
    pub fit: Option<Fit>,
}

/// Where a size's buffers are, for `--fit` on the CPU backend: each side gets its own line.
#[derive(Serialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum CacheSide {
    /// Within a rank's share of its core's own cache (an L2).
    Core,
    /// Past the core's cache, below 3/4 of the rank's share of the last-level cache.
    Shared,
    /// From 3/4 of the last-level share: from memory.
    Memory,
}

/// time ≈ α + size / β, fitted to a sweep's out-of-place times (least squares of the
/// relative errors, so that the small sizes weigh as much as the large).
#[derive(Serialize, Debug, Clone, Copy, Default, PartialEq)]
pub struct Fit {
    /// α: the time of an empty call, in µs (the latency of the algorithm's steps).
    pub alpha_us: f64,
    /// β: bytes per second, in GB/s, at which the time grows with the size.
    pub beta_gbps: f64,
    /// The largest relative error of the fit over the sweep's sizes (0.1: 10%).
    pub worst_error: f64,
    /// Whether it was fitted to each size's median call (the single calls the CPU
    /// backend times one by one), which one interrupted call does not move, rather than
    /// to the mean of the timed loop (NCCL, whose calls are only queued when they return).
    pub medians: bool,
}

/// One size of the sweep.
#[derive(Serialize, Debug, Clone, Default)]
pub struct PerfRow {
    /// Bytes of the larger of a rank's buffers (nccl-tests' size).
    pub size: usize,
    /// Elements of that buffer.
    pub count: usize,
    /// The element type.
    #[serde(rename = "type")]
    pub datatype: String,
    /// The operator, or `none`.
    pub redop: String,
    /// The root rank, or -1 when there is none.
    pub root: i64,
    /// Separate send and receive buffers.
    pub out_of_place: Placement,
    /// One buffer, overwritten with the result.
    pub in_place: Placement,
}

/// The figures of one placement at one size.
#[derive(Serialize, Debug, Clone, Default)]
pub struct Placement {
    /// Microseconds per operation, combined over ranks as `-a` says.
    pub time_us: f64,
    /// Bytes / time, GB/s.
    pub algbw: f64,
    /// algbw × the collective's bus factor, GB/s.
    pub busbw: f64,
    /// Wrong elements over every rank (nccl-tests' #wrong); absent when not checked.
    pub wrong: Option<u64>,
    /// The algorithm that ran (the tuner's name; on NCCL, "NCCL's choice").
    pub algo: String,
    /// The protocol it ran with (`ll`, `ll128`, `simple`; on NCCL empty: NCCL chooses,
    /// as `algo` says).
    pub proto: String,
    /// Steps (LL, LL128) or pieces (Simple) the ranks sent over shared memory by that
    /// protocol during the timed runs, all together: what shows the protocol ran (null
    /// off the CPU backend).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proto_steps: Option<u64>,
    /// Single calls (nccl-tests' `-I`): the median of each call's slowest rank, µs
    /// (null on NCCL, whose calls are queued, not finished, when they return).
    pub median_us: Option<f64>,
    /// Their 99th percentile (nearest rank), µs.
    pub p99_us: Option<f64>,
    /// Calls in which some rank slept on the shared-memory futex (null over TCP, which
    /// does not count its waits).
    pub slept: Option<u64>,
}

/// The timed calls one by one (nccl-tests' `-I`): each call counts as its slowest rank.
#[derive(Serialize, Debug, Clone, Copy, PartialEq)]
pub struct SingleCalls {
    /// Calls stamped (the first ones of the loop, up to 10 000).
    pub calls: usize,
    /// The median call, µs.
    pub median_us: f64,
    /// The 99th percentile (nearest rank: the largest under 100 calls), µs.
    pub p99_us: f64,
    /// Calls in which some rank slept on the shared-memory futex instead of spinning;
    /// `None` where a transport does not count (TCP).
    pub slept: Option<u64>,
}

/// What one rank reported.
#[derive(Serialize, Default, Debug, Clone)]
pub struct RankReport {
    /// The rank.
    pub rank: usize,
    /// Its index on its node.
    pub local_rank: usize,
    /// Its host.
    pub host: String,
    /// Its process id.
    pub pid: u32,
    /// Its device, e.g. `cpu:1` or `cuda:0`.
    pub device: String,
    /// The GPU's name, on NCCL.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_name: Option<String>,
    /// The elements shown at each stage (`before`, `after`).
    #[serde(flatten)]
    pub stages: BTreeMap<String, Vec<serde_json::Value>>,
}

/// The result check: how many elements, over all ranks, differ from the expected value.
#[derive(Serialize, Debug, Clone, Default)]
pub struct Check {
    /// No wrong element anywhere.
    pub ok: bool,
    /// Wrong elements over all ranks (nccl-tests' #wrong).
    pub wrong: u64,
}

/// Timing of a collective, with nccl-tests' formulas.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    /// Seconds per operation (slowest rank).
    pub seconds: f64,
    /// Buffer bytes / seconds / 1e9.
    pub algbw: f64,
    /// `algbw` × the collective's bus factor (all-reduce: 2(n-1)/n; broadcast: 1).
    pub busbw: f64,
}

impl Timing {
    /// The bandwidths of moving `bytes` in `seconds` with a collective whose bus factor
    /// (on this many ranks) is `bus_factor`.
    pub fn new(bus_factor: f64, bytes: usize, seconds: f64) -> Timing {
        let algbw = if seconds > 0.0 {
            bytes as f64 / 1e9 / seconds
        } else {
            0.0
        };
        Timing {
            seconds,
            algbw,
            busbw: algbw * bus_factor,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bandwidths_follow_nccl_tests() {
        // 100 MiB all-reduce on 4 ranks in 0.1 s: algbw 1.048576 GB/s, busbw × 1.5.
        let t = Timing::new(1.5, 100 << 20, 0.1);
        assert!((t.algbw - 1.048576).abs() < 1e-9);
        assert!((t.busbw - 1.572864).abs() < 1e-9);
        let t = Timing::new(1.0, 1_000_000_000, 2.0);
        assert_eq!((t.algbw, t.busbw), (0.5, 0.5));
        assert_eq!(Timing::new(0.0, 4, 0.001).busbw, 0.0);
    }
}
