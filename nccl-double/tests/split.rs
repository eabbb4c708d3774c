//! `ncclCommSplit` as NCCL's sources have it (`init.cc`, tags v2.18.1 to v2.30.7:
//! `ncclCommSplit`, from 2.27 `ncclCommInitChildComm`, and `commGetSplitInfo`): the ranks
//! of one color form a communicator, ranked by key, then by parent rank;
//! `NCCL_SPLIT_NOCOLOR` (-1) gets NULL and its config is never read; any other color,
//! negative ones included, is a color; a NULL config inherits the parent's (blocking or
//! not); a parent with an asynchronous error makes the split return that error
//! (`ncclCommEnsureReady`, from 2.19). Played with the probe's `split` op.

mod support;

use support::{Job, Out, all, all_ok, fields};

/// The `op=split` line of one rank, as fields.
fn split_line(o: &Out) -> std::collections::HashMap<&str, &str> {
    let line = o.stdout.lines().find(|l| l.contains("op=split")).unwrap_or_default();
    fields(line)
}

/// A split job of `world` ranks: rank r passes `colors[r]` and `keys[r]`.
fn split_job(colors: &[i32], keys: &[i32]) -> Job {
    let mut job = Job::new("split", colors.len());
    for (r, (c, k)) in colors.iter().zip(keys).enumerate() {
        job = job.rank_args(r, &["--color", &c.to_string(), "--key", &k.to_string()]);
    }
    job
}

/// Asserts that rank `r` got a communicator of `count` ranks in which it is `rank`, whose
/// all-reduce of (parent rank + 1) summed to `sum`, and whose call said `call`.
fn member(outs: &[Out], r: usize, (count, rank, sum): (&str, &str, &str), call: &str) {
    let f = split_line(&outs[r]);
    let ctx = all(outs);
    assert_eq!(f.get("split"), Some(&"ncclSuccess"), "rank {r}:\n{ctx}");
    assert_eq!(f.get("newcomm"), Some(&"set"), "rank {r}:\n{ctx}");
    assert_eq!(f.get("count_call"), Some(&"ncclSuccess"), "rank {r}:\n{ctx}");
    assert_eq!(f.get("user_rank_call"), Some(&"ncclSuccess"), "rank {r}:\n{ctx}");
    assert_eq!(f.get("count"), Some(&count), "rank {r}: ncclCommCount:\n{ctx}");
    assert_eq!(f.get("user_rank"), Some(&rank), "rank {r}: ncclCommUserRank:\n{ctx}");
    assert_eq!(f.get("sum"), Some(&sum), "rank {r}: the members' all-reduce:\n{ctx}");
    assert_eq!(f.get("child_call"), Some(&call), "rank {r}:\n{ctx}");
}

/// Asserts that rank `r` got no communicator, and that the split said `ncclSuccess`.
fn no_member(outs: &[Out], r: usize) {
    let f = split_line(&outs[r]);
    let ctx = all(outs);
    assert_eq!(f.get("split"), Some(&"ncclSuccess"), "rank {r}:\n{ctx}");
    assert_eq!(
        f.get("newcomm"),
        Some(&"null"),
        "rank {r}: NCCL_SPLIT_NOCOLOR gets NULL:\n{ctx}"
    );
}

#[test]
fn a_split_of_four_ranks_orders_each_color_by_key_then_parent_rank_and_nocolor_gets_null() {
    // Color 0: rank 3 (key 1), then ranks 0 and 2 (key 5 both: by parent rank); rank 1
    // has NCCL_SPLIT_NOCOLOR. A blocking parent and a NULL config make a blocking child
    // (the all-reduce says ncclSuccess); a non-blocking parent, a non-blocking one (it
    // says ncclInProgress): the parent's config is inherited (copyCommConfig).
    for (mode, call) in [(&[][..], "ncclSuccess"), (&["--nonblocking"][..], "ncclInProgress")] {
        let outs = split_job(&[0, -1, 0, 0], &[5, 0, 5, 1]).args(mode).run();
        all_ok(&outs);
        member(&outs, 3, ("3", "0", "8"), call);
        member(&outs, 0, ("3", "1", "8"), call);
        member(&outs, 2, ("3", "2", "8"), call);
        no_member(&outs, 1);
    }
    // Two colors, keys out of parent order (a negative key too): color 1 is rank 2 (key
    // -3), then rank 0; color 0 is rank 3 (key 2), then rank 1 (key 9).
    let outs = split_job(&[1, 0, 1, 0], &[0, 9, -3, 2]).run();
    all_ok(&outs);
    member(&outs, 2, ("2", "0", "4"), "ncclSuccess");
    member(&outs, 0, ("2", "1", "4"), "ncclSuccess");
    member(&outs, 3, ("2", "0", "6"), "ncclSuccess");
    member(&outs, 1, ("2", "1", "6"), "ncclSuccess");
}

