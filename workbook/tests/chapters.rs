//! What EXERCISES.md says "you will see", run and checked chapter by chapter, on the real
//! binaries as multi-process jobs (the examples, and the reference solutions standing in
//! for a student's finished code).

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
fn chapter_2_the_root_is_unchanged_and_everyone_ends_with_its_value() {
    let bcast = built("01-nccl-broadcast");
    let bcast = bcast.to_str().unwrap();
    let args = [
        "--nproc-per-node",
        "4",
        "--root",
        "2",
        "--value",
        "7",
        "--format",
        "json",
    ];
    let j = run(bcast, &args).ok().json();
    let before = stage(&j, "before");
    assert_eq!(before, [[0.0; 4], [0.0; 4], [7.0; 4], [0.0; 4]]);
    assert_eq!(stage(&j, "after"), vec![vec![7.0; 4]; 4]);
    assert_eq!(stage(&j, "after")[2], before[2], "the root's row is unchanged");
    // On a terminal, the root's cells are not marked as changed; the others' are.
    let r = run(
        bcast,
        &[
            "--nproc-per-node",
            "4",
            "--root",
            "2",
            "--value",
            "7",
            "--color",
            "always",
        ],
    )
    .ok();
    let after = r.stdout.split("After broadcast:").nth(1).unwrap();
    let row = |rank: usize| {
        after
            .lines()
            .find(|l| l.starts_with(&format!("  CPU {rank} |")))
            .unwrap()
    };
    assert!(!row(2).contains('\u{1b}'), "{r}");
    assert!(row(0).contains("\u{1b}[1;32m7"), "{r}");

    let j = run(
        bcast,
        &[
            "--nproc-per-node",
            "4",
            "--root",
            "2",
            "--init",
            "rank",
            "--format",
            "json",
        ],
    )
    .ok()
    .json();
    assert_eq!(stage(&j, "before"), [[1.0; 4], [2.0; 4], [3.0; 4], [4.0; 4]]);
    assert_eq!(stage(&j, "after"), vec![vec![3.0; 4]; 4]);

    let r = run(bcast, &["--nproc-per-node", "4", "--root", "4"]);
    assert_eq!(r.code, Some(2), "{r}");
    assert!(
        r.stderr
            .contains("error: rank 0: --root 4 is not a rank: the world has ranks 0 to 3"),
        "{r}"
    );
}

#[test]
fn chapter_3_the_sum_is_n_n_plus_1_over_2_and_the_average_n_plus_1_over_2() {
    let allreduce = built("02-nccl-allreduce");
    for n in [4usize, 5] {
        let args = ["--nproc-per-node", &n.to_string(), "--init", "rank", "--format", "json"];
        let j = run(allreduce.to_str().unwrap(), &args).ok().json();
        assert_eq!(stage(&j, "after"), vec![vec![(n * (n + 1) / 2) as f64; 4]; n]);
    }
    // A finished exercise 3 (the solution stands in for it): the third table.
    let average = built("sol03-average");
    let r = run(average.to_str().unwrap(), &["--nproc-per-node", "4", "--init", "rank"]).ok();
    let table = r.stdout.split("Average (sum / 4):").nth(1).expect("the third table");
    for rank in 0..4 {
        let line = format!("  CPU {rank} | 2.5 | 2.5 | 2.5 | 2.5 |");
        assert!(table.lines().any(|l| l == line), "missing {line:?}:\n{r}");
    }
}

#[test]
fn chapter_5_a_ring_that_sends_first_deadlocks_on_large_chunks_only() {
    let ring = built("sol05-ring-allreduce");
    let ring = ring.to_str().unwrap();
    let ok = run(
        ring,
        &[
            "--nproc-per-node",
            "3",
            "--count",
            "100003",
            "--send-first",
            "--format",
            "json",
        ],
    )
    .ok();
    assert_eq!(ok.json()["check"]["ok"], true, "{ok}");
    let args = [
        "--nproc-per-node",
        "3",
        "--count",
        "8000000",
        "--send-first",
        "--timeout",
        "3",
        "--iters",
        "1",
    ];
    let r = run(ring, &args);
    assert_eq!(r.code, Some(1), "{r}");
    // Each rank's line says which send waits for which rank, and that this rank is sending
    // too (the accounts of the session's point-to-point calls), then what its link saw.
    let stuck = r.stderr.lines().any(|l| {
        (0..3).any(|rank| {
            let right = (rank + 1) % 3;
            l.starts_with(&format!(
                "error: rank {rank}: its send of 10.2 MiB to rank {right} is not received: rank {right} is in a \
                 send too, to rank {}",
                (right + 1) % 3
            )) && l.contains(": sending 266666")
                && l.contains(&format!("elements to (rank {right} "))
                && l.ends_with(&format!(
                    "nothing moved to or from rank {right} for the whole --timeout: it is stuck or gone"
                ))
        })
    });
    assert!(stuck, "{r}");
}

