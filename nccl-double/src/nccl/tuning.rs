//! `NCCL_ALGO` and `NCCL_PROTO`, read as the NCCL being played reads them
//! (`src/graph/tuning.cc`, `ncclTopoTuneModel` at init; `enqueue.cc` at each collective),
//! and NCCL's `TUNING` lines:
//!
//! - up to 2.23, `parseList` takes one list (`Tree,Ring`, `^LL128`), compares names
//!   without case and ignores a name it does not know; from 2.24, `;`-separated lists may
//!   each name a collective (`allreduce:tree;broadcast:ring`), and an unknown name or
//!   collective fails the init with `ncclInvalidUsage` (`Unrecognized element token
//!   "Bogus" when parsing "Bogus"`);
//! - then NCCL's own rules, by version (the double has no CollNet and its ranks are nodes
//!   of one GPU each: [`super::model`]): CollNet and NVLS are disabled; up to 2.23, a list
//!   that leaves none of Ring, Tree, NVLS and NVLSTree gets Ring and Tree back ("ignoring
//!   NCCL_ALGO=COLLNET": `NCCL_ALGO=Bogus` runs); 2.18 never disables the ring of a
//!   collective other than the all-reduce; 2.19 to 2.23 give a collective left with
//!   nothing its ring back (`ringbdw`: every protocol up to 2.21, the enabled ones from
//!   2.22); LL128 is off by default (NCCL enables it by default only up to PCI switches,
//!   and the double's ranks are joined by a network); from 2.24 there is no way back;
//! - the table of latencies and bandwidths that results (bandwidth 0: may not run) is
//!   printed at init by rank 0 with `NCCL_DEBUG=INFO` and `TUNING` in
//!   `NCCL_DEBUG_SUBSYS`, as 2.18 to 2.30 print it: blocks of three algorithms (PAT, from
//!   2.23, alone in a third block), each an `Algorithm` line, a `Protocol` line (always
//!   three algorithms' worth), a `Max NThreads` line and one line per collective of
//!   `latency/bandwidth` per algorithm and protocol;
//! - each collective takes the algorithm and protocol of least time by that table (time =
//!   latency + bytes / (1000 × bandwidth), as `ncclTopoGetAlgoTime`, ties to the first);
//!   none left fails the call: `no algorithm/protocol available` (`ncclInternalError` up
//!   to 2.23; from 2.24 naming the variables, `ncclInvalidUsage` if one is set). Rank 0
//!   prints the choice (`TUNING`) when the call is launched: from 2.24 `AllReduce: 8
//!   Bytes -> Algo RING proto LL channel{Lo..Hi}={0..0}` (the call's count × type size);
//!   2.23 `AllReduce: 16 Bytes -> Algo 1 proto 0 time 16.600000` and 2.20 to 2.22 the
//!   same without the name (the bytes of the whole operation: × nranks for all-gather and
//!   reduce-scatter; algorithm and protocol by number); 2.18 and 2.19 print nothing.
//!   The double computes every result itself: the algorithm is a label.
//!
//! A communicator of one rank reads neither: `ncclTopoTuneModel` returns before them when
//! `nRanks <= 1` (every tag from 2.18 to 2.30), and its collectives are launched as one
//! copy, with no algorithm chosen (`ncclLaunchOneRank`): no table, no choice. Seen so on
//! an H200 with NCCL 2.28.3 (`bench/nccl-env.sh`, docs/gpu-runs.md): `NCCL_ALGO=Bogus`
//! inits and runs. Nor does a collective of no elements choose (NCCL drops it).

use super::model::{self, ALL_GATHER, ALL_REDUCE, Model, PAT, REDUCE_SCATTER, RING, TREE};
use super::work::{Call, Kind};
use super::{INTERNAL_ERROR, INVALID_USAGE};
use crate::exchange::Failure;
use crate::reduce::{DataType, Op};
use crate::version::version;

