//! The checker against the committed exercises: every starting file fails every case of
//! its check, every reference solution passes every case, for the world sizes and counts
//! EXERCISES.md names, and the failures say which ranks and elements are wrong.
//!
//! These guard the starting files as committed: in a copy where you have solved an
//! exercise, `every_starting_file_fails` fails for it, as it should.

use testkit::{LIMIT, Run, command, finish, spawn};

const CHECKER: &str = env!("CARGO_BIN_EXE_workbook");

/// `workbook ARGS`, with the --timeout the tests give the programs (testkit's).
fn workbook(args: &[&str]) -> Run {
    finish(spawn(command(CHECKER, args)), LIMIT * 4)
}

/// The case lines of a check's output: (passed, label).
fn cases(r: &Run) -> Vec<(bool, String)> {
    r.stdout
        .lines()
        .filter_map(|l| {
            l.strip_prefix("  ok      ")
                .map(|c| (true, c.to_string()))
                .or_else(|| l.strip_prefix("  FAILED  ").map(|c| (false, c.to_string())))
        })
        .collect()
}

/// How many runs the check's header announces.
fn announced(r: &Run) -> usize {
    let head = r
        .stdout
        .lines()
        .find(|l| l.contains(" runs on the "))
        .expect("a header");
    let before = head.split(" runs on the ").next().unwrap();
    before.rsplit(' ').next().unwrap().parse().unwrap()
}

/// Each exercise, with labels that its check must include: the world sizes and counts
/// EXERCISES.md promises.
fn required(number: u32) -> Vec<String> {
    let mut labels = Vec::new();
    match number {
        3 => {
            for n in 2..=5 {
                labels.push(format!("world {n}, --init rank --count 7"));
            }
        }
        4 => {
            for algo in ["star", "chain", "pipeline"] {
                labels.push(format!("world 2, --algo {algo} --root 1 --count 7"));
                labels.push(format!("world 5, --algo {algo} --root 4 --count 100003"));
            }
        }
        5 => {
            for n in 2..=5 {
                for count in [1, 7, 13, 100003] {
                    labels.push(format!("world {n}, --count {count}"));
                }
            }
            labels.push("world 3, --count 8000000".into());
        }
        7 => {
            for method in ["each", "packed"] {
                labels.push(format!("world 5, --method {method} --root 2 --layers 0 --hidden 1"));
            }
        }
        8 => {
            for n in 2..=5 {
                for count in [1, 7, 100003] {
                    labels.push(format!("world {n}, --count {count}"));
                }
            }
            labels.push("world 3, --count 13 --lr 0.125".into());
        }
        _ => unreachable!(),
    }
    labels
}

#[test]
fn every_starting_file_fails_every_case_and_says_which_ranks_and_elements() {
    for number in [3, 4, 5, 7, 8] {
        let n = number.to_string();
        let r = workbook(&["check", &n, "--keep-going"]);
        assert_eq!(r.code, Some(1), "exercise {number}: {r}");
        let cases = cases(&r);
        assert_eq!(cases.len(), announced(&r), "exercise {number}: {r}");
        for (passed, label) in &cases {
            assert!(
                !passed,
                "exercise {number}'s starting file passes '{label}' (did you solve it in this copy?):\n{r}"
            );
        }
        for label in required(number) {
            assert!(
                cases.iter().any(|(_, l)| *l == label),
                "exercise {number}: no case '{label}':\n{r}"
            );
        }
        assert!(r.stdout.contains("look for TODO in exercises/"), "{r}");
        assert!(r.stdout.contains(&format!("`cargo workbook hint {number}`")), "{r}");
    }
}

#[test]
fn every_solution_passes_every_case() {
    for number in [3, 4, 5, 7, 8] {
        let n = number.to_string();
        let r = workbook(&["check", &n, "--solution"]);
        assert_eq!(r.code, Some(0), "exercise {number}: {r}");
        let cases = cases(&r);
        assert_eq!(cases.len(), announced(&r), "exercise {number}: {r}");
        assert!(cases.iter().all(|(passed, _)| *passed), "exercise {number}: {r}");
        for label in required(number) {
            assert!(
                cases.iter().any(|(_, l)| *l == label),
                "exercise {number}: no case '{label}':\n{r}"
            );
        }
        assert!(r.stdout.contains(&format!("Exercise {number} passes")), "{r}");
    }
}

