//! Start-up that scales (issue 30, item 8): the CPU backend's pairs of ranks connect on
//! first use, as NCCL's runtime connect does, so a ring makes a channel (shared memory)
//! or a connection (TCP) per rank, not one per pair. Real multi-process jobs.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use testkit::{LIMIT, Run, command, finish_or_kill, free_port, spawn};

const BIN: &str = env!("CARGO_BIN_EXE_harness-probe");

/// The parent of process `pid`, while it lives.
fn parent(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')').next()?.split_whitespace().nth(1)?.parse().ok()
}

/// The channel files in /dev/shm now made by the children of `launcher` (the job's ranks).
fn job_files(launcher: u32) -> BTreeSet<String> {
    let Ok(dir) = std::fs::read_dir("/dev/shm") else {
        return BTreeSet::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| {
            n.strip_prefix("nccl-workbook-")
                .and_then(|rest| rest.split('-').next())
                .and_then(|pid| pid.parse::<u32>().ok())
                .is_some_and(|owner| parent(owner) == Some(launcher))
        })
        .collect()
}

/// What each rank said it made, `what` being `shared-memory channel(s)` or `TCP
/// connection(s)`: `cpu INFO rank R: K shared-memory channel(s) made (pairs connect on
/// first use)`.
fn made(stderr: &str, what: &str) -> Vec<(usize, u64)> {
    let tail = format!(" {what} made (pairs connect on first use)");
    stderr
        .lines()
        .filter_map(|l| {
            let rest = l[l.find("cpu INFO rank ")? + "cpu INFO rank ".len()..].to_string();
            let (rank, rest) = rest.split_once(": ")?;
            let count = rest.strip_suffix(tail.as_str())?;
            Some((rank.parse().ok()?, count.parse().ok()?))
        })
        .collect()
}

#[test]
fn a_ring_all_reduce_makes_a_channel_per_rank_not_one_per_pair() {
    // 12 ranks on one host, the ring piece by piece (no single copy, which reads every
    // rank's buffer): each rank sends to its right neighbour alone. Eagerly, every pair
    // got two channels at start, 132 files in /dev/shm at once; connected on first use,
    // 12, and never more than 12 at once.
    let ranks = 12;
    let n = ranks.to_string();
    let mut cmd = command(
        BIN,
        &[
            "--nproc-per-node",
            &n,
            "--count",
            "1048576",
            "--iters",
            "2",
            "--timeout",
            "30",
        ],
    );
    cmd.env("NCCL_WORKBOOK_CORES", "16")
        .env("NCCL_ALGO", "Ring")
        .env("NCCL_P2P_DISABLE", "1")
        .env("NCCL_DEBUG", "INFO");
    let child = spawn(cmd);
    let launcher = child.id();
    let (r, in_time, most, seen) = watch_while(child, Duration::from_millis(1), move || job_files(launcher));
    assert!(in_time, "{r}");
    let r = r.ok();
    assert!(r.stdout.contains("via ring-pipelined"), "{r}");
    assert!(r.stdout.contains(&format!("Check: OK, all {ranks} ranks")), "{r}");
    // What /dev/shm held during the run first (eagerly: 132 files at once), then what
    // the ranks say.
    assert!(
        most <= ranks,
        "{most} channel files at once, for {ranks} ranks: {seen:?}"
    );
    assert!(
        seen.iter().all(|f| f.ends_with(".part") || {
            let (from, to) = f.rsplit_once("-to-").unwrap();
            let from: usize = from.rsplit('-').next().unwrap().parse().unwrap();
            to.parse::<usize>().unwrap() == (from + 1) % ranks
        }),
        "a channel outside the ring: {seen:?}"
    );
    let made = made(&r.stderr, "shared-memory channel(s)");
    let said: BTreeSet<usize> = made.iter().map(|(rank, _)| *rank).collect();
    assert_eq!(said, (0..ranks).collect(), "every rank says what it made\n{r}");
    for (rank, count) in &made {
        assert_eq!(
            *count, 1,
            "rank {rank} made {count} channels, its right neighbour's alone\n{r}"
        );
    }
}

/// The sockets of process `pid` (their inodes), while it lives.
fn socket_inodes(pid: u32) -> BTreeSet<String> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return BTreeSet::new();
    };
    dir.flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter_map(|l| Some(l.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?.to_string()))
        .collect()
}

/// The TCP connections now open between two of the job's ranks (the children of
/// `launcher`), each as its two ports, lower first: both ends belong to the ranks, and
/// neither is `store` (rank 0's store, which every rank reaches).
fn rank_connections(launcher: u32, store: u16) -> BTreeSet<(u16, u16)> {
    let inodes: BTreeSet<String> = testkit::children(launcher)
        .into_iter()
        .flat_map(socket_inodes)
        .collect();
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let port = |a: &str| a.rsplit(':').next().and_then(|p| u16::from_str_radix(p, 16).ok());
    // (local port, remote port) of every established socket of the ranks.
    let ends: BTreeSet<(u16, u16)> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let ours = *f.get(3)? == "01" && inodes.contains(*f.get(9)?);
            ours.then_some((port(f.get(1)?)?, port(f.get(2)?)?))
        })
        .filter(|(local, remote)| *local != store && *remote != store)
        .collect();
    ends.iter()
        .filter(|(local, remote)| local < remote && ends.contains(&(*remote, *local)))
        .copied()
        .collect()
}

