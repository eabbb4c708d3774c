//! Lesson 08 calls cudarc's NCCL API itself: run it on simulated GPUs and on the NCCL
//! test double, and where NCCL cannot run. Real processes.

use std::process::{Child, Command};
use std::time::Duration;
use testkit::{LIMIT, Run, finish, finish_or_kill, free_port, nccl_command, run, spawn};

const BIN: &str = env!("CARGO_BIN_EXE_08-cudarc-allreduce");

#[test]
fn every_rank_gets_the_sum_on_simulated_gpus() {
    for world in [1usize, 2, 4] {
        let w = world.to_string();
        let r = run(BIN, &["--simulate-gpus", &w, "--count", "5"]).ok();
        let sum = world * (world + 1) / 2;
        let got = format!("[{}]", vec![format!("{sum}.0"); 5].join(", "));
        for rank in 0..world {
            let line = format!("rank {rank}: sent {}, got {got}", rank + 1);
            assert!(r.stdout.lines().any(|l| l == line), "missing {line:?}:\n{r}");
        }
        assert!(
            r.stdout
                .starts_with(&format!("backend: nccl on {world} simulated GPUs")),
            "{r}"
        );
    }
}

#[test]
fn more_ranks_than_gpus_are_refused_as_the_other_lessons_refuse_them() {
    // 3 ranks on 2 GPUs: ranks 0 and 2 on GPU 0. Refused before the lesson makes its
    // communicator, as lesson 02 refuses it (NCCL's own "Duplicate GPU detected").
    let r = finish(spawn(nccl_command(BIN, &["--nproc-per-node", "3"], 2)), LIMIT);
    assert_eq!(r.code, Some(2), "{r}");
    assert!(
        r.stderr.contains("ranks 0 and 2 are both on GPU GPU-")
            && r.stderr.contains("NCCL refuses two ranks on one GPU"),
        "{r}"
    );
    assert!(!r.stderr.contains("ncclCommInitRank"), "{r}");
    assert!(!r.stderr.contains("panicked"), "{r}");
}

/// Rank `rank` of `world` started by hand on `port`, on the double with `gpus` GPUs.
fn by_hand(world: usize, rank: usize, port: u16, gpus: usize, extra: &[&str]) -> Command {
    let (w, r, p) = (world.to_string(), rank.to_string(), port.to_string());
    let args = [&["--world-size", &w, "--rank", &r, "--master-port", &p][..], extra].concat();
    nccl_command(BIN, &args, gpus)
}

/// Four ranks by hand on two emulated nodes of two GPUs, placed cyclically as `srun
/// --distribution=cyclic` places them (ranks 0 and 2 on node-a, 1 and 3 on node-b), with
/// `env` set on each; run to the end.
fn cyclic(env: &[(&str, &str)]) -> Vec<Run> {
    let port = free_port();
    let ranks: Vec<Child> = (0..4)
        .map(|r| {
            let mut cmd = by_hand(4, r, port, 2, &[]);
            cmd.env("SLURMD_NODENAME", ["node-a", "node-b"][r % 2])
                .envs(env.iter().copied());
            spawn(cmd)
        })
        .collect();
    ranks.into_iter().map(|c| finish(c, LIMIT)).collect()
}

#[test]
fn a_cyclic_placement_is_refused_naming_the_device_rule_that_runs_it() {
    let runs = cyclic(&[]);
    assert_eq!(runs[0].code, Some(2), "{}", runs[0]);
    let said = &runs[0].stderr;
    assert!(
        said.contains("ranks 0 and 2 are both on GPU GPU-")
            && said.contains("the placement is cyclic-like")
            && said.contains("--device-rule local-rank"),
        "{}",
        runs[0]
    );
    assert_eq!(said.lines().count(), 1, "one line:\n{}", runs[0]);
    // The same rule as the other lessons', here from its variable.
    let runs = cyclic(&[("NCCL_WORKBOOK_DEVICE_RULE", "local-rank")]);
    for (rank, run) in runs.iter().enumerate() {
        assert_eq!(run.code, Some(0), "{run}");
        let line = format!("rank {rank}: sent {}, got [10.0, 10.0, 10.0, 10.0]", rank + 1);
        assert!(run.stdout.lines().any(|l| l == line), "missing {line:?}:\n{run}");
    }
}

#[test]
fn a_rank_stuck_in_nccl_at_the_deadline_ends_at_once_with_one_line() {
    // Two ranks whose NCCLs never meet (each has its own meeting folder, as if the other
    // never joined): both sit in ncclCommInitRank, which has no deadline. At --timeout,
    // each must say so and exit 1 at once: ending with exit() would run the CUDA
    // runtime's static destructors, which wait for the thread stuck in NCCL (the double
    // plays them).
    let port = free_port();
    let rooms = |r: usize| testkit::nccl_double_dir().with_file_name(format!("rooms-stuck-{}-{r}", std::process::id()));
    let ranks: Vec<Child> = (0..2)
        .map(|r| {
            std::fs::create_dir_all(rooms(r)).unwrap();
            let mut cmd = by_hand(2, r, port, 2, &["--timeout", "2"]);
            cmd.env("NCCL_DOUBLE_DIR", rooms(r));
            spawn(cmd)
        })
        .collect();
    for (rank, child) in ranks.into_iter().enumerate() {
        let (run, in_time) = finish_or_kill(child, Duration::from_secs(30));
        assert!(in_time, "rank {rank} did not end within 30 s of a 2 s deadline:\n{run}");
        assert_eq!(run.code, Some(1), "{run}");
        assert_eq!(run.stderr.lines().count(), 1, "one line:\n{run}");
        assert!(
            run.stderr
                .starts_with(&format!("error: rank {rank}: not done after --timeout 2 s")),
            "{run}"
        );
        let _ = std::fs::remove_dir_all(rooms(rank));
    }
}

