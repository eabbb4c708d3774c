//! Which algorithm runs, said where a student looks: the `Time:` line, the JSON report,
//! `NCCL_DEBUG=INFO`; and `NCCL_ALGO` read as NCCL reads it, refused in one line where
//! it names what the CPU backend does not have. Real multi-process jobs.

use testkit::{LIMIT, Run, command, finish, spawn};

const BIN: &str = env!("CARGO_BIN_EXE_harness-probe");

/// The probe (an all-reduce) on `ranks` ranks with `count` floats, with `env` set (a host of 8 cores,
/// so that the choice does not depend on this machine's).
fn all_reduce(ranks: usize, count: usize, json: bool, env: &[(&str, &str)]) -> Run {
    let (n, c) = (ranks.to_string(), count.to_string());
    let mut args = vec!["--nproc-per-node", &n, "--count", &c, "--iters", "2"];
    if json {
        args.extend(["--format", "json"]);
    }
    let mut cmd = command(BIN, &args);
    cmd.env("NCCL_WORKBOOK_CORES", "8").envs(env.iter().copied());
    finish(spawn(cmd), LIMIT)
}

#[test]
fn the_time_line_and_the_report_name_the_algorithm_for_a_small_and_a_large_buffer() {
    // 16 B: every rank's buffer straight to every rank; 4 MiB on one host: the single
    // copy; with NCCL_ALGO=Ring (or without the single copy), the ring piece by piece;
    // over TCP, step by step.
    for (count, env, algo) in [
        (4usize, &[][..], "direct"),
        (1 << 20, &[], "single-copy"),
        (1 << 20, &[("NCCL_ALGO", "Ring")], "ring-pipelined"),
        (1 << 20, &[("NCCL_ALGO", "allreduce:^single-copy")], "ring-pipelined"),
    ] {
        let r = all_reduce(3, count, true, env).ok();
        let j = r.json();
        assert_eq!(j["algo"], algo, "{count} floats, {env:?}: {r}");
        assert_eq!(j["check"]["ok"], true, "{r}");
        let r = all_reduce(3, count, false, env).ok();
        let time = r.stdout.lines().find(|l| l.starts_with("Time: ")).expect("a Time line");
        assert!(time.contains(&format!(" via {algo} (")), "{time}\n{r}");
    }
    let mut cmd = command(
        BIN,
        &[
            "--nproc-per-node",
            "3",
            "--count",
            "1048576",
            "--iters",
            "1",
            "--transport",
            "tcp",
            "--format",
            "json",
        ],
    );
    cmd.env("NCCL_WORKBOOK_CORES", "8");
    let r = finish(spawn(cmd), LIMIT).ok();
    assert_eq!(r.json()["algo"], "ring", "{r}");
}

#[test]
fn nccl_debug_info_prints_each_choice_once_as_nccls_tuning_line() {
    let r = all_reduce(2, 256, false, &[("NCCL_DEBUG", "INFO")]).ok();
    let line = "cpu INFO AllReduce: 1024 Bytes -> Algo direct proto simple";
    assert_eq!(r.stdout.lines().filter(|l| *l == line).count(), 1, "{r}");
    let r = all_reduce(2, 256, false, &[]).ok();
    assert!(!r.stdout.contains("-> Algo"), "{r}");
}

#[test]
fn nccl_algo_naming_what_the_cpu_backend_lacks_is_refused_in_one_line() {
    for algo in ["NVLS", "ring,NVLS", "allreduce:CollNetDirect", "ring;tree", "rings"] {
        let r = all_reduce(2, 4, false, &[("NCCL_ALGO", algo)]);
        assert_eq!(r.code, Some(2), "NCCL_ALGO={algo}: {r}");
        let errors: Vec<&str> = r.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(errors.len(), 1, "NCCL_ALGO={algo}: one line: {r}");
        assert!(errors[0].contains(&format!("NCCL_ALGO={algo}: ")), "{r}");
        assert!(!r.stderr.contains("panicked"), "{r}");
    }
    let r = all_reduce(2, 4, false, &[("NCCL_ALGO", "NVLS")]);
    assert!(
        r.stderr.contains(
            "the CPU backend has no NVLS: it has ring and tree (NCCL's Ring and Tree), direct and single-copy"
        ),
        "{r}"
    );
    // Excluding what it lacks is no error.
    let r = all_reduce(2, 4, true, &[("NCCL_ALGO", "^nvls")]).ok();
    assert_eq!(r.json()["algo"], "direct", "{r}");
}

#[test]
fn on_eight_nodes_a_medium_all_reduce_goes_by_the_tree_and_on_four_round_the_ring() {
    // 64 KiB: past a direct message. Emulated nodes (a host name each, TCP between them).
    for (nodes, algo) in [(8, "tree"), (4, "ring")] {
        let runs = testkit::nodes(nodes, |node, args| {
            let mut cmd = command(
                BIN,
                &[
                    &[
                        "--backend",
                        "cpu",
                        "--nproc-per-node",
                        "1",
                        "--count",
                        "16384",
                        "--iters",
                        "1",
                    ][..],
                    args,
                ]
                .concat(),
            );
            cmd.env("SLURMD_NODENAME", format!("node-{node}"));
            cmd
        });
        for r in &runs {
            assert_eq!(r.code, Some(0), "{nodes} nodes: {r}");
        }
        let j = runs[0].json();
        assert_eq!(j["algo"], algo, "{nodes} nodes: {}", runs[0]);
        assert_eq!(j["check"]["ok"], true, "{}", runs[0]);
    }
}