/// NCCL's collectives as `ncclFuncStr` names them (2.18 to 2.30); `ncclFuncToString`
/// names them alike.
const FUNCS: [&str; 5] = ["Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce"];
/// `ncclAlgoStr` (PAT from 2.23).
const ALGOS: [&str; 7] = [
    "Tree",
    "Ring",
    "CollNetDirect",
    "CollNetChain",
    "NVLS",
    "NVLSTree",
    "PAT",
];
/// `ncclAlgoToString` (2.23 and later).
const ALGO_NAMES: [&str; 7] = [
    "TREE",
    "RING",
    "COLLNET_DIRECT",
    "COLLNET_CHAIN",
    "NVLS",
    "NVLS_TREE",
    "PAT",
];
/// `ncclProtoStr`.
const PROTOS: [&str; 3] = ["LL", "LL128", "Simple"];
/// `ncclProtoToString`.
const PROTO_NAMES: [&str; 3] = ["LL", "LL128", "SIMPLE"];

/// What the variables enabled when a communicator started (NCCL's `algoEnable` and
/// `protoEnable` of that init; a later change of the variables reaches only the
/// communicators started after it), `[collective][name]`: 0 off, 1 on, 2 (LL128's
/// default) on where NCCL enables LL128 by default.
#[derive(Clone, Debug, PartialEq)]
pub struct Enabled {
    algos: [[u8; ALGOS.len()]; FUNCS.len()],
    protos: [[u8; PROTOS.len()]; FUNCS.len()],
}

/// How many algorithms NCCL `version` has (PAT from 2.23).
fn nalgos(version: u32) -> usize {
    if version >= 22300 { ALGOS.len() } else { 6 }
}

/// `parseList` of `text` over `elems`, into `list[collective][elem]`, as the version
/// played reads it.
fn parse_list<const N: usize>(text: &str, elems: &[&str], list: &mut [[u8; N]; 5], new: bool) -> Result<(), String> {
    if !new {
        // 2.18 to 2.23: one list for every collective; unknown names are ignored.
        let (def, set, body) = match text.strip_prefix('^') {
            Some(rest) => (1, 0, rest),
            None => (0, 1, text),
        };
        for row in list.iter_mut() {
            row.iter_mut().for_each(|x| *x = def);
            for token in body.split(',').filter(|t| !t.is_empty()) {
                if let Some(i) = elems.iter().position(|e| e.eq_ignore_ascii_case(token)) {
                    row[i] = set;
                }
            }
        }
        return Ok(());
    }
    for (k, entry) in text.split(';').filter(|e| !e.is_empty()).enumerate() {
        let mut parts = entry.split(':').filter(|p| !p.is_empty());
        let (prefix, body) = match (parts.next(), parts.next()) {
            (Some(p), Some(b)) => (Some(p), b),
            (Some(b), None) if k == 0 => (None, b),
            _ => return Err(format!("All entries except the first must have a prefix: \"{text}\"")),
        };
        let (unset, set, body) = match body.strip_prefix('^') {
            Some(rest) => (1, 0, rest),
            None => (0, 1, body),
        };
        let mut found = false;
        for (f, row) in list.iter_mut().enumerate() {
            if prefix.is_some_and(|p| !p.eq_ignore_ascii_case(FUNCS[f])) {
                continue;
            }
            found = true;
            row.iter_mut().for_each(|x| *x = unset);
            for token in body.split(',').filter(|t| !t.is_empty()) {
                match elems.iter().position(|e| e.eq_ignore_ascii_case(token)) {
                    Some(i) => row[i] = set,
                    None => {
                        return Err(format!(
                            "Unrecognized element token \"{token}\" when parsing \"{text}\""
                        ));
                    }
                }
            }
        }
        if !found {
            return Err(format!(
                "Unrecognized prefix token \"{}\" when parsing \"{text}\"",
                prefix.unwrap_or_default()
            ));
        }
    }
    Ok(())
}

