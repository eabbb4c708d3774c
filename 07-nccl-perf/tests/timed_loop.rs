//! The benchmark's timed loop on NCCL is nccl-tests' own: the calls go to a blocking
//! communicator, one after the other, then one wait. From NCCL 2.23 every call on a
//! non-blocking communicator (the one every wait of the workbook needs, for its
//! deadlines) is launched by a helper thread and must be polled to `ncclSuccess` before
//! the next: a thread and a poll per call. The double plays 2.23 (`NCCL_DOUBLE_VERSION`)
//! and counts its helper threads (`NCCL_DOUBLE_STATS`). Real processes.

use testkit::{LIMIT, finish, nccl_command, spawn};

const BIN: &str = env!("CARGO_BIN_EXE_07-nccl-perf");

/// Runs the benchmark on 2 simulated GPUs playing NCCL `version`: every row checked, and
/// the number of helper threads the double started.
fn helpers(version: &str, iters: &str) -> u64 {
    let stats = testkit::nccl_double_dir().with_file_name(format!("stats-{}-{version}", std::process::id()));
    let _ = std::fs::remove_file(&stats);
    let args = [
        "--backend",
        "nccl",
        "--nproc-per-node",
        "2",
        "-b",
        "8",
        "-e",
        "1K",
        "-f",
        "8",
        "-n",
        iters,
        "-w",
        "2",
    ];
    let mut cmd = nccl_command(BIN, &args, 2);
    cmd.env("NCCL_DOUBLE_VERSION", version).env("NCCL_DOUBLE_STATS", &stats);
    let r = finish(spawn(cmd), LIMIT).ok();
    let rows: Vec<Vec<&str>> = r
        .stdout
        .lines()
        .filter(|l| l.split_whitespace().next().is_some_and(|w| w.parse::<u64>().is_ok()))
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), 3, "{r}");
    assert!(rows.iter().all(|c| (c[8], c[12]) == ("0", "0")), "{r}");
    // Each rank wrote the file at its exit: the last one's is there.
    let said = std::fs::read_to_string(&stats).unwrap_or_else(|e| panic!("no stats ({e}):\n{r}"));
    let _ = std::fs::remove_file(&stats);
    said.trim()
        .strip_prefix("helper_threads=")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{said}"))
}

#[test]
fn no_timed_call_waits_for_a_helper_thread_on_nccl_2_23() {
    // 3 sizes x 2 placements x (50 or 200 timed calls): the timed calls start none. The
    // rest (the split that makes the blocking communicator, and the checks) are the same
    // whatever the number of timed calls.
    let (few, many) = (helpers("22304", "50"), helpers("22304", "200"));
    assert_eq!(
        few, many,
        "the helper threads grow with the timed calls: {few} for 50, {many} for 200"
    );
    assert!(many < 50, "{many} helper threads");
    // Before 2.23, a non-blocking communicator's collectives start no helper thread:
    // only the split does.
    assert_eq!(helpers("21803", "50"), 1);
}
