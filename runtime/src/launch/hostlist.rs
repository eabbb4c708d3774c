//! Slurm's compressed lists, as srun hands them to each task.
//!
//! - `SLURM_JOB_NODELIST` names the job's nodes compactly: `lrdn[0001-0004,0007],login01`
//!   stands for lrdn0001, lrdn0002, lrdn0003, lrdn0004, lrdn0007 and login01. The first
//!   host runs rank 0, so it is the master every rank must reach.
//! - `SLURM_TASKS_PER_NODE` says how many tasks each node runs: `2(x3),1` is 2, 2, 2, 1.
//!   A rank's entry is its node's local world size.
//!
//! The rules follow Slurm's `src/common/hostlist.c`: entries are separated by commas or
//! spaces (not those inside brackets); each is `prefix[ranges]suffix`, ranges a comma list
//! of `N` or `N-M`; numbers keep the width of the range's start (`n[09-11]` is n09, n10,
//! n11); several bracket groups expand in turn (`a[1-2]b[3-4]`).

use std::fmt;

/// Most hosts one range may name (Slurm's limit).
const MAX_RANGE: u64 = 65_536;
/// Most hosts a whole list may name, so hostile input cannot exhaust memory.
const MAX_HOSTS: usize = 1 << 20;

/// A list that is not valid Slurm syntax: the input and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostlistError {
    input: String,
    why: String,
}

impl fmt::Display for HostlistError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bad Slurm list {:?}: {}", self.input, self.why)
    }
}

impl std::error::Error for HostlistError {}

fn err<T>(input: &str, why: impl Into<String>) -> Result<T, HostlistError> {
    Err(HostlistError {
        input: input.to_string(),
        why: why.into(),
    })
}

/// Expands a host list into host names, in the order written (no sorting, no dedup).
pub fn expand(list: &str) -> Result<Vec<String>, HostlistError> {
    let mut hosts = Vec::new();
    for entry in entries(list)? {
        expand_entry(list, entry, &mut hosts)?;
    }
    if hosts.is_empty() {
        return err(list, "the list is empty");
    }
    Ok(hosts)
}

/// The first host of a list, without expanding the rest (cheap for 10,000 nodes).
pub fn first(list: &str) -> Result<String, HostlistError> {
    let entries = entries(list)?;
    let Some(entry) = entries.first() else {
        return err(list, "the list is empty");
    };
    // Validate the whole list's shape, but expand only the first host of the first entry.
    for e in &entries[1..] {
        groups(list, e)?;
    }
    let mut name = String::new();
    for part in groups(list, entry)? {
        match part {
            Part::Text(t) => name.push_str(t),
            Part::Ranges(r) => name.push_str(&r[0].format(r[0].lo)),
        }
    }
    Ok(name)
}

/// Expands `SLURM_TASKS_PER_NODE` (`2(x3),1` -> [2, 2, 2, 1]).
pub fn tasks_per_node(spec: &str) -> Result<Vec<usize>, HostlistError> {
    let mut out = Vec::new();
    for item in spec.split(',').map(str::trim) {
        let (count, times) = match item.split_once('(') {
            None => (item, 1),
            Some((count, rest)) => {
                let Some(times) = rest.strip_prefix('x').and_then(|r| r.strip_suffix(')')) else {
                    return err(spec, format!("'{item}' should look like 2(x3)"));
                };
                (count, number(spec, times)?)
            }
        };
        let count = number(spec, count)?;
        if count == 0 || times == 0 {
            return err(spec, format!("'{item}' counts zero"));
        }
        if out.len() as u64 + times > MAX_HOSTS as u64 {
            return err(spec, "names more than a million nodes");
        }
        out.extend(std::iter::repeat_n(count as usize, times as usize));
    }
    Ok(out)
}

/// Splits a list at commas and spaces that are outside brackets.
fn entries(list: &str) -> Result<Vec<&str>, HostlistError> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in list.char_indices() {
        match c {
            '[' if depth == 0 => depth = 1,
            '[' => return err(list, format!("nested '[' at position {i}")),
            ']' if depth == 1 => depth = 0,
            ']' => return err(list, format!("']' without '[' at position {i}")),
            ',' | ' ' | '\t' | '\n' if depth == 0 => {
                if i > start {
                    out.push(&list[start..i]);
                }
                start = i + c.len_utf8();
            }
            _ => {}
        }
    }
    if depth != 0 {
        return err(list, "a '[' is never closed");
    }
    if list.len() > start {
        out.push(&list[start..]);
    }
    Ok(out)
}

/// A numbered range `lo-hi`, printed zero-padded to `width` digits.
#[derive(Clone, Copy)]
struct Range {
    lo: u64,
    hi: u64,
    width: usize,
}

impl Range {
    fn format(&self, n: u64) -> String {
        format!("{n:0width$}", width = self.width)
    }
}

enum Part<'a> {
    Text(&'a str),
    Ranges(Vec<Range>),
}

/// Cuts one entry into text and bracket groups.
fn groups<'a>(list: &str, entry: &'a str) -> Result<Vec<Part<'a>>, HostlistError> {
    let mut parts = Vec::new();
    let mut rest = entry;
    while let Some(open) = rest.find('[') {
        if open > 0 {
            parts.push(Part::Text(&rest[..open]));
        }
        let close = rest[open..].find(']').map(|c| open + c).ok_or_else(|| HostlistError {
            input: list.into(),
            why: "a '[' is never closed".into(),
        })?;
        let inner = &rest[open + 1..close];
        if inner.is_empty() {
            return err(list, format!("empty brackets in '{entry}'"));
        }
        parts.push(Part::Ranges(
            inner.split(',').map(|r| range(list, r)).collect::<Result<_, _>>()?,
        ));
        rest = &rest[close + 1..];
    }
    if !rest.is_empty() {
        parts.push(Part::Text(rest));
    }
    Ok(parts)
}

