//! The benchmark as real multi-process jobs: its figures follow nccl-tests' formulas,
//! every element is checked (#wrong is 0, and a corrupted element is counted and fails
//! the run), on both transports, under the launcher and with ranks started by hand, and
//! on the NCCL test double.

use serde_json::Value;
use testkit::{LIMIT, Run, command, finish, free_port, nccl_command, spawn};

const BIN: &str = env!("CARGO_BIN_EXE_07-nccl-perf");

/// Runs the benchmark with `line`'s words as its arguments, and `env` set.
fn perf(line: &str, env: &[(&str, &str)]) -> Run {
    let mut cmd = command(BIN, &words(line));
    cmd.envs(env.iter().copied());
    finish(spawn(cmd), LIMIT)
}

fn words(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

/// Checks one sweep's JSON: the sizes asked for, nccl-tests' algbw and busbw from each
/// time, and no wrong element.
fn check_sweep(j: &Value, op: &str, world: usize, sizes: &[u64], r: &Run) {
    assert_eq!(j["example"], "07-nccl-perf", "{r}");
    assert_eq!(j["op"], op, "{r}");
    assert_eq!(j["world_size"], world, "{r}");
    let rows = j["rows"].as_array().unwrap_or_else(|| panic!("no rows:\n{r}"));
    let got: Vec<u64> = rows.iter().map(|row| row["size"].as_u64().unwrap()).collect();
    assert_eq!(got, sizes, "{r}");
    let factor = if op == "all_reduce" {
        2.0 * (world as f64 - 1.0) / world as f64
    } else {
        1.0
    };
    let mut busbws = vec![];
    for row in rows {
        assert_eq!(row["count"].as_u64().unwrap() * 4, row["size"].as_u64().unwrap(), "{r}");
        assert_eq!(row["type"], "float");
        assert_eq!(row["root"], if op == "all_reduce" { -1 } else { 0 });
        for place in ["out_of_place", "in_place"] {
            let p = &row[place];
            let (t, algbw, busbw) = (
                p["time_us"].as_f64().unwrap(),
                p["algbw"].as_f64().unwrap(),
                p["busbw"].as_f64().unwrap(),
            );
            assert!(t > 0.0, "{r}");
            let want = row["size"].as_f64().unwrap() / 1e9 / (t / 1e6);
            assert!(
                (algbw - want).abs() <= 1e-9 * want.max(1.0),
                "algbw {algbw} != size/time {want}"
            );
            assert!(
                (busbw - algbw * factor).abs() <= 1e-9 * busbw.max(1.0),
                "busbw {busbw} != {algbw} × {factor}"
            );
            assert_eq!(p["wrong"], 0, "{place} at {}:\n{r}", row["size"]);
            busbws.push(busbw);
        }
    }
    let avg = busbws.iter().sum::<f64>() / busbws.len() as f64;
    assert!((j["avg_busbw"].as_f64().unwrap() - avg).abs() < 1e-9, "{r}");
    assert_eq!(j["wrong"], 0, "{r}");
    assert!(j["memcpy_gbps"].as_f64().unwrap() > 0.0, "{r}");
}

#[test]
fn sweeps_are_right_on_shared_memory_and_tcp() {
    // Sizes that are not multiples of the world, of the ring's chunks or of the shared
    // ring's slots: 4 B to 4 MiB + 4 B, three ranks.
    for transport in ["shm", "tcp"] {
        for op in ["all-reduce", "broadcast"] {
            let r = perf(
                &format!(
                    "--nproc-per-node 3 --op {op} -b 4 -e 8M -f 37 -w 1 -n 2 -c 2 --transport {transport} --format json"
                ),
                &[],
            )
            .ok();
            let j = r.json();
            check_sweep(&j, &op.replace('-', "_"), 3, &[4, 148, 5476, 202612, 7496644], &r);
            let via: Vec<&str> = j["transports"]
                .as_object()
                .unwrap()
                .values()
                .map(|v| v.as_str().unwrap())
                .collect();
            assert_eq!(via, vec![transport; 3], "{r}");
        }
    }
}

#[test]
fn every_world_from_2_to_5_is_right_on_shared_memory() {
    // Two ranks run the ring step by step; three and more run it piece by piece
    // (partial sums reduced straight into the next message): both must be exact, for
    // sizes that span several pieces and end off their edges.
    for world in 2..=5 {
        let r = perf(
            &format!("--nproc-per-node {world} --op all-reduce -b 4 -e 8M -f 37 -w 0 -n 1 --format json"),
            &[],
        )
        .ok();
        check_sweep(&r.json(), "all_reduce", world, &[4, 148, 5476, 202612, 7496644], &r);
    }
}

#[test]
fn a_corrupted_element_is_counted_and_fails_the_run() {
    // Rank 1 doubles its element 3 before the check: one wrong element per checked run.
    let r = perf(
        "-b 1K -e 4K -f 4 -w 0 -n 1 --format json",
        &[("NCCL_WORKBOOK_FAULT", "corrupt:1:3")],
    );
    assert_eq!(r.code, Some(1), "{r}");
    let j = r.json();
    for row in j["rows"].as_array().unwrap() {
        assert_eq!(row["out_of_place"]["wrong"], 1, "{r}");
        assert_eq!(row["in_place"]["wrong"], 1, "{r}");
    }
    assert_eq!(j["wrong"], 4, "{r}");
    assert!(r.stderr.contains("4 wrong element(s)"), "{r}");

    let text = perf("-b 1K -e 1K -w 0 -n 1", &[("NCCL_WORKBOOK_FAULT", "corrupt:0:0")]);
    assert_eq!(text.code, Some(1), "{text}");
    assert!(text.stdout.contains("# Out of bounds values : 2 FAILED"), "{text}");
    let row = text
        .stdout
        .lines()
        .find(|l| l.trim_start().starts_with("1024"))
        .unwrap();
    assert_eq!(
        row.split_whitespace().filter(|w| *w == "1").count(),
        2,
        "#wrong is 1 in both placements: {row}"
    );
}

#[test]
fn the_table_has_nccl_tests_columns() {
    let r = perf("--op broadcast --root 1 -b 64 -e 256 -f 2 -n 3", &[]).ok();
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("out-of-place") && l.contains("in-place")),
        "{r}"
    );
    assert!(
        lines.iter().any(|l| l.split_whitespace().collect::<Vec<_>>()
            == [
                "#", "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw",
                "busbw", "#wrong"
            ]),
        "{r}"
    );
    let rows: Vec<Vec<&str>> = lines
        .iter()
        .filter(|l| !l.starts_with('#') && l.trim_start().starts_with(char::is_numeric))
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), 3, "{r}");
    for (row, size) in rows.iter().zip(["64", "128", "256"]) {
        assert_eq!(
            row[..5],
            [
                size,
                &(size.parse::<u32>().unwrap() / 4).to_string(),
                "float",
                "none",
                "1"
            ],
            "{r}"
        );
        assert_eq!((row[8], row[12]), ("0", "0"), "{r}");
    }
    assert!(lines.iter().any(|l| l.starts_with("# Avg bus bandwidth")), "{r}");
    assert!(lines.contains(&"# Out of bounds values : 0 OK"), "{r}");
}

