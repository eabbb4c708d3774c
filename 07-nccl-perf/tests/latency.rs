//! Latency a student can measure: besides the mean of the calls back to back, every row
//! gives the spread of the single calls (nccl-tests' `-I`: median, p99) and how many of
//! them slept, in the text table and in the JSON rows. Real multi-process jobs; no time is
//! asserted, only what is reported and how.

use serde_json::Value;
use testkit::{LIMIT, Run, command, finish, spawn};

const BIN: &str = env!("CARGO_BIN_EXE_07-nccl-perf");

fn perf(args: &[&str]) -> Run {
    finish(spawn(command(BIN, args)), LIMIT).ok()
}

/// Every placement of every row has a median no larger than its p99, both positive, and
/// a `slept` that is a count of at most `iters` calls (`counted`) or null (not counted).
fn check_rows(j: &Value, iters: u64, counted: bool, r: &Run) {
    let rows = j["rows"].as_array().unwrap_or_else(|| panic!("no rows:\n{r}"));
    assert!(!rows.is_empty(), "{r}");
    for row in rows {
        for place in ["out_of_place", "in_place"] {
            let p = &row[place];
            let (median, p99) = (p["median_us"].as_f64(), p["p99_us"].as_f64());
            let (Some(median), Some(p99)) = (median, p99) else {
                panic!("{place} has no median_us/p99_us: {p}\n{r}");
            };
            assert!(median > 0.0 && median <= p99, "{place}: {p}\n{r}");
            match counted {
                true => assert!(p["slept"].as_u64().is_some_and(|n| n <= iters), "{place}: {p}\n{r}"),
                false => assert!(p["slept"].is_null(), "{place}: {p}\n{r}"),
            }
        }
    }
}

#[test]
fn every_row_carries_its_single_calls_in_json_over_both_transports() {
    for (via, counted) in [("shm", true), ("tcp", false)] {
        let r = perf(&[
            "--coll",
            "all_reduce",
            "-b",
            "4",
            "-e",
            "1K",
            "-f",
            "16",
            "-n",
            "40",
            "--nproc-per-node",
            "2",
            "--transport",
            via,
            "--format",
            "json",
        ]);
        check_rows(&r.json(), 40, counted, &r);
    }
    // A rooted collective on 3 ranks, and the sweep of every collective.
    let r = perf(&[
        "--coll",
        "all",
        "-b",
        "64",
        "-e",
        "64",
        "-n",
        "10",
        "--nproc-per-node",
        "3",
        "--format",
        "json",
    ]);
    let sweeps = r.json()["sweeps"].as_array().cloned().unwrap_or_default();
    assert_eq!(sweeps.len(), 6, "{r}");
    for sweep in &sweeps {
        check_rows(sweep, 10, true, &r);
    }
}

#[test]
fn the_text_table_gives_the_single_calls_under_each_row() {
    let r = perf(&[
        "--coll",
        "broadcast",
        "-b",
        "64",
        "-e",
        "256",
        "-f",
        "2",
        "-n",
        "30",
        "--nproc-per-node",
        "3",
    ]);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("# time: mean of the calls back to back") && l.contains("may overlap")),
        "the header says what the time column is, and that a rooted collective's calls overlap:\n{r}"
    );
    let rows: Vec<usize> = (0..lines.len())
        .filter(|i| lines[*i].trim_start().starts_with(char::is_numeric))
        .collect();
    assert_eq!(rows.len(), 3, "{r}");
    for i in rows {
        // Under the row: a comment (programs reading nccl-tests' rows skip it), one
        // "p50 .. p99 .. slept N" under each placement.
        let under = lines[i + 1];
        assert!(
            under.starts_with('#') && under.contains("30 single calls:"),
            "{under}\n{r}"
        );
        let words: Vec<&str> = under.split_whitespace().collect();
        let at = |w: &str| {
            words
                .iter()
                .enumerate()
                .filter(|(_, x)| **x == w)
                .map(|(k, _)| k)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            (at("p50").len(), at("p99").len(), at("slept").len()),
            (2, 2, 2),
            "{under}"
        );
        for k in at("p50").into_iter().chain(at("p99")) {
            assert!(words[k + 1].parse::<f64>().is_ok(), "{under}");
        }
        for k in at("slept") {
            assert!(words[k + 1].parse::<u64>().is_ok_and(|n| n <= 30), "{under}");
        }
        // The placements line up: the second line is as long as the row without its
        // last column, the algorithm and the protocol (`direct simple`, `ring ll128`).
        let (row, algo) = lines[i].rsplit_once("  ").unwrap();
        assert!(
            algo.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "-/ ".contains(c)),
            "{}",
            lines[i]
        );
        assert_eq!(under.len(), row.len(), "{under}\n{}", lines[i]);
    }
    // Over TCP the sleeps are not counted, and the table says so.
    let r = perf(&[
        "--coll",
        "all_reduce",
        "-b",
        "64",
        "-e",
        "64",
        "-n",
        "5",
        "--nproc-per-node",
        "2",
        "--transport",
        "tcp",
    ]);
    let under = r
        .stdout
        .lines()
        .find(|l| l.contains("single calls:"))
        .unwrap_or_else(|| panic!("{r}"));
    assert_eq!(under.matches("slept n/a").count(), 2, "{under}");
}
