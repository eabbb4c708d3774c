//! `bench/nodes.sh`, run as EXERCISES.md chapter 10 has a student run it: N emulated nodes
//! of one job on this machine (each its own host name), node 0's output on the terminal,
//! the other nodes' kept aside and shown only when they fail, one line and exit 2 on bad
//! usage, and nothing left behind.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use support::built;
use testkit::{LIMIT, Run, TIMEOUT, clear_job_env, finish, spawn};

/// The workbook's folder, where a student runs `bench/nodes.sh`.
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .to_path_buf()
}

/// `bench/nodes.sh ARGS` from the workbook's folder, as a student types it (the script
/// itself, not `bash script`: it must be executable), with `tmp` as its TMPDIR, in an
/// environment that is no other job's.
fn nodes_sh(args: &[&str], tmp: &Path) -> Run {
    let mut cmd = Command::new(workspace().join("bench/nodes.sh"));
    cmd.args(args).current_dir(workspace()).env("TMPDIR", tmp);
    clear_job_env(&mut cmd);
    finish(spawn(cmd), LIMIT)
}

/// An empty folder of this test's own, for the script's TMPDIR.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("nodes-sh-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("making a scratch folder");
    dir
}

/// What is left in `dir` (the script's TMPDIR), by name.
fn left_in(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .expect("reading the scratch folder")
        .map(|e| e.expect("a folder entry").file_name().to_string_lossy().into_owned())
        .collect()
}

#[test]
fn nodes_sh_runs_hello_world_as_two_nodes_and_shows_node_0s_table() {
    let hello = built("00-nccl-hello-world");
    let tmp = scratch("hello");
    let r = nodes_sh(
        &[
            "2",
            hello.to_str().unwrap(),
            "--nproc-per-node",
            "1",
            "--timeout",
            TIMEOUT,
        ],
        &tmp,
    );
    assert_eq!(r.code, Some(0), "{r}");
    assert!(r.stdout.lines().any(|l| l == "Hello from 2 ranks:"), "{r}");
    // The table's host column, found by its header: one host per node.
    let rows: Vec<Vec<&str>> = r
        .stdout
        .lines()
        .filter(|l| l.starts_with('|'))
        .map(|l| l.split('|').map(str::trim).collect())
        .collect();
    let header = rows.first().unwrap_or_else(|| panic!("no table:\n{r}"));
    let host = header
        .iter()
        .position(|c| *c == "host")
        .unwrap_or_else(|| panic!("no host column:\n{r}"));
    let hosts: Vec<&str> = rows[1..].iter().map(|row| row[host]).collect();
    assert_eq!(hosts, ["node0", "node1"], "{r}");
    // Node 1 succeeded: nothing of it is shown, and nothing is left behind.
    assert!(!r.stderr.contains("node 1 failed"), "{r}");
    assert_eq!(left_in(&tmp), Vec::<String>::new(), "{r}");
    let _ = std::fs::remove_dir_all(&tmp);
}

#[test]
fn nodes_sh_says_bad_usage_in_one_line_and_shows_a_failed_nodes_last_lines() {
    let tmp = scratch("usage");
    let bad: [&[&str]; 5] = [&[], &["x", "true"], &["0", "true"], &["-3", "true"], &["3"]];
    for args in bad {
        let r = nodes_sh(args, &tmp);
        assert_eq!(r.code, Some(2), "bench/nodes.sh {args:?}:\n{r}");
        assert_eq!(r.stderr.lines().count(), 1, "bench/nodes.sh {args:?}:\n{r}");
        assert!(r.stderr.starts_with("error: "), "bench/nodes.sh {args:?}:\n{r}");
        assert!(r.stdout.is_empty(), "bench/nodes.sh {args:?}:\n{r}");
    }
    let r = nodes_sh(&["--help"], &tmp);
    assert_eq!(r.code, Some(0), "{r}");
    assert!(r.stdout.starts_with("Usage: bench/nodes.sh N COMMAND [ARGS...]"), "{r}");

    // Node 1 of 2 fails, node 0 succeeds: node 0's output only, node 1's last lines after
    // it, and exit 1. (Each node gets --nnodes 2 --node-rank K ... after the script's
    // words, as its $0 and $1...: the script ignores them.)
    let script =
        r#"echo "out of $SLURMD_NODENAME"; if [ "$SLURMD_NODENAME" = node1 ]; then echo "node1 broke" >&2; exit 3; fi"#;
    let r = nodes_sh(&["2", "bash", "-c", script], &tmp);
    assert_eq!(r.code, Some(1), "{r}");
    assert_eq!(r.stdout, "out of node0\n", "{r}");
    assert!(r.stderr.contains("node 1 failed (exit 3)"), "{r}");
    assert!(r.stderr.contains("node1 broke"), "{r}");
    // Node 0 fails: its own status.
    let script = r#"[ "$SLURMD_NODENAME" = node0 ] && exit 5; exit 0"#;
    let r = nodes_sh(&["3", "bash", "-c", script], &tmp);
    assert_eq!(r.code, Some(5), "{r}");
    // Every node refuses its arguments (exit 2, as the lessons do): node 0's one line,
    // not the same line again for each other node.
    let script = r#"echo "error: unexpected argument" >&2; exit 2"#;
    let r = nodes_sh(&["3", "bash", "-c", script], &tmp);
    assert_eq!(r.code, Some(2), "{r}");
    assert_eq!(r.stderr, "error: unexpected argument\n", "{r}");
    // A node still running once node 0 has ended is stopped after 10 s, and named.
    let script = r#"[ "$SLURMD_NODENAME" = node1 ] && exec sleep 120; exit 0"#;
    let r = nodes_sh(&["2", "bash", "-c", script], &tmp);
    assert_eq!(r.code, Some(1), "{r}");
    assert!(
        r.stderr
            .contains("node 1 was still running 10 s after node 0 ended: stopped"),
        "{r}"
    );
    assert_eq!(left_in(&tmp), Vec::<String>::new(), "{r}");
    let _ = std::fs::remove_dir_all(&tmp);
}
