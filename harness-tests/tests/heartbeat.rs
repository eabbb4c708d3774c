//! The rank at fault is named by every rank and every launcher: a rank stopped (SIGSTOP)
//! as silent, by its missing heartbeat, a rank killed as lost, on one host and on
//! emulated hosts. (Before: each rank named whichever rank exited first, most often one
//! that had only given up waiting, and each launcher the first of its own ranks to fail.)

use std::process::{Child, Command};
use std::thread::sleep;
use std::time::{Duration, Instant};
use testkit::{LIMIT, Run, command, finish, free_port, spawn};

const BIN: &str = env!("CARGO_BIN_EXE_harness-probe");
/// A long run of all-reduces: still running whenever a rank is hit.
const WORK: [&str; 4] = ["--size", "4M", "--iters", "100000"];
/// What every wait may take past --timeout, on a loaded machine: the launcher's grace for
/// the other ranks (3 s) and room for the rest.
const SLACK: Duration = Duration::from_secs(8);

/// The ranks a launcher started, in rank order, once it has started `n`.
fn ranks_of(launcher: &Child, n: usize) -> Vec<u32> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let kids = testkit::children(launcher.id());
        if kids.len() == n || Instant::now() > deadline {
            return kids;
        }
        sleep(Duration::from_millis(20));
    }
}

/// The lines of the ranks (`error: rank N: ...`) in `run`'s stderr, and the launcher's.
fn lines(run: &Run) -> (Vec<&str>, &str) {
    let ranks = run.stderr.lines().filter(|l| l.starts_with("error: rank ")).collect();
    let launcher = run
        .stderr
        .lines()
        .find(|l| l.starts_with("launcher: "))
        .unwrap_or_else(|| panic!("the launcher said nothing:\n{run}"));
    (ranks, launcher)
}

/// `nodes` launchers of `per_node` ranks each on this machine, each an emulated host
/// (`SLURMD_NODENAME`), with `--timeout timeout`; each launcher with its ranks' pids.
fn emulated_hosts(nodes: usize, per_node: usize, timeout: &str) -> Vec<(Child, Vec<u32>)> {
    let (port, total, per) = (free_port().to_string(), nodes.to_string(), per_node.to_string());
    let launchers: Vec<Child> = (0..nodes)
        .map(|n| {
            let node = n.to_string();
            let mut args = vec![
                "--nnodes",
                &total,
                "--node-rank",
                &node,
                "--nproc-per-node",
                &per,
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                &port,
                "--timeout",
                timeout,
            ];
            args.extend(WORK);
            let mut cmd: Command = command(BIN, &args);
            cmd.env("SLURMD_NODENAME", format!("node-{n}"));
            spawn(cmd)
        })
        .collect();
    launchers
        .into_iter()
        .map(|l| {
            let kids = ranks_of(&l, per_node);
            (l, kids)
        })
        .collect()
}

#[test]
fn a_stopped_rank_is_named_as_silent_by_every_rank_and_the_launcher() {
    // 4 ranks on one host, rank 1 stopped in the middle of the all-reduces. Before: the
    // ranks named whichever rank gave up first ("rank 2 failed first (its connection
    // closed)"), though rank 1 froze.
    let mut args = vec!["--nproc-per-node", "4", "--timeout", "4"];
    args.extend(WORK);
    let launcher = spawn(command(BIN, &args));
    let kids = ranks_of(&launcher, 4);
    assert_eq!(kids.len(), 4, "the launcher did not start 4 ranks");
    sleep(Duration::from_millis(2500)); // well into the timed all-reduces
    testkit::signal(kids[1], 19); // SIGSTOP
    let hit = Instant::now();
    let run = finish(launcher, LIMIT);
    let took = hit.elapsed();
    testkit::signal(kids[1], 9); // if it were still there
    assert_eq!(run.code, Some(1), "{run}");
    assert!(
        took < Duration::from_secs(4) + SLACK,
        "ended {took:?} after the signal:\n{run}"
    );
    let (ranks, launcher) = lines(&run);
    assert_eq!(ranks.len(), 3, "ranks 0, 2 and 3 each say one line:\n{run}");
    for line in ranks {
        assert!(
            line.contains(": rank 1 stopped responding (no heartbeat for "),
            "a rank does not name rank 1 as silent: {line}\n{run}"
        );
    }
    assert!(
        launcher.starts_with("launcher: rank 1 was frozen (its process was stopped: SIGSTOP, or a debugger)"),
        "{run}"
    );
}

