//! `--show-calls=RANK`: one rank's calls, to follow alone; `--show-calls` (or `=all`):
//! every rank's, each line starting with its rank. Real processes on simulated GPUs.

use testkit::run;

const BIN: &str = env!("CARGO_BIN_EXE_harness-probe");

/// The ranks whose call lines (`rank R │ …`) `out` holds, in order of first appearance.
fn ranks_shown(out: &str) -> Vec<usize> {
    let mut ranks = Vec::new();
    for line in out.lines() {
        if let Some((rank, _)) = line.strip_prefix("rank ").and_then(|l| l.split_once(" │ "))
            && let Ok(r) = rank.parse::<usize>()
            && !ranks.contains(&r)
        {
            ranks.push(r);
        }
    }
    ranks.sort();
    ranks
}

#[test]
fn show_calls_with_a_rank_shows_that_rank_only() {
    let r = run(BIN, &["--simulate-gpus", "3", "--show-calls=1", "--iters", "1"]).ok();
    assert_eq!(ranks_shown(&r.stdout), vec![1], "{r}");
    assert!(
        r.stdout.lines().any(|l| l.starts_with("rank 1 │ ncclAllReduce(")),
        "{r}"
    );
    // Every rank's, as before, with no value or with `all`.
    for flag in ["--show-calls", "--show-calls=all"] {
        let r = run(BIN, &["--simulate-gpus", "3", flag, "--iters", "1"]).ok();
        assert_eq!(ranks_shown(&r.stdout), vec![0, 1, 2], "{flag}: {r}");
    }
}

#[test]
fn a_bad_show_calls_value_is_one_line_and_exit_2() {
    for (value, said) in [
        (
            "--show-calls=3",
            "--show-calls 3 is not a rank: the world has ranks 0 to 2",
        ),
        ("--show-calls=one", "`one` is neither `all` nor a rank"),
        ("--show-calls=-1", "`-1` is neither `all` nor a rank"),
    ] {
        let r = run(BIN, &["--simulate-gpus", "3", value]);
        assert_eq!(r.code, Some(2), "{value}: {r}");
        assert_eq!(r.stderr.lines().count(), 1, "{value}: {r}");
        assert!(r.stderr.contains(said), "{value}: {r}");
        assert!(!r.stderr.contains("panicked"), "{value}: {r}");
    }
}
