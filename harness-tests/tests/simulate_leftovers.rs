//! Nothing that simulated GPUs make stays behind when a job ends in a failure (issue 30,
//! item 1): neither the simulator's meeting folder in /dev/shm (the data of the job's last
//! calls: 129 MiB for a 64 MiB all-reduce) nor the private folder of library links in the
//! temporary folder. The launcher removes what its ranks left; every start removes what
//! processes that are gone left (a job killed with its launcher), and never a live
//! process's files. Real jobs of real processes.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use testkit::{LIMIT, children, command, ended, finish, signal, spawn};

const BIN: &str = env!("CARGO_BIN_EXE_harness-probe");

/// Taken by each test: one test's job removes what another planted or counts on.
static JOBS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A temporary folder of the test's own, given to its jobs as TMPDIR: what is left there
/// is theirs.
fn private_tmp(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("simulate-leftovers-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn names_in(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The simulator's meeting folder (in /dev/shm) where one of `pids` has published its card
/// (`rank-<r>`: "nranks version pid ..."), once there is one.
fn room_of(pids: &[u32]) -> Option<PathBuf> {
    let dir = std::fs::read_dir("/dev/shm").ok()?;
    dir.flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("nccl-double-"))
        })
        .find(|room| {
            names_in(room).iter().filter(|n| n.starts_with("rank-")).any(|card| {
                std::fs::read_to_string(room.join(card))
                    .ok()
                    .and_then(|c| c.split(' ').nth(2).and_then(|p| p.parse::<u32>().ok()))
                    .is_some_and(|pid| pids.contains(&pid))
            })
        })
}

/// Bytes under `dir`.
fn bytes(dir: &Path) -> u64 {
    names_in(dir)
        .iter()
        .filter_map(|n| std::fs::metadata(dir.join(n)).ok())
        .map(|m| m.len())
        .sum()
}

