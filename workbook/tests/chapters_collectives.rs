//! What EXERCISES.md says "you will see", run and checked chapter by chapter, on the real
//! binaries as multi-process jobs (the examples, and the reference solutions standing in
//! for a student's finished code).
//!
//! This file: the collectives. Broadcast, all-reduce and the ring (chapters 2, 3, 5), the
//! benchmark's columns (6), the packed broadcast and groups (7, 13), the sharded step (8),
//! overlap (14).
//! Where ranks run (devices, nodes, split communicators) is in chapters_ranks.rs.

mod support;

use support::built;
use testkit::{run, stage};

#[test]
fn chapter_2_the_root_is_unchanged_and_everyone_ends_with_its_value() {
    let bcast = built("01-nccl-broadcast");
    let bcast = bcast.to_str().unwrap();
    let args = [
        "--nproc-per-node",
        "4",
        "--root",
        "2",
        "--value",
        "7",
        "--format",
        "json",
    ];
    let j = run(bcast, &args).ok().json();
    let before = stage(&j, "before");
    assert_eq!(before, [[0.0; 4], [0.0; 4], [7.0; 4], [0.0; 4]]);
    assert_eq!(stage(&j, "after"), vec![vec![7.0; 4]; 4]);
    assert_eq!(stage(&j, "after")[2], before[2], "the root's row is unchanged");
    // On a terminal, the root's cells are not marked as changed; the others' are.
    let r = run(
        bcast,
        &[
            "--nproc-per-node",
            "4",
            "--root",
            "2",
            "--value",
            "7",
            "--color",
            "always",
        ],
    )
    .ok();
    let after = r.stdout.split("After broadcast:").nth(1).unwrap();
    let row = |rank: usize| {
        after
            .lines()
            .find(|l| l.starts_with(&format!("  CPU {rank} |")))
            .unwrap()
    };
    assert!(!row(2).contains('\u{1b}'), "{r}");
    assert!(row(0).contains("\u{1b}[1;32m7"), "{r}");

    let j = run(
        bcast,
        &[
            "--nproc-per-node",
            "4",
            "--root",
            "2",
            "--init",
            "rank",
            "--format",
            "json",
        ],
    )
    .ok()
    .json();
    assert_eq!(stage(&j, "before"), [[1.0; 4], [2.0; 4], [3.0; 4], [4.0; 4]]);
    assert_eq!(stage(&j, "after"), vec![vec![3.0; 4]; 4]);

    let r = run(bcast, &["--nproc-per-node", "4", "--root", "4"]);
    assert_eq!(r.code, Some(2), "{r}");
    assert!(
        r.stderr
            .contains("error: rank 0: --root 4 is not a rank: the world has ranks 0 to 3"),
        "{r}"
    );
}

#[test]
fn chapter_3_the_sum_is_n_n_plus_1_over_2_and_the_average_n_plus_1_over_2() {
    let allreduce = built("02-nccl-allreduce");
    for n in [4usize, 5] {
        let args = ["--nproc-per-node", &n.to_string(), "--init", "rank", "--format", "json"];
        let j = run(allreduce.to_str().unwrap(), &args).ok().json();
        assert_eq!(stage(&j, "after"), vec![vec![(n * (n + 1) / 2) as f64; 4]; n]);
    }
    // A finished exercise 3 (the solution stands in for it): the third table.
    let average = built("sol03-average");
    let r = run(average.to_str().unwrap(), &["--nproc-per-node", "4", "--init", "rank"]).ok();
    let table = r.stdout.split("Average (sum / 4):").nth(1).expect("the third table");
    for rank in 0..4 {
        let line = format!("  CPU {rank} | 2.5 | 2.5 | 2.5 | 2.5 |");
        assert!(table.lines().any(|l| l == line), "missing {line:?}:\n{r}");
    }
}

