//! The link's tests: two links of this one process, joined by a pair of channels, send
//! each other messages of every size by every protocol, run ahead, wait and fail.

use super::ShmLink;
use super::cpu::has_prefetch_for_write;
use super::layout::{CHANNEL_BYTES, Channel, INLINE, PIECES, SLOT_BYTES, SMALL_PIECE};
use super::sent_by;
use super::wait::{SPIN_FOR, waits_slept};
use crate::transport::Link;
use crate::transport::protocol::{Protocol, ll, ll128};
use std::io;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, AtomicU32, Ordering::*};
use std::time::Duration;

fn pair(tag: &str) -> (ShmLink, ShmLink) {
    let base = format!("/dev/shm/nccl-workbook-test-{}-{tag}", std::process::id());
    let (ab, ba) = (format!("{base}-ab"), format!("{base}-ba"));
    let link = |out: &str, inbox: &str, create: bool| ShmLink {
        rank: 8,
        peer: 9,
        peer_pid: std::process::id(),
        out: OnceLock::from(Channel::map(out, create).unwrap()),
        inbox: OnceLock::from(Channel::map(inbox, create).unwrap()),
        making: Default::default(),
        reserved: Default::default(),
        seen_reserved: Default::default(),
        timeout: Duration::from_secs(5),
        tail_seen: AtomicU32::new(0),
        fifo_tail_seen: Default::default(),
        read: AtomicU32::new(0),
        fifo_read: Default::default(),
        spin: SPIN_FOR,
        proto: AtomicU8::new(Protocol::Simple as u8),
        prefetch_w: has_prefetch_for_write(),
    };
    let a = link(&ab, &ba, true);
    let b = link(&ab, &ba, false);
    let b = ShmLink {
        out: b.inbox,
        inbox: b.out,
        ..b
    };
    let _ = (std::fs::remove_file(&ab), std::fs::remove_file(&ba));
    // `a` made both files (`b` holds no descriptor to reserve with): every region
    // reserved at once, as each sender would on first use.
    for c in [a.out.get().unwrap(), a.inbox.get().unwrap()] {
        // SAFETY: the descriptor of a file this test made, held by the channel.
        assert_eq!(
            unsafe { libc::posix_fallocate(c.lock, 0, CHANNEL_BYTES as libc::off_t) },
            0
        );
        c.populate(0..CHANNEL_BYTES);
        for r in &c.header().reserved {
            r.store(1, Release);
        }
    }
    for link in [&a, &b] {
        for r in &link.reserved {
            r.store(true, Relaxed);
        }
    }
    (a, b)
}

#[test]
fn messages_of_every_size_cross_in_order() {
    let (a, b) = pair("sizes");
    let sizes = [
        0,
        1,
        7,
        INLINE,
        INLINE + 1,
        SMALL_PIECE,
        SMALL_PIECE + 1,
        SLOT_BYTES - 1,
        SLOT_BYTES,
        SLOT_BYTES + 1,
        SLOT_BYTES + INLINE,      // a last piece inline
        SLOT_BYTES + SMALL_PIECE, // a last piece in a small buffer
        5 * SLOT_BYTES + 3,
        3 << 20,
    ];
    std::thread::scope(|s| {
        s.spawn(|| {
            for (i, n) in sizes.iter().enumerate() {
                let msg: Vec<u8> = (0..*n).map(|k| (k * 31 + i) as u8).collect();
                a.send(2, &msg).unwrap();
            }
        });
        for (i, n) in sizes.iter().enumerate() {
            let mut got = vec![0u8; *n];
            b.recv_into(2, &mut got).unwrap();
            assert!(
                got.iter().enumerate().all(|(k, v)| *v == (k * 31 + i) as u8),
                "message {i}"
            );
        }
    });
}

