//! A rank that waits long for another inside a collective sleeps: it polls the shared
//! flag only for a few microseconds, then waits on a futex (shared memory) or in the
//! kernel (TCP). One test in this file, so that the CPU time of this process's children
//! is this test's alone.

use std::time::Duration;
use testkit::{LIMIT, children_cpu, command, finish, spawn};

const BIN: &str = env!("CARGO_BIN_EXE_harness-probe");

#[test]
fn a_rank_kept_waiting_three_seconds_spends_well_under_a_second_of_cpu() {
    for via in ["shm", "tcp"] {
        let before = children_cpu();
        let args = [
            "--backend",
            "cpu",
            "--nproc-per-node",
            "2",
            "--transport",
            via,
            "--iters",
            "1",
        ];
        let mut cmd = command(BIN, &args);
        // Rank 1 starts its first all-reduce 3 s late; rank 0 waits for it in there.
        cmd.env("NCCL_WORKBOOK_FAULT", "late:1:3000");
        let r = finish(spawn(cmd), LIMIT).ok();
        let cpu = children_cpu() - before;
        assert!(r.stdout.contains("Check: OK"), "{r}");
        assert!(r.elapsed >= Duration::from_secs(3), "the hook did not hold rank 1: {r}");
        // Spinning through the wait would cost about 3 s of CPU; both ranks, the
        // launcher and their start together stay far below that.
        assert!(
            cpu < Duration::from_secs(1),
            "{via}: {cpu:?} of CPU over {:?}",
            r.elapsed
        );
        eprintln!("{via}: {cpu:?} of CPU over {:?}", r.elapsed);
    }
}
