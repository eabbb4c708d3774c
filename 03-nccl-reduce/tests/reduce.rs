//! The reduce example as real multi-process jobs, checked through --format json: the
//! root holds the reduction, every other rank keeps its own buffer.

use testkit::{LIMIT, OPS, finish, nccl_command, over, run, spawn, stage};

const BIN: &str = env!("CARGO_BIN_EXE_03-nccl-reduce");

/// Checks a JSON report of `world` ranks started with --init rank: before, rank r holds
/// r+1; after, the root holds `op` over them and the others are unchanged.
fn check(j: &serde_json::Value, world: usize, root: usize, op: &str, shown: usize, ctx: &str) {
    assert_eq!(
        (j["world_size"].as_u64(), j["check"]["ok"].as_bool()),
        (Some(world as u64), Some(true)),
        "{ctx}"
    );
    assert_eq!(j["check"]["wrong"], 0, "{ctx}");
    let start: Vec<f64> = (1..=world).map(|v| v as f64).collect();
    let after = stage(j, "after");
    for (rank, row) in stage(j, "before").iter().enumerate() {
        assert_eq!(row, &vec![start[rank]; shown], "before, rank {rank}: {ctx}");
        let want = if rank == root { over(op, &start) } else { start[rank] };
        for v in &after[rank] {
            assert!(
                (v - want).abs() <= 1e-5 * want.abs().max(1.0),
                "after, rank {rank}: {v} not {want}: {ctx}"
            );
        }
        assert_eq!(after[rank].len(), shown, "{ctx}");
    }
}

#[test]
fn the_root_holds_the_reduction_for_every_world_op_and_root() {
    for world in 1..=5usize {
        for (o, op) in OPS.iter().enumerate() {
            let root = (world + o) % world;
            // Odd counts, one smaller than the world, one large; every other run over TCP.
            let count = [1usize, 3, 7, 2, 1_000_003][(world + o) % 5];
            let via = if (world + o) % 2 == 1 { "tcp" } else { "shm" };
            let line = format!(
                "--nproc-per-node {world} --root {root} --op {op} --count {count} --init rank --transport {via} \
                 --iters 1 --format json"
            );
            let args: Vec<&str> = line.split_whitespace().collect();
            let out = run(BIN, &args).ok();
            let j = out.json();
            let ctx = format!("{line}: {out}");
            check(&j, world, root, op, count.min(8), &ctx);
            let pairs = j["transports"].as_object().cloned().unwrap_or_default();
            assert_eq!(pairs.len(), world * (world - 1) / 2, "{ctx}");
            assert!(pairs.values().all(|v| v == via), "{ctx}");
        }
    }
}

#[test]
fn on_the_nccl_double_too() {
    let line = "--backend nccl --nproc-per-node 3 --root 2 --op max --count 7 --init rank --format json";
    let args: Vec<&str> = line.split_whitespace().collect();
    let r = finish(spawn(nccl_command(BIN, &args, 4)), LIMIT).ok();
    let j = r.json();
    assert_eq!(j["backend"], "nccl", "{r}");
    check(&j, 3, 2, "max", 7, &r.to_string());
}

#[test]
fn the_text_output_shows_the_result_on_the_root_only() {
    let r = run(BIN, &["--nproc-per-node", "3", "--root", "1", "--init", "rank"]).ok();
    let after = r.stdout.split("After reduce:").nth(1).expect("an After table");
    for line in [
        "  CPU 0 | 1 | 1 | 1 | 1 |",
        "  CPU 1 | 6 | 6 | 6 | 6 |",
        "  CPU 2 | 3 | 3 | 3 | 3 |",
        "Only the root, rank 1, holds the sum of every rank's buffer; the other ranks' buffers are unchanged.",
        "Check: OK, all 3 ranks hold the expected values in all 4 elements",
    ] {
        assert!(after.lines().any(|l| l == line), "missing {line:?} in:\n{r}");
    }
    assert!(
        r.stdout.contains("Before reduce:\n") && r.stdout.contains("Time: "),
        "{r}"
    );
}

#[test]
fn a_root_outside_the_world_or_an_unknown_op_is_one_usage_error() {
    let r = run(BIN, &["--nproc-per-node", "3", "--root", "9"]);
    assert_eq!(r.code, Some(2), "{r}");
    assert_eq!(
        r.stderr.trim(),
        "error: rank 0: --root 9 is not a rank: the world has ranks 0 to 2",
        "{r}"
    );
    let r = run(BIN, &["--op", "mean"]);
    assert_eq!(r.code, Some(2), "{r}");
    assert_eq!(r.stderr.lines().count(), 1, "{r}");
    assert!(r.stderr.contains("[possible values: sum, prod, max, min, avg]"), "{r}");
}
