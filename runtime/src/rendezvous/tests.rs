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
        secret: None,
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
            secret: None,
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
        secret: None,
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
    let verdict = zero.blame(Duration::from_millis(300)).unwrap().unwrap();
    let (rank, why) = (verdict.rank, verdict.why.clone());
    assert_eq!(rank, 2, "{why}");
    assert!(!verdict.gave_up);
    assert!(
        why.starts_with("stopped responding (no heartbeat for ")
            && why.ends_with(": its process is stopped or frozen)"),
        "{why}"
    );
    // The answer stands, for every rank, whatever happens next (rank 1 lost, say).
    drop(beat1);
    drop(one);
    thread::sleep(Duration::from_millis(100));
    assert_eq!(zero.blame(Duration::from_millis(300)).unwrap(), Some(verdict));
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
        Some(Verdict::new(2, "failed first (its connection closed)".into(), false))
    );
    drop(one);
}

#[test]
fn a_rank_that_gave_up_is_no_crash_and_is_blamed_after_a_lost_or_silent_one() {
    let s = server(4);
    let mut zero = join(&s, "job-a", 4, 0).unwrap();
    let (mut one, two) = (join(&s, "job-a", 4, 1).unwrap(), join(&s, "job-a", 4, 2).unwrap());
    let mut three = join(&s, "job-a", 4, 3).unwrap();
    // Rank 1's own wait timed out, with nobody to blame: it gives up, then exits.
    one.give_up("nothing moved between it and rank 2 for the whole --timeout")
        .unwrap();
    // The rank that gave up asks: nobody (it is not its own cause).
    assert_eq!(one.blame(Duration::from_secs(60)).unwrap(), None);
    drop(one);
    thread::sleep(Duration::from_millis(100));
    // Gone, and said so to a rank waiting for it, but not as a crash.
    let e = zero.wait(&[("k1".into(), 1)], "rank 1's key").unwrap_err().to_string();
    assert!(
        e.contains("rank 1 is gone (it gave up: nothing moved between it and rank 2 for the whole --timeout)")
            && !e.contains("crashed"),
        "{e}"
    );
    assert_eq!(
        zero.first_lost().unwrap(),
        Some(Verdict::new(
            1,
            "nothing moved between it and rank 2 for the whole --timeout".into(),
            true
        ))
    );
    // Rank 2 is then killed: the crash is the cause, not the rank that gave up.
    drop(two);
    thread::sleep(Duration::from_millis(100));
    assert_eq!(
        three.blame(Duration::from_secs(60)).unwrap(),
        Some(Verdict::new(2, "failed first (its connection closed)".into(), false))
    );
    drop((zero, three));
    // With no crash and no silence, the first rank that gave up is named, as having given up.
    let s = server(3);
    let mut zero = join(&s, "job-a", 3, 0).unwrap();
    let mut one = join(&s, "job-a", 3, 1).unwrap();
    let two = join(&s, "job-a", 3, 2).unwrap();
    one.give_up("nothing moved between it and rank 2 for the whole --timeout")
        .unwrap();
    drop(one);
    thread::sleep(Duration::from_millis(100));
    let verdict = zero.blame(Duration::from_secs(60)).unwrap().unwrap();
    assert_eq!(
        verdict,
        Verdict::new(
            1,
            "gave up first (nothing moved between it and rank 2 for the whole --timeout)".into(),
            true
        )
    );
    // That answer is not kept: a rank lost later is the answer from then on.
    drop(two);
    thread::sleep(Duration::from_millis(100));
    let verdict = zero.blame(Duration::from_secs(60)).unwrap().unwrap();
    assert_eq!((verdict.rank, verdict.gave_up), (2, false), "{}", verdict.why);
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
    let Verdict { rank, why: how, .. } = st.first_lost().unwrap().unwrap();
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
        secret: None,
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

/// A heartbeat connection for `rank` of a world of `world`, beside `store`'s.
fn heartbeat_in(store: &Store, world: usize, rank: usize) -> Result<Store> {
    let j = Join {
        job_id: "job-a".into(),
        world_size: world,
        rank,
        secret: None,
    };
    store.heartbeat(&j, Duration::from_secs(2))
}

/// A join made by hand, as a stranger who knows the job's id would make it: job-a, a
/// world of `world`, as `rank` in `role`, and nothing more. The connection, if the store
/// took it, else what it said.
fn joined_by_hand(
    addr: std::net::SocketAddr,
    world: u64,
    rank: u64,
    role: u64,
) -> std::result::Result<TcpStream, String> {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let hello = wire::Encoder::default().str("job-a").u64(world).u64(rank).u64(role);
    wire::write_frame(&mut c, HELLO, &hello.0).unwrap();
    match wire::read_frame(&mut c, MAX_FRAME) {
        Ok((OK, _)) => Ok(c),
        Ok((_, why)) => Err(String::from_utf8_lossy(&why).into_owned()),
        Err(e) => Err(e.to_string()),
    }
}

#[test]
fn a_rank_holds_no_more_heartbeat_connections_than_it_needs() {
    // Issue 53, item 1: 20,000 heartbeat joins for one rank were each taken, with a thread
    // of rank 0's each (16,206 threads, then an abort). A rank has one heartbeat, and room
    // for one more (a communicator made anew before the last one's closing is seen).
    let s = server(2);
    let _zero = join(&s, "job-a", 2, 0).unwrap();
    let one = join(&s, "job-a", 2, 1).unwrap();
    let first = heartbeat_in(&one, 2, 1).unwrap();
    let _second = heartbeat_in(&one, 2, 1).unwrap();
    let e = heartbeat_in(&one, 2, 1).err().unwrap().to_string();
    assert_eq!(
        e, "rank 1 already holds 2 heartbeat connections, the most one rank may hold",
        "{e}"
    );
    // One closes: its place is free again, once the store has seen it go.
    drop(first);
    let again = (0..100).find_map(|_| {
        thread::sleep(Duration::from_millis(20));
        heartbeat_in(&one, 2, 1).ok()
    });
    assert!(again.is_some(), "a closed heartbeat's place was never freed");
}

#[test]
fn past_its_cap_the_store_refuses_newcomers_as_they_come() {
    // Issue 53, item 1: the store of a world of 1 holds 2 + 64 connections. Rank 0, its two
    // heartbeats and 63 silent strangers fill it: each newcomer is refused on the spot
    // (a frame saying why, from the accepting thread: no thread of its own, nothing read).
    let s = server(1);
    let zero = join(&s, "job-a", 1, 0).unwrap();
    let _beats = [heartbeat_in(&zero, 1, 0).unwrap(), heartbeat_in(&zero, 1, 0).unwrap()];
    let _strangers: Vec<TcpStream> = (0..63).map(|_| TcpStream::connect(s.addr()).unwrap()).collect();
    for _ in 0..3 {
        let mut c = TcpStream::connect(s.addr()).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let (kind, why) = wire::read_frame(&mut c, MAX_FRAME).expect("a newcomer past the cap is told at once");
        let why = String::from_utf8_lossy(&why);
        assert_eq!(kind, FULL, "{why}");
        assert!(
            why.contains("holds 66 connections, the most it takes for a job of 1 ranks (2 per rank, and 64 joining)"),
            "{why}"
        );
    }
    // The ranks that are in are served as before.
    let mut zero = zero;
    zero.set("k", b"v").unwrap();
    assert_eq!(zero.get("k").unwrap(), Some(b"v".to_vec()));
}

#[test]
fn a_full_store_is_tried_again_until_it_takes_the_rank() {
    // A store full when a rank comes answers FULL: the rank tries again (a flood of
    // strangers passes), as it does while the master is not up yet.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    thread::spawn(move || {
        for (n, c) in l.incoming().enumerate() {
            let Ok(mut c) = c else { return };
            let _ = wire::read_frame(&mut c, MAX_FRAME);
            let _ = match n {
                0 => wire::write_frame(&mut c, FULL, b"the store is full"),
                _ => wire::write_frame(&mut c, OK, b"token"),
            };
            thread::spawn(move || {
                let _ = wire::read_frame(&mut c, MAX_FRAME);
            });
        }
    });
    assert!(Store::connect("127.0.0.1", port, &rank_one(), Duration::from_secs(5)).is_ok());
}

