//! `--steps` on the broadcast: the root's buffer goes down the chain round the ring, one
//! rank further at each step.

use testkit::run;

const BIN: &str = env!("CARGO_BIN_EXE_01-nccl-broadcast");

#[test]
fn steps_show_the_buffer_passed_down_the_chain_from_the_root() {
    let r = run(
        BIN,
        &[
            "--backend",
            "cpu",
            "--nproc-per-node",
            "4",
            "--root",
            "2",
            "--count",
            "3",
            "--steps",
            "--iters",
            "2",
        ],
    )
    .ok();
    assert!(r.stdout.contains("Check: OK"), "{r}");
    let block: Vec<&str> = r
        .stdout
        .lines()
        .skip_while(|l| !l.starts_with("Steps of broadcast on 4 ranks"))
        .take_while(|l| !l.is_empty())
        .collect();
    assert!(!block.is_empty(), "{r}");
    // Only the checked run: the two timed ones are not shown.
    assert_eq!(r.stdout.matches("Steps of broadcast").count(), 1, "{r}");
    // The chain from root 2: 2 → 3, then 3 → 0, then 0 → 1, one step each.
    let headings: Vec<&str> = block
        .iter()
        .filter(|l| l.starts_with("  step"))
        .map(|l| l.trim())
        .collect();
    assert_eq!(headings, ["step 1 of 3", "step 2 of 3", "step 3 of 3"], "{r}");
    let chain = [(2usize, 3usize), (3, 0), (0, 1)];
    for (s, (from, to)) in chain.iter().enumerate() {
        let at = block.iter().position(|l| l.trim() == headings[s]).unwrap();
        let rows = &block[at + 1..at + 5];
        for (rank, row) in rows.iter().enumerate() {
            assert!(row.trim_start().starts_with(&format!("CPU {rank} |")), "{row}");
            let words = row.rsplit_once("|  ").map(|(_, w)| w).unwrap_or("");
            let want = if rank == *from {
                format!("sent the buffer → rank {to}")
            } else if rank == *to {
                format!("got the buffer from rank {from}")
            } else {
                "-".to_string()
            };
            assert_eq!(words, want, "step {}: {r}", s + 1);
            // The rank that received marks its cells as changed, and holds 42 now.
            let changed = row.matches("[42]").count();
            assert_eq!(changed, if rank == *to { 3 } else { 0 }, "step {}: {row}", s + 1);
        }
    }
}
