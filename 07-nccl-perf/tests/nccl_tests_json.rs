//! `-J FILE`: the result in nccl-tests' own JSON (format version 3, `src/util.cu`), so
//! that nccl-tests' scripts read it. Checked here: every name and nesting nccl-tests
//! writes, figures equal to the table's (`--format json` of the same run), one result
//! per size and sweep, and a file that cannot be written refused before any rank starts.

use std::path::PathBuf;
use testkit::run;

const BIN: &str = env!("CARGO_BIN_EXE_07-nccl-perf");

fn file(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    dir.join(format!("{name}-{}.json", std::process::id()))
}

/// The leaves of a file nccl-tests 2.19.6 wrote, as `path type`.
const NCCL_TESTS: &str = include_str!("data/nccl-tests-2.19.6-paths.txt");

/// The leaves of `v` as `path type` (`config.devices.[].pid number`): array indices as
/// `[]`, as the fixture writes them. An empty array counts as a leaf of its elements'
/// path with type `string` when it is `args` or `env` (lists of strings).
fn leaves(v: &serde_json::Value) -> Vec<String> {
    fn walk(v: &serde_json::Value, path: &str, out: &mut Vec<String>) {
        let join = |k: &str| {
            if path.is_empty() {
                k.to_string()
            } else {
                format!("{path}.{k}")
            }
        };
        match v {
            serde_json::Value::Object(m) => m.iter().for_each(|(k, x)| walk(x, &join(k), out)),
            serde_json::Value::Array(a) => a.iter().for_each(|x| walk(x, &join("[]"), out)),
            serde_json::Value::String(_) => out.push(format!("{path} string")),
            serde_json::Value::Number(_) => out.push(format!("{path} number")),
            serde_json::Value::Bool(_) => out.push(format!("{path} boolean")),
            serde_json::Value::Null => out.push(format!("{path} null")),
        }
    }
    let mut out = vec![];
    walk(v, "", &mut out);
    out.sort();
    out.dedup();
    out
}

/// The keys of a JSON object, sorted.
fn keys(v: &serde_json::Value) -> Vec<&str> {
    let mut k: Vec<&str> = v.as_object().expect("an object").keys().map(String::as_str).collect();
    k.sort();
    k
}

#[test]
fn the_result_has_nccl_tests_names_and_the_tables_figures() {
    same_as_nccl_tests(&["--nproc-per-node", "2"], "cpu");
}

#[test]
fn on_nccl_it_says_ncclgetversions_code() {
    same_as_nccl_tests(&["--simulate-gpus", "2"], "nccl");
}

