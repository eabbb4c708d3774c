//! The all-reduce example as real multi-process jobs, checked through --format json.

use testkit::{LIMIT, command, finish, run, spawn, stage};

const BIN: &str = env!("CARGO_BIN_EXE_02-nccl-allreduce");

#[test]
fn every_rank_holds_the_sum_for_every_world_size_and_count() {
    for world in 1..=4usize {
        for count in [1usize, 7, 1_000_003] {
            let (w, c) = (world.to_string(), count.to_string());
            let r = run(
                BIN,
                &[
                    "--nproc-per-node",
                    &w,
                    "--count",
                    &c,
                    "--init",
                    "rank",
                    "--iters",
                    "1",
                    "--format",
                    "json",
                ],
            )
            .ok();
            let j = r.json();
            let ctx = format!("world {world}, count {count}: {r}");
            assert_eq!(j["world_size"], world, "{ctx}");
            assert_eq!(j["count"], count, "{ctx}");
            assert_eq!(j["check"]["ok"], true, "{ctx}");
            assert_eq!(j["check"]["wrong"], 0, "{ctx}");
            let sum = (world * (world + 1) / 2) as f64;
            let shown = count.min(8);
            for (rank, row) in stage(&j, "before").iter().enumerate() {
                assert_eq!(row, &vec![(rank + 1) as f64; shown], "{ctx}");
            }
            for row in stage(&j, "after") {
                assert_eq!(row, vec![sum; shown], "{ctx}");
            }
            let ranks: Vec<u64> = j["ranks"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["rank"].as_u64().unwrap())
                .collect();
            assert_eq!(
                ranks,
                (0..world as u64).collect::<Vec<_>>(),
                "rows in rank order: {ctx}"
            );
            assert!(j["time_us"].as_f64().unwrap() > 0.0, "{ctx}");
        }
    }
}

#[test]
fn each_op_gives_what_nccl_computes() {
    // 4 ranks holding 1, 2, 3, 4; every other op over TCP.
    for (i, (op, want)) in [("sum", 10.0), ("prod", 24.0), ("max", 4.0), ("min", 1.0), ("avg", 2.5)]
        .into_iter()
        .enumerate()
    {
        let via = ["shm", "tcp"][i % 2];
        let line =
            format!("--nproc-per-node 4 --op {op} --count 7 --init rank --transport {via} --iters 1 --format json");
        let r = run(BIN, &line.split_whitespace().collect::<Vec<_>>()).ok();
        let j = r.json();
        assert_eq!(j["check"]["ok"], true, "{line}: {r}");
        assert_eq!(stage(&j, "after"), vec![vec![want; 7]; 4], "{line}: {r}");
        assert_eq!(j["transports"]["0-3"], via, "{line}: {r}");
    }
    let r = run(BIN, &["--op", "mean"]);
    assert_eq!(r.code, Some(2), "{r}");
    assert_eq!(r.stderr.lines().count(), 1, "{r}");
    assert!(r.stderr.contains("[possible values: sum, prod, max, min, avg]"), "{r}");
}

#[test]
fn the_text_output_is_the_courses_table() {
    let r = run(BIN, &[]).ok();
    let out = &r.stdout;
    for line in [
        "Before all-reduce:",
        "  CPU 0 | 1 | 1 | 1 | 1 |",
        "  CPU 1 | 1 | 1 | 1 | 1 |",
        "After all-reduce:",
        "  CPU 0 | 2 | 2 | 2 | 2 |",
        "  CPU 1 | 2 | 2 | 2 | 2 |",
        "Check: OK, all 2 ranks hold 2 in all 4 elements",
    ] {
        assert!(out.lines().any(|l| l == line), "missing {line:?} in:\n{r}");
    }
    assert!(out.lines().next().unwrap().starts_with("backend: cpu, because"), "{r}");
    assert!(out.contains("Time: ") && out.contains("busbw"), "{r}");
    assert!(
        !out.contains('\u{1b}'),
        "escape codes in output that is not a terminal:\n{r}"
    );
    assert!(r.stderr.is_empty(), "{r}");
}

#[test]
fn changed_cells_stand_out_only_when_colour_is_on() {
    let r = run(BIN, &["--color", "always"]).ok();
    let after = r.stdout.split("After all-reduce:").nth(1).unwrap();
    assert!(
        after.contains("\u{1b}[1;32m2\u{1b}[0m"),
        "the changed cells are not bold green:\n{r}"
    );
    assert!(
        !r.stdout.split("After").next().unwrap().contains('\u{1b}'),
        "the Before table changed nothing"
    );
    let mut cmd = command(BIN, &["--color", "auto"]);
    cmd.env("NO_COLOR", "1");
    let r = finish(spawn(cmd), LIMIT).ok();
    assert!(!r.stdout.contains('\u{1b}'), "{r}");
}

#[test]
fn a_wrong_element_is_counted_reported_and_fails_the_run() {
    let mut cmd = command(BIN, &["--nproc-per-node", "3", "--count", "7", "--format", "json"]);
    cmd.env("NCCL_WORKBOOK_FAULT", "corrupt:2:5");
    let r = finish(spawn(cmd), LIMIT);
    assert_eq!(r.code, Some(1), "{r}");
    let j = r.json();
    assert_eq!(j["check"]["ok"], false, "{r}");
    assert_eq!(j["check"]["wrong"], 1, "{r}");
    assert!(
        r.stderr.contains("rank 2: 1 wrong (element 5 is 6 instead of 3)"),
        "{r}"
    );
    assert_eq!(
        r.stderr.matches("check FAILED").count(),
        1,
        "said once, by rank 0:\n{r}"
    );
}

#[test]
fn size_takes_binary_suffixes() {
    let j = run(BIN, &["--size", "64K", "--iters", "1", "--format", "json"])
        .ok()
        .json();
    assert_eq!(j["count"], 16384);
    let algbw = j["algbw_gbps"].as_f64().unwrap();
    let expected = 65536.0 / 1e9 / (j["time_us"].as_f64().unwrap() / 1e6);
    assert!(
        (algbw - expected).abs() < 1e-9 * expected.max(1.0),
        "algbw {algbw} is not bytes/time ({expected})"
    );
    assert!(
        (j["busbw_gbps"].as_f64().unwrap() - algbw).abs() < 1e-12,
        "2 ranks: busbw = algbw × 2(n-1)/n = algbw"
    );
}

#[test]
fn a_nan_sums_to_nan_and_passes_its_own_check() {
    // NCCL adds NaN like any float: every element becomes NaN, which is what the check expects.
    let r = run(BIN, &["--backend", "cpu", "--value", "nan", "--format", "json"]);
    assert_eq!(r.code, Some(0), "{r}");
    assert_eq!(r.json()["check"]["ok"], true, "{r}");
}
