//! The shared-memory transport: two ranks on one host pass messages through memory that
//! both processes map, as NCCL's SHM transport does inside a node. No socket, no kernel
//! copy: the sender copies a piece into a slot, the receiver reads (or reduces) it
//! straight from there.
//!
//! Each direction of a pair is a *channel*: a file in `/dev/shm` holding a header, a ring
//! of [`PIECES`](layout::PIECES) metadata lines, each with a small buffer, and a small ring of large
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
//! counters ([`Fifo`](layout::Fifo)). The link sends a collective's messages by the protocol the tuner
//! set ([`Link::set_protocol`](super::Link::set_protocol)); both ends set the same, so the receiver looks where the
//! sender wrote. Point-to-point messages go by Simple. Steps and pieces sent by each
//! protocol are counted ([`sent_by`]).
//!
//! The module is one file per part: where everything lies in a channel ([`layout`]), the
//! link's three protocols over it ([`link`]), how a side waits for the other ([`wait`]),
//! what it asks of the CPU (binding to a core, `prefetchw`, non-temporal copies: [`cpu`]),
//! and the channel files in `/dev/shm`, made, opened, reserved and removed ([`files`]).

mod cpu;
mod files;
mod layout;
mod link;
#[cfg(test)]
mod tests;
mod wait;

pub use cpu::{bound_core, copy_around_cache};
pub use files::{available, bytes_for, channel_bytes, channels_made, remove_dead_files, remove_files_of, space};
pub use layout::{INLINE, SLOT_BYTES, SLOTS, SMALL_PIECE};
pub use wait::waits_slept;

use self::cpu::{bind_to_own_core, has_prefetch_for_write};
use self::files::reserve_descriptors;
use self::layout::Channel;
use self::wait::SPIN_FOR;
use super::protocol::Protocol;
use crate::rendezvous::Store;
use anyhow::Result;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

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
    /// The same for the LL and LL128 rings ([`Fifo`](layout::Fifo)).
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
    /// [`Link::set_protocol`](super::Link::set_protocol) on both ends alike.
    proto: AtomicU8,
    /// The CPU has `prefetchw` ([`PREFETCH_W`](link::PREFETCH_W)).
    prefetch_w: bool,
}

/// How many steps (LL, LL128) or pieces (Simple) this process has sent by `proto` so far:
/// what shows that a protocol really ran (the benchmark's `proto_steps`). Each sending
/// thread counts its own ([`super::sent`]): a shared counter would cost a locked add per
/// message.
pub fn sent_by(proto: Protocol) -> u64 {
    super::sent::total(proto)
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
    let leave = !binds().map_err(|message| crate::error::SharedError { message, usage: true })?;
    if peers.len() + 1 == world && world <= cores && !leave {
        bind_to_own_core(peers.iter().filter(|p| **p < rank).count(), world);
    }
    reserve_descriptors();
    let pids = store.share("shm/pid", rank, world, &pid.to_le_bytes(), "every rank's process id")?;
    let pids: Vec<u32> = pids
        .iter()
        .map(|b| b.as_slice().try_into().map(u32::from_le_bytes).unwrap_or(0))
        .collect();
    files::remember_job(peers.iter().map(|&p| pids[p]).collect());
    Ok(peers
        .iter()
        .map(|&peer| ShmLink::unconnected(rank, peer, pids[peer], timeout, spin))
        .collect())
}

/// `NCCL_WORKBOOK_BIND`: whether ranks that share a host with a core each are bound to
/// their cores (`core`, the default) or left to the scheduler (`none`); anything else is
/// the user's error, in one line.
pub fn binds() -> Result<bool, String> {
    match std::env::var("NCCL_WORKBOOK_BIND") {
        Err(_) => Ok(true),
        Ok(v) if v.trim().is_empty() || v.trim().eq_ignore_ascii_case("core") => Ok(true),
        Ok(v) if v.trim().eq_ignore_ascii_case("none") => Ok(false),
        Ok(v) => Err(format!(
            "NCCL_WORKBOOK_BIND={v}: 'core' (each rank on a core of its own where there are enough, the \
             default) or 'none' (the ranks left to the scheduler)"
        )),
    }
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
}
