//! What a student's program does that is no wrong answer, as the checker reports it
//! (issue 30, item 9), from real programs in workbook/fixtures/wrong/: a `println!` left
//! in, or megabytes printed, is named as lines the checker cannot read, the first shown
//! (cut short); a `panic!` on one rank names that rank and the student's file and line,
//! not a bug in the workbook. The checker is bounded whatever the program does: of a
//! flood it keeps a few MiB and says so, and a process the program leaves behind is neither
//! waited for nor left running.

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

/// The checker's output and its peak memory (the largest resident set of it and of the
/// processes it waited for, from wait4(2)) for `args`, with `env` added.
#[allow(clippy::zombie_processes)] // the child is waited for, by wait4 rather than Child::wait
fn with_peak_memory(args: &[&str], env: &[(&str, &str)]) -> (Run, u64) {
    use std::io::Read;
    let mut cmd = command(CHECKER, args);
    cmd.envs(env.iter().copied());
    let mut child = spawn(cmd);
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let start = std::time::Instant::now();
    // SAFETY: rusage is plain data, for which all zeroes is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let mut status = 0;
    // SAFETY: wait4 writes only the status and the rusage it is given, both ours and alive;
    // the pid is our own child, which nothing else waits for (`child` is never waited).
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!(pid, child.id() as i32, "wait4: {}", std::io::Error::last_os_error());
    let run = Run {
        code: libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)),
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
        elapsed: start.elapsed(),
    };
    // ru_maxrss is in KiB on Linux.
    (run, usage.ru_maxrss as u64 * 1024)
}

#[test]
fn a_flood_is_cut_at_a_few_mib_and_not_held_in_memory() {
    let args = [
        "check",
        "3",
        "--fixture",
        "wrong03-flood-64m",
        "--max-world",
        "2",
        "--timeout",
        "5s",
    ];
    // Checked once writing nothing (it is the solution then), so that the measured check's
    // own build is a no-op: a compiler among the processes it waits for would count in its
    // peak memory (and the workbook's other builds of it may pick other features).
    let mut cmd = command(CHECKER, &args);
    cmd.env("WORKBOOK_TEST_FLOOD_MIB", "0");
    let r = finish(spawn(cmd), LIMIT * 4);
    assert_eq!(r.code, Some(0), "writing nothing, it passes:\n{r}");
    // Each of 2 ranks writes 256 MiB on stdout, 512 MiB in all (rather than the fixture's
    // 64 MiB each, for a wide margin: the processes the checker waits for, cargo among
    // them, count in its peak too).
    let (r, peak) = with_peak_memory(&args, &[("WORKBOOK_TEST_FLOOD_MIB", "256")]);
    assert_eq!(r.code, Some(1), "{r}");
    let said = failure(&r);
    assert!(
        said[0].starts_with("the program printed lines the checker cannot read"),
        "{said:#?}\n{r}"
    );
    assert!(
        said.contains(&"stdout was cut at 8 MiB: the program wrote 512.0 MiB there, where the checker reads one JSON document (--format json)"),
        "{said:#?}\n{r}"
    );
    // What the checker holds is what it keeps, not what was written (it held all of it).
    assert!(peak < 256 << 20, "the checker's peak memory: {} MiB\n{r}", peak >> 20);
}

#[test]
fn a_process_left_behind_is_not_waited_for_nor_left_running() {
    // Rank 0 of every case starts `sleep 40`, which holds the job's stdout and stderr, and
    // leaves it. 3 cases: were the checker to wait for each, it would take 2 minutes.
    let file = std::env::temp_dir().join(format!("workbook-sleep-pids-{}", std::process::id()));
    let _ = std::fs::remove_file(&file);
    let args = [
        "check",
        "3",
        "--fixture",
        "wrong03-leave-sleep",
        "--max-world",
        "2",
        "--timeout",
        "5s",
    ];
    let mut cmd = command(CHECKER, &args);
    cmd.env("WORKBOOK_TEST_PIDS", &file);
    let r = finish(spawn(cmd), LIMIT);
    assert_eq!(r.code, Some(0), "{r}");
    assert!(r.stdout.contains("Exercise 3 passes"), "{r}");
    let pids: Vec<u32> = std::fs::read_to_string(&file)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.parse().ok())
        .collect();
    assert_eq!(pids.len(), 3, "one sleep per case: {pids:?}\n{r}");
    // Each was killed with its case's job: gone (or a zombie), never still sleeping. A
    // killed process takes a moment to be over: allowed a few seconds.
    let still_sleeping = |pid: u32| {
        !testkit::ended(pid) && std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == b"sleep\x0040\0")
    };
    for pid in pids {
        let start = std::time::Instant::now();
        while still_sleeping(pid) && start.elapsed() < std::time::Duration::from_secs(10) {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(
            !still_sleeping(pid),
            "sleep {pid} is still running after the check:\n{r}"
        );
    }
    let _ = std::fs::remove_file(&file);
}
