//! On NCCL, the table's `algo proto` column and `--fit` say what NCCL itself chose and
//! how it models the cost: read from NCCL's own TUNING lines (`workbook_nccl::nccl_log`),
//! on the NCCL test double playing NCCL 2.28.3 (which prints them as NCCL does). Where
//! the user sets `NCCL_DEBUG`, the output is theirs and the column says "NCCL's choice".

use testkit::{Run, finish, nccl_command, spawn};

const BIN: &str = env!("CARGO_BIN_EXE_07-nccl-perf");

/// A sweep on 4 simulated GPUs playing NCCL 2.28.3, with `env` and `--fit`, as JSON.
fn sweep(env: &[(&str, &str)], extra: &[&str]) -> Run {
    let mut args = vec![
        "--nproc-per-node",
        "4",
        "-b",
        "8",
        "-e",
        "1M",
        "-f",
        "32",
        "-n",
        "2",
        "-w",
        "1",
        "--fit",
        "--format",
        "json",
    ];
    args.extend_from_slice(extra);
    let mut cmd = nccl_command(BIN, &args, 4);
    cmd.args(["--backend", "nccl"]).env("NCCL_DOUBLE_VERSION", "22803");
    for (k, v) in env {
        cmd.env(k, v);
    }
    finish(spawn(cmd), testkit::LIMIT).ok()
}

/// Each row's out-of-place (algorithm, protocol).
fn choices(r: &Run) -> Vec<(String, String)> {
    let j = r.json();
    let rows = j["rows"].as_array().unwrap_or_else(|| panic!("no rows:\n{r}"));
    rows.iter()
        .map(|row| {
            let p = &row["out_of_place"];
            (
                p["algo"].as_str().unwrap().to_string(),
                p["proto"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn the_column_names_what_nccl_chose_and_fit_shows_nccls_own_model() {
    let r = sweep(&[], &[]);
    let chose = choices(&r);
    assert!(
        chose
            .iter()
            .all(|(a, p)| ["ring", "tree"].contains(&a.as_str()) && !p.is_empty()),
        "every size names NCCL's algorithm and protocol: {chose:?}\n{r}"
    );
    let j = r.json();
    let costs = j["nccl_costs"]
        .as_array()
        .unwrap_or_else(|| panic!("no nccl_costs:\n{r}"));
    let ring_simple = costs
        .iter()
        .find(|c| c["algo"] == "ring" && c["proto"] == "simple")
        .unwrap_or_else(|| panic!("no ring simple cell in {costs:?}"));
    assert!(ring_simple["bandwidth_gbs"].as_f64().unwrap() > 0.0, "{ring_simple}");
    assert!(costs.iter().all(|c| c["function"] == "AllReduce"), "{costs:?}");
    // Forced, NCCL runs the tree at every size, and the column follows.
    let r = sweep(&[("NCCL_ALGO", "Tree")], &[]);
    assert!(choices(&r).iter().all(|(a, _)| a == "tree"), "{:?}\n{r}", choices(&r));
}

#[test]
fn the_fit_says_which_sizes_nccl_chose_each_for() {
    let mut cmd = nccl_command(
        BIN,
        &[
            "--nproc-per-node",
            "2",
            "-b",
            "8",
            "-e",
            "64K",
            "-f",
            "64",
            "-n",
            "2",
            "--fit",
        ],
        2,
    );
    cmd.args(["--backend", "nccl"]).env("NCCL_DOUBLE_VERSION", "22803");
    let r = finish(spawn(cmd), testkit::LIMIT).ok();
    assert!(
        r.stdout
            .contains("# NCCL's own model (its TUNING table, rank 0): time = latency + size / bandwidth"),
        "{r}"
    );
    assert!(r.stdout.contains("; NCCL chose it "), "{r}");
}

/// The variables a `-J` file lists in `env`.
fn env_listed(path: &std::path::Path) -> Vec<String> {
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    doc["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn the_users_nccl_debug_is_left_alone_and_not_taken_for_ours() {
    let path =
        std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("choices-{}.json", std::process::id()));
    // Ours: NCCL's lines are read, and the variables set to read them are not the user's.
    let r = sweep(&[], &["-J", path.to_str().unwrap()]);
    let env = env_listed(&path);
    assert!(!env.iter().any(|v| v.starts_with("NCCL_DEBUG")), "{env:?}\n{r}");
    // The user's: NCCL prints where they asked, the column says NCCL chose, the file lists it.
    let r = sweep(&[("NCCL_DEBUG", "WARN")], &["-J", path.to_str().unwrap()]);
    let env = env_listed(&path);
    let _ = std::fs::remove_file(&path);
    assert!(
        choices(&r).iter().all(|(a, p)| a == "NCCL's choice" && p.is_empty()),
        "{r}"
    );
    assert!(r.json().get("nccl_costs").is_none(), "{r}");
    assert!(env.iter().any(|v| v == "NCCL_DEBUG=WARN"), "{env:?}");
}

/// NCCL 2.20 to 2.23 print numbers, and count an all-gather's bytes over the whole buffer:
/// the column still names NCCL's choice.
#[test]
fn older_nccls_numbered_lines_name_the_choice_of_an_all_gather_too() {
    for version in ["22103", "22303"] {
        let mut cmd = nccl_command(
            BIN,
            &[
                "--nproc-per-node",
                "2",
                "--coll",
                "all_gather",
                "-b",
                "64",
                "-e",
                "4K",
                "-f",
                "64",
                "-n",
                "1",
                "-w",
                "1",
                "--format",
                "json",
            ],
            2,
        );
        cmd.args(["--backend", "nccl"]).env("NCCL_DOUBLE_VERSION", version);
        let r = finish(spawn(cmd), testkit::LIMIT).ok();
        let chose = choices(&r);
        assert!(
            !chose.is_empty() && chose.iter().all(|(a, p)| a == "ring" && !p.is_empty()),
            "NCCL {version}: {chose:?}\n{r}"
        );
    }
}
