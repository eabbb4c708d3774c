//! `NCCL_TESTS_SPLIT` and `NCCL_TESTS_SPLIT_MASK`: the benchmark on sub-communicators,
//! as nccl-tests runs it (its `src/common.cu`, `run()`; README "Running multiple
//! operations in parallel").
//!
//! Each rank computes a color from its world rank; the ranks of one color form a
//! communicator (`MPI_Comm_split(MPI_COMM_WORLD, color, proc)`, then `ncclCommInitRank`
//! on it: ranks in world order), and every communicator runs the same sweep at the same
//! time. nccl-tests' syntax, which this module reads alike:
//!
//! - `NCCL_TESTS_SPLIT="<operation><value>"`: the operation `AND`, `OR`, `MOD` or `DIV`
//!   (any case), or `&`, `|`, `%`, `/`; spaces before the value; the value decimal, `0x`
//!   hexadecimal, `0b` binary, or octal with a leading `0` (C's `strtoul(s, NULL, 0)`).
//!   color = rank & value, rank | value, rank % value or rank / value.
//! - `NCCL_TESTS_SPLIT_MASK="<hex>"`: color = rank & mask, the mask hexadecimal with or
//!   without `0x` (`strtoul(s, NULL, 16)`: `10` is sixteen). It wins over
//!   `NCCL_TESTS_SPLIT` when both are set.
//!
//! Where nccl-tests reads a value it cannot use (`MOD x`, `XOR 3`) it silently puts every
//! rank in one communicator, and `MOD 0` or `DIV 0` divides by zero (SIGFPE): here each
//! is refused in one line (exit 2), as any other bad input. An empty value is unset.
//!
//! Its figures (`src/common.cu`, `BenchTime`): each rank's busbw uses its own
//! communicator's size (`args->nProcs` is `ncclProcs`), while the time is combined and
//! `#wrong` summed over the whole world (`MPI_Allreduce(..., MPI_COMM_WORLD)`); process 0
//! of the world prints the one table. So the bandwidth is per communicator: the
//! communicators together move their number times as much.

use std::collections::BTreeMap;

/// The variables, in the order nccl-tests reads them: the mask first (color = rank & mask)…
pub const MASK_VAR: &str = "NCCL_TESTS_SPLIT_MASK";
/// … then the general form (`AND`, `OR`, `MOD` or `DIV` and an operand), read when no mask is set.
pub const SPLIT_VAR: &str = "NCCL_TESTS_SPLIT";

/// How a rank's color comes from its rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `rank & value`.
    And,
    /// `rank | value`.
    Or,
    /// `rank % value`.
    Mod,
    /// `rank / value`.
    Div,
}

impl Op {
    /// The operator as the header writes it (`rank % 2`).
    fn symbol(self) -> &'static str {
        match self {
            Op::And => "&",
            Op::Or => "|",
            Op::Mod => "%",
            Op::Div => "/",
        }
    }
}

/// A split, as the environment asked for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    /// The variable that said it: [`SPLIT_VAR`] or [`MASK_VAR`].
    pub var: &'static str,
    /// Its value, as given (trimmed).
    pub text: String,
    /// How the color comes from the rank.
    pub op: Op,
    /// The operand: 0 to `i32::MAX` (a color is an `int`), at least 1 for MOD and DIV.
    pub value: u32,
    /// Whether [`SPLIT_VAR`] was set too, and ignored.
    pub ignored_split: bool,
}

/// The most an operand may be: colors are C `int`s.
const MAX: u64 = i32::MAX as u64;

/// Reads [`MASK_VAR`], else [`SPLIT_VAR`]: `None` when neither is set (or both empty);
/// an error (one line) for a value nccl-tests could not mean.
pub fn from_env() -> Result<Option<Spec>, String> {
    let get = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    match (get(MASK_VAR), get(SPLIT_VAR)) {
        (Some(mask), split) => parse_mask(&mask).map(|mut s| {
            s.ignored_split = split.is_some();
            Some(s)
        }),
        (None, Some(split)) => parse_split(&split).map(Some),
        (None, None) => Ok(None),
    }
}

