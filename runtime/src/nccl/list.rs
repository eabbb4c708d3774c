//! The grammar of `NCCL_ALGO` and `NCCL_PROTO`, as NCCL's `parseList`
//! (`src/graph/tuning.cc`) reads it: lists separated by `;`, each `[collective:][^]name,name…`;
//! a list without a collective is for every collective, and only the first may lack one;
//! `^` allows everything but the names. What the names and collectives mean is the
//! reader's: NCCL's algorithms and protocols for the NCCL backend, the CPU backend's own
//! for its tuner.

/// One list of a value: `allreduce:^ring,tree`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct List<'a> {
    /// The collective it is for (`allreduce`), as written; `None`: every collective.
    pub func: Option<&'a str>,
    /// `^`: everything but `names`.
    pub exclude: bool,
    /// The names, as written (empty ones dropped).
    pub names: Vec<&'a str>,
}

/// The lists of `text`, or why it does not read as NCCL's lists, in words.
pub fn parse(text: &str) -> Result<Vec<List<'_>>, String> {
    let mut lists = Vec::new();
    for (k, entry) in text.split(';').map(str::trim).filter(|e| !e.is_empty()).enumerate() {
        let (func, list) = match entry.split_once(':') {
            Some((f, l)) => (Some(f.trim()), l.trim()),
            None if k == 0 => (None, entry),
            None => {
                return Err(format!(
                    "'{entry}': every list but the first must name its collective (allreduce:…)"
                ));
            }
        };
        let (exclude, list) = match list.strip_prefix('^') {
            Some(rest) => (true, rest),
            None => (false, list),
        };
        let names = list.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
        lists.push(List { func, exclude, names });
    }
    Ok(lists)
}

/// Whether `name` names `known`, as NCCL compares them (any case) and the CPU backend
/// too (`-` and `_` not mattering: `single-copy`, `SINGLE_COPY`).
pub fn same(name: &str, known: &str) -> bool {
    let squash = |s: &str| s.replace(['-', '_'], "").to_lowercase();
    squash(name) == squash(known)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_read_as_nccls_parse_list() {
        assert_eq!(parse("").unwrap(), vec![]);
        assert_eq!(
            parse("Ring;allreduce:^tree, ring ;").unwrap(),
            vec![
                List {
                    func: None,
                    exclude: false,
                    names: vec!["Ring"]
                },
                List {
                    func: Some("allreduce"),
                    exclude: true,
                    names: vec!["tree", "ring"]
                },
            ]
        );
        assert!(
            parse("ring;tree")
                .unwrap_err()
                .contains("every list but the first must name its collective")
        );
        assert!(same("SINGLE_COPY", "single-copy") && same("AllReduce", "allreduce") && !same("ring", "tree"));
    }
}