/// What `NCCL_ALGO` and `NCCL_PROTO` (`algo`, `proto`) enable on NCCL `version`, or
/// NCCL's refusal.
fn enabled_from(algo: Option<&str>, proto: Option<&str>, version: u32) -> Result<Enabled, String> {
    let new = version >= 22400;
    let mut e = Enabled {
        algos: [[1; 7]; 5],
        protos: [[1, 2, 1]; 5],
    };
    if let Some(p) = proto {
        parse_list(p, &PROTOS, &mut e.protos, new)?;
    }
    if let Some(a) = algo {
        parse_list(a, &ALGOS[..nalgos(version)], &mut e.algos, new)?;
    }
    Ok(e)
}

/// The variables' values now: NCCL reads them with `getenv` each time (`ncclGetEnv`),
/// at every communicator's init and when a collective finds nothing to run.
fn vars() -> (Option<String>, Option<String>) {
    (std::env::var("NCCL_ALGO").ok(), std::env::var("NCCL_PROTO").ok())
}

/// NCCL's table for `n` ranks (`n > 1`) on NCCL `version`, once `e` and NCCL's own rules
/// have zeroed the bandwidth of what may not run (see the module's doc).
// Indices, as NCCL's loops: collective, algorithm and protocol index several tables.
#[allow(clippy::needless_range_loop)]
fn table(n: usize, e: &Enabled, version: u32) -> Model {
    let mut m = model::model(n);
    if version < 22300 {
        // No PAT before 2.23.
        for c in 0..5 {
            m.lat[c][PAT] = [0.0; 3];
            m.bw[c][PAT] = [0.0; 3];
        }
    }
    // 2.19 to 2.23: `ringbdw`, the ring's bandwidth before any is disabled.
    let mut ringbdw: [[f32; 3]; 5] = std::array::from_fn(|c| m.bw[c][RING]);
    let mut algos = e.algos;
    for row in algos.iter_mut() {
        // No CollNet (collNetSupport 0), so no CollNet and no NVLS on several nodes.
        row[model::COLLNET_DIRECT] = 0;
        row[model::COLLNET_CHAIN] = 0;
        row[model::NVLS] = 0;
        // Up to 2.23: "If user has hard set NCCL_ALGO=COLLNET, ignore it".
        if version < 22400 && row[RING] == 0 && row[TREE] == 0 && row[model::NVLS_TREE] == 0 {
            row[RING] = 1;
            row[TREE] = 1;
        }
    }
    for c in 0..5 {
        for a in 0..7 {
            for p in 0..3 {
                // LL128 by default: only up to PCI switches (typeInter <= PATH_PXB), and
                // the double's ranks are joined by a network.
                let p_enable = match e.protos[c][p] {
                    2 => 0,
                    x => x,
                };
                if p_enable == 0 {
                    m.bw[c][a][p] = 0.0;
                }
                // 2.18: "Never disable ring for non-allreduce operations".
                let kept = version < 21900 && a == RING && c != ALL_REDUCE;
                if !kept && algos[c][a] == 0 {
                    m.bw[c][a][p] = 0.0;
                }
                if (22200..22400).contains(&version) && a == RING && p_enable == 0 {
                    ringbdw[c][p] = 0.0;
                }
            }
        }
    }
    if (21900..22400).contains(&version) {
        for c in 0..5 {
            if m.bw[c].iter().flatten().all(|b| *b == 0.0) {
                // "at least set ring algo available"
                m.bw[c][RING] = ringbdw[c];
            }
        }
    }
    m
}