#[test]
fn every_protocol_carries_every_size_in_order_and_counts_its_steps() {
    let sizes = [
        0,
        1,
        7,
        119,
        121,
        4093,
        ll::STEP_DATA + 1,
        ll128::STEP_DATA * 3 + 5,
        3 << 20,
    ];
    for p in Protocol::ALL {
        let (a, b) = pair(&format!("proto-{}", p.name()));
        a.set_protocol(p);
        b.set_protocol(p);
        assert_eq!(b.protocol(), p);
        let before = sent_by(p);
        std::thread::scope(|s| {
            s.spawn(|| {
                for (i, n) in sizes.iter().enumerate() {
                    let msg: Vec<u8> = (0..*n).map(|k| (k * 13 + i) as u8).collect();
                    a.send(4, &msg).unwrap();
                    a.send(4, &msg).unwrap();
                }
            });
            for (i, n) in sizes.iter().enumerate() {
                let want: Vec<u8> = (0..*n).map(|k| (k * 13 + i) as u8).collect();
                let mut got = vec![0u8; *n];
                b.recv_into(4, &mut got).unwrap();
                assert!(got == want, "{} message {i}, {n} bytes", p.name());
                let mut pieces = vec![0u8; *n];
                b.recv_pieces(4, *n, &mut |off, piece| {
                    pieces[off..off + piece.len()].copy_from_slice(piece)
                })
                .unwrap();
                assert!(pieces == want, "{} pieces {i}, {n} bytes", p.name());
            }
        });
        assert!(sent_by(p) >= before + 2 * sizes.len() as u64, "{} counted", p.name());
        // Point-to-point messages go by Simple whatever the collectives use.
        let simple = sent_by(Protocol::Simple);
        a.send(crate::SEND_RECV_TAG, &[1, 2]).unwrap();
        let mut got = [0u8; 2];
        b.recv_into(crate::SEND_RECV_TAG, &mut got).unwrap();
        assert_eq!((got, sent_by(Protocol::Simple)), ([1, 2], simple + 1));
        // A mismatch is named by every protocol.
        a.send(1, &[1, 2, 3]).unwrap();
        let err = b.recv_into(2, &mut [0; 3]).unwrap_err();
        assert!(err.to_string().contains("(tag 1) than this rank (tag 2)"), "{err}");
    }
}

#[test]
fn a_sender_far_ahead_fills_every_line_and_waits_and_nothing_is_overwritten() {
    // Small pieces (inline and in small buffers) and large ones mixed, many more than
    // the lines and slots, sent while the receiver sleeps: the sender must wait for
    // room, and every message must arrive whole and in order.
    let (a, b) = pair("ahead");
    let small = [1, INLINE, INLINE + 9, SMALL_PIECE, 4, 0, 100];
    let mixed = [1, SMALL_PIECE + 1, INLINE, SLOT_BYTES + 5];
    let count = 3 * PIECES;
    // Small ones first, enough to fill every line; then small and large mixed.
    let size = |i: usize| match i < 2 * PIECES {
        true => small[i % small.len()],
        false => mixed[i % mixed.len()],
    };
    let msg = |i: usize| -> Vec<u8> { (0..size(i)).map(|k| (k * 7 + i) as u8).collect() };
    std::thread::scope(|s| {
        s.spawn(|| {
            for i in 0..count {
                a.send(3, &msg(i)).unwrap();
            }
        });
        std::thread::sleep(Duration::from_millis(50));
        for i in 0..count {
            let mut got = vec![0u8; size(i)];
            b.recv_into(3, &mut got).unwrap();
            assert_eq!(got, msg(i), "message {i}");
        }
    });
}

#[test]
fn a_mismatch_is_named_and_a_closed_peer_ends_the_wait() {
    let (a, b) = pair("mismatch");
    a.send(1, &[1, 2, 3]).unwrap();
    let err = b.recv_into(2, &mut [0; 3]).unwrap_err();
    assert!(
        err.to_string()
            .contains("another collective (tag 1) than this rank (tag 2)"),
        "{err}"
    );
    a.send(1, &[1, 2, 3]).unwrap();
    let err = b.recv_into(1, &mut [0; 4]).unwrap_err();
    assert!(err.to_string().contains("sent 3 bytes where 4"), "{err}");
    let (a, b) = pair("closed");
    drop(a);
    let err = b.recv_into(1, &mut [0; 1]).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof, "{err}");
}

#[test]
fn a_wait_longer_than_the_spin_sleeps_and_is_counted() {
    let (a, b) = pair("slept");
    let before = waits_slept();
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(100)); // far beyond SPIN_FOR
            a.send(1, &[7]).unwrap();
        });
        let mut got = [0u8; 1];
        b.recv_into(1, &mut got).unwrap();
        assert_eq!(got, [7]);
    });
    assert!(waits_slept() > before, "the receiver's wait went to sleep");
}
