//! The shared-memory transport: two ranks on one host pass messages through memory that
//! both processes map, as NCCL's SHM transport does inside a node. No socket, no kernel
//! copy: the sender copies a piece into a slot, the receiver reads (or reduces) it
//! straight from there.
//!
//! Each direction of a pair is a *channel*: a file in `/dev/shm` holding a header, a ring
//! of [`PIECES`] metadata lines, each with a small buffer, and a small ring of large
//! slots, small enough to stay in the CPU's cache. It is a single-producer,
//! single-consumer queue: piece `head` goes into line `head % PIECES` (a few bytes), its
//! small buffer (up to [`SMALL_PIECE`]) or slot `head % SLOTS`, then the sender advances
//! `head`; the receiver reads piece `tail` and then advances `tail`.
//! A piece of a few bytes travels inside its metadata line, one cache line that also
//! says that it has arrived: the receiver polls that line, and one transfer of it from
//! the sender's core brings the news and the bytes together.
//! A side that must wait spins (the other rank, running on another core, is usually
//! about to answer), then sleeps on a futex that the other side wakes: see
//! [`ShmLink::wait`] for when it spins, yields or sleeps, and why. While it sleeps it
//! checks, every few milliseconds, that the peer process is still alive and that the
//! whole `--timeout` has not passed, so a crashed peer ends the wait at once instead of
//! hanging it. Every wait that went to sleep is counted ([`waits_slept`]): the benchmark
//! shows how many calls slept.
//!
//! A channel is made on first use, by its sender, and opened by its receiver at its first
//! receive ([`connect`]); only its header, metadata and small buffers are reserved then:
//! the large slots and the LL and LL128 rings are reserved the first time a message needs
//! them ([`ShmLink::reserve`]).
//!
//! The slots are NCCL's Simple protocol: data, then a flag per piece. Each channel also
//! has a buffer for each of NCCL's two others ([`super::protocol`]): LL's 8-byte lines
//! and LL128's 128-byte lines, each line flagged, each buffer a ring of steps with its own
//! counters ([`Fifo`]). The link sends a collective's messages by the protocol the tuner
//! set ([`Link::set_protocol`]); both ends set the same, so the receiver looks where the
//! sender wrote. Point-to-point messages go by Simple. Steps and pieces sent by each
//! protocol are counted ([`sent_by`]).

use super::protocol::{Protocol, StepHeader, ll, ll128};
use super::{Link, len_mismatch, op_mismatch};
use crate::rendezvous::Store;
use anyhow::{Result, bail};
use std::ffi::CString;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering::*};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Bytes per slot: one piece of a message.
pub const SLOT_BYTES: usize = 512 << 10;
/// Slots per channel: 4 × 512 KiB = 2 MiB, which stays in the CPU's last-level cache, so a
/// piece the sender wrote is still in cache when the receiver reads it. (Measured on
/// 2-core AMD machines: 64 KiB slots made the waits, not the copies, the cost.)
pub const SLOTS: usize = 4;
/// Pieces in flight at most (metadata lines per channel): small pieces need no slot, so
/// a sender may run this far ahead, and reads the receiver's `tail` only when it is.
const PIECES: usize = 64;
/// How many pieces ahead the receiver asks for the next metadata lines ([`prefetch`]):
/// with small messages back to back, the transfer of one line from the sender's core
/// (about 60-100 ns here) was half a 4 B broadcast's time; asked for 8 pieces early, it
/// overlaps the pieces before it (2 ranks, 4 B, 0.17 -> 0.12 us per broadcast).
const PREFETCH: u32 = 8;
/// How many pieces ahead the sender asks for a metadata line for writing
/// ([`prefetch_for_write`]). The line's last piece, [`PIECES`] pieces earlier, was read
/// by the receiver, whose core keeps a copy, and a store to the line waits until that
/// copy is gone; x86 commits stores in order, so every store after it waits too. Where a
/// cache line's round trip between the two cores takes about 500 ns (the VM's vCPUs
/// placed far apart), the sender stalled on every piece: a 4 B broadcast on 2 ranks took
/// 0.16 us, and 0.07 with the line asked for 2 pieces early (0.063 -> 0.059 where the
/// round trip is 70-200 ns). One piece ahead is the line the receiver polls while it
/// waits: taking it from under the receiver was slower there (0.09-0.21 us); 4 and more
/// were slower where the round trip is short.
const PREFETCH_W: u32 = 2;

const MAGIC: u64 = u64::from_le_bytes(*b"NCWB-SHM");
/// Where channel files live, and how their names start: `nccl-workbook-<creator's
/// pid>-<from>-to-<to>`. The pid says whose a file is, so that files of dead processes
/// can be found and removed.
const DIR: &str = "/dev/shm";
const PREFIX: &str = "nccl-workbook-";
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
const CHANNEL_BYTES: usize = LL128_OFFSET + ll128::BYTES;
/// The part of a channel every message uses (header, metadata, small buffers): reserved
/// when the channel is made; the rest only when a message needs it ([`ShmLink::reserve`]).
const ALWAYS_BYTES: usize = DATA_OFFSET;
const _: () = assert!(LL_OFFSET.is_multiple_of(128) && LL128_OFFSET.is_multiple_of(128));
/// How long a waiting side with a core of its own spins before it sleeps: far longer
/// than a peer on another core takes to answer a small message (a fraction of a
/// microsecond), so that two ranks calling back to back never sleep, and short enough
/// that a rank kept waiting (its peer late, or busy with a large reduction) gives its
/// core back soon (a 3 s wait costs well under a second of CPU).
const SPIN_FOR: Duration = Duration::from_micros(100);
/// How long a side that shares a core (more ranks than cores) yields it before it sleeps.
const YIELD_FOR: Duration = Duration::from_micros(50);
/// How often a sleeping side wakes up to check that its peer is alive.
const CHECK_EVERY: Duration = Duration::from_millis(10);

/// A channel's header. Counters that different sides write sit on different cache
/// lines, so that the two processes do not fight over one line.
#[repr(C)]
struct Header {
    magic: AtomicU64,
    _pad0: [u64; 7],
    /// Pieces written so far (the sender's counter; also its futex word).
    head: AtomicU32,
    /// The receiver is asleep on `head`.
    receiver_sleeping: AtomicU32,
    _pad1: [u64; 7],
    /// Pieces read so far (the receiver's counter; also its futex word).
    tail: AtomicU32,
    /// The sender is asleep on `tail`.
    sender_sleeping: AtomicU32,
    _pad2: [u64; 7],
    /// Set by either side when it leaves (normally or not).
    closed: AtomicU32,
    /// The core the sender last waited on, plus one (0: not known yet). Written by the
    /// sender only when it changes, so the line stays in both sides' caches.
    sender_cpu: AtomicU32,
    _pad3: [u64; 7],
    /// The counters of the LL and LL128 buffers ([`Protocol::Ll`] and
    /// [`Protocol::Ll128`] as index).
    fifos: [Fifo; 2],
    /// Which of the regions that only some messages use are reserved, by protocol
    /// ([`Protocol`] as index: LL's ring, LL128's, Simple's large slots): set by the
    /// sender once it reserved the region ([`ShmLink::reserve`]), before it first writes
    /// there. The receiver reads an LL or LL128 ring only once its flag is set.
    reserved: [AtomicU32; 3],
}

