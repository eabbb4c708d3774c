//! Where everything lies in a channel's file: the header and its counters, the metadata
//! line of each piece in flight, the small buffers, the large slots (Simple) and the LL
//! and LL128 rings, and the [`Channel`] that maps them in this process. What lies where is
//! fixed here once; the link ([`super::link`]) reads and writes through these offsets.

use super::wait::futex_wake;
use crate::transport::protocol::{Protocol, ll, ll128};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};

/// Bytes per slot: one piece of a message.
pub const SLOT_BYTES: usize = 512 << 10;
/// Slots per channel: 4 × 512 KiB = 2 MiB, which stays in the CPU's last-level cache, so a
/// piece the sender wrote is still in cache when the receiver reads it. (Measured on
/// 2-core AMD machines: 64 KiB slots made the waits, not the copies, the cost.)
pub const SLOTS: usize = 4;
/// Pieces in flight at most (metadata lines per channel): small pieces need no slot, so
/// a sender may run this far ahead, and reads the receiver's `tail` only when it is.
pub(super) const PIECES: usize = 64;
pub(super) const MAGIC: u64 = u64::from_le_bytes(*b"NCWB-SHM");
/// Where the slots' metadata starts in a channel's file: after the header, on a cache line.
const META_OFFSET: usize = 1024;
/// Where the small buffers start in a channel's file: after the header and the metadata.
const SMALL_OFFSET: usize = 8192;
/// A piece of at most this many bytes goes in the small buffer of its metadata line.
pub const SMALL_PIECE: usize = 4096;
/// Where the slots start in a channel's file: after the small buffers.
const DATA_OFFSET: usize = SMALL_OFFSET + PIECES * SMALL_PIECE;
/// A piece of at most this many bytes travels inline, in its metadata line.
pub const INLINE: usize = 32;
/// Where the LL buffer starts: after the slots, on a 128-byte line.
const LL_OFFSET: usize = DATA_OFFSET + SLOTS * SLOT_BYTES;
/// Where the LL128 buffer starts: after LL's.
const LL128_OFFSET: usize = LL_OFFSET + ll::BYTES;
pub(super) const CHANNEL_BYTES: usize = LL128_OFFSET + ll128::BYTES;
/// The part of a channel every message uses (header, metadata, small buffers): reserved
/// when the channel is made; the rest only when a message needs it ([`ShmLink::reserve`](super::ShmLink::reserve)).
pub(super) const ALWAYS_BYTES: usize = DATA_OFFSET;
const _: () = assert!(LL_OFFSET.is_multiple_of(128) && LL128_OFFSET.is_multiple_of(128));

/// A channel's header. Counters that different sides write sit on different cache
/// lines, so that the two processes do not fight over one line.
#[repr(C)]
pub(super) struct Header {
    pub(super) magic: AtomicU64,
    _pad0: [u64; 7],
    /// Pieces written so far (the sender's counter; also its futex word).
    pub(super) head: AtomicU32,
    /// The receiver is asleep on `head`.
    pub(super) receiver_sleeping: AtomicU32,
    _pad1: [u64; 7],
    /// Pieces read so far (the receiver's counter; also its futex word).
    pub(super) tail: AtomicU32,
    /// The sender is asleep on `tail`.
    pub(super) sender_sleeping: AtomicU32,
    _pad2: [u64; 7],
    /// Set by either side when it leaves (normally or not).
    pub(super) closed: AtomicU32,
    /// The core the sender last waited on, plus one (0: not known yet). Written by the
    /// sender only when it changes, so the line stays in both sides' caches.
    pub(super) sender_cpu: AtomicU32,
    _pad3: [u64; 7],
    /// The counters of the LL and LL128 buffers ([`Protocol::Ll`] and
    /// [`Protocol::Ll128`] as index).
    pub(super) fifos: [Fifo; 2],
    /// Which of the regions that only some messages use are reserved, by protocol
    /// ([`Protocol`] as index: LL's ring, LL128's, Simple's large slots): set by the
    /// sender once it reserved the region ([`ShmLink::reserve`](super::ShmLink::reserve)), before it first writes
    /// there. The receiver reads an LL or LL128 ring only once its flag is set.
    pub(super) reserved: [AtomicU32; 3],
}

/// The counters of one protocol's ring of steps (LL's or LL128's), as the header's `head`
/// and `tail` are the slots': steps written by the sender, steps read by the receiver,
/// each also a futex word to sleep on. The receiver does not poll `head`: it polls the
/// lines' flags, and sleeps on `head` only after a long wait.
#[repr(C, align(64))]
pub(super) struct Fifo {
    pub(super) head: AtomicU32,
    pub(super) receiver_sleeping: AtomicU32,
    _pad0: [u64; 7],
    pub(super) tail: AtomicU32,
    pub(super) sender_sleeping: AtomicU32,
}

