//! `bench/claims.sh`: reruns every figure and comparison that README.md, docs/ and EXERCISES.md
//! state, on the machine at hand, and prints what the text says beside what was measured,
//! with the direction of each comparison checked.
//!
//! Each claim ([`claims::all`]) quotes its text (the quote must still be in the file: a
//! claim whose text changed is stale), runs the commands the text runs, alternating them
//! round after round so that a slow moment of the machine hits every side alike, and
//! checks each comparison's direction on the medians. `--quick` (CI) runs every command
//! once with the fewest iterations, checks that it still runs and that every quote is
//! still there, and judges no timing.

mod claims;
mod run;

use anyhow::{Result, bail};
use claims::{Check, Claim};
use std::process::ExitCode;

/// What the command line asked for.
struct Options {
    quick: bool,
    runs: usize,
    only: Vec<String>,
    list: bool,
    /// `--write FILE`: the page of measured figures (docs/measured.md), written at the end.
    write: Option<std::path::PathBuf>,
}

fn parse() -> Result<Options> {
    let mut o = Options {
        quick: false,
        runs: 5,
        only: vec![],
        list: false,
        write: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => o.quick = true,
            "--list" => o.list = true,
            "--write" => match args.next().filter(|f| !f.is_empty() && !f.starts_with('-')) {
                Some(file) => o.write = Some(file.into()),
                None => bail!("--write takes the page to write (docs/measured.md)"),
            },
            "--runs" => {
                let n = args.next().unwrap_or_default();
                o.runs = match n.parse() {
                    Ok(n) if n > 0 => n,
                    _ => bail!("--runs takes a number of rounds, 1 or more (not {n:?})"),
                }
            }
            "-h" | "--help" => {
                println!(
                    "usage: bench/claims.sh [--quick] [--runs N] [--list] [--write FILE] [CLAIM...]\n\n\
                     Reruns every measured claim of README.md, docs/ and EXERCISES.md and prints the text's figures\n\
                     beside this machine's (medians of N rounds, 5 by default, the commands alternating).\n\
                     CLAIM: run only the claims whose id starts so (e.g. ch7). --quick: each command once,\n\
                     fewest iterations, no timing judged (CI). --list: the claims, without running them.\n\
                     --write FILE: also write the figures as a page (docs/measured.md), generated, never edited."
                );
                std::process::exit(0);
            }
            s if s.starts_with('-') => bail!("unknown option {s} (see --help)"),
            s => o.only.push(s.to_string()),
        }
    }
    if o.quick {
        if o.write.is_some() {
            bail!("--write with --quick: a page of figures needs measured rounds, not one run of each command");
        }
        o.runs = 1;
    }
    Ok(o)
}