/// The counters of one protocol's ring of steps (LL's or LL128's), as the header's `head`
/// and `tail` are the slots': steps written by the sender, steps read by the receiver,
/// each also a futex word to sleep on. The receiver does not poll `head`: it polls the
/// lines' flags, and sleeps on `head` only after a long wait.
#[repr(C, align(64))]
struct Fifo {
    head: AtomicU32,
    receiver_sleeping: AtomicU32,
    _pad0: [u64; 7],
    tail: AtomicU32,
    sender_sleeping: AtomicU32,
}

/// What a piece is: which message and which part of it, and a small piece itself. One
/// cache line, written by the sender, `seq` last.
#[repr(C, align(64))]
struct PieceMeta {
    /// The sender's `head` once this piece is in: the receiver waiting for piece
    /// `tail` sees it here as `tail + 1` (polling this line, not the header's).
    seq: AtomicU32,
    op: u32,
    len: u32,
    /// 1 when the piece is in `bytes`, not in a slot.
    inline: u32,
    message_len: u64,
    offset: u64,
    bytes: [u8; INLINE],
}

const _: () = assert!(size_of::<PieceMeta>() == 64);
const _: () = assert!(size_of::<Header>() <= META_OFFSET && META_OFFSET + PIECES * 64 <= SMALL_OFFSET);
const _: () = assert!(size_of::<Fifo>() == 128);

/// One direction between two ranks, mapped in this process.
struct Channel {
    base: *mut u8,
    /// The creator's open file, holding a shared `flock` on it for as long as the channel
    /// lives (-1 for the peer that only maps it): how any process, in any pid namespace,
    /// tells a live channel file from one that a dead job left ([`remove_dead_files`]).
    lock: libc::c_int,
}

// SAFETY: the mapping is shared memory made for two processes; every access that races
// goes through the header's atomics, and each channel has one sender and one receiver.
unsafe impl Send for Channel {}
unsafe impl Sync for Channel {}

impl Channel {
    /// Maps the channel file at `path` (creating and sizing it when `create`).
    fn map(path: &str, create: bool) -> io::Result<Channel> {
        let c_path = CString::new(path).map_err(io::Error::other)?;
        let flags = if create {
            libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC
        } else {
            libc::O_RDWR | libc::O_CLOEXEC
        };
        // SAFETY: plain system calls on a file we name; every result is checked.
        unsafe {
            let fd = libc::open(c_path.as_ptr(), flags, 0o600);
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            // The creator holds a shared lock while it lives: the kernel drops it when the
            // process ends, however it ends, and every namespace sees it (a pid does not).
            if create && libc::flock(fd, libc::LOCK_SH) != 0 {
                let e = io::Error::last_os_error();
                libc::close(fd);
                libc::unlink(c_path.as_ptr());
                return Err(e);
            }
            // Reserve the memory now: a file only sized (ftruncate) on a full tmpfs would
            // map fine and then kill this process with SIGBUS at its first write.
            if create {
                let r = match fault_shm_full() {
                    true => libc::ENOSPC,
                    // The part every message uses; the large slots and the LL and LL128
                    // rings are reserved by the sender when first needed (`reserve`).
                    false => libc::posix_fallocate(fd, 0, ALWAYS_BYTES as libc::off_t),
                };
                if r != 0 {
                    libc::close(fd);
                    libc::unlink(c_path.as_ptr());
                    return Err(match r {
                        libc::ENOSPC => io::Error::other(full_message()),
                        r => io::Error::from_raw_os_error(r),
                    });
                }
            }
            let base = libc::mmap(
                std::ptr::null_mut(),
                CHANNEL_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                // Not MAP_POPULATE, which would reserve the regions not used yet: the
                // part every message uses is populated below, the others when reserved.
                libc::MAP_SHARED,
                fd,
                0,
            );
            let lock = match create {
                true => fd,
                false => {
                    libc::close(fd);
                    -1
                }
            };
            if base == libc::MAP_FAILED {
                let e = io::Error::last_os_error();
                if lock >= 0 {
                    libc::close(lock);
                }
                return Err(e);
            }
            let channel = Channel {
                base: base.cast(),
                lock,
            };
            // Every page of the part every message uses mapped now, not at its first use:
            // a page touched for the first time in a timed run costs a fault on each side.
            channel.populate(0..ALWAYS_BYTES);
            if create {
                channel.header().magic.store(MAGIC, Release);
            } else if channel.header().magic.load(Acquire) != MAGIC {
                return Err(io::Error::other(format!("{path} is not a channel of this program")));
            }
            Ok(channel)
        }
    }

    /// Maps the pages of `range` now (reserved already: no page is made here, so no
    /// `SIGBUS` on a full `/dev/shm`). Where the kernel lacks `MADV_POPULATE_WRITE`
    /// (before 5.14) they are mapped at their first use instead.
    fn populate(&self, range: std::ops::Range<usize>) {
        // SAFETY: the range lies inside this channel's mapping; madvise only maps pages.
        unsafe {
            libc::madvise(
                self.base.add(range.start).cast(),
                range.end - range.start,
                libc::MADV_POPULATE_WRITE,
            );
        }
    }

    fn header(&self) -> &Header {
        // SAFETY: the mapping starts with a Header and lives as long as `self`.
        unsafe { &*self.base.cast::<Header>() }
    }

