//! `-A ALGO,...` (every sweep once per algorithm, as `NCCL_ALGO` set to each would run
//! it) and `--fit` (time ≈ α + size/β under each sweep, and where two algorithms' fits
//! cross). Real multi-process jobs.

use testkit::{LIMIT, Run, command, finish, spawn};

const BIN: &str = env!("CARGO_BIN_EXE_07-nccl-perf");

/// The benchmark, with no core's cache said to split a sweep's fit (this machine's L2
/// would, where a rank's buffers outgrow it: the tests below that want it say so).
fn perf(args: &[&str]) -> Run {
    perf_with(args, &[("NCCL_WORKBOOK_L2", "0")])
}

fn perf_with(args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut cmd = command(BIN, args);
    cmd.envs(env.iter().copied());
    finish(spawn(cmd), LIMIT)
}

#[test]
fn each_algorithm_sweeps_in_turn_fitted_and_checked() {
    let args = [
        "--backend",
        "cpu",
        "--nproc-per-node",
        "3",
        "-b",
        "64K",
        "-e",
        "1M",
        "-f",
        "4",
        "-n",
        "3",
        "-w",
        "1",
    ];
    let r = perf(&[&args[..], &["-A", "ring,tree", "--fit", "--format", "json"]].concat()).ok();
    let j = r.json();
    let sweeps = j["sweeps"].as_array().unwrap_or_else(|| panic!("two sweeps:\n{r}"));
    assert_eq!(sweeps.len(), 2, "{r}");
    for (sweep, asked, ran) in [(&sweeps[0], "ring", "ring-pipelined"), (&sweeps[1], "tree", "tree")] {
        assert_eq!(sweep["nccl_algo"], asked, "{r}");
        assert_eq!(sweep["wrong"], 0, "{r}");
        for row in sweep["rows"].as_array().unwrap() {
            assert_eq!(row["out_of_place"]["algo"], ran, "{asked}: {r}");
        }
        let fit = &sweep["fit"];
        assert!(fit["alpha_us"].as_f64().unwrap() >= 0.0, "{r}");
        assert!(fit["beta_gbps"].as_f64().unwrap() > 0.0, "{r}");
    }
    let text = perf(&[&args[..], &["-A", "ring,tree", "--fit"]].concat()).ok();
    assert!(
        text.stdout
            .contains("# -A tree: every sweep below as NCCL_ALGO=tree would run it"),
        "{text}"
    );
    assert_eq!(
        text.stdout.matches("# fit (out of place): time ≈ ").count(),
        2,
        "{text}"
    );
    assert!(
        text.stdout
            .contains("# fit: all_reduce float, ring against tree: they "),
        "{text}"
    );
}

#[test]
fn an_algorithm_or_protocol_the_backend_lacks_is_refused_in_one_line_before_any_sweep() {
    for (args, says) in [
        (
            &["--backend", "cpu", "--nproc-per-node", "2", "-A", "ring,bogus"][..],
            "-A bogus: unknown algorithm 'bogus'",
        ),
        (
            &["--simulate-gpus", "2", "-A", "ring,bogus"][..],
            "-A bogus: NCCL_ALGO=bogus: NCCL 2.18.3 has no algorithm 'bogus'",
        ),
        (
            &["--simulate-gpus", "2", "-P", "fast"][..],
            "-P fast: NCCL_PROTO=fast: NCCL 2.18.3 has no protocol 'fast'",
        ),
        // Both given: the error names the flag whose value NCCL does not know.
        (
            &["--simulate-gpus", "2", "-A", "ring", "-P", "fast"][..],
            "-P fast: NCCL_PROTO=fast: NCCL 2.18.3 has no protocol 'fast'",
        ),
    ] {
        let r = perf(&[args, &["-b", "4K", "-e", "4K"]].concat());
        assert_eq!(r.code, Some(2), "{r}");
        let lines: Vec<&str> = r.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "{r}");
        assert!(lines[0].contains(says), "{r}");
    }
}