/// Starts a simulated-GPU job that runs long (TMPDIR: `tmp`), and waits until its ranks
/// have made their communicator: the launcher, its ranks and their meeting folder.
fn long_job(tmp: &Path) -> (std::process::Child, Vec<u32>, PathBuf) {
    let mut cmd = command(
        BIN,
        &[
            "--simulate-gpus",
            "2",
            "--size",
            "4M",
            "--iters",
            "1000000",
            "--timeout",
            "30",
        ],
    );
    cmd.env("TMPDIR", tmp);
    let mut child = spawn(cmd);
    let start = Instant::now();
    loop {
        let kids = children(child.id());
        if kids.len() == 2
            && let Some(room) = room_of(&kids)
        {
            // Mid-run: past the check, into the timed all-reduces.
            std::thread::sleep(Duration::from_millis(500));
            return (child, kids, room);
        }
        if start.elapsed() > Duration::from_secs(60) || child.try_wait().unwrap().is_some() {
            let _ = child.kill();
            panic!("the job never made its communicator:\n{}", finish(child, LIMIT));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until every one of `ranks` has ended, as ranks whose launcher was killed must,
/// within 10 s.
fn ranks_end(ranks: &[u32]) {
    let start = Instant::now();
    while !ranks.iter().all(|&k| ended(k)) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the ranks outlived their launcher"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_simulated_rank_killed_mid_run_leaves_nothing_behind() {
    let _alone = JOBS.lock().unwrap_or_else(|p| p.into_inner());
    let tmp = private_tmp("killed-rank");
    let (child, kids, room) = long_job(&tmp);
    signal(kids[1], 9);
    let r = finish(child, LIMIT);
    let (room_left, tmp_left) = (room.exists(), names_in(&tmp));
    let mib = bytes(&room) >> 20;
    let _ = std::fs::remove_dir_all(&room);
    let _ = std::fs::remove_dir_all(&tmp);
    assert_eq!(r.code, Some(1), "{r}");
    assert!(r.stderr.contains("rank 1 failed first (killed by signal 9"), "{r}");
    assert!(!room_left, "left in /dev/shm: {} ({mib} MiB)\n{r}", room.display());
    assert!(tmp_left.is_empty(), "left in the temporary folder: {tmp_left:?}\n{r}");
}

#[test]
fn what_a_job_killed_with_its_launcher_left_is_removed_by_the_next_job() {
    let _alone = JOBS.lock().unwrap_or_else(|p| p.into_inner());
    let tmp = private_tmp("killed-launcher");
    let (child, kids, room) = long_job(&tmp);
    let launcher = child.id();
    // Its ranks are told to stop as it dies (PR_SET_PDEATHSIG).
    signal(launcher, 9);
    let r = finish(child, LIMIT);
    ranks_end(&kids);
    let links = tmp.join(format!("nccl-workbook-sim-{launcher}"));
    let left_before = (room.exists(), links.exists());
    // Any next job on this host, even one on the CPU backend.
    let mut next = command(BIN, &["--backend", "cpu"]);
    next.env("TMPDIR", &tmp);
    let next = finish(spawn(next), LIMIT);
    let (room_left, links_left) = (room.exists(), links.exists());
    let _ = std::fs::remove_dir_all(&room);
    let _ = std::fs::remove_dir_all(&tmp);
    assert_eq!(next.code, Some(0), "{next}");
    assert!(
        !room_left,
        "left in /dev/shm: {} (there after the kill: {})\n{r}",
        room.display(),
        left_before.0
    );
    assert!(
        !links_left,
        "left: {} (there after the kill: {})\n{r}",
        links.display(),
        left_before.1
    );
}

/// A rank killed outright, then its launcher (issue 53, item 8): the surviving rank is
/// told to stop (SIGTERM, as its launcher dies) and removes, before it goes, the meeting
/// folder the killed rank could not leave and the launcher's link folder. Nothing waits
/// for a next job.
#[test]
fn a_rank_then_its_launcher_killed_leave_nothing_without_a_next_job() {
    let _alone = JOBS.lock().unwrap_or_else(|p| p.into_inner());
    let tmp = private_tmp("killed-both");
    let (child, kids, room) = long_job(&tmp);
    let launcher = child.id();
    signal(kids[1], 9);
    std::thread::sleep(Duration::from_millis(100));
    signal(launcher, 9);
    let r = finish(child, LIMIT);
    ranks_end(&kids);
    let links = tmp.join(format!("nccl-workbook-sim-{launcher}"));
    let (room_left, links_left) = (room.exists(), links.exists());
    let _ = std::fs::remove_dir_all(&room);
    let _ = std::fs::remove_dir_all(&tmp);
    assert!(!room_left, "left in /dev/shm: {}\n{r}", room.display());
    assert!(!links_left, "left: {}\n{r}", links.display());
}

#[test]
fn files_of_dead_processes_are_removed_and_a_live_ones_kept() {
    let _alone = JOBS.lock().unwrap_or_else(|p| p.into_inner());
    let tmp = private_tmp("planted");
    let mut gone = std::process::Command::new("true").spawn().unwrap();
    let dead = gone.id();
    gone.wait().unwrap();
    let me = std::process::id();
    let room = |maker: u32, members: &[u32], tag: &str| {
        let dir = PathBuf::from(format!(
            "/dev/shm/nccl-double-{maker}-{tag}0000000000000000000000000000"
        ));
        std::fs::create_dir_all(&dir).unwrap();
        for m in members {
            std::fs::write(dir.join(format!("pid-{m}")), b"").unwrap();
        }
        std::fs::write(dir.join("op-1-0"), vec![0u8; 1 << 20]).unwrap();
        dir
    };
    let dead_room = room(dead, &[dead], "dead");
    let live_room = room(me, &[me], "1111");
    // Made by a process that is gone, still used by one that is not: a live job's.
    let shared_room = room(dead, &[dead, me], "5ead");
    // A link in a dead process's folder points at a file that must survive it.
    let outside = tmp.join("outside");
    std::fs::write(&outside, b"not ours").unwrap();
    let folder = |name: String| {
        let dir = tmp.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::os::unix::fs::symlink(&outside, dir.join("libnccl.so")).unwrap();
        dir
    };
    let dead_links = [
        folder(format!("nccl-workbook-{dead}")),
        folder(format!("nccl-workbook-sim-{dead}")),
    ];
    let live_links = [
        folder(format!("nccl-workbook-{me}")),
        folder(format!("nccl-workbook-sim-{me}")),
    ];
    // Not the workbook's own names: never touched.
    let other = folder(format!("nccl-workbook-sim-plot-{dead}"));

    let mut cmd = command(BIN, &["--simulate-gpus", "2"]);
    cmd.env("TMPDIR", &tmp);
    let r = finish(spawn(cmd), LIMIT);

    let there = |p: &PathBuf| p.exists();
    let gone_now: Vec<bool> = [&dead_room].into_iter().chain(&dead_links).map(|p| !there(p)).collect();
    let kept: Vec<bool> = [&live_room, &shared_room]
        .into_iter()
        .chain(&live_links)
        .chain([&other, &outside])
        .map(there)
        .collect();
    for dir in [&dead_room, &live_room, &shared_room] {
        let _ = std::fs::remove_dir_all(dir);
    }
    let _ = std::fs::remove_dir_all(&tmp);
    assert_eq!(r.code, Some(0), "{r}");
    assert_eq!(
        gone_now,
        vec![true; 3],
        "a dead process's room or link folders are still there (room, links, sim links)"
    );
    assert_eq!(
        kept,
        vec![true; 6],
        "removed what it must keep (live room, shared room, live links, live sim links, \
         another program's folder, a link's target)"
    );
}