    /// The metadata line of piece number `piece`.
    fn meta(&self, piece: u32) -> *mut PieceMeta {
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
    fn place(&self, piece: u32, len: usize) -> *mut u8 {
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

    fn data(&self, slot: usize) -> *mut u8 {
        // SAFETY: slot < SLOTS, inside the mapping.
        unsafe { self.base.add(DATA_OFFSET + slot * SLOT_BYTES) }
    }

    /// The LL lines of step number `step` (of the ring of [`ll::STEPS`]).
    fn ll_step(&self, step: u32) -> &[AtomicU64] {
        let at = LL_OFFSET + (step as usize % ll::STEPS) * ll::STEP_LINES * ll::LINE;
        // SAFETY: the step's lines lie inside the LL buffer, 8-byte aligned, in the
        // mapping that lives as long as `self`; they are only ever accessed as atomics.
        unsafe { std::slice::from_raw_parts(self.base.add(at).cast::<AtomicU64>(), ll::STEP_LINES) }
    }

    /// The first LL128 line of step number `step` (of the ring of [`ll128::STEPS`]).
    fn ll128_step(&self, step: u32) -> *mut ll128::Line {
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

/// A shared-memory link to one peer on this host: a channel each way.
pub struct ShmLink {
    /// This rank.
    rank: usize,
    peer: usize,
    peer_pid: u32,
    /// This rank writes, the peer reads: made by this rank at its first send to the peer
    /// ([`ShmLink::out`]).
    out: OnceLock<Channel>,
    /// The peer writes, this rank reads: made by the peer at its first send, opened here
    /// at this rank's first receive ([`ShmLink::inbox`]).
    inbox: OnceLock<Channel>,
    /// Held while `out` is made, and while `inbox` is looked for (one thread each).
    making: [Mutex<()>; 2],
    /// Which regions of `out` this side reserved ([`ShmLink::reserve`]), and which of
    /// `inbox` it saw reserved, by protocol.
    reserved: [AtomicBool; 3],
    seen_reserved: [AtomicBool; 3],
    timeout: Duration,
    /// The receiver's `tail` as this side last read it (only the sending thread uses it).
    tail_seen: AtomicU32,
    /// The same for the LL and LL128 rings ([`Fifo`]).
    fifo_tail_seen: [AtomicU32; 2],
    /// Pieces this side has read from `inbox`: the inbox's `tail`, kept here too (only the
    /// receiving thread uses it). The header's line is the sender's to poll when the ring
    /// is full; reading it back for every piece would fetch it from the sender's core.
    read: AtomicU32,
    /// The same for the LL and LL128 rings.
    fifo_read: [AtomicU32; 2],
    /// How long a wait spins: [`SPIN_FOR`], or nothing when this host runs more ranks
    /// than it has cores (the peer may be waiting for this very core).
    spin: Duration,
    /// The protocol of the collective's messages ([`Protocol`] as a number), set by
    /// [`Link::set_protocol`] on both ends alike.
    proto: AtomicU8,
    /// The CPU has `prefetchw` ([`PREFETCH_W`]).
    prefetch_w: bool,
}

/// How many steps (LL, LL128) or pieces (Simple) this process has sent by `proto` so far:
/// what shows that a protocol really ran (the benchmark's `proto_steps`). Each sending
/// thread counts its own ([`super::sent`]): a shared counter would cost a locked add per
/// message.
pub fn sent_by(proto: Protocol) -> u64 {
    super::sent::total(proto)
}

/// Waits, over every shared-memory link of this process, that went to sleep on the futex.
static SLEPT: AtomicU64 = AtomicU64::new(0);

/// How many waits of this process have slept on the futex so far: a call during which it
/// moved slept at least once (the benchmark's `slept` column).
pub fn waits_slept() -> u64 {
    SLEPT.load(Relaxed)
}

/// Asks the CPU to bring the cache line at `line` into this core's cache, without waiting
/// for it: a hint, which never faults and changes no memory.
#[inline]
fn prefetch(line: *const i8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing into a register and cannot fault, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(line)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = line;
}

/// Asks the CPU to bring the cache line at `line` into this core's cache for writing
/// (`prefetchw`: taking it from the other cores' caches), without waiting for it: a
/// hint, which never faults and changes no memory. Only where the CPU has the
/// instruction ([`has_prefetch_for_write`]).
#[inline]
fn prefetch_for_write(line: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the caller checked that the CPU has `prefetchw` (has_prefetch_for_write),
    // which reads nothing into a register, writes no memory and cannot fault, whatever
    // the address.
    unsafe {
        std::arch::asm!("prefetchw [{0}]", in(reg) line, options(nostack, preserves_flags, readonly))
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = line;
}

/// Whether this CPU has `prefetchw` (CPUID leaf 0x8000_0001, ECX bit 8: every AMD
/// x86-64 CPU, Intel's since Broadwell).
fn has_prefetch_for_write() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::__cpuid;
        // A safe function in recent Rust, an unsafe one in older.
        // SAFETY: CPUID exists on every x86-64 CPU and only reads registers; a leaf past the
        // highest one returns other data, not a fault, and `max` decides whether ECX counts.
        #[allow(unused_unsafe)]
        let (max, ecx) = unsafe { (__cpuid(0x8000_0000).eax, __cpuid(0x8000_0001).ecx) };
        max >= 0x8000_0001 && ecx & (1 << 8) != 0
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The core this thread runs on, plus one (0 when the system cannot say).
fn current_cpu() -> u32 {
    // SAFETY: no arguments; returns -1 on failure.
    let cpu = unsafe { libc::sched_getcpu() };
    u32::try_from(cpu).map_or(0, |c| c + 1)
}

impl ShmLink {
    /// Waits until `ready()` holds: spins, then sleeps on `word` (a futex), flagging
    /// `sleeping` so the other side knows to wake it. Fails when the peer has left or
    /// died, or when nothing happened for the whole timeout.
    ///
    /// Spinning pays when the peer runs on another core right now: it answers within a
    /// fraction of a microsecond, where a sleeping process takes several to be woken (and
    /// each wake-up costs the waker a system call). So a rank with a core of its own spins
    /// for [`SPIN_FOR`]. But the scheduler may put both ranks on one core (it wakes a
    /// process where its waker runs, and leaves cache-hot processes where they are): then
    /// the peer cannot run while this rank spins, and every call would cost a whole spin
    /// and a switch. Each side says where it last waited (`sender_cpu`); a rank that finds
    /// its peer on its own core sleeps at once, and the wake-up lets the scheduler move
    /// it to an idle core, after which both spin again. Where the host runs more ranks
    /// than cores, a wait yields its core for [`YIELD_FOR`] (a peer that shares it can
    /// run), then sleeps.
    #[inline]
    fn wait(
        &self,
        channel: &Channel,
        word: &AtomicU32,
        sleeping: &AtomicU32,
        ready: impl Fn() -> bool,
        gone: io::ErrorKind,
    ) -> io::Result<()> {
        match ready() {
            true => Ok(()), // the usual case when the peer is ahead: no clock read, no call
            false => self.wait_longer(channel, word, sleeping, ready, gone),
        }
    }

    /// [`ShmLink::wait`] once the first look found nothing.
    #[inline(never)]
    fn wait_longer(
        &self,
        channel: &Channel,
        word: &AtomicU32,
        sleeping: &AtomicU32,
        ready: impl Fn() -> bool,
        gone: io::ErrorKind,
    ) -> io::Result<()> {
        let start = Instant::now();
        let mine = current_cpu();
        if let Some(out) = self.out.get() {
            let told = &out.header().sender_cpu;
            if told.load(Relaxed) != mine {
                told.store(mine, Relaxed);
            }
        }
        let peer_here =
            mine != 0 && (self.inbox.get()).is_some_and(|inbox| inbox.header().sender_cpu.load(Relaxed) == mine);
        if !peer_here {
            while start.elapsed() < self.spin {
                for _ in 0..16 {
                    if ready() {
                        return Ok(());
                    }
                    std::hint::spin_loop();
                }
            }
        }
        // A rank with a core of its own that finds its peer on that core sleeps at once.
        if self.spin.is_zero() {
            while start.elapsed() < YIELD_FOR {
                if ready() {
                    return Ok(());
                }
                std::thread::yield_now();
            }
        }
        let deadline = Instant::now() + self.timeout;
        let mut counted = false;
        loop {
            sleeping.store(1, SeqCst);
            let seen = word.load(SeqCst);
            if ready() {
                sleeping.store(0, Relaxed);
                return Ok(());
            }
            if channel.header().closed.load(SeqCst) != 0 {
                sleeping.store(0, Relaxed);
                return Err(io::Error::new(gone, format!("rank {} closed the channel", self.peer)));
            }
            if !counted {
                SLEPT.fetch_add(1, Relaxed);
                counted = true;
            }
            futex_wait(word, seen, CHECK_EVERY);
            sleeping.store(0, Relaxed);
            if ready() {
                return Ok(());
            }
            if !process_alive(self.peer_pid) {
                return Err(io::Error::new(
                    gone,
                    format!("rank {} (pid {}) is gone", self.peer, self.peer_pid),
                ));
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "nothing moved for the whole timeout",
                ));
            }
        }
    }

    /// Waits for the next piece of a message `len` bytes long whose first `offset`
    /// bytes have arrived, and returns where it lies (its slot, or its metadata line)
    /// and its length.
    fn next_piece(&self, tag: u8, len: usize, offset: usize) -> io::Result<(*const u8, usize)> {
        let inbox = self.inbox()?;
        let h = inbox.header();
        let tail = self.read.load(Relaxed);
        let m = inbox.meta(tail);
        // SAFETY: `seq` is an atomic in the mapping, written by the sender alone.
        let seq = unsafe { &(*m).seq };
        let next = tail.wrapping_add(1);
        self.wait(
            inbox,
            &h.head,
            &h.receiver_sleeping,
            || seq.load(Acquire) == next,
            io::ErrorKind::UnexpectedEof,
        )?;
        // A sender running ahead has written the next lines already: asking for one
        // [`PREFETCH`] pieces ahead now overlaps its transfer from the sender's core with
        // this piece's work, where a load when it is due would wait the whole transfer.
        prefetch(inbox.meta(tail.wrapping_add(PREFETCH)).cast());
        // SAFETY: the sender wrote this slot's metadata before `seq` (Release), which we
        // have seen (Acquire); it will not touch the slot until `tail` moves.
        let (op, n, inline, message_len, at) = unsafe {
            (
                (*m).op,
                (*m).len as usize,
                (*m).inline != 0,
                (*m).message_len,
                (*m).offset,
            )
        };
        if op != tag as u32 {
            return Err(op_mismatch(self.peer, op as u8, tag));
        }
        if message_len != len as u64 {
            return Err(len_mismatch(self.peer, message_len, len));
        }
        if at != offset as u64 || n > SLOT_BYTES || inline != (n <= INLINE) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the shared-memory channel is corrupt",
            ));
        }
        Ok((inbox.place(tail, n), n))
    }

