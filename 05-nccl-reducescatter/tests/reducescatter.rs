//! The reduce-scatter example as real multi-process jobs, checked through --format json:
//! rank b ends with the reduction of every rank's block b, for every operator, in place
//! and out of place.

use testkit::{LIMIT, OPS, finish, nccl_command, over, run, spawn, stage};

const BIN: &str = env!("CARGO_BIN_EXE_05-nccl-reducescatter");

/// Checks a report of `world` ranks: block b of rank r held (r+1)(b+1); afterwards rank
/// r's shard (out of place) or its block r (in place) holds `op` over every rank's block r.
fn check(j: &serde_json::Value, world: usize, op: &str, shown: usize, in_place: bool, ctx: &str) {
    assert_eq!(j["world_size"], world, "{ctx}");
    assert_eq!(
        (j["check"]["ok"].as_bool(), j["check"]["wrong"].as_u64()),
        (Some(true), Some(0)),
        "{ctx}"
    );
    let value = |r: usize, b: usize| ((r + 1) * (b + 1)) as f64;
    let shard = |b: usize| over(op, &(0..world).map(|r| value(r, b)).collect::<Vec<_>>());
    let blocks = |f: &dyn Fn(usize) -> f64| -> Vec<f64> { (0..world).flat_map(|b| vec![f(b); shown]).collect() };
    let after = stage(j, "after");
    for (rank, row) in stage(j, "before").iter().enumerate() {
        assert_eq!(row, &blocks(&|b| value(rank, b)), "before, rank {rank}: {ctx}");
        let want = if in_place {
            blocks(&|b| if b == rank { shard(rank) } else { value(rank, b) })
        } else {
            vec![shard(rank); shown]
        };
        assert_eq!(after[rank].len(), want.len(), "after, rank {rank}: {ctx}");
        for (got, want) in after[rank].iter().zip(&want) {
            assert!(
                (got - want).abs() <= 1e-5 * want.max(1.0),
                "after, rank {rank}: {got} not {want}: {ctx}"
            );
        }
    }
}

#[test]
fn rank_b_gets_the_reduction_of_block_b_for_every_world_and_op() {
    for world in 1..=5usize {
        for (o, op) in OPS.iter().enumerate() {
            // Both forms and both transports for every op and world size; odd counts,
            // one smaller than the world, and a large one.
            let i = world + o;
            let count = [1usize, 3, 7, 2, 333_333][i % 5];
            let place = if i % 2 == 0 { "--in-place" } else { "" };
            let via = if (i / 2) % 2 == 1 { "tcp" } else { "shm" };
            let line = format!(
                "--nproc-per-node {world} --op {op} --count {count} {place} --transport {via} --iters 1 --format json"
            );
            let r = run(BIN, &line.split_whitespace().collect::<Vec<_>>()).ok();
            let (j, ctx) = (r.json(), format!("{line}: {r}"));
            check(&j, world, op, count.min(8), !place.is_empty(), &ctx);
            let pairs = j["transports"].as_object().cloned().unwrap_or_default();
            assert_eq!(pairs.len(), world * (world - 1) / 2, "{ctx}");
            assert!(pairs.values().all(|v| v == via), "{ctx}");
        }
    }
}

#[test]
fn on_the_nccl_double_too() {
    for (op, place) in [("sum", ""), ("avg", "--in-place")] {
        let line = format!("--backend nccl --nproc-per-node 4 --op {op} --count 3 {place} --format json");
        let args: Vec<&str> = line.split_whitespace().collect();
        let r = finish(spawn(nccl_command(BIN, &args, 4)), LIMIT).ok();
        let j = r.json();
        assert_eq!(j["backend"], "nccl", "{r}");
        check(&j, 4, op, 3, !place.is_empty(), &r.to_string());
    }
}

#[test]
fn the_text_output_labels_each_block_with_the_rank_it_goes_to() {
    let r = run(BIN, &["--nproc-per-node", "3", "--count", "1"]).ok();
    for line in [
        "Before reduce-scatter:",
        "        | block 0 → rank 0 | block 1 → rank 1 | block 2 → rank 2 |",
        "  CPU 2 | 3                | 6                | 9                |",
        "After reduce-scatter (each rank's shard):",
        "  CPU 0 | 6  |",
        "  CPU 2 | 18 |",
        "Rank b holds the sum of every rank's block b.",
        "Check: OK, all 3 ranks hold the expected values in their one element",
    ] {
        assert!(r.stdout.lines().any(|l| l == line), "missing {line:?} in:\n{r}");
    }
}

#[test]
fn an_unknown_op_is_one_usage_error() {
    let r = run(BIN, &["--op", "mean"]);
    assert_eq!(r.code, Some(2), "{r}");
    assert_eq!(r.stderr.lines().count(), 1, "{r}");
    assert!(r.stderr.contains("invalid value 'mean' for '--op <OP>'"), "{r}");
}
