//! The checker against the starting files and the solutions: every starting file fails
//! every case of its check, every reference solution passes every case, for the world sizes
//! and counts EXERCISES.md names, and the failures say which ranks and elements are wrong,
//! and when a wrong answer deadlocks, that it is a deadlock.
//!
//! The starting files checked are the pristine ones in workbook/starting/
//! (`check N --starting`), not exercises/src/bin/, which the student edits: a workbook whose
//! exercises are solved stays green. The wrong answers are workbook/fixtures/wrong/.

mod support;

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
                // More than a shared-memory channel holds: a send nobody receives blocks.
                labels.push(format!("world 3, --algo {algo} --root 1 --size 16M"));
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
        13 => {
            for n in 2..=5 {
                labels.push(format!("world {n}, --count 7"));
            }
            // More than a shared-memory channel holds: without a group, a deadlock.
            labels.push("world 3, --count 1000000".into());
        }
        10 => {
            labels.push("world 1, --count 7".into());
            for n in [2, 3, 5, 8, 17] {
                for count in [1, 7, 100003] {
                    labels.push(format!("world {n}, --count {count}"));
                }
                labels.push(format!("world {n}, --count 13 --pieces 16"));
            }
        }
        14 => {
            // One rank alone, buckets of one layer, of three and of the whole model.
            for (n, mib) in [(1, "0.003"), (2, "0.008"), (3, "25"), (4, "0.003")] {
                labels.push(format!(
                    "world {n}, --layers 7 --hidden 8 --compute-us 300 --bucket-mb {mib}"
                ));
            }
        }
        12 => {
            // One node, nodes of one rank, and grids between, on the CPU backend and the double.
            for (n, p) in [(1, 1), (2, 1), (2, 2), (4, 2), (6, 3), (8, 4)] {
                labels.push(format!("world {n}, --per-node {p} --count 120000"));
            }
        }
        _ => unreachable!(),
    }
    labels
}

#[test]
fn every_starting_file_fails_every_case_and_says_which_ranks_and_elements() {
    for number in [3, 4, 5, 7, 8, 10, 12, 13, 14] {
        let n = number.to_string();
        let r = workbook(&["check", &n, "--starting", "--keep-going"]);
        assert_eq!(r.code, Some(1), "exercise {number}: {r}");
        let cases = cases(&r);
        assert_eq!(cases.len(), announced(&r), "exercise {number}: {r}");
        for (passed, label) in &cases {
            // A world of one rank sends nothing: a tree (or hierarchy) that does nothing is
            // right there.
            let alone = [10, 12].contains(&number) && label.starts_with("world 1,");
            assert_eq!(*passed, alone, "exercise {number}'s starting file on '{label}':\n{r}");
        }
        for label in required(number) {
            assert!(
                cases.iter().any(|(_, l)| *l == label),
                "exercise {number}: no case '{label}':\n{r}"
            );
        }
        assert!(r.stdout.contains("look for TODO in workbook/starting/"), "{r}");
        assert!(!r.stdout.contains("deadlock"), "wrong values are no deadlock: {r}");
        assert!(r.stdout.contains(&format!("`cargo workbook hint {number}`")), "{r}");
    }
}

