//! The broadcast example as real multi-process jobs, checked through --format json.

use testkit::{run, stage};

const BIN: &str = env!("CARGO_BIN_EXE_01-nccl-broadcast");

#[test]
fn every_rank_gets_the_roots_buffer_from_every_root() {
    for world in 1..=4usize {
        for root in 0..world {
            for count in [1usize, 7, 1_000_003] {
                let (w, r, c) = (world.to_string(), root.to_string(), count.to_string());
                let out = run(
                    BIN,
                    &[
                        "--nproc-per-node",
                        &w,
                        "--root",
                        &r,
                        "--count",
                        &c,
                        "--iters",
                        "1",
                        "--format",
                        "json",
                    ],
                )
                .ok();
                let j = out.json();
                let ctx = format!("world {world}, root {root}, count {count}: {out}");
                assert_eq!(j["check"]["ok"], true, "{ctx}");
                let shown = count.min(8);
                for (rank, row) in stage(&j, "before").iter().enumerate() {
                    let v = if rank == root { 42.0 } else { 0.0 };
                    assert_eq!(row, &vec![v; shown], "{ctx}");
                }
                for row in stage(&j, "after") {
                    assert_eq!(row, vec![42.0; shown], "{ctx}");
                }
            }
        }
    }
}

#[test]
fn with_init_rank_everyone_ends_with_the_roots_rank_plus_one() {
    let j = run(
        BIN,
        &[
            "--nproc-per-node",
            "3",
            "--root",
            "1",
            "--init",
            "rank",
            "--format",
            "json",
        ],
    )
    .ok()
    .json();
    assert_eq!(stage(&j, "before"), vec![vec![1.0; 4], vec![2.0; 4], vec![3.0; 4]]);
    assert_eq!(stage(&j, "after"), vec![vec![2.0; 4]; 3]);
}

#[test]
fn the_text_output_is_the_courses_table() {
    let r = run(BIN, &["--value", "7"]).ok();
    for line in [
        "Before broadcast:",
        "  CPU 0 | 7 | 7 | 7 | 7 |",
        "  CPU 1 | 0 | 0 | 0 | 0 |",
        "After broadcast:",
        "  CPU 1 | 7 | 7 | 7 | 7 |",
    ] {
        assert!(r.stdout.lines().any(|l| l == line), "missing {line:?} in:\n{r}");
    }
}

#[test]
fn a_root_outside_the_world_is_one_usage_error() {
    let r = run(BIN, &["--nproc-per-node", "3", "--root", "3"]);
    assert_eq!(r.code, Some(2), "{r}");
    assert_eq!(
        r.stderr.trim(),
        "error: rank 0: --root 3 is not a rank: the world has ranks 0 to 2",
        "{r}"
    );
}
