//! Asynchrony and no deadline, as real NCCL on one node: a collective is queued on the
//! stream and the call returns; if a peer never makes its matching call (it left, exited,
//! was killed with SIGKILL or frozen with SIGSTOP), the survivors' streams stay busy for
//! ever and nothing fails by itself, until `ncclCommAbort`, which frees them at once.
//! Non-blocking inits say `ncclInProgress` until every rank has joined, and can be
//! aborted; finalize waits for the queued work (blocking) or says `ncclInProgress` until
//! it is done (non-blocking). And the abort itself waits for the node's other ranks: it
//! does not return while one that has not left is stopped or gone (NCCL's issues #863,
//! #1013, #1777); the tests of stuck work turn that off (`NCCL_DOUBLE_ABORT_WAITS=0`)
//! where the peer is killed or stopped, and the last tests here show it.

mod support;

use std::time::Duration;
use support::{Job, Out, all, all_ok, fields, gone, wait_for_file};

/// How long a survivor watches its stream (ms).
const WATCH_MS: u64 = 1500;

/// The `key` field of the line of `out` that holds `marker`, as a number.
fn number(out: &Out, marker: &str, key: &str) -> u64 {
    let line = out.stdout.lines().find(|l| l.contains(marker)).unwrap_or_default();
    fields(line)
        .get(key)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key} on the {marker} line:\n{out}"))
}

/// Checks a survivor's `watch` report: the call returned at once and so did the free of
/// its send buffer; the stream stayed busy for the whole watch, with no error reported
/// (`ncclCommGetAsyncError` said ncclSuccess throughout, an event recorded after it was
/// not complete); `ncclCommAbort` took well under 100 ms and left the stream idle (the
/// event complete); and the process ended cleanly: exit 0, no warning (the deferred free
/// happened: no leak reported when the context went).
fn stuck_until_aborted(o: &Out, outs: &[Out]) {
    let ctx = all(outs);
    assert_eq!(o.code, Some(0), "rank {}:\n{ctx}", o.rank);
    let line = o.stdout.lines().find(|l| l.contains("op=watch")).unwrap_or_default();
    let f = fields(line);
    assert!(number(o, "op=watch", "call_ms") < 200, "{ctx}");
    assert!(number(o, "op=watch", "free_ms") < 200, "{ctx}");
    assert_eq!(
        f.get("idle_polls"),
        Some(&"0"),
        "the stream was idle at some point:\n{ctx}"
    );
    // Polled every 10 ms or so: the watch lasted its time.
    assert!(number(o, "op=watch", "busy_polls") > 80, "{ctx}");
    assert_eq!(f.get("states"), Some(&"ncclSuccess"), "{ctx}");
    assert!(number(o, "op=watch", "abort_ms") < 100, "the abort was slow:\n{ctx}");
    assert_eq!(f.get("idle_after_abort"), Some(&"true"), "{ctx}");
    // An event recorded after the collective answers as the stream does.
    assert_eq!(f.get("event_done_while_stuck"), Some(&"false"), "{ctx}");
    assert_eq!(f.get("event_done_after_abort"), Some(&"true"), "{ctx}");
    assert!(o.stderr.is_empty(), "rank {}:\n{ctx}", o.rank);
}

/// A job of `world` ranks watching a collective; the last rank misbehaves with `brk`.
fn watch_job(world: usize, brk: &[&str]) -> Job {
    let watch = WATCH_MS.to_string();
    Job::new("watch", world)
        .args(&["--watch-ms", &watch])
        .rank_args(world - 1, brk)
}

/// A `watch` job whose last rank joins, writes the returned file, then never calls
/// anything (the test kills or stops it).
fn hang_job(world: usize) -> (Job, std::path::PathBuf) {
    let job = watch_job(world, &[]);
    let ready = job.file("ready");
    let job = job.rank_args(world - 1, &["--break", "hang", "--ready-file", ready.to_str().unwrap()]);
    (job, ready)
}

#[test]
fn a_peer_that_leaves_without_calling_the_collective_leaves_the_stream_busy_until_abort() {
    for mode in [&[][..], &["--nonblocking"][..]] {
        let job = watch_job(3, &["--break", "exit-early"]).args(mode);
        let outs = job.run();
        for o in &outs[..2] {
            stuck_until_aborted(o, &outs);
        }
        assert_eq!(outs[2].code, Some(0), "{}", all(&outs));
        assert_eq!(outs[2].stdout.trim(), "rank=2 left early", "{}", all(&outs));
        // Everyone left (the peer by its abort): the folder is gone.
        assert!(job.left_nothing_behind(), "{}", all(&outs));
    }
}

