//! What EXERCISES.md says "you will see", run and checked chapter by chapter, on the real
//! binaries as multi-process jobs (the examples, and the reference solutions standing in
//! for a student's finished code).
//!
//! This file: where ranks run. Each rank's device (chapter 1, and chapter 9's cyclic
//! placement), NCCL's refusal of two ranks on one GPU and the calls on simulated GPUs
//! (chapter 1), two launchers as two nodes (chapter 9), and split communicators, rows
//! inside a node and columns across (chapters 9 and 12). The collectives' chapters are in
//! chapters_collectives.rs; EXERCISES.md's text, in exercises_md.rs.

mod support;

use support::built;
use testkit::{LIMIT, Run, command, finish, nccl_command, run, spawn, stage};

/// One field of every rank in a JSON report, as text.
fn field(j: &serde_json::Value, key: &str) -> Vec<String> {
    let text = |v: &serde_json::Value| v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string());
    j["ranks"].as_array().unwrap().iter().map(|r| text(&r[key])).collect()
}
#[test]
fn chapter_1_device_is_rank_mod_device_count_with_one_row_per_process() {
    let hello = built("00-nccl-hello-world");
    for n in [1usize, 2, 4, 5] {
        let r = run(
            hello.to_str().unwrap(),
            &["--nproc-per-node", &n.to_string(), "--format", "json"],
        )
        .ok();
        let j = r.json();
        assert_eq!(
            field(&j, "rank"),
            (0..n).map(|r| r.to_string()).collect::<Vec<_>>(),
            "{r}"
        );
        assert_eq!(field(&j, "local_rank"), field(&j, "rank"), "{r}");
        // On the CPU backend a node has one device per rank of its own: all n here.
        assert_eq!(
            field(&j, "device"),
            (0..n).map(|r| format!("cpu:{r}")).collect::<Vec<_>>(),
            "{r}"
        );
        let pids: std::collections::HashSet<_> = field(&j, "pid").into_iter().collect();
        assert_eq!(pids.len(), n, "one process per rank: {r}");
    }
    // device_count is the node's, not the world's: two launchers of `per_node` ranks each
    // (two nodes on this host, ranks placed by blocks) give rank r device r % per_node,
    // where the world's size would give r.
    for per_node in [1usize, 3] {
        let p = per_node.to_string();
        let [a, b] =
            testkit::two_nodes(|_, args| command(hello.to_str().unwrap(), &[args, &["--nproc-per-node", &p]].concat()));
        let (a, b) = (a.ok(), b.ok());
        let j = a.json();
        assert_eq!(j["world_size"], 2 * per_node, "{a}\n{b}");
        assert_eq!(
            field(&j, "device"),
            (0..2 * per_node)
                .map(|r| format!("cpu:{}", r % per_node))
                .collect::<Vec<_>>(),
            "{a}\n{b}"
        );
    }
    // One rank is "1 rank", not "1 ranks".
    let r = run(hello.to_str().unwrap(), &["--nproc-per-node", "1"]).ok();
    assert!(r.stdout.lines().any(|l| l == "Hello from 1 rank:"), "{r}");
    let r = run(hello.to_str().unwrap(), &["--nproc-per-node", "5"]).ok();
    assert!(r.stdout.lines().any(|l| l == "Hello from 5 ranks:"), "{r}");
    assert!(
        r.stdout
            .lines()
            .any(|l| l.starts_with("| 4 ") && l.contains("| cpu:4 ")),
        "{r}"
    );
    assert!(
        r.stdout
            .contains("Each rank uses device = rank % device_count, with device_count = 5."),
        "{r}"
    );
}

