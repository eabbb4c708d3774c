//! `NCCL_ALGO` and `NCCL_PROTO` as the CPU backend reads them: which families of
//! algorithms ([`Allowed`]) and which protocols ([`Protocols`]) each collective may run,
//! both read with NCCL's `parseList` grammar (`parse_list`, over
//! `workbook_runtime::nccl::list`). Apart from the tuner that weighs them, so that what
//! the two variables accept, and how a bad value is refused, is read in one place.

use crate::transport::protocol::Protocol;
use workbook_runtime::{Func, nccl};

/// Which protocols `NCCL_PROTO` allows, per collective.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Protocols {
    /// `[collective in Func::ALL order][protocol]`.
    per: [[bool; 3]; Func::ALL.len()],
    /// Every protocol for every collective (`NCCL_PROTO` unset): the tuner's fast path.
    pub(super) every: bool,
}

impl Default for Protocols {
    fn default() -> Protocols {
        Protocols {
            per: [[true; 3]; Func::ALL.len()],
            every: true,
        }
    }
}

impl Protocols {
    /// Whether `proto` may run `func`.
    pub fn allows(&self, func: Func, proto: Protocol) -> bool {
        let i = func.index();
        self.per[i][proto as usize]
    }

    /// Whether some collective may not run Simple (which TCP links need).
    pub fn without_simple(&self) -> bool {
        self.per.iter().any(|row| !row[Protocol::Simple as usize])
    }

    /// `NCCL_PROTO` as the user set it (`text`; every protocol when unset or empty).
    pub fn from_user(text: Option<String>) -> Result<Protocols, String> {
        match text {
            Some(text) if !text.trim().is_empty() => {
                let protos = Protocols::parse(&text).map_err(|why| format!("NCCL_PROTO={text}: {why}"))?;
                // NCCL finds no protocol for any call then, and refuses each
                // ("no algorithm/protocol available", ncclInvalidUsage): said before the run.
                match protos.per.iter().flatten().any(|ok| *ok) {
                    true => Ok(protos),
                    false => Err(format!(
                        "NCCL_PROTO={text}: excludes every protocol (LL, LL128 and Simple), so no collective can run \
                         (NCCL refuses each call: \"no algorithm/protocol available\"); leave one out of the list"
                    )),
                }
            }
            _ => Ok(Protocols::default()),
        }
    }

    /// Reads `NCCL_PROTO` as NCCL's `parseList` does, as [`Allowed::parse`] reads
    /// `NCCL_ALGO`: `LL`, `LL128`, `Simple`, `^LL128`, `allreduce:LL;broadcast:Simple`,
    /// case not mattering.
    pub fn parse(text: &str) -> Result<Protocols, String> {
        let names = Protocol::ALL.map(|p| p.name());
        let per = parse_list(text, &names, |name, _exclude| {
            Err(format!(
                "unknown protocol '{name}': LL, LL128 or Simple (NCCL's protocols)"
            ))
        })?;
        let every = per.iter().flatten().all(|ok| *ok);
        Ok(Protocols { per, every })
    }
}

/// NCCL's `parseList` over `names`: `;`-separated lists, each `[collective:][^]name,name…`;
/// a list without a collective (only the first may lack one) is for every collective; `^`
/// allows all but the names; case, `-` and `_` do not matter. `other(name, excluded)`
/// answers a name not in `names`: `Ok` to pass over it, or the error. Returns, per
/// collective in [`Func::ALL`]'s order, which names are allowed.
fn parse_list<const N: usize>(
    text: &str,
    names: &[&str; N],
    other: impl Fn(&str, bool) -> Result<(), String>,
) -> Result<[[bool; N]; Func::ALL.len()], String> {
    let mut per = [[true; N]; Func::ALL.len()];
    for list in nccl::list::parse(text)? {
        let mut named = [false; N];
        for name in list.names {
            match names.iter().position(|known| nccl::list::same(name, known)) {
                Some(f) => named[f] = true,
                None => other(name, list.exclude)?,
            }
        }
        let row = named.map(|n| n != list.exclude);
        match list.func {
            None => per = [row; Func::ALL.len()],
            Some(p) => match Func::ALL.iter().find(|f| nccl::list::same(p, f.nccl_func())) {
                Some(f) => per[f.index()] = row,
                None => {
                    return Err(format!(
                        "unknown collective '{p}': one of {}",
                        Func::ALL.map(|f| f.nccl_func().to_lowercase()).join(", ")
                    ));
                }
            },
        }
    }
    Ok(per)
}

