//! `NCCL_TESTS_SPLIT` (and `NCCL_TESTS_SPLIT_MASK`): the benchmark on sub-communicators,
//! as nccl-tests runs it. Real multi-process jobs, on the CPU backend and on the NCCL
//! test double: the header names the split, busbw counts the communicator's ranks, every
//! communicator's elements are checked, `-J` says each rank's group, and a value that
//! means nothing is refused in one line.

use serde_json::Value;
use std::path::PathBuf;
use testkit::{LIMIT, Run, command, finish, spawn};

const BIN: &str = env!("CARGO_BIN_EXE_07-nccl-perf");

/// Runs the benchmark with `line`'s words as its arguments, and `env` set.
fn perf(line: &str, env: &[(&str, &str)]) -> Run {
    let mut cmd = command(BIN, &line.split_whitespace().collect::<Vec<_>>());
    cmd.env_remove("NCCL_TESTS_SPLIT").env_remove("NCCL_TESTS_SPLIT_MASK");
    cmd.envs(env.iter().copied());
    finish(spawn(cmd), LIMIT)
}

/// A `-J` file of this test process.
fn file(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("split-{name}-{}.json", std::process::id()))
}

/// The table's rows: lines that start with a size.
fn rows(out: &str) -> Vec<Vec<&str>> {
    out.lines()
        .filter(|l| l.split_whitespace().next().is_some_and(|w| w.parse::<u64>().is_ok()))
        .map(|l| l.split_whitespace().collect())
        .collect()
}

/// The `-J` file's `split.communicators`, as (color, ranks).
fn communicators(doc: &Value) -> Vec<(i64, Vec<u64>)> {
    doc["split"]["communicators"]
        .as_array()
        .unwrap_or_else(|| panic!("no split.communicators in {doc}"))
        .iter()
        .map(|c| {
            let ranks: Vec<u64> = c["ranks"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r.as_u64().unwrap())
                .collect();
            assert_eq!(c["nranks"].as_u64(), Some(ranks.len() as u64), "{c}");
            (c["color"].as_i64().unwrap(), ranks)
        })
        .collect()
}

/// Every result of a `-J` file: no wrong element, and busbw = algbw × `factor` (the
/// factor of the communicator's size, not the world's).
fn results_checked(doc: &Value, factor: f64) {
    let results = doc["results"].as_array().unwrap();
    assert!(!results.is_empty(), "{doc}");
    for res in results {
        for place in ["out_of_place", "in_place"] {
            let p = &res[place];
            assert_eq!(p["nwrong"], 0, "{res}");
            let (alg, bus) = (p["alg_bw"].as_f64().unwrap(), p["bus_bw"].as_f64().unwrap());
            assert!(
                (bus - alg * factor).abs() <= 1e-9 * alg.max(1.0),
                "busbw {bus} for algbw {alg}: {res}"
            );
        }
    }
}

