//! NCCL's double binary tree on the CPU backend (`NCCL_ALGO=Tree`), checked element by
//! element by the benchmark (every element of every rank against where it comes from,
//! in place and out of place), on one node (the trees are a chain) and on emulated nodes,
//! odd and even in number (the second tree is the first mirrored, or shifted), with one
//! rank per node and several, from 1 to 17 ranks. Real multi-process jobs.

use serde_json::Value;
use testkit::{Run, command, finish, spawn};

const BIN: &str = env!("CARGO_BIN_EXE_07-nccl-perf");

/// A small sweep of odd and even element counts (1 to 13 floats: the halves differ by one,
/// one tree may get nothing) with every operator and type, and 3 MiB (each tree's half in
/// several pieces).
const SWEEPS: [&str; 2] = ["-b 4 -e 52 -i 12 -o all -d all", "-b 3M -e 3M -o sum -d float"];

/// Runs `sweep` as `nodes` emulated nodes (each its own host name, so TCP between them and
/// shared memory inside) of `per_node` ranks; returns node 0's run, which prints the JSON.
fn tree_job(nodes: usize, per_node: usize, sweep: &str) -> Run {
    let per = per_node.to_string();
    let mut words: Vec<&str> = sweep.split_whitespace().collect();
    words.extend(["--coll", "all_reduce", "-w", "0", "-n", "1", "--nproc-per-node", &per]);
    let runs = testkit::nodes(nodes, |node, args| {
        let mut cmd = command(BIN, &[&words[..], args].concat());
        cmd.env("NCCL_ALGO", "Tree")
            .env("SLURMD_NODENAME", format!("node-{node}"));
        cmd
    });
    for r in &runs[1..] {
        assert_eq!(r.code, Some(0), "{nodes} nodes of {per_node}, another node:\n{r}");
    }
    runs.into_iter().next().unwrap().ok()
}

/// Every row ran the tree and found no wrong element, in place and out of place.
fn check(r: &Run, world: usize) {
    let j: Value = r.json();
    assert_eq!(j["world_size"], world, "{r}");
    let sweeps = match j["sweeps"].as_array() {
        Some(all) => all.clone(),
        None => vec![j.clone()],
    };
    for sweep in &sweeps {
        assert_eq!(sweep["wrong"], 0, "{r}");
        for row in sweep["rows"].as_array().unwrap_or_else(|| panic!("no rows:\n{r}")) {
            for place in ["out_of_place", "in_place"] {
                let what = format!("{} {} at {} B, {place}", sweep["type"], sweep["redop"], row["size"]);
                assert_eq!(row[place]["wrong"], 0, "{what}:\n{r}");
                // One rank has no tree: nothing to choose, nothing moves.
                if world > 1 {
                    assert_eq!(row[place]["algo"], "tree", "{what}:\n{r}");
                }
            }
        }
    }
}

/// `NCCL_ALGO=Tree` on `world` ranks of one host, `sweep`.
fn one_node(world: usize, sweep: &str) -> Run {
    let line = format!("{sweep} --coll all_reduce -w 0 -n 1 --nproc-per-node {world} --format json");
    let words: Vec<&str> = line.split_whitespace().collect();
    let mut cmd = command(BIN, &words);
    cmd.env("NCCL_ALGO", "Tree");
    finish(spawn(cmd), testkit::LIMIT).ok()
}

#[test]
fn the_tree_is_right_on_one_node_and_on_odd_and_even_numbers_of_nodes() {
    // On one node the trees are a chain; over nodes, even (mirrored second tree) and odd
    // (shifted), with one rank per node (the trees alone) and two (a chain under each
    // node's first rank).
    for world in [1, 2, 3, 5] {
        for sweep in SWEEPS {
            check(&one_node(world, sweep), world);
        }
    }
    for (nodes, per_node) in [(2, 1), (3, 2), (4, 2)] {
        for sweep in SWEEPS {
            check(&tree_job(nodes, per_node, sweep), nodes * per_node);
        }
    }
}

#[test]
#[ignore = "long sweep: run by .ci/run"]
fn the_tree_is_right_on_every_shape_up_to_17_ranks() {
    for world in [4, 8, 17] {
        for sweep in SWEEPS {
            check(&one_node(world, sweep), world);
        }
    }
    for (nodes, per_node) in [(3, 1), (4, 1), (5, 1), (2, 2), (3, 3), (6, 2), (17, 1)] {
        for sweep in SWEEPS {
            check(&tree_job(nodes, per_node, sweep), nodes * per_node);
        }
    }
}