#[test]
fn a_peer_alive_that_never_calls_the_collective_leaves_the_stream_busy_until_abort() {
    let (job, _) = hang_job(2);
    let mut ranks = job.start();
    let peer = ranks.pop().unwrap();
    let (me, in_time) = ranks.pop().unwrap().finish();
    assert!(in_time, "{me}");
    stuck_until_aborted(&me, std::slice::from_ref(&me));
    let pid = peer.pid();
    let peer = peer.kill();
    assert_eq!(peer.code, None, "{peer}");
    assert!(gone(pid));
}

#[test]
fn a_peer_that_exits_or_is_killed_without_abort_is_waited_for_until_abort() {
    // It exits on its own (exit code 3), never ending its communicator.
    let outs = watch_job(2, &["--break", "crash"])
        .env("NCCL_DOUBLE_ABORT_WAITS", "0")
        .run();
    assert_eq!(outs[1].code, Some(3), "{}", all(&outs));
    stuck_until_aborted(&outs[0], &outs);
    // kill -9 once it has joined.
    let (job, ready) = hang_job(2);
    let job = job.env("NCCL_DOUBLE_ABORT_WAITS", "0");
    let mut ranks = job.start();
    wait_for_file(&ready);
    let peer = ranks.pop().unwrap();
    let pid = peer.pid();
    peer.signal("KILL");
    let (me, in_time) = ranks.pop().unwrap().finish();
    let peer = peer.kill();
    assert_eq!(peer.code, None, "{peer}");
    assert!(in_time, "{me}");
    stuck_until_aborted(&me, &[me.clone(), peer]);
    assert!(gone(pid));
}

#[test]
fn a_stopped_peer_is_waited_for_until_abort() {
    let (job, ready) = hang_job(3);
    let job = job.args(&["--nonblocking"]).env("NCCL_DOUBLE_ABORT_WAITS", "0");
    let mut ranks = job.start();
    wait_for_file(&ready);
    let peer = ranks.pop().unwrap();
    let pid = peer.pid();
    peer.signal("STOP");
    let ends: Vec<_> = ranks.into_iter().map(|r| r.finish()).collect();
    // Nothing is left: the stopped one is killed (SIGKILL ends a stopped process).
    let peer = peer.kill();
    assert_eq!(peer.code, None, "{peer}");
    assert!(gone(pid));
    let outs: Vec<Out> = ends.iter().map(|(o, _)| o.clone()).collect();
    for (o, in_time) in &ends {
        assert!(in_time, "{}", all(&outs));
        stuck_until_aborted(o, &outs);
    }
}

#[test]
fn a_blocking_init_waits_for_a_missing_rank_with_no_deadline() {
    let job = Job::new("allreduce", 2).without(1);
    let mut ranks = job.start();
    std::thread::sleep(Duration::from_millis(1500));
    let mut rank0 = ranks.pop().unwrap();
    assert!(rank0.running(), "ncclCommInitRank ended by itself");
    let pid = rank0.pid();
    let o = rank0.kill();
    assert_eq!(o.code, None, "{o}");
    assert!(o.stderr.is_empty(), "{o}");
    assert!(gone(pid));
}

#[test]
fn a_non_blocking_init_is_in_progress_until_the_last_rank_joins() {
    let outs = Job::new("allreduce", 3)
        .args(&["--nonblocking", "--count", "2"])
        .rank_args(2, &["--delay-ms", "1000"])
        .run();
    all_ok(&outs);
    for o in &outs {
        assert_eq!(o.results(), [vec![6.0, 9.0]], "{}", all(&outs));
    }
    for o in &outs[..2] {
        assert!(
            number(o, "init=nonblocking", "in_progress_polls") > 10,
            "{}",
            all(&outs)
        );
        assert!(number(o, "init=nonblocking", "init_ms") >= 700, "{}", all(&outs));
    }
}

#[test]
fn a_non_blocking_init_can_be_aborted_while_a_rank_is_missing() {
    let job = Job::new("init-abort", 2).args(&["--abort-after-ms", "800"]).without(1);
    let outs = job.run();
    let o = &outs[0];
    assert_eq!(o.code, Some(0), "{o}");
    let f = fields(o.stdout.trim());
    assert_eq!(f["states"], "ncclInProgress", "{o}");
    assert!(number(o, "op=init-abort", "polls") > 20, "{o}");
    assert!(number(o, "op=init-abort", "abort_ms") < 100, "{o}");
    assert!(o.stderr.is_empty(), "{o}");
}

