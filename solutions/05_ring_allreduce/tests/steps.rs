//! `--steps` on the reference solution of exercise 5: a ring built by hand from
//! `send_recv_add` and `send_recv` is watched like the library's own (EXERCISES.md 5).

use testkit::run;

const BIN: &str = env!("CARGO_BIN_EXE_sol05-ring-allreduce");

#[test]
fn steps_show_a_hand_written_ring_step_by_step() {
    for extra in [&[][..], &["--send-first"][..]] {
        let mut args = vec![
            "--backend",
            "cpu",
            "--nproc-per-node",
            "3",
            "--count",
            "6",
            "--steps",
            "--iters",
            "2",
        ];
        args.extend(extra);
        let r = run(BIN, &args).ok();
        assert!(r.stdout.contains("Check: OK"), "{r}");
        assert_eq!(
            r.stdout.matches("Steps of the point-to-point calls on 3 ranks").count(),
            1,
            "{r}"
        );
        let block: Vec<&str> = r
            .stdout
            .lines()
            .skip_while(|l| !l.starts_with("Steps of"))
            .take_while(|l| !l.is_empty())
            .collect();
        let headings: Vec<&str> = block
            .iter()
            .filter(|l| l.starts_with("  step"))
            .map(|l| l.trim())
            .collect();
        // send then recv (--send-first) is numbered as one step, as send_recv is.
        assert_eq!(
            headings,
            ["step 1 of 4", "step 2 of 4", "step 3 of 4", "step 4 of 4"],
            "{r}"
        );
        // Step 1: rank r sends chunk r right and adds chunk r - 1 from the left.
        let at = block.iter().position(|l| l.trim() == "step 1 of 4").unwrap();
        for r0 in 0..3usize {
            let row = block[at + 1 + r0];
            let (right, left) = ((r0 + 1) % 3, (r0 + 2) % 3);
            assert!(
                row.ends_with(&format!(
                    "sent chunk {r0} → rank {right}, got chunk {left} from rank {left} (+)"
                )),
                "{row}\n{r}"
            );
        }
        // Element 0 of rank 0 starts as 1 + 0 and ends as the sum 1 + 2 + 3; the last
        // row of the last step shows every sum: 6 36 | 66 96 | 126 156.
        let last = block.last().unwrap();
        let sums: Vec<String> = ["6", "36", "66", "96", "126", "156"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let row = last.rsplit_once("|  ").unwrap().0;
        let shown: Vec<String> = row[row.find('|').unwrap()..]
            .replace(['|', '[', ']'], " ")
            .split_whitespace()
            .map(str::to_string)
            .collect();
        assert_eq!(shown, sums, "{last}");
    }
}