#[test]
fn chapter_9_cyclic_placement_puts_two_ranks_of_a_node_on_one_device() {
    // The loop of EXERCISES.md 9: what srun --distribution=cyclic starts, by hand; then
    // the same job with --device-rule local-rank.
    let hello = built("00-nccl-hello-world");
    for (rule, devices) in [
        (None, ["cpu:0", "cpu:1", "cpu:0", "cpu:1"]),
        (Some("local-rank"), ["cpu:0", "cpu:0", "cpu:1", "cpu:1"]),
    ] {
        let job = format!("cyclic-{}-{}", std::process::id(), rule.unwrap_or("rank"));
        let ranks: Vec<_> = (0..4usize)
            .map(|r| {
                let mut args = vec!["--format", "json"];
                if let Some(rule) = rule {
                    args.extend(["--device-rule", rule]);
                }
                let mut cmd = command(hello.to_str().unwrap(), &args);
                cmd.env("SLURM_PROCID", r.to_string())
                    .env("SLURM_NTASKS", "4")
                    .env("SLURM_NODEID", (r % 2).to_string())
                    .env("SLURM_LOCALID", (r / 2).to_string())
                    .env("SLURM_TASKS_PER_NODE", "2(x2)")
                    .env("SLURM_JOB_NODELIST", "localhost")
                    .env("SLURM_JOB_ID", &job)
                    .env("SLURM_STEP_ID", "0")
                    .env("SLURMD_NODENAME", format!("node{}", r % 2));
                spawn(cmd)
            })
            .collect();
        let runs: Vec<Run> = ranks.into_iter().map(|c| finish(c, LIMIT).ok()).collect();
        let j = runs[0].json();
        assert_eq!(field(&j, "host"), ["node0", "node1", "node0", "node1"], "{}", runs[0]);
        assert_eq!(field(&j, "local_rank"), ["0", "0", "1", "1"], "{}", runs[0]);
        assert_eq!(field(&j, "device"), devices, "{rule:?}: {}", runs[0]);
    }
}

#[test]
fn chapter_1_nccl_refuses_more_ranks_than_gpus_before_calling_nccl() {
    let hello = built("00-nccl-hello-world");
    let cmd = nccl_command(
        hello.to_str().unwrap(),
        &["--backend", "nccl", "--nproc-per-node", "5"],
        4,
    );
    let r = finish(spawn(cmd), LIMIT);
    assert_eq!(r.code, Some(2), "{r}");
    assert!(
        r.stderr.contains("error: rank 0: ranks 0 and 4 are both on GPU GPU-")
            && r.stderr.contains(
                "NCCL refuses two ranks on one GPU (\"Duplicate GPU detected\"); start at most one rank per GPU"
            ),
        "{r}"
    );
    assert!(
        !r.stderr.contains("nccl-double WARN"),
        "NCCL must not have been called:\n{r}"
    );
}