/// What a piece is: which message and which part of it, and a small piece itself. One
/// cache line, written by the sender, `seq` last.
#[repr(C, align(64))]
pub(super) struct PieceMeta {
    /// The sender's `head` once this piece is in: the receiver waiting for piece
    /// `tail` sees it here as `tail + 1` (polling this line, not the header's).
    pub(super) seq: AtomicU32,
    pub(super) op: u32,
    pub(super) len: u32,
    /// 1 when the piece is in `bytes`, not in a slot.
    pub(super) inline: u32,
    pub(super) message_len: u64,
    pub(super) offset: u64,
    pub(super) bytes: [u8; INLINE],
}

const _: () = assert!(size_of::<PieceMeta>() == 64);
const _: () = assert!(size_of::<Header>() <= META_OFFSET && META_OFFSET + PIECES * 64 <= SMALL_OFFSET);
const _: () = assert!(size_of::<Fifo>() == 128);

/// One direction between two ranks, mapped in this process.
pub(super) struct Channel {
    pub(super) base: *mut u8,
    /// The creator's open file, holding a shared `flock` on it for as long as the channel
    /// lives (-1 for the peer that only maps it): how any process, in any pid namespace,
    /// tells a live channel file from one that a dead job left ([`remove_dead_files`](super::remove_dead_files)).
    pub(super) lock: libc::c_int,
}

// SAFETY: the mapping is shared memory made for two processes; every access that races
// goes through the header's atomics, and each channel has one sender and one receiver.
unsafe impl Send for Channel {}
unsafe impl Sync for Channel {}

impl Channel {
    pub(super) fn header(&self) -> &Header {
        // SAFETY: the mapping starts with a Header and lives as long as `self`.
        unsafe { &*self.base.cast::<Header>() }
    }

    /// The metadata line of piece number `piece`.
    pub(super) fn meta(&self, piece: u32) -> *mut PieceMeta {
        // SAFETY: PIECES lines fit between META_OFFSET and DATA_OFFSET.
        unsafe {
            self.base
                .add(META_OFFSET)
                .cast::<PieceMeta>()
                .add(piece as usize % PIECES)
        }
    }

    /// Where piece number `piece`, `len` bytes, lies: inline in its metadata line, in
    /// the line's small buffer, or in a slot.
    pub(super) fn place(&self, piece: u32, len: usize) -> *mut u8 {
        let line = piece as usize % PIECES;
        if len <= INLINE {
            // SAFETY: a field of the piece's metadata, inside the mapping.
            unsafe { (&raw mut (*self.meta(piece)).bytes).cast() }
        } else if len <= SMALL_PIECE {
            // SAFETY: PIECES small buffers lie between SMALL_OFFSET and DATA_OFFSET.
            unsafe { self.base.add(SMALL_OFFSET + line * SMALL_PIECE) }
        } else {
            self.data(piece as usize % SLOTS)
        }
    }

    pub(super) fn data(&self, slot: usize) -> *mut u8 {
        // SAFETY: slot < SLOTS, inside the mapping.
        unsafe { self.base.add(DATA_OFFSET + slot * SLOT_BYTES) }
    }

    /// The LL lines of step number `step` (of the ring of [`ll::STEPS`]).
    pub(super) fn ll_step(&self, step: u32) -> &[AtomicU64] {
        let at = LL_OFFSET + (step as usize % ll::STEPS) * ll::STEP_LINES * ll::LINE;
        // SAFETY: the step's lines lie inside the LL buffer, 8-byte aligned, in the
        // mapping that lives as long as `self`; they are only ever accessed as atomics.
        unsafe { std::slice::from_raw_parts(self.base.add(at).cast::<AtomicU64>(), ll::STEP_LINES) }
    }

    /// The first LL128 line of step number `step` (of the ring of [`ll128::STEPS`]).
    pub(super) fn ll128_step(&self, step: u32) -> *mut ll128::Line {
        let at = LL128_OFFSET + (step as usize % ll128::STEPS) * ll128::STEP_LINES * ll128::LINE;
        // SAFETY: the step's lines lie inside the LL128 buffer, 128-byte aligned.
        unsafe { self.base.add(at).cast() }
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        let h = self.header();
        h.closed.store(1, SeqCst);
        futex_wake(&h.head);
        futex_wake(&h.tail);
        // SAFETY: the mapping was made by `map` with this length and is not used again;
        // `lock` is this channel's own descriptor (or -1), closed once, here.
        unsafe {
            libc::munmap(self.base.cast(), CHANNEL_BYTES);
            if self.lock >= 0 {
                libc::close(self.lock);
            }
        }
    }
}

/// Where the region of `p` lies in a channel: LL's ring, LL128's, Simple's large slots.
pub(super) fn region(p: Protocol) -> std::ops::Range<usize> {
    match p {
        Protocol::Ll => LL_OFFSET..LL128_OFFSET,
        Protocol::Ll128 => LL128_OFFSET..CHANNEL_BYTES,
        Protocol::Simple => DATA_OFFSET..LL_OFFSET,
    }
}
