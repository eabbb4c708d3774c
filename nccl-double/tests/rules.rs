//! The double enforces the rules of the real CUDA driver and NCCL: each test breaks one
//! on purpose, through cudarc, in real processes (one per rank), and checks the error.

use testkit::{LIMIT, Run, finish, nccl_command, spawn};

const PROBE: &str = env!("CARGO_BIN_EXE_nccl-double-probe");

/// Runs `world` ranks of the probe on `case`; returns each rank's run.
fn ranks(case: &str, world: usize) -> Vec<Run> {
    let file = std::env::temp_dir().join(format!("nccl-double-id-{case}-{}", std::process::id()));
    let _ = std::fs::remove_file(&file);
    let file = file.to_string_lossy().into_owned();
    let children: Vec<_> = (0..world)
        .map(|r| {
            let mut cmd = nccl_command(PROBE, &[case, &r.to_string(), &world.to_string(), &file], 4);
            cmd.env("NCCL_DOUBLE_TIMEOUT_S", "10");
            spawn(cmd)
        })
        .collect();
    let runs = children.into_iter().map(|c| finish(c, LIMIT)).collect();
    let _ = std::fs::remove_file(&file);
    runs
}

fn all_fail_with(runs: &[Run], code: &str, text: &str) {
    let all: String = runs.iter().map(|r| r.to_string()).collect();
    for r in runs {
        assert_eq!(r.code, Some(1), "{all}");
        assert!(r.stdout.starts_with("error: nccl"), "{all}");
    }
    assert!(
        runs.iter().any(|r| r.stdout.contains(code) && r.stdout.contains(text)),
        "no rank says {code}: {text}\n{all}"
    );
}

#[test]
fn a_correct_program_works_on_2_and_4_ranks() {
    for world in [2, 4] {
        let sum = (world * (world + 1) / 2) as f32;
        for r in ranks("all-reduce", world) {
            assert_eq!(r.stdout.trim(), format!("ok {:?}", vec![sum; 4]), "{r}");
        }
    }
}

#[test]
fn rule_a_context_must_be_current_on_the_thread() {
    all_fail_with(
        &ranks("no-context", 2),
        "ncclInvalidUsage",
        "no CUDA context current on this thread",
    );
}

#[test]
fn rule_ranks_must_agree_on_the_world() {
    all_fail_with(&ranks("world-mismatch", 2), "ncclInvalidArgument", "joined a world of");
    let runs = ranks("same-rank", 2);
    let all: String = runs.iter().map(|r| r.to_string()).collect();
    assert!(runs.iter().all(|r| r.code == Some(1)), "{all}");
    assert!(all.contains("two processes claim the same rank"), "{all}");
}

#[test]
fn rule_every_rank_calls_the_same_collective() {
    all_fail_with(&ranks("count-mismatch", 2), "ncclInvalidUsage", "collective mismatch");
    all_fail_with(&ranks("root-mismatch", 3), "ncclInvalidUsage", "collective mismatch");
}

#[test]
fn rule_buffers_are_device_memory() {
    all_fail_with(&ranks("host-memory", 2), "ncclInvalidArgument", "is not device memory");
}

#[test]
fn cudarc_loads_the_double_only_through_the_path() {
    let mut cmd = testkit::command(PROBE, &["all-reduce", "0", "1", "/nonexistent/id"]);
    cmd.env("NCCL_DOUBLE", "1").env("LD_LIBRARY_PATH", "/nonexistent");
    let r = finish(spawn(cmd), LIMIT);
    assert_ne!(r.code, Some(0), "the probe ran without the double on its path:\n{r}");
}
