//! The split lesson as real multi-process jobs: rows, then columns, every rank's elements
//! read from --format json; on the CPU backend and on the NCCL test double, on one
//! machine and on two emulated nodes; bad input and a rank killed in the split.

use testkit::{LIMIT, command, finish, nccl_command, spawn, stage};

const BIN: &str = env!("CARGO_BIN_EXE_09-nccl-split");

/// What every rank must hold after the rows and after the columns, for `world` ranks in
/// rows of `tp`, rank r starting from r + 1.
fn expected(world: usize, tp: usize) -> (Vec<f64>, f64) {
    let rows = (0..world)
        .map(|r| {
            let first = r / tp * tp;
            (first..first + tp).map(|m| (m + 1) as f64).sum()
        })
        .collect();
    (rows, (world * (world + 1) / 2) as f64)
}

/// Checks a job's report: `world` ranks in rows of `tp`, `count` elements shown.
fn check(j: &serde_json::Value, world: usize, tp: usize, count: usize, ctx: &str) {
    let (rows, all) = expected(world, tp);
    assert_eq!(j["world_size"], world, "{ctx}");
    assert_eq!(j["check"]["ok"], true, "{ctx}");
    assert_eq!(j["check"]["wrong"], 0, "{ctx}");
    let before: Vec<Vec<f64>> = (0..world).map(|r| vec![(r + 1) as f64; count]).collect();
    assert_eq!(stage(j, "before"), before, "{ctx}");
    let after_rows: Vec<Vec<f64>> = rows.iter().map(|v| vec![*v; count]).collect();
    assert_eq!(stage(j, "rows"), after_rows, "{ctx}");
    assert_eq!(stage(j, "columns"), vec![vec![all; count]; world], "{ctx}");
}

#[test]
fn rows_then_columns_give_the_world_sum_on_1_to_8_ranks() {
    for (world, tp) in [(1, 1), (2, 1), (2, 2), (3, 3), (4, 2), (6, 3), (6, 2), (8, 4), (8, 2)] {
        let (w, t) = (world.to_string(), tp.to_string());
        let args = ["--nproc-per-node", &w, "--tp", &t, "--count", "5", "--format", "json"];
        let r = finish(spawn(command(BIN, &args)), LIMIT).ok();
        check(&r.json(), world, tp, 5, &format!("{world} ranks, rows of {tp}: {r}"));
    }
}

#[test]
fn rows_then_columns_on_simulated_gpus() {
    for (world, tp) in [(4, 2), (6, 3)] {
        let (w, t) = (world.to_string(), tp.to_string());
        let args = [
            "--backend",
            "nccl",
            "--nproc-per-node",
            &w,
            "--tp",
            &t,
            "--count",
            "1000",
            "--format",
            "json",
        ];
        let r = finish(spawn(nccl_command(BIN, &args, world)), LIMIT).ok();
        let j = r.json();
        assert_eq!(j["backend"], "nccl", "{r}");
        check(&j, world, tp, 8, &format!("{world} GPUs, rows of {tp}: {r}"));
    }
}

#[test]
fn a_row_is_a_node_by_default_on_two_emulated_nodes() {
    for nccl in [false, true] {
        let runs = testkit::nodes(2, |node, args| {
            let mut a = vec!["--nproc-per-node", "2", "--count", "3"];
            a.extend_from_slice(args);
            let mut cmd = match nccl {
                true => {
                    a.extend(["--backend", "nccl"]);
                    nccl_command(BIN, &a, 2)
                }
                false => command(BIN, &a),
            };
            cmd.env("SLURMD_NODENAME", format!("node{node}"));
            cmd
        });
        for r in &runs {
            assert_eq!(r.code, Some(0), "nccl {nccl}: {r}");
        }
        let j = runs[0].json();
        check(&j, 4, 2, 3, &format!("nccl {nccl}: {}", runs[0]));
        if !nccl {
            // Rows inside a node over shared memory, columns across over TCP.
            assert_eq!(j["transports"]["0-1"], "shm", "{}", runs[0]);
            assert_eq!(j["transports"]["0-2"], "tcp", "{}", runs[0]);
        }
    }
}

#[test]
fn every_colors_steps_are_shown_alike_whatever_its_world_ranks() {
    // Color 1's ranks are world ranks 2 and 3: its parts name them so, and its steps are
    // matched through them, as color 0's (world ranks 0 and 1) are.
    let args = ["--nproc-per-node", "4", "--tp", "2", "--steps", "--count", "4"];
    let r = finish(spawn(command(BIN, &args)), LIMIT);
    assert_eq!(r.code, Some(0), "{r}");
    let out = r.stdout.replace(' ', "");
    assert_eq!(out.matches("reduce-scatterstep1of1").count(), 2, "{r}");
    assert_eq!(out.matches("all-gatherstep1of1").count(), 2, "{r}");
    assert!(!out.contains("step1of2"), "{r}");
    for (me, peer, sent, got) in [(0, 1, 0, 1), (1, 0, 1, 0), (2, 3, 0, 1), (3, 2, 1, 0)] {
        let said = format!("sentchunk{sent}→rank{peer},gotchunk{got}fromrank{peer}(+)");
        assert!(
            out.lines()
                .any(|l| l.starts_with(&format!("CPU{me}|")) && l.ends_with(&said)),
            "CPU {me}: {said}\n{r}"
        );
    }
}