#[test]
fn a_stopped_rank_on_another_host_is_named_by_every_launcher() {
    // 3 emulated hosts of 2 ranks, rank 3 (host 1) stopped. Before: the launchers of hosts
    // 0 and 2 each blamed the first of their own ranks to give up.
    let jobs = emulated_hosts(3, 2, "5");
    sleep(Duration::from_millis(2500));
    testkit::signal(jobs[1].1[1], 19); // rank 3: SIGSTOP
    let hit = Instant::now();
    let runs: Vec<(Run, Duration)> = jobs
        .into_iter()
        .map(|(l, kids)| {
            let run = finish(l, LIMIT);
            for k in kids {
                testkit::signal(k, 9); // the stopped rank, if it were still there
            }
            (run, hit.elapsed())
        })
        .collect();
    for (node, (run, took)) in runs.iter().enumerate() {
        let ctx = format!("host {node}, ended {took:?} after the signal:\n{run}");
        assert_eq!(run.code, Some(1), "{ctx}");
        assert!(*took < Duration::from_secs(5) + SLACK, "{ctx}");
        let (ranks, launcher) = lines(run);
        assert!(launcher.starts_with("launcher: rank 3 "), "{ctx}");
        let said = match node {
            1 => "launcher: rank 3 was frozen (its process was stopped",
            _ => "launcher: rank 3 (on another node) stopped responding (no heartbeat for ",
        };
        assert!(launcher.starts_with(said), "{ctx}");
        for line in ranks {
            assert!(
                line.contains(": rank 3 stopped responding (no heartbeat for "),
                "{line}\n{ctx}"
            );
        }
    }
}

#[test]
fn a_killed_rank_is_named_as_lost_by_every_rank_and_every_launcher() {
    // 2 emulated hosts of 2 ranks, rank 2 (host 1) killed. Before: host 0's launcher
    // blamed the first of its own ranks to exit ("rank 0 failed first (exit status 1)").
    let jobs = emulated_hosts(2, 2, "10");
    sleep(Duration::from_millis(2500));
    testkit::signal(jobs[1].1[0], 9); // rank 2: SIGKILL
    let hit = Instant::now();
    for (node, (launcher, _)) in jobs.into_iter().enumerate() {
        let run = finish(launcher, LIMIT);
        let ctx = format!("host {node}, ended {:?} after the signal:\n{run}", hit.elapsed());
        assert_eq!(run.code, Some(1), "{ctx}");
        assert!(hit.elapsed() < Duration::from_secs(10) + SLACK, "{ctx}");
        let (ranks, launcher) = lines(&run);
        let said = match node {
            1 => "launcher: rank 2 failed first (killed by signal 9 (SIGKILL)",
            _ => "launcher: rank 2 (on another node) failed first (its connection closed)",
        };
        assert!(launcher.starts_with(said), "{ctx}");
        assert!(!ranks.is_empty(), "{ctx}");
        for line in ranks {
            assert!(
                line.contains(": rank 2 failed first (its connection closed)"),
                "{line}\n{ctx}"
            );
        }
    }
}

#[test]
fn a_node_whose_only_rank_is_stopped_ends_once_no_rank_can_wait_for_it() {
    // 2 emulated hosts of 1 rank, rank 0 (which hosts the store) stopped. Host 1's rank
    // names it and ends; host 0's launcher had no rank of its own left to fail, and no
    // way to hear from host 1. Before: it waited for its stopped rank for ever.
    let jobs = emulated_hosts(2, 1, "3");
    sleep(Duration::from_millis(2500));
    let frozen = jobs[0].1[0];
    testkit::signal(frozen, 19); // rank 0: SIGSTOP
    let hit = Instant::now();
    for (node, (launcher, _)) in jobs.into_iter().enumerate() {
        let run = finish(launcher, LIMIT);
        let ctx = format!("host {node}, ended {:?} after the signal:\n{run}", hit.elapsed());
        assert_eq!(run.code, Some(1), "{ctx}");
        let (_, said) = lines(&run);
        if node == 0 {
            // --timeout, then 5 s for the other nodes' ranks to say it first.
            assert!(hit.elapsed() < Duration::from_secs(3 + 5) + SLACK, "{ctx}");
            assert!(
                said.starts_with(
                    "launcher: rank 0 was frozen (stopped: SIGSTOP, or a debugger) for longer than --timeout (3 s)"
                ),
                "{ctx}"
            );
        } else {
            assert!(said.starts_with("launcher: rank 0 (on another node)"), "{ctx}");
        }
    }
    assert!(testkit::ended(frozen), "the stopped rank is gone");
}