#[test]
fn a_rank_with_no_color_does_not_read_its_config() {
    // NCCL parses the config only for a rank that joins a new communicator: a config not
    // made by NCCL_CONFIG_INITIALIZER is no error with NCCL_SPLIT_NOCOLOR.
    let outs = split_job(&[-1, 0], &[0, 0])
        .rank_args(0, &["--split-config", "no-magic"])
        .run();
    all_ok(&outs);
    no_member(&outs, 0);
    member(&outs, 1, ("1", "0", "2"), "ncclSuccess");
    assert!(outs[0].stderr.is_empty(), "no WARN line:\n{}", all(&outs));
}

#[test]
fn a_negative_color_other_than_nocolor_is_a_color_like_any_other() {
    // commGetSplitInfo compares colors and tests only NCCL_SPLIT_NOCOLOR: -2 is a color.
    let outs = split_job(&[-2, 7, -2], &[0, 0, 0]).run();
    all_ok(&outs);
    member(&outs, 0, ("2", "0", "4"), "ncclSuccess");
    member(&outs, 2, ("2", "1", "4"), "ncclSuccess");
    member(&outs, 1, ("1", "0", "2"), "ncclSuccess");
}

#[test]
fn a_split_of_a_parent_with_an_asynchronous_error_returns_that_error() {
    // Rank 1's all-reduce fails (an injected ncclSystemError, at the call): rank 0's
    // all-reduce then ends with the asynchronous error ncclRemoteError, which NCCL's
    // ncclCommEnsureReady (2.19 on) returns from the split as it is. Rank 1's call failed
    // its checks (no asynchronous error): the double refuses its split as before.
    for (version, says) in [
        ("21803", "NCCL 2.18's ncclCommSplit does not look"),
        (
            "21903",
            "Attempt to use communicator before the previous operation returned ncclSuccess",
        ),
        ("22703", "ncclCommEnsureReady returns it"),
    ] {
        let outs = split_job(&[0, 0], &[0, 1])
            .args(&["--first", "allreduce"])
            .env("NCCL_DOUBLE_VERSION", version)
            .rank_env(1, "NCCL_DOUBLE_FAIL", "ncclAllReduce:1")
            .run();
        let ctx = all(&outs);
        all_ok(&outs);
        let f = split_line(&outs[0]);
        assert_eq!(
            f.get("first"),
            Some(&"failed,parent_state=ncclRemoteError"),
            "{version}:\n{ctx}"
        );
        assert_eq!(f.get("split"), Some(&"ncclRemoteError"), "{version}:\n{ctx}");
        assert_eq!(f.get("newcomm"), Some(&"null"), "{version}:\n{ctx}");
        let warn = outs[0]
            .stderr
            .lines()
            .find(|l| l.contains("ncclCommSplit"))
            .unwrap_or_default();
        assert!(
            warn.starts_with("nccl-double WARN") && warn.contains("ncclRemoteError") && warn.contains(says),
            "{version}: {says:?}:\n{ctx}"
        );
        if version == "22703" {
            // 2.27 on: ncclCommEnsureReady WARNs only for ncclInProgress.
            assert!(!warn.contains("Attempt to use"), "{version}:\n{ctx}");
        }
        let f = split_line(&outs[1]);
        assert_eq!(f.get("split"), Some(&"ncclInvalidUsage"), "{version}:\n{ctx}");
        assert_eq!(f.get("newcomm"), Some(&"null"), "{version}:\n{ctx}");
    }
}
