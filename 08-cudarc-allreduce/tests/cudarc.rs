//! Lesson 08 calls cudarc's NCCL API itself: run it on simulated GPUs and on the NCCL
//! test double, and where NCCL cannot run. Real processes.

use testkit::{LIMIT, finish, nccl_command, run, spawn};

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
fn more_ranks_than_gpus_share_them_by_the_courses_rule_and_nccl_refuses() {
    // 3 ranks on 2 GPUs: ranks 0 and 2 on GPU 0, which NCCL refuses (duplicate GPU).
    let r = finish(spawn(nccl_command(BIN, &["--nproc-per-node", "3"], 2)), LIMIT);
    assert_eq!(r.code, Some(1), "{r}");
    assert!(r.stderr.contains("NCCL failed in ncclCommInitRank with"), "{r}");
    assert!(!r.stderr.contains("panicked"), "{r}");
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
