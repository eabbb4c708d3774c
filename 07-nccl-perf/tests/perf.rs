//! The benchmark as real multi-process jobs: its figures follow nccl-tests' formulas,
//! every element is checked (#wrong is 0, and a corrupted element is counted and fails
//! the run), on both transports, under the launcher and with ranks started by hand, and
//! on the NCCL test double. The long sweeps (every world, operator and type; buffers past
//! the caches) are `#[ignore]`d in `cargo test`: `.ci/run` runs them (`-- --ignored`).

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

/// nccl-tests' bus-bandwidth factor of a collective on `n` ranks.
fn factor(op: &str, n: usize) -> f64 {
    let n = n as f64;
    match op {
        "all_reduce" => 2.0 * (n - 1.0) / n,
        "all_gather" | "reduce_scatter" | "alltoall" => (n - 1.0) / n,
        _ => 1.0,
    }
}

/// The sizes a sweep of `asked` bytes measures for `op` on `n` ranks: whole elements,
/// and for all-gather, reduce-scatter and all-to-all a multiple of `n` of them.
fn sizes_of(op: &str, n: usize, elem: u64, asked: &[u64]) -> Vec<u64> {
    let per = match op {
        "all_gather" | "reduce_scatter" | "alltoall" => n as u64,
        _ => 1,
    };
    asked.iter().map(|b| (b / elem / per).max(1) * per * elem).collect()
}

/// Bytes per element of nccl-tests' type names.
fn elem(datatype: &str) -> u64 {
    match datatype {
        "double" => 8,
        "half" | "bfloat16" => 2,
        _ => 4,
    }
}

/// Checks one sweep's JSON: the sizes asked for, nccl-tests' algbw and busbw from each
/// time, the columns, and no wrong element.
fn check_sweep(j: &Value, op: &str, world: usize, asked: &[u64], r: &Run) {
    assert_eq!(j["op"], op, "{r}");
    let datatype = j["type"].as_str().unwrap();
    let rows = j["rows"].as_array().unwrap_or_else(|| panic!("no rows:\n{r}"));
    let got: Vec<u64> = rows.iter().map(|row| row["size"].as_u64().unwrap()).collect();
    assert_eq!(got, sizes_of(op, world, elem(datatype), asked), "{op} {datatype}:\n{r}");
    let reduces = ["reduce", "all_reduce", "reduce_scatter"].contains(&op);
    let mut busbws = vec![];
    for row in rows {
        let what = format!("{op} {datatype} {} at {}", row["redop"], row["size"]);
        assert_eq!(
            row["count"].as_u64().unwrap() * elem(datatype),
            row["size"].as_u64().unwrap(),
            "{r}"
        );
        assert_eq!(row["type"], datatype);
        assert_eq!(row["redop"] == "none", !reduces, "{what}");
        assert_eq!(row["redop"], j["redop"], "{what}");
        let rooted = op == "broadcast" || op == "reduce";
        assert_eq!(row["root"].as_i64().unwrap() >= 0, rooted, "{what}");
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
            let f = factor(op, world);
            assert!(
                (busbw - algbw * f).abs() <= 1e-9 * busbw.max(1.0),
                "busbw {busbw} != {algbw} × {f}"
            );
            assert_eq!(p["wrong"], 0, "{place} of {what}:\n{r}");
            busbws.push(busbw);
        }
    }
    let avg = busbws.iter().sum::<f64>() / busbws.len() as f64;
    assert!((j["avg_busbw"].as_f64().unwrap() - avg).abs() < 1e-9, "{r}");
    assert_eq!(j["wrong"], 0, "{r}");
    assert!(j["memcpy_gbps"].as_f64().unwrap() > 0.0, "{r}");
}

/// Checks a run of every collective, operator and type (`--coll all -o all -d all`).
fn check_every_sweep(r: &Run, world: usize, asked: &[u64]) {
    let j = r.json();
    assert_eq!(j["world_size"], world, "{r}");
    let sweeps = j["sweeps"].as_array().unwrap_or_else(|| panic!("no sweeps:\n{r}"));
    // 6 collectives, 5 types; the 3 reductions with 5 operators each: (3 + 3 × 5) × 5.
    assert_eq!(sweeps.len(), 90, "{r}");
    for sweep in sweeps {
        check_sweep(sweep, sweep["op"].as_str().unwrap(), world, asked, r);
    }
    let seen = |key: &str| {
        let mut v: Vec<&str> = sweeps.iter().map(|s| s[key].as_str().unwrap()).collect();
        v.sort();
        v.dedup();
        v
    };
    assert_eq!(
        seen("op"),
        [
            "all_gather",
            "all_reduce",
            "alltoall",
            "broadcast",
            "reduce",
            "reduce_scatter"
        ],
        "{r}"
    );
    assert_eq!(seen("type"), ["bfloat16", "double", "float", "half", "int32"], "{r}");
    assert_eq!(seen("redop"), ["avg", "max", "min", "none", "prod", "sum"], "{r}");
}

