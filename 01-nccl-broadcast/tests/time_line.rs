//! The `Time:` line says which figure it gives (the mean of the runs back to back), gives
//! the single calls' median and p99 and how many slept on the next line, and says that a
//! rooted collective's calls may overlap. Real multi-process jobs; no time is asserted.

use testkit::run;

const BIN: &str = env!("CARGO_BIN_EXE_01-nccl-broadcast");

#[test]
fn a_broadcast_on_three_ranks_says_its_calls_overlap_and_gives_single_calls() {
    let r = run(BIN, &["--nproc-per-node", "3", "--iters", "20"]).ok();
    let lines: Vec<&str> = r.stdout.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.starts_with("Time: "))
        .unwrap_or_else(|| panic!("{r}"));
    let time = lines[at];
    assert!(
        time.contains("(slowest of 3 ranks, mean of 20 runs back to back"),
        "{time}"
    );
    assert!(
        time.contains("calls may overlap: the root leaves once its data is handed over"),
        "{time}"
    );
    let single = lines.get(at + 1).map(|l| l.trim()).unwrap_or_default();
    assert!(
        single.starts_with("single calls (each its slowest rank): median "),
        "{r}"
    );
    assert!(
        single.contains(" us, p99 ") && single.ends_with(" of 20 slept"),
        "{single}"
    );

    let r = run(BIN, &["--nproc-per-node", "3", "--iters", "20", "--format", "json"]).ok();
    let j = r.json();
    let s = &j["single_calls"];
    assert_eq!(s["calls"], 20, "{r}");
    assert!(
        s["median_us"].as_f64().is_some_and(|m| m > 0.0) && s["p99_us"].as_f64() >= s["median_us"].as_f64(),
        "{r}"
    );
    assert!(s["slept"].as_u64().is_some_and(|n| n <= 20), "{r}");
    assert_eq!(
        j["calls_overlap"], "the root leaves once its data is handed over",
        "{r}"
    );
}

#[test]
fn one_run_is_one_run_and_tcp_does_not_count_sleeps() {
    let r = run(BIN, &["--nproc-per-node", "2", "--iters", "1"]).ok();
    let time = r
        .stdout
        .lines()
        .find(|l| l.starts_with("Time: "))
        .unwrap_or_else(|| panic!("{r}"));
    assert!(time.contains("(slowest of 2 ranks, one run):"), "{time}");
    assert!(!r.stdout.contains("single calls"), "one call has no spread:\n{r}");
    let r = run(BIN, &["--nproc-per-node", "2", "--iters", "5", "--transport", "tcp"]).ok();
    assert!(r.stdout.contains("sleeps not counted over TCP"), "{r}");
}
