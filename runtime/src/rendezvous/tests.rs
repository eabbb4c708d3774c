//! The store's tests: a server and its ranks in one process, joins refused, waits that
//! time out or fail at once naming the rank, heartbeats and blame, and strangers that
//! send junk or trickle bytes.

use super::*;
use crate::wire;
use std::thread;

fn server(world: usize) -> StoreServer {
    StoreServer::start("127.0.0.1:0".parse().unwrap(), "job-a", world).unwrap()
}

fn join(s: &StoreServer, job: &str, world: usize, rank: usize) -> Result<Store> {
    let j = Join {
        job_id: job.into(),
        world_size: world,
        rank,
    };
    Store::connect("127.0.0.1", s.addr().port(), &j, Duration::from_secs(2))
}

#[test]
fn set_wait_and_barrier_across_ranks() {
    let s = server(2);
    let port = s.addr().port();
    let other = thread::spawn(move || {
        let j = Join {
            job_id: "job-a".into(),
            world_size: 2,
            rank: 1,
        };
        let mut st = Store::connect("127.0.0.1", port, &j, Duration::from_secs(2)).unwrap();
        st.set("x", b"from 1").unwrap();
        st.barrier("end", 1, 2).unwrap();
        st.bye();
    });
    let mut st = join(&s, "job-a", 2, 0).unwrap();
    let got = st.wait(&[("x".into(), 1)], "x").unwrap();
    assert_eq!(got, vec![b"from 1".to_vec()]);
    st.barrier("end", 0, 2).unwrap();
    other.join().unwrap();
}

#[test]
fn refuses_wrong_job_world_and_duplicate_rank() {
    let s = server(2);
    let e = join(&s, "job-b", 2, 1).err().unwrap().to_string();
    assert!(e.contains("belongs to job 'job-a'"), "{e}");
    let e = join(&s, "job-a", 3, 1).err().unwrap().to_string();
    assert!(e.contains("world of 3 ranks, but rank 0 with 2"), "{e}");
    let _first = join(&s, "job-a", 2, 1).unwrap();
    let e = join(&s, "job-a", 2, 1).err().unwrap().to_string();
    assert!(e.contains("already joined"), "{e}");
}

#[test]
fn a_wait_times_out_naming_the_missing_rank() {
    let s = server(3);
    let mut st = join(&s, "job-a", 3, 0).unwrap();
    st.timeout = Duration::from_millis(200);
    let e = st.barrier("b", 0, 3).unwrap_err().to_string();
    assert!(e.contains("ranks 1, 2 not there (they never joined"), "{e}");
}

#[test]
fn a_timeout_names_the_rank_busy_elsewhere_before_the_ranks_that_wait_too() {
    // Rank 1 waits in the store for another meeting; rank 2 joined and never comes
    // (stuck in a send, say): rank 2 is the one the others wait on.
    let s = server(3);
    let mut zero = join(&s, "job-a", 3, 0).unwrap();
    let mut one = join(&s, "job-a", 3, 1).unwrap();
    let _two = join(&s, "job-a", 3, 2).unwrap();
    one.timeout = Duration::from_secs(3);
    let waiter = thread::spawn(move || one.barrier("rows", 1, 3));
    thread::sleep(Duration::from_millis(100));
    zero.timeout = Duration::from_millis(300);
    let e = zero.barrier("check", 0, 3).unwrap_err().to_string();
    assert!(
        e.contains(
            "waiting for every rank to reach 'check': rank 2 is alive but did not come: busy outside the store \
             (stuck in a send, a receive or on the GPU?); rank 1 was itself waiting for every rank to reach 'rows'"
        ),
        "{e}"
    );
    let (busy, waiting) = (
        e.find("rank 2 is alive").unwrap(),
        e.find("rank 1 was itself waiting").unwrap(),
    );
    assert!(busy < waiting, "the rank waited on first: {e}");
    assert!(!e.contains("not there"), "{e}");
    drop(zero);
    let _ = waiter.join();
}