fn main() -> ExitCode {
    let opts = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let all = match claims::all() {
        Ok(all) => all,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::from(2);
        }
    };
    let chosen: Vec<&Claim> = all
        .iter()
        .filter(|c| opts.only.is_empty() || opts.only.iter().any(|o| c.id.starts_with(o.as_str())))
        .collect();
    if chosen.is_empty() {
        eprintln!(
            "error: no claim's id starts with {} (see --list)",
            opts.only.join(" or ")
        );
        return ExitCode::from(2);
    }
    if opts.list {
        for c in &chosen {
            println!("{:<22} {}: {}", c.id, c.place, c.says);
        }
        return ExitCode::SUCCESS;
    }
    let machine = run::machine();
    println!("# claims of README.md, docs/ and EXERCISES.md, measured on {machine}");
    println!(
        "# {} ({} round{} per claim; medians, [lowest-highest])\n",
        if opts.quick {
            "quick: no timing is judged"
        } else {
            "full"
        },
        opts.runs,
        if opts.runs == 1 { "" } else { "s" }
    );
    let mut summary = vec![];
    let mut failed = 0;
    for claim in chosen {
        match judge(claim, &opts) {
            Ok(rows) => summary.extend(rows),
            Err(e) => {
                failed += 1;
                println!("  FAILED: {e:#}\n");
                summary.push(Row {
                    id: claim.id,
                    place: claim.place,
                    says: claim.says.to_string(),
                    measured: format!("failed: {e}"),
                    verdict: "FAILED".into(),
                });
            }
        }
    }
    if let Some(page) = &opts.write {
        if let Err(e) = write_page(page, &machine, opts.runs, &summary) {
            eprintln!("error: writing {}: {e}", page.display());
            return ExitCode::FAILURE;
        }
        println!("(the figures are written to {})\n", page.display());
    }
    println!("## Summary ({machine})\n");
    println!("| claim | the text says | measured here | direction |");
    println!("|---|---|---|---|");
    for r in &summary {
        println!("| {} | {} | {} | {} |", r.id, r.says, r.measured, r.verdict);
        if r.verdict.contains("DOES NOT HOLD") || r.verdict.starts_with("STALE") {
            failed += 1;
        }
    }
    if failed > 0 {
        println!("\n{failed} claim(s) failed, do not hold or are stale: fix the text or the code.");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// The page `--write` makes: what it is, where and when it was measured ([`run::machine`]
/// says both), and one row per
/// claim: where the text says it, what it says, the medians and ranges, and the direction.
fn write_page(page: &std::path::Path, machine: &str, runs: usize, rows: &[Row]) -> Result<()> {
    let mut text = format!(
        "# Measured figures\n\n\
         What the text's comparisons measure on one machine: every claim of README.md, docs/ and \
         EXERCISES.md that `bench/claims/claims.json` lists, rerun by `bench/claims.sh --write \
         docs/measured.md`. This page is generated: never edit it by hand; rerun the script.\n\n\
         Measured on {machine}: medians of {runs} round{}, the lowest and highest in brackets. \
         Laptops and VMs differ: directions and orders of magnitude carry over, single figures do not.\n\n\
         | claim | where | the text says | measured | direction |\n|---|---|---|---|---|\n",
        if runs == 1 { "" } else { "s" }
    );
    for r in rows {
        let cell = |s: &str| s.replace('|', "\\|");
        text.push_str(&format!(
            "| {} | {} | {} | {} | {} |\n",
            r.id,
            cell(r.place),
            cell(&r.says),
            cell(&r.measured),
            cell(&r.verdict)
        ));
    }
    std::fs::write(page, text)?;
    Ok(())
}

/// One line of the summary.
struct Row {
    id: &'static str,
    /// Where the text says it: `EXERCISES.md, answer 7`.
    place: &'static str,
    says: String,
    measured: String,
    verdict: String,
}

/// Runs one claim's commands round after round and judges its checks.
fn judge(claim: &Claim, opts: &Options) -> Result<Vec<Row>> {
    println!("### {} ({})", claim.id, claim.place);
    println!("  the text: \"{}\"", claim.quote);
    let stale = !run::quoted(claim.file, claim.quote)?;
    if stale {
        println!(
            "  STALE: this quote is no longer in {}: update the claim or the text",
            claim.file
        );
    }
    let values = run::measure(claim, opts.runs, opts.quick)?;
    for (m, v) in claim.measures.iter().zip(&values) {
        println!(
            "  {:<46} {:>22}   ({})",
            m.label,
            m.unit.spread(v),
            m.command_line(opts.quick)
        );
    }
    let med: Vec<f64> = values.iter().map(|v| run::median(v)).collect();
    let measured = claim
        .measures
        .iter()
        .zip(&values)
        .map(|(m, v)| format!("{} {}", m.label, m.unit.spread(v)))
        .collect::<Vec<_>>()
        .join("; ");
    let mut rows = vec![];
    if claim.checks.is_empty() {
        println!("  (figures only: no direction to check)\n");
        rows.push(Row {
            id: claim.id,
            place: claim.place,
            says: claim.says.into(),
            measured,
            verdict: if stale { "STALE".into() } else { "figures only".into() },
        });
        return Ok(rows);
    }
    let mut verdicts = vec![];
    for check in &claim.checks {
        let (text, holds) = check.judge(&claim.measures, &med);
        let verdict = match (opts.quick, holds, claim.depends) {
            (true, _, _) => format!("{text}: not judged (--quick)"),
            (false, true, _) => format!("{text}: holds"),
            (false, false, Some(why)) => format!("{text}: differs here (depends on the machine: {why})"),
            (false, false, None) => format!("DOES NOT HOLD: {text}"),
        };
        println!("  {verdict}");
        verdicts.push(verdict);
    }
    println!();
    let mut verdict = verdicts.join("; ");
    if stale {
        verdict = format!("STALE (the quote is not in {}); {verdict}", claim.file);
    }
    if let Some(v) = verdicts.iter().find(|v| v.starts_with("DOES NOT HOLD")) {
        verdict = format!("{v} (of: {})", verdicts.join("; "));
    }
    rows.push(Row {
        id: claim.id,
        place: claim.place,
        says: claim.says.into(),
        measured,
        verdict,
    });
    Ok(rows)
}

impl Check {
    /// The comparison in words, with the medians, and whether it holds.
    fn judge(&self, m: &[claims::Measure], med: &[f64]) -> (String, bool) {
        let sum = |side: &[usize]| side.iter().map(|&i| med[i]).sum::<f64>();
        let name = |side: &[usize]| {
            side.iter()
                .map(|&i| m[i].label.as_str())
                .collect::<Vec<_>>()
                .join(" + ")
        };
        match self {
            Check::Less { a, b, by } => {
                let ratio = sum(b) / sum(a);
                let need = match *by {
                    b if b > 1.0 => format!(" by {b}× or more"),
                    b if b < 1.0 => format!(" (or within {:.0}%)", (1.0 / b - 1.0) * 100.0),
                    _ => String::new(),
                };
                (format!("{} < {}{need} ({ratio:.2}×)", name(a), name(b)), ratio >= *by)
            }
            Check::Within { a, b, factor } => {
                let ratio = sum(a) / sum(b);
                (
                    format!("{} ≈ {} within {factor}× ({ratio:.2}×)", name(a), name(b)),
                    ratio <= *factor && ratio >= 1.0 / factor,
                )
            }
            Check::Below { a, value } => (
                format!("{} < {}", m[*a].label, m[*a].unit.show(*value)),
                med[*a] < *value,
            ),
        }
    }
}