#[test]
fn ranks_started_by_hand_agree() {
    let port = free_port().to_string();
    let ranks: Vec<_> = (0..2)
        .map(|rank| {
            let args = format!("--world-size 2 --rank {rank} --master-port {port} -b 4 -e 1M -f 16 -n 2 --format json");
            spawn(command(BIN, &words(&args)))
        })
        .collect();
    let runs: Vec<Run> = ranks.into_iter().map(|c| finish(c, LIMIT).ok()).collect();
    check_sweep(
        &runs[0].json(),
        "all_reduce",
        2,
        &[4, 64, 1024, 16384, 262144],
        &runs[0],
    );
    assert!(runs[1].stdout.is_empty(), "only rank 0 prints");
}

#[test]
fn bad_sweeps_are_refused_in_one_line() {
    for (args, says) in [
        ("-b 1M -e 4K", "-b 1M is larger than -e 4K"),
        ("-f 1", "stepfactor"),
        ("-f 2 -i 4K", "cannot be used with"),
        ("-d half", "half"),
        ("--op broadcast --root 5", "--root 5 is not a rank"),
    ] {
        let r = perf(args, &[]);
        assert_eq!(r.code, Some(2), "{args:?}:\n{r}");
        assert_eq!(r.stderr.lines().count(), 1, "{args:?}:\n{r}");
        assert!(r.stderr.contains(says), "{args:?} should say {says:?}:\n{r}");
    }
}

#[test]
fn on_the_nccl_double_with_double_precision() {
    let cmd = nccl_command(
        BIN,
        &words("--backend nccl --nproc-per-node 2 -d double -b 8 -e 1M -f 64 -n 2 --format json"),
        2,
    );
    let r = finish(spawn(cmd), LIMIT).ok();
    let j = r.json();
    assert_eq!(j["backend"], "nccl", "{r}");
    assert_eq!(j["type"], "double", "{r}");
    assert_eq!(j["rows"].as_array().unwrap().len(), 3, "{r}");
    assert_eq!(j["wrong"], 0, "{r}");
}

#[test]
fn buffers_larger_than_the_caches_are_right_too() {
    // From 16 MiB the results are written around the cache (non-temporal stores); an odd
    // size puts the slices' edges off the 16-byte boundaries those stores need.
    for (op, world) in [("all-reduce", 2), ("all-reduce", 3), ("broadcast", 3)] {
        let r = perf(
            &format!("--nproc-per-node {world} --op {op} -b 17825796 -e 17825796 -w 0 -n 1 --format json"),
            &[],
        )
        .ok();
        check_sweep(&r.json(), &op.replace('-', "_"), world, &[17825796], &r);
    }
}