#[test]
fn a_lost_rank_fails_waits_at_once() {
    let s = server(2);
    let mut st = join(&s, "job-a", 2, 0).unwrap();
    drop(join(&s, "job-a", 2, 1).unwrap()); // rank 1 vanishes without a goodbye
    let t = Instant::now();
    let e = st.barrier("b", 0, 2).unwrap_err().to_string();
    assert!(e.contains("rank 1 is gone"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(2));
}

/// A heartbeat connection for `rank` of a world of 3, beside `store`'s.
fn heartbeat_of(store: &Store, rank: usize) -> Result<Store> {
    let j = Join {
        job_id: "job-a".into(),
        world_size: 3,
        rank,
    };
    store.heartbeat(&j, Duration::from_secs(2))
}

#[test]
fn the_rank_whose_heartbeat_stopped_is_blamed_and_every_rank_gets_that_answer() {
    let s = server(3);
    let mut zero = join(&s, "job-a", 3, 0).unwrap();
    let (one, two) = (join(&s, "job-a", 3, 1).unwrap(), join(&s, "job-a", 3, 2).unwrap());
    let (mut beat1, mut beat2) = (heartbeat_of(&one, 1).unwrap(), heartbeat_of(&two, 2).unwrap());
    beat1.beat().unwrap();
    beat2.beat().unwrap();
    // Both beat: nobody to blame (and nothing recorded).
    assert_eq!(zero.blame(Duration::from_millis(300)).unwrap(), None);
    // Rank 2 stops beating; rank 1 goes on.
    for _ in 0..8 {
        thread::sleep(Duration::from_millis(50));
        beat1.beat().unwrap();
    }
    let (rank, why) = zero.blame(Duration::from_millis(300)).unwrap().unwrap();
    assert_eq!(rank, 2, "{why}");
    assert!(
        why.starts_with("stopped responding (no heartbeat for ")
            && why.ends_with(": its process is stopped or frozen)"),
        "{why}"
    );
    // The answer stands, for every rank, whatever happens next (rank 1 lost, say).
    drop(beat1);
    drop(one);
    thread::sleep(Duration::from_millis(100));
    assert_eq!(zero.blame(Duration::from_millis(300)).unwrap(), Some((2, why)));
    drop(two);
}

#[test]
fn a_lost_rank_is_blamed_before_a_silent_one_and_a_heartbeat_closing_loses_nobody() {
    let s = server(3);
    let mut zero = join(&s, "job-a", 3, 0).unwrap();
    let one = join(&s, "job-a", 3, 1).unwrap();
    let two = join(&s, "job-a", 3, 2).unwrap();
    let mut beat1 = heartbeat_of(&one, 1).unwrap();
    beat1.beat().unwrap();
    // A heartbeat's connection closing says nothing; its rank is still there.
    drop(beat1);
    thread::sleep(Duration::from_millis(100));
    assert_eq!(zero.first_lost().unwrap(), None);
    // Rank 1 is silent by now, but rank 2 is lost: the lost one is to blame.
    drop(two);
    thread::sleep(Duration::from_millis(100));
    assert_eq!(
        zero.blame(Duration::from_millis(50)).unwrap(),
        Some((2, "failed first (its connection closed)".into()))
    );
    drop(one);
}

#[test]
fn a_heartbeat_is_refused_for_a_rank_that_has_not_joined() {
    let s = server(3);
    let zero = join(&s, "job-a", 3, 0).unwrap();
    let e = heartbeat_of(&zero, 2).err().unwrap().to_string();
    assert!(e.contains("a heartbeat of rank 2, which has not joined"), "{e}");
    // A heartbeat adds no rank: rank 0 may beat, and still join only once.
    assert!(heartbeat_of(&zero, 0).is_ok());
    let e = join(&s, "job-a", 3, 0).err().unwrap().to_string();
    assert!(e.contains("already joined"), "{e}");
}

#[test]
fn the_store_remembers_which_rank_went_first() {
    let s = server(3);
    let mut st = join(&s, "job-a", 3, 0).unwrap();
    assert_eq!(st.first_lost().unwrap(), None);
    drop(join(&s, "job-a", 3, 2).unwrap());
    thread::sleep(Duration::from_millis(100));
    drop(join(&s, "job-a", 3, 1).unwrap());
    thread::sleep(Duration::from_millis(100));
    let (rank, how) = st.first_lost().unwrap().unwrap();
    assert_eq!((rank, how.as_str()), (2, "its connection closed"));
}

#[test]
fn stray_bytes_do_not_disturb_the_store() {
    use std::io::Write;
    let s = server(1);
    for junk in [
        &b"GET / HTTP/1.1\r\n\r\n"[..],
        &wire::header(HELLO, u64::MAX),
        &[0u8; 3],
    ] {
        let mut c = TcpStream::connect(s.addr()).unwrap();
        let _ = c.write_all(junk);
    }
    let mut st = join(&s, "job-a", 1, 0).unwrap();
    st.set("k", b"v").unwrap();
    assert_eq!(st.get("k").unwrap(), Some(b"v".to_vec()));
}

#[test]
fn a_join_larger_than_a_join_is_closed_at_once_not_awaited() {
    // A header announcing a 16 MiB join: closed before anything is allocated for it.
    use std::io::{Read, Write};
    let s = server(1);
    let mut c = TcpStream::connect(s.addr()).unwrap();
    c.write_all(&wire::header(HELLO, 16 << 20)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let t = Instant::now();
    let mut buf = [0u8; 1];
    assert_eq!(c.read(&mut buf).unwrap_or(0), 0, "the store answered a 16 MiB join");
    assert!(
        t.elapsed() < Duration::from_secs(4),
        "closed only after {:?}",
        t.elapsed()
    );
}

/// A listener on a free port whose every connection gets `first` at once (if any),
/// then, after reading `reads` frames, one byte every 100 ms for 30 s.
fn trickler(first: Option<Vec<u8>>, reads: usize) -> u16 {
    use std::io::Write;
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { return };
            let first = first.clone();
            thread::spawn(move || {
                let _ = wire::read_frame(&mut c, MAX_FRAME);
                if let Some(f) = first {
                    let _ = c.write_all(&f);
                }
                for _ in 0..reads {
                    let _ = wire::read_frame(&mut c, MAX_FRAME);
                }
                // A header announcing a large reply, one byte at a time.
                for b in wire::header(OK, 1 << 20).iter().chain(&[0u8; 300]) {
                    if c.write_all(&[*b]).is_err() {
                        return;
                    }
                    thread::sleep(Duration::from_millis(100));
                }
            });
        }
    });
    port
}

