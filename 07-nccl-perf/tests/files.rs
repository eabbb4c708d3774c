//! Files from outside the benchmark (issue 30, item 4): results given to `--plot-with`
//! are read within a bound, and non-regular files and absurd values are refused in one
//! line (exit 2); paths are taken as the OS gives them, not only as UTF-8; a picture that
//! cannot be written is refused before any rank starts, and one that fails at the end
//! says why in one readable line, not in Rust's debug form.
//!
//! The runs that read hostile files do so under `ulimit -v` (4 GB), so that a program that
//! would read without bound fails fast here rather than filling the machine's memory.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use testkit::{Capability, Run, finish_or_kill, spawn};

const BIN: &str = env!("CARGO_BIN_EXE_07-nccl-perf");

/// A small, quick sweep on one rank.
const SWEEP: &str = "-b 4 -e 64 -f 4 -n 1 -w 0 --nproc-per-node 1";

/// A fresh folder for one test's files.
fn folder(test: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("files-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs the benchmark with `args` under a 4 GB address-space limit, for at most 30 s;
/// fails the test if it had to be killed (a read that waits forever).
fn perf(args: &[&OsStr]) -> Run {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg("ulimit -v 4000000; exec \"$0\" \"$@\"")
        .arg(BIN)
        .args(args)
        .args(["--timeout", testkit::TIMEOUT]);
    testkit::clear_job_env(&mut cmd);
    let (run, in_time) = finish_or_kill(spawn(cmd), Duration::from_secs(30));
    assert!(in_time, "the run was killed after 30 s (a read without end?):\n{run}");
    run
}

fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

/// A result as `--format json` saves it, with `busbw` as the first row's bus bandwidth.
fn result(busbw: &str) -> String {
    format!(
        r#"{{"backend": "cpu", "world_size": 2, "transports": {{"0-1": "shm"}}, "ranks": [{{"host": "vm"}}],
            "op": "all_reduce", "type": "float", "redop": "sum", "memcpy_gbps": 10.0,
            "rows": [{{"size": 4, "out_of_place": {{"time_us": 10.0, "busbw": {busbw}}}}},
                     {{"size": 1024, "out_of_place": {{"time_us": 20.0, "busbw": 0.1}}}}]}}"#
    )
}

/// Checks a refusal: exit 2, one line on stderr that says `why`, no rank started.
fn refused(r: &Run, why: &str) {
    assert_eq!(r.code, Some(2), "{r}");
    assert_eq!(r.stderr.trim().lines().count(), 1, "{r}");
    assert!(r.stderr.starts_with("error: "), "{r}");
    assert!(r.stderr.contains(why), "no '{why}' in:\n{r}");
    assert!(
        !r.stderr.contains("panicked") && !r.stderr.contains("internal error"),
        "{r}"
    );
    assert!(r.stdout.is_empty(), "a rank started:\n{r}");
}

/// `--plot DIR/p.png --plot-with FILE --no-run`.
fn plot_with(dir: &Path, file: &Path) -> Run {
    let png = dir.join("p.png");
    perf(&[
        os("--plot"),
        png.as_os_str(),
        os("--plot-with"),
        file.as_os_str(),
        os("--no-run"),
    ])
}

#[test]
fn saved_results_are_read_within_a_bound_and_absurd_ones_refused_in_one_line() {
    let dir = folder("results");
    // A device: read without end before (until memory ran out).
    refused(&plot_with(&dir, Path::new("/dev/zero")), "not a regular file");
    // A FIFO nobody writes to: opening it waited for a writer, forever.
    let fifo = dir.join("fifo.json");
    let made = Command::new("mkfifo").arg(&fifo).status().is_ok_and(|s| s.success());
    if made {
        refused(&plot_with(&dir, &fifo), "FIFO");
    } else {
        testkit::skip(Capability::Fifo, "mkfifo is not here: the FIFO case is skipped");
    }
    // A file over the bound (sparse: it takes no room).
    let huge = dir.join("huge.json");
    std::fs::File::create(&huge).unwrap().set_len(100 << 20).unwrap();
    refused(&plot_with(&dir, &huge), "longer than the 64 MiB");
    // Absurd values: busbw 1e308 asked for a 16 GiB allocation (and aborted under the
    // limit); a negative one was drawn as if it were a result.
    for (busbw, said) in [
        ("1e308", "busbw 1e308 is out of range"),
        ("-5", "busbw -5 is out of range"),
    ] {
        let file = dir.join(format!("busbw{busbw}.json"));
        std::fs::write(&file, result(busbw)).unwrap();
        refused(&plot_with(&dir, &file), said);
    }
    let fine = dir.join("fine.json");
    std::fs::write(&fine, result("0.001")).unwrap();
    let r = plot_with(&dir, &fine);
    assert_eq!(r.code, Some(0), "{r}");
    assert!(dir.join("p.png").is_file());
}