/// NCCL's `TUNING` table as lines, for the first `nalgos` algorithms (`ncclTopoTuneModel`,
/// 2.18 to 2.30).
fn table_lines(m: &Model, nalgos: usize) -> Vec<String> {
    let mut lines = Vec::new();
    for block in 0..nalgos.div_ceil(3) {
        let algos: Vec<usize> = (block * 3..block * 3 + 3).filter(|a| *a < nalgos).collect();
        let mut line = String::from("  Algorithm   |");
        for &a in &algos {
            line += &format!(" {:>14}   {:>14}   {:>14} |", "", ALGOS[a], "");
        }
        lines.push(line);
        // Three algorithms' worth of protocols, whatever the block holds (as NCCL).
        let mut line = String::from("  Protocol    |");
        for _ in 0..3 {
            for p in PROTOS {
                line += &format!(" {p:>14} |");
            }
        }
        lines.push(line);
        let mut line = String::from(" Max NThreads |");
        for &a in &algos {
            for t in m.threads[a] {
                line += &format!(" {t:>14} |");
            }
        }
        lines.push(line);
        for (c, func) in FUNCS.iter().enumerate() {
            let mut line = format!("{func:>13} |");
            for &a in &algos {
                for p in 0..3 {
                    line += &format!("{:8.1}/{:6.1} |", m.lat[c][a][p], m.bw[c][a][p]);
                }
            }
            lines.push(line);
        }
    }
    lines
}

/// An algorithm and protocol chosen for a collective, and its time (µs) by the table.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Choice {
    algo: usize,
    proto: usize,
    time: f32,
}

/// The algorithm and protocol of least time for collective `c` of `bytes` bytes (the
/// whole operation's: NCCL's `nBytes`), as `topoGetAlgoInfo` finds them in the table `m`
/// (ties go to the first); `avg`: a reduce-scatter that averages, which PAT does not run.
fn choose(m: &Model, c: usize, bytes: usize, avg: bool) -> Option<Choice> {
    let mut best: Option<Choice> = None;
    let mut min_time = 3_600_000_000.0f32;
    for a in 0..7 {
        if a == PAT && c == REDUCE_SCATTER && avg {
            continue;
        }
        for p in 0..3 {
            let bw = m.bw[c][a][p];
            if bw == 0.0 {
                continue;
            }
            let time = m.lat[c][a][p] + bytes as f32 / (1000.0 * bw);
            if time >= 0.0 && time < min_time {
                min_time = time;
                best = Some(Choice {
                    algo: a,
                    proto: p,
                    time,
                });
            }
        }
    }
    best
}

/// The collective's index among NCCL's functions, and whether it averages.
fn func(kind: Kind) -> (usize, bool) {
    match kind {
        Kind::Broadcast(_) => (model::BROADCAST, false),
        Kind::Reduce(op, _) => (model::REDUCE, matches!(op, Op::Avg)),
        Kind::AllGather => (ALL_GATHER, false),
        Kind::ReduceScatter(op) => (REDUCE_SCATTER, matches!(op, Op::Avg)),
        Kind::AllReduce(op) => (ALL_REDUCE, matches!(op, Op::Avg)),
    }
}

/// At init, once every rank has joined (where NCCL's `ncclTopoTuneModel` runs, at
/// every init and split): reads the variables, says them as NCCL does
/// (`NCCL_DEBUG=INFO`, subsystem ENV), fails as NCCL 2.24 and later do on a name they do
/// not know, and on rank 0 prints the table (subsystem TUNING). Returns what they
/// enable, which the communicator keeps for its collectives. On one rank, nothing (see
/// the module's doc).
pub fn check_init(device: usize, rank: usize, nranks: usize) -> Result<Option<Enabled>, Failure> {
    if nranks <= 1 {
        return Ok(None);
    }
    let (algo, proto) = vars();
    if let Some(p) = &proto {
        super::debug::env_line(device, &format!("NCCL_PROTO set by environment to {p}"));
    }
    if let Some(a) = &algo {
        super::debug::env_line(device, &format!("NCCL_ALGO set by environment to {a}"));
    }
    let e =
        enabled_from(algo.as_deref(), proto.as_deref(), version()).map_err(|why| Failure::new(INVALID_USAGE, why))?;
    if rank == 0 && super::debug::tuning() {
        for line in table_lines(&table(nranks, &e, version()), nalgos(version())) {
            super::debug::info(device, &line);
        }
    }
    Ok(Some(e))
}