#[test]
fn without_nccl_it_says_what_is_missing_and_what_to_do() {
    let r = run(BIN, &[]);
    assert_eq!(r.code, Some(1), "{r}");
    assert_eq!(r.stderr.lines().count(), 1, "{r}");
    assert!(
        r.stderr.contains("the CUDA driver (libcuda.so) is not on this machine"),
        "{r}"
    );
    assert!(r.stderr.contains("--simulate-gpus N"), "{r}");
    let r = run(BIN, &["--backend", "cpu"]);
    assert_eq!(r.code, Some(2), "{r}");
    assert!(r.stderr.contains("this lesson calls NCCL itself"), "{r}");
}

/// NCCL's `NCCL_DEBUG_SUBSYS=COLL` lines in `out`: `host:pid:tid [GPU] NCCL INFO AllReduce: …`.
fn coll_lines(out: &str) -> Vec<&str> {
    out.lines()
        .filter(|l| !l.starts_with("--show-calls") && l.contains("] NCCL INFO AllReduce: opCount "))
        .collect()
}

#[test]
fn show_calls_prints_the_lessons_nccl_calls_as_nccl_reports_them() {
    // Its calls are NCCL's: --show-calls turns on NCCL's own report of each collective
    // (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=COLL), printed here by the double as NCCL does.
    let r = run(BIN, &["--simulate-gpus", "2", "--show-calls", "--count", "6"]).ok();
    let lines = coll_lines(&r.stdout);
    assert_eq!(lines.len(), 2, "one all-reduce per rank:\n{r}");
    for gpu in 0..2 {
        let line = lines
            .iter()
            .find(|l| l.contains(&format!(" [{gpu}] NCCL INFO ")))
            .unwrap_or_else(|| panic!("no line of GPU {gpu}:\n{r}"));
        assert!(
            line.contains("AllReduce: opCount 0 sendbuff 0x")
                && line.contains(" count 6 datatype 7 op 0 root 0 comm 0x")
                && line.ends_with(" [nranks=2] stream (nil)"),
            "{line}"
        );
    }
    assert!(
        r.stdout
            .lines()
            .any(|l| l.starts_with("--show-calls: this lesson calls NCCL itself")),
        "{r}"
    );
    assert!(
        r.stdout
            .lines()
            .any(|l| l.starts_with("rank 1: NCCL's lines for this rank are those of process ")),
        "{r}"
    );
    // One rank's only.
    let r = run(BIN, &["--simulate-gpus", "2", "--show-calls=1"]).ok();
    let lines = coll_lines(&r.stdout);
    assert!(lines.len() == 1 && lines[0].contains(" [1] NCCL INFO "), "{r}");
    // Without the flag, none.
    let r = run(BIN, &["--simulate-gpus", "2"]).ok();
    assert!(coll_lines(&r.stdout).is_empty(), "{r}");
}

#[test]
fn each_rank_ends_as_nccls_examples_do_finalize_then_destroy_never_abort() {
    // cudarc's `Comm` drops with ncclCommAbort: right after this rank's stream is done, it
    // can cut the sends NCCL's proxy thread still owes a peer. The lesson ends each rank
    // with ncclCommFinalize, then ncclCommDestroy; the double records every entry point
    // each process called (NCCL_DOUBLE_TRACE), one file per rank.
    let port = free_port();
    let trace = |r: usize| std::env::temp_dir().join(format!("nccl-workbook-08-trace-{}-{r}", std::process::id()));
    let ranks: Vec<Child> = (0..2)
        .map(|r| {
            let _ = std::fs::remove_file(trace(r));
            let mut cmd = by_hand(2, r, port, 2, &[]);
            cmd.env("NCCL_DOUBLE_TRACE", trace(r));
            spawn(cmd)
        })
        .collect();
    for (rank, child) in ranks.into_iter().enumerate() {
        let run = finish(child, LIMIT).ok();
        let line = format!("rank {rank}: sent {}, got [3.0, 3.0, 3.0, 3.0]", rank + 1);
        assert!(run.stdout.lines().any(|l| l == line), "missing {line:?}:\n{run}");
        let called = std::fs::read_to_string(trace(rank)).unwrap_or_default();
        let _ = std::fs::remove_file(trace(rank));
        let called: Vec<&str> = called.lines().collect();
        let at = |name: &str| called.iter().position(|c| *c == name);
        assert!(
            matches!((at("ncclCommFinalize"), at("ncclCommDestroy")), (Some(f), Some(d)) if f < d),
            "rank {rank}: finalize, then destroy: {called:?}"
        );
        assert_eq!(at("ncclCommAbort"), None, "rank {rank}: no abort: {called:?}");
    }
}
