//! The `Time:` line of a collective whose every rank needs every other's data: the mean of
//! the runs back to back, no overlap to warn of, the single calls on the next line.

use testkit::run;

const BIN: &str = env!("CARGO_BIN_EXE_02-nccl-allreduce");

#[test]
fn an_all_reduce_names_its_statistic_and_does_not_overlap() {
    let r = run(BIN, &["--nproc-per-node", "3", "--iters", "10"]).ok();
    let lines: Vec<&str> = r.stdout.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.starts_with("Time: "))
        .unwrap_or_else(|| panic!("{r}"));
    assert!(
        lines[at].contains("(slowest of 3 ranks, mean of 10 runs back to back):"),
        "{r}"
    );
    assert!(!lines[at].contains("overlap"), "{r}");
    assert!(
        lines[at + 1]
            .trim()
            .starts_with("single calls (each its slowest rank): median "),
        "{r}"
    );
    let j = run(BIN, &["--nproc-per-node", "3", "--iters", "10", "--format", "json"])
        .ok()
        .json();
    assert_eq!(j["single_calls"]["calls"], 10);
    assert!(j.get("calls_overlap").is_none(), "{j}");
}
