//! The all-to-all example as real multi-process jobs, checked through --format json:
//! block j of rank i ends as block i of rank j, in place and out of place.

use testkit::{LIMIT, finish, nccl_command, run, spawn, stage};

const BIN: &str = env!("CARGO_BIN_EXE_06-nccl-alltoall");

/// Checks a report of `world` ranks: block j of rank i held 10·i + j (100·i + j beyond 10
/// ranks; `shown` elements of each block); afterwards block i of rank j holds it.
fn check(j: &serde_json::Value, world: usize, shown: usize, ctx: &str) {
    let scale = if world <= 10 { 10 } else { 100 };
    assert_eq!(j["world_size"], world, "{ctx}");
    assert_eq!(
        (j["check"]["ok"].as_bool(), j["check"]["wrong"].as_u64()),
        (Some(true), Some(0)),
        "{ctx}"
    );
    let blocks =
        |f: &dyn Fn(usize) -> usize| -> Vec<f64> { (0..world).flat_map(|b| vec![f(b) as f64; shown]).collect() };
    let after = stage(j, "after");
    for (rank, row) in stage(j, "before").iter().enumerate() {
        assert_eq!(row, &blocks(&|to| scale * rank + to), "before, rank {rank}: {ctx}");
        assert_eq!(
            after[rank],
            blocks(&|from| scale * from + rank),
            "after, rank {rank}: {ctx}"
        );
    }
}

#[test]
fn block_j_of_rank_i_goes_to_rank_j_for_every_world_in_and_out_of_place() {
    for world in 1..=5usize {
        for in_place in [false, true] {
            // Odd counts, one smaller than the world, one large; every other run over TCP.
            let i = world + in_place as usize;
            let count = [1usize, 3, 7, 2, 333_333][(world + 2 * in_place as usize) % 5];
            let via = if i % 2 == 1 { "tcp" } else { "shm" };
            let place = if in_place { "--in-place" } else { "" };
            let line =
                format!("--nproc-per-node {world} --count {count} {place} --transport {via} --iters 1 --format json");
            let r = run(BIN, &line.split_whitespace().collect::<Vec<_>>()).ok();
            let (j, ctx) = (r.json(), format!("{line}: {r}"));
            check(&j, world, count.min(8), &ctx);
            let pairs = j["transports"].as_object().cloned().unwrap_or_default();
            assert_eq!(pairs.len(), world * (world - 1) / 2, "{ctx}");
            assert!(pairs.values().all(|v| v == via), "{ctx}");
        }
    }
}

#[test]
fn beyond_ten_ranks_the_sender_is_the_hundreds() {
    let r = run(
        BIN,
        &[
            "--nproc-per-node",
            "11",
            "--count",
            "1",
            "--iters",
            "1",
            "--format",
            "json",
        ],
    )
    .ok();
    check(&r.json(), 11, 1, &r.to_string());
}

#[test]
fn on_the_nccl_double_too() {
    for place in ["", "--in-place"] {
        let line = format!("--backend nccl --nproc-per-node 3 --count 5 {place} --format json");
        let args: Vec<&str> = line.split_whitespace().collect();
        let r = finish(spawn(nccl_command(BIN, &args, 4)), LIMIT).ok();
        let j = r.json();
        assert_eq!(j["backend"], "nccl", "{r}");
        check(&j, 3, 5, &r.to_string());
    }
}

#[test]
fn the_text_output_says_where_each_block_goes_and_comes_from() {
    let r = run(BIN, &["--nproc-per-node", "3", "--count", "1"]).ok();
    for line in [
        "Before all-to-all (send buffers):",
        "        | to rank 0 | to rank 1 | to rank 2 |",
        "  CPU 1 | 10        | 11        | 12        |",
        "After all-to-all (receive buffers):",
        "        | from rank 0 | from rank 1 | from rank 2 |",
        "  CPU 1 | 1           | 11          | 21          |",
        "Block j of rank i went to rank j, as its block i: the blocks were transposed.",
        "Check: OK, all 3 ranks hold the expected values in all 3 elements",
    ] {
        assert!(r.stdout.lines().any(|l| l == line), "missing {line:?} in:\n{r}");
    }
}

#[test]
fn a_bad_transport_is_one_usage_error() {
    let r = run(BIN, &["--transport", "pigeon"]);
    assert_eq!(r.code, Some(2), "{r}");
    assert_eq!(r.stderr.lines().count(), 1, "{r}");
    assert!(r.stderr.contains("invalid value 'pigeon' for '--transport"), "{r}");
}
