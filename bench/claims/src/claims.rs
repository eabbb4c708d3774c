//! The claims: what README.md, docs/ and EXERCISES.md state, the commands that measure it, and
//! the direction each comparison must have. When the text changes, its claim changes in
//! the same commit (a quote no longer in the text makes the claim stale).
//!
//! The claims themselves are data, in the order of the text: `bench/claims/claims.json`,
//! built into the program and read by [`all`]. Each one there is an object:
//!
//! - `id`, `place`, `file`, `quote`, `says`, and `depends` where the direction depends
//!   on the machine: [`Claim`]'s fields; `note`, what a reader of the file should know
//!   (which measure is which, why a bound is what it is), which the program ignores;
//! - `measures`, each `{"label", "run", "nodes", "report" | "row" + "at" | "rows",
//!   "unit"}`: `run` is the command as a person types it (variables first, `NCCL_ALGO=Ring
//!   07-nccl-perf --coll all_reduce ...`), `nodes` the "nodes" of this host (1 when left
//!   out), `report` a JSON pointer into the command's report ([`Stat::Report`]), `row` a
//!   size (`4`, `16K`, `64M`) with `at` a pointer into the benchmark's row of that size
//!   ([`Stat::Row`]), `rows` a pointer whose largest value over every row counts
//!   ([`Stat::Rows`]); `unit` is `us`, `GB/s`, `count` or `share` ([`Unit`]);
//! - `checks`, each on the measures' numbers: `{"less": [a...], "than": [b...], "by": f}`
//!   (`by` 1 when left out), `{"within": [a...], "of": [b...], "factor": f}` or
//!   `{"below": a, "value": v}` ([`Check`]).

use anyhow::{Context, Result, bail};
use serde_json::{Map, Value};

/// One command of the workbook (a release binary), as the text runs it.
#[derive(Clone, Debug)]
pub struct Cmd {
    /// The binary: `07-nccl-perf`, `sol07-packed-broadcast`.
    pub bin: &'static str,
    /// Its arguments, as the text writes them (`--format json` is added).
    pub args: Vec<String>,
    /// Variables in front of it (`NCCL_ALGO=Ring`).
    pub env: Vec<(&'static str, &'static str)>,
    /// "Nodes" of this host, each its own launcher (`--nnodes`), 1 for a plain run.
    pub nodes: usize,
}

impl Cmd {
    /// The arguments to run: in `--quick`, the fewest timed iterations.
    pub fn args_for(&self, quick: bool) -> Vec<String> {
        let mut out = self.args.clone();
        if quick {
            for i in 1..out.len() {
                match out[i - 1].as_str() {
                    "--iters" | "-n" => out[i] = "1".into(),
                    "-w" => out[i] = "0".into(),
                    _ => {}
                }
            }
        }
        out
    }
}