#[test]
fn a_value_or_a_store_past_its_limit_is_refused_naming_the_rank() {
    // Issue 53, item 2: one joined client grew rank 0 from 4 MB to 1.66 GB in 7 s. One key
    // holds at most 8 MiB, the store of 2 ranks 256 MiB and 1 MiB per rank: past either, the
    // set is refused in one line naming the rank, and the job goes on.
    let s = server(2);
    let mut zero = join(&s, "job-a", 2, 0).unwrap();
    let mut one = join(&s, "job-a", 2, 1).unwrap();
    let e = one.set("big", &vec![0u8; (8 << 20) + 1]).unwrap_err();
    assert!(store_said(&e), "{e:#}");
    assert_eq!(
        e.to_string(),
        "rank 1 set 'big' to 8.0 MiB: one key of the store holds at most 8.0 MiB"
    );
    assert_eq!(zero.get("big").unwrap(), None);
    // 32 keys of 8 MiB fit; a 33rd does not, whoever sets it; a key set anew counts once.
    let full = vec![7u8; 8 << 20];
    for k in 0..32 {
        one.set(&format!("k/{k}"), &full).unwrap();
    }
    one.set("k/0", &full).unwrap();
    let e = one.set("k/\n32", &full).unwrap_err().to_string();
    assert_eq!(
        e,
        "rank 1 set 'k/\\n32' (8.0 MiB) past what the store keeps for a job of 2 ranks, 258.0 MiB (256 MiB, and 1 \
         MiB per rank), of which it holds 256.0 MiB already"
    );
    let e = zero.set("k/33", &full).unwrap_err().to_string();
    assert!(
        e.starts_with("rank 0 set 'k/33' (8.0 MiB) past what the store keeps"),
        "{e}"
    );
    // A wait that names a key again and again would make the store build one answer of
    // them all: refused past what one answer carries (16 MiB).
    let keys: Vec<(String, usize)> = (0..3).map(|_| ("k/1".to_string(), 1)).collect();
    let e = zero.wait(&keys, "k/1 thrice").unwrap_err().to_string();
    assert!(
        e.starts_with(
            "rank 0 waited for 3 keys that hold 24.0 MiB together, more than one answer of the store carries"
        ),
        "{e}"
    );
    // Nothing failed: both ranks still meet, and what was freed is room again.
    for k in 0..32 {
        one.set(&format!("k/{k}"), &[]).unwrap();
    }
    zero.set("k/33", &full).unwrap();
    let other = thread::spawn(move || one.barrier("end", 1, 2));
    zero.barrier("end", 0, 2).unwrap();
    other.join().unwrap().unwrap();
    zero.set("k/33", &[]).unwrap();
}

