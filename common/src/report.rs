//! Reports: the result check, the timing with nccl-tests' bandwidth formulas, and the
//! JSON document that `--format json` prints for programs and tests.

use crate::backend::bus_factor;
use crate::transport::Op;
use serde::Serialize;
use std::collections::BTreeMap;

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
    /// The bandwidths of moving `bytes` with `op` on `n` ranks in `seconds`.
    pub fn new(op: Op, bytes: usize, n: usize, seconds: f64) -> Timing {
        let algbw = if seconds > 0.0 {
            bytes as f64 / 1e9 / seconds
        } else {
            0.0
        };
        Timing {
            seconds,
            algbw,
            busbw: algbw * bus_factor(op, n),
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bandwidths_follow_nccl_tests() {
        // 100 MiB all-reduce on 4 ranks in 0.1 s: algbw 1.048576 GB/s, busbw × 1.5.
        let t = Timing::new(Op::AllReduce, 100 << 20, 4, 0.1);
        assert!((t.algbw - 1.048576).abs() < 1e-9);
        assert!((t.busbw - 1.572864).abs() < 1e-9);
        let t = Timing::new(Op::Broadcast, 1_000_000_000, 8, 2.0);
        assert_eq!((t.algbw, t.busbw), (0.5, 0.5));
        assert_eq!(Timing::new(Op::AllReduce, 4, 1, 0.001).busbw, 0.0);
    }

    #[test]
    fn sizes_for_people() {
        assert_eq!(human_bytes(16), "16 B");
        assert_eq!(human_bytes(100 << 20), "100.0 MiB");
    }
}