#[test]
fn chapter_1_simulated_gpus_show_who_makes_the_unique_id_and_the_all_reduce_call() {
    let hello = built("00-nccl-hello-world");
    let r = run(
        hello.to_str().unwrap(),
        &["--simulate-gpus", "4", "--nproc-per-node", "5"],
    );
    assert_eq!(r.code, Some(2), "{r}");
    assert!(
        r.stderr.contains("error: rank 0: ranks 0 and 4 are both on GPU GPU-"),
        "{r}"
    );
    let allreduce = built("02-nccl-allreduce");
    let r = run(
        allreduce.to_str().unwrap(),
        &["--simulate-gpus", "2", "--show-calls", "--count", "4"],
    )
    .ok();
    let calls = |rank: usize, function: &str| {
        let prefix = format!("rank {rank} │ {function}(");
        r.stdout.lines().filter(|l| l.starts_with(&prefix)).count()
    };
    assert_eq!(
        (calls(0, "ncclGetUniqueId"), calls(1, "ncclGetUniqueId")),
        (1, 0),
        "{r}"
    );
    for rank in 0..2 {
        assert_eq!(calls(rank, "ncclCommInitRankConfig"), 1, "{r}");
        assert!(calls(rank, "cuMemcpyHtoDAsync_v2") >= 1, "{r}");
        let reduce = format!("rank {rank} │ ncclAllReduce(");
        let line = r
            .stdout
            .lines()
            .find(|l| l.starts_with(&reduce))
            .expect("an all-reduce");
        assert!(line.contains("count=4, datatype=ncclFloat32, op=ncclSum"), "{line}");
    }
    let cudarc = built("08-cudarc-allreduce");
    let r = run(cudarc.to_str().unwrap(), &["--simulate-gpus", "4"]).ok();
    assert!(r.stdout.contains("rank 3: sent 4, got [10.0, 10.0, 10.0, 10.0]"), "{r}");
}
#[test]
fn chapter_9_two_launchers_rehearse_two_nodes() {
    let hello = built("00-nccl-hello-world");
    let [a, b] =
        testkit::two_nodes(|_, args| command(hello.to_str().unwrap(), &[args, &["--nproc-per-node", "2"]].concat()));
    let (a, b) = (a.ok(), b.ok());
    assert!(b.stdout.is_empty(), "only rank 0, on node 0, prints: {b}");
    let j = a.json();
    assert_eq!(field(&j, "local_rank"), ["0", "1", "0", "1"], "{a}");
    assert_eq!(field(&j, "device"), ["cpu:0", "cpu:1", "cpu:0", "cpu:1"], "{a}");
    // Without a node name of their own, both "nodes" are this host: nothing crosses TCP.
    let host = field(&j, "host")[0].clone();
    assert_eq!(field(&j, "host"), vec![host; 4], "{a}");
    let pairs = j["transports"].as_object().expect("the transports");
    assert_eq!(pairs.len(), 6, "{a}");
    assert!(pairs.values().all(|t| t == "shm"), "every pair shares memory: {a}");
}

#[test]
fn chapter_9_with_a_node_name_each_the_rehearsal_crosses_tcp_between_nodes() {
    // Chapter 1's trick: SLURMD_NODENAME names the node a launcher (and its ranks) is on.
    let hello = built("00-nccl-hello-world");
    let hello = hello.to_str().unwrap();
    let with_names = |node: usize, args: &[&str]| {
        let mut cmd = command(hello, &[args, &["--nproc-per-node", "2"]].concat());
        cmd.env("SLURMD_NODENAME", format!("node{node}"))
            .env("NCCL_DEBUG", "INFO");
        cmd
    };
    let [a, b] = testkit::two_nodes(with_names);
    let (a, b) = (a.ok(), b.ok());
    let j = a.json();
    assert_eq!(field(&j, "host"), ["node0", "node0", "node1", "node1"], "{a}");
    assert_eq!(field(&j, "local_rank"), ["0", "1", "0", "1"], "{a}");
    assert_eq!(field(&j, "device"), ["cpu:0", "cpu:1", "cpu:0", "cpu:1"], "{a}");
    assert!(b.stdout.is_empty(), "only rank 0, on node 0, prints: {b}");
    for (pair, via) in [
        ("0-1", "shm"),
        ("2-3", "shm"),
        ("0-2", "tcp"),
        ("0-3", "tcp"),
        ("1-2", "tcp"),
        ("1-3", "tcp"),
    ] {
        assert_eq!(j["transports"][pair], via, "{pair}: {a}");
    }

    // The commands of EXERCISES.md 9, as they print on a terminal: one line per pair.
    let port = testkit::free_port().to_string();
    let node = |n: usize| {
        let rank = n.to_string();
        let args = [
            "--nnodes",
            "2",
            "--node-rank",
            &rank,
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            &port,
        ];
        spawn(with_names(n, &args))
    };
    let (a, b) = (node(0), node(1));
    let (a, b) = (finish(a, LIMIT).ok(), finish(b, LIMIT).ok());
    assert!(b.stdout.is_empty(), "only rank 0, on node 0, prints: {b}");
    let said = format!("{}{}", a.stdout, a.stderr);
    for line in [
        "cpu INFO 0[node0] <-> 1[node0] via SHM/shared memory (same host)",
        "cpu INFO 0[node0] <-> 2[node1] via NET/TCP (different hosts)",
        "cpu INFO 0[node0] <-> 3[node1] via NET/TCP (different hosts)",
        "cpu INFO 1[node0] <-> 2[node1] via NET/TCP (different hosts)",
        "cpu INFO 1[node0] <-> 3[node1] via NET/TCP (different hosts)",
        "cpu INFO 2[node1] <-> 3[node1] via SHM/shared memory (same host)",
    ] {
        assert!(said.lines().any(|l| l == line), "missing {line:?}:\n{a}");
    }
    assert!(a.stdout.contains("| 2    | 0          | node1 |"), "{a}");
}
/// EXERCISES.md 9 and 12: lesson 09 on two emulated nodes splits rows inside each node
/// (shared memory) and columns across them (TCP); rows then columns give the world's sum.
#[test]
fn chapter_9_and_12_rows_stay_in_a_node_and_columns_cross_it() {
    let split = built("09-nccl-split");
    let split = split.to_str().unwrap();
    let mut runs = testkit::nodes(2, |node, args| {
        let mut cmd = command(split, &[args, &["--nproc-per-node", "2", "--count", "3"]].concat());
        cmd.env("SLURMD_NODENAME", format!("node{node}"));
        cmd
    });
    let a = runs.remove(0).ok();
    let j = a.json();
    assert_eq!(j["transports"]["0-1"], "shm", "{a}");
    assert_eq!(j["transports"]["2-3"], "shm", "{a}");
    assert_eq!(j["transports"]["0-2"], "tcp", "{a}");
    assert_eq!(
        stage(&j, "rows"),
        [vec![3.0; 3], vec![3.0; 3], vec![7.0; 3], vec![7.0; 3]],
        "{a}"
    );
    assert_eq!(stage(&j, "columns"), vec![vec![10.0; 3]; 4], "{a}");
}