#[test]
fn a_heartbeat_from_another_process_than_its_ranks_is_refused_and_hides_nothing() {
    // Issue 53, item 3: anyone who knew the job's id could join as rank 2's heartbeat and
    // beat for it, hiding that rank 2 froze. A heartbeat is taken only from the process
    // that joined as its rank (it shows the token of that join).
    let s = server(3);
    let mut zero = join(&s, "job-a", 3, 0).unwrap();
    let (one, two) = (join(&s, "job-a", 3, 1).unwrap(), join(&s, "job-a", 3, 2).unwrap());
    let mut beat1 = heartbeat_of(&one, 1).unwrap();
    let mut beat2 = heartbeat_of(&two, 2).unwrap();
    beat1.beat().unwrap();
    beat2.beat().unwrap();
    // A stranger, by hand, and rank 1's process, claiming rank 2: both refused.
    let e = joined_by_hand(s.addr(), 3, 2, ROLE_HEARTBEAT).err().unwrap_or_default();
    assert!(
        e.starts_with("a heartbeat for rank 2 from 127.0.0.1:")
            && e.ends_with(
                ", which is not rank 2's own process (it lacks the token of rank 2's join): it is not counted"
            ),
        "{e}"
    );
    let e = heartbeat_of(&one, 2).err().unwrap().to_string();
    assert!(e.contains("which is not rank 2's own process"), "{e}");
    // Rank 2 freezes; rank 1 beats on. Had a fake heartbeat been taken, it would beat too.
    drop(beat2);
    let mut fake = joined_by_hand(s.addr(), 3, 2, ROLE_HEARTBEAT).ok();
    for _ in 0..8 {
        thread::sleep(Duration::from_millis(50));
        beat1.beat().unwrap();
        if let Some(f) = &mut fake {
            let _ = wire::write_frame(f, BEAT, &[]).and_then(|()| wire::read_frame(f, MAX_FRAME).map(drop));
        }
    }
    let verdict = zero
        .blame(Duration::from_millis(300))
        .unwrap()
        .expect("rank 2 is silent");
    assert_eq!(verdict.rank, 2, "{}", verdict.why);
    drop((one, two));
}

