//! The double's tuning model: the latency (µs) and bandwidth (GB/s) of every collective
//! by every algorithm and protocol, which NCCL's `TUNING` table prints and from which
//! each collective's algorithm is chosen (`super::tuning`).
//!
//! **The numbers are the double's, shaped as NCCL's.** The double's ranks talk through
//! host memory, which NCCL has no model of; the double plays them as NCCL's `NET` case of
//! nodes of one GPU each (`nNodes == nRanks`, one rank per node) joined by a network of
//! [`LINK_GBS`] per channel on [`CHANNELS`] channel, Ampere GPUs (compute capability 8.0,
//! as the double's devices say) and Intel CPUs, and computes what
//! `ncclTopoTuneModel` (`src/graph/tuning.cc`, NCCL 2.28.9, its constants included) would
//! from there. Nothing in them was measured: they say what NCCL would think of such a
//! machine, never how fast the double is.

/// The algorithms, in NCCL's order (`NCCL_ALGO_TREE` ... `NCCL_ALGO_PAT`).
pub const TREE: usize = 0;
pub const RING: usize = 1;
pub const COLLNET_DIRECT: usize = 2;
pub const COLLNET_CHAIN: usize = 3;
pub const NVLS: usize = 4;
pub const NVLS_TREE: usize = 5;
pub const PAT: usize = 6;
/// The protocols, in NCCL's order.
pub const LL: usize = 0;
pub const LL128: usize = 1;
pub const SIMPLE: usize = 2;
/// The collectives, in NCCL's order (`ncclFuncBroadcast` ... `ncclFuncAllReduce`).
pub const BROADCAST: usize = 0;
pub const REDUCE: usize = 1;
pub const ALL_GATHER: usize = 2;
pub const REDUCE_SCATTER: usize = 3;
pub const ALL_REDUCE: usize = 4;

/// The network's nominal speed per channel, GB/s (a 100 Gb/s NIC): the graphs' `bwIntra`
/// and `bwInter` of the ring, the tree and PAT (the double has no CollNet, and no NVLS:
/// their graphs have no channel).
pub const LINK_GBS: f64 = 12.5;
/// Channels of the ring, the tree and PAT (each collective's `channel{Lo..Hi}={0..0}`).
pub const CHANNELS: usize = 1;

/// `baseLatencies` (µs), `[algorithm][protocol]`.
const BASE_LAT: [[f64; 3]; 7] = [
    [6.8, 14.0, 8.4],
    [6.6, 14.0, 8.4],
    [0.0; 3],
    [0.0; 3],
    [0.0; 3],
    [0.0; 3],
    [8.0, 8.0, 8.0],
];
/// `hwLatencies[NCCL_HW_NET]` (µs), `[algorithm][protocol]`.
const NET_LAT: [[f64; 3]; 7] = [
    [5.0, 8.5, 14.0],
    [2.7, 4.0, 14.0],
    [0.0, 0.0, 31.0],
    [0.0, 0.0, 30.0],
    [0.0, 0.0, 18.0],
    [0.0, 0.0, 20.9],
    [0.0, 0.0, 14.0],
];
/// `llMaxBws` of Intel CPUs (several nodes), by `nNodes` 1, 2, more.
const LL_MAX_BW: [f64; 3] = [39.0, 39.0, 20.4];
/// Ampere's `perChMaxRingLL128Bws`, `perChMaxTreeLL128Bws`, `perChMaxTreeBws`.
const RING_LL128_MAX_BW: [f64; 3] = [20.0, 20.0, 20.0];
const TREE_LL128_MAX_BW: [f64; 3] = [20.0, 20.0, 20.0];
const TREE_MAX_BW: [f64; 3] = [24.0, 23.6, 17.8];
/// `NCCL_SIMPLE_MAX_NTHREADS`, `NCCL_LL_MAX_NTHREADS`, `NCCL_LL128_MAX_NTHREADS`,
/// `NCCL_MAX_NTHREADS`, and `PCI_BW` (GB/s), below which the ring's Simple uses 256.
const SIMPLE_MAX_NTHREADS: i32 = 512;
const LL_MAX_NTHREADS: i32 = 512;
const LL128_MAX_NTHREADS: i32 = 640;
const MAX_NTHREADS: i32 = 640;
const PCI_BW: f64 = 12.0;

/// NCCL's model of a communicator, before `NCCL_ALGO` and `NCCL_PROTO` (and NCCL's own
/// rules) zero the bandwidth of what may not run (`super::tuning`).
#[derive(Clone, Debug, PartialEq)]
pub struct Model {
    /// `comm->latencies[collective][algorithm][protocol]`, µs.
    pub lat: [[[f32; 3]; 7]; 5],
    /// `comm->bandwidths[collective][algorithm][protocol]`, GB/s (0: cannot run).
    pub bw: [[[f32; 3]; 7]; 5],
    /// `comm->maxThreads[algorithm][protocol]`.
    pub threads: [[i32; 3]; 7],
}

