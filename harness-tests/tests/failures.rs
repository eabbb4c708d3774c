//! Failures end in bounded time and say who failed: ranks killed at several points,
//! ranks that never arrive, a killed launcher, and stray bytes sent to a running job.

use std::io::Write;
use std::net::TcpStream;
use std::process::Child;
use std::thread::sleep;
use std::time::{Duration, Instant};
use testkit::{Capability, LIMIT, Run, command, finish, free_port, spawn};

const BIN: &str = env!("CARGO_BIN_EXE_harness-probe");
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
        || (dead == 0
            && (e.contains("rank 0, which hosts the store, is gone")
                || e.contains("rank 0, which hosts the store, stopped answering or is gone")))
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
    // Every rank of worlds 2 to 4 in turn, the jobs side by side (each on its own port).
    let jobs: Vec<_> = (2..=4usize)
        .flat_map(|world| (0..world).map(move |dead| (world, dead)))
        .map(|(world, dead)| {
            let others: Vec<usize> = (0..world).filter(|r| *r != dead).collect();
            (
                world,
                dead,
                Instant::now(),
                start(world, &others, free_port(), &["--timeout", "2"]),
            )
        })
        .collect();
    for (world, dead, started, ranks) in jobs {
        for (r, child) in ranks {
            let run = finish(child, LIMIT);
            let ctx = format!("world {world}, rank {dead} never started; rank {r}:\n{run}");
            assert_eq!(run.code, Some(1), "{ctx}");
            assert!(started.elapsed() < Duration::from_secs(15), "{ctx}");
            let named = if dead == 0 {
                "is rank 0 running".to_string()
            } else {
                format!("rank {dead} not there")
            };
            assert!(run.stderr.contains(&named), "{ctx}");
        }
    }
}

#[test]
fn two_jobs_on_one_port_the_second_is_refused_and_the_first_completes() {
    let port = free_port().to_string();
    let args = [
        "--nproc-per-node",
        "2",
        "--master-port",
        &port,
        // Seconds of small all-reduces (latency-bound, so about as long in a debug build):
        // the first job must still be running when the second comes.
        "--size",
        "4K",
        "--iters",
        "100000",
        "--format",
        "json",
    ];
    let first = spawn(command(BIN, &args));
    sleep(Duration::from_millis(500));
    let second = finish(spawn(command(BIN, &args)), LIMIT);
    assert_eq!(second.code, Some(1), "{second}");
    assert!(
        second
            .stderr
            .contains(&format!("port {port} on 127.0.0.1 is already in use")),
        "{second}"
    );
    // The second job's other rank reached the first job's store, which refused it.
    assert!(second.stderr.contains("this store belongs to job"), "{second}");
    let first = finish(first, LIMIT);
    assert_eq!(first.code, Some(0), "{first}");
    assert_eq!(first.json()["check"]["ok"], true);
}

#[test]
fn a_stranger_who_knows_a_launched_jobs_id_cannot_join_it_and_the_job_goes_on() {
    // Issue 53, item 4: a job's id is easy to work out (here it is given, --job-id), and any
    // process on the machine could join its store: as a rank's heartbeat, say, to beat for
    // it. The launcher gives its ranks a secret that the store asks of every join: the
    // stranger is told so, and the job ends as it would have.
    let port = free_port();
    let p = port.to_string();
    let args = [
        "--nproc-per-node",
        "2",
        "--master-port",
        &p,
        "--job-id",
        "known",
        "--size",
        "4K",
        "--iters",
        "20000",
        "--format",
        "json",
    ];
    let job = spawn(command(BIN, &args));
    // Job "known", a world of 2, rank 1, as its heartbeat (role 1): a join made by hand.
    let mut payload = 5u32.to_le_bytes().to_vec();
    payload.extend_from_slice(b"known");
    for field in [2u64, 1, 1] {
        payload.extend_from_slice(&field.to_le_bytes());
    }
    let mut hello = b"NCWB\x01\x01\0\0".to_vec();
    hello.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    hello.extend_from_slice(&payload);
    let until = Instant::now() + Duration::from_secs(30);
    // Tried until rank 1 has joined (before, a heartbeat of it is refused for that).
    let said = loop {
        let answer = TcpStream::connect(("127.0.0.1", port)).ok().and_then(|mut c| {
            c.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
            c.write_all(&hello).ok()?;
            let mut head = [0u8; 16];
            std::io::Read::read_exact(&mut c, &mut head).ok()?;
            let mut body = vec![0u8; u64::from_le_bytes(head[8..].try_into().unwrap()).min(4096) as usize];
            std::io::Read::read_exact(&mut c, &mut body).ok()?;
            Some((head[5], String::from_utf8_lossy(&body).into_owned()))
        });
        match answer {
            Some((_, why)) if why.contains("which has not joined") => {}
            Some(answer) => break answer,
            None => {}
        }
        assert!(Instant::now() < until, "the job's store never answered");
        sleep(Duration::from_millis(50));
    };
    assert_eq!(
        said.0, 129,
        "the store took a heartbeat without the job's secret: {said:?}"
    );
    assert!(
        said.1.starts_with(
            "this job's store takes only joins that carry the job's secret (NCCL_WORKBOOK_SECRET), and this one \
             carries none"
        ),
        "{said:?}"
    );
    let run = finish(job, LIMIT);
    assert_eq!(run.code, Some(0), "{run}");
    assert_eq!(run.json()["check"]["ok"], true, "{run}");
}

