//! The split example (common/examples/split.rs) as real jobs: every collective, in place
//! and out of place, checked element by element on split communicators of 1 to 8 ranks,
//! on the CPU backend and on the NCCL test double; and a rank that never calls the
//! split, named within --timeout.

use testkit::{LIMIT, finish, spawn};

/// The example's binary, built here when cargo was asked for this test alone.
fn example() -> String {
    // `cargo test` builds the examples beside the test binaries, in <target>/<profile>/
    // examples, except when asked for one test target only: then build it here.
    let exe = std::env::current_exe().unwrap();
    let bin = exe.parent().unwrap().parent().unwrap().join("examples/split");
    if !bin.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let built = std::process::Command::new(cargo)
            .args(["build", "-q", "-p", "common", "--example", "split"])
            .status();
        assert!(built.is_ok_and(|s| s.success()), "building the split example failed");
    }
    bin.to_str().unwrap().to_string()
}

/// Runs the example on `world` ranks with `args`, on the double when `gpus`.
fn job(world: usize, args: &[&str], gpus: bool) -> testkit::Run {
    let w = world.to_string();
    let mut all = vec!["--nproc-per-node", &w];
    all.extend_from_slice(args);
    if !args.contains(&"--timeout") {
        all.extend(["--timeout", "20"]);
    }
    let cmd = match gpus {
        true => {
            all.extend(["--backend", "nccl"]);
            testkit::nccl_command(&example(), &all, world)
        }
        false => testkit::command(&example(), &all),
    };
    finish(spawn(cmd), LIMIT)
}

/// The 12 checks passed, on `groups` communicators.
fn all_checked(r: &testkit::Run, groups: usize, ctx: &str) {
    assert_eq!(r.code, Some(0), "{ctx}: {r}");
    assert_eq!(r.stdout.matches("Check: OK").count(), 12, "{ctx}: {r}");
    assert!(
        r.stdout
            .contains(&format!("split: 12 collectives checked on {groups} communicator(s)")),
        "{ctx}: {r}"
    );
    assert!(!r.stdout.contains("FAILED"), "{ctx}: {r}");
}

#[test]
fn every_collective_on_split_communicators_of_1_to_8_ranks() {
    // (world, colors, extra): communicators of 1 to 8 ranks, keys in order and reversed,
    // a rank of no color.
    // Communicators of 1 (3 colors on 3 ranks), 2, 3, 4, 5, 6, 7 (8 ranks, one without a
    // color) and 8 ranks.
    let cases: [(usize, usize, &[&str]); 9] = [
        (1, 1, &[]),
        (3, 3, &[]),
        (4, 2, &[]),
        (3, 1, &["--reverse"]),
        (8, 2, &["--reverse"]),
        (5, 1, &[]),
        (7, 3, &["--nocolor-last"]),
        (8, 1, &["--nocolor-last", "--reverse"]),
        (8, 1, &[]),
    ];
    for (world, colors, extra) in cases {
        let c = colors.to_string();
        let mut args = vec!["--colors", &c];
        args.extend_from_slice(extra);
        let groups = colors.min(world - usize::from(extra.contains(&"--nocolor-last")));
        all_checked(
            &job(world, &args, false),
            groups,
            &format!("{world} ranks, {colors} colors {extra:?}"),
        );
    }
}

#[test]
fn every_collective_on_split_communicators_on_the_nccl_double() {
    // Communicators of 2 (and a rank without a color), 3, 1, 4, 7 and 8 ranks.
    for (world, colors, extra) in [
        (4usize, 2usize, &["--reverse"][..]),
        (5, 2, &["--nocolor-last"][..]),
        (6, 2, &[][..]),
        (2, 2, &[][..]),
        (8, 2, &["--reverse"][..]),
        (8, 1, &["--nocolor-last"][..]),
        (8, 1, &[][..]),
    ] {
        let c = colors.to_string();
        let mut args = vec!["--colors", &c];
        args.extend_from_slice(extra);
        all_checked(
            &job(world, &args, true),
            colors,
            &format!("{world} GPUs, {colors} colors {extra:?}"),
        );
    }
}

#[test]
fn a_rank_that_never_splits_is_named_within_the_timeout() {
    for gpus in [false, true] {
        let r = job(3, &["--skip-split", "1", "--timeout", "3"], gpus);
        assert_eq!(r.code, Some(1), "{r}");
        // The job's own time (building the example or the double is not counted).
        assert!(r.elapsed.as_secs() < 3 + 5, "{r}");
        // Ranks 0 and 2 name rank 1, whether its own deadline's words reached them first
        // ("timed out after 3 s waiting for ...") or only its end ("rank 1 is gone ...
        // while waiting for ..."): on a loaded machine the three deadlines race.
        for rank in [0, 2] {
            let line = r
                .stderr
                .lines()
                .find(|l| l.starts_with(&format!("error: rank {rank}: ")))
                .unwrap_or_else(|| panic!("no line of rank {rank}:\n{r}"));
            assert!(
                line.contains("rank 1 failed first (its connection closed): ")
                    && line.contains("waiting for every rank's color and key for the split"),
                "{r}"
            );
        }
    }
}