    /// Waits until piece number `head` (the next) of `len` bytes can go: fewer than
    /// [`PIECES`] pieces are unread, and for a piece that needs a large slot, fewer than
    /// [`SLOTS`]. Returns that number.
    fn free_slot(&self, len: usize) -> io::Result<u32> {
        if len > SMALL_PIECE {
            self.reserve(Protocol::Simple)?;
        }
        let h = self.out()?.header();
        let head = h.head.load(Relaxed);
        let room = if len <= SMALL_PIECE { PIECES } else { SLOTS } as u32;
        // The receiver's `tail` as last read: while it shows room, this side need not
        // fetch the receiver's line again.
        if head.wrapping_sub(self.tail_seen.load(Relaxed)) < room {
            return Ok(head);
        }
        self.wait(
            self.out()?,
            &h.tail,
            &h.sender_sleeping,
            || {
                let tail = h.tail.load(Acquire);
                self.tail_seen.store(tail, Relaxed);
                head.wrapping_sub(tail) < room
            },
            io::ErrorKind::BrokenPipe,
        )?;
        Ok(head)
    }

    /// Publishes piece number `head`, filled: `len` bytes at `offset` of a
    /// `message_len`-byte message.
    fn publish(&self, head: u32, tag: u8, len: usize, message_len: usize, offset: usize) {
        let out = self.out.get().expect("a channel made by free_slot");
        let h = out.header();
        let m = out.meta(head);
        // SAFETY: the slot is ours until the receiver has seen `seq` and moved `tail`.
        unsafe {
            (*m).op = tag as u32;
            (*m).len = len as u32;
            (*m).inline = (len <= INLINE) as u32;
            (*m).message_len = message_len as u64;
            (*m).offset = offset as u64;
            (*m).seq.store(head.wrapping_add(1), Release); // the piece is in
        }
        // The line of the piece [`PREFETCH_W`] ahead, once the receiver is done with it
        // (as far as this side knows): asking for it while the receiver still reads its
        // piece there would take it from the receiver.
        let ahead = head.wrapping_add(PREFETCH_W);
        if self.prefetch_w && ahead.wrapping_sub(self.tail_seen.load(Relaxed)) < PIECES as u32 {
            prefetch_for_write(out.meta(ahead).cast());
        }
        // For a receiver asleep on `head`; SeqCst, so that either this side sees
        // `receiver_sleeping` or the receiver sees the piece before it sleeps.
        h.head.fetch_add(1, SeqCst);
        if h.receiver_sleeping.load(SeqCst) != 0 {
            futex_wake(&h.head);
        }
    }

    /// Hands the slot back to the sender.
    fn release(&self) {
        let h = self.inbox.get().expect("a channel opened by next_piece").header();
        self.read.store(self.read.load(Relaxed).wrapping_add(1), Relaxed);
        h.tail.fetch_add(1, SeqCst);
        if h.sender_sleeping.load(SeqCst) != 0 {
            futex_wake(&h.tail);
        }
    }
}

/// LL and LL128: a message goes in steps, each written line by line into the protocol's
/// ring of steps and read line by line as each line's flag arrives.
impl ShmLink {
    /// The protocol a message tagged `tag` goes by: the collective's, Simple for
    /// point-to-point messages (which no tuner chose a protocol for).
    fn protocol_for(&self, tag: u8) -> Protocol {
        match tag {
            crate::SEND_RECV_TAG => Protocol::Simple,
            _ => Protocol::from_index(self.proto.load(Relaxed)),
        }
    }

    /// Data bytes per step of `p` (LL or LL128).
    fn step_data(p: Protocol) -> usize {
        match p {
            Protocol::Ll => ll::STEP_DATA,
            _ => ll128::STEP_DATA,
        }
    }

    /// Waits until the next step of `p` may be written (fewer than the ring's steps are
    /// unread) and returns its number.
    fn free_step(&self, p: Protocol) -> io::Result<u32> {
        self.reserve(p)?;
        let f = &self.out()?.header().fifos[p as usize];
        let steps = match p {
            Protocol::Ll => ll::STEPS,
            _ => ll128::STEPS,
        } as u32;
        let head = f.head.load(Relaxed);
        let seen = &self.fifo_tail_seen[p as usize];
        // The receiver's `tail` as last read: while it shows room, its line stays unread.
        if head.wrapping_sub(seen.load(Relaxed)) < steps {
            return Ok(head);
        }
        self.wait(
            self.out()?,
            &f.tail,
            &f.sender_sleeping,
            || {
                let tail = f.tail.load(Acquire);
                seen.store(tail, Relaxed);
                head.wrapping_sub(tail) < steps
            },
            io::ErrorKind::BrokenPipe,
        )?;
        Ok(head)
    }

    /// Sends `data` by `p` (LL or LL128), step by step.
    fn send_steps(&self, p: Protocol, tag: u8, data: &[u8]) -> io::Result<()> {
        let mut offset = 0;
        loop {
            let n = Self::step_data(p).min(data.len() - offset);
            let step = self.free_step(p)?;
            let h = StepHeader {
                tag,
                len: n,
                message_len: data.len() as u64,
            };
            let flag = step.wrapping_add(1);
            let piece = &data[offset..offset + n];
            match p {
                Protocol::Ll => ll::write(self.out()?.ll_step(step), flag, h, piece),
                // SAFETY: `free_step` said the receiver has handed this step back.
                _ => unsafe { ll128::write(self.out()?.ll128_step(step), flag as u64, h, piece) },
            }
            // The lines carry their own news; `head` is for a receiver asleep on it.
            let f = &self.out()?.header().fifos[p as usize];
            f.head.fetch_add(1, SeqCst);
            if f.receiver_sleeping.load(SeqCst) != 0 {
                futex_wake(&f.head);
            }
            super::sent::count(p);
            offset += n;
            if offset >= data.len() {
                return Ok(());
            }
        }
    }