/// The TCP ports process `pid` listens on (from /proc: its sockets' inodes, matched
/// against the kernel's table of listening sockets).
fn listening_ports(pid: u32) -> Vec<u16> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .collect::<Vec<_>>()
        })
        .unwrap_or_default()
        .iter()
        .filter_map(|l| {
            l.to_str()?
                .strip_prefix("socket:[")?
                .strip_suffix(']')
                .map(str::to_string)
        })
        .collect();
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let listening = f.get(3) == Some(&"0A") && f.get(9).is_some_and(|i| inodes.iter().any(|x| x == i));
            let port = f
                .get(1)?
                .rsplit(':')
                .next()
                .and_then(|p| u16::from_str_radix(p, 16).ok())?;
            listening.then_some(port)
        })
        .collect()
}

#[test]
fn junk_sent_to_the_store_during_setup_changes_nothing() {
    // Ranks 0 and 1 of 3 start while rank 2 is late: rank 0's store is listening, and
    // waiting. (The peer links listen only once every rank has joined.)
    let port = free_port();
    let mut ranks = start(3, &[0, 1], port, &["--count", "100000", "--format", "json"]);
    sleep(Duration::from_millis(700));
    let ports: Vec<u16> = ranks.iter().flat_map(|(_, c)| listening_ports(c.id())).collect();
    assert!(!ports.is_empty(), "rank 0's store is not listening");
    let junk: [&[u8]; 4] = [
        b"GET / HTTP/1.1\r\n\r\n",
        &[0xAB; 300],
        b"NCWB\x01\xc8\0\0\xff\xff\xff\xff\xff\xff\xff\x7f",
        b"NCWB\x01",
    ];
    for p in &ports {
        for bytes in junk {
            if let Ok(mut c) = TcpStream::connect(("127.0.0.1", *p)) {
                let _ = c.write_all(bytes);
            }
        }
    }
    ranks.extend(start(3, &[2], port, &["--count", "100000", "--format", "json"]));
    for (r, child) in ranks {
        let run = finish(child, LIMIT);
        assert_eq!(run.code, Some(0), "rank {r}:\n{run}");
        if r == 0 {
            assert_eq!(run.json()["check"]["ok"], true, "{run}");
        }
    }
}

