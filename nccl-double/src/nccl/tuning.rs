//! `NCCL_ALGO` and `NCCL_PROTO`, read as the NCCL being played reads them
//! (`src/graph/tuning.cc`, `ncclTopoTuneModel` at init; `enqueue.cc` at each collective):
//!
//! - up to 2.23, `parseList` takes one list (`Tree,Ring`, `^LL128`), compares names
//!   without case and ignores a name it does not know; a collective that is then left
//!   with no algorithm fails when called: `no algorithm/protocol available`
//!   (`ncclInternalError`);
//! - from 2.24, `;`-separated lists may each name a collective (`allreduce:tree;
//!   broadcast:ring`), and an unknown name or collective fails the init with
//!   `ncclInvalidUsage` (`Unrecognized element token "Bogus" when parsing "Bogus"`);
//!   a collective left with nothing fails when called, with `ncclInvalidUsage` and the
//!   variables' values in the message.
//!
//! A communicator of one rank reads neither: `ncclTopoTuneModel` returns before them when
//! `nRanks <= 1` (every tag from 2.18 to 2.30), and its collectives are launched as one
//! copy, with no algorithm chosen (`ncclLaunchOneRank`). Seen so on an H200 with NCCL
//! 2.28.3 (`bench/nccl-env.sh`, docs/gpu-runs.md): `NCCL_ALGO=Bogus` inits and runs.
//!
//! What the double can run: every collective by the ring, the all-reduce also by the
//! tree (NCCL's trees are chains inside a node), every protocol. CollNet, NVLS and PAT
//! need hardware or nodes it does not simulate.

use super::work::Kind;
use super::{INTERNAL_ERROR, INVALID_USAGE, version};
use crate::exchange::Failure;
use crate::reduce::DataType;
use std::sync::OnceLock;

/// NCCL's collectives as `ncclFuncStr` names them (2.18 to 2.28).
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
/// `ncclProtoStr`.
const PROTOS: [&str; 3] = ["LL", "LL128", "Simple"];

/// Which algorithms and protocols each collective may use: `[collective][name]`.
#[derive(Clone, Debug, PartialEq)]
struct Enabled {
    algos: [[bool; ALGOS.len()]; FUNCS.len()],
    protos: [[bool; PROTOS.len()]; FUNCS.len()],
}

/// The algorithms of the version played (PAT from 2.23).
fn algos() -> &'static [&'static str] {
    if version() >= 22300 { &ALGOS } else { &ALGOS[..6] }
}

