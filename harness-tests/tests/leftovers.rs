//! Nothing is left in /dev/shm, however a job ends, and a job that /dev/shm cannot hold
//! is refused before it starts (issue 14, items 1 and 4). Real jobs of real processes.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use testkit::{LIMIT, command, finish, spawn};

const BIN: &str = env!("CARGO_BIN_EXE_harness-probe");

/// Held by the tests that count channel files or plant them: one of them plants a dead
/// process's file, which the other would count as its own job's leftover if they ran at once.
static CHANNEL_FILES: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The channel files in /dev/shm now, by name.
fn channel_files() -> BTreeSet<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n.starts_with("nccl-workbook-") && !n.starts_with("nccl-workbook-test-"))
                .collect()
        })
        .unwrap_or_default()
}

/// The process that created channel file `name` (its pid is in the name).
fn owner(name: &str) -> u32 {
    name["nccl-workbook-".len()..]
        .split('-')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

fn alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

#[test]
fn a_rank_killed_while_setting_up_shared_memory_leaves_no_file() {
    // Rank 2 of 4 is killed (SIGKILL) right after creating the channels its peers were
    // about to open: nobody else would ever remove their names.
    let _alone = CHANNEL_FILES.lock().unwrap_or_else(|p| p.into_inner());
    let before = channel_files();
    let mut cmd = command(BIN, &["--backend", "cpu", "--nproc-per-node", "4", "--timeout", "20"]);
    cmd.env("NCCL_WORKBOOK_FAULT", "die-in-shm-setup:2");
    let r = finish(spawn(cmd), LIMIT);
    assert_eq!(r.code, Some(1), "{r}");
    assert!(r.stderr.contains("rank 2 failed first (killed by signal 9"), "{r}");
    // Files of other jobs (other tests) may come and go; none of this job's may stay.
    let left: Vec<String> = channel_files()
        .difference(&before)
        .filter(|f| !alive(owner(f)))
        .cloned()
        .collect();
    assert!(left.is_empty(), "left in /dev/shm: {left:?}\n{r}");
}

#[test]
fn files_left_by_dead_processes_are_removed_by_the_next_job() {
    // A job killed together with its launcher leaves its names; the next job on this
    // host removes those of processes that are gone, and only those.
    let _alone = CHANNEL_FILES.lock().unwrap_or_else(|p| p.into_inner());
    let mut gone = std::process::Command::new("true").spawn().unwrap();
    let dead = gone.id();
    gone.wait().unwrap();
    let stale = format!("/dev/shm/nccl-workbook-{dead}-0-to-1");
    let live = format!("/dev/shm/nccl-workbook-{}-0-to-1", std::process::id());
    for f in [&stale, &live] {
        std::fs::write(f, b"left behind").unwrap();
    }
    let r = finish(spawn(command(BIN, &["--backend", "cpu", "--timeout", "20"])), LIMIT);
    let (stale_left, live_left) = (
        std::path::Path::new(&stale).exists(),
        std::path::Path::new(&live).exists(),
    );
    let _ = std::fs::remove_file(&stale);
    let _ = std::fs::remove_file(&live);
    assert_eq!(r.code, Some(0), "{r}");
    assert!(!stale_left, "the dead process's file is still there");
    assert!(live_left, "a live process's file was removed");
}

#[test]
fn more_ranks_than_dev_shm_can_hold_are_refused_before_starting() {
    let t = Instant::now();
    let r = finish(
        spawn(command(
            BIN,
            &["--backend", "cpu", "--nproc-per-node", "1000", "--timeout", "20"],
        )),
        LIMIT,
    );
    assert_eq!(r.code, Some(2), "{r}");
    assert_eq!(r.stderr.lines().count(), 1, "{r}");
    assert!(r.stderr.contains("1000 ranks on this host would need"), "{r}");
    assert!(
        r.stderr.contains("of /dev/shm") && r.stderr.contains("--transport tcp"),
        "{r}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "refused only after {:?}",
        t.elapsed()
    );
}

#[test]
fn buffers_larger_than_the_memory_are_refused_before_they_are_made() {
    // 16 GiB per buffer (the most --size takes) on enough ranks to need more than this
    // machine has (2 on this project's 24 GiB machine): without the check, the
    // out-of-memory killer.
    let total_gib = std::fs::read_to_string("/proc/meminfo")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap()
        >> 20;
    let ranks = (total_gib / 32 + 2).to_string();
    let t = Instant::now();
    let args = ["--backend", "cpu", "--size", "16G", "--nproc-per-node", &ranks];
    let r = finish(spawn(command(BIN, &args)), LIMIT);
    assert_eq!(r.code, Some(2), "{r}");
    assert!(
        r.stderr
            .contains(&format!("--size 16G: {ranks} rank(s) on this host would hold")),
        "{r}"
    );
    assert!(r.stderr.contains("of memory available"), "{r}");
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "refused only after {:?}",
        t.elapsed()
    );
}

#[test]
fn a_full_dev_shm_is_one_line_per_rank_not_a_signal() {
    // Tests cannot fill the machine's /dev/shm: the hook makes reserving a channel fail
    // as it does there (ENOSPC from posix_fallocate), where a file only sized with
    // ftruncate would have killed the rank with SIGBUS at its first write.
    let mut cmd = command(BIN, &["--backend", "cpu", "--timeout", "20"]);
    cmd.env("NCCL_WORKBOOK_FAULT", "shm-full");
    let r = finish(spawn(cmd), LIMIT);
    assert_eq!(r.code, Some(1), "{r}");
    assert!(!r.stderr.contains("signal"), "{r}");
    for line in r.stderr.lines().filter(|l| l.starts_with("error: rank")) {
        assert!(
            line.contains("/dev/shm is full (") && line.contains("free of") && line.contains("--transport tcp"),
            "{line}"
        );
    }
    assert!(r.stderr.lines().any(|l| l.starts_with("error: rank")), "{r}");
}