#[test]
fn a_job_with_a_secret_refuses_joins_without_it_and_goes_on() {
    // Issue 53, item 4: a job's id can be worked out by anyone on the machine. The store
    // of a job with a secret takes only joins that carry it; a stranger is told so, and
    // the job does not notice.
    use crate::secret::Secret;
    let secret = Secret::fresh().unwrap();
    let s = StoreServer::start_with("127.0.0.1:0".parse().unwrap(), "job-a", 2, Some(secret.clone())).unwrap();
    let port = s.addr().port();
    let with = move |rank: usize, secret: Option<Secret>| {
        let j = Join {
            job_id: "job-a".into(),
            world_size: 2,
            rank,
            secret,
        };
        Store::connect("127.0.0.1", port, &j, Duration::from_secs(2))
    };
    let mut zero = with(0, Some(secret.clone())).unwrap();
    let e = with(1, None).err().unwrap().to_string();
    assert!(
        e.contains(
            "this job's store takes only joins that carry the job's secret (NCCL_WORKBOOK_SECRET), and this one \
             carries none"
        ),
        "{e}"
    );
    let e = with(1, Some(Secret::fresh().unwrap())).err().unwrap().to_string();
    assert!(
        e.contains("the secret this join carries (NCCL_WORKBOOK_SECRET) is not this job's"),
        "{e}"
    );
    assert!(!e.contains(secret.text()), "the store told its secret: {e}");
    // By hand, as rank 1 and as rank 0's heartbeat: refused the same.
    let e = joined_by_hand(s.addr(), 2, 1, ROLE_RANK).err().unwrap_or_default();
    assert!(
        e.starts_with("this job's store takes only joins that carry the job's secret"),
        "{e}"
    );
    let e = joined_by_hand(s.addr(), 2, 0, ROLE_HEARTBEAT).err().unwrap_or_default();
    assert!(
        e.starts_with("this job's store takes only joins that carry the job's secret"),
        "{e}"
    );
    // Nothing changed: rank 1's place is free, nobody is lost, and the job meets.
    assert_eq!(zero.first_lost().unwrap(), None);
    let mut one = with(1, Some(secret)).unwrap();
    let other = thread::spawn(move || one.barrier("end", 1, 2));
    zero.barrier("end", 0, 2).unwrap();
    other.join().unwrap().unwrap();
    // A job without a secret refuses a join that brings one: its ranks were started unlike.
    let plain = server(2);
    let j = Join {
        job_id: "job-a".into(),
        world_size: 2,
        rank: 1,
        secret: Some(Secret::fresh().unwrap()),
    };
    let e = Store::connect("127.0.0.1", plain.addr().port(), &j, Duration::from_secs(2))
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("rank 0, which hosts the store, was started without one: set the same one on every rank"),
        "{e}"
    );
}