    /// Receives the step of `p` that holds bytes `offset..offset + dst.len()` of a
    /// message of `len` bytes into `dst`, checking its header first.
    fn recv_step(&self, p: Protocol, tag: u8, len: usize, offset: usize, dst: &mut [u8]) -> io::Result<()> {
        let f = &self.inbox()?.header().fifos[p as usize];
        if !self.seen_reserved[p as usize].load(Relaxed) {
            // The ring's pages exist once the sender reserved them: polling its lines
            // before would make them here (or, on a full /dev/shm, raise SIGBUS).
            let flag = &self.inbox()?.header().reserved[p as usize];
            self.wait(
                self.inbox()?,
                &f.head,
                &f.receiver_sleeping,
                || flag.load(Acquire) != 0,
                io::ErrorKind::UnexpectedEof,
            )?;
            self.inbox()?.populate(region(p));
            self.seen_reserved[p as usize].store(true, Relaxed);
        }
        let read = &self.fifo_read[p as usize];
        let step = read.load(Relaxed);
        let flag = step.wrapping_add(1);
        let mut wait = |ready: &dyn Fn() -> bool| {
            self.wait(
                self.inbox()?,
                &f.head,
                &f.receiver_sleeping,
                ready,
                io::ErrorKind::UnexpectedEof,
            )
        };
        let (h, expected) = match p {
            Protocol::Ll => (
                ll::read_header(self.inbox()?.ll_step(step), flag, &mut wait)?,
                len as u32 as u64, // LL's header holds the low 32 bits
            ),
            // SAFETY: this step is the receiver's until `tail` moves past it.
            _ => (
                unsafe { ll128::read_header(self.inbox()?.ll128_step(step), flag as u64, &mut wait)? },
                len as u64,
            ),
        };
        if h.tag != tag {
            return Err(op_mismatch(self.peer, h.tag, tag));
        }
        if h.message_len != expected {
            return Err(len_mismatch(self.peer, h.message_len, len));
        }
        if h.len != dst.len() || offset + h.len > len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the shared-memory channel is corrupt",
            ));
        }
        match p {
            Protocol::Ll => ll::read_data(self.inbox()?.ll_step(step), flag, dst, &mut wait)?,
            // SAFETY: as above.
            _ => unsafe { ll128::read_data(self.inbox()?.ll128_step(step), flag as u64, dst, &mut wait)? },
        }
        read.store(step.wrapping_add(1), Relaxed);
        f.tail.fetch_add(1, SeqCst);
        if f.sender_sleeping.load(SeqCst) != 0 {
            futex_wake(&f.tail);
        }
        Ok(())
    }

    /// Receives a message of `len` bytes by `p` into `dst`, step by step.
    fn recv_steps_into(&self, p: Protocol, tag: u8, dst: &mut [u8]) -> io::Result<()> {
        let len = dst.len();
        let mut offset = 0;
        loop {
            let n = Self::step_data(p).min(len - offset);
            self.recv_step(p, tag, len, offset, &mut dst[offset..offset + n])?;
            offset += n;
            if offset >= len {
                return Ok(());
            }
        }
    }

    /// Receives a message of `len` bytes by `p`, handing each step to `each` from a
    /// buffer of this thread's (the lines hold flags between the data: no step can be
    /// read where it lies, as a Simple slot is).
    fn recv_steps_pieces(
        &self,
        p: Protocol,
        tag: u8,
        len: usize,
        each: &mut dyn FnMut(usize, &[u8]),
    ) -> io::Result<()> {
        thread_local! {
            static STAGING: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
        }
        let mut buf = STAGING.take();
        let mut offset = 0;
        let result = loop {
            let n = Self::step_data(p).min(len - offset);
            if buf.len() < n {
                buf.resize(n, 0);
            }
            if let Err(e) = self.recv_step(p, tag, len, offset, &mut buf[..n]) {
                break Err(e);
            }
            each(offset, &buf[..n]);
            offset += n;
            if offset >= len {
                break Ok(());
            }
        };
        STAGING.set(buf);
        result
    }
}

impl ShmLink {
    /// The rank at the other end.
    pub fn peer(&self) -> usize {
        self.peer
    }
}

impl Link for ShmLink {
    fn set_protocol(&self, proto: Protocol) {
        self.proto.store(proto as u8, Relaxed);
    }

    fn protocol(&self) -> Protocol {
        Protocol::from_index(self.proto.load(Relaxed))
    }

    fn send(&self, tag: u8, data: &[u8]) -> io::Result<()> {
        let p = self.protocol_for(tag);
        if p != Protocol::Simple {
            return self.send_steps(p, tag, data);
        }
        let mut offset = 0;
        loop {
            let n = SLOT_BYTES.min(data.len() - offset);
            let piece = self.free_slot(n)?;
            // SAFETY: the piece's place is free (see `free_slot`) and holds n bytes.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr().add(offset), self.out()?.place(piece, n), n) };
            self.publish(piece, tag, n, data.len(), offset);
            super::sent::count(Protocol::Simple);
            offset += n;
            if offset >= data.len() {
                return Ok(());
            }
        }
    }

    /// A message that fits a slot is written in place: `fill` gets the free slot itself.
    fn send_with(&self, tag: u8, len: usize, fill: &mut dyn FnMut(&mut [u8]) -> io::Result<()>) -> io::Result<()> {
        if let p @ (Protocol::Ll | Protocol::Ll128) = self.protocol_for(tag) {
            // The lines hold flags between the data: `fill` writes into a buffer of this
            // thread's, kept from call to call (a fresh one would cost page faults).
            thread_local! {
                static OUT: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
            }
            let mut buf = OUT.take();
            if buf.len() < len {
                buf.resize(len, 0);
            }
            let sent = fill(&mut buf[..len]).and_then(|()| self.send_steps(p, tag, &buf[..len]));
            OUT.set(buf);
            return sent;
        }
        if len > SLOT_BYTES {
            let mut buf = vec![0u8; len];
            fill(&mut buf)?;
            return self.send(tag, &buf);
        }
        let piece = self.free_slot(len)?;
        // SAFETY: the piece's place is free (see `free_slot`) and holds len bytes; the
        // receiver will not read it before `publish`.
        fill(unsafe { std::slice::from_raw_parts_mut(self.out()?.place(piece, len), len) })?;
        self.publish(piece, tag, len, len, 0);
        super::sent::count(Protocol::Simple);
        Ok(())
    }

    fn recv_into(&self, tag: u8, dst: &mut [u8]) -> io::Result<()> {
        let p = self.protocol_for(tag);
        if p != Protocol::Simple {
            return self.recv_steps_into(p, tag, dst);
        }
        let len = dst.len();
        self.recv_pieces(tag, len, &mut |off, piece| {
            dst[off..off + piece.len()].copy_from_slice(piece)
        })
    }

    /// Copies each piece out with non-temporal stores, which go to memory without first
    /// reading the destination into the cache: on a large buffer, a third less memory
    /// traffic than a plain copy.
    fn recv_into_streaming(&self, tag: u8, dst: &mut [u8]) -> io::Result<()> {
        let p = self.protocol_for(tag);
        if p != Protocol::Simple {
            return self.recv_steps_into(p, tag, dst);
        }
        let len = dst.len();
        self.recv_pieces(tag, len, &mut |off, piece| {
            copy_around_cache(&mut dst[off..off + piece.len()], piece)
        })
    }