/// Which families of algorithms `NCCL_ALGO` allows, per collective.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allowed {
    /// `[collective in Func::ALL order][family]`.
    per: [[bool; FAMILIES]; Func::ALL.len()],
}

/// What `NCCL_ALGO` names on the CPU backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Family {
    /// NCCL's `Ring`: the ring, the pipelined ring, the chain, the pairwise all-to-all.
    Ring = 0,
    /// `direct` (the CPU backend's own).
    Direct = 1,
    /// `single-copy` (the CPU backend's own; NCCL's P2P read).
    SingleCopy = 2,
    /// NCCL's `Tree`: the double binary tree (all-reduce).
    Tree = 3,
}

const FAMILIES: usize = 4;
const FAMILY_NAMES: [&str; FAMILIES] = ["ring", "direct", "single-copy", "tree"];
/// NCCL's algorithms the CPU backend does not have (`ncclAlgoStr`, 2.18 to 2.28).
const NCCL_ONLY: [&str; 5] = ["CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT"];

impl Default for Allowed {
    fn default() -> Allowed {
        Allowed {
            per: [[true; FAMILIES]; Func::ALL.len()],
        }
    }
}

impl Allowed {
    /// Whether `family` may run `func`.
    pub(super) fn allows(&self, func: Func, family: Family) -> bool {
        let i = func.index();
        self.per[i][family as usize]
    }

    /// `NCCL_ALGO` as the user set it (`text`; everything when unset or empty).
    pub fn from_user(text: Option<String>) -> Result<Allowed, String> {
        match text {
            Some(text) if !text.trim().is_empty() => {
                let allowed = Allowed::parse(&text).map_err(|why| format!("NCCL_ALGO={text}: {why}"))?;
                // Some algorithm left for some collective, or NCCL refuses every call.
                let left = Func::ALL.iter().any(|&f| {
                    crate::collective::algorithms(f)
                        .iter()
                        .any(|row| allowed.allows(f, row.algorithm.family()))
                });
                match left {
                    true => Ok(allowed),
                    false => Err(format!(
                        "NCCL_ALGO={text}: excludes every algorithm the CPU backend has (ring, tree, direct and \
                         single-copy), so no collective can run (NCCL refuses each call: \"no algorithm/protocol \
                         available\"); leave one out of the list"
                    )),
                }
            }
            _ => Ok(Allowed::default()),
        }
    }

    /// Reads `NCCL_ALGO` as NCCL's `parseList` does: `;`-separated lists, each
    /// `[collective:][^]name,name…`; a list without a collective (only the first may
    /// lack one) is for every collective; `^` allows all but the names; case does not
    /// matter. `Ring` and `Tree` are NCCL's; `direct` and `single-copy` are the CPU
    /// backend's own. NCCL's other algorithms (`CollNetDirect`, …) have no counterpart here:
    /// allowing one is refused (excluding one with `^` changes nothing).
    pub fn parse(text: &str) -> Result<Allowed, String> {
        let per = parse_list(text, &FAMILY_NAMES, |name, exclude| {
            match NCCL_ONLY.iter().find(|a| a.eq_ignore_ascii_case(name)) {
                Some(_) if exclude => Ok(()),
                Some(nccl) => Err(format!(
                    "the CPU backend has no {nccl}: it has ring and tree (NCCL's Ring and Tree), direct and \
                     single-copy"
                )),
                None => Err(format!(
                    "unknown algorithm '{name}': ring or tree (NCCL's Ring and Tree), direct or single-copy \
                     (NCCL's CollNetDirect, CollNetChain, NVLS, NVLSTree and PAT need GPUs)"
                )),
            }
        })?;
        Ok(Allowed { per })
    }

