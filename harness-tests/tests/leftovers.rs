//! Nothing is left in /dev/shm, however a job ends, and a job that /dev/shm cannot hold
//! is refused before it starts (issue 14, items 1 and 4). Real jobs of real processes.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use testkit::{Capability, LIMIT, command, finish, spawn};

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

/// Launchers killed outright while their ranks start (issue 53, item 8: 80 launchers
/// killed 0-30 ms after they started left 52 channel files in /dev/shm): the ranks are
/// told to stop as their launcher dies, and remove their channel files before they go,
/// and those of peers that could not; nothing waits for a next job to sweep them.
#[test]
fn ranks_whose_launcher_is_killed_while_they_start_remove_their_files() {
    let _alone = CHANNEL_FILES.lock().unwrap_or_else(|p| p.into_inner());
    let before = channel_files();
    let args = [
        "--backend",
        "cpu",
        "--nproc-per-node",
        "4",
        "--size",
        "4M",
        "--timeout",
        "5",
    ];
    let mut ranks = vec![];
    for i in 0..40u64 {
        let mut child = spawn(command(BIN, &args));
        std::thread::sleep(Duration::from_micros(1500 * i));
        ranks.extend(testkit::children(child.id()));
        testkit::signal(child.id(), 9);
        let _ = child.wait();
    }
    let start = Instant::now();
    while !ranks.iter().all(|&k| testkit::ended(k)) {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "ranks outlived their launcher"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // Files of other jobs may come and go; none of a process that is gone (a zombie
    // included: this machine's init reaps orphans late) may stay.
    let left: Vec<String> = channel_files()
        .difference(&before)
        .filter(|f| testkit::ended(owner(f)))
        .cloned()
        .collect();
    assert!(left.is_empty(), "left in /dev/shm: {left:?}");
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
        aged(f);
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

/// Makes file `f` a minute old, as a file left by a job that died earlier is (a file
/// younger than 2 s may be a live job's that its creator has not locked yet).
fn aged(f: &str) {
    let minute_ago = std::time::SystemTime::now() - Duration::from_secs(60);
    std::fs::File::options()
        .write(true)
        .open(f)
        .unwrap()
        .set_modified(minute_ago)
        .unwrap();
}

/// A channel file named for process `pid` and locked as a live rank locks the files it
/// made (a shared `flock`, held until the returned file is dropped).
fn held_channel_file(pid: u32) -> (String, std::fs::File) {
    let name = format!("/dev/shm/nccl-workbook-{pid}-0-to-1");
    std::fs::write(&name, b"a live job's").unwrap();
    aged(&name);
    let f = std::fs::File::open(&name).unwrap();
    f.lock_shared().unwrap();
    (name, f)
}

#[test]
fn a_file_whose_creator_holds_its_lock_is_kept_whatever_its_pid_says() {
    // Issue 30, item 3: a job in another pid namespace has pids this one cannot see. Here
    // a pid that is gone names the file, but a live process holds its lock, as the ranks
    // of such a job hold theirs: the next job must leave it.
    let _alone = CHANNEL_FILES.lock().unwrap_or_else(|p| p.into_inner());
    let mut gone = std::process::Command::new("true").spawn().unwrap();
    let dead = gone.id();
    gone.wait().unwrap();
    let (name, lock) = held_channel_file(dead);
    let r = finish(spawn(command(BIN, &["--backend", "cpu", "--timeout", "20"])), LIMIT);
    let kept = std::path::Path::new(&name).exists();
    drop(lock);
    let r2 = finish(spawn(command(BIN, &["--backend", "cpu", "--timeout", "20"])), LIMIT);
    let then = std::path::Path::new(&name).exists();
    let _ = std::fs::remove_file(&name);
    assert_eq!(r.code, Some(0), "{r}");
    assert_eq!(r2.code, Some(0), "{r2}");
    assert!(
        kept,
        "a locked file (its creator alive, in a namespace of its own) was removed"
    );
    assert!(!then, "once its lock was released, the dead process's file stayed");
}

#[test]
fn a_job_in_a_new_pid_namespace_leaves_a_live_jobs_files_alone() {
    // Two jobs, one in a new pid namespace (unshare -p, as a container is): there, this
    // process's pid names nothing in /proc. It used to remove this job's live files.
    let can = std::process::Command::new("unshare")
        .args(["-p", "-f", "--mount-proc", "true"])
        .status()
        .is_ok_and(|s| s.success());
    if !can {
        testkit::skip(
            Capability::PidNamespaces,
            "`unshare -p -f --mount-proc` is not allowed here (it needs root or user namespaces): skipped",
        );
        return;
    }
    let _alone = CHANNEL_FILES.lock().unwrap_or_else(|p| p.into_inner());
    let (name, lock) = held_channel_file(std::process::id());
    let mut cmd = std::process::Command::new("unshare");
    cmd.args(["-p", "-f", "--mount-proc", BIN, "--backend", "cpu", "--timeout", "20"]);
    testkit::clear_job_env(&mut cmd);
    let r = finish(spawn(cmd), LIMIT);
    let kept = std::path::Path::new(&name).exists();
    drop(lock);
    let _ = std::fs::remove_file(&name);
    assert_eq!(r.code, Some(0), "{r}");
    assert!(
        kept,
        "the job in the new pid namespace removed a live job's channel file"
    );
}

#[test]
fn more_ranks_than_dev_shm_can_hold_are_refused_before_starting() {
    // The rings of 1000 ranks (two channels each, about 4 MiB a channel: 8 GiB) fit in
    // most machines' /dev/shm: the hook says only 1 GB is free.
    let t = Instant::now();
    let mut cmd = command(
        BIN,
        &["--backend", "cpu", "--nproc-per-node", "1000", "--timeout", "20"],
    );
    cmd.env("NCCL_WORKBOOK_FAULT", "shm-free:1000000000");
    let r = finish(spawn(cmd), LIMIT);
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
    // The ranks decide together: one line, said once.
    let said: Vec<&str> = r.stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(said.len(), 1, "{r}");
    assert!(
        said[0].contains(&format!("--size 16G: {ranks} rank(s) on ")) && said[0].contains(" would hold "),
        "{r}"
    );
    assert!(said[0].contains("of memory available"), "{r}");
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
