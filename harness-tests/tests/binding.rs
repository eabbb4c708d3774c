//! Ranks of a one-host job with a core each are bound to cores of their own, and
//! `NCCL_DEBUG=INFO` says so; `NCCL_WORKBOOK_BIND=none` leaves them to the scheduler.

use std::time::Duration;
use testkit::{command, finish, spawn};

const BIN: &str = env!("CARGO_BIN_EXE_harness-probe");
const LIMIT: Duration = Duration::from_secs(90);

fn run(bind: Option<&str>) -> String {
    let mut cmd = command(BIN, &["--nproc-per-node", "2"]);
    cmd.env("NCCL_DEBUG", "INFO");
    if let Some(b) = bind {
        cmd.env("NCCL_WORKBOOK_BIND", b);
    }
    finish(spawn(cmd), LIMIT).ok().stdout
}

#[test]
fn info_says_the_ranks_are_bound_and_bind_none_leaves_them() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let bound = run(None);
    if cores >= 2 {
        assert!(
            bound.contains("cpu INFO each rank bound to a core of its own"),
            "{bound}"
        );
    } else {
        assert!(
            !bound.contains("bound to a core"),
            "one core: nothing to bind to\n{bound}"
        );
    }
    let left = run(Some("none"));
    assert!(!left.contains("bound to a core"), "{left}");
    assert!(left.contains("Check: OK"), "{left}");
}