#[test]
fn paths_are_taken_as_the_os_gives_them() {
    // Names that are not UTF-8: a result saved under one, a picture drawn into another.
    let dir = folder("bytes");
    let saved = dir.join(OsStr::from_bytes(b"saved-\xfe.json"));
    std::fs::write(&saved, result("0.001")).unwrap();
    let png = dir.join(OsStr::from_bytes(b"perf-\xff.png"));
    let r = perf(&[
        os("--plot"),
        png.as_os_str(),
        os("--plot-with"),
        saved.as_os_str(),
        os("--no-run"),
    ]);
    assert_eq!(r.code, Some(0), "{r}");
    assert!(r.stdout.starts_with("# Plot: "), "{r}");
    assert!(png.is_file(), "no picture at {}:\n{r}", png.display());
}

#[test]
fn a_plot_that_cannot_be_written_is_refused_before_any_rank_starts() {
    let dir = folder("outputs");
    let run = |target: &Path| {
        let mut args: Vec<&OsStr> = SWEEP.split_whitespace().map(os).collect();
        args.extend([os("--plot"), target.as_os_str()]);
        perf(&args)
    };
    // A folder: found only after the whole run, before.
    let folder_png = dir.join("folder.png");
    std::fs::create_dir(&folder_png).unwrap();
    refused(&run(&folder_png), "is a folder");
    // A FIFO: writing the picture would wait for a reader.
    let fifo = dir.join("fifo.png");
    if Command::new("mkfifo").arg(&fifo).status().is_ok_and(|s| s.success()) {
        refused(&run(&fifo), "FIFO");
    }
    // A folder this process may not write in (root may write anywhere: skipped there).
    let locked = dir.join("locked");
    std::fs::create_dir(&locked).unwrap();
    let status = Command::new("chmod").arg("555").arg(&locked).status().unwrap();
    assert!(status.success());
    if std::fs::write(locked.join("try"), "").is_err() {
        refused(&run(&locked.join("p.png")), "cannot write in the folder");
    } else {
        testkit::skip(
            Capability::ReadOnlyFolders,
            "this user may write in a read-only folder (root?): that case is skipped",
        );
    }
    let _ = Command::new("chmod").arg("755").arg(&locked).status();
    // What is refused leaves nothing behind.
    assert!(
        std::fs::read_dir(&locked)
            .unwrap()
            .all(|e| e.unwrap().file_name() == "try")
    );
}

#[test]
fn a_plot_that_fails_at_the_end_says_why_in_one_readable_line() {
    if !Path::new("/dev/full").exists() {
        testkit::skip(Capability::DevFull, "no /dev/full here: skipped");
        return;
    }
    // A picture written to /dev/full: the write fails when the picture is saved.
    let dir = folder("full");
    let full = dir.join("full.png");
    std::os::unix::fs::symlink("/dev/full", &full).unwrap();
    let saved = dir.join("saved.json");
    std::fs::write(&saved, result("0.001")).unwrap();
    let r = perf(&[
        os("--plot"),
        full.as_os_str(),
        os("--plot-with"),
        saved.as_os_str(),
        os("--no-run"),
    ]);
    assert_eq!(r.code, Some(1), "{r}");
    assert_eq!(
        r.stderr.trim(),
        format!("error: --plot {}: no space left on device", full.display())
    );
    // After a run: rank 0's one line says the same, in words.
    let mut args: Vec<&OsStr> = SWEEP.split_whitespace().map(os).collect();
    args.extend([os("--plot"), full.as_os_str()]);
    let r = perf(&args);
    assert_eq!(r.code, Some(1), "{r}");
    assert!(
        r.stderr
            .contains(&format!("--plot {}: no space left on device", full.display())),
        "{r}"
    );
    for debug in ["ImageError", "IoError", "Os {", "kind:"] {
        assert!(!r.stderr.contains(debug), "Rust's debug form:\n{r}");
    }
}
