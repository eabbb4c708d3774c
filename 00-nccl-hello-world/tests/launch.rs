//! Hello world under every way of launching, and every bad input, as real processes.

use std::net::TcpListener;
use std::time::Duration;
use testkit::{LIMIT, Run, command, finish, free_port, run, spawn};

const BIN: &str = env!("CARGO_BIN_EXE_00-nccl-hello-world");

/// One field of every rank in a JSON report, as text: `["0", "1"]`, `["cpu:0", "cpu:1"]`.
fn field(j: &serde_json::Value, key: &str) -> Vec<String> {
    let text = |v: &serde_json::Value| v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string());
    j["ranks"].as_array().unwrap().iter().map(|r| text(&r[key])).collect()
}

#[test]
fn the_launcher_starts_every_rank_and_rank_0_prints_them_in_order() {
    for world in 1..=4usize {
        let r = run(BIN, &["--nproc-per-node", &world.to_string(), "--format", "json"]).ok();
        let j = r.json();
        assert_eq!(j["example"], "00-nccl-hello-world");
        assert_eq!(j["backend"], "cpu");
        assert_eq!(j["world_size"], world);
        assert_eq!(field(&j, "rank"), (0..world).map(|r| r.to_string()).collect::<Vec<_>>());
        assert_eq!(field(&j, "local_rank"), field(&j, "rank"));
        assert_eq!(
            field(&j, "device"),
            (0..world).map(|r| format!("cpu:{r}")).collect::<Vec<_>>()
        );
        let pids: std::collections::HashSet<_> = field(&j, "pid").into_iter().collect();
        assert_eq!(pids.len(), world, "one process per rank: {r}");
    }
}

#[test]
fn the_text_table_has_one_row_per_rank() {
    let r = run(BIN, &["--nproc-per-node", "3"]).ok();
    let rows: Vec<&str> = r
        .stdout
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| rank"))
        .collect();
    assert_eq!(rows.len(), 3, "{r}");
    for (rank, row) in rows.iter().enumerate() {
        assert!(
            row.starts_with(&format!("| {rank} ")) && row.contains(&format!("cpu:{rank}")),
            "{row}\n{r}"
        );
    }
    assert!(
        r.stdout.contains("device = rank % device_count, with device_count = 3"),
        "{r}"
    );
}

#[test]
fn ranks_started_by_hand_with_flags() {
    let port = free_port().to_string();
    let ranks: Vec<_> = (0..3)
        .map(|rank| {
            let rank = rank.to_string();
            spawn(command(
                BIN,
                &[
                    "--world-size",
                    "3",
                    "--rank",
                    &rank,
                    "--master-port",
                    &port,
                    "--format",
                    "json",
                ],
            ))
        })
        .collect();
    let runs: Vec<Run> = ranks.into_iter().map(|c| finish(c, LIMIT).ok()).collect();
    let j = runs[0].json();
    assert_eq!(j["world_size"], 3);
    // With no launcher to say so, local ranks come from comparing hosts.
    assert_eq!(field(&j, "local_rank"), vec!["0", "1", "2"]);
    assert!(
        runs[1].stdout.is_empty() && runs[2].stdout.is_empty(),
        "only rank 0 prints"
    );
}

fn torchrun_rank(rank: usize, world: usize, port: u16, agent: bool) -> std::process::Child {
    let mut cmd = command(BIN, &["--format", "json"]);
    cmd.env("RANK", rank.to_string())
        .env("WORLD_SIZE", world.to_string())
        .env("LOCAL_RANK", rank.to_string())
        .env("LOCAL_WORLD_SIZE", world.to_string())
        .env("MASTER_ADDR", "localhost")
        .env("MASTER_PORT", port.to_string())
        .env("TORCHELASTIC_RUN_ID", "none");
    if agent {
        cmd.env("TORCHELASTIC_USE_AGENT_STORE", "True");
    }
    spawn(cmd)
}

#[test]
fn torchrun_style_variables_with_and_without_its_agent() {
    let port = free_port();
    let ranks: Vec<_> = (0..2).map(|r| torchrun_rank(r, 2, port, false)).collect();
    let runs: Vec<Run> = ranks.into_iter().map(|c| finish(c, LIMIT).ok()).collect();
    assert_eq!(runs[0].json()["world_size"], 2);

    // Under torchrun, its agent already listens on MASTER_PORT: the store takes the next.
    // (Hold a port P for the agent whose P+1 is free too: other tests' sockets come and go.)
    let (_agent, port) = loop {
        let agent = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = agent.local_addr().unwrap().port();
        if port < u16::MAX && TcpListener::bind(("127.0.0.1", port + 1)).is_ok() {
            break (agent, port);
        }
    };
    let ranks: Vec<_> = (0..2).map(|r| torchrun_rank(r, 2, port, true)).collect();
    let runs: Vec<Run> = ranks.into_iter().map(|c| finish(c, LIMIT)).collect();
    assert_eq!(runs[0].code, Some(0), "{}", runs[0]);
    assert_eq!(runs[0].json()["world_size"], 2);
}