#[test]
fn chapter_7c_a_group_is_the_same_876_broadcasts_in_3_nccl_groups_and_the_cpu_backend_says_what_it_did() {
    let sync = built("sol07-packed-broadcast");
    let sync = sync.to_str().unwrap();
    let args = [
        "--simulate-gpus",
        "2",
        "--show-calls",
        "--iters",
        "1",
        "--method",
        "group",
    ];
    let r = run(sync, &args).ok();
    let count = |f: &str| {
        r.stdout
            .lines()
            .filter(|l| l.starts_with(&format!("rank 0 │ {f}(")))
            .count()
    };
    assert_eq!(
        (count("ncclBroadcast"), count("ncclGroupStart"), count("ncclGroupEnd")),
        (876, 3, 3),
        "{r}"
    );
    // The Group: lines the chapter shows, at --hidden 8 and 128.
    for (hidden, line) in [
        (
            "8",
            "Group: 292 broadcasts (float, root 0) packed into one broadcast of 121.1 KiB",
        ),
        (
            "128",
            "Group: 292 broadcasts (float, root 0): 194 under 64.0 KiB packed into one of 157.0 KiB, 98 of 64.0 KiB \
             or more run as they are (18.6 MiB)",
        ),
    ] {
        let args = [
            "--nproc-per-node",
            "2",
            "--iters",
            "1",
            "--method",
            "group",
            "--hidden",
            hidden,
        ];
        let r = run(sync, &args).ok();
        assert!(r.stdout.lines().any(|l| l == line), "no {line:?}:\n{r}");
    }
}

#[test]
fn chapter_13_without_its_group_the_all_to_all_deadlocks_on_large_blocks_and_each_rank_says_why() {
    let bin = built("sol13-grouped-alltoall");
    let bin = bin.to_str().unwrap();
    // Small blocks fit in the links: the sends return, and the receives find them.
    run(
        bin,
        &["--nproc-per-node", "3", "--count", "7", "--no-group", "--iters", "1"],
    )
    .ok();
    // In a group, blocks larger than a link holds go through.
    let r = run(bin, &["--nproc-per-node", "3", "--count", "1000000", "--iters", "1"]).ok();
    assert!(
        r.stdout.lines().any(|l| l
            == "Group: 2 sends and 2 receives progressed together (the sends to 2 ranks on threads of their own \
                while this one receives)"),
        "{r}"
    );
    // Without it, every rank waits in its first send.
    let args = [
        "--nproc-per-node",
        "3",
        "--count",
        "1000000",
        "--no-group",
        "--timeout",
        "5",
        "--iters",
        "1",
    ];
    let r = run(bin, &args);
    assert_eq!(r.code, Some(1), "{r}");
    let said = "error: rank 0: its send of 3.8 MiB to rank 1 is not received: rank 1 is in a send too, to rank 0 (a \
                deadlock: past the link's buffer a send returns only once its receiver takes it, as NCCL's does past \
                its eager size; issue the sends and receives together, in one group: session.group()): sending \
                1000000 elements to (rank 1 over shared memory): ";
    assert!(r.stderr.lines().any(|l| l.starts_with(said)), "{r}");
    // Simulated GPUs have no eager size: without the group, even 7 elements wait.
    let args = [
        "--simulate-gpus",
        "3",
        "--count",
        "7",
        "--no-group",
        "--timeout",
        "3",
        "--iters",
        "1",
    ];
    let r = run(bin, &args);
    assert_eq!(r.code, Some(1), "{r}");
    assert!(
        r.stderr.lines().any(|l| l.starts_with(
            "error: rank 0: nothing finished in 3 s (--timeout) waiting for the GPU to finish send to rank 1 \
             (ncclSend)"
        )),
        "{r}"
    );
}

#[test]
fn chapter_7_one_broadcast_per_tensor_is_292_nccl_calls_and_one_packed_is_one() {
    // What makes the packed broadcast faster, counted rather than timed (a test asserts no
    // time): the NCCL calls rank 0 makes, shown by --show-calls on simulated GPUs, for the
    // checked step, the timed loop's warm-up and one timed step.
    let sync = built("sol07-packed-broadcast");
    let calls = |method: &str| {
        let args = [
            "--simulate-gpus",
            "2",
            "--show-calls",
            "--iters",
            "1",
            "--method",
            method,
        ];
        let r = run(sync.to_str().unwrap(), &args).ok();
        r.stdout
            .lines()
            .filter(|l| l.starts_with("rank 0 │ ncclBroadcast("))
            .count()
    };
    assert_eq!((calls("each"), calls("packed")), (3 * 292, 3));
    let r = run(sync.to_str().unwrap(), &["--nproc-per-node", "2", "--iters", "1"]).ok();
    assert!(
        r.stdout
            .contains("Model: 292 tensors, 30992 parameters (0.1 MiB), from 8 to 8000 elements each"),
        "{r}"
    );
}