#[test]
#[ignore = "long sweep: run by .ci/run"]
fn every_collective_operator_and_type_is_exact_on_every_world_from_1_to_5() {
    // Counts of 1 element, smaller than the world, odd, and spanning many pieces; out of
    // place and in place; NCCL's in-place layouts; every operator and type.
    let asked = [4, 116, 3364, 97556];
    for world in 1..=5 {
        let r = perf(
            &format!("--nproc-per-node {world} --coll all -o all -d all -b 4 -e 100K -f 29 -w 0 -n 1 --format json"),
            &[],
        )
        .ok();
        check_every_sweep(&r, world, &asked);
    }
}

#[test]
fn every_collective_operator_and_type_is_exact_on_the_nccl_double() {
    // The same through cudarc and the test double's ncclReduce, ncclAllGather,
    // ncclReduceScatter and grouped ncclSend/ncclRecv (the in-place all-to-all copies
    // its blocks aside first: NCCL has no in-place all-to-all).
    for world in [1, 2, 3, 5] {
        let cmd = nccl_command(
            BIN,
            &words(&format!(
                "--backend nccl --nproc-per-node {world} --coll all -o all -d all -b 4 -e 4K -f 29 -w 0 -n 1 --format json"
            )),
            world,
        );
        let r = finish(spawn(cmd), LIMIT).ok();
        assert_eq!(r.json()["backend"], "nccl", "{r}");
        check_every_sweep(&r, world, &[4, 116, 3364]);
    }
}

#[test]
fn ranks_started_with_different_commands_are_refused_naming_both() {
    // Two ranks started by hand that disagree on the collective (another job on the same
    // port, or a typo): refused at the rendezvous, before any data moves.
    let port = free_port().to_string();
    let ranks: Vec<_> = ["all_gather", "reduce_scatter"]
        .iter()
        .enumerate()
        .map(|(rank, op)| {
            let args =
                format!("--world-size 2 --rank {rank} --master-port {port} --coll {op} -b 1K -e 1K -n 1 --timeout 20");
            spawn(command(BIN, &words(&args)))
        })
        .collect();
    let runs: Vec<Run> = ranks.into_iter().map(|c| finish(c, LIMIT)).collect();
    for r in &runs {
        assert_eq!(r.code, Some(2), "{r}");
        assert!(
            r.stderr.contains("rank 0 runs `07-nccl-perf --coll all_gather -b 1K -e 1K -n 1` but rank 1 runs \
                               `07-nccl-perf --coll reduce_scatter -b 1K -e 1K -n 1`: every rank of a job runs the same command"),
            "{r}"
        );
    }
}

#[test]
fn sweeps_are_right_on_shared_memory_and_tcp() {
    // Sizes that are not multiples of the world, of the ring's chunks or of the shared
    // ring's slots: 4 B to 4 MiB + 4 B, three ranks, every collective.
    for transport in ["shm", "tcp"] {
        let r = perf(
            &format!("--nproc-per-node 3 --coll all -b 4 -e 8M -f 37 -w 0 -n 1 --transport {transport} --format json"),
            &[],
        )
        .ok();
        let j = r.json();
        let sweeps = j["sweeps"].as_array().unwrap();
        assert_eq!(sweeps.len(), 6, "{r}");
        for sweep in sweeps {
            let op = sweep["op"].as_str().unwrap();
            check_sweep(sweep, op, 3, &[4, 148, 5476, 202612, 7496644], &r);
        }
        let via: Vec<&str> = j["transports"]
            .as_object()
            .unwrap()
            .values()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert_eq!(via, vec![transport; 3], "{r}");
    }
}