#[test]
fn slurm_variables_one_task_per_rank() {
    // Two "nodes" of two tasks each, as srun would describe them, all on this machine.
    let job = (std::process::id() % 100_000).to_string();
    let ranks: Vec<_> = (0..4usize)
        .map(|rank| {
            let mut cmd = command(BIN, &["--format", "json"]);
            cmd.env("SLURM_PROCID", rank.to_string())
                .env("SLURM_NTASKS", "4")
                .env("SLURM_LOCALID", (rank % 2).to_string())
                .env("SLURM_NODEID", (rank / 2).to_string())
                .env("SLURM_TASKS_PER_NODE", "2(x2)")
                .env("SLURM_JOB_NODELIST", "localhost")
                .env("SLURM_JOB_ID", &job)
                .env("SLURM_STEP_ID", "0");
            spawn(cmd)
        })
        .collect();
    let runs: Vec<Run> = ranks.into_iter().map(|c| finish(c, LIMIT).ok()).collect();
    let j = runs[0].json();
    assert_eq!(field(&j, "local_rank"), vec!["0", "1", "0", "1"], "{}", runs[0]);
    // device = rank % device_count, with device_count = the 2 ranks of each node.
    assert_eq!(field(&j, "device"), vec!["cpu:0", "cpu:1", "cpu:0", "cpu:1"]);
}

#[test]
fn a_slurm_step_on_part_of_the_allocation_finds_its_master_on_the_steps_first_node() {
    // `srun -N1 -w localhost` inside a two-node job whose first node is elsewhere (here
    // a name that resolves nowhere): rank 0 runs on the step's node, so that is the master.
    let job = (std::process::id() % 100_000 + 7).to_string();
    let ranks: Vec<_> = (0..2usize)
        .map(|rank| {
            let mut cmd = command(BIN, &["--format", "json", "--timeout", "10"]);
            cmd.env("SLURM_PROCID", rank.to_string())
                .env("SLURM_NTASKS", "2")
                .env("SLURM_LOCALID", rank.to_string())
                .env("SLURM_NODEID", "0")
                .env("SLURM_JOB_NODELIST", "no-such-node[1-2].invalid,localhost")
                .env("SLURM_TASKS_PER_NODE", "2(x3)")
                .env("SLURM_STEP_NODELIST", "localhost")
                .env("SLURM_STEP_TASKS_PER_NODE", "2")
                .env("SLURM_JOB_ID", &job)
                .env("SLURM_STEP_ID", "3");
            spawn(cmd)
        })
        .collect();
    let runs: Vec<Run> = ranks.into_iter().map(|c| finish(c, LIMIT).ok()).collect();
    assert_eq!(runs[0].json()["world_size"], 2, "{}", runs[0]);
}

#[test]
fn two_launchers_as_two_nodes_on_one_machine() {
    let [a, b] = testkit::two_nodes(|_, args| command(BIN, &[args, &["--nproc-per-node", "2"]].concat()));
    let (a, b) = (a.ok(), b.ok());
    let j = a.json();
    assert_eq!(j["world_size"], 4);
    assert_eq!(field(&j, "local_rank"), vec!["0", "1", "0", "1"]);
    assert!(b.stdout.is_empty(), "node 1 prints nothing: rank 0 is on node 0");
}

/// Runs `args`, expecting exit `code` and one line on stderr containing `says`.
fn refused(args: &[&str], code: i32, says: &str) -> Run {
    let r = run(BIN, args);
    assert_eq!(r.code, Some(code), "{r}");
    let first = r.stderr.lines().next().unwrap_or("");
    assert!(
        first.starts_with("error: ") && first.contains(says),
        "expected {says:?} in:\n{r}"
    );
    assert!(!r.stderr.contains("panicked") && !r.stderr.contains("backtrace"), "{r}");
    r
}

#[test]
fn bad_input_is_one_line_and_exit_status_2() {
    refused(&["--nproc-per-node", "0"], 2, "'0' for '--nproc-per-node");
    refused(
        &["--world-size", "2", "--rank", "2"],
        2,
        "--rank 2 is not a rank: the world has ranks 0 to 1",
    );
    refused(&["--backend", "gloo"], 2, "invalid value 'gloo' for '--backend");
    refused(&["--timeout", "soon"], 2, "'soon' is not a duration");
    refused(
        &["--nnodes", "2"],
        2,
        "every node needs the same --master-addr and --master-port",
    );
    let r = refused(&["--rank", "1"], 2, "--world-size");
    assert_eq!(r.stderr.lines().count(), 1, "{r}");
}