/// Where a figure is in a command's JSON report.
#[derive(Clone, Debug)]
pub enum Stat {
    /// A JSON pointer into the report: `/time_us`.
    Report(&'static str),
    /// A pointer into the benchmark's row of this size: `/in_place/busbw`.
    Row(u64, &'static str),
    /// The largest value at this pointer over every row.
    Rows(&'static str),
}

/// How a figure is shown.
#[derive(Clone, Copy, Debug)]
pub enum Unit {
    /// Microseconds (shown in ms from 1000).
    Us,
    /// Milliseconds (lesson 10's step times).
    Ms,
    /// GB/s.
    GBps,
    /// A count (calls that slept).
    Count,
    /// A fraction, shown in percent (how far a row is off a fit).
    Share,
}

impl Unit {
    /// One value.
    pub fn show(self, v: f64) -> String {
        match self {
            Unit::Us if v >= 1000.0 => format!("{:.2} ms", v / 1000.0),
            Unit::Us if v >= 10.0 => format!("{v:.0} µs"),
            Unit::Us => format!("{v:.2} µs"),
            Unit::Ms => format!("{v:.1} ms"),
            Unit::GBps => format!("{v:.2} GB/s"),
            Unit::Count => format!("{v:.0}"),
            Unit::Share => format!("{:.0}%", v * 100.0),
        }
    }

    /// The median and, with several values, the range: `1.6 ms [1.4-1.9]`.
    pub fn spread(self, v: &[f64]) -> String {
        let m = crate::run::median(v);
        if v.len() < 2 {
            return self.show(m);
        }
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        format!("{} [{}-{}]", self.show(m), self.show(lo), self.show(hi))
    }
}

/// One measured figure: a label, the command, and where its figure is.
#[derive(Clone, Debug)]
pub struct Measure {
    pub label: String,
    pub cmd: Cmd,
    pub stat: Stat,
    pub unit: Unit,
}

impl Measure {
    /// The command as a person types it.
    pub fn command_line(&self, quick: bool) -> String {
        let env: String = self.cmd.env.iter().map(|(k, v)| format!("{k}={v} ")).collect();
        let nodes = match self.cmd.nodes {
            1 => String::new(),
            n => format!(" (on {n} \"nodes\")"),
        };
        format!("{env}{} {}{nodes}", self.cmd.bin, self.cmd.args_for(quick).join(" "))
    }
}

/// The direction a comparison must have, on the medians. A side is the sum of the
/// measures it lists (a reduce-scatter and an all-gather against an all-reduce).
#[derive(Clone, Debug)]
pub enum Check {
    /// Side `a` is less than side `b`, by the factor `by` at least (1: any).
    Less { a: Vec<usize>, b: Vec<usize>, by: f64 },
    /// Sides `a` and `b` are within `factor` of each other.
    Within { a: Vec<usize>, b: Vec<usize>, factor: f64 },
    /// Measure `a` is below `value`.
    Below { a: usize, value: f64 },
}

/// One claim of the text.
#[derive(Clone, Debug)]
pub struct Claim {
    /// Short and stable: `ch7.shm`.
    pub id: &'static str,
    /// Where: `EXERCISES.md, answer 7`.
    pub place: &'static str,
    /// The file that must still hold the quote.
    pub file: &'static str,
    /// The text's own words (its figures): must be found in `file`.
    pub quote: &'static str,
    /// The claim in a few words, for the summary.
    pub says: &'static str,
    pub measures: Vec<Measure>,
    pub checks: Vec<Check>,
    /// Why the direction depends on the machine, when it does: then a direction that
    /// does not hold here is reported, not failed.
    pub depends: Option<&'static str>,
}

/// The claims' data, `bench/claims/claims.json`, built into the program.
const DATA: &str = include_str!("../claims.json");

/// Every claim, in the order of the text, read from `bench/claims/claims.json`.
pub fn all() -> Result<Vec<Claim>> {
    parse(DATA).context("bench/claims/claims.json")
}

/// The claims of `text`, a JSON list of claims (see the module's doc).
fn parse(text: &str) -> Result<Vec<Claim>> {
    let data: Value = serde_json::from_str(text)?;
    let list = data.as_array().context("not a list of claims")?;
    list.iter()
        .enumerate()
        .map(|(i, c)| {
            let id = c.get("id").and_then(Value::as_str).unwrap_or("?");
            claim(c).with_context(|| format!("claim {} ({id})", i + 1))
        })
        .collect()
}

/// One claim.
fn claim(v: &Value) -> Result<Claim> {
    let m = object(
        v,
        &[
            "id", "place", "file", "quote", "says", "note", "depends", "measures", "checks",
        ],
    )?;
    let measures = list(m, "measures")?
        .iter()
        .enumerate()
        .map(|(i, v)| measure(v).with_context(|| format!("measure {i}")))
        .collect::<Result<Vec<_>>>()?;
    let checks = list(m, "checks")?
        .iter()
        .enumerate()
        .map(|(i, v)| check(v, measures.len()).with_context(|| format!("check {}", i + 1)))
        .collect::<Result<Vec<_>>>()?;
    Ok(Claim {
        id: text(m, "id")?,
        place: text(m, "place")?,
        file: text(m, "file")?,
        quote: text(m, "quote")?,
        says: text(m, "says")?,
        measures,
        checks,
        depends: m.get("depends").map(|_| text(m, "depends")).transpose()?,
    })
}

/// One measure: its label, its command, where its figure is and how it is shown.
fn measure(v: &Value) -> Result<Measure> {
    let m = object(v, &["label", "run", "nodes", "report", "row", "at", "rows", "unit"])?;
    let stat = match (m.contains_key("report"), m.contains_key("row"), m.contains_key("rows")) {
        (true, false, false) => Stat::Report(text(m, "report")?),
        (false, true, false) => Stat::Row(size(text(m, "row")?)?, text(m, "at")?),
        (false, false, true) => Stat::Rows(text(m, "rows")?),
        _ => bail!("a measure takes one of report, row (with at) and rows"),
    };
    if m.contains_key("at") && !m.contains_key("row") {
        bail!("at goes with row");
    }
    let unit = match text(m, "unit")? {
        "us" => Unit::Us,
        "ms" => Unit::Ms,
        "GB/s" => Unit::GBps,
        "count" => Unit::Count,
        "share" => Unit::Share,
        other => bail!("unit {other:?}: us, GB/s, count or share"),
    };
    // Variables first (`NCCL_ALGO=Ring`), then the binary, then its arguments.
    let mut words = text(m, "run")?.split_whitespace().peekable();
    let mut env = vec![];
    while let Some((k, v)) = words.peek().and_then(|w| w.split_once('=')) {
        env.push((k, v));
        words.next();
    }
    let bin = words.next().context("run names no binary")?;
    let nodes = match m.get("nodes") {
        None => 1,
        Some(n) => n.as_u64().filter(|&n| n > 0).context("nodes: a number, 1 or more")? as usize,
    };
    Ok(Measure {
        label: text(m, "label")?.to_string(),
        cmd: Cmd {
            bin,
            args: words.map(str::to_string).collect(),
            env,
            nodes,
        },
        stat,
        unit,
    })
}

/// One check, on a claim of `measures` measures.
fn check(v: &Value, measures: usize) -> Result<Check> {
    let m = v.as_object().context("not an object")?;
    let side = |key: &str| -> Result<Vec<usize>> {
        let side = list(m, key)?
            .iter()
            .map(|i| index(i, measures))
            .collect::<Result<Vec<_>>>()
            .with_context(|| key.to_string())?;
        match side.is_empty() {
            true => bail!("{key}: no measure"),
            false => Ok(side),
        }
    };
    if m.contains_key("less") {
        object(v, &["less", "than", "by"])?;
        let by = match m.get("by") {
            None => 1.0,
            Some(_) => number(m, "by")?,
        };
        Ok(Check::Less {
            a: side("less")?,
            b: side("than")?,
            by,
        })
    } else if m.contains_key("within") {
        object(v, &["within", "of", "factor"])?;
        Ok(Check::Within {
            a: side("within")?,
            b: side("of")?,
            factor: number(m, "factor")?,
        })
    } else if m.contains_key("below") {
        object(v, &["below", "value"])?;
        Ok(Check::Below {
            a: index(&m["below"], measures).context("below")?,
            value: number(m, "value")?,
        })
    } else {
        bail!("a check is less (than, by), within (of, factor) or below (value)")
    }
}

/// `v` as an object whose keys are all in `known` (a misspelt key is an error, not ignored).
fn object<'a>(v: &'a Value, known: &[&str]) -> Result<&'a Map<String, Value>> {
    let m = v.as_object().context("not an object")?;
    if let Some(k) = m.keys().find(|k| !known.contains(&k.as_str())) {
        bail!("unknown key {k:?} (known: {})", known.join(", "));
    }
    Ok(m)
}

/// The text at `key`. The claims live as long as the program: their text is kept for
/// good (leaked once), so that a claim's fields stay `&'static str`.
fn text(m: &Map<String, Value>, key: &str) -> Result<&'static str> {
    let s = m
        .get(key)
        .and_then(Value::as_str)
        .with_context(|| format!("{key}: a text"))?;
    Ok(Box::leak(s.to_string().into_boxed_str()))
}