#[test]
fn a_sweep_the_tuner_ran_with_several_algorithms_gets_a_fit_per_algorithm() {
    // 8 B to 8 MiB by 16 on 2 ranks: the tuner runs more than one algorithm over it. A
    // last-level cache said to be 1 GiB keeps every size in it, and no core's cache is
    // said to split it (one fit per algorithm).
    let args = [
        "--backend",
        "cpu",
        "--nproc-per-node",
        "2",
        "-b",
        "8",
        "-e",
        "8M",
        "-f",
        "16",
        "-n",
        "3",
        "-w",
        "1",
        "--fit",
    ];
    let big = [("NCCL_WORKBOOK_LLC", "1G"), ("NCCL_WORKBOOK_L2", "0")];
    let r = perf_with(&[&args[..], &["--format", "json"]].concat(), &big).ok();
    let doc = r.json();
    let rows = doc["rows"].as_array().unwrap();
    let mut ran: Vec<&str> = vec![];
    for row in rows {
        let a = row["out_of_place"]["algo"].as_str().unwrap();
        if ran.last() != Some(&a) {
            ran.push(a);
        }
    }
    assert!(ran.len() >= 2, "one algorithm over the sweep: {ran:?}");
    assert!(doc["fit"].is_null(), "one line for several algorithms: {}", doc["fit"]);
    let fits = doc["fits"].as_array().expect("a fit per algorithm");
    let names: Vec<&str> = fits.iter().map(|f| f["algo"].as_str().unwrap()).collect();
    assert_eq!(names, ran, "the fits follow the rows' algorithms, in order");
    assert_eq!(fits[0]["from_bytes"], rows[0]["size"]);
    assert_eq!(fits[fits.len() - 1]["to_bytes"], rows[rows.len() - 1]["size"]);
    let text = perf_with(&args, &big).ok();
    assert!(
        text.stdout
            .contains("# fit (out of place), one per algorithm the tuner chose:"),
        "{text}"
    );
    assert!(text.stdout.contains(&format!("#   {} (", ran[0])), "{text}");
}

#[test]
fn sizes_whose_buffers_outgrow_the_cache_are_fitted_apart() {
    // A last-level cache said to be 2 MiB: each of 2 ranks gets 1 MiB of it, 3/4 of which
    // the send and receive buffers of 384 KiB and more reach (no core's cache said to split
    // the sizes below: the next test has one).
    let args = [
        "--backend",
        "cpu",
        "--nproc-per-node",
        "2",
        "-b",
        "64K",
        "-e",
        "4M",
        "-f",
        "4",
        "-n",
        "5",
        "-w",
        "1",
        "--fit",
    ];
    let llc = [("NCCL_WORKBOOK_LLC", "2M"), ("NCCL_WORKBOOK_L2", "0")];
    let r = perf_with(&[&args[..], &["--format", "json"]].concat(), &llc).ok();
    let doc = r.json();
    assert_eq!(doc["cache_share_bytes"], 1 << 20, "{r}");
    assert_eq!(doc["out_of_cache_from"], 1 << 20, "the first size from 384 KiB: {r}");
    // The runs of sizes a line each follows: one algorithm, one side of the cache.
    let mut runs: Vec<(String, bool)> = vec![];
    for row in doc["rows"].as_array().unwrap() {
        let run = (
            row["out_of_place"]["algo"].as_str().unwrap().to_string(),
            row["size"].as_u64().unwrap() < 1 << 20,
        );
        if runs.last() != Some(&run) {
            runs.push(run);
        }
        assert!(row["out_of_place"]["median_us"].as_f64().unwrap() > 0.0, "{r}");
    }
    assert!(
        doc["fit"].is_null(),
        "one line through the cache and memory: {}",
        doc["fit"]
    );
    let fits: Vec<(String, bool)> = doc["fits"]
        .as_array()
        .expect("a fit per side of the cache")
        .iter()
        .map(|f| {
            (
                f["algo"].as_str().unwrap().to_string(),
                f["cache"].as_str().unwrap() == "shared",
            )
        })
        .collect();
    assert_eq!(fits, runs, "{r}");
    for f in doc["fits"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| !f["alpha_us"].is_null())
    {
        assert_eq!(f["medians"], true, "fitted to the median calls: {r}");
    }
    let text = perf_with(&args, &llc).ok();
    assert!(
        text.stdout
            .contains("from 1.0 MiB a rank's buffers reach 3/4 of its 1.0 MiB share of the last-level cache"),
        "{text}"
    );
    assert!(text.stdout.contains(", from memory (1.0 MiB to 4.0 MiB): "), "{text}");
    if runs[runs.len() - 2].0 == runs[runs.len() - 1].0 {
        assert!(
            text.stdout
                .contains("#   out of the cache between 256.0 KiB and 1.0 MiB: β "),
            "{text}"
        );
    }
}