    /// Zero-copy: `each` reads each piece in its slot (`scratch` is not needed).
    fn recv_pieces(&self, tag: u8, len: usize, each: &mut dyn FnMut(usize, &[u8])) -> io::Result<()> {
        let p = self.protocol_for(tag);
        if p != Protocol::Simple {
            return self.recv_steps_pieces(p, tag, len, each);
        }
        let mut offset = 0;
        loop {
            let (at, n) = self.next_piece(tag, len, offset)?;
            // SAFETY: `at` holds `n` bytes the sender published; they stay ours until `release`.
            let piece = unsafe { std::slice::from_raw_parts(at, n) };
            each(offset, piece);
            self.release();
            offset += n;
            if offset >= len {
                return Ok(());
            }
        }
    }

    fn describe(&self) -> String {
        format!("rank {} over shared memory", self.peer)
    }

    /// The whole ring of the link's protocol: the sender can fill every slot (or step)
    /// before the receiver takes one.
    fn eager_limit(&self) -> usize {
        match self.protocol() {
            Protocol::Simple => SLOTS * SLOT_BYTES,
            Protocol::Ll => ll::STEPS * ll::STEP_DATA,
            Protocol::Ll128 => ll128::STEPS * ll128::STEP_DATA,
        }
    }
}

/// Sets up a shared-memory link with every peer in `peers` (ranks on this host), as NCCL's
/// runtime connect does (2.22+): no channel is made here, only what names them, each
/// rank's pid, gathered through the store. A pair's channels are made the first time the
/// two ranks exchange data, each direction on its own:
///
/// - the *sender* makes the channel it writes, at its first send to that peer
///   ([`ShmLink::out`]): it creates `nccl-workbook-<its pid>-<from>-to-<to>.part`, holds
///   a shared `flock` on it for as long as it lives, reserves and maps it, and renames it
///   to its final name, so that a name without `.part` is a channel ready to open. It
///   then writes at once: a send never waits for the receiver to connect, only (as
///   before) for room in the channel, so no order of first uses can deadlock;
/// - the *receiver* opens it at its first receive from that peer ([`ShmLink::inbox`]),
///   waiting for the name to appear, and removes the name once mapped (the memory lives
///   on while either side maps it). Its wait ends when the sender's process is gone, or
///   when nothing appeared for the whole `timeout`, naming the peer.
///
/// A pair that never exchanges data makes nothing: a ring makes one channel per
/// neighbour and direction. A rank that dies, or a channel never received, leaves a
/// name: the launcher removes the files of its ranks when they have ended, and every
/// setup first removes the files of processes that are gone and unlocked, so nothing
/// stays in `/dev/shm` however a job ends.
pub fn connect(
    store: &mut Store,
    rank: usize,
    world: usize,
    peers: &[usize],
    timeout: Duration,
) -> Result<Vec<ShmLink>> {
    remove_dead_files();
    let pid = std::process::id();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let spin = match peers.len() < cores {
        true => SPIN_FOR,
        false => Duration::ZERO,
    };
    // A job on one host with a core for each rank: each rank on a core of its own, unless
    // NCCL_WORKBOOK_BIND=none leaves the ranks to the scheduler (two jobs on one host).
    let leave = std::env::var("NCCL_WORKBOOK_BIND").is_ok_and(|v| v.trim().eq_ignore_ascii_case("none"));
    if peers.len() + 1 == world && world <= cores && !leave {
        bind_to_own_core(peers.iter().filter(|p| **p < rank).count(), world);
    }
    reserve_descriptors();
    let pids = store.share("shm/pid", rank, world, &pid.to_le_bytes(), "every rank's process id")?;
    let pids: Vec<u32> = pids
        .iter()
        .map(|b| b.as_slice().try_into().map(u32::from_le_bytes).unwrap_or(0))
        .collect();
    Ok(peers
        .iter()
        .map(|&peer| ShmLink::unconnected(rank, peer, pids[peer], timeout, spin))
        .collect())
}

/// Where the region of `p` lies in a channel: LL's ring, LL128's, Simple's large slots.
fn region(p: Protocol) -> std::ops::Range<usize> {
    match p {
        Protocol::Ll => LL_OFFSET..LL128_OFFSET,
        Protocol::Ll128 => LL128_OFFSET..CHANNEL_BYTES,
        Protocol::Simple => DATA_OFFSET..LL_OFFSET,
    }
}

impl ShmLink {
    /// Reserves the region of `out` that `p` writes (its ring, or the large slots), the
    /// first time this side needs it: a channel that carries small messages alone takes
    /// [`ALWAYS_BYTES`] of `/dev/shm`, not [`CHANNEL_BYTES`]. Reserved with
    /// `posix_fallocate`, so a full `/dev/shm` is an error here, in one line, never a
    /// `SIGBUS` at a write; then flagged for the receiver ([`Header::reserved`]).
    fn reserve(&self, p: Protocol) -> io::Result<()> {
        let i = p as usize;
        if self.reserved[i].load(Relaxed) {
            return Ok(());
        }
        let out = self.out()?;
        let range = region(p);
        let r = match fault_shm_full() {
            true => libc::ENOSPC,
            // SAFETY: `lock` is this side's open descriptor of the file it made (the
            // sender makes `out`); the range lies inside the channel.
            false => unsafe {
                libc::posix_fallocate(
                    out.lock,
                    range.start as libc::off_t,
                    (range.end - range.start) as libc::off_t,
                )
            },
        };
        match r {
            0 => {}
            libc::ENOSPC => return Err(io::Error::other(full_message())),
            r => return Err(io::Error::from_raw_os_error(r)),
        }
        out.populate(range);
        out.header().reserved[i].store(1, Release);
        self.reserved[i].store(true, Relaxed);
        Ok(())
    }
}