#[test]
fn chapter_8_the_sharded_step_matches_the_plain_one_and_the_bus_factors() {
    // A finished exercise 8 (the solution stands in for it), 7 parameters on 4 ranks.
    let sharded = built("sol08-sharded-update");
    let r = run(sharded.to_str().unwrap(), &["--nproc-per-node", "4", "--count", "7"]).ok();
    assert!(r.stdout.contains("7 parameters + 1 of padding = 4 shards of 2"), "{r}");
    for title in [
        "Expected: the plain step (all-reduce, every rank updates everything):",
        "After the sharded step:",
    ] {
        let table = r.stdout.split(title).nth(1).expect(title).split("\n\n").next().unwrap();
        for rank in 0..4 {
            let line = format!("  CPU {rank} | 0.375 | 0.75 | 1.125 | 1.5 | 1.875 | 2.25 | 2.625 | 0 |");
            assert!(table.lines().any(|l| l == line), "{title} {line:?}:\n{r}");
        }
    }
    // The benchmark's factors on 4 ranks: 2(n-1)/n for all_reduce, (n-1)/n for the pair.
    let perf = built("07-nccl-perf");
    for (op, factor) in [
        ("all_reduce", "1.500"),
        ("reduce_scatter", "0.750"),
        ("all_gather", "0.750"),
    ] {
        let args = ["--coll", op, "-b", "1K", "-e", "1K", "--nproc-per-node", "4"];
        let r = run(perf.to_str().unwrap(), &args).ok();
        let header = format!("# {op} (");
        assert!(
            r.stdout
                .lines()
                .any(|l| l.starts_with(&header) && l.ends_with(&format!("busbw = algbw × {factor}"))),
            "{r}"
        );
    }
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

/// Every question of EXERCISES.md has its answer folded under it, of at most 12 lines;
/// every chapter opens with its goal and time; no line holds a date; the introduction
/// links the glossary, which defines the terms it promises: one entry of at most two lines
/// per term, each with its own anchor, in alphabetical order; and every link within the
/// file lands on an anchor of it.
#[test]
fn every_question_has_a_folded_answer_and_the_glossary_is_there() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../EXERCISES.md");
    let text = std::fs::read_to_string(path).unwrap();
    let questions: Vec<&str> = text.split("**Question ").skip(1).collect();
    assert!(questions.len() >= 15, "{} questions", questions.len());
    for q in &questions {
        let name = q.split("**").next().unwrap();
        let before_next_heading = q.split("\n## ").next().unwrap();
        assert!(
            before_next_heading.contains("<details><summary>Answer</summary>"),
            "question {name} has no folded answer"
        );
    }
    // A workbook, not a lab notebook: every answer short, every chapter opening with its
    // goal and its time, no dates (the figures of a day are in docs/measured.md).
    for answer in text.split("<details><summary>Answer</summary>\n").skip(1) {
        let body = answer.split("</details>").next().unwrap().trim_matches('\n');
        let lines = body.lines().count();
        assert!(lines <= 12, "an answer of {lines} lines (at most 12): {body:.80}…");
    }
    for chapter in text.split("\n## ").skip(1) {
        let (title, body) = chapter.split_once('\n').unwrap();
        if title.starts_with(|c: char| c.is_ascii_digit()) || title.starts_with("Appendix") {
            let opening = body.trim_start().split("\n\n").next().unwrap();
            assert!(
                opening.starts_with("**Goal:**") && opening.contains("**Time:**"),
                "chapter {title:?} does not open with its goal and time"
            );
        }
    }
    let dated = text.lines().find(|l| {
        l.as_bytes().windows(10).any(|w| {
            w.iter().enumerate().all(|(i, b)| match i {
                4 | 7 => *b == b'-',
                _ => b.is_ascii_digit(),
            }) && w.starts_with(b"20")
        })
    });
    assert_eq!(dated, None, "a date in EXERCISES.md");
    let intro = text.split("\n## ").next().unwrap();
    assert!(
        intro.contains("[glossary](#glossary)"),
        "the introduction links the glossary"
    );
    let glossary = text.split("\n## Glossary\n").nth(1).expect("a glossary");
    let glossary = glossary.split("\n## ").next().unwrap();
    // Each entry: `- <a id="glossary-TERM"></a>**Term**...`, then at most one more line.
    let mut entries: Vec<Vec<&str>> = Vec::new();
    for line in glossary.lines().filter(|l| !l.trim().is_empty()) {
        if line.starts_with("- ") {
            entries.push(vec![line]);
        } else {
            assert!(line.starts_with("  "), "a glossary line outside an entry: {line:?}");
            entries.last_mut().expect("an entry").push(line);
        }
    }
    let mut ids = Vec::new();
    for entry in &entries {
        let id = entry[0]
            .strip_prefix("- <a id=\"")
            .and_then(|rest| rest.split_once("\"></a>**"))
            .map(|(id, _)| id)
            .unwrap_or_else(|| panic!("an entry without its anchor: {:?}", entry[0]));
        assert!(entry.len() <= 2, "the entry {id} has {} lines", entry.len());
        ids.push(id);
    }
    let mut sorted = ids.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(ids, sorted, "the glossary's entries, in alphabetical order, once each");
    for term in [
        "algbw",
        "algorithm",
        "all-gather",
        "all-to-all",
        "alpha-beta",
        "busbw",
        "channel",
        "chunk",
        "communicator",
        "deadlock",
        "eager",
        "futex",
        "group",
        "hierarchical-all-reduce",
        "kernel",
        "local-rank",
        "net",
        "nvlink",
        "p2p",
        "pipeline",
        "protocol",
        "rank",
        "reduce-scatter",
        "rendezvous",
        "rendezvous-protocol",
        "ring",
        "root",
        "shm",
        "single-copy",
        "spinning",
        "split",
        "store",
        "stream",
        "transport",
        "tree",
        "tuner",
        "world",
    ] {
        let id = format!("glossary-{term}");
        assert!(ids.contains(&id.as_str()), "the glossary has no {term}");
        assert!(
            intro.contains(&format!("(#{id})")),
            "the introduction does not link {term}"
        );
    }
    // Every `](#anchor)` of the file: an `<a id>` of it, or a heading's (GitHub's slug).
    let mut anchors: Vec<String> = text
        .split("<a id=\"")
        .skip(1)
        .map(|rest| rest.split('"').next().unwrap().to_string())
        .collect();
    for heading in text.lines().filter(|l| l.starts_with('#')) {
        let title = heading.trim_start_matches('#').trim().to_lowercase();
        let slug: String = title
            .chars()
            .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        anchors.push(slug);
    }
    for link in text.split("](#").skip(1) {
        let anchor = link.split(')').next().unwrap();
        assert!(anchors.iter().any(|a| a == anchor), "the link #{anchor} lands nowhere");
    }
}