#[test]
fn mod_2_on_four_cpu_ranks_measures_two_communicators_of_two() {
    let path = file("cpu");
    let r = perf(
        &format!(
            "--nproc-per-node 4 --coll all -b 24 -e 24 -n 1 -w 0 -J {}",
            path.display()
        ),
        &[("NCCL_TESTS_SPLIT", "MOD 2")],
    )
    .ok();
    let out = &r.stdout;
    assert!(
        out.lines().any(|l| l
            == "# NCCL_TESTS_SPLIT=MOD 2: 2 communicators of 2 ranks (color = rank % 2), each running every sweep at \
                the same time"),
        "{r}"
    );
    assert!(
        out.contains("# The rows are color 0's (rank 0's communicator): busbw for its 2 ranks"),
        "{r}"
    );
    // nccl-tests' device lines, with each rank's group.
    for rank in 0..4 {
        let line = format!("#  Rank {rank:>2} Group {:>2} Pid", rank % 2);
        assert!(out.lines().any(|l| l.starts_with(&line)), "no '{line}':\n{r}");
    }
    // busbw for 2 ranks: all-reduce's 2(n-1)/n is 1 (on 4 ranks it would be 1.5).
    assert!(
        out.contains("# all_reduce (ncclAllReduce), float, operator sum: busbw = algbw\n"),
        "{r}"
    );
    assert!(
        out.contains("# all_gather (ncclAllGather), float, no operator: busbw = algbw × 0.500"),
        "{r}"
    );
    // One table (rank 0's communicator), each collective once, every element right.
    let rows = rows(out);
    assert_eq!(rows.len(), 6, "one row per collective:\n{r}");
    for row in &rows {
        assert_eq!((row[8], row[12]), ("0", "0"), "#wrong: {row:?}\n{r}");
    }
    // 24 B of all-gather is 6 floats: a multiple of 2 ranks (4 ranks would make it 16 B).
    let gather = rows
        .iter()
        .find(|row| row.contains(&"float") && row[3] == "none" && row[4] == "-1");
    assert!(gather.is_some_and(|row| row[0] == "24"), "{r}");

    let doc: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let _ = std::fs::remove_file(&path);
    assert_eq!(communicators(&doc), [(0, vec![0, 2]), (1, vec![1, 3])]);
    assert_eq!(doc["split"]["variable"], "NCCL_TESTS_SPLIT");
    assert_eq!(doc["split"]["color"], "rank % 2");
    let groups: Vec<&Value> = doc["config"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| &d["group"])
        .collect();
    assert_eq!(groups, [0, 1, 0, 1]);
    let all_reduce: Vec<&Value> = doc["results"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|res| res["collective"] == "all_reduce")
        .collect();
    assert_eq!(all_reduce.len(), 1, "{doc}");
    results_checked(&serde_json::json!({ "results": all_reduce }), 1.0);
}