#[test]
fn chapter_5_a_ring_that_sends_first_deadlocks_on_large_chunks_only() {
    let ring = built("sol05-ring-allreduce");
    let ring = ring.to_str().unwrap();
    let ok = run(
        ring,
        &[
            "--nproc-per-node",
            "3",
            "--count",
            "100003",
            "--send-first",
            "--format",
            "json",
        ],
    )
    .ok();
    assert_eq!(ok.json()["check"]["ok"], true, "{ok}");
    let args = [
        "--nproc-per-node",
        "3",
        "--count",
        "8000000",
        "--send-first",
        "--timeout",
        "3",
        "--iters",
        "1",
    ];
    let r = run(ring, &args);
    assert_eq!(r.code, Some(1), "{r}");
    // Each rank's line says which send waits for which rank, and that this rank is sending
    // too (the accounts of the session's point-to-point calls), then what its link saw.
    let stuck = r.stderr.lines().any(|l| {
        (0..3).any(|rank| {
            let right = (rank + 1) % 3;
            l.starts_with(&format!(
                "error: rank {rank}: its send of 10.2 MiB to rank {right} is not received: rank {right} is in a \
                 send too, to rank {}",
                (right + 1) % 3
            )) && l.contains(": sending 266666")
                && l.contains(&format!("elements to (rank {right} "))
                && l.ends_with(&format!(
                    "nothing moved to or from rank {right} for the whole --timeout: it is stuck or gone"
                ))
        })
    });
    assert!(stuck, "{r}");
}

#[test]
fn chapter_7c_a_group_is_the_same_876_broadcasts_in_3_nccl_groups_and_the_cpu_backend_says_what_it_did() {
    let sync = built("sol07-packed-broadcast");
    let sync = sync.to_str().unwrap();
    let args = [
        "--simulate-gpus",
        "2",
        "--show-calls",
        "--iters",
        "1",
        "--method",
        "group",
    ];
    let r = run(sync, &args).ok();
    let count = |f: &str| {
        r.stdout
            .lines()
            .filter(|l| l.starts_with(&format!("rank 0 │ {f}(")))
            .count()
    };
    assert_eq!(
        (count("ncclBroadcast"), count("ncclGroupStart"), count("ncclGroupEnd")),
        (876, 3, 3),
        "{r}"
    );
    // The Group: lines the chapter shows, at --hidden 8 and 128.
    for (hidden, line) in [
        (
            "8",
            "Group: 292 broadcasts (float, root 0) packed into one broadcast of 121.1 KiB",
        ),
        (
            "128",
            "Group: 292 broadcasts (float, root 0): 194 under 64.0 KiB packed into one of 157.0 KiB, 98 of 64.0 KiB \
             or more run as they are (18.6 MiB)",
        ),
    ] {
        let args = [
            "--nproc-per-node",
            "2",
            "--iters",
            "1",
            "--method",
            "group",
            "--hidden",
            hidden,
        ];
        let r = run(sync, &args).ok();
        assert!(r.stdout.lines().any(|l| l == line), "no {line:?}:\n{r}");
    }
}

#[test]
fn chapter_13_without_its_group_the_all_to_all_deadlocks_on_large_blocks_and_each_rank_says_why() {
    let bin = built("sol13-grouped-alltoall");
    let bin = bin.to_str().unwrap();
    // Small blocks fit in the links: the sends return, and the receives find them.
    run(
        bin,
        &["--nproc-per-node", "3", "--count", "7", "--no-group", "--iters", "1"],
    )
    .ok();
    // In a group, blocks larger than a link holds go through.
    let r = run(bin, &["--nproc-per-node", "3", "--count", "1000000", "--iters", "1"]).ok();
    assert!(
        r.stdout.lines().any(|l| l
            == "Group: 2 sends and 2 receives progressed together (the sends to 2 ranks on threads of their own \
                while this one receives)"),
        "{r}"
    );
    // Without it, every rank waits in its first send.
    let args = [
        "--nproc-per-node",
        "3",
        "--count",
        "1000000",
        "--no-group",
        "--timeout",
        "5",
        "--iters",
        "1",
    ];
    let r = run(bin, &args);
    assert_eq!(r.code, Some(1), "{r}");
    let said = "error: rank 0: its send of 3.8 MiB to rank 1 is not received: rank 1 is in a send too, to rank 0 (a \
                deadlock: past the link's buffer a send returns only once its receiver takes it, as NCCL's does past \
                its eager size; issue the sends and receives together, in one group: session.group()): sending \
                1000000 elements to (rank 1 over shared memory): ";
    assert!(r.stderr.lines().any(|l| l.starts_with(said)), "{r}");
    // Simulated GPUs have no eager size: without the group, even 7 elements wait.
    let args = [
        "--simulate-gpus",
        "3",
        "--count",
        "7",
        "--no-group",
        "--timeout",
        "3",
        "--iters",
        "1",
    ];
    let r = run(bin, &args);
    assert_eq!(r.code, Some(1), "{r}");
    assert!(
        r.stderr.lines().any(|l| l.starts_with(
            "error: rank 0: nothing finished in 3 s (--timeout) waiting for the GPU to finish send to rank 1 \
             (ncclSend)"
        )),
        "{r}"
    );
}