/// Finalize, then destroy, through cudarc's raw API (cudarc's safe Comm only aborts),
/// with rank 1 calling the all-reduce 800 ms late: blocking, rank 0's finalize waits for
/// it; non-blocking, it says ncclInProgress at once and ncclCommGetAsyncError says so
/// until the all-reduce is done. Then a collective on the finalized communicator and an
/// abort of the destroyed one are refused.
#[test]
fn finalize_waits_for_the_queued_work_blocking_or_not() {
    for nonblocking in [false, true] {
        let mode: &[&str] = if nonblocking { &["--nonblocking"] } else { &[] };
        let job = Job::new("raw", 2).args(mode).rank_args(1, &["--op-delay-ms", "800"]);
        let outs = job.run();
        all_ok(&outs);
        let ctx = all(&outs);
        for o in &outs {
            let line = o.stdout.lines().find(|l| l.contains("op=raw")).unwrap_or_default();
            let f = fields(line);
            assert_eq!(f["result"], "3,3,3,3", "{ctx}");
            assert_eq!(f["after_finalize"], "ncclInvalidUsage", "{ctx}");
            assert_eq!(f["abort_after_destroy"], "ncclInvalidArgument", "{ctx}");
            assert!(o.stderr.contains("on a finalized communicator"), "{o}");
            assert!(o.stderr.contains("not a live communicator. Destroyed twice?"), "{o}");
        }
        let r0 = &outs[0];
        let f = fields(r0.stdout.lines().find(|l| l.contains("op=raw")).unwrap());
        if nonblocking {
            assert_eq!(f["finalize"], "ncclInProgress", "{ctx}");
            assert!(number(r0, "op=raw", "finalize_ms") < 300, "{ctx}");
            assert!(number(r0, "op=raw", "in_progress_polls") > 10, "{ctx}");
        } else {
            assert_eq!(f["finalize"], "ncclSuccess", "{ctx}");
            assert!(number(r0, "op=raw", "finalize_ms") >= 600, "{ctx}");
        }
        assert!(number(r0, "op=raw", "settled_ms") >= 600, "{ctx}");
        assert!(job.left_nothing_behind(), "{ctx}");
    }
}

/// The abort waits for the node: with a peer stopped (SIGSTOP), a survivor's abort does
/// not return until the peer resumes (SIGCONT); with a peer killed, never (the survivor
/// is still in it when the test gives up and kills it). Peers of another node (another
/// `NCCL_DOUBLE_HOST`) do not hold it.
#[test]
fn an_abort_waits_while_a_peer_of_the_node_is_stopped_or_gone() {
    // Stopped, then resumed 1.5 s after the survivor's watch ended; NCCL_DEBUG=WARN for
    // the double to say why the abort waits, as NCCL's warnings go: to its debug output
    // (here stdout), not stderr.
    let (job, ready) = hang_job(2);
    let job = job.rank_env(0, "NCCL_DEBUG", "WARN");
    let mut ranks = job.start();
    wait_for_file(&ready);
    let peer = ranks.pop().unwrap();
    let pid = peer.pid();
    peer.signal("STOP");
    let me = ranks.pop().unwrap();
    std::thread::sleep(Duration::from_millis(WATCH_MS + 1500));
    peer.signal("CONT");
    let (me, in_time) = me.finish();
    let peer = peer.kill();
    assert!(gone(pid));
    let ctx = all(&[me.clone(), peer]);
    assert!(in_time, "{ctx}");
    assert_eq!(me.code, Some(0), "{ctx}");
    assert!(
        number(&me, "op=watch", "abort_ms") >= 1000,
        "the abort did not wait:\n{ctx}"
    );
    assert!(
        me.stdout
            .contains("NCCL WARN rank 0: ncclCommAbort waits for rank 1 of this node")
            && me.stdout.contains("which is stopped")
            && !me.stderr.contains("ncclCommAbort waits"),
        "{ctx}"
    );
    // Killed: the abort never returns.
    let (job, ready) = hang_job(2);
    let job = job.rank_env(0, "NCCL_DEBUG", "WARN");
    let mut ranks = job.start();
    wait_for_file(&ready);
    let peer = ranks.pop().unwrap();
    peer.signal("KILL");
    let mut me = ranks.pop().unwrap();
    std::thread::sleep(Duration::from_millis(WATCH_MS + 2000));
    assert!(me.running(), "the abort returned with a dead peer on the node");
    let me = me.kill();
    let peer = peer.kill();
    assert!(me.stdout.contains("which is gone"), "{}", all(&[me.clone(), peer]));
    // Another node's peer, killed: the abort returns at once.
    let (job, ready) = hang_job(2);
    let job = job.rank_env(1, "NCCL_DOUBLE_HOST", "another-node");
    let mut ranks = job.start();
    wait_for_file(&ready);
    let peer = ranks.pop().unwrap();
    peer.signal("KILL");
    let (me, in_time) = ranks.pop().unwrap().finish();
    let peer = peer.kill();
    assert!(in_time, "{me}");
    stuck_until_aborted(&me, &[me.clone(), peer]);
}
