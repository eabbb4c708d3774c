//! `--steps` on the reference solution of exercise 10: a tree built by hand from
//! `recv_add_part`, `send_part` and `recv_part` takes 2·⌊log2 n⌋ steps, up then down
//! (EXERCISES.md 10), where the ring of exercise 5 takes 2(n - 1).

use testkit::run;

const BIN: &str = env!("CARGO_BIN_EXE_sol10-tree-allreduce");

/// The `--steps` block of a run on `n` ranks of 10 elements.
fn steps(n: usize) -> (testkit::Run, Vec<String>) {
    let n = n.to_string();
    let args = [
        "--backend",
        "cpu",
        "--nproc-per-node",
        &n,
        "--count",
        "10",
        "--steps",
        "--iters",
        "1",
    ];
    let r = run(BIN, &args).ok();
    let block = r
        .stdout
        .lines()
        .skip_while(|l| !l.starts_with("Steps of"))
        .take_while(|l| !l.is_empty())
        .map(str::to_string)
        .collect();
    (r, block)
}

#[test]
fn steps_show_the_tree_up_then_down_in_two_log2_n_steps() {
    for (n, depth) in [(2, 1), (5, 2), (8, 3)] {
        let (r, block) = steps(n);
        assert!(r.stdout.contains("Check: OK"), "{r}");
        let headings: Vec<&str> = block
            .iter()
            .filter(|l| l.starts_with("  step"))
            .map(|l| l.trim())
            .collect();
        let want: Vec<String> = (1..=2 * depth).map(|i| format!("step {i} of {}", 2 * depth)).collect();
        assert_eq!(headings, want, "{n} ranks:\n{r}");
    }
    // 5 ranks: step 1, the leaves 3 and 4 send to rank 1, which adds both; step 2, rank 0
    // adds ranks 1 and 2; the last step, rank 1 passes the sum to 3 and 4.
    let (r, block) = steps(5);
    let row = |step: usize, rank: usize| {
        let at = block
            .iter()
            .position(|l| l.trim() == format!("step {step} of 4"))
            .unwrap();
        block[at + 1 + rank].clone()
    };
    assert!(
        row(1, 1).ends_with("got the buffer from rank 3 (+), got the buffer from rank 4 (+)"),
        "{r}"
    );
    assert!(row(1, 3).ends_with("sent the buffer → rank 1"), "{r}");
    assert!(
        row(2, 0).ends_with("got the buffer from rank 1 (+), got the buffer from rank 2 (+)"),
        "{r}"
    );
    assert!(
        row(4, 1).ends_with("sent the buffer → rank 3, sent the buffer → rank 4"),
        "{r}"
    );
    // Element 0 of rank r starts as r + 1: every rank ends with 1 + 2 + 3 + 4 + 5 = 15.
    for rank in 0..5 {
        assert!(
            row(4, rank).contains("|  15 ") || row(4, rank).contains("| [15]"),
            "{r}"
        );
    }
}