#[test]
fn sizes_whose_buffers_fit_a_cores_cache_are_fitted_apart_too() {
    // A last-level cache said to be 4 MiB (2 MiB a rank) and a core's cache said to be
    // 128 KiB: 64 KiB's buffers (128 KiB) fit in the core's, 256 KiB's outgrow it, and
    // 1 MiB's and 4 MiB's reach 3/4 of the last-level share: three sides, a line each.
    let args = "--backend cpu --nproc-per-node 2 -b 64K -e 4M -f 4 -n 5 -w 1 --fit";
    let args: Vec<&str> = args.split_whitespace().collect();
    let env = [("NCCL_WORKBOOK_LLC", "4M"), ("NCCL_WORKBOOK_L2", "128K")];
    // Over TCP the data crosses a network, not the caches: no core's cache splits it.
    let tcp = perf_with(&[&args[..], &["--transport", "tcp", "--format", "json"]].concat(), &env).ok();
    assert!(tcp.json()["out_of_core_cache_from"].is_null(), "{tcp}");
    let r = perf_with(&[&args[..], &["--format", "json"]].concat(), &env).ok();
    let doc = r.json();
    assert_eq!(doc["core_cache_share_bytes"], 128 << 10, "{r}");
    assert_eq!(doc["out_of_core_cache_from"], 256 << 10, "{r}");
    assert_eq!(doc["out_of_cache_from"], 1 << 20, "{r}");
    let rows = doc["rows"].as_array().unwrap();
    if rows
        .iter()
        .any(|row| row["out_of_place"]["algo"] != rows[0]["out_of_place"]["algo"])
    {
        return; // the tuner's thresholds moved: the sides are checked where one algorithm runs
    }
    let sides: Vec<(&str, u64, u64)> = doc["fits"]
        .as_array()
        .expect("a fit per side of the cache")
        .iter()
        .map(|f| {
            let (from, to) = (f["from_bytes"].as_u64().unwrap(), f["to_bytes"].as_u64().unwrap());
            (f["cache"].as_str().unwrap(), from, to)
        })
        .collect();
    assert_eq!(
        sides,
        [
            ("core", 64 << 10, 64 << 10),
            ("shared", 256 << 10, 256 << 10),
            ("memory", 1 << 20, 4 << 20)
        ],
        "{r}"
    );
    let text = perf_with(&args, &env).ok();
    for line in [
        "from 256.0 KiB a rank's buffers outgrow its 128.0 KiB share of its core's own cache, from 1.0 MiB they \
         reach 3/4 of its 2.0 MiB share of the last-level cache",
        ", in the core's cache (64.0 KiB): no fit",
        ", in the shared cache (256.0 KiB): no fit",
        ", from memory (1.0 MiB to 4.0 MiB): time ≈ ",
    ] {
        assert!(text.stdout.contains(line), "{line}\n{text}");
    }
}

#[test]
fn on_nccl_each_value_gets_a_communicator_nccl_started_under_it() {
    // NCCL reads NCCL_ALGO and NCCL_PROTO when a communicator starts: each sweep runs on
    // one split from the last after the variable changed, and NCCL's own choice (its
    // TUNING lines, on the test double playing NCCL 2.28.3) follows the sweep's value.
    let out = std::env::temp_dir().join(format!("nccl-workbook-algos-{}.json", std::process::id()));
    let args =
        "--simulate-gpus 4 --nproc-per-node 4 -b 8 -e 64K -f 64 -n 2 -w 1 -A ring,tree -P ll,simple --format json";
    let mut args: Vec<&str> = args.split_whitespace().collect();
    args.extend(["-J", out.to_str().unwrap()]);
    let r = perf_with(&args, &[("NCCL_DOUBLE_VERSION", "22803")]).ok();
    let j = r.json();
    let sweeps = j["sweeps"].as_array().unwrap_or_else(|| panic!("four sweeps:\n{r}"));
    let asked: Vec<(&str, &str)> = sweeps
        .iter()
        .map(|s| (s["nccl_algo"].as_str().unwrap(), s["nccl_proto"].as_str().unwrap()))
        .collect();
    assert_eq!(
        asked,
        [("ring", "ll"), ("ring", "simple"), ("tree", "ll"), ("tree", "simple")],
        "{r}"
    );
    for (sweep, (algo, proto)) in sweeps.iter().zip(asked) {
        assert_eq!(sweep["wrong"], 0, "{r}");
        for row in sweep["rows"].as_array().unwrap() {
            for place in ["out_of_place", "in_place"] {
                assert_eq!(row[place]["algo"], algo, "{algo} {proto} {place}: {r}");
                assert_eq!(row[place]["proto"], proto, "{algo} {proto} {place}: {r}");
            }
        }
    }
    // The user set neither variable: nccl-tests' JSON lists the user's environment.
    let doc = std::fs::read_to_string(&out).unwrap();
    let _ = std::fs::remove_file(&out);
    let doc: serde_json::Value = serde_json::from_str(&doc).unwrap();
    let env = doc["env"].as_array().unwrap_or_else(|| panic!("no env: {doc}"));
    assert!(
        env.iter()
            .all(|e| !e.as_str().unwrap().starts_with("NCCL_ALGO=") && !e.as_str().unwrap().starts_with("NCCL_PROTO=")),
        "{env:?}"
    );
    assert!(doc["results"].as_array().is_some_and(|r| !r.is_empty()), "{doc}");
    let text = perf_with(
        &["--simulate-gpus", "2", "-b", "8", "-e", "8", "-A", "tree"],
        &[("NCCL_DOUBLE_VERSION", "22803")],
    )
    .ok();
    assert!(
        text.stdout
            .contains("# -A tree: every sweep below on a communicator NCCL started under NCCL_ALGO=tree"),
        "{text}"
    );
}