#[test]
#[ignore = "long sweep: run by .ci/run"]
fn every_world_from_2_to_5_is_right_on_shared_memory() {
    // On one host a large all-reduce, broadcast, reduce, all-gather, reduce-scatter or
    // all-to-all reads the other ranks' buffers where they lie (single copy); with
    // NCCL_P2P_DISABLE=1 it goes through the shared slots (the all-reduce round the ring
    // piece by piece, partial sums reduced straight into the next message), and so it
    // does when the buffers lie outside the shared arenas (the test hook; the reduce's
    // others then send their buffers to its root). All must be exact, for sizes that span
    // several pieces and end off their edges.
    for world in 2..=5 {
        let heap = ("NCCL_WORKBOOK_FAULT", "heap-buffers");
        for p2p in [[].as_slice(), &[("NCCL_P2P_DISABLE", "1")], &[heap]] {
            for op in [
                "all_reduce",
                "broadcast",
                "reduce",
                "all_gather",
                "reduce_scatter",
                "alltoall",
            ] {
                let r = perf(
                    &format!("--nproc-per-node {world} --coll {op} -b 4 -e 8M -f 37 -w 0 -n 1 --format json"),
                    p2p,
                )
                .ok();
                check_sweep(&r.json(), op, world, &[4, 148, 5476, 202612, 7496644], &r);
            }
        }
    }
}

#[test]
fn either_side_of_the_small_message_switch_and_with_the_ring_forced_every_element_is_right() {
    // Up to 16 KiB an all-reduce or a broadcast goes direct, rank to rank; above, round
    // the ring; NCCL_ALGO=Ring keeps the ring at every size (^Tree excludes only the
    // tree, which the tuner never picks unasked). Every operator and world, both transports, in place and out of
    // place (the JSON's #wrong counts both).
    let asked = [16376, 16380, 16384, 16388, 16392];
    for world in 1..=4 {
        for (transport, algo) in [("shm", "^Tree"), ("tcp", "^Tree"), ("shm", "Ring")] {
            let r = perf(
                &format!(
                    "--nproc-per-node {world} --coll all -o all -b 16376 -e 16392 -i 4 -w 0 -n 1 \
                     --transport {transport} --format json"
                ),
                &[("NCCL_ALGO", algo)],
            )
            .ok();
            let j = r.json();
            let sweeps = j["sweeps"].as_array().unwrap();
            assert_eq!(sweeps.len(), 18, "{r}");
            for sweep in sweeps {
                check_sweep(sweep, sweep["op"].as_str().unwrap(), world, &asked, &r);
            }
        }
    }
}