#[test]
fn a_ring_all_reduce_over_tcp_makes_a_connection_per_rank_not_one_per_pair() {
    // 12 ranks, TCP between every pair, the ring: each rank sends to its right neighbour
    // alone. Eagerly, every pair was connected at start, 66 connections open at once, all
    // through the run; connected on first use, 12 (each rank dials its right neighbour).
    let ranks = 12;
    let (n, store) = (ranks.to_string(), free_port());
    let p = store.to_string();
    let mut cmd = command(
        BIN,
        &[
            "--nproc-per-node",
            &n,
            "--master-port",
            &p,
            "--transport",
            "tcp",
            "--count",
            "1048576",
            "--iters",
            "2",
            "--timeout",
            "30",
        ],
    );
    cmd.env("NCCL_WORKBOOK_CORES", "16")
        .env("NCCL_ALGO", "Ring")
        .env("NCCL_DEBUG", "INFO");
    let child = spawn(cmd);
    let launcher = child.id();
    let (r, in_time, most, seen) = watch_while(child, Duration::from_millis(2), move || {
        rank_connections(launcher, store)
    });
    assert!(in_time, "{r}");
    let r = r.ok();
    assert!(r.stdout.contains(&format!("Check: OK, all {ranks} ranks")), "{r}");
    // What the kernel held during the run first (eagerly: 66 at once), then what the
    // ranks say.
    assert!(!seen.is_empty(), "no connection seen between the ranks\n{r}");
    assert!(
        most <= ranks,
        "{most} connections between ranks open at once, for {ranks} ranks: {seen:?}"
    );
    let made = made(&r.stderr, "TCP connection(s)");
    let said: BTreeSet<usize> = made.iter().map(|(rank, _)| *rank).collect();
    assert_eq!(said, (0..ranks).collect(), "every rank says what it made\n{r}");
    for (rank, count) in &made {
        assert_eq!(
            *count, 1,
            "rank {rank} made {count} connections, to its right neighbour alone\n{r}"
        );
    }
}

#[test]
fn a_rank_killed_before_it_connected_over_tcp_is_named_at_once_by_the_rank_waiting_for_it() {
    // Rank 1 of 3 starts its first collective late (a test hook), while ranks 0 and 2 are
    // in theirs: rank 2 waits for rank 1's connection. Killed there,
    // rank 1 never connects; its port refuses connections, which rank 2 finds while it
    // waits and says, naming rank 1 and its address (not, after --timeout, that nothing
    // came).
    let store = free_port();
    let p = store.to_string();
    let mut cmd = command(
        BIN,
        &[
            "--nproc-per-node",
            "3",
            "--master-port",
            &p,
            "--transport",
            "tcp",
            "--count",
            "1000",
            "--timeout",
            "60",
        ],
    );
    cmd.env("NCCL_WORKBOOK_FAULT", "late:1:60000");
    let child = spawn(cmd);
    let launcher = child.id();
    // A connection between two ranks: they have started their collective, past every
    // rank's setup, rank 1's too.
    let start = Instant::now();
    while rank_connections(launcher, store).is_empty() && start.elapsed() < LIMIT {
        std::thread::sleep(Duration::from_millis(20));
    }
    let ranks = testkit::children(launcher);
    assert_eq!(ranks.len(), 3, "the launcher's ranks: {ranks:?}");
    std::thread::sleep(Duration::from_millis(300));
    assert!(testkit::signal(ranks[1], 9), "killing rank 1");
    let (r, in_time) = finish_or_kill(child, LIMIT);
    assert!(in_time, "{r}");
    assert_ne!(r.code, Some(0), "{r}");
    assert!(
        r.stderr.lines().any(|l| l.contains("rank 2:")
            && l.contains("rank 1 at 127.0.0.1:")
            && l.contains("never connected to this rank")),
        "rank 2 names rank 1, gone before it connected\n{r}"
    );
}

/// Runs `child` to its end (at most LIMIT), looking at the job every `every` from another
/// thread: the run, whether it ended in time, the most things `look` saw at once, and
/// every thing it saw.
fn watch_while<T: Ord + Send + 'static>(
    child: std::process::Child,
    every: Duration,
    look: impl Fn() -> BTreeSet<T> + Send + 'static,
) -> (Run, bool, usize, BTreeSet<T>) {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let (mut most, mut seen) = (0, BTreeSet::new());
            let start = Instant::now();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && start.elapsed() < LIMIT {
                let now = look();
                most = most.max(now.len());
                seen.extend(now);
                std::thread::sleep(every);
            }
            (most, seen)
        })
    };
    let (r, in_time) = finish_or_kill(child, LIMIT);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (most, seen) = watcher.join().expect("the watching thread");
    (r, in_time, most, seen)
}