/// The ranks a launcher started, in rank order.
fn ranks_of(launcher: &Child) -> Vec<u32> {
    let pid = launcher.id();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let kids = testkit::children(pid);
        if kids.len() == 3 || Instant::now() > deadline {
            return kids;
        }
        sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_frozen_rank_even_the_stores_host_ends_the_job_within_the_timeout_and_is_named() {
    // Rank 0 hosts the store, rank 2 only computes: freezing either (SIGSTOP) must end the
    // job within --timeout plus a constant, and the launcher names the frozen one. (It
    // used to wait 3 s more for the frozen rank to exit, which a stopped process cannot,
    // and 2 s more asking the frozen store who failed.)
    for victim in [0, 2] {
        let launcher = spawn(command(
            BIN,
            &[
                "--nproc-per-node",
                "3",
                "--size",
                "16M",
                "--iters",
                "100000",
                "--timeout",
                "3",
            ],
        ));
        let kids = ranks_of(&launcher);
        sleep(Duration::from_millis(1500));
        testkit::signal(kids[victim], 19); // SIGSTOP
        let hit = Instant::now();
        let run = finish(launcher, LIMIT);
        let took = hit.elapsed();
        testkit::signal(kids[victim], 9); // if it were still there
        assert_eq!(run.code, Some(1), "{run}");
        assert!(
            run.stderr.contains(&format!(
                "launcher: rank {victim} was frozen (its process was stopped: SIGSTOP, or a debugger)"
            )),
            "{run}"
        );
        // By hand, unloaded, with --timeout 5: 6.1 s (rank 0) and 5.1 s (rank 2), from 10.1
        // and 8.1; the bound leaves room for a loaded machine.
        assert!(
            took < Duration::from_secs(3 + 7),
            "rank {victim} frozen: ended after {took:?}\n{run}"
        );
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
    testkit::signal(kids[1], 9);
    let run = finish(launcher, LIMIT);
    assert_eq!(run.code, Some(1), "{run}");
    assert!(
        run.stderr
            .contains("launcher: rank 1 failed first (killed by signal 9 (SIGKILL): by someone, or by the kernel's out-of-memory killer"),
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
        assert!(
            testkit::ended(k),
            "rank process {k} outlived its launcher (state {:?})",
            testkit::process_state(k)
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
    fn setrlimit(resource: i32, rlim: *const [u64; 2]) -> i32;
}

#[test]
fn a_frozen_store_is_called_stuck_not_a_stranger() {
    // Rank 0 is stopped before rank 1 joins: the kernel still takes the connection, and
    // nothing answers. (It used to say "something other than this program's store".)
    let port = free_port();
    let p = port.to_string();
    let rank0 = spawn(command(BIN, &["--world-size", "2", "--rank", "0", "--master-port", &p]));
    sleep(Duration::from_millis(700));
    testkit::signal(rank0.id(), 19); // SIGSTOP
    let args = [
        "--world-size",
        "2",
        "--rank",
        "1",
        "--master-port",
        &p,
        "--timeout",
        "3",
    ];
    let run = finish(spawn(command(BIN, &args)), LIMIT);
    testkit::signal(rank0.id(), 9);
    let _ = finish(rank0, LIMIT);
    assert_eq!(run.code, Some(1), "{run}");
    assert!(
        run.stderr
            .contains("took the connection but did not answer within 3 s: rank 0 is stuck"),
        "{run}"
    );
}

#[test]
fn a_master_that_trickles_a_byte_now_and_then_holds_a_rank_no_longer_than_the_timeout() {
    // Something on the master's port sends a byte every half second and never a whole
    // reply. A socket's read timeout restarts at every byte: it used to hold a rank with
    // --timeout 1 for 7.5 s. Now every read of the store ends by its deadline.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    std::thread::spawn(move || {
        for mut c in listener.incoming().flatten() {
            std::thread::spawn(move || {
                for _ in 0..60 {
                    if c.write_all(b"x").is_err() {
                        return;
                    }
                    sleep(Duration::from_millis(500));
                }
            });
        }
    });
    let args = [
        "--world-size",
        "2",
        "--rank",
        "1",
        "--master-port",
        &port,
        "--timeout",
        "1",
    ];
    let t = Instant::now();
    let run = finish(spawn(command(BIN, &args)), LIMIT);
    let took = t.elapsed();
    assert_eq!(run.code, Some(1), "{run}");
    assert_eq!(run.stderr.trim().lines().count(), 1, "{run}");
    assert!(run.stderr.contains("no whole reply came within 1 s"), "{run}");
    // --timeout 1 and the 2 s every wait may add, with room for a loaded machine.
    assert!(took < Duration::from_secs(1 + 2 + 2), "ended after {took:?}\n{run}");
}

#[test]
fn strangers_on_the_stores_port_neither_exhaust_it_nor_keep_a_rank_out() {
    // Rank 0 may hold 128 descriptors. 200 strangers connect to its store and stay,
    // silent, before rank 1 comes with --timeout 8. The store closes the oldest stranger
    // past 64, so rank 1 gets in at once. (It used to keep every one: out of
    // descriptors, its accept loop spun, and rank 1 waited until strangers timed out
    // after 10 s, past its own deadline.)
    use std::os::unix::process::CommandExt;
    let port = free_port();
    let p = port.to_string();
    let args = ["--world-size", "2", "--master-port", &p, "--count", "1000"];
    let mut rank0 = command(BIN, &[&args[..], &["--rank", "0", "--timeout", "20"]].concat());
    // SAFETY: setrlimit is async-signal-safe, as code between fork and exec must be.
    unsafe {
        rank0.pre_exec(|| {
            setrlimit(7, &[128, 128]); // RLIMIT_NOFILE
            Ok(())
        });
    }
    let rank0 = spawn(rank0);
    let mut strangers = vec![];
    let until = Instant::now() + Duration::from_secs(5);
    while strangers.len() < 200 && Instant::now() < until {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(c) => strangers.push(c),
            Err(_) => sleep(Duration::from_millis(20)),
        }
    }
    sleep(Duration::from_millis(300));
    let rank1 = spawn(command(BIN, &[&args[..], &["--rank", "1", "--timeout", "8"]].concat()));
    let runs: Vec<Run> = [rank0, rank1].into_iter().map(|c| finish(c, LIMIT)).collect();
    drop(strangers);
    for (r, run) in runs.iter().enumerate() {
        assert_eq!(run.code, Some(0), "rank {r}:\n{run}");
    }
}

/// Three ranks by hand over TCP (1000 elements, --timeout 8), rank 2 held `ms` after every
/// rank published its address; returns the store's port, the ranks, and the peer ports of
/// ranks 0 and 1 once they are open (while rank 2 is held).
fn rank_2_held(ms: u64) -> (u16, Vec<(usize, Child)>, Vec<u16>) {
    let (port, w) = (free_port(), ["--count", "1000", "--transport", "tcp", "--timeout", "8"]);
    let mut ranks = start(3, &[0, 1], port, &w);
    let p = port.to_string();
    let late = ["--world-size", "3", "--rank", "2", "--master-port", &p];
    let mut late = command(BIN, &[&late[..], &w].concat());
    late.env("NCCL_WORKBOOK_FAULT", format!("stall-mesh:2:{ms}"));
    ranks.push((2, spawn(late)));
    let mut peer_ports: Vec<u16> = vec![];
    for _ in 0..100 {
        peer_ports = ranks
            .iter()
            .filter(|(r, _)| *r < 2)
            .flat_map(|(_, c)| listening_ports(c.id()))
            .filter(|p| *p != port)
            .collect();
        if peer_ports.len() >= 2 {
            break;
        }
        sleep(Duration::from_millis(30));
    }
    (port, ranks, peer_ports)
}

/// A TCP peer link's greeting as a stranger sends it, framed by the workbook's own wire
/// code: the job's id (which anyone on the machine can work out), a rank, and a key
/// (`None`: the greeting of the links before they had one). Kind 200 is a greeting.
fn greeting(job: &str, rank: u64, key: Option<&str>) -> Vec<u8> {
    use workbook_runtime::wire::{Encoder, header};
    let mut payload = Encoder::default().str(job).u64(rank);
    if let Some(k) = key {
        payload = payload.str(k);
    }
    [&header(200, payload.0.len() as u64)[..], &payload.0].concat()
}

#[test]
fn a_stranger_who_knows_the_jobs_id_cannot_take_a_ranks_place_on_a_peer_link() {
    // While rank 2 is held, a stranger greets ranks 0 and 1 on their peer ports as rank 2,
    // with the job's id, which anyone can work out (`manual@ADDR:PORT`). The links used to
    // take it on that alone: the stranger held rank 2's place (it could have sent rank 2's
    // data) and the real rank 2, refused as a second copy, failed the job at --timeout.
    // A greeting must show the key each rank published in the store beside its address.
    let (port, ranks, peer_ports) = rank_2_held(3000);
    assert_eq!(peer_ports.len(), 2, "the peer ports of ranks 0 and 1 are not open");
    let job = format!("manual@127.0.0.1:{port}");
    let mut answers = vec![];
    for p in &peer_ports {
        for key in [None, Some("0123456789abcdef0123456789abcdef")] {
            let mut c = TcpStream::connect(("127.0.0.1", *p)).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
            c.write_all(&greeting(&job, 2, key)).unwrap();
            let mut answer = [0u8; 16];
            // Closed unanswered (0 bytes, or reset); an answer is a frame header.
            let n = std::io::Read::read(&mut c, &mut answer).unwrap_or(0);
            answers.push((*p, key.is_some(), n));
        }
    }
    for (r, child) in ranks {
        let run = finish(child, LIMIT);
        assert_eq!(run.code, Some(0), "rank {r}:\n{run}");
    }
    for (p, keyed, n) in answers {
        assert_eq!(
            n, 0,
            "port {p} answered a stranger's greeting (with a key of its own: {keyed})"
        );
    }
}

#[test]
fn silent_and_trickling_strangers_on_the_peer_ports_hold_nobody_up() {
    // While rank 2 is held, strangers connect to ranks 0 and 1's peer ports: ten that say
    // nothing and stay, and one that sends a well-formed frame header and then its
    // payload a byte every 300 ms. Newcomers are read side by side, each with a second to
    // greet, so the real rank 2 gets in at once. (They used to be read one at a time, and
    // the trickler held its rank for as long as it trickled: 24 s here.)
    let started = Instant::now();
    let (_, ranks, peer_ports) = rank_2_held(4000);
    assert!(!peer_ports.is_empty(), "no peer port open while the mesh is built");
    let mut silent = vec![];
    let mut tricklers = vec![];
    for p in peer_ports.clone() {
        // The trickler first: it would be the first newcomer read.
        tricklers.push(std::thread::spawn(move || {
            if let Ok(mut c) = TcpStream::connect(("127.0.0.1", p)) {
                let _ = c.write_all(b"NCWB\x01\x01\0\0\xe8\x03\0\0\0\0\0\0");
                for _ in 0..80 {
                    if c.write_all(b"x").is_err() {
                        break;
                    }
                    sleep(Duration::from_millis(300));
                }
            }
        }));
        sleep(Duration::from_millis(50));
        silent.extend((0..10).filter_map(|_| TcpStream::connect(("127.0.0.1", p)).ok()));
    }
    for (r, child) in ranks {
        let run = finish(child, LIMIT);
        assert_eq!(run.code, Some(0), "rank {r} (peer ports {peer_ports:?}):\n{run}");
    }
    let took = started.elapsed();
    drop(silent);
    assert!(took < Duration::from_secs(16), "the job took {took:?}");
    for t in tricklers {
        let _ = t.join();
    }
}

#[test]
fn junk_sent_to_the_peer_ports_while_the_mesh_is_built_changes_nothing() {
    // Rank 2 is held after every rank published its address: ranks 0 and 1 wait on
    // their open peer ports, where a port scanner's and a stranger's bytes arrive first.
    // (TCP between every pair: on one host the ranks would otherwise share memory.)
    let (port, w) = (
        free_port(),
        ["--count", "100000", "--format", "json", "--transport", "tcp"],
    );
    let mut ranks = start(3, &[0, 1], port, &w);
    let mut late = command(
        BIN,
        &[
            "--world-size",
            "3",
            "--rank",
            "2",
            "--master-port",
            &port.to_string(),
            "--count",
            "100000",
            "--format",
            "json",
            "--transport",
            "tcp",
        ],
    );
    late.env("NCCL_WORKBOOK_FAULT", "stall-mesh:2:1500");
    ranks.push((2, spawn(late)));
    sleep(Duration::from_millis(700));
    let peer_ports: Vec<u16> = ranks
        .iter()
        .filter(|(r, _)| *r < 2)
        .flat_map(|(_, c)| listening_ports(c.id()))
        .filter(|p| *p != port)
        .collect();
    assert!(!peer_ports.is_empty(), "no peer port open while the mesh is built");
    let junk: [&[u8]; 3] = [
        b"SSH-2.0-scanner\r\n",
        b"NCWB\x01\xc8\0\0\xff\xff\xff\xff\xff\xff\xff\x7f",
        b"NCWB\x01\xc8",
    ];
    for p in &peer_ports {
        for bytes in junk {
            if let Ok(mut c) = TcpStream::connect(("127.0.0.1", *p)) {
                let _ = c.write_all(bytes);
            }
        }
        let _ = TcpStream::connect(("127.0.0.1", *p)); // and one that says nothing at all
    }
    for (r, child) in ranks {
        let run = finish(child, LIMIT);
        assert_eq!(run.code, Some(0), "rank {r} (peer ports {peer_ports:?}):\n{run}");
        if r == 0 {
            assert_eq!(run.json()["check"]["ok"], true, "{run}");
        }
    }
}

#[test]
fn a_world_too_large_is_refused_in_one_line_and_a_multitude_of_missing_ranks_in_a_short_one() {
    // Before: an allocation abort with a backtrace (exit 134), and a 600 kB line.
    for (args, env, says) in [
        (
            &["--world-size", "4294967295", "--rank", "0"][..],
            None,
            "--world-size 4294967295: the workbook runs at most 65536 ranks",
        ),
        (
            &[][..],
            Some(("99999999999", "0")),
            "WORLD_SIZE 99999999999: the workbook runs at most 65536 ranks",
        ),
        (
            &[
                "--nproc-per-node",
                "1000",
                "--nnodes",
                "100",
                "--node-rank",
                "1",
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                "29999",
            ][..],
            None,
            "--nproc-per-node 1000 × --nnodes 100 = 100000: the workbook runs at most 65536 ranks",
        ),
    ] {
        let mut cmd = command(BIN, &[&["--backend", "cpu"][..], args].concat());
        if let Some((world, rank)) = env {
            cmd.env("WORLD_SIZE", world).env("RANK", rank);
        }
        let r = finish(spawn(cmd), LIMIT);
        assert_eq!(r.code, Some(2), "{r}");
        assert_eq!(r.stderr.lines().count(), 1, "{r}");
        assert!(r.stderr.contains(says), "{r}");
    }
    let mut cmd = command(BIN, &["--backend", "cpu", "--timeout", "1"]);
    cmd.env("WORLD_SIZE", "3000").env("RANK", "0");
    let r = finish(spawn(cmd), LIMIT);
    assert_eq!(r.code, Some(1), "{r}");
    assert!(r.stderr.contains("ranks 1–2999 (2999 ranks) not there"), "{r}");
    assert!(r.stderr.len() < 500, "{} bytes: {r}", r.stderr.len());
}

#[test]
fn a_low_soft_limit_of_open_files_is_raised_to_the_hard_one() {
    // Before: with `ulimit -Sn 20`, 16 ranks ran out of descriptors and the launcher blamed
    // whichever rank lost the store first. The program raises its soft limit to the hard
    // one at start, as HPC programs do.
    let hard = std::process::Command::new("sh")
        .args(["-c", "ulimit -Hn"])
        .output()
        .unwrap();
    let hard = String::from_utf8_lossy(&hard.stdout).trim().to_string();
    if hard != "unlimited" && hard.parse::<u64>().unwrap_or(0) < 1024 {
        testkit::skip(
            Capability::OpenFiles,
            &format!("the hard limit of open files here is {hard}, too low to raise to: skipped"),
        );
        return;
    }
    let mut cmd = std::process::Command::new("sh");
    cmd.args(["-c", "ulimit -Sn 20 && exec \"$0\" \"$@\"", BIN])
        .args([
            "--backend",
            "cpu",
            "--nproc-per-node",
            "16",
            "--count",
            "4",
            "--iters",
            "1",
        ])
        .args(["--timeout", testkit::TIMEOUT]);
    testkit::clear_job_env(&mut cmd);
    let r = finish(spawn(cmd), LIMIT);
    assert_eq!(r.code, Some(0), "{r}");
    assert!(r.stdout.contains("Check: OK, all 16 ranks hold"), "{r}");
}

/// The probe run as `sh -c 'LIMITS; exec BIN ARGS...'` (with `env` set), bounded by LIMIT.
fn under_limits(limits: &str, args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut cmd = std::process::Command::new("sh");
    cmd.args(["-c", &format!("{limits} && exec \"$0\" \"$@\""), BIN])
        .args(args)
        .args(["--timeout", testkit::TIMEOUT]);
    testkit::clear_job_env(&mut cmd);
    cmd.envs(env.iter().copied());
    finish(spawn(cmd), LIMIT)
}

/// No Rust abort, no backtrace, no panic: what a refused allocation used to print.
fn no_abort(r: &Run) {
    for abort in ["memory allocation of", "stack backtrace", "panicked", "signal 6"] {
        assert!(!r.stderr.contains(abort), "{abort:?} in:\n{r}");
    }
}

#[test]
fn buffers_beyond_ulimit_v_are_refused_before_they_are_made() {
    // Needs `ulimit -v` (RLIMIT_AS), which any user may lower. 2 ranks of --size 1G hold
    // 2 GiB each (the buffer and the copy its check reads back), over the 1.5 GB they may
    // map; nothing that large is made. Before: the memory check counted only the host's
    // free memory, so the run went on and ended in "memory allocation of 1073741824 bytes
    // failed", a 45-line backtrace and SIGABRT.
    let args = ["--backend", "cpu", "--size", "1G", "--iters", "1"];
    let r = under_limits("ulimit -v 1500000", &args, &[]);
    assert_eq!(r.code, Some(2), "{r}");
    no_abort(&r);
    // The ranks decide together (rank 0, which hosts the store, has less left than the
    // others): one line, said once, and no rank goes on to fail on the one that refused.
    let said: Vec<&str> = r.stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(said.len(), 1, "{r}");
    assert!(
        said[0].contains("--size 1G: rank ")
            && said[0].contains(" would hold 2.00 GiB in buffers, and its address space is limited to 1.43 GiB"),
        "{r}"
    );
}

#[test]
fn an_allocation_refused_at_run_time_is_one_line_naming_rank_size_and_limit() {
    // Needs `ulimit -v`. With the check before start skipped (the test hook), the 256 MiB
    // copy that the check reads back does not fit under the limit: that allocation must
    // fail in one line naming the rank, the size and the limit, exit 1. Before: "memory
    // allocation of 268435456 bytes failed", a backtrace and SIGABRT.
    let args = ["--backend", "cpu", "--size", "256M", "--iters", "1"];
    let r = under_limits("ulimit -v 500000", &args, &[("NCCL_WORKBOOK_FAULT", "no-memory-check")]);
    assert_eq!(r.code, Some(1), "{r}");
    no_abort(&r);
    let said = r
        .stderr
        .lines()
        .find(|l| l.contains("could not allocate 256.0 MiB"))
        .unwrap_or_else(|| panic!("no line says the allocation:\n{r}"));
    assert!(said.starts_with("error: rank "), "{said}");
    assert!(
        said.contains("address space is limited to 488.3 MiB (ulimit -v, RLIMIT_AS)"),
        "{said}"
    );
    assert!(r.stderr.contains("launcher: rank "), "{r}");
}

#[test]
fn a_hard_limit_of_open_files_too_low_for_the_job_is_said_before_it_starts() {
    // `ulimit -n 20` sets the hard limit too: 16 ranks cannot be given what they need
    // (rank 0: about 4 per rank, and 64 for its store's newcomers). Before: the ranks ran out of descriptors, rank 0's
    // "Too many open files" was never printed, the others said a foreign store answered
    // and the launcher blamed another rank. Now: one line naming the limit, exit 2, at
    // once (by the launcher; by rank 0 when the ranks are started by hand).
    let args = [
        "--backend",
        "cpu",
        "--nproc-per-node",
        "16",
        "--count",
        "4",
        "--iters",
        "1",
    ];
    let r = under_limits("ulimit -n 20", &args, &[]);
    assert_eq!(r.code, Some(2), "{r}");
    assert_eq!(r.stderr.lines().count(), 1, "{r}");
    assert!(
        r.stderr
            .contains("ulimit -n: a process here may hold 20 open files (its hard limit")
            && r.stderr.contains("rank 0 of a job of 16 ranks needs about 144"),
        "{r}"
    );
    let by_hand = ["--backend", "cpu", "--world-size", "16", "--rank", "0", "--count", "4"];
    let r = under_limits("ulimit -n 20", &by_hand, &[]);
    assert_eq!(r.code, Some(2), "{r}");
    assert_eq!(r.stderr.lines().count(), 1, "{r}");
    assert!(
        r.stderr
            .starts_with("error: rank 0: ulimit -n: a process here may hold 20"),
        "{r}"
    );
}
