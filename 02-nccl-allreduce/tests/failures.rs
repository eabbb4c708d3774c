//! Failures end in bounded time and say who failed: ranks killed at several points,
//! ranks that never arrive, a killed launcher, and stray bytes sent to a running job.

use std::io::Write;
use std::net::TcpStream;
use std::process::Child;
use std::thread::sleep;
use std::time::{Duration, Instant};
use testkit::{LIMIT, Run, command, finish, free_port, spawn};

const BIN: &str = env!("CARGO_BIN_EXE_02-nccl-allreduce");
/// The --timeout the ranks get here: every survivor must be out well within it.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Starts `ranks` of a `world` by hand (one process each) on `port`.
fn start(world: usize, ranks: &[usize], port: u16, extra: &[&str]) -> Vec<(usize, Child)> {
    let (w, p) = (world.to_string(), port.to_string());
    ranks
        .iter()
        .map(|&r| {
            let rank = r.to_string();
            let mut args = vec!["--world-size", &w, "--rank", &rank, "--master-port", &p];
            args.extend_from_slice(extra);
            if !extra.contains(&"--timeout") {
                args.extend(["--timeout", "10"]);
            }
            (r, spawn(command(BIN, &args)))
        })
        .collect()
}

fn kill(child: &mut Child) {
    // SIGKILL: no chance to say goodbye, as when a node dies.
    child.kill().unwrap();
    child.wait().unwrap();
}

/// Whether a survivor's message names `dead` as the rank that went.
fn names(run: &Run, dead: usize) -> bool {
    let e = &run.stderr;
    e.contains(&format!("rank {dead} failed first"))
        || e.contains(&format!("lost rank {dead}:"))
        || e.contains(&format!("rank {dead} is gone"))
        || (dead == 0 && e.contains("rank 0, which hosts the store, is gone"))
}

#[test]
fn killing_each_rank_during_a_large_all_reduce() {
    for world in 2..=4usize {
        for dead in 0..world {
            let all: Vec<usize> = (0..world).collect();
            let mut ranks = start(world, &all, free_port(), &["--size", "16M", "--iters", "100000"]);
            sleep(Duration::from_millis(1500)); // well into the timed all-reduces
            kill(&mut ranks[dead].1);
            let killed = Instant::now();
            for (r, child) in ranks.into_iter().filter(|(r, _)| *r != dead) {
                let run = finish(child, LIMIT);
                let ctx = format!(
                    "world {world}, rank {dead} killed, rank {r} after {:?}:\n{run}",
                    killed.elapsed()
                );
                assert!(
                    killed.elapsed() < TIMEOUT,
                    "survivors must exit within --timeout: {ctx}"
                );
                assert_eq!(run.code, Some(1), "{ctx}");
                assert!(names(&run, dead), "the message does not name rank {dead}: {ctx}");
            }
        }
    }
}

#[test]
fn a_rank_that_never_arrives_is_named_at_the_timeout() {
    for dead in [0, 2] {
        let started = Instant::now();
        let others: Vec<usize> = (0..3).filter(|r| *r != dead).collect();
        let ranks = start(3, &others, free_port(), &["--timeout", "2"]);
        for (r, child) in ranks {
            let run = finish(child, LIMIT);
            let ctx = format!("rank {dead} never started; rank {r}:\n{run}");
            assert_eq!(run.code, Some(1), "{ctx}");
            assert!(started.elapsed() < Duration::from_secs(8), "{ctx}");
            let named = if dead == 0 {
                "is rank 0 running"
            } else {
                "rank 2 not there (they never joined"
            };
            assert!(run.stderr.contains(named), "{ctx}");
        }
    }
}

/// The ranks a launcher started, in rank order.
fn ranks_of(launcher: &Child) -> Vec<u32> {
    let pid = launcher.id();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let kids = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        let kids: Vec<u32> = kids.split_whitespace().filter_map(|k| k.parse().ok()).collect();
        if kids.len() == 3 || Instant::now() > deadline {
            return kids;
        }
        sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_launcher_names_the_rank_that_failed_and_how() {
    let launcher = spawn(command(
        BIN,
        &["--nproc-per-node", "3", "--size", "16M", "--iters", "100000"],
    ));
    let kids = ranks_of(&launcher);
    sleep(Duration::from_millis(1500));
    unsafe { libc_kill(kids[1] as i32, 9) };
    let run = finish(launcher, LIMIT);
    assert_eq!(run.code, Some(1), "{run}");
    assert!(
        run.stderr
            .contains("launcher: rank 1 failed first (killed by signal 9 (SIGKILL))"),
        "{run}"
    );
}

#[test]
fn killing_the_launcher_kills_its_ranks() {
    let mut launcher = spawn(command(
        BIN,
        &["--nproc-per-node", "3", "--size", "16M", "--iters", "100000"],
    ));
    let kids = ranks_of(&launcher);
    assert_eq!(kids.len(), 3);
    sleep(Duration::from_millis(500));
    kill(&mut launcher);
    sleep(Duration::from_millis(500));
    for k in kids {
        // Gone, or a zombie waiting for init to reap it: never still running.
        let state = std::fs::read_to_string(format!("/proc/{k}/stat")).unwrap_or_default();
        let state = state
            .rsplit(')')
            .next()
            .unwrap_or("")
            .split_whitespace()
            .next()
            .unwrap_or("gone");
        assert!(
            state == "gone" || state == "Z",
            "rank process {k} outlived its launcher (state {state})"
        );
    }
}

#[test]
fn stray_bytes_sent_to_a_running_jobs_store_change_nothing() {
    let port = free_port();
    let ranks = start(
        2,
        &[0, 1],
        port,
        &["--size", "4M", "--iters", "200", "--format", "json"],
    );
    sleep(Duration::from_millis(300));
    let junk: [&[u8]; 4] = [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        &[0xFF; 64],
        // A frame header claiming an enormous payload, then a half-written frame.
        b"NCWB\x01\x01\0\0\xff\xff\xff\xff\xff\xff\xff\x7f",
        b"NCWB\x01\x02\0\0\x10\0\0\0\0\0\0\0half",
    ];
    for bytes in junk {
        if let Ok(mut c) = TcpStream::connect(("127.0.0.1", port)) {
            let _ = c.write_all(bytes);
        }
    }
    for (r, child) in ranks {
        let run = finish(child, LIMIT);
        assert_eq!(run.code, Some(0), "rank {r}:\n{run}");
        if r == 0 {
            assert_eq!(run.json()["check"]["ok"], true, "{run}");
        }
    }
}

unsafe extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}
