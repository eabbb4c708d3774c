//! What NCCL 2.18 to 2.30 really do on the paths a cluster job takes, read in NCCL's
//! sources and played by the test double (`NCCL_DOUBLE_VERSION` picks the version):
//! real processes, one rank each, through cudarc's real loading path.

use std::process::Command;
use testkit::{LIMIT, Run, finish, nccl_command, spawn};

const BIN: &str = env!("CARGO_BIN_EXE_harness-probe");

/// `world` ranks of the probe (an all-reduce) on the double, playing NCCL `version` (a version code).
fn job(version: &str, world: usize, args: &[&str]) -> Command {
    let w = world.to_string();
    let mut all = vec!["--backend", "nccl", "--nproc-per-node", &w];
    all.extend_from_slice(args);
    let mut cmd = nccl_command(BIN, &all, world.max(1));
    cmd.env("NCCL_DOUBLE_VERSION", version);
    cmd
}

// ---------------------------------------------------------------------------------
// ncclConfig_t: NCCL copies `size` bytes of it. Up to 2.25 the struct has 4 bytes of
// padding at its end, which NCCL 2.26 reads as `trafficClass` with no version guard.

#[test]
fn the_config_gives_nccl_only_its_declared_fields_so_2_26_reads_no_traffic_class() {
    for version in ["21803", "22602", "22703"] {
        let run: Run = finish(spawn(job(version, 2, &["--format", "json"])), LIMIT);
        assert!(
            !run.stderr.contains("trafficClass"),
            "NCCL {version} was handed the config's padding as a field:\n{run}"
        );
        let run = run.ok();
        assert_eq!(run.json()["check"]["wrong"], 0, "{run}");
    }
}

// ---------------------------------------------------------------------------------
// A deadline is "nothing finished for --timeout", not "the queued work took longer".

#[test]
fn a_queue_longer_than_the_timeout_that_progresses_throughout_is_not_a_timeout() {
    // 2 s of --timeout, and every all-reduce takes 20 ms on the double (NCCL_DOUBLE_WORK_US):
    // the timed loop queues 150 of them before it waits, 3 s of work in all, finishing
    // one every 20 ms. Operations of 1 MiB or more each get an event; smaller ones one in 16.
    for size in ["1M", "4K"] {
        let args = ["--size", size, "--iters", "150", "--timeout", "2", "--format", "json"];
        let mut cmd = job("21803", 2, &args);
        cmd.env("NCCL_DOUBLE_WORK_US", "20000");
        let started = std::time::Instant::now();
        let run = finish(spawn(cmd), LIMIT);
        let took = started.elapsed();
        let run = run.ok();
        assert_eq!(run.json()["check"]["wrong"], 0, "{run}");
        // Only meaningful if the queue did outlast the timeout.
        assert!(
            took > std::time::Duration::from_secs(3),
            "{size}: the job took only {took:?}: make it longer"
        );
    }
}
