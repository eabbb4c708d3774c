//! What a student's program does that is no wrong answer, as the checker reports it
//! (issue 30, item 9), from real programs in workbook/fixtures/wrong/: a `println!` left
//! in, or megabytes printed, is named as lines the checker cannot read, the first shown
//! (cut short); a `panic!` on one rank names that rank and the student's file and line,
//! not a bug in the workbook.

use testkit::{LIMIT, Run, command, finish, spawn};

const CHECKER: &str = env!("CARGO_BIN_EXE_workbook");

fn check_fixture(bin: &str) -> Run {
    finish(
        spawn(command(CHECKER, &["check", "3", "--fixture", bin, "--timeout", "5s"])),
        LIMIT * 4,
    )
}

/// The lines under the first failed case, up to `run it yourself`.
fn failure(r: &Run) -> Vec<&str> {
    r.stdout
        .lines()
        .skip_while(|l| !l.starts_with("  FAILED  "))
        .skip(1)
        .take_while(|l| !l.contains("run it yourself"))
        .map(str::trim)
        .collect()
}

#[test]
fn a_println_in_the_students_code_is_named_and_shown() {
    let r = check_fixture("wrong03-println");
    assert_eq!(r.code, Some(1), "{r}");
    let said = failure(&r);
    assert!(
        said[0].starts_with("the program printed lines the checker cannot read"),
        "{said:#?}\n{r}"
    );
    assert_eq!(said[1], "debug: dividing by 2", "{said:#?}\n{r}");
    assert!(!r.stdout.contains("(exit status 0), saying:"), "{r}");
}

#[test]
fn megabytes_of_output_are_named_and_their_first_line_cut_short() {
    let r = check_fixture("wrong03-flood");
    assert_eq!(r.code, Some(1), "{r}");
    let said = failure(&r);
    assert!(
        said[0].starts_with("the program printed lines the checker cannot read"),
        "{said:#?}\n{r}"
    );
    // 160 characters, then how many more (the ranks' lines may run into each other).
    let (shown, more) = said[1]
        .split_once("… (")
        .unwrap_or_else(|| panic!("not cut: {said:#?}"));
    assert_eq!(shown, "x".repeat(160), "{said:#?}");
    let more: usize = more.trim_end_matches(" more characters)").parse().unwrap();
    assert!(more >= (4 << 20) - 160, "{said:#?}");
    assert!(r.stdout.len() < 10_000, "{} bytes printed", r.stdout.len());
}

#[test]
fn a_panic_in_the_students_code_names_the_rank_and_the_line() {
    let r = check_fixture("wrong03-panic");
    assert_eq!(r.code, Some(1), "{r}");
    let said = failure(&r);
    assert!(said.iter().any(|l| l.starts_with("the job failed")), "{said:#?}\n{r}");
    let panic = said
        .iter()
        .find(|l| l.contains("panicked"))
        .unwrap_or_else(|| panic!("no panic named:\n{r}"));
    assert!(
        panic.starts_with("error: rank 1 panicked at workbook/fixtures/wrong/03_panic.rs:26: index out of bounds"),
        "{panic}\n{r}"
    );
    assert!(!r.stdout.contains("a bug in the workbook"), "{r}");
    // The program itself says so, on the rank's line (common's panic hook): the checker
    // built it beside itself.
    let program = std::path::Path::new(CHECKER).with_file_name("wrong03-panic");
    let own = finish(
        spawn(command(
            &program.to_string_lossy(),
            &[
                "--nproc-per-node",
                "2",
                "--timeout",
                "5s",
                "--init",
                "rank",
                "--count",
                "1",
            ],
        )),
        LIMIT,
    );
    assert_eq!(own.code, Some(1), "{own}");
    assert!(
        own.stderr
            .lines()
            .any(|l| l
                .starts_with("error: rank 1: panicked at workbook/fixtures/wrong/03_panic.rs:26: index out of bounds")),
        "{own}"
    );
    assert!(!own.stderr.contains("a bug in the workbook"), "{own}");
}
