//! The reference solution of exercise 12 where it is easy to get wrong: on the NCCL test
//! double, a split communicator's call queued after another communicator's on the same
//! stream waits for it (a rank late to the all-reduce across nodes must not let its
//! neighbour's all-gather inside the node copy a shard not yet summed); on two emulated
//! nodes, the hierarchy crosses TCP once per shard.

use testkit::{LIMIT, command, finish, nccl_command, spawn};

const BIN: &str = env!("CARGO_BIN_EXE_sol12-hierarchical-allreduce");

#[test]
fn a_call_waits_for_another_communicators_call_before_it_on_the_stream() {
    // Nodes of one rank: the reduce-scatter and all-gather run on one-rank communicators,
    // the all-reduce across both ranks. Rank 0 starts 500 ms late, so rank 1's all-reduce
    // waits for it on the GPU while its all-gather is already queued behind it.
    let args = [
        "--backend",
        "nccl",
        "--nproc-per-node",
        "2",
        "--per-node",
        "1",
        "--count",
        "4",
        "--iters",
        "1",
        "--format",
        "json",
    ];
    let mut cmd = nccl_command(BIN, &args, 2);
    cmd.env("NCCL_WORKBOOK_FAULT", "late:0:500");
    let r = finish(spawn(cmd), LIMIT).ok();
    let j = r.json();
    assert_eq!(j["check"]["wrong"], 0, "{r}");
    assert_eq!(testkit::stage(&j, "after"), vec![vec![3.0, 23.0, 43.0, 63.0]; 2], "{r}");
}

#[test]
fn on_two_emulated_nodes_the_hierarchy_gives_the_sum() {
    let runs = testkit::nodes(2, |node, args| {
        let mut a = vec!["--nproc-per-node", "2", "--count", "12", "--iters", "1"];
        a.extend_from_slice(args);
        let mut cmd = command(BIN, &a);
        cmd.env("SLURMD_NODENAME", format!("node{node}"));
        cmd
    });
    for r in &runs {
        assert_eq!(r.code, Some(0), "{r}");
    }
    let j = runs[0].json();
    assert_eq!(j["check"]["wrong"], 0, "{}", runs[0]);
    let sums: Vec<f64> = (0..8).map(|i| (10 + 40 * i) as f64).collect();
    assert_eq!(testkit::stage(&j, "after"), vec![sums; 4], "{}", runs[0]);
}