fn range(list: &str, text: &str) -> Result<Range, HostlistError> {
    let (lo_text, hi_text) = text.split_once('-').unwrap_or((text, text));
    let (lo, hi) = (number(list, lo_text)?, number(list, hi_text)?);
    if lo > hi {
        return err(list, format!("range {text} runs backwards"));
    }
    if hi - lo >= MAX_RANGE {
        return err(list, format!("range {text} names more than {MAX_RANGE} hosts"));
    }
    Ok(Range {
        lo,
        hi,
        width: lo_text.len(),
    })
}

fn number(list: &str, text: &str) -> Result<u64, HostlistError> {
    if text.is_empty() || text.len() > 18 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return err(list, format!("'{text}' is not a number"));
    }
    text.parse().or_else(|_| err(list, format!("'{text}' is not a number")))
}

fn expand_entry(list: &str, entry: &str, hosts: &mut Vec<String>) -> Result<(), HostlistError> {
    let mut names = vec![String::new()];
    for part in groups(list, entry)? {
        match part {
            Part::Text(t) => names.iter_mut().for_each(|n| n.push_str(t)),
            Part::Ranges(ranges) => {
                let count: u64 = ranges.iter().map(|r| r.hi - r.lo + 1).sum();
                if (names.len() as u64).saturating_mul(count) + hosts.len() as u64 > MAX_HOSTS as u64 {
                    return err(list, "names more than a million hosts");
                }
                names = names
                    .iter()
                    .flat_map(|n| {
                        ranges
                            .iter()
                            .flat_map(move |r| (r.lo..=r.hi).map(move |i| format!("{n}{}", r.format(i))))
                    })
                    .collect();
            }
        }
    }
    hosts.extend(names);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(list: &str) -> Vec<String> {
        let hosts = expand(list).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(first(list).unwrap(), hosts[0], "first() of {list:?}");
        hosts
    }

    #[test]
    fn slurms_examples() {
        assert_eq!(
            ok("lrdn[0001-0004,0007],login01"),
            ["lrdn0001", "lrdn0002", "lrdn0003", "lrdn0004", "lrdn0007", "login01"]
        );
        assert_eq!(ok("n[09-11]"), ["n09", "n10", "n11"]);
        assert_eq!(ok("n[9-11]"), ["n9", "n10", "n11"]);
        assert_eq!(ok("n[098-101]"), ["n098", "n099", "n100", "n101"]);
        assert_eq!(ok("node[1-2]-ib"), ["node1-ib", "node2-ib"]);
        assert_eq!(ok("a[1-2]b[3-4]"), ["a1b3", "a1b4", "a2b3", "a2b4"]);
        assert_eq!(
            ok("rack[1-2]-node[01-02]"),
            ["rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"]
        );
        assert_eq!(ok("localhost"), ["localhost"]);
        assert_eq!(ok("n[1]"), ["n1"]);
        assert_eq!(ok("tux2,tux1 tux2"), ["tux2", "tux1", "tux2"]);
        assert_eq!(ok("a,b,"), ["a", "b"]);
        assert_eq!(ok("10.0.0.1"), ["10.0.0.1"]);
    }

    #[test]
    fn tasks_per_node_expands_repeats() {
        assert_eq!(tasks_per_node("2(x3),1").unwrap(), [2, 2, 2, 1]);
        assert_eq!(tasks_per_node("4").unwrap(), [4]);
        for bad in ["", "0", "2(x0)", "2(x3", "2(3)", "x", "2(x99999999)"] {
            assert!(tasks_per_node(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn bad_lists_are_refused_with_the_input_quoted() {
        for bad in [
            "n[3-1]",
            "n[1-2",
            "n]1",
            "n[]",
            "n[a-b]",
            "n[-1]",
            "n[1-2-3]",
            "n[[1]]",
            "",
            " , ",
            "n[0-99999]",
        ] {
            let e = expand(bad).err().unwrap_or_else(|| panic!("{bad:?} expanded"));
            assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
            assert!(first(bad).is_err(), "first() accepted {bad:?}");
        }
        assert!(
            expand("n[000000000000000000001-2]").is_err(),
            "30-digit numbers are refused, not a panic"
        );
        assert!(expand("a[0-60000]b[0-60000]").is_err(), "too many hosts");
    }

    #[test]
    fn random_lists_round_trip_and_garbage_never_panics() {
        let mut rng = testkit::Xorshift(0x2545f4914f6cdd1d);
        let mut next = |n| rng.below(n);
        for _ in 0..2000 {
            // A list built from known pieces, compared with its expansion built by hand.
            let (mut list, mut want) = (Vec::new(), Vec::new());
            for _ in 0..1 + next(3) {
                let (width, lo) = (1 + next(3) as usize, next(50));
                let hi = lo + next(4);
                list.push(format!("h{}[{lo:0width$}-{hi:0width$}]s", next(9)));
                let prefix = &list.last().unwrap()[..2];
                want.extend((lo..=hi).map(|i| format!("{prefix}{i:0width$}s")));
            }
            assert_eq!(ok(&list.join(",")), want);
            // Garbage: any mix of the syntax's characters.
            let garbage: String = (0..next(12))
                .map(|_| "[]-,x0 9é(".chars().nth(next(10) as usize).unwrap())
                .collect();
            let _ = (expand(&garbage), first(&garbage), tasks_per_node(&garbage));
        }
    }
}