#[test]
fn every_solution_passes_every_case() {
    for number in [3, 4, 5, 7, 8, 10, 12, 13, 14] {
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
    let r = workbook(&["check", "5", "--starting"]);
    assert_eq!(r.code, Some(1), "{r}");
    let lines: Vec<&str> = r.stdout.lines().map(str::trim).collect();
    for line in [
        "FAILED  world 2, --count 1",
        "rank 0: element 0 is 1 instead of 3",
        "rank 1: element 0 is 2 instead of 3",
        "the program's own check of every element: check FAILED, 2 wrong elements: rank 0: 1 wrong (element 0 is 1 instead of 3); rank 1: 1 wrong (element 0 is 2 instead of 3)",
        "run it yourself: cargo run --bin start05-ring-allreduce -- --nproc-per-node 2 --timeout 20s --count 1",
    ] {
        assert!(lines.contains(&line), "missing {line:?}:\n{r}");
    }
    // It stops at the first failing case unless --keep-going.
    assert_eq!(cases(&r).len(), 1, "{r}");

    // The broadcast from root 1: rank 0 never received, so it still holds zeros.
    let r = workbook(&["check", "4", "--starting", "--hint"]);
    assert!(
        r.stdout
            .contains("rank 0: element 0 is 0 instead of 42 (7 of the 7 elements shown are wrong)"),
        "{r}"
    );
    assert!(r.stdout.contains("Hint: Every send needs a matching recv"), "{r}");
    assert!(r.stdout.contains("`cargo workbook hint 4 --more`"), "{r}");

    // The starting sharded step does nothing: the parameters keep their i + 1, where one
    // step on 2 ranks (average gradient 1.5 (i + 1), lr 0.25) leaves 0.625 (i + 1).
    let r = workbook(&["check", "8", "--starting"]);
    assert_eq!(r.code, Some(1), "{r}");
    let lines: Vec<&str> = r.stdout.lines().map(str::trim).collect();
    for line in [
        "FAILED  world 2, --count 1",
        "rank 0: element 0 is 1 instead of 0.625",
        "rank 1: element 0 is 1 instead of 0.625",
        "the program's own check of every element: check FAILED, 2 wrong elements: rank 0: 1 wrong (element 0 is 1 instead of 0.625); rank 1: 1 wrong (element 0 is 1 instead of 0.625)",
        "run it yourself: cargo run --bin start08-sharded-update -- --nproc-per-node 2 --timeout 20s --count 1",
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

    // The student's files under a folder of the test's own, never the workbook's (a
    // student's work): the first run writes them and says so, the second finds them.
    let root = std::env::temp_dir().join(format!("workbook-list-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let dir = root.to_string_lossy().into_owned();
    let r = workbook(&["list", "--root", &dir]).ok();
    assert!(
        r.stdout
            .starts_with("Wrote 9 exercises into exercises/src/bin/, as shipped"),
        "{r}"
    );
    assert!(root.join("exercises/src/bin/ex13-grouped-alltoall.rs").is_file(), "{r}");
    let r = workbook(&["list", "--root", &dir]).ok();
    for (n, code) in [
        (3, "exercises/src/bin/ex03-average.rs"),
        (5, "exercises/src/bin/ex05-ring-allreduce.rs"),
        (7, "exercises/src/bin/ex07-packed-broadcast.rs"),
        (8, "exercises/src/bin/ex08-sharded-update.rs"),
        (10, "exercises/src/bin/ex10-tree-allreduce.rs"),
        (12, "exercises/src/bin/ex12-hierarchical-allreduce.rs"),
        (13, "exercises/src/bin/ex13-grouped-alltoall.rs"),
        (14, "exercises/src/bin/ex14-ddp-buckets.rs"),
    ] {
        assert!(
            r.stdout
                .lines()
                .any(|l| l.contains(&format!("{n}. ")) && l.contains(code)),
            "{r}"
        );
    }
    assert_eq!(r.stdout.lines().count(), 14, "chapters 1 to 14:\n{r}");
    // One column for what each row says of its code, whatever the title's length.
    let columns: Vec<Option<usize>> = r
        .stdout
        .lines()
        .map(|l| {
            let at = l.find("your code:").or_else(|| l.find("runs and questions"))?;
            Some(l[..at].chars().count())
        })
        .collect();
    assert!(
        columns.iter().all(|c| c.is_some() && *c == columns[0]),
        "misaligned:\n{r}"
    );

    let r = workbook(&["check", "1", "--root", &dir]).ok();
    assert!(r.stdout.contains("there is no code to check"), "{r}");
    std::fs::remove_dir_all(&root).unwrap();

    for (args, says) in [
        (
            vec!["check", "15"],
            "error: there is no exercise 15: the exercises are 1 to 14",
        ),
        (vec!["hint", "0"], "error: there is no exercise 0"),
        (vec!["check"], "error: say which exercise to check"),
        (
            vec!["check", "5", "--backend", "gpu"],
            "error: invalid value 'gpu' for '--backend",
        ),
        (
            vec!["check", "5", "--max-world", "65"],
            "error: invalid value '65' for '--max-world",
        ),
    ] {
        let r = workbook(&[&args[..], &["--root", &dir]].concat());
        assert_eq!(r.code, Some(2), "{args:?}: {r}");
        assert_eq!(r.stderr.lines().count(), 1, "{args:?}: one line:\n{r}");
        assert!(r.stderr.starts_with(says), "{args:?}: {r}");
        // Bad input writes nothing.
        assert!(!root.exists(), "{args:?} wrote {}", root.display());
    }
}

#[test]
fn on_nccl_too_the_solutions_pass_and_a_starting_file_fails() {
    // The NCCL test double with 4 GPUs: send_recv and the parts go through NCCL groups.
    for number in ["3", "4", "5", "7", "8", "10", "12", "13", "14"] {
        let args = ["check", number, "--solution", "--backend", "nccl", "--max-world", "4"];
        let r = finish(spawn(testkit::nccl_command(CHECKER, &args, 4)), LIMIT * 4);
        assert_eq!(r.code, Some(0), "exercise {number}: {r}");
        assert!(r.stdout.contains("runs on the nccl backend"), "{r}");
        assert!(cases(&r).iter().all(|(passed, _)| *passed), "{r}");
    }
    let args = ["check", "5", "--starting", "--backend", "nccl", "--max-world", "4"];
    let r = finish(spawn(testkit::nccl_command(CHECKER, &args, 4)), LIMIT * 4);
    assert_eq!(r.code, Some(1), "{r}");
    assert!(r.stdout.contains("rank 1: element 0 is 2 instead of 3"), "{r}");
}

#[test]
fn on_simulated_gpus_the_checker_runs_unchanged() {
    // --simulate-gpus: the NCCL backend with no GPU and no setup; worlds above 3 left out.
    let r = workbook(&["check", "5", "--solution", "--simulate-gpus", "3"]);
    assert_eq!(r.code, Some(0), "{r}");
    assert!(
        r.stdout
            .contains("runs on the nccl backend on 3 simulated GPUs (host memory)"),
        "{r}"
    );
    let worlds: Vec<String> = cases(&r)
        .iter()
        .map(|(_, c)| c.split(',').next().unwrap().to_string())
        .collect();
    assert!(worlds.iter().all(|w| w == "world 2" || w == "world 3"), "{worlds:?}");
    assert!(worlds.contains(&"world 3".to_string()), "{r}");
    let r = workbook(&["check", "5", "--starting", "--simulate-gpus", "2"]);
    assert_eq!(r.code, Some(1), "{r}");
    assert!(r.stdout.contains("rank 1: element 0 is 2 instead of 3"), "{r}");
    assert!(r.stdout.contains("--simulate-gpus 2 --count 1"), "the rerun line:\n{r}");
    let r = workbook(&["check", "5", "--simulate-gpus", "2", "--backend", "nccl"]);
    assert_eq!(r.code, Some(2), "{r}");
}

#[test]
fn the_nccl_backend_where_it_cannot_run_is_refused_once_not_failed_case_by_case() {
    // A machine with an NVIDIA driver runs it: nothing to refuse there.
    if std::path::Path::new("/proc/driver/nvidia").exists() {
        return;
    }
    // Before: every exercise's first case FAILED, then "Exercise 14 is not done yet: look
    // for TODO", or of the solution "this is a bug in the workbook".
    for source in ["--starting", "--solution"] {
        let r = workbook(&["check", "14", source, "--backend", "nccl"]);
        assert_eq!(r.code, Some(2), "{r}");
        assert!(r.stdout.is_empty(), "{r}");
        let lines: Vec<&str> = r.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{r}");
        assert!(lines[0].starts_with("error: --backend nccl cannot run here: "), "{r}");
        assert!(lines[0].contains("--simulate-gpus N"), "{r}");
    }
}

#[test]
fn a_timeout_too_short_for_a_job_to_start_is_refused_not_blamed_on_the_code() {
    // Before: every case failed, and of the solution the checker said "this is a bug in
    // the workbook".
    let r = workbook(&["check", "14", "--solution", "--timeout", "1ms"]);
    assert_eq!(r.code, Some(2), "{r}");
    assert!(r.stdout.is_empty(), "{r}");
    assert_eq!(r.stderr.lines().count(), 1, "{r}");
    assert!(r.stderr.contains("give 1s or more"), "{r}");
}

/// The deadlock's explanation, as the checker prints it: one paragraph over several lines.
fn explanation(r: &Run) -> String {
    let from = r
        .stdout
        .find("This is a deadlock: ")
        .unwrap_or_else(|| panic!("no deadlock named:\n{r}"));
    let to = r.stdout[from..]
        .find("run it yourself")
        .map_or(r.stdout.len(), |i| from + i);
    r.stdout[from..to].split_whitespace().collect::<Vec<_>>().join(" ")
}

#[test]
fn a_deadlock_is_named_as_one_with_its_usual_causes() {
    // Every rank receives from its left neighbour before it sends to its right (a real
    // program, workbook/fixtures/wrong/04_receive_first.rs): nobody ever sends.
    let r = workbook(&["check", "4", "--fixture", "wrong04-receive-first", "--timeout", "3s"]);
    assert_eq!(r.code, Some(1), "{r}");
    assert_eq!(
        cases(&r),
        [(false, "world 2, --algo star --root 1 --count 7".to_string())],
        "{r}"
    );
    // The ranks' own lines still come first.
    assert!(
        r.stdout.contains("error: rank 1: receiving 7 elements from (rank 0 ")
            || r.stdout.contains("error: rank 0: receiving 7 elements from (rank 1 "),
        "{r}"
    );
    let said = explanation(&r);
    for words in [
        "This is a deadlock: rank 0 was receiving from rank 1; rank 1 was receiving from rank 0.",
        "Each rank waited for a rank that was itself waiting, so none could ever go on, and --timeout ended the job.",
        "both ranks of a pair send first, or both receive first, or a ring in which every rank waits for its left \
         neighbour before it sends to its right.",
        "Here every rank receives first: nobody sends, so nothing ever arrives.",
        "or use send_recv, which sends and receives at once.",
    ] {
        assert!(said.contains(words), "missing {words:?} in {said:?}:\n{r}");
    }

    // Every rank of a ring sends first (EXERCISES.md 5c): the small cases pass, the large
    // one deadlocks, every rank in its send to the right.
    let r = workbook(&["check", "5", "--fixture", "wrong05-send-first", "--timeout", "3s"]);
    assert_eq!(r.code, Some(1), "{r}");
    let failed: Vec<_> = cases(&r).into_iter().filter(|(ok, _)| !ok).collect();
    assert_eq!(failed, [(false, "world 3, --count 8000000".to_string())], "{r}");
    let said = explanation(&r);
    assert!(
        said.contains(
            "This is a deadlock: rank 0 was sending to rank 1; rank 1 was sending to rank 2; rank 2 was sending to rank 0."
        ),
        "{said:?}:\n{r}"
    );
    assert!(said.contains("Here every rank sends first"), "{said:?}:\n{r}");
}

#[test]
fn on_nccl_a_deadlock_is_named_as_one_too() {
    let args = [
        "check",
        "4",
        "--fixture",
        "wrong04-receive-first",
        "--timeout",
        "3s",
        "--backend",
        "nccl",
        "--max-world",
        "3",
    ];
    let r = finish(spawn(testkit::nccl_command(CHECKER, &args, 3)), LIMIT * 4);
    assert_eq!(r.code, Some(1), "{r}");
    assert!(
        r.stdout.contains("(ncclSend)") || r.stdout.contains("(ncclRecv)"),
        "{r}"
    );
    let said = explanation(&r);
    assert!(
        said.starts_with("This is a deadlock: rank 0 was waiting for its GPU to finish a "),
        "{said:?}:\n{r}"
    );
    assert!(
        said.contains("put the send and the receive of a step in one ncclGroupStart/ncclGroupEnd"),
        "{said:?}:\n{r}"
    );
    assert!(said.contains("both receive first"), "{said:?}:\n{r}");
}

#[test]
fn a_message_nobody_receives_fails_the_job_naming_sender_receiver_and_size() {
    // A chain whose last rank also sends to the root (workbook/fixtures/wrong/04_extra_send.rs):
    // every rank still ends with the root's values. On 2 ranks with root 1, rank 0 is the last
    // and sends 7 elements (28 B) to rank 1, once per broadcast, which never receives them.
    let bin = support::built("wrong04-extra-send");
    let exe = bin.to_str().unwrap();
    let base = [
        "--nproc-per-node",
        "2",
        "--root",
        "1",
        "--algo",
        "chain",
        "--count",
        "7",
        "--timeout",
        "3s",
    ];
    for transport in ["shm", "tcp"] {
        let mut args = base.to_vec();
        args.extend(["--iters", "1", "--transport", transport]);
        let r = finish(spawn(command(exe, &args)), LIMIT);
        assert_eq!(r.code, Some(1), "{transport}: {r}");
        let line = r
            .stderr
            .lines()
            .find(|l| l.contains("never received"))
            .unwrap_or_else(|| panic!("{transport}: no line says so:\n{r}"));
        assert!(
            line.starts_with("error: rank 0: rank 0 sent ")
                && line.contains(
                    " B) to rank 1 that rank 1 never received (sends with no matching recv: NCCL would hang here)"
                ),
            "{transport}: {line}"
        );
        assert!(!r.stderr.contains("panicked"), "{r}");
    }
    // On NCCL (its test double) such a send hangs: the rank says why when its --timeout ends.
    let mut args = base.to_vec();
    args.extend(["--simulate-gpus", "2"]);
    let r = finish(spawn(command(exe, &args)), LIMIT);
    assert_eq!(r.code, Some(1), "{r}");
    assert!(
        r.stderr.contains(
            "error: rank 0: rank 0 sent 28 B to rank 1 that rank 1 never received (a send with no matching recv: \
             NCCL hangs here)"
        ),
        "{r}"
    );

    // The checker fails every case, the one larger than a shared-memory channel too (there
    // the send blocks): no hang, and the rank stuck in it is read first.
    let r = workbook(&[
        "check",
        "4",
        "--fixture",
        "wrong04-extra-send",
        "--keep-going",
        "--timeout",
        "3s",
    ]);
    assert_eq!(r.code, Some(1), "{r}");
    let cases = cases(&r);
    assert_eq!(cases.len(), announced(&r), "{r}");
    assert!(cases.iter().all(|(passed, _)| !passed), "{r}");
    let lines: Vec<&str> = r.stdout.lines().map(str::trim).collect();
    let at = lines
        .iter()
        .position(|l| *l == "FAILED  world 3, --algo chain --root 1 --size 16M")
        .unwrap_or_else(|| panic!("no 16M case:\n{r}"));
    assert!(
        r.stdout
            .contains("This is a send with no matching recv: rank 0 sent to rank 1, and rank 1 went on without"),
        "{r}"
    );
    let first_error = lines[at..].iter().find(|l| l.starts_with("error: ")).unwrap();
    assert!(
        first_error.starts_with("error: rank 0: rank 0 sent 16.0 MiB to rank 1 that rank 1 never received"),
        "the rank everyone waited on first: {first_error}\n{r}"
    );
}

#[test]
fn output_to_a_closed_pipe_ends_quietly() {
    use std::io::{BufRead, BufReader};
    // `cargo workbook check 8 | head -1`, and a lesson's `| head -1`: the reader goes away
    // after one line; the writer ends with status 0, and says nothing of it.
    let lesson = support::built("02-nccl-allreduce");
    for (bin, args) in [
        (CHECKER.to_string(), vec!["check", "8", "--solution"]),
        (lesson.to_string_lossy().to_string(), vec!["--nproc-per-node", "3"]),
    ] {
        let mut child = spawn(command(&bin, &args));
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut first = String::new();
        out.read_line(&mut first).unwrap();
        assert!(!first.is_empty(), "{bin}: no output");
        drop(out);
        let mut stderr = String::new();
        let _ = std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr);
        let start = std::time::Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if start.elapsed() > LIMIT * 4 {
                let _ = child.kill();
                panic!("{bin}: still running after {:?}:\n{stderr}", LIMIT * 4);
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        assert_eq!(status.code(), Some(0), "{bin}: {status}:\n{stderr}");
        assert!(!stderr.contains("panicked"), "{bin}:\n{stderr}");
        assert!(!stderr.contains("Broken pipe"), "{bin}:\n{stderr}");
    }
}

#[test]
fn a_hint_nudges_and_more_says_the_solution() {
    // Every exercise, with code or not, has its solution in words.
    for number in (1..=13).map(|n| n.to_string()) {
        let number = number.as_str();
        let hint = workbook(&["hint", number]).ok();
        let more = workbook(&["hint", number, "--more"]).ok();
        assert!(
            hint.stdout.contains(&format!("`cargo workbook hint {number} --more`")),
            "{hint}"
        );
        assert!(
            more.stdout.starts_with(&format!("The solution of exercise {number} (")),
            "{more}"
        );
        assert_ne!(hint.stdout, more.stdout);
    }
    // The nudge names no call that solves it; the solution in words does (wrapped anywhere).
    let flat = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let (hint, more) = (workbook(&["hint", "5"]).ok(), workbook(&["hint", "5", "--more"]).ok());
    assert!(!hint.stdout.contains("c(rank + n - t)"), "{hint}");
    assert!(flat(&more.stdout).contains("c(rank + n - t)"), "{more}");
    let (hint, more) = (workbook(&["hint", "3"]).ok(), workbook(&["hint", "3", "--more"]).ok());
    assert!(!hint.stdout.contains("x / n"), "{hint}");
    assert!(flat(&more.stdout).contains("x / n"), "{more}");
    let (hint, more) = (workbook(&["hint", "12"]).ok(), workbook(&["hint", "12", "--more"]).ok());
    assert!(!hint.stdout.contains("reduce_scatter_into"), "{hint}");
    assert!(
        flat(&more.stdout).contains("s.all_reduce(shard, ReduceOp::Sum)"),
        "{more}"
    );
    let (hint, more) = (workbook(&["hint", "10"]).ok(), workbook(&["hint", "10", "--more"]).ok());
    assert!(!hint.stdout.contains("recv_add_part"), "{hint}");
    assert!(
        flat(&more.stdout).contains("recv_add_part(buf, piece(k), child)"),
        "{more}"
    );
}

#[test]
fn the_starting_tree_passes_one_rank_and_fails_two_as_chapter_10_says() {
    // EXERCISES.md 10: "you will see it pass on one rank, where there is nothing to send,
    // and fail on two: `rank 0: element 0 is 1 instead of 3`".
    let r = workbook(&["check", "10", "--starting"]);
    assert_eq!(r.code, Some(1), "{r}");
    assert_eq!(
        cases(&r),
        [
            (true, "world 1, --count 7".to_string()),
            (false, "world 2, --count 1".to_string())
        ],
        "{r}"
    );
    assert!(r.stdout.contains("rank 0: element 0 is 1 instead of 3"), "{r}");
}

#[test]
fn an_all_to_all_without_its_group_deadlocks_on_large_blocks_and_the_checker_says_so() {
    // Exercise 13's sends and receives made one by one (workbook/fixtures/wrong/13_no_group.rs):
    // the small blocks pass (a send returns once its data fits in the link), the one larger
    // than a shared-memory channel deadlocks, every rank in its first send.
    let r = workbook(&["check", "13", "--fixture", "wrong13-no-group", "--timeout", "3s"]);
    assert_eq!(r.code, Some(1), "{r}");
    let failed: Vec<_> = cases(&r).into_iter().filter(|(ok, _)| !ok).collect();
    assert_eq!(failed, [(false, "world 3, --count 1000000".to_string())], "{r}");
    // Each rank's own line: which send waits for which rank, and what that rank waits in.
    for rank in 0..3 {
        let line = r
            .stdout
            .lines()
            .map(str::trim)
            .find(|l| l.starts_with(&format!("error: rank {rank}: ")))
            .unwrap_or_else(|| panic!("no line of rank {rank}:\n{r}"));
        assert!(line.contains(": its send of 3.8 MiB to rank "), "{line}\n{r}");
        assert!(line.contains(" is in a send too, to rank "), "{line}\n{r}");
        assert!(line.contains("in one group: session.group()"), "{line}\n{r}");
    }
    let said = explanation(&r);
    assert!(
        said.starts_with("This is a deadlock: rank 0 was sending to rank 1;"),
        "{said:?}:\n{r}"
    );
    assert!(said.contains("Here every rank sends first"), "{said:?}:\n{r}");
    assert!(
        said.contains("Or issue a rank's sends and receives together, in one group (s.group(), then g.end())"),
        "{said:?}:\n{r}"
    );
}

#[test]
fn reset_puts_an_exercise_back_as_shipped_and_says_so() {
    // Under a folder of its own, never the workbook's exercises/ (a student's work).
    let root = std::env::temp_dir().join(format!("workbook-reset-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let dir = root.to_string_lossy().into_owned();
    let file = root.join("exercises/src/bin/ex05-ring-allreduce.rs");
    let shipped = include_str!("../starting/05_ring_allreduce.rs");
    // Written where it was missing, then left alone when it is as shipped.
    let r = workbook(&["reset", "5", "--root", &dir]).ok();
    assert!(
        r.stdout
            .contains("exercises/src/bin/ex05-ring-allreduce.rs is as shipped again"),
        "{r}"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), shipped);
    let r = workbook(&["reset", "5", "--root", &dir]).ok();
    assert!(r.stdout.contains("is as shipped already: nothing to reset"), "{r}");
    // A changed file is put back.
    std::fs::write(&file, "fn main() {} // solved, or broken\n").unwrap();
    let r = workbook(&["reset", "5", "--root", &dir]).ok();
    assert!(r.stdout.contains("is as shipped again"), "{r}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), shipped);
    // A chapter without code, and no such exercise: one line, exit 2.
    for (n, said) in [
        ("1", "exercise 1 has no code to reset"),
        ("99", "there is no exercise 99"),
    ] {
        let r = workbook(&["reset", n, "--root", &dir]);
        assert_eq!(r.code, Some(2), "{r}");
        assert_eq!(r.stderr.lines().count(), 1, "{r}");
        assert!(r.stderr.contains(said), "{r}");
    }
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn buckets_waited_at_once_issued_late_or_never_waited_are_named() {
    for (bin, says) in [
        ("wrong14-wait-each", "bucket 1 was waited at"),
        ("wrong14-late", "after the next layer's backward had started"),
        ("wrong14-no-wait", "collectives issued on the stream were never waited"),
    ] {
        let r = workbook(&["check", "14", "--fixture", bin]);
        assert_eq!(r.code, Some(1), "{bin}: {r}");
        assert!(r.stdout.contains(says), "{bin}: {r}");
        // Their values are right, or never read: the failure is the buckets', not an element's.
        assert!(!r.stdout.contains(" instead of "), "{bin}: {r}");
    }
    // On simulated GPUs a layer is a kernel, and a bucket issued after the next layer's
    // launch is late there too.
    let r = workbook(&["check", "14", "--fixture", "wrong14-late", "--simulate-gpus", "2"]);
    assert_eq!(r.code, Some(1), "{r}");
    assert!(r.stdout.contains("after the next layer's backward had started"), "{r}");
}

#[test]
fn a_report_that_lacks_the_elements_a_case_checks_fails_it() {
    // No all-to-all, only a report whose every row is empty and whose check says ok
    // (workbook/fixtures/wrong/13_forged.rs): no element is wrong, since none is there.
    let r = workbook(&["check", "13", "--fixture", "wrong13-forged", "--keep-going"]);
    assert_eq!(r.code, Some(1), "{r}");
    let cases = cases(&r);
    assert_eq!(cases.len(), announced(&r), "{r}");
    assert!(cases.iter().all(|(passed, _)| !passed), "{r}");
    let lines: Vec<&str> = r.stdout.lines().map(str::trim).collect();
    // Every rank of every case, with how many elements the case checks: --show 16 of
    // each of the world's blocks.
    for (world, count, shown) in [(2, 7, 14), (3, 7, 21), (5, 100003, 80), (3, 1000000, 48)] {
        let at = lines
            .iter()
            .position(|l| *l == format!("FAILED  world {world}, --count {count}"))
            .unwrap_or_else(|| panic!("no case of world {world}, --count {count}:\n{r}"));
        for rank in 0..world {
            let line = format!("rank {rank}: its 'after' row has 0 elements instead of the {shown} the case checks");
            assert!(
                lines[at + 1..]
                    .iter()
                    .take_while(|l| !l.starts_with("run it yourself"))
                    .any(|l| l.starts_with(&line)),
                "missing {line:?} under world {world}, --count {count}:\n{r}"
            );
        }
    }
}