/// `NCCL_TESTS_SPLIT`'s value: `MOD 2`, `%2`, `and 0x3`, `DIV 0b100`.
pub fn parse_split(text: &str) -> Result<Spec, String> {
    let text = text.trim();
    let quoted = format!("{SPLIT_VAR}='{}'", workbook_runtime::error::cut(text, 40));
    const OPS: [(&str, &str, Op); 4] = [
        ("AND", "&", Op::And),
        ("OR", "|", Op::Or),
        ("MOD", "%", Op::Mod),
        ("DIV", "/", Op::Div),
    ];
    let found = OPS.iter().find_map(|(word, sym, op)| {
        let rest = match text.get(..word.len()) {
            Some(head) if head.eq_ignore_ascii_case(word) => &text[word.len()..],
            _ => text.strip_prefix(sym)?,
        };
        Some((*op, rest))
    });
    let Some((op, rest)) = found else {
        return Err(format!(
            "{quoted}: not <operation> <value>: the operation is AND, OR, MOD or DIV (or &, |, %, /), \
             e.g. 'MOD 2' or '%2'"
        ));
    };
    let value = number(rest.trim_start()).map_err(|why| format!("{quoted}: {why}"))?;
    if value == 0 && matches!(op, Op::Mod | Op::Div) {
        return Err(format!(
            "{quoted}: rank {} 0 divides by zero: the value of MOD and DIV is 1 or more",
            op.symbol()
        ));
    }
    Ok(Spec {
        var: SPLIT_VAR,
        text: text.to_string(),
        op,
        value,
        ignored_split: false,
    })
}

/// `NCCL_TESTS_SPLIT_MASK`'s value: a hexadecimal mask, `0x3` or `3`.
pub fn parse_mask(text: &str) -> Result<Spec, String> {
    let text = text.trim();
    let digits = text
        .strip_prefix("0x")
        .or_else(|| text.strip_prefix("0X"))
        .unwrap_or(text);
    let value = u64::from_str_radix(digits, 16)
        .ok()
        .filter(|_| !digits.starts_with('+'))
        .ok_or_else(|| {
            format!(
                "{MASK_VAR}='{}': not a hexadecimal mask (e.g. 0x3, or 3: nccl-tests reads it in hexadecimal)",
                workbook_runtime::error::cut(text, 40)
            )
        })?;
    if value > MAX {
        return Err(format!(
            "{MASK_VAR}='{text}': larger than 0x{MAX:x}: a color is a C int"
        ));
    }
    Ok(Spec {
        var: MASK_VAR,
        text: text.to_string(),
        op: Op::And,
        value: value as u32,
        ignored_split: false,
    })
}

/// A value as C's `strtoul(s, NULL, 0)` reads it, after nccl-tests' `0b` prefix: decimal,
/// `0x` hex, `0b` binary, a leading `0` octal. Unlike nccl-tests, what follows the number
/// must be nothing (`2abc` is refused, not read as 2), and a sign is refused.
fn number(s: &str) -> Result<u32, String> {
    let lower = s.to_ascii_lowercase();
    let (digits, radix) = if let Some(d) = lower.strip_prefix("0x") {
        (d, 16)
    } else if let Some(d) = lower.strip_prefix("0b") {
        (d, 2)
    } else if lower.len() > 1 && lower.starts_with('0') {
        (&lower[1..], 8)
    } else {
        (lower.as_str(), 10)
    };
    let bad = || {
        format!(
            "'{}' is not a number: decimal, 0x hexadecimal, 0b binary (or octal with a leading 0)",
            workbook_runtime::error::cut(s, 40)
        )
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return Err(bad());
    }
    let value = u64::from_str_radix(digits, radix).map_err(|_| bad())?;
    if value > MAX {
        return Err(format!("{value}... is larger than {MAX}: a color is a C int"));
    }
    Ok(value as u32)
}

impl Spec {
    /// The color of world rank `rank`, as nccl-tests computes it.
    pub fn color(&self, rank: usize) -> i32 {
        let (r, v) = (rank as u32, self.value);
        let c = match self.op {
            Op::And => r & v,
            Op::Or => r | v,
            Op::Mod => r % v,
            Op::Div => r / v,
        };
        c as i32
    }

    /// `rank % 2`, `rank & 0x3`: how the color is computed.
    pub fn formula(&self) -> String {
        match self.op {
            Op::And | Op::Or => format!("rank {} {:#x}", self.op.symbol(), self.value),
            Op::Mod | Op::Div => format!("rank {} {}", self.op.symbol(), self.value),
        }
    }

    /// Each color's world ranks, in world order (the order of their ranks in it: nccl-tests
    /// splits with the world rank as the key).
    pub fn groups(&self, world: usize) -> BTreeMap<i32, Vec<usize>> {
        let mut groups: BTreeMap<i32, Vec<usize>> = BTreeMap::new();
        for r in 0..world {
            groups.entry(self.color(r)).or_default().push(r);
        }
        groups
    }