#[test]
fn a_bad_environment_is_one_line_and_exit_status_2() {
    // What Slurm or torchrun would never set, set by hand or by a broken script.
    for (env, says) in [
        (
            &[
                ("SLURM_PROCID", "0"),
                ("SLURM_NTASKS", "2"),
                ("SLURM_JOB_NODELIST", "node[1-"),
            ][..],
            "reading SLURM_JOB_NODELIST: bad Slurm list",
        ),
        (&[("RANK", "0")][..], "RANK is set but WORLD_SIZE is not"),
        (
            &[
                ("RANK", "1"),
                ("WORLD_SIZE", "2"),
                ("LOCAL_RANK", "3"),
                ("LOCAL_WORLD_SIZE", "2"),
            ][..],
            "LOCAL_RANK 3 is not a local rank",
        ),
    ] {
        let mut cmd = command(BIN, &["--timeout", "5"]);
        cmd.envs(env.iter().copied());
        let r = finish(spawn(cmd), LIMIT);
        assert_eq!(r.code, Some(2), "{env:?}:\n{r}");
        assert_eq!(r.stderr.lines().count(), 1, "{env:?}:\n{r}");
        assert!(r.stderr.contains(says), "{env:?} should say {says:?}:\n{r}");
    }
    // A 100 kB value is quoted cut, not whole; a job id that long is refused.
    let long = "7".repeat(100_000);
    let mut cmd = command(BIN, &["--timeout", "5"]);
    cmd.env("RANK", &long).env("WORLD_SIZE", "2");
    let r = finish(spawn(cmd), LIMIT);
    assert_eq!(r.code, Some(2), "{r}");
    assert!(
        r.stderr.len() < 400 && r.stderr.contains("more bytes)"),
        "{} bytes",
        r.stderr.len()
    );
    let r = run(BIN, &["--job-id", &long[..1000]]);
    assert_eq!(r.code, Some(2), "{r}");
    assert!(r.stderr.contains("a job id is 1 to 200 printable characters"), "{r}");
}

#[test]
fn failures_at_run_time_are_one_line_and_exit_status_1() {
    // Nobody at the master: the rank retries until --timeout, then names the address.
    let port = free_port().to_string();
    let r = refused(
        &[
            "--world-size",
            "2",
            "--rank",
            "1",
            "--master-port",
            &port,
            "--timeout",
            "1",
        ],
        1,
        "could not reach the master at 127.0.0.1:",
    );
    assert!(r.elapsed < Duration::from_secs(10), "{r}");

    // A port in use: rank 0 cannot host the store, says which port, and the job stops.
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let r = refused(
        &["--master-port", &port, "--timeout", "5"],
        1,
        &format!("port {port} on 127.0.0.1 is already in use"),
    );
    assert!(
        r.stderr.contains("launcher: rank 0 failed first (exit status 1)"),
        "{r}"
    );

    // NCCL asked for on a machine without it: says what is missing.
    refused(
        &["--backend", "nccl"],
        1,
        "--backend nccl cannot run here: the CUDA driver",
    );
}

#[test]
fn a_rank_with_the_wrong_world_size_or_job_is_refused() {
    let port = free_port().to_string();
    let rank0 = spawn(command(
        BIN,
        &[
            "--world-size",
            "2",
            "--rank",
            "0",
            "--master-port",
            &port,
            "--timeout",
            "5",
        ],
    ));
    let wrong = run(
        BIN,
        &[
            "--world-size",
            "3",
            "--rank",
            "1",
            "--master-port",
            &port,
            "--timeout",
            "5",
        ],
    );
    assert_eq!(wrong.code, Some(1), "{wrong}");
    assert!(
        wrong
            .stderr
            .contains("was started with a world of 3 ranks, but rank 0 with 2"),
        "{wrong}"
    );
    let other_job = run(
        BIN,
        &[
            "--world-size",
            "2",
            "--rank",
            "1",
            "--master-port",
            &port,
            "--job-id",
            "other",
            "--timeout",
            "5",
        ],
    );
    assert!(other_job.stderr.contains("this store belongs to job"), "{other_job}");
    // The right rank still completes the job.
    let good = run(
        BIN,
        &[
            "--world-size",
            "2",
            "--rank",
            "1",
            "--master-port",
            &port,
            "--timeout",
            "5",
        ],
    )
    .ok();
    assert!(good.stderr.is_empty(), "{good}");
    finish(rank0, LIMIT).ok();
}