/// At each collective of `count` elements of `dtype` (the call's own count: sendcount
/// of an all-gather, recvcount of a reduce-scatter) on a communicator whose init
/// enabled `tuned`: whether the table leaves it an algorithm and a protocol; if not,
/// NCCL's error, naming the variables as they are now (NCCL reads them again there). On
/// one rank no algorithm is chosen, and a collective of no elements is dropped: nothing
/// is missing.
pub fn check_call(
    kind: Kind,
    dtype: DataType,
    count: usize,
    nranks: usize,
    tuned: Option<&Enabled>,
) -> Result<(), Failure> {
    if nranks <= 1 || count == 0 {
        return Ok(());
    }
    let Some(e) = tuned else { return Ok(()) };
    let m = table(nranks, e, version());
    let (f, avg) = func(kind);
    if choose(&m, f, 1, avg).is_some() {
        return Ok(());
    }
    let (algo, proto) = vars();
    if version() < 22400 {
        return Err(Failure::new(INTERNAL_ERROR, "Error : no algorithm/protocol available"));
    }
    let said = |var: &str, v: &Option<String>| {
        v.as_ref()
            .map(|v| format!(" {var} was set to {v}."))
            .unwrap_or_default()
    };
    let code = if algo.is_some() || proto.is_some() {
        INVALID_USAGE
    } else {
        INTERNAL_ERROR
    };
    Err(Failure::new(
        code,
        format!(
            "Error : no algorithm/protocol available for function {} with datatype {dtype}.{}{}",
            FUNCS[f],
            said("NCCL_ALGO", &algo),
            said("NCCL_PROTO", &proto)
        ),
    ))
}

/// The line rank 0 prints when a collective is launched (`INFO(NCCL_TUNING, …)` in
/// `enqueue.cc`): `bytes` is the call's count × the type's size, `n` the ranks; `None`
/// where the version prints none (2.18, 2.19).
fn choice_line(version: u32, kind: Kind, bytes: usize, n: usize, c: Choice) -> Option<String> {
    let (f, _) = func(kind);
    let total = if f == ALL_GATHER || f == REDUCE_SCATTER {
        bytes * n
    } else {
        bytes
    };
    let (a, p, time) = (c.algo, c.proto, f64::from(c.time));
    match version {
        ..22000 => None,
        22000..22300 => Some(format!("{total} Bytes -> Algo {a} proto {p} time {time:.6}")),
        22300..22400 => Some(format!(
            "{}: {total} Bytes -> Algo {a} proto {p} time {time:.6}",
            FUNCS[f]
        )),
        _ => Some(format!(
            "{}: {bytes} Bytes -> Algo {} proto {} channel{{Lo..Hi}}={{0..0}}",
            FUNCS[f], ALGO_NAMES[a], PROTO_NAMES[p]
        )),
    }
}