/// A run on two ranks (`how`, of `backend`) with `-J` and `--format json`: every leaf of
/// nccl-tests' file, and the table's figures.
fn same_as_nccl_tests(how: &[&str], backend: &str) {
    let path = file(backend);
    let out = run(
        BIN,
        &[
            how[0],
            how[1],
            "-b",
            "8",
            "-e",
            "4K",
            "-f",
            "8",
            "-n",
            "3",
            "-w",
            "1",
            "--format",
            "json",
            "-J",
            path.to_str().unwrap(),
        ],
    )
    .ok();
    let table = out.json();
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let _ = std::fs::remove_file(&path);

    // Every leaf nccl-tests writes, with its type: from a real file (tests/data).
    let ours = leaves(&doc);
    // The CPU backend runs no NCCL: its version is null.
    let cpu = |l: &str| match (backend, l) {
        ("cpu", "nccl_version number") => "nccl_version null".to_string(),
        _ => l.to_string(),
    };
    let missing: Vec<String> = NCCL_TESTS
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(cpu)
        .filter(|l| !ours.contains(l))
        .collect();
    assert!(
        missing.is_empty(),
        "leaves nccl-tests writes and ours lacks (or types differ): {missing:?}\nours: {ours:?}"
    );
    assert_eq!(doc["version"], 3);
    assert_eq!(doc["backend"], backend);
    match backend {
        "cpu" => assert!(doc["nccl_version"].is_null(), "the CPU backend runs no NCCL"),
        _ => assert!(
            doc["nccl_version"].as_u64().is_some_and(|v| v > 21800),
            "{}",
            doc["nccl_version"]
        ),
    }
    assert_eq!(doc["config"]["minimum_bytes"], 8);
    assert_eq!(doc["config"]["step_factor"], 8);
    assert_eq!(doc["config"]["iterations"], 3);
    let devices = doc["config"]["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 2);
    for (r, d) in devices.iter().enumerate() {
        assert_eq!(
            keys(d),
            [
                "device",
                "device_hex",
                "device_info",
                "group",
                "hostname",
                "pid",
                "rank"
            ]
        );
        assert_eq!(d["rank"], r);
        assert_eq!(d["pid"], table["ranks"][r]["pid"]);
    }

    // One result per size (8, 64, 512, 4096), each with the table's figures.
    let results = doc["results"].as_array().unwrap();
    let rows = table["rows"].as_array().unwrap();
    assert_eq!(results.len(), 4);
    assert_eq!(results.len(), rows.len());
    for (res, row) in results.iter().zip(rows) {
        for key in ["size", "count", "type", "redop", "actual_iterations", "experiment_name"] {
            assert!(res.get(key).is_some(), "no {key} in {res}");
        }
        assert_eq!(res["size"], row["size"]);
        assert_eq!(res["count"], row["count"]);
        assert_eq!(res["root"], "    -1", "nccl-tests writes the root as \"%6i\"");
        assert_eq!(res["actual_iterations"], 3);
        for place in ["out_of_place", "in_place"] {
            let (ours, theirs) = (&res[place], &row[place]);
            assert_eq!(keys(ours), ["alg_bw", "bus_bw", "nwrong", "time"]);
            assert_eq!(ours["time"], theirs["time_us"]);
            assert_eq!(ours["alg_bw"], theirs["algbw"]);
            assert_eq!(ours["bus_bw"], theirs["busbw"]);
            assert_eq!(ours["nwrong"], 0);
        }
    }
    assert_eq!(doc["out_of_bounds"]["okay"], "true", "nccl-tests' booleans are strings");
    assert_eq!(doc["config"]["parallel_init"], "false");
    assert_eq!(doc["errors"], serde_json::json!([""]));
    assert_eq!(doc["average_bus_bandwidth"]["bandwidth"], table["avg_busbw"]);
    assert!(
        doc["args"].as_array().unwrap().iter().any(|a| a == "-J"),
        "args are the command line's: {}",
        doc["args"]
    );
}

#[test]
fn every_sweep_is_named_in_one_file() {
    let path = file("sweeps");
    run(
        BIN,
        &[
            "--nproc-per-node",
            "2",
            "-b",
            "64",
            "-e",
            "64",
            "-n",
            "1",
            "-w",
            "0",
            "--coll",
            "broadcast",
            "-d",
            "all",
            "-J",
            path.to_str().unwrap(),
        ],
    )
    .ok();
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let _ = std::fs::remove_file(&path);
    let names: Vec<&str> = doc["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["experiment_name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "broadcast float none",
            "broadcast double none",
            "broadcast int32 none",
            "broadcast half none",
            "broadcast bfloat16 none"
        ]
    );
    assert!(doc["results"].as_array().unwrap().iter().all(|r| r["root"] == "     0"));
}

#[test]
fn a_result_that_cannot_be_written_is_refused_before_any_rank_starts() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    for (path, why) in [
        (dir.to_str().unwrap().to_string(), "is a folder: a result is a file"),
        (
            "/no/such/folder/r.json".to_string(),
            "there is no folder /no/such/folder",
        ),
    ] {
        let out = run(BIN, &["--nproc-per-node", "2", "-J", &path]);
        assert_eq!(out.code, Some(2), "{out}");
        assert_eq!(out.stderr.trim().lines().count(), 1, "{out}");
        assert!(out.stderr.contains(why), "no '{why}' in:\n{out}");
        assert!(out.stdout.is_empty(), "a rank started:\n{out}");
    }
}
