//! `NCCL_ALGO` and `NCCL_PROTO` on the NCCL backend: NCCL reads them itself (the ranks
//! inherit them); the workbook checks, before NCCL starts, that they name what the NCCL
//! that loads knows, so that a mistake is one line naming the variable (exit 2) on every
//! version. NCCL itself differs by version (`src/graph/tuning.cc`, `parseList`): from 2.24
//! an unknown name fails its init ("Unrecognized element token"); up to 2.23 it is
//! ignored, and a collective left with no algorithm fails when called; per-collective
//! lists (`allreduce:tree;broadcast:ring`) exist from 2.24 only.

use workbook_runtime::nccl::{self, Version};

/// NCCL's collectives (`ncclFuncStr`), as per-collective lists name them.
const FUNCS: [&str; 5] = ["Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce"];
/// NCCL's algorithms (`ncclAlgoStr`, 2.18 to 2.28; PAT from 2.23).
pub(crate) const ALGOS: [&str; 7] = [
    "Tree",
    "Ring",
    "CollNetDirect",
    "CollNetChain",
    "NVLS",
    "NVLSTree",
    "PAT",
];
/// NCCL's protocols (`ncclProtoStr`).
pub(crate) const PROTOS: [&str; 3] = ["LL", "LL128", "Simple"];

/// Checks `NCCL_ALGO` and `NCCL_PROTO` (read with `var`) against NCCL `version`
/// (`major.minor.patch`): one line saying what is wrong, if anything.
pub fn check(version: &str, var: &dyn Fn(&str) -> Option<String>) -> Result<(), String> {
    // What cannot be read as a version is taken as the newest.
    let code = Version::parse(version).unwrap_or(Version::new(u32::MAX, 0, 0));
    let algos: &[&str] = if code >= Version::new(2, 23, 0) {
        &ALGOS
    } else {
        &ALGOS[..6]
    };
    for (name, known, what) in [
        ("NCCL_ALGO", algos, "algorithm"),
        ("NCCL_PROTO", &PROTOS[..], "protocol"),
    ] {
        if let Some(value) = var(name).filter(|v| !v.trim().is_empty()) {
            check_list(&value, known, what, code, version).map_err(|why| format!("{name}={value}: {why}"))?;
        }
    }
    Ok(())
}

/// `name` (`NCCL_ALGO` or `NCCL_PROTO`) set to `value`, alone, as NCCL `version` reads
/// it: a value the benchmark's `-A` or `-P` gives it, checked on its own so that an error
/// names it and not the other variable.
pub fn check_one(version: &str, name: &str, value: &str) -> Result<(), String> {
    check(version, &|n| (n == name).then(|| value.to_string()))
}

/// One variable's value, as NCCL `version` reads it.
fn check_list(text: &str, known: &[&str], what: &str, code: Version, version: &str) -> Result<(), String> {
    for list in nccl::list::parse(text)? {
        match list.func {
            Some(p) if code < Version::new(2, 24, 0) => {
                return Err(format!(
                    "NCCL {version} takes one list for every collective; lists per collective ('{p}:…') need NCCL \
                     2.24 or later"
                ));
            }
            Some(p) if !FUNCS.iter().any(|f| f.eq_ignore_ascii_case(p)) => {
                return Err(format!(
                    "NCCL knows no collective '{p}' (it names {})",
                    FUNCS.join(", ")
                ));
            }
            _ => {}
        }
        if let Some(token) = list
            .names
            .iter()
            .find(|t| !known.iter().any(|n| n.eq_ignore_ascii_case(t)))
        {
            return Err(format!(
                "NCCL {version} has no {what} '{token}' (it knows {})",
                known.join(", ")
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(algo: Option<&str>, proto: Option<&str>, version: &str) -> Result<(), String> {
        check(version, &|name| match name {
            "NCCL_ALGO" => algo.map(String::from),
            "NCCL_PROTO" => proto.map(String::from),
            _ => None,
        })
    }

    #[test]
    fn what_nccl_knows_passes_and_the_rest_is_named_in_one_line() {
        for algo in ["Tree", "ring,tree", "^NVLS", "allreduce:tree;broadcast:ring", "PAT"] {
            with(Some(algo), Some("LL,Simple"), "2.28.3").unwrap();
        }
        with(Some("Tree"), Some("^LL128"), "2.18.3").unwrap();
        for (algo, proto, version, says) in [
            (
                Some("Bogus"),
                None,
                "2.28.3",
                "NCCL_ALGO=Bogus: NCCL 2.28.3 has no algorithm 'Bogus' (it knows Tree,",
            ),
            (Some("single-copy"), None, "2.28.3", "no algorithm 'single-copy'"),
            (
                None,
                Some("LL256"),
                "2.28.3",
                "NCCL_PROTO=LL256: NCCL 2.28.3 has no protocol 'LL256'",
            ),
            (Some("PAT"), None, "2.22.3", "NCCL 2.22.3 has no algorithm 'PAT'"),
            (
                Some("allreduce:tree"),
                None,
                "2.18.3",
                "lists per collective ('allreduce:…') need NCCL 2.24",
            ),
            (Some("gather:ring"), None, "2.28.3", "NCCL knows no collective 'gather'"),
            (
                Some("ring;tree"),
                None,
                "2.28.3",
                "every list but the first must name its collective",
            ),
        ] {
            let e = with(algo, proto, version).unwrap_err();
            assert!(e.contains(says), "{algo:?} {proto:?} {version}: {e}");
            assert!(!e.contains('\n'));
        }
    }
}