#[test]
fn a_cache_size_that_means_nothing_is_refused_in_one_line() {
    for (var, said) in [
        (
            "NCCL_WORKBOOK_LLC",
            "error: rank 0: NCCL_WORKBOOK_LLC: 'lots' is not a size (try 4, 64K, 100M or 1G)",
        ),
        (
            "NCCL_WORKBOOK_L2",
            "error: rank 0: NCCL_WORKBOOK_L2 (a size, or 0 for none): 'lots' is not a size (try 4, 64K, 100M or 1G)",
        ),
    ] {
        let r = perf("--nproc-per-node 2 -b 4 -e 4 -n 1", &[(var, "lots")]);
        assert_eq!(r.code, Some(2), "{r}");
        let errors: Vec<&str> = r.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(errors, [said], "{r}");
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
    let r = perf("--coll broadcast --root 1 -b 64 -e 256 -f 2 -n 3", &[]).ok();
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
                "busbw", "#wrong", "algo", "proto"
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
        // 2 ranks: the chain is direct already.
        assert_eq!(row[13], "chain", "{r}");
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
        (
            "-d fp8",
            "unknown type 'fp8': one of float, double, int32, half, bfloat16, or all",
        ),
        ("--coll gather", "unknown collective 'gather'"),
        // --op named the collective before it named the operator, as nccl-tests' does.
        (
            "--op all_reduce",
            "'all_reduce' is a collective: --op is the reduction operator, as in nccl-tests; name the collective \
             with --coll all_reduce",
        ),
        ("--coll broadcast --root 5", "--root 5 is not a rank"),
        ("--coll all_gather --root 1", "all_gather has no root"),
        ("--coll alltoall -o max", "alltoall reduces nothing"),
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
#[ignore = "long sweep: run by .ci/run"]
fn buffers_larger_than_the_caches_are_right_too() {
    // When the ranks' buffers outgrow the last-level cache (said to be 16 MiB here, so
    // that any machine streams), the results are written around the cache (non-temporal
    // stores), read from the other ranks' buffers or through the shared slots
    // (NCCL_P2P_DISABLE=1); an odd size puts the slices' edges off the 16-byte boundaries
    // those stores need.
    for (op, world) in [
        ("all-reduce", 2),
        ("all-reduce", 3),
        ("broadcast", 3),
        ("all_gather", 3),
    ] {
        for p2p in ["0", "1"] {
            let r = perf(
                &format!("--nproc-per-node {world} --coll {op} -b 17825796 -e 17825796 -w 0 -n 1 --format json"),
                &[("NCCL_WORKBOOK_LLC", "16777216"), ("NCCL_P2P_DISABLE", p2p)],
            )
            .ok();
            check_sweep(&r.json(), &op.replace('-', "_"), world, &[17825796], &r);
        }
    }
}

#[test]
fn large_collectives_on_one_host_read_where_it_lies_and_the_trace_says_so() {
    // 1 MiB on 3 ranks: every collective (in place too: the benchmark runs both) reads
    // the others' buffers (the trace names each collective's algorithm), unless
    // NCCL_P2P_DISABLE=1.
    let dir = std::env::temp_dir().join(format!("nccl-workbook-perf-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for op in [
        "broadcast",
        "reduce",
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "alltoall",
    ] {
        for p2p in ["0", "1"] {
            let file = dir.join(format!("{op}-{p2p}.json"));
            let r = perf(
                &format!(
                    "--nproc-per-node 3 --coll {op} -b 1M -e 1M -w 0 -n 1 --format json --trace {}",
                    file.display()
                ),
                // The single copy wherever it can run (the tuner's sizes depend on the
                // cores: see every_row_names_the_algorithm_that_ran_as_the_tuner_chose_it).
                &[("NCCL_P2P_DISABLE", p2p), ("NCCL_ALGO", "single-copy")],
            )
            .ok();
            check_sweep(&r.json(), op, 3, &[1 << 20], &r);
            let doc: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
            let algorithms: Vec<&str> = doc["traceEvents"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|e| e["cat"] == "collective")
                .map(|e| e["args"]["algorithm"].as_str().unwrap_or(""))
                .collect();
            assert!(!algorithms.is_empty(), "{op}: no collective in the trace");
            let singles = algorithms.iter().filter(|a| a.starts_with("single-copy")).count();
            // In place too: the in-place all-to-all puts its blocks aside in the arena.
            let want = match p2p {
                "1" => 0,
                _ => algorithms.len(),
            };
            assert_eq!(singles, want, "{op}, NCCL_P2P_DISABLE={p2p}: {algorithms:?}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn every_row_names_the_algorithm_that_ran_as_the_tuner_chose_it() {
    // On a host with cores enough (8), 4 KiB all-reduce goes direct and 4 MiB by single
    // copy, in both placements; an in-place all-to-all too (its blocks put aside in the
    // arena, where the others read them); NCCL_ALGO=Ring
    // keeps the ring at every size.
    let cores = ("NCCL_WORKBOOK_CORES", "8");
    let algos = |r: &Run, op: &str| -> Vec<(String, String)> {
        let j = r.json();
        let rows = j["rows"].as_array().unwrap_or_else(|| panic!("{op}: no rows: {r}"));
        rows.iter()
            .map(|row| {
                let algo = |p: &str| {
                    row[p]["algo"]
                        .as_str()
                        .unwrap_or_else(|| panic!("no algo: {r}"))
                        .to_string()
                };
                (algo("out_of_place"), algo("in_place"))
            })
            .collect()
    };
    let pair = |a: &str, b: &str| (a.to_string(), b.to_string());
    let json = "-b 4K -e 4M -f 1024 -w 0 -n 1 --format json";
    let r = perf(&format!("--nproc-per-node 2 --coll all_reduce {json}"), &[cores]).ok();
    assert_eq!(
        algos(&r, "all_reduce"),
        [pair("direct", "direct"), pair("single-copy", "single-copy")],
        "{r}"
    );
    let r = perf(&format!("--nproc-per-node 3 --coll alltoall {json}"), &[cores]).ok();
    assert_eq!(algos(&r, "alltoall")[1], pair("single-copy", "single-copy"), "{r}");
    let r = perf(
        &format!("--nproc-per-node 3 --coll all_reduce {json}"),
        &[cores, ("NCCL_ALGO", "ring")],
    )
    .ok();
    assert_eq!(
        algos(&r, "all_reduce"),
        [
            pair("ring-pipelined", "ring-pipelined"),
            pair("ring-pipelined", "ring-pipelined")
        ],
        "{r}"
    );
    // For people: a last column, `algo proto`, one name where both placements ran the
    // same (both names where they differ: the unit test of `both`), then the protocol.
    let r = perf("--nproc-per-node 3 --coll alltoall -b 4M -e 4M -w 0 -n 1", &[cores]).ok();
    assert!(
        r.stdout
            .lines()
            .any(|l| l.starts_with("# ") && l.ends_with("#wrong  algo proto")),
        "{r}"
    );
    assert!(r.stdout.lines().any(|l| l.ends_with("  single-copy simple")), "{r}");
}