/// The number at `key`.
fn number(m: &Map<String, Value>, key: &str) -> Result<f64> {
    m.get(key)
        .and_then(Value::as_f64)
        .with_context(|| format!("{key}: a number"))
}

/// The list at `key`.
fn list<'a>(m: &'a Map<String, Value>, key: &str) -> Result<&'a Vec<Value>> {
    m.get(key)
        .and_then(Value::as_array)
        .with_context(|| format!("{key}: a list"))
}

/// A measure's index, below `measures`.
fn index(v: &Value, measures: usize) -> Result<usize> {
    match v.as_u64() {
        Some(i) if (i as usize) < measures => Ok(i as usize),
        _ => bail!("{v}: not the index of one of the claim's {measures} measures"),
    }
}

/// A size as the commands write it: `4`, `16K`, `64M` (bytes).
fn size(s: &str) -> Result<u64> {
    let (digits, shift) = match s.strip_suffix('K') {
        Some(d) => (d, 10),
        None => match s.strip_suffix('M') {
            Some(d) => (d, 20),
            None => (s, 0),
        },
    };
    match digits.parse::<u64>() {
        Ok(n) => Ok(n << shift),
        Err(_) => bail!("row {s:?}: a size in bytes (4, 16K, 64M)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_claim_reads_and_every_id_is_its_own() {
        let all = all().unwrap();
        assert!(all.len() > 20, "{} claims", all.len());
        let mut ids: Vec<&str> = all.iter().map(|c| c.id).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), all.len(), "an id twice");
        assert!(all.iter().all(|c| !c.measures.is_empty()));
    }

    #[test]
    fn a_run_line_is_read_as_variables_binary_and_arguments() {
        let c = parse(
            r#"[{"id": "x", "place": "p", "file": "f", "quote": "q", "says": "s",
                "measures": [{"label": "l", "run": "NCCL_ALGO=Ring A=1 07-nccl-perf -b 4 -e 16K", "nodes": 2,
                              "row": "16K", "at": "/in_place/busbw", "unit": "GB/s"}],
                "checks": [{"below": 0, "value": 0.5}]}]"#,
        )
        .unwrap();
        let m = &c[0].measures[0];
        assert_eq!(m.cmd.env, [("NCCL_ALGO", "Ring"), ("A", "1")]);
        assert_eq!(
            (m.cmd.bin, m.cmd.args.join(" "), m.cmd.nodes),
            ("07-nccl-perf", "-b 4 -e 16K".into(), 2)
        );
        assert!(matches!(m.stat, Stat::Row(16384, "/in_place/busbw")));
        assert!(matches!(c[0].checks[0], Check::Below { a: 0, value: 0.5 }));
    }

    #[test]
    fn a_misspelt_key_or_an_index_past_the_measures_is_refused() {
        let one = |measure: &str, check: &str| {
            parse(&format!(
                r#"[{{"id": "x", "place": "p", "file": "f", "quote": "q", "says": "s",
                     "measures": [{measure}], "checks": [{check}]}}]"#
            ))
            .map(|_| ())
            .map_err(|e| format!("{e:#}"))
        };
        let ok = r#"{"label": "l", "run": "b", "report": "/time_us", "unit": "us"}"#;
        assert_eq!(one(ok, r#"{"less": [0], "than": [0]}"#), Ok(()));
        let e = one(ok, r#"{"less": [0], "than": [1]}"#).unwrap_err();
        assert!(e.contains("not the index of one of the claim's 1 measures"), "{e}");
        let e = one(
            r#"{"label": "l", "run": "b", "report": "/t", "unit": "us", "nodse": 2}"#,
            "",
        )
        .unwrap_err();
        assert!(e.contains("unknown key \"nodse\""), "{e}");
        let e = one(r#"{"label": "l", "run": "b", "report": "/t", "unit": "hours"}"#, "").unwrap_err();
        assert!(e.contains("unit \"hours\""), "{e}");
    }
}