fn rank_one() -> Join {
    Join {
        job_id: "job-a".into(),
        world_size: 2,
        rank: 1,
    }
}

#[test]
fn a_master_that_trickles_bytes_holds_a_join_no_longer_than_the_timeout() {
    let port = trickler(None, 0);
    let t = Instant::now();
    let e = Store::connect("127.0.0.1", port, &rank_one(), Duration::from_secs(1))
        .err()
        .unwrap();
    let took = t.elapsed();
    assert!(took < Duration::from_secs(1) + crate::deadline::SLACK, "{took:?}");
    assert!(e.to_string().contains("no whole reply came within 1 s"), "{e}");
}

#[test]
fn a_store_that_trickles_a_reply_is_left_within_the_timeout_and_the_slack() {
    let mut ok = vec![];
    wire::write_frame(&mut ok, OK, &[]).unwrap();
    let port = trickler(Some(ok), 0);
    let mut st = Store::connect("127.0.0.1", port, &rank_one(), Duration::from_secs(1)).unwrap();
    let t = Instant::now();
    let e = st.get("k").err().unwrap();
    let took = t.elapsed();
    assert!(
        took < Duration::from_secs(1) + crate::deadline::SLACK + Duration::from_millis(500),
        "{took:?}"
    );
    assert!(
        took >= Duration::from_secs(1),
        "it gave up before the timeout and slack: {took:?}"
    );
    assert!(e.to_string().contains("no answer in time"), "{e}");
}