/// `parseList` of `str` over `elems`, into `list[collective][elem]`, as the version
/// played reads it.
fn parse_list(text: &str, elems: &[&str], list: &mut [[bool; 7]; 5], new: bool) -> Result<(), String> {
    if !new {
        // 2.18 to 2.23: one list for every collective; unknown names are ignored.
        let (def, set, body) = match text.strip_prefix('^') {
            Some(rest) => (true, false, rest),
            None => (false, true, text),
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
            Some(rest) => (true, false, rest),
            None => (false, true, body),
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

/// What `NCCL_ALGO` and `NCCL_PROTO` (`algo`, `proto`) enable, or NCCL's refusal.
fn enabled_from(algo: Option<&str>, proto: Option<&str>, new: bool) -> Result<Enabled, String> {
    let mut e = Enabled {
        algos: [[true; 7]; 5],
        protos: [[true; 3]; 5],
    };
    if let Some(p) = proto {
        let mut list = [[true; 7]; 5];
        parse_list(p, &PROTOS, &mut list, new)?;
        for (row, parsed) in e.protos.iter_mut().zip(list) {
            row.copy_from_slice(&parsed[..3]);
        }
    }
    if let Some(a) = algo {
        parse_list(a, algos(), &mut e.algos, new)?;
    }
    Ok(e)
}

/// The variables' values, read once.
fn vars() -> &'static (Option<String>, Option<String>) {
    static VARS: OnceLock<(Option<String>, Option<String>)> = OnceLock::new();
    VARS.get_or_init(|| (std::env::var("NCCL_ALGO").ok(), std::env::var("NCCL_PROTO").ok()))
}

/// What the variables enable, or why the init fails (2.24 and later).
fn enabled() -> &'static Result<Enabled, String> {
    static E: OnceLock<Result<Enabled, String>> = OnceLock::new();
    E.get_or_init(|| {
        let (algo, proto) = vars();
        enabled_from(algo.as_deref(), proto.as_deref(), version() >= 22400)
    })
}

/// At init, once every rank has joined (where NCCL's `ncclTopoTuneModel` runs): says
/// the variables as NCCL does (`NCCL_DEBUG=INFO`, subsystem ENV), and fails as NCCL 2.24
/// and later do on a name they do not know. On one rank, nothing (see the module's doc).
pub fn check_init(device: usize, nranks: usize) -> Result<(), Failure> {
    if nranks <= 1 {
        return Ok(());
    }
    let (algo, proto) = vars();
    if let Some(p) = proto {
        super::debug::env_line(device, &format!("NCCL_PROTO set by environment to {p}"));
    }
    if let Some(a) = algo {
        super::debug::env_line(device, &format!("NCCL_ALGO set by environment to {a}"));
    }
    enabled()
        .as_ref()
        .map(|_| ())
        .map_err(|why| Failure::new(INVALID_USAGE, why.clone()))
}

/// At each collective: whether an algorithm the double can run, and a protocol, are left
/// to it; if not, NCCL's error. On one rank no algorithm is chosen, so none is missing.
pub fn check_call(kind: Kind, dtype: DataType, nranks: usize) -> Result<(), Failure> {
    if nranks <= 1 {
        return Ok(());
    }
    let Ok(e) = enabled() else { return Ok(()) };
    let (f, name) = match kind {
        Kind::Broadcast(_) => (0, "Broadcast"),
        Kind::Reduce(..) => (1, "Reduce"),
        Kind::AllGather => (2, "AllGather"),
        Kind::ReduceScatter(_) => (3, "ReduceScatter"),
        Kind::AllReduce(_) => (4, "AllReduce"),
    };
    // Ring for every collective, and the tree for the all-reduce.
    let runs = e.algos[f][1] || (f == 4 && e.algos[f][0]);
    if runs && e.protos[f].iter().any(|p| *p) {
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
            "Error : no algorithm/protocol available for function {name} with datatype {dtype}.{}{}",
            said("NCCL_ALGO", algo),
            said("NCCL_PROTO", proto)
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_2_24_lists_name_their_collective_and_unknown_names_fail() {
        let e = enabled_from(Some("allreduce:tree;broadcast:ring"), None, true).unwrap();
        assert!(e.algos[4][0] && !e.algos[4][1], "{e:?}");
        assert!(e.algos[0][1] && !e.algos[0][0]);
        assert!(
            e.algos[2].iter().all(|x| *x),
            "untouched collectives keep every algorithm"
        );
        let e = enabled_from(Some("^ring"), Some("LL,simple"), true).unwrap();
        assert!(!e.algos[1][1] && e.algos[1][0]);
        assert_eq!(e.protos[4], [true, false, true]);
        for (text, says) in [
            ("Bogus", "Unrecognized element token \"Bogus\" when parsing \"Bogus\""),
            ("ring;tree", "All entries except the first must have a prefix"),
            ("gather:ring", "Unrecognized prefix token \"gather\""),
        ] {
            assert!(
                enabled_from(Some(text), None, true).unwrap_err().contains(says),
                "{text}"
            );
        }
    }

    #[test]
    fn up_to_2_23_unknown_names_are_ignored_and_may_leave_nothing() {
        let e = enabled_from(Some("Bogus"), None, false).unwrap();
        assert!(e.algos.iter().all(|row| row.iter().all(|x| !x)), "{e:?}");
        let e = enabled_from(Some("tree"), None, false).unwrap();
        assert!(e.algos[4][0] && !e.algos[4][1] && !e.algos[0][1]);
    }
}