#[test]
fn chapter_7_one_broadcast_per_tensor_is_292_nccl_calls_and_one_packed_is_one() {
    // What makes the packed broadcast faster, counted rather than timed (a test asserts no
    // time): the NCCL calls rank 0 makes, shown by --show-calls on simulated GPUs, for the
    // checked step, the timed loop's warm-up and one timed step.
    let sync = built("sol07-packed-broadcast");
    let calls = |method: &str| {
        let args = [
            "--simulate-gpus",
            "2",
            "--show-calls",
            "--iters",
            "1",
            "--method",
            method,
        ];
        let r = run(sync.to_str().unwrap(), &args).ok();
        r.stdout
            .lines()
            .filter(|l| l.starts_with("rank 0 │ ncclBroadcast("))
            .count()
    };
    assert_eq!((calls("each"), calls("packed")), (3 * 292, 3));
    let r = run(sync.to_str().unwrap(), &["--nproc-per-node", "2", "--iters", "1"]).ok();
    assert!(
        r.stdout
            .contains("Model: 292 tensors, 30992 parameters (0.1 MiB), from 8 to 8000 elements each"),
        "{r}"
    );
}

#[test]
fn chapter_8_the_sharded_step_matches_the_plain_one_and_the_bus_factors() {
    // A finished exercise 8 (the solution stands in for it), 7 parameters on 4 ranks.
    let sharded = built("sol08-sharded-update");
    let r = run(sharded.to_str().unwrap(), &["--nproc-per-node", "4", "--count", "7"]).ok();
    assert!(r.stdout.contains("7 parameters + 1 of padding = 4 shards of 2"), "{r}");
    for title in [
        "Expected: the plain step (all-reduce, every rank updates everything):",
        "After the sharded step:",
    ] {
        let table = r.stdout.split(title).nth(1).expect(title).split("\n\n").next().unwrap();
        for rank in 0..4 {
            let line = format!("  CPU {rank} | 0.375 | 0.75 | 1.125 | 1.5 | 1.875 | 2.25 | 2.625 | 0 |");
            assert!(table.lines().any(|l| l == line), "{title} {line:?}:\n{r}");
        }
    }
    // The benchmark's factors on 4 ranks: 2(n-1)/n for all_reduce, (n-1)/n for the pair.
    let perf = built("07-nccl-perf");
    for (op, factor) in [
        ("all_reduce", "1.500"),
        ("reduce_scatter", "0.750"),
        ("all_gather", "0.750"),
    ] {
        let args = ["--coll", op, "-b", "1K", "-e", "1K", "--nproc-per-node", "4"];
        let r = run(perf.to_str().unwrap(), &args).ok();
        let header = format!("# {op} (");
        assert!(
            r.stdout
                .lines()
                .any(|l| l.starts_with(&header) && l.ends_with(&format!("busbw = algbw × {factor}"))),
            "{r}"
        );
    }
}
/// EXERCISES.md 6, against the benchmark: rows whose algbw is size / time, whose busbw is
/// algbw × 2(n-1)/n, with no wrong element, and a time that is flat at small sizes and
/// grows with the size at large ones.
#[test]
fn chapter_6_the_benchmark_columns_and_the_turn_from_latency_to_bandwidth() {
    let perf = built("07-nccl-perf");
    let args = [
        "--coll",
        "all-reduce",
        "-b",
        "4",
        "-e",
        "16M",
        "-f",
        "4",
        "--nproc-per-node",
        "2",
    ];
    let r = run(perf.to_str().unwrap(), &args).ok();
    let rows: Vec<Vec<f64>> = r
        .stdout
        .lines()
        .filter(|l| !l.trim_start().starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            l.split_whitespace()
                .filter_map(|w| w.parse().ok())
                .collect::<Vec<f64>>()
        })
        .filter(|nums| nums.len() >= 10)
        .collect();
    assert!(rows.len() >= 10, "4 B to 16 MiB by 4: {r}");
    for row in &rows {
        // size, count (type, redop: words; root: a number or not), then out of place:
        // time, algbw, busbw, #wrong; then the same four in place.
        let out = &row[row.len() - 8..];
        let (size, time, algbw, busbw, wrong) = (row[0], out[0], out[1], out[2], out[3]);
        let want = size / time / 1e3;
        assert!(
            (algbw - want).abs() <= 0.011 + 0.02 * want,
            "algbw {algbw} vs {want}: {r}"
        );
        assert!(
            (busbw - algbw).abs() <= 0.011 + 0.02 * algbw,
            "2 ranks: busbw = algbw: {r}"
        );
        assert_eq!(wrong, 0.0, "{r}");
    }
    let (first, last) = (&rows[0], rows.last().unwrap());
    let (first, last) = (&first[first.len() - 8..], &last[last.len() - 8..]);
    assert!(last[0] > 10.0 * first[0], "16 MiB takes far longer than 4 B: {r}");
    assert!(last[1] > first[1], "large sizes reach a higher algbw: {r}");
    assert!(r.stdout.contains("# Avg bus bandwidth"), "{r}");
}