    /// The header's lines: the variable, the communicators it makes of `world` ranks, and
    /// what the table's figures are of.
    pub fn header(&self, world: usize) -> Vec<String> {
        let groups = self.groups(world);
        let sizes: Vec<usize> = groups.values().map(Vec::len).collect();
        let n = groups.len();
        let plural = |k: usize, what: &str| format!("{k} {what}{}", if k == 1 { "" } else { "s" });
        let made = match sizes.iter().all(|s| *s == sizes[0]) {
            true => format!("{} of {}", plural(n, "communicator"), plural(sizes[0], "rank")),
            false => {
                let each: Vec<String> = groups
                    .iter()
                    .map(|(c, m)| format!("color {c}: {}", plural(m.len(), "rank")))
                    .collect();
                format!("{} ({})", plural(n, "communicator"), each.join(", "))
            }
        };
        let ignored = match self.ignored_split {
            true => format!(" ({SPLIT_VAR} ignored: the mask wins, as in nccl-tests)"),
            false => String::new(),
        };
        // Rank 0's color, whose communicator's rows the table shows (the smallest color).
        let first = self.color(0);
        let mine = groups.get(&first).map_or(world, Vec::len);
        let together = match (n > 1, sizes.iter().all(|s| *s == sizes[0])) {
            (true, true) => format!("; the {n} together move {n}× the busbw"),
            _ => String::new(),
        };
        vec![
            format!(
                "# {}={}: {made} (color = {}), each running every sweep at the same time{ignored}",
                self.var,
                self.text,
                self.formula()
            ),
            format!(
                "# The rows are color {first}'s (rank 0's communicator): busbw for its {}, the time over all {world} \
                 ranks (-a), #wrong summed over every communicator{together}",
                plural(mine, "rank"),
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn colors(text: &str, world: usize) -> Vec<i32> {
        let s = parse_split(text).unwrap();
        (0..world).map(|r| s.color(r)).collect()
    }

    #[test]
    fn operations_and_values_read_as_nccl_tests_reads_them() {
        assert_eq!(colors("MOD 2", 4), [0, 1, 0, 1]);
        assert_eq!(colors("%2", 4), [0, 1, 0, 1]);
        assert_eq!(colors("mod2", 4), [0, 1, 0, 1]);
        assert_eq!(colors("DIV 2", 4), [0, 0, 1, 1]);
        assert_eq!(colors("/ 0b10", 4), [0, 0, 1, 1]);
        assert_eq!(colors("AND 0x1", 4), [0, 1, 0, 1]);
        assert_eq!(colors("&1", 4), [0, 1, 0, 1]);
        assert_eq!(colors("OR 0x1", 4), [1, 1, 3, 3]);
        assert_eq!(colors("| 1", 4), [1, 1, 3, 3]);
        // strtoul(s, NULL, 0): a leading 0 is octal.
        assert_eq!(parse_split("MOD 010").unwrap().value, 8);
        assert_eq!(
            parse_split("MOD 0").unwrap_err(),
            format!("{SPLIT_VAR}='MOD 0': rank % 0 divides by zero: the value of MOD and DIV is 1 or more")
        );
        assert!(parse_split("DIV 0x0").unwrap_err().contains("divides by zero"));
        assert!(parse_split("AND 0").is_ok(), "AND 0: every rank color 0");
        assert!(parse_split("XOR 3").unwrap_err().contains("not <operation> <value>"));
        assert!(parse_split("MOD x").unwrap_err().contains("'x' is not a number"));
        assert!(parse_split("MOD 2abc").unwrap_err().contains("not a number"));
        assert!(parse_split("MOD -2").unwrap_err().contains("not a number"));
        assert!(parse_split("MOD").unwrap_err().contains("not a number"));
        assert!(parse_split("OR 4294967295").unwrap_err().contains("a color is a C int"));
    }

    #[test]
    fn the_mask_is_hexadecimal_with_or_without_0x() {
        let m = parse_mask("0x3").unwrap();
        assert_eq!((m.op, m.value, m.formula()), (Op::And, 3, "rank & 0x3".to_string()));
        assert_eq!(parse_mask("10").unwrap().value, 16);
        assert!(parse_mask("zz").unwrap_err().contains("not a hexadecimal mask"));
        assert!(parse_mask("0x").is_err());
    }

    #[test]
    fn the_header_names_the_communicators() {
        let h = parse_split("MOD 2").unwrap().header(4);
        assert_eq!(
            h[0],
            "# NCCL_TESTS_SPLIT=MOD 2: 2 communicators of 2 ranks (color = rank % 2), each running every sweep at the same time"
        );
        assert!(
            h[1].contains("busbw for its 2 ranks") && h[1].contains("move 2× the busbw"),
            "{}",
            h[1]
        );
        let h = parse_split("DIV 3").unwrap().header(4);
        assert!(
            h[0].contains("2 communicators (color 0: 3 ranks, color 1: 1 rank)"),
            "{}",
            h[0]
        );
        assert!(!h[1].contains("together"), "{}", h[1]);
        assert_eq!(parse_split("DIV 3").unwrap().groups(4)[&1], vec![3]);
    }
}