/// When a unit of `calls` is launched on rank `rank` of `nranks` (device `device`), on a
/// communicator whose init enabled `tuned`: rank 0 prints each collective's choice, with
/// `TUNING` in `NCCL_DEBUG_SUBSYS`.
pub fn print_choices(calls: &[Call], device: usize, rank: usize, nranks: usize, tuned: Option<&Enabled>) {
    if rank != 0 || nranks <= 1 || !super::debug::tuning() {
        return;
    }
    let Some(e) = tuned else { return };
    let m = table(nranks, e, version());
    for call in calls {
        let Call::Collective {
            kind,
            send_bytes,
            recv_bytes,
            ..
        } = call
        else {
            continue;
        };
        let bytes = match kind {
            Kind::Broadcast(_) | Kind::ReduceScatter(_) => *recv_bytes,
            _ => *send_bytes,
        };
        let (f, avg) = func(*kind);
        let total = if f == ALL_GATHER || f == REDUCE_SCATTER {
            bytes * nranks
        } else {
            bytes
        };
        if bytes == 0 {
            continue;
        }
        if let Some(line) = choose(&m, f, total, avg).and_then(|c| choice_line(version(), *kind, bytes, nranks, c)) {
            super::debug::info(device, &line);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_2_24_lists_name_their_collective_and_unknown_names_fail() {
        let e = enabled_from(Some("allreduce:tree;broadcast:ring"), None, 22809).unwrap();
        assert_eq!(e.algos[4][..2], [1, 0], "{e:?}");
        assert_eq!(e.algos[0][..2], [0, 1]);
        assert!(
            e.algos[2].iter().all(|x| *x == 1),
            "untouched collectives keep every algorithm"
        );
        let e = enabled_from(Some("^ring"), Some("LL,simple"), 22809).unwrap();
        assert_eq!(e.algos[1][..2], [1, 0]);
        assert_eq!(e.protos[4], [1, 0, 1]);
        let e = enabled_from(None, Some("allreduce:LL"), 22809).unwrap();
        assert_eq!(e.protos[4], [1, 0, 0]);
        assert_eq!(e.protos[0], [1, 2, 1], "LL128 keeps its default elsewhere");
        for (text, says) in [
            ("Bogus", "Unrecognized element token \"Bogus\" when parsing \"Bogus\""),
            ("ring;tree", "All entries except the first must have a prefix"),
            ("gather:ring", "Unrecognized prefix token \"gather\""),
        ] {
            assert!(
                enabled_from(Some(text), None, 22809).unwrap_err().contains(says),
                "{text}"
            );
        }
    }

    #[test]
    fn up_to_2_23_unknown_names_are_ignored_and_may_leave_nothing() {
        let e = enabled_from(Some("Bogus"), None, 21803).unwrap();
        assert!(e.algos.iter().all(|row| row.iter().all(|x| *x == 0)), "{e:?}");
        let e = enabled_from(Some("tree"), None, 21803).unwrap();
        assert_eq!(e.algos[4][..2], [1, 0]);
        assert_eq!(e.algos[0][..2], [1, 0]);
    }

    /// The table of `n` ranks on `version` with these variables.
    fn t(n: usize, algo: Option<&str>, proto: Option<&str>, version: u32) -> Model {
        table(n, &enabled_from(algo, proto, version).unwrap(), version)
    }

    /// Whether collective `c` has any algorithm left.
    fn runs(m: &Model, c: usize) -> bool {
        choose(m, c, 1, false).is_some()
    }

    #[test]
    fn nccls_rules_by_version_decide_what_is_left() {
        let bcast = model::BROADCAST;
        // LL128 is off by default, CollNet and NVLS never run.
        let m = t(2, None, None, 22809);
        assert_eq!(m.bw[ALL_REDUCE][RING][1], 0.0);
        assert!(m.bw[ALL_REDUCE][RING][0] > 0.0 && m.bw[ALL_REDUCE][TREE][2] > 0.0);
        assert!(m.bw[ALL_GATHER][PAT][2] > 0.0, "PAT: one GPU per node");
        assert_eq!(
            t(2, None, None, 22203).bw[ALL_GATHER][PAT][2],
            0.0,
            "no PAT before 2.23"
        );
        assert!(t(2, None, Some("LL128"), 22809).bw[ALL_REDUCE][RING][1] > 0.0);
        // NCCL_ALGO=Tree: 2.18 keeps the ring of the other collectives; 2.19 to 2.23 give
        // it back to a collective left with nothing; 2.24 does not.
        for (version, broadcast_runs) in [(21803, true), (22105, true), (22304, true), (22403, false)] {
            let m = t(2, Some("Tree"), None, version);
            assert_eq!(runs(&m, bcast), broadcast_runs, "{version}");
            assert_eq!(m.bw[ALL_REDUCE][RING], [0.0; 3], "{version}");
            assert!(runs(&m, ALL_REDUCE));
        }
        // NCCL_ALGO=Bogus up to 2.23: Ring and Tree come back.
        let m = t(2, Some("Bogus"), None, 21803);
        assert!(m.bw[ALL_REDUCE][TREE][2] > 0.0 && m.bw[ALL_REDUCE][RING][2] > 0.0);
        // NCCL_PROTO=Bogus: nothing on 2.18; the ring back with every protocol, LL128
        // included, on 2.19 to 2.21; nothing from 2.22 (ringbdw follows the protocols).
        assert!(!runs(&t(2, None, Some("Bogus"), 21803), ALL_REDUCE));
        let m = t(2, None, Some("Bogus"), 22105);
        assert!(
            m.bw[ALL_REDUCE][RING].iter().all(|b| *b > 0.0),
            "{:?}",
            m.bw[ALL_REDUCE]
        );
        assert!(!runs(&t(2, None, Some("Bogus"), 22203), ALL_REDUCE));
        assert!(!runs(&t(2, Some("allreduce:^tree,ring"), None, 22809), ALL_REDUCE));
    }

    #[test]
    fn the_choice_is_the_least_time_and_follows_the_variables() {
        let m = t(4, None, None, 22809);
        // Small: the tree's LL on 4 ranks (fewer hops); large: the ring's Simple.
        let small = choose(&m, ALL_REDUCE, 8, false).unwrap();
        assert_eq!((small.algo, small.proto), (TREE, 0));
        let large = choose(&m, ALL_REDUCE, 1 << 28, false).unwrap();
        assert_eq!((large.algo, large.proto), (RING, 2));
        let m = t(4, Some("Ring"), Some("Simple"), 22809);
        let c = choose(&m, ALL_REDUCE, 8, false).unwrap();
        assert_eq!((c.algo, c.proto), (RING, 2));
        // PAT does not run an averaging reduce-scatter.
        let m = t(2, Some("PAT"), None, 22809);
        assert!(choose(&m, REDUCE_SCATTER, 8, false).is_some());
        assert!(choose(&m, REDUCE_SCATTER, 8, true).is_none());
    }

    #[test]
    fn the_lines_are_nccls() {
        let m = t(2, None, None, 22809);
        let lines = table_lines(&m, 7);
        assert_eq!(lines.len(), 3 * 8, "three blocks of 3 + 5 lines");
        assert_eq!(
            lines[0],
            format!(
                "  Algorithm   |{:>32}{:>19}{:>32}{:>19}{:>32}{:>19}",
                "Tree", "|", "Ring", "|", "CollNetDirect", "|"
            )
        );
        assert_eq!(lines[16], format!("  Algorithm   |{:>32}{:>19}", "PAT", "|"));
        assert_eq!(
            lines[17].matches('|').count(),
            10,
            "the protocol line is three algorithms wide"
        );
        assert_eq!(
            lines[18],
            format!(" Max NThreads |{:>17}{:>17}{:>17}", "0 |", "0 |", "0 |")
        );
        assert_eq!(
            lines[7],
            "    AllReduce |    16.8/   1.5 |    31.0/   0.0 |    36.4/   5.8 |    16.6/   6.2 |    31.0/   0.0 |    \
             36.4/  12.5 |     5.0/   0.0 |     8.5/   0.0 |    14.0/   0.0 |"
        );
        assert_eq!(t(2, None, None, 21803).bw.len(), 5);
        assert_eq!(table_lines(&t(2, None, None, 21803), 6).len(), 2 * 8);
        let c = Choice {
            algo: RING,
            proto: 0,
            time: 16.6,
        };
        let ag = Kind::AllGather;
        assert_eq!(choice_line(21903, ag, 8, 2, c), None);
        assert_eq!(
            choice_line(22005, ag, 8, 2, c).unwrap(),
            "16 Bytes -> Algo 1 proto 0 time 16.600000"
        );
        assert_eq!(
            choice_line(22304, ag, 8, 2, c).unwrap(),
            "AllGather: 16 Bytes -> Algo 1 proto 0 time 16.600000"
        );
        assert_eq!(
            choice_line(22809, ag, 8, 2, c).unwrap(),
            "AllGather: 8 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..0}"
        );
    }
}