#[test]
fn mod_2_on_four_simulated_gpus_splits_ncclcommsplit() {
    let path = file("nccl");
    let r = perf(
        &format!(
            "--simulate-gpus 4 -b 1K -e 16K -f 4 -n 2 -w 1 --format json -J {}",
            path.display()
        ),
        &[("NCCL_TESTS_SPLIT", "%2")],
    )
    .ok();
    let j = r.json();
    assert_eq!(j["backend"], "nccl", "{r}");
    assert_eq!(j["world_size"], 4, "{r}");
    // --format json names the split as -J does.
    assert_eq!(j["split"]["value"], "%2", "{r}");
    assert_eq!(communicators(&j), [(0, vec![0, 2]), (1, vec![1, 3])], "{r}");
    assert_eq!(j["wrong"], 0, "{r}");
    let rows = j["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 3, "{r}");
    for row in rows {
        for place in ["out_of_place", "in_place"] {
            let p = &row[place];
            assert_eq!(p["wrong"], 0, "{r}");
            // all_reduce on 2 ranks: busbw = algbw (× 1.5 on 4).
            let (alg, bus) = (p["algbw"].as_f64().unwrap(), p["busbw"].as_f64().unwrap());
            assert!((bus - alg).abs() <= 1e-9 * alg.max(1.0), "{row}\n{r}");
        }
    }
    let doc: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let _ = std::fs::remove_file(&path);
    assert_eq!(communicators(&doc), [(0, vec![0, 2]), (1, vec![1, 3])]);
    assert_eq!(doc["split"]["value"], "%2");
    results_checked(&doc, 1.0);
}

#[test]
fn unequal_communicators_and_the_mask_are_named() {
    // DIV 3 on 4 ranks: ranks 0-2, and rank 3 alone (a communicator of one).
    let r = perf(
        "--nproc-per-node 4 -b 64 -e 256 -f 4 -n 1 -w 0",
        &[("NCCL_TESTS_SPLIT", "DIV 3")],
    )
    .ok();
    assert!(
        r.stdout.contains(
            "# NCCL_TESTS_SPLIT=DIV 3: 2 communicators (color 0: 3 ranks, color 1: 1 rank) (color = rank / 3)"
        ),
        "{r}"
    );
    assert!(r.stdout.contains("busbw for its 3 ranks"), "{r}");
    assert!(
        r.stdout.contains("busbw = algbw × 1.333"),
        "all-reduce on 3 ranks:\n{r}"
    );
    for row in rows(&r.stdout) {
        assert_eq!((row[8], row[12]), ("0", "0"), "#wrong: {row:?}\n{r}");
    }

    // The mask wins over NCCL_TESTS_SPLIT, read in hexadecimal: rank & 0x2.
    let path = file("mask");
    let r = perf(
        &format!("--nproc-per-node 4 -b 64 -e 64 -n 1 -w 0 -J {}", path.display()),
        &[("NCCL_TESTS_SPLIT_MASK", "2"), ("NCCL_TESTS_SPLIT", "MOD 2")],
    )
    .ok();
    assert!(
        r.stdout.contains(
            "# NCCL_TESTS_SPLIT_MASK=2: 2 communicators of 2 ranks (color = rank & 0x2), each running every sweep at \
             the same time (NCCL_TESTS_SPLIT ignored: the mask wins, as in nccl-tests)"
        ),
        "{r}"
    );
    let doc: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let _ = std::fs::remove_file(&path);
    assert_eq!(communicators(&doc), [(0, vec![0, 1]), (2, vec![2, 3])]);
    results_checked(&doc, 1.0);
}

#[test]
fn a_wrong_element_on_the_other_communicator_is_counted() {
    // Rank 3 (color 1, whose rows are not printed) doubles its element 0 before each
    // check: nccl-tests sums #wrong over the world, so the table shows it.
    let r = perf(
        "--nproc-per-node 4 -b 1K -e 1K -n 1 -w 0 --format json",
        &[("NCCL_TESTS_SPLIT", "MOD 2"), ("NCCL_WORKBOOK_FAULT", "corrupt:3:0")],
    );
    assert_eq!(r.code, Some(1), "{r}");
    let j = r.json();
    for row in j["rows"].as_array().unwrap() {
        assert_eq!(row["out_of_place"]["wrong"], 1, "{r}");
        assert_eq!(row["in_place"]["wrong"], 1, "{r}");
    }
    assert!(r.stderr.contains("2 wrong element(s)"), "{r}");
}

#[test]
fn a_split_that_means_nothing_is_refused_in_one_line() {
    const SMALL: &str = "-b 64 -e 64 -n 1 -w 0";
    for (var, value, args, why) in [
        (
            "NCCL_TESTS_SPLIT",
            "MOD 0",
            SMALL,
            "NCCL_TESTS_SPLIT='MOD 0': rank % 0 divides by zero",
        ),
        (
            "NCCL_TESTS_SPLIT",
            "div 0x0",
            SMALL,
            "NCCL_TESTS_SPLIT='div 0x0': rank / 0 divides by zero",
        ),
        (
            "NCCL_TESTS_SPLIT",
            "XOR 2",
            SMALL,
            "NCCL_TESTS_SPLIT='XOR 2': not <operation> <value>",
        ),
        (
            "NCCL_TESTS_SPLIT",
            "MOD two",
            SMALL,
            "NCCL_TESTS_SPLIT='MOD two': 'two' is not a number",
        ),
        (
            "NCCL_TESTS_SPLIT_MASK",
            "0xZ",
            SMALL,
            "NCCL_TESTS_SPLIT_MASK='0xZ': not a hexadecimal mask",
        ),
        // A root is a rank of the communicator, not of the world.
        (
            "NCCL_TESTS_SPLIT",
            "MOD 2",
            "--nproc-per-node 4 --coll broadcast -r 2 -b 64 -e 64 -n 1 -w 0",
            "--root 2 is not a rank of every communicator: NCCL_TESTS_SPLIT=MOD 2 makes one of 2 rank(s) (ranks 0 to 1)",
        ),
    ] {
        let r = perf(args, &[(var, value)]);
        assert_eq!(r.code, Some(2), "{var}={value}:\n{r}");
        let lines: Vec<&str> = r.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "{var}={value}:\n{r}");
        assert!(
            lines[0].starts_with("error: rank 0: ") && lines[0].contains(why),
            "{var}={value}:\n{r}"
        );
        assert!(rows(&r.stdout).is_empty(), "no sweep ran:\n{r}");
    }
}