/// EXERCISES.md 12a: the tables of 4 ranks in rows of 2, one per communicator, and the
/// two ncclCommSplit calls of rank 1 on simulated GPUs, each all-reduce on its own one.
#[test]
fn chapter_12_one_table_per_color_and_rank_1s_splits() {
    let split = built("09-nccl-split");
    let split = split.to_str().unwrap();
    let r = run(split, &["--nproc-per-node", "4", "--tp", "2", "--count", "3"]).ok();
    for line in [
        "Rows: after the all-reduce in each tensor-parallel group, color 1 (2 ranks):",
        "  CPU 2, rank 0 | 7 | 7 | 7 |",
        "Check: OK, color 0's 2 ranks hold 3, color 1's 2 ranks hold 7 in all 3 elements",
        "  CPU 1, rank 0 | 10 | 10 | 10 |",
        "Check: OK, all 4 ranks hold 10 in all 3 elements (on 2 communicators of the split)",
    ] {
        assert!(r.stdout.lines().any(|l| l == line), "missing {line:?}:\n{r}");
    }
    let args = [
        "--nproc-per-node",
        "4",
        "--tp",
        "2",
        "--count",
        "3",
        "--backend",
        "nccl",
        "--show-calls=1",
    ];
    let r = finish(spawn(nccl_command(split, &args, 4)), LIMIT).ok();
    let calls = testkit::calls(&r.stdout, 1);
    let splits: Vec<&String> = calls.iter().filter(|c| c.starts_with("ncclCommSplit(")).collect();
    assert_eq!(splits.len(), 2, "{r}");
    assert!(splits[0].contains("color=0, key=1,"), "{r}");
    assert!(splits[1].contains("color=1, key=0,"), "{r}");
    let comm = |c: &String| {
        c.split("comm=")
            .nth(1)
            .and_then(|s| s.split(',').next())
            .map(str::to_string)
    };
    let reduces: Vec<Option<String>> = calls
        .iter()
        .filter(|c| c.starts_with("ncclAllReduce("))
        .map(comm)
        .collect();
    assert_eq!(reduces.len(), 2, "{r}");
    assert_ne!(reduces[0], reduces[1], "each all-reduce on its own communicator: {r}");
}