/// Whether `e` says this process (or the system) has no descriptor left to open a file.
fn out_of_descriptors(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

/// Gives one descriptor of the [`RESERVE`] back, for an open to retry at once; false
/// when none is left.
fn release_reserve() -> bool {
    match RESERVE.lock().unwrap_or_else(|p| p.into_inner()).pop() {
        Some(fd) => {
            // SAFETY: a descriptor of the reserve, opened by `reserve_descriptors`, closed once.
            unsafe { libc::close(fd) };
            true
        }
        None => false,
    }
}

/// Descriptors held aside from start-up (`/dev/null` opened), so that a channel made or
/// opened on first use finds one even when the rest of the process took them all (the
/// store's host, say, serving many connections under a low `ulimit -n`): eagerly, every
/// channel was open before the store served anyone else.
static RESERVE: Mutex<Vec<libc::c_int>> = Mutex::new(Vec::new());

/// Fills the [`RESERVE`] up to two descriptors, as far as the limit allows.
fn reserve_descriptors() {
    let mut reserve = RESERVE.lock().unwrap_or_else(|p| p.into_inner());
    while reserve.len() < 2 {
        // SAFETY: opens a file by a valid C string; the result is checked.
        let fd = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        if fd < 0 {
            return;
        }
        reserve.push(fd);
    }
}

/// The name of the channel from rank `from` to rank `to`, made by process `owner` (the
/// sender): `/dev/shm/nccl-workbook-<owner>-<from>-to-<to>`.
fn channel_name(owner: u32, from: usize, to: usize) -> String {
    format!("{DIR}/{PREFIX}{owner}-{from}-to-{to}")
}

/// Channels this process has made (as a sender) so far: what `NCCL_DEBUG=INFO` reports,
/// and the measure that the pairs connect on first use.
static MADE: AtomicU64 = AtomicU64::new(0);

/// How many shared-memory channels this process has made so far (one per peer it sent to).
pub fn channels_made() -> u64 {
    MADE.load(Relaxed)
}

impl ShmLink {
    /// A link to `peer` (process `peer_pid`) with no channel yet: each is made at its
    /// first use ([`connect`]).
    fn unconnected(rank: usize, peer: usize, peer_pid: u32, timeout: Duration, spin: Duration) -> ShmLink {
        ShmLink {
            rank,
            peer,
            peer_pid,
            out: OnceLock::new(),
            inbox: OnceLock::new(),
            making: Default::default(),
            reserved: Default::default(),
            seen_reserved: Default::default(),
            timeout,
            tail_seen: AtomicU32::new(0),
            fifo_tail_seen: Default::default(),
            read: AtomicU32::new(0),
            fifo_read: Default::default(),
            spin,
            proto: AtomicU8::new(Protocol::Simple as u8),
            prefetch_w: has_prefetch_for_write(),
        }
    }

    /// The channel this rank writes to the peer, made at the first call ([`connect`]).
    #[inline]
    fn out(&self) -> io::Result<&Channel> {
        match self.out.get() {
            Some(c) => Ok(c),
            None => self.make_out(),
        }
    }

    /// [`ShmLink::out`] the first time: makes the channel.
    #[inline(never)]
    fn make_out(&self) -> io::Result<&Channel> {
        let _one = self.making[0].lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = self.out.get() {
            return Ok(c);
        }
        let path = channel_name(std::process::id(), self.rank, self.peer);
        let part = format!("{path}.part");
        let make = || {
            Channel::map(&part, true).and_then(|c| match std::fs::rename(&part, &path) {
                Ok(()) => Ok(c),
                Err(e) => {
                    let _ = std::fs::remove_file(&part);
                    Err(e)
                }
            })
        };
        // Out of descriptors may pass (the store closes strangers past its limit): tried
        // again until the timeout.
        let (start, mut pause) = (Instant::now(), Duration::from_micros(100));
        let made = loop {
            match make() {
                Err(e) if out_of_descriptors(&e) && release_reserve() => {}
                Err(e) if out_of_descriptors(&e) && start.elapsed() < self.timeout => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(20));
                }
                made => break made,
            }
        };
        let channel = made.map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("making the shared-memory channel {path} to rank {}: {e}", self.peer),
            )
        })?;
        MADE.fetch_add(1, Relaxed);
        reserve_descriptors();
        fault_die_in_setup(self.rank);
        Ok(self.out.get_or_init(|| channel))
    }

    /// The channel the peer writes to this rank, opened at the first call: waits until
    /// the peer has made it (at its first send), its process is gone, or the whole
    /// timeout passed with nothing made ([`connect`]).
    #[inline]
    fn inbox(&self) -> io::Result<&Channel> {
        match self.inbox.get() {
            Some(c) => Ok(c),
            None => self.open_inbox(),
        }
    }

    /// [`ShmLink::inbox`] the first time: opens the channel.
    #[inline(never)]
    fn open_inbox(&self) -> io::Result<&Channel> {
        let _one = self.making[1].lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = self.inbox.get() {
            return Ok(c);
        }
        let path = channel_name(self.peer_pid, self.peer, self.rank);
        let start = Instant::now();
        let mut pause = Duration::from_micros(20);
        loop {
            match Channel::map(&path, false) {
                Ok(channel) => {
                    // This rank is the channel's only other user: its name is no longer needed.
                    let _ = std::fs::remove_file(&path);
                    reserve_descriptors();
                    return Ok(self.inbox.get_or_init(|| channel));
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                // Out of descriptors may pass (the store closes strangers past its limit).
                Err(e) if out_of_descriptors(&e) && release_reserve() => continue,
                Err(e) if out_of_descriptors(&e) && start.elapsed() < self.timeout => {}
                Err(e) => {
                    return Err(io::Error::new(
                        e.kind(),
                        format!("opening rank {}'s shared-memory channel {path}: {e}", self.peer),
                    ));
                }
            }
            // The name is looked for again after the pid is seen gone: a sender may make
            // its channel, send and exit in between.
            if !process_alive(self.peer_pid) && !std::path::Path::new(&path).exists() {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("rank {} (pid {}) is gone", self.peer, self.peer_pid),
                ));
            }
            if start.elapsed() >= self.timeout {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "nothing moved for the whole timeout",
                ));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(2));
        }
    }
}

/// Binds this thread (the rank's main thread, and the threads it starts from now on) to
/// the `index`-th of the cores it may run on, when there are at least `ranks` of them:
/// each of a host's ranks on a core of its own, as Open MPI binds ranks to cores by
/// default. Left to itself the scheduler may put two ranks on one core (it wakes a process
/// where its waker runs, and leaves recently run processes where they are, for their
/// caches), where they take turns instead of answering each other within a fraction of
/// a microsecond: small collectives then cost 10 to 30 times more, for a whole run. A
/// rank that was given fewer cores (by `taskset`, Slurm or mpirun) is left as it is.
fn bind_to_own_core(index: usize, ranks: usize) {
    if let Some(core) = bind(index, ranks) {
        BOUND.store(core as i64, Relaxed);
    }
}

/// The core this rank bound itself to ([`bind_to_own_core`]), if it did: what
/// `NCCL_DEBUG=INFO` says, as NCCL prints a rank's CPU affinity.
pub fn bound_core() -> Option<usize> {
    usize::try_from(BOUND.load(Relaxed)).ok()
}

/// The core of [`bound_core`], -1 when none.
static BOUND: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(-1);

/// Binds this thread to the `index`-th of the cores it may run on, when there are at
/// least `ranks` of them; returns that core.
fn bind(index: usize, ranks: usize) -> Option<usize> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity/sched_setaffinity read and write
    // only the set we pass, of the size we pass; failures leave the affinity unchanged.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return None;
        }
        let allowed: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
            .filter(|c| libc::CPU_ISSET(*c, &set))
            .collect();
        if allowed.len() < ranks {
            return None;
        }
        let core = *allowed.get(index)?;
        let mut mine: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(core, &mut mine);
        (libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &mine) == 0).then_some(core)
    }
}

/// `dst.copy_from_slice(src)` with non-temporal (streaming) stores where the CPU has
/// them: the destination's lines are written straight to memory, not read into the cache
/// first and written back later.
pub fn copy_around_cache(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len());
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
        // The part of dst that starts on a 16-byte boundary and spans whole 64-byte blocks.
        let head = dst.as_ptr().align_offset(16).min(dst.len());
        let body = (dst.len() - head) / 64 * 64;
        dst[..head].copy_from_slice(&src[..head]);
        // SAFETY: SSE2 is part of x86_64. Every access is within dst[head..head + body]
        // and src[head..head + body]; stores are 16-byte aligned; loads may be unaligned.
        unsafe {
            let (d, s) = (dst.as_mut_ptr().add(head), src.as_ptr().add(head));
            for i in (0..body).step_by(64) {
                for k in (0..64).step_by(16) {
                    let v = _mm_loadu_si128(s.add(i + k).cast::<__m128i>());
                    _mm_stream_si128(d.add(i + k).cast::<__m128i>(), v);
                }
            }
            _mm_sfence(); // streaming stores are weakly ordered: finish them before going on
        }
        dst[head + body..].copy_from_slice(&src[head + body..]);
    }
    #[cfg(not(target_arch = "x86_64"))]
    dst.copy_from_slice(src);
}