    /// Forbids `family` for `func`.
    pub(super) fn forbid(&mut self, func: Func, family: Family) {
        let i = func.index();
        self.per[i][family as usize] = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(text: &str) -> Allowed {
        Allowed::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    #[test]
    fn nccl_algo_reads_as_nccls_parse_list() {
        let all = Allowed::default();
        assert_eq!(with(""), all);
        let ring = with("Ring");
        for c in Func::ALL {
            assert!(
                ring.allows(c, Family::Ring) && !ring.allows(c, Family::Direct),
                "{}",
                c.name()
            );
            assert!(!ring.allows(c, Family::SingleCopy));
        }
        // Case does not matter, nor - or _ in names; `^` excludes.
        assert_eq!(with("RING"), ring);
        assert_eq!(with("ring,direct,SINGLE_COPY,tree"), all);
        let no_copy = with("^single-copy");
        assert!(no_copy.allows(Func::Broadcast, Family::Ring) && no_copy.allows(Func::Broadcast, Family::Direct));
        assert!(!no_copy.allows(Func::Broadcast, Family::SingleCopy));
        // Per collective; a later list replaces that collective's.
        let per = with("ring;allreduce:single-copy;broadcast:^ring");
        assert!(per.allows(Func::AllReduce, Family::SingleCopy) && !per.allows(Func::AllReduce, Family::Ring));
        assert!(!per.allows(Func::Broadcast, Family::Ring) && per.allows(Func::Broadcast, Family::Direct));
        assert!(per.allows(Func::ReduceScatter, Family::Ring) && !per.allows(Func::ReduceScatter, Family::SingleCopy));
        assert_eq!(with("all_reduce:ring"), with("AllReduce:Ring"));
        // Excluding what the CPU backend lacks changes nothing.
        assert_eq!(with("^nvls"), all);
        let tree = with("Tree");
        assert!(tree.allows(Func::AllReduce, Family::Tree) && !tree.allows(Func::AllReduce, Family::Ring));
    }

    #[test]
    fn nccl_algo_refuses_what_the_cpu_backend_lacks_in_one_line() {
        for (text, says) in [
            (
                "CollNetDirect",
                "the CPU backend has no CollNetDirect: it has ring and tree (NCCL's Ring and Tree), direct and \
                 single-copy",
            ),
            ("ring,nvls", "the CPU backend has no NVLS"),
            ("allreduce:pat", "no PAT"),
            ("ring;tree", "every list but the first must name its collective"),
            ("gather:ring", "unknown collective 'gather'"),
            ("rings", "unknown algorithm 'rings'"),
        ] {
            let e = Allowed::parse(text).unwrap_err();
            assert!(e.contains(says), "{text}: {e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn nccl_proto_reads_as_nccl_algo_does_and_refuses_what_nccl_lacks() {
        let p = |t: &str| Protocols::parse(t).unwrap_or_else(|e| panic!("{t}: {e}"));
        assert_eq!(p(""), Protocols::default());
        assert_eq!(p("ll,LL128,SIMPLE"), Protocols::default());
        let ll = p("LL");
        assert!(ll.allows(Func::AllReduce, Protocol::Ll) && !ll.allows(Func::AllReduce, Protocol::Simple));
        assert!(ll.without_simple() && !p("^LL128").without_simple());
        let no128 = p("^ll128");
        assert!(!no128.allows(Func::Broadcast, Protocol::Ll128) && no128.allows(Func::Broadcast, Protocol::Ll));
        let per = p("simple;allreduce:ll");
        assert!(per.allows(Func::AllReduce, Protocol::Ll) && !per.allows(Func::AllReduce, Protocol::Simple));
        assert!(per.allows(Func::Reduce, Protocol::Simple) && !per.allows(Func::Reduce, Protocol::Ll));
        for (text, says) in [
            ("Bogus", "unknown protocol 'Bogus': LL, LL128 or Simple"),
            ("LL;simple", "every list but the first must name its collective"),
            ("gather:LL", "unknown collective 'gather'"),
        ] {
            let e = Protocols::parse(text).unwrap_err();
            assert!(e.contains(says) && !e.contains('\n'), "{text}: {e}");
        }
    }
}