/// `log2i`: the floor of the base-2 logarithm (0 for 0 and 1).
fn log2i(n: usize) -> usize {
    n.checked_ilog2().unwrap_or(0) as usize
}

/// The double's model of a communicator of `n` ranks (`n > 1`), each a node of one GPU:
/// `ncclTopoTuneModel` of NCCL 2.28.9 for `nNodes == nRanks == n`, with no CollNet and no
/// NVLS, that is, for each collective, algorithm and protocol that NCCL does not skip:
///
/// - the bus bandwidth `busBw` is [`LINK_GBS`] × [`CHANNELS`], refined as NCCL does: the
///   ring's LL at half of it (at most `llMaxBw`), the ring's LL128 at 0.92 of it, the
///   tree's all-reduce at 0.92 (at most the tree's per-channel maximum), then its LL at
///   1/3.8 and its LL128 at 120/128, PAT at 0.75; CollNet and NVLS have no channel: 0;
/// - the algorithm bandwidth is `busBw` × `n / nsteps` for the ring (`nsteps` = 2(n−1)
///   for the all-reduce, so n/(2(n−1)); n−1 for all-gather and reduce-scatter; n for
///   broadcast and reduce), × 0.5 for the tree; PAT's is `busBw`;
/// - the latency is `baseLat + nsteps × hwLat[NET][Tree]` for the ring's all-reduce,
///   all-gather and reduce-scatter (one rank per node: NCCL uses the tree's network
///   latency), `baseLat + hwLat[NET][Ring]` for its broadcast and reduce (one pipelined
///   hop: `sameChannels`), `baseLat + 2·log2(n)·hwLat[NET][Tree]` for the tree's
///   all-reduce, `baseLat + log2(n)·hwLat[NET][Tree]/3.5 + 2.8·n` for PAT, and the
///   network latency for CollNet (whose bandwidth is 0);
/// - what NCCL skips (the tree and PAT outside their collectives, NVLS) is 0.0/0.0, and
///   PAT runs Simple only (the double's nodes have one GPU each: NCCL's `ncclPatEnable`).
///
/// Left out: `NCCL_NTHREADS`, `NCCL_LL128_NTHREADS` and the other tuning variables, the
/// tree's 0.85 for a plain tree pattern, tuner plugins.
// Indices, as NCCL's loops: collective, algorithm and protocol index several tables.
#[allow(clippy::needless_range_loop)]
pub fn model(n: usize) -> Model {
    let mut m = Model {
        lat: [[[0.0; 3]; 7]; 5],
        bw: [[[0.0; 3]; 7]; 5],
        threads: [[0; 3]; 7],
    };
    let link = LINK_GBS * CHANNELS as f64;
    let ring_simple_threads = if link <= PCI_BW { 256 } else { SIMPLE_MAX_NTHREADS };
    m.threads[RING][SIMPLE] = ring_simple_threads;
    m.threads[TREE][SIMPLE] = SIMPLE_MAX_NTHREADS;
    for a in [COLLNET_DIRECT, COLLNET_CHAIN, NVLS, NVLS_TREE] {
        m.threads[a][SIMPLE] = MAX_NTHREADS;
    }
    for a in [RING, TREE] {
        m.threads[a][LL] = LL_MAX_NTHREADS;
        m.threads[a][LL128] = LL128_MAX_NTHREADS;
    }
    let index2 = if n <= 2 { n - 1 } else { 2 };
    let ll_max = LL_MAX_BW[index2];
    for c in 0..5 {
        let nsteps = match c {
            ALL_REDUCE => 2 * (n - 1),
            ALL_GATHER | REDUCE_SCATTER => n - 1,
            _ => n,
        };
        let ag_rs = c == ALL_GATHER || c == REDUCE_SCATTER;
        for a in 0..7 {
            if (c == BROADCAST || c == REDUCE) && a != RING {
                continue;
            }
            if ag_rs && ![PAT, RING, NVLS, COLLNET_DIRECT].contains(&a) {
                continue;
            }
            if c == ALL_REDUCE && a == PAT {
                continue;
            }
            for p in 0..3 {
                if (a == NVLS || a == NVLS_TREE) && p != SIMPLE {
                    continue;
                }
                if ag_rs && a == PAT && p != SIMPLE {
                    continue;
                }
                let channels = if [TREE, RING, PAT].contains(&a) { CHANNELS } else { 0 };
                // NVLS needs at least 2 channels.
                if (a == NVLS || a == NVLS_TREE) && channels < 2 {
                    continue;
                }
                let mut bus = if channels > 0 { link } else { 0.0 };
                if a == RING && p == LL {
                    bus = ll_max.min(bus * 0.5);
                }
                if a == RING && p == LL128 {
                    bus = (bus * 0.92).min(channels as f64 * RING_LL128_MAX_BW[index2]);
                }
                if a == TREE && c == ALL_REDUCE {
                    bus = (bus * 0.92).min(channels as f64 * TREE_MAX_BW[index2]);
                }
                if a == TREE && p == LL {
                    bus = (bus / 3.8).min(ll_max);
                }
                if a == TREE && p == LL128 {
                    bus = (bus * 120.0 / 128.0).min(channels as f64 * TREE_LL128_MAX_BW[index2]);
                }
                if a == PAT {
                    bus *= 0.75;
                }
                if !(a != RING && ag_rs) {
                    bus *= if a == RING { n as f64 / nsteps as f64 } else { 0.5 };
                }
                m.bw[c][a][p] = bus as f32;
                // One rank per node: every hop is a network hop, at the tree's latency.
                let inter = NET_LAT[TREE][p];
                let extra = match a {
                    RING if c == BROADCAST || c == REDUCE => NET_LAT[RING][p],
                    RING => nsteps as f64 * inter,
                    TREE if c == ALL_REDUCE => 2.0 * log2i(n) as f64 * inter,
                    COLLNET_DIRECT | COLLNET_CHAIN => inter,
                    PAT if ag_rs => log2i(n) as f64 * (inter / 3.5) + n as f64 * 2.8,
                    _ => 0.0,
                };
                m.lat[c][a][p] = (BASE_LAT[a][p] + extra) as f32;
            }
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `x` is `want` to f32's precision.
    fn close(x: f32, want: f64) -> bool {
        (f64::from(x) - want).abs() < 1e-4
    }

    #[test]
    fn the_ring_and_the_tree_have_nccls_ratios() {
        let m = model(4);
        // Ring all-reduce: busBw·n/(2(n−1)); all-gather: busBw·n/(n−1); broadcast: busBw.
        assert!(close(m.bw[ALL_REDUCE][RING][SIMPLE], 12.5 * 4.0 / 6.0));
        assert!(close(m.bw[ALL_GATHER][RING][SIMPLE], 12.5 * 4.0 / 3.0));
        assert!(close(m.bw[BROADCAST][RING][SIMPLE], 12.5));
        assert!(close(m.bw[ALL_REDUCE][RING][LL], 6.25 * 4.0 / 6.0));
        // Tree all-reduce: 0.92·busBw, halved; LL at 1/3.8 of that.
        assert!(close(m.bw[ALL_REDUCE][TREE][SIMPLE], 12.5 * 0.92 * 0.5));
        assert!(close(m.bw[ALL_REDUCE][TREE][LL], 12.5 * 0.92 / 3.8 * 0.5));
        assert!(close(m.lat[ALL_REDUCE][RING][SIMPLE], 8.4 + 6.0 * 14.0));
        assert!(close(m.lat[ALL_REDUCE][TREE][SIMPLE], 8.4 + 2.0 * 2.0 * 14.0));
        assert!(close(m.lat[BROADCAST][RING][LL], 6.6 + 2.7));
        // PAT: all-gather and reduce-scatter, Simple, one GPU per node.
        assert!(close(m.bw[ALL_GATHER][PAT][SIMPLE], 12.5 * 0.75));
        assert!(close(m.lat[ALL_GATHER][PAT][SIMPLE], 8.0 + 2.0 * 4.0 + 4.0 * 2.8));
        assert_eq!(m.bw[ALL_GATHER][PAT][LL], 0.0);
        assert_eq!(m.lat[ALL_REDUCE][PAT], [0.0; 3]);
        // What cannot run: no bandwidth.
        for c in 0..5 {
            for a in [COLLNET_DIRECT, COLLNET_CHAIN, NVLS, NVLS_TREE] {
                assert_eq!(m.bw[c][a], [0.0; 3]);
            }
            if c != ALL_REDUCE {
                assert_eq!(m.bw[c][TREE], [0.0; 3]);
            }
        }
        assert_eq!(m.threads[RING], [512, 640, 512]);
        assert_eq!(m.threads[PAT], [0, 0, 0]);
        assert_eq!(model(2).lat[ALL_REDUCE][TREE][LL], model(3).lat[ALL_REDUCE][TREE][LL]);
    }
}