#[test]
fn a_failure_names_ranks_elements_and_the_command_to_rerun_it() {
    // The starting ring does nothing: rank r keeps r + 1 + 10 (i mod 1000), where every
    // rank should hold the sum 3 + 20 (i mod 1000) on 2 ranks.
    let r = workbook(&["check", "5"]);
    assert_eq!(r.code, Some(1), "{r}");
    let lines: Vec<&str> = r.stdout.lines().map(str::trim).collect();
    for line in [
        "FAILED  world 2, --count 1",
        "rank 0: element 0 is 1 instead of 3",
        "rank 1: element 0 is 2 instead of 3",
        "the program's own check of every element: check FAILED, 2 wrong elements: rank 0: 1 wrong (element 0 is 1 instead of 3); rank 1: 1 wrong (element 0 is 2 instead of 3)",
        "run it yourself: cargo run --bin ex05-ring-allreduce -- --nproc-per-node 2 --timeout 20s --count 1",
    ] {
        assert!(lines.contains(&line), "missing {line:?}:\n{r}");
    }
    // It stops at the first failing case unless --keep-going.
    assert_eq!(cases(&r).len(), 1, "{r}");

    // The broadcast from root 1: rank 0 never received, so it still holds zeros.
    let r = workbook(&["check", "4", "--hint"]);
    assert!(
        r.stdout
            .contains("rank 0: element 0 is 0 instead of 42 (7 of the 7 elements shown are wrong)"),
        "{r}"
    );
    assert!(r.stdout.contains("Hint: Every send needs a matching recv"), "{r}");

    // The starting sharded step does nothing: the parameters keep their i + 1, where one
    // step on 2 ranks (average gradient 1.5 (i + 1), lr 0.25) leaves 0.625 (i + 1).
    let r = workbook(&["check", "8"]);
    assert_eq!(r.code, Some(1), "{r}");
    let lines: Vec<&str> = r.stdout.lines().map(str::trim).collect();
    for line in [
        "FAILED  world 2, --count 1",
        "rank 0: element 0 is 1 instead of 0.625",
        "rank 1: element 0 is 1 instead of 0.625",
        "the program's own check of every element: check FAILED, 2 wrong elements: rank 0: 1 wrong (element 0 is 1 instead of 0.625); rank 1: 1 wrong (element 0 is 1 instead of 0.625)",
        "run it yourself: cargo run --bin ex08-sharded-update -- --nproc-per-node 2 --timeout 20s --count 1",
    ] {
        assert!(lines.contains(&line), "missing {line:?}:\n{r}");
    }
}

#[test]
fn hints_list_and_bad_input() {
    let r = workbook(&["hint", "5"]).ok();
    assert!(
        r.stdout
            .starts_with("Hint for exercise 5 (ring all-reduce from point-to-point):"),
        "{r}"
    );
    assert!(r.stdout.contains("send_recv"), "{r}");

    let r = workbook(&["list"]).ok();
    for (n, code) in [
        (3, "exercises/03_average"),
        (5, "exercises/05_ring_allreduce"),
        (7, "exercises/07_packed_broadcast"),
        (8, "exercises/08_sharded_update"),
    ] {
        assert!(
            r.stdout
                .lines()
                .any(|l| l.contains(&format!("{n}. ")) && l.contains(code)),
            "{r}"
        );
    }
    assert_eq!(r.stdout.lines().count(), 9, "chapters 1 to 9:\n{r}");

    let r = workbook(&["check", "1"]).ok();
    assert!(r.stdout.contains("there is no code to check"), "{r}");

    for (args, says) in [
        (
            vec!["check", "10"],
            "error: there is no exercise 10: the exercises are 1 to 9",
        ),
        (vec!["hint", "0"], "error: there is no exercise 0"),
        (vec!["check"], "error: say which exercise to check"),
        (
            vec!["check", "5", "--backend", "gpu"],
            "error: invalid value 'gpu' for '--backend",
        ),
        (
            vec!["check", "5", "--max-world", "9"],
            "error: invalid value '9' for '--max-world",
        ),
    ] {
        let r = workbook(&args);
        assert_eq!(r.code, Some(2), "{args:?}: {r}");
        assert_eq!(r.stderr.lines().count(), 1, "{args:?}: one line:\n{r}");
        assert!(r.stderr.starts_with(says), "{args:?}: {r}");
    }
}

#[test]
fn on_nccl_too_the_solutions_pass_and_a_starting_file_fails() {
    // The NCCL test double with 4 GPUs: send_recv and the parts go through NCCL groups.
    for number in ["3", "4", "5", "7", "8"] {
        let args = ["check", number, "--solution", "--backend", "nccl", "--max-world", "4"];
        let r = finish(spawn(testkit::nccl_command(CHECKER, &args, 4)), LIMIT * 4);
        assert_eq!(r.code, Some(0), "exercise {number}: {r}");
        assert!(r.stdout.contains("runs on the nccl backend"), "{r}");
        assert!(cases(&r).iter().all(|(passed, _)| *passed), "{r}");
    }
    let args = ["check", "5", "--backend", "nccl", "--max-world", "4"];
    let r = finish(spawn(testkit::nccl_command(CHECKER, &args, 4)), LIMIT * 4);
    assert_eq!(r.code, Some(1), "{r}");
    assert!(r.stdout.contains("rank 1: element 0 is 2 instead of 3"), "{r}");
}
