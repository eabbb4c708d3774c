//! The all-to-all on the NCCL test double when a rank freezes or the GPU stalls: every
//! other rank ends within `--timeout` plus a few seconds, says one line, and names the
//! cause, never a rank that only waited.
//!
//! The timed loop runs on a blocking communicator (nccl-tests' default), whose group end
//! launches the group in the caller's thread and connects to each peer at the first send
//! or receive with it (NCCL's `groupLaunch`): a peer frozen there leaves the others inside
//! `ncclGroupEnd`, where no poll reaches. The double plays it (it connects at a group's
//! end, waiting for the peer), and `NCCL_DOUBLE_STOP` freezes the victim exactly there.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};
use testkit::{LIMIT, Run, finish, free_port, nccl_command, spawn};

const BIN: &str = env!("CARGO_BIN_EXE_06-nccl-alltoall");

/// Rank `rank` of 3 started by hand on `port`, on the double with 4 GPUs, its meeting
/// folders in `rooms`.
fn by_hand(rank: usize, port: u16, rooms: &PathBuf, extra: &[&str]) -> Command {
    let (r, p) = (rank.to_string(), port.to_string());
    let mut args = vec![
        "--backend",
        "nccl",
        "--world-size",
        "3",
        "--rank",
        &r,
        "--master-port",
        &p,
    ];
    args.extend_from_slice(extra);
    let mut cmd = nccl_command(BIN, &args, 4);
    cmd.env("NCCL_DOUBLE_DIR", rooms);
    cmd
}

/// A folder of its own for the double's meeting folders, under target/ (a frozen or killed
/// rank's stays behind, as a real NCCL's shared-memory files would): removed at the end.
fn rooms(name: &str) -> PathBuf {
    let dir = testkit::nccl_double_dir().with_file_name(format!("rooms-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The one `error:` line of a survivor's stderr.
fn error_line(run: &Run) -> String {
    let said: Vec<&str> = run.stderr.lines().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(said.len(), 1, "not one error line:\n{run}");
    said[0].to_string()
}

#[test]
fn a_rank_frozen_in_the_timed_loops_first_group_end_is_named_within_the_timeout() {
    const TIMEOUT: u64 = 4;
    let t = TIMEOUT.to_string();
    for victim in [2, 0] {
        let port = free_port();
        let rooms = rooms(&format!("frozen-{victim}"));
        let start = Instant::now();
        let ranks: Vec<Child> = (0..3)
            .map(|r| {
                let mut cmd = by_hand(r, port, &rooms, &["--iters", "20", "--timeout", &t]);
                // The checked all-to-all ends with the first ncclGroupEnd; the second is the
                // timed loop's first, on its blocking communicator: the victim stops there.
                if r == victim {
                    cmd.env("NCCL_DOUBLE_STOP", "ncclGroupEnd:2");
                }
                spawn(cmd)
            })
            .collect();
        let mut victim_child = None;
        for (r, child) in ranks.into_iter().enumerate() {
            if r == victim {
                victim_child = Some(child);
                continue;
            }
            let run = finish(child, LIMIT);
            let took = start.elapsed();
            let ctx = format!("rank {victim} frozen; rank {r} after {took:?}:\n{run}");
            // Its start, the checked all-to-all, then --timeout in ncclGroupEnd and a little.
            assert!(took < Duration::from_secs(TIMEOUT + 10), "too slow: {ctx}");
            assert_eq!(run.code, Some(1), "{ctx}");
            let line = error_line(&run);
            assert!(line.contains("did not return in 4 s (--timeout)"), "{ctx}");
            let named = match victim {
                0 => line.contains("rank 0, which hosts the store, stopped answering or is gone"),
                v => line.contains(&format!("the store says rank {v} stopped responding")),
            };
            assert!(named, "rank {victim} is not named: {ctx}");
        }
        // The frozen one is still there (nothing can end it but a signal): end it.
        let mut victim_child = victim_child.expect("the victim");
        let _ = victim_child.kill();
        let _ = victim_child.wait();
        let _ = std::fs::remove_dir_all(&rooms);
    }
}

#[test]
fn a_grouped_all_to_all_that_makes_no_progress_is_named_as_a_group_not_as_sends_outside_one() {
    // Every unit of work takes 30 s: the first all-to-all runs past --timeout with every
    // rank alive and polling. What is waited for is the group, queued at its end; the
    // sends and receives inside it are in one group, and the message must not say they
    // are not.
    let port = free_port();
    let rooms = rooms("slow");
    let ranks: Vec<Child> = (0..3)
        .map(|r| {
            let mut cmd = by_hand(r, port, &rooms, &["--iters", "1", "--timeout", "3"]);
            cmd.env("NCCL_DOUBLE_WORK_US", "30000000");
            spawn(cmd)
        })
        .collect();
    // Every rank's deadline passes at about the same moment: the first to pass it explains;
    // one a few milliseconds later may learn first that rank 0 (the store's host) is gone,
    // and say so, waiting for the same group.
    let mut explained = 0;
    for (r, child) in ranks.into_iter().enumerate() {
        let run = finish(child, LIMIT);
        assert_eq!(run.code, Some(1), "rank {r}:\n{run}");
        let line = error_line(&run);
        assert!(
            line.contains(
                "waiting for the GPU to finish the group of 6 calls (3 ncclSend, 3 ncclRecv) queued by ncclGroupEnd"
            ),
            "rank {r}: {line}"
        );
        assert!(!line.contains("go in one group"), "rank {r}: {line}");
        explained += usize::from(line.contains("the calls of a group progress together"));
    }
    assert!(explained > 0, "no rank explains what the group waits for");
    let _ = std::fs::remove_dir_all(&rooms);
}

#[test]
fn a_variable_that_would_override_the_communicators_config_is_refused_in_one_line() {
    for (name, value) in [
        ("NCCL_COMM_BLOCKING", "1"),
        ("NCCL_COMM_BLOCKING", "0"),
        ("NCCL_COMM_SPLIT_SHARE_RESOURCES", "1"),
    ] {
        let mut cmd = Command::new(BIN);
        cmd.args(["--simulate-gpus", "2"]).env(name, value);
        let run = finish(spawn(cmd), LIMIT);
        assert_eq!(run.code, Some(2), "{name}={value}:\n{run}");
        assert_eq!(
            run.stderr.trim().lines().count(),
            1,
            "{name}={value}: not one line:\n{run}"
        );
        assert!(run.stderr.starts_with("error: "), "{run}");
        assert!(
            run.stderr.contains(&format!("{name}={value} is set: NCCL would ")),
            "{run}"
        );
        assert!(run.stderr.contains(&format!("env -u {name}")), "{run}");
    }
    // A value NCCL ignores is no reason to refuse.
    let mut cmd = Command::new(BIN);
    cmd.args(["--simulate-gpus", "2", "--format", "json"])
        .env("NCCL_COMM_BLOCKING", "2");
    let run = finish(spawn(cmd), LIMIT);
    assert_eq!(run.code, Some(0), "{run}");
}