/// EXERCISES.md 6, against the benchmark: rows whose algbw is size / time, whose busbw is
/// algbw × 2(n-1)/n, with no wrong element, and a time that is flat at small sizes and
/// grows with the size at large ones.
#[test]
fn chapter_6_the_benchmark_columns_and_the_turn_from_latency_to_bandwidth() {
    let perf = built("07-nccl-perf");
    let args = [
        "--coll",
        "all-reduce",
        "-b",
        "4",
        "-e",
        "16M",
        "-f",
        "4",
        "--nproc-per-node",
        "2",
    ];
    let r = run(perf.to_str().unwrap(), &args).ok();
    let rows: Vec<Vec<f64>> = r
        .stdout
        .lines()
        .filter(|l| !l.trim_start().starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            l.split_whitespace()
                .filter_map(|w| w.parse().ok())
                .collect::<Vec<f64>>()
        })
        .filter(|nums| nums.len() >= 10)
        .collect();
    assert!(rows.len() >= 10, "4 B to 16 MiB by 4: {r}");
    for row in &rows {
        // size, count (type, redop: words; root: a number or not), then out of place:
        // time, algbw, busbw, #wrong; then the same four in place.
        let out = &row[row.len() - 8..];
        let (size, time, algbw, busbw, wrong) = (row[0], out[0], out[1], out[2], out[3]);
        let want = size / time / 1e3;
        assert!(
            (algbw - want).abs() <= 0.011 + 0.02 * want,
            "algbw {algbw} vs {want}: {r}"
        );
        assert!(
            (busbw - algbw).abs() <= 0.011 + 0.02 * algbw,
            "2 ranks: busbw = algbw: {r}"
        );
        assert_eq!(wrong, 0.0, "{r}");
    }
    let (first, last) = (&rows[0], rows.last().unwrap());
    let (first, last) = (&first[first.len() - 8..], &last[last.len() - 8..]);
    assert!(last[0] > 10.0 * first[0], "16 MiB takes far longer than 4 B: {r}");
    assert!(last[1] > first[1], "large sizes reach a higher algbw: {r}");
    assert!(r.stdout.contains("# Avg bus bandwidth"), "{r}");
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