#[test]
fn a_row_length_that_does_not_divide_the_world_is_one_line_and_exit_2() {
    let r = finish(spawn(command(BIN, &["--nproc-per-node", "4", "--tp", "3"])), LIMIT);
    assert_eq!(r.code, Some(2), "{r}");
    let errors: Vec<&str> = r.stderr.lines().filter(|l| l.starts_with("error")).collect();
    assert_eq!(
        errors,
        ["error: rank 0: --tp 3: the 4 ranks do not make whole rows of 3: give --tp a divisor of 4"],
        "{r}"
    );
    let r = finish(spawn(command(BIN, &["--nproc-per-node", "2", "--tp", "two"])), LIMIT);
    assert_eq!(r.code, Some(2), "{r}");
}

#[test]
fn a_rank_killed_in_the_split_is_named_within_the_timeout_and_nothing_is_left() {
    for nccl in [false, true] {
        let rooms = testkit::nccl_double_dir().with_file_name(format!("rooms-split-{}", std::process::id()));
        std::fs::create_dir_all(&rooms).unwrap();
        let before = orphans();
        let args = [
            "--nproc-per-node",
            "4",
            "--tp",
            "2",
            "--timeout",
            "5",
            "--backend",
            if nccl { "nccl" } else { "cpu" },
        ];
        let mut cmd = match nccl {
            true => nccl_command(BIN, &args, 4),
            false => command(BIN, &args),
        };
        cmd.env("NCCL_WORKBOOK_FAULT", "die-in-split:2")
            .env("NCCL_DOUBLE_DIR", &rooms);
        let started = std::time::Instant::now();
        let r = finish(spawn(cmd), LIMIT);
        let ctx = format!("nccl {nccl}, after {:?}: {r}", started.elapsed());
        assert_eq!(r.code, Some(1), "{ctx}");
        assert!(started.elapsed() < std::time::Duration::from_secs(5 + 5), "{ctx}");
        assert!(
            r.stderr.contains("launcher: rank 2 failed first (killed by signal 9"),
            "{ctx}"
        );
        for line in r.stderr.lines().filter(|l| l.starts_with("error: rank")) {
            assert!(
                line.contains("rank 2"),
                "a rank's line does not name rank 2: {line}\n{ctx}"
            );
        }
        assert!(!r.stderr.contains("panicked"), "{ctx}");
        let left: Vec<String> = orphans().difference(&before).cloned().collect();
        assert!(left.is_empty(), "files left in /dev/shm: {left:?}\n{ctx}");
        let _ = std::fs::remove_dir_all(&rooms);
    }
}

/// A rank stopped (SIGSTOP) as it first runs calls on its split, on simulated GPUs: every
/// survivor names it as stopped, whichever communicator it was waiting on, and none ends
/// on a bare "ending with its NCCL communicator open" when NCCL's abort hangs.
#[test]
fn a_rank_stopped_in_the_split_is_named_by_every_survivor() {
    let rooms = testkit::nccl_double_dir().with_file_name(format!("rooms-split-stop-{}", std::process::id()));
    std::fs::create_dir_all(&rooms).unwrap();
    let args = ["--nproc-per-node", "4", "--tp", "2", "--size", "16M", "--timeout", "5"];
    let mut cmd = nccl_command(BIN, &args, 4);
    cmd.env("NCCL_WORKBOOK_FAULT", "stop-in-split:2")
        .env("NCCL_DOUBLE_DIR", &rooms);
    let r = finish(spawn(cmd), LIMIT);
    let _ = std::fs::remove_dir_all(&rooms);
    assert_eq!(r.code, Some(1), "{r}");
    assert!(r.stderr.contains("launcher: rank 2 was frozen"), "{r}");
    let lines: Vec<&str> = r.stderr.lines().filter(|l| l.starts_with("error: rank")).collect();
    for survivor in [0, 1, 3] {
        let said: Vec<&&str> = lines
            .iter()
            .filter(|l| l.starts_with(&format!("error: rank {survivor}: ")))
            .collect();
        assert!(!said.is_empty(), "rank {survivor} said nothing: {r}");
        for line in said {
            assert!(
                line.contains("rank 2 stopped responding"),
                "rank {survivor}: {line}\n{r}"
            );
        }
    }
    assert!(!r.stderr.contains("ending with its NCCL communicator open"), "{r}");
}

/// The shared-memory channel files in /dev/shm whose owner (the process in their name,
/// `nccl-workbook-<pid>-...`) is gone: what a job left behind. (Counting every file would
/// count the channels of the jobs this file's other tests run at the same time.)
fn orphans() -> std::collections::BTreeSet<String> {
    let Ok(dir) = std::fs::read_dir("/dev/shm") else {
        return Default::default();
    };
    dir.flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| {
            let owner = name.strip_prefix("nccl-workbook-").and_then(|r| r.split('-').next());
            owner
                .and_then(|p| p.parse::<u32>().ok())
                .is_some_and(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists())
        })
        .collect()
}