#[test]
fn chapter_14_buckets_are_issued_as_their_layers_end_and_the_one_all_reduce_after_the_backward() {
    // Lesson 10 on two emulated nodes over a link, as the chapter runs it (2 steps a way).
    let lesson = built("10-nccl-overlap");
    let lesson = lesson.to_str().unwrap();
    let runs = testkit::two_nodes(|node, job| {
        let args = [
            job,
            &["--nproc-per-node", "1", "--link", "50us,10Gbps", "--iters", "2"][..],
        ]
        .concat();
        let mut cmd = testkit::command(lesson, &args);
        cmd.env("SLURMD_NODENAME", format!("node{node}"));
        cmd
    });
    let j = runs[0].json();
    assert_eq!(j["check"]["ok"], true, "{}", runs[0]);
    // The streams: 2 steps of each way, in order. The default model: 8 layers of 3 MiB,
    // buckets of 4 MiB or a little more: 7, the first ready once 2 layers are computed.
    let streams = j["streams"].as_array().expect("the streams");
    let (after, buckets) = (&streams[1], &streams[3]);
    let times = |s: &serde_json::Value, what: &str| -> Vec<f64> {
        s["collectives"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c[what].as_f64().unwrap())
            .collect()
    };
    let computing: Vec<Vec<f64>> = serde_json::from_value(buckets["computing"].clone()).unwrap();
    let issued = times(buckets, "issued");
    assert_eq!(issued.len(), 7, "{buckets}");
    // Bucket 1 is issued after layers 8 and 7, before layer 6 starts computing.
    assert!(
        issued[0] >= computing[1][1] && issued[0] <= computing[2][0],
        "{buckets}"
    );
    // The one all-reduce after the backward: issued once every layer is computed.
    let last: Vec<Vec<f64>> = serde_json::from_value(after["computing"].clone()).unwrap();
    assert_eq!(times(after, "issued").len(), 1, "{after}");
    assert!(times(after, "issued")[0] >= last[7][1], "{after}");
}