/// Whether process `pid` is still running (not gone, not a zombie waiting to be reaped).
fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name in parentheses: "1234 (name) S ...".
        Ok(stat) => !matches!(
            stat.rsplit_once(") ").and_then(|(_, rest)| rest.chars().next()),
            Some('Z' | 'X')
        ),
        Err(_) => false,
    }
}

/// Sleeps until `word` is woken or no longer holds `seen`, for at most `at_most`.
fn futex_wait(word: &AtomicU32, seen: u32, at_most: Duration) {
    let ts = libc::timespec {
        tv_sec: at_most.as_secs() as libc::time_t,
        tv_nsec: at_most.subsec_nanos() as libc::c_long,
    };
    // SAFETY: FUTEX_WAIT (shared, not PRIVATE: the word is in memory two processes map)
    // on a valid, aligned u32; a spurious return is harmless, the caller re-checks.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            seen,
            &ts as *const libc::timespec,
        );
    }
}

/// Wakes whoever sleeps on `word`.
fn futex_wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE on a valid, aligned u32.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}

/// Removes every channel file that `pids` created (the launcher, once its ranks ended).
pub fn remove_files_of(pids: &[u32]) {
    remove_files(|owner, _| pids.contains(&owner));
}

/// Removes the channel files of processes that are gone: what a job killed with its
/// launcher (or killed in the instant before its ranks opened them) left behind. A file
/// is gone only if its creator's pid is not alive *and* no process holds its lock: a job
/// in another pid namespace (a container, `unshare -p`) has pids this one cannot see,
/// but its ranks hold the locks of the files they made ([`Channel`]'s `lock`). A file
/// younger than [`SETTLING`] is left too: its creator may not hold its lock yet.
pub fn remove_dead_files() {
    remove_files(|owner, path| !process_alive(owner) && settled(path) && !locked(path));
}

/// How long a channel file may go unlocked after it is made (its creator opens it, then
/// locks it, microseconds apart).
const SETTLING: Duration = Duration::from_secs(2);

/// Whether `path` was last changed at least [`SETTLING`] ago.
fn settled(path: &std::path::Path) -> bool {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|age| age >= SETTLING)
}

/// Whether some process holds the lock of the channel file at `path` (its live creator).
fn locked(path: &std::path::Path) -> bool {
    let Ok(c_path) = CString::new(std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str())) else {
        return true;
    };
    // SAFETY: plain system calls on a path we name and a descriptor we own and close.
    unsafe {
        let fd = libc::open(c_path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW);
        if fd < 0 {
            // Gone already, or not ours to read: not ours to remove either.
            return true;
        }
        let held = libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) != 0;
        libc::close(fd);
        held
    }
}

fn remove_files(of: impl Fn(u32, &std::path::Path) -> bool) {
    let Ok(dir) = std::fs::read_dir(DIR) else {
        return;
    };
    // SAFETY: no arguments.
    let me = unsafe { libc::getuid() };
    for entry in dir.flatten() {
        let name = entry.file_name();
        let owner = name
            .to_str()
            .and_then(|n| n.strip_prefix(PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok());
        let mine = entry
            .metadata()
            .is_ok_and(|m| std::os::unix::fs::MetadataExt::uid(&m) == me);
        if let Some(owner) = owner
            && mine
            && of(owner, &entry.path())
        {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Bytes of `/dev/shm` that `ranks` ranks on one host are sure to take for their
/// channels: the pairs connect on first use ([`connect`]), so what a job takes depends on
/// what it runs; counted here is a ring each way, two channels per rank (a ring
/// all-reduce makes one per rank, a tree one per parent and child). Collectives that
/// reach every rank from every rank (small messages sent direct, the single-copy
/// algorithms' announcements, all-to-all) connect more pairs, up to `ranks × (ranks - 1)`
/// channels; a full `/dev/shm` then fails them in one line ([`full_message`]).
pub fn bytes_for(ranks: usize) -> u64 {
    match ranks {
        0 | 1 => 0,
        2 => 2 * CHANNEL_BYTES as u64,
        _ => 2 * ranks as u64 * CHANNEL_BYTES as u64,
    }
}

/// Bytes of one channel in `/dev/shm` (reserved when it is made).
pub const fn channel_bytes() -> u64 {
    CHANNEL_BYTES as u64
}

/// `/dev/shm`'s free and total bytes.
pub fn space() -> Option<(u64, u64)> {
    let path = CString::new(DIR).ok()?;
    // SAFETY: a valid path and a zeroed struct for the answer.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return None;
    }
    let unit = st.f_frsize as u64;
    let free = st.f_bavail as u64 * unit;
    // Test hook: `NCCL_WORKBOOK_FAULT=shm-free:BYTES` says that much is free (tests cannot
    // fill the machine's /dev/shm, and 1024 ranks' rings fit in most).
    let free = crate::fault::asked("shm-free", None)
        .and_then(|v| v.first()?.parse::<u64>().ok())
        .map_or(free, |pretend| pretend.min(free));
    Some((free, st.f_blocks as u64 * unit))
}

/// What a full `/dev/shm` means for the job, in one line.
fn full_message() -> String {
    let (free, total) = space().unwrap_or((0, 0));
    format!(
        "{DIR} is full ({} free of {}): stop what fills it, start fewer ranks per host, or use --transport tcp",
        crate::units::human_bytes(free as usize),
        crate::units::human_bytes(total as usize)
    )
}

/// Test hook: `NCCL_WORKBOOK_FAULT=shm-full` makes creating a channel fail as on a full
/// `/dev/shm` (tests cannot fill the machine's).
fn fault_shm_full() -> bool {
    crate::fault::asked("shm-full", None).is_some()
}

/// Test hook: `NCCL_WORKBOOK_FAULT=die-in-shm-setup:RANK` kills that rank (SIGKILL) once
/// it has created its channels, before its peers open them.
fn fault_die_in_setup(rank: usize) {
    if crate::fault::asked("die-in-shm-setup", Some(rank)).is_some() {
        // SAFETY: sends a signal to this process.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    }
}

/// Fails unless shared memory can be used here, saying why.
pub fn available() -> Result<()> {
    if !std::path::Path::new("/dev/shm").is_dir() {
        bail!("there is no /dev/shm on this host");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn streaming_copies_are_exact_at_every_alignment() {
        let src: Vec<u8> = (0..1000).map(|i| (i * 7) as u8).collect();
        let mut dst = vec![0u8; 1100];
        for start in 0..20 {
            for len in [0, 1, 15, 16, 63, 64, 65, 200, 999 - start] {
                dst.fill(0);
                copy_around_cache(&mut dst[start..start + len], &src[..len]);
                assert_eq!(&dst[start..start + len], &src[..len], "at {start}, {len} bytes");
                assert!(dst[..start].iter().chain(&dst[start + len..]).all(|b| *b == 0));
            }
        }
    }

    #[test]
    fn liveness_reads_proc() {
        assert!(process_alive(std::process::id()));
        assert!(!process_alive(u32::MAX - 1));
    }
}
