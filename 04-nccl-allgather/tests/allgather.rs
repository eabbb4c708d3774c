//! The all-gather example as real multi-process jobs, checked through --format json:
//! every rank ends with every rank's block, in rank order, in place and out of place.

use testkit::{LIMIT, finish, nccl_command, run, spawn, stage};

const BIN: &str = env!("CARGO_BIN_EXE_04-nccl-allgather");

/// Runs `line` (flags, split at spaces) and returns its JSON report and a context for messages.
fn json(line: &str) -> (serde_json::Value, String) {
    let args: Vec<&str> = line.split_whitespace().collect();
    let r = run(BIN, &args).ok();
    (r.json(), format!("{line}: {r}"))
}

/// Checks a report of `world` ranks: rank r sent r+1, and every rank's receive buffer
/// shows block b filled with b+1 (`shown` elements of each block).
fn check(j: &serde_json::Value, world: usize, shown: usize, in_place: bool, ctx: &str) {
    assert_eq!(j["world_size"], world, "{ctx}");
    assert_eq!(
        (j["check"]["ok"].as_bool(), j["check"]["wrong"].as_u64()),
        (Some(true), Some(0)),
        "{ctx}"
    );
    let blocks = |f: &dyn Fn(usize) -> f64| -> Vec<f64> { (0..world).flat_map(|b| vec![f(b); shown]).collect() };
    for (rank, row) in stage(j, "before").iter().enumerate() {
        let mine = (rank + 1) as f64;
        let want = if in_place {
            blocks(&|b| if b == rank { mine } else { 0.0 })
        } else {
            vec![mine; shown]
        };
        assert_eq!(row, &want, "before, rank {rank}: {ctx}");
    }
    for (rank, row) in stage(j, "after").iter().enumerate() {
        assert_eq!(row, &blocks(&|b| (b + 1) as f64), "after, rank {rank}: {ctx}");
    }
}

#[test]
fn every_rank_gets_every_block_for_every_world_in_and_out_of_place() {
    for world in 1..=5usize {
        for in_place in [false, true] {
            // Odd counts, one smaller than the world, one large; every other run over TCP.
            let i = world + in_place as usize;
            let count = [1usize, 3, 7, 2, 333_333][i % 5];
            let via = if i % 2 == 1 { "tcp" } else { "shm" };
            let place = if in_place { "--in-place" } else { "" };
            let (j, ctx) = json(&format!(
                "--nproc-per-node {world} --count {count} {place} --transport {via} --iters 1 --format json"
            ));
            check(&j, world, count.min(8), in_place, &ctx);
            assert_eq!(j["count"], count, "{ctx}");
            let pairs = j["transports"].as_object().cloned().unwrap_or_default();
            assert_eq!(pairs.len(), world * (world - 1) / 2, "{ctx}");
            assert!(pairs.values().all(|v| v == via), "{ctx}");
        }
    }
}

#[test]
fn on_the_nccl_double_too() {
    for place in ["", "--in-place"] {
        let line = format!("--backend nccl --nproc-per-node 3 --count 5 {place} --format json");
        let args: Vec<&str> = line.split_whitespace().collect();
        let r = finish(spawn(nccl_command(BIN, &args, 4)), LIMIT).ok();
        let j = r.json();
        assert_eq!(j["backend"], "nccl", "{r}");
        check(&j, 3, 5, !place.is_empty(), &r.to_string());
    }
}

#[test]
fn the_text_output_names_the_rank_each_block_came_from() {
    let r = run(BIN, &[]).ok();
    let after = r.stdout.split("After all-gather (each rank's receive buffer):").nth(1);
    let after = after.expect("an After table");
    for line in [
        "        | from rank 0   | from rank 1   |",
        "  CPU 0 | 1 | 1 | 1 | 1 | 2 | 2 | 2 | 2 |",
        "  CPU 1 | 1 | 1 | 1 | 1 | 2 | 2 | 2 | 2 |",
        "Every rank holds the same buffer: block b is what rank b sent.",
        "Check: OK, all 2 ranks hold the expected values in all 8 elements",
    ] {
        assert!(after.lines().any(|l| l == line), "missing {line:?} in:\n{r}");
    }
    assert!(
        r.stdout.contains("  CPU 1 | 2 | 2 | 2 | 2 |\n"),
        "the send buffers: {r}"
    );
    assert!(
        r.stdout.contains("Time: ") && r.stdout.contains("factor for all_gather on 2 ranks)"),
        "{r}"
    );
}

#[test]
fn a_count_of_zero_is_one_usage_error() {
    let r = run(BIN, &["--count", "0"]);
    assert_eq!(r.code, Some(2), "{r}");
    assert_eq!(r.stderr.lines().count(), 1, "{r}");
    assert!(
        r.stderr.starts_with("error: invalid value '0' for '--count <N>'"),
        "{r}"
    );
}
