//! The CPU backend's communicator: links to every other rank and the steps the CPU
//! algorithms are made of (the algorithms themselves, and the choice between them, live
//! with their collective, in `common::collective`).
//!
//! The ranks sit in a ring, each sending to its right neighbour and receiving from its
//! left. Every link carries the same amount at the same time, so no rank is a
//! bottleneck, whatever the number of ranks.

use crate::element::{Element, as_bytes, as_bytes_mut};
use crate::error::SharedError;
use crate::heartbeat::Heartbeat;
use crate::host_memory::{self, HostMem, PeerArena};
use crate::launch::Identity;
use crate::rendezvous::Store;
use crate::transport::shm::copy_around_cache;
use crate::transport::simulated::{Network, SimulatedLink};
use crate::transport::{self, TransportChoice, Via, shm, tcp};
use crate::transport::{Link, Mismatch, Unconnected};
use crate::units;
use anyhow::{Context, Result, anyhow};
use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, mpsc};
use std::thread;
use std::time::Duration;

/// The last-level cache assumed where the machine does not say (`/sys`): 32 MiB.
const LLC_DEFAULT: usize = 32 << 20;
/// A link that buffers at least this much gets ring steps in slices, in one thread.
const MIN_SLICE: usize = 256 << 10;
/// Messages up to this size may go straight from every rank to every rank that needs
/// them (one message time, the tuner's `Direct`), not round the ring (2(n - 1) message
/// times for an all-reduce): for them the time per message, α, is all there is, and the
/// ring multiplies it. Every such message fits a link's buffer (a shared-memory slot, a
/// socket's buffer), so the sends may all go before the receives.
pub const SMALL: usize = 16 << 10;
/// The tag of point-to-point messages (`send`/`recv`), which belong to no collective.
pub const SEND_RECV_TAG: u8 = 100;

/// A rank's communicator on the CPU backend: its place in the world, and a link to every
/// other rank (as NCCL's `ncclComm_t` holds its connections to its peers).
pub struct Comm {
    rank: usize,
    world: usize,
    /// Shared with the communicators split from this one (and theirs): a split
    /// communicator reuses the parent's links between its ranks, as NCCL's split shares
    /// its parent's connections when asked (`splitShare`).
    links: Vec<Option<Arc<dyn Link>>>,
    /// The world's rank of each rank of this communicator (identity but on a split one):
    /// what errors name.
    world_ranks: Vec<usize>,
    /// Every pair of ranks on one machine shares memory (`--transport` is not `tcp`).
    shm_on_node: bool,
    pipelined: bool,
    /// Some host of the job runs more ranks than it has cores.
    oversubscribed: bool,
    /// Each rank's machine, numbered in the order of the first rank on each (rank 0's is
    /// 0): what NCCL calls a node, over which it builds its trees.
    nodes: Vec<usize>,
    /// Buffers from this size are written around the cache: see [`Comm::streams`].
    stream_above: usize,
    /// This rank's share of its core's own cache, where it is smaller than its share of
    /// the last-level cache: see [`Comm::core_cache_share`].
    core_share: Option<usize>,
    /// The name of the collective whose messages carry a tag, for mismatch errors (the
    /// links know tags only; the collectives know their names).
    names: fn(u8) -> &'static str,
    /// Working memory the algorithms reuse from call to call (no page faults per call),
    /// in the arena when it is large: other ranks can read it there.
    scratch: Mutex<(HostMem<u8>, HostMem<u8>)>,
    /// Every other rank's arena, mapped here, when all ranks share one host and every
    /// rank mapped every other one's: the single-copy algorithms read peers' buffers.
    peer_arenas: Option<Vec<Option<Arc<PeerArena>>>>,
    /// Every pair of ranks shares memory: NCCL's three protocols can run ([`Comm::set_protocol`]).
    protocols: bool,
    /// Says, at the end, how many shared-memory channels this rank made.
    report: ChannelReport,
    /// This rank's heartbeat, while it lives ([`crate::heartbeat`]): shared with the communicators
    /// split from this one, and stopped with the last of them.
    heartbeat: Option<Arc<Heartbeat>>,
    /// The thread that sends a step's message too large for its link's buffer while this
    /// rank receives ([`Comm::exchange`]): started on first use, kept while the
    /// communicator lives (`None`: it could not be started).
    send_thread: OnceLock<Option<mpsc::Sender<SendJob>>>,
}

impl Comm {
    /// A CPU backend for `rank` of `world` over `links` (`links[rank]` is `None`).
    /// `pipelined`: every link of the ring (rank i to i + 1) buffers several pieces (they
    /// all share memory), so the all-reduce may run piece by piece round the whole ring;
    /// every rank must be told the same. `names` names a collective by its tag. Results
    /// of buffers from `stream_above` bytes are written around the cache ([`Comm::streams`]).
    pub fn new(
        rank: usize,
        world: usize,
        links: Vec<Option<Arc<dyn Link>>>,
        pipelined: bool,
        names: fn(u8) -> &'static str,
        stream_above: usize,
    ) -> Comm {
        Comm {
            rank,
            world,
            links,
            world_ranks: (0..world).collect(),
            shm_on_node: true,
            pipelined,
            oversubscribed: false,
            nodes: vec![0; world],
            stream_above,
            core_share: None,
            names,
            scratch: Mutex::new((HostMem::new(vec![]), HostMem::new(vec![]))),
            peer_arenas: None,
            protocols: false,
            report: ChannelReport {
                rank,
                shm: false,
                tcp: false,
            },
            heartbeat: None,
            send_thread: OnceLock::new(),
        }
    }

    /// The same rank, on a job whose every pair of ranks shares memory (or not): the
    /// links have NCCL's three protocols (LL, LL128, Simple), not Simple alone.
    pub fn with_protocols(self, protocols: bool) -> Comm {
        Comm { protocols, ..self }
    }

    /// Whether the links have NCCL's three protocols: every pair of ranks shares memory
    /// (the TCP transport has Simple alone). The same on every rank.
    #[inline]
    pub fn has_protocols(&self) -> bool {
        self.protocols
    }

    /// Sends the collectives' messages by `proto` from now on, on every link: the tuner's
    /// choice, made alike on every rank before a collective moves any data.
    #[inline]
    pub fn set_protocol(&self, proto: crate::transport::protocol::Protocol) {
        // A link shared with a split communicator may have been set by it: each is looked at.
        for link in self.links.iter().flatten().filter(|l| l.protocol() != proto) {
            link.set_protocol(proto);
        }
    }

    /// The same rank, reading its peers' buffers through `arenas` (the single-copy algorithms).
    pub fn with_peer_arenas(self, arenas: Option<Vec<Option<PeerArena>>>) -> Comm {
        Comm {
            peer_arenas: arenas.map(|a| a.into_iter().map(|p| p.map(Arc::new)).collect()),
            ..self
        }
    }

    /// This rank.
    #[inline]
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    #[inline]
    pub fn world(&self) -> usize {
        self.world
    }

    /// The left neighbour in the ring (rank - 1) and the right one (rank + 1).
    #[inline]
    pub fn neighbours(&self) -> (usize, usize) {
        // (rank - 1) mod world and (rank + 1) mod world, without a division (every call
        // of a ring or chain asks).
        let last = self.world - 1;
        let left = if self.rank == 0 { last } else { self.rank - 1 };
        let right = if self.rank == last { 0 } else { self.rank + 1 };
        (left, right)
    }

    /// The same rank, each rank `r` on machine `nodes[r]` (numbered from 0 in the order
    /// of their first rank).
    pub fn on_nodes(self, nodes: Vec<usize>) -> Comm {
        Comm { nodes, ..self }
    }

    /// Each rank's machine (NCCL's node), numbered from 0 in the order of its first rank:
    /// the same on every rank.
    #[inline]
    pub fn nodes(&self) -> &[usize] {
        &self.nodes
    }

    /// This rank's part of a communicator split from this one (`ncclCommSplit`): the ranks
    /// `members` of this one (this rank among them), in their new order. It reuses this
    /// communicator's links between them, its peers' arenas and what it knows of the
    /// machines: nothing connects, so a split costs no more than the meeting that decided it.
    pub fn split(&self, members: &[usize]) -> Comm {
        let rank = members
            .iter()
            .position(|&m| m == self.rank)
            .expect("a rank splits into a communicator it is a member of");
        let world = members.len();
        let pair_in_memory = |a: usize, b: usize| {
            let (a, b) = (members[a], members[b]);
            self.shm_on_node && self.nodes[a] == self.nodes[b]
        };
        let ring_in_memory = (0..world).all(|a| world == 1 || pair_in_memory(a, (a + 1) % world));
        let every_pair_in_memory = (0..world).all(|a| (0..world).all(|b| a == b || pair_in_memory(a, b)));
        // The nodes renumbered in the order of their first rank in the new communicator.
        let mut seen: Vec<usize> = vec![];
        let nodes = members
            .iter()
            .map(|&m| match seen.iter().position(|&n| n == self.nodes[m]) {
                Some(i) => i,
                None => {
                    seen.push(self.nodes[m]);
                    seen.len() - 1
                }
            })
            .collect();
        Comm {
            rank,
            world,
            links: members.iter().map(|&m| self.links[m].clone()).collect(),
            world_ranks: members.iter().map(|&m| self.world_ranks[m]).collect(),
            shm_on_node: self.shm_on_node,
            pipelined: ring_in_memory,
            oversubscribed: self.oversubscribed,
            nodes,
            stream_above: self.stream_above,
            core_share: self.core_share,
            names: self.names,
            scratch: Mutex::new((HostMem::new(vec![]), HostMem::new(vec![]))),
            peer_arenas: self
                .peer_arenas
                .as_ref()
                .map(|a| members.iter().map(|&m| a[m].clone()).collect()),
            protocols: world > 1 && every_pair_in_memory,
            report: ChannelReport {
                rank,
                shm: false,
                tcp: false,
            },
            heartbeat: self.heartbeat.clone(),
            send_thread: OnceLock::new(),
        }
    }

    /// The world's rank of this communicator's rank `r` (itself, but on a split communicator).
    #[inline]
    pub fn world_rank(&self, r: usize) -> usize {
        self.world_ranks[r]
    }

    /// The same rank, on a job some of whose hosts have more ranks than cores.
    pub fn oversubscribed_by(self, oversubscribed: bool) -> Comm {
        Comm { oversubscribed, ..self }
    }

    /// Whether every link of the ring (rank i to i + 1) shares memory, so that a ring may
    /// run piece by piece round the whole ring (the same on every rank).
    #[inline]
    pub fn ring_in_memory(&self) -> bool {
        self.pipelined
    }

    /// Whether some host of the job runs more ranks than it has cores (the same on every rank).
    #[inline]
    pub fn oversubscribed(&self) -> bool {
        self.oversubscribed
    }

    /// Whether results of a `len`-byte buffer are written around the cache
    /// (non-temporal stores): when the buffers of every rank on this host together
    /// outgrow its last-level cache, nothing would be read back from the cache anyway,
    /// and a plain store would first read each line from memory. Below that, plain stores
    /// keep the result in the cache for the next step (or the next call). A choice each
    /// rank makes for its own stores: the messages do not depend on it.
    #[inline]
    pub fn streams(&self, len: usize) -> bool {
        len >= self.stream_above
    }

    /// This rank's share of its host's last-level cache (the cache over the ranks on the
    /// host): a rank whose buffers reach it runs from memory, not from the cache, and
    /// moves data at memory's speed (the benchmark's `--fit` fits such sizes apart).
    #[inline]
    pub fn cache_share(&self) -> usize {
        self.stream_above
    }

    /// This rank's share of its core's own cache (the level below the last, an L2: the
    /// cores over the ranks on the host), where it is smaller than 3/4 of the last-level
    /// share:
    /// while a rank's buffers fit in it, the other ranks' cores may still hold the lines
    /// it writes, from the last call (an all-reduce's result), and each such store first
    /// takes its line back: the benchmark's `--fit` fits such sizes apart.
    /// `None` where the machine has one level of cache below the last.
    #[inline]
    pub fn core_cache_share(&self) -> Option<usize> {
        self.core_share
    }

    /// This rank's share of its core's own cache ([`Comm::core_cache_share`]), kept only
    /// where it is smaller than 3/4 of its share of the last-level cache (from where
    /// `--fit` counts a rank's buffers as in memory). Given only where every pair of ranks
    /// shares memory: over TCP the data crosses a network, not the caches.
    pub fn with_core_cache(mut self, share: Option<usize>) -> Comm {
        self.core_share = share.filter(|&s| s > 0 && s < cache_room(self.stream_above));
        self
    }

    /// Whether this rank maps every other rank's arena (the single-copy algorithms).
    #[inline]
    pub fn reads_peers(&self) -> bool {
        self.peer_arenas.is_some()
    }

    /// Tells every other rank where this rank's `regions` lie in its arena, so that they
    /// can read them; returns whether all of them are there (a buffer made elsewhere is
    /// not, and is then announced as such). Sent once this rank's buffers hold what the
    /// collective reads: a peer reads a region only after this message.
    pub fn announce(&self, tag: u8, regions: &[&[u8]], to: impl Iterator<Item = usize>) -> Result<bool> {
        let offsets: Vec<Option<usize>> = regions.iter().map(|r| host_memory::offset_of(r)).collect();
        let words: Vec<u8> = offsets
            .iter()
            .flat_map(|o| o.map_or(u64::MAX, |o| o as u64).to_le_bytes())
            .collect();
        for peer in to {
            self.send_tagged(tag, &words, peer)
                .with_context(|| format!("telling rank {peer} where this rank's buffer is"))?;
        }
        Ok(offsets.iter().all(Option::is_some))
    }

    /// What `peer` announced ([`Comm::announce`]): its regions, of `lens` bytes, as this
    /// rank sees them in its arena, or `None` if any is not in it.
    pub fn regions_of(&self, tag: u8, peer: usize, lens: &[usize]) -> Result<Option<Vec<&[u8]>>> {
        let mut words = vec![0u8; 8 * lens.len()];
        self.link(peer)
            .recv_into(tag, &mut words)
            .map_err(|e| self.lost(e, peer))
            .with_context(|| format!("learning where rank {peer}'s buffer is"))?;
        let arena = self.peer_arenas.as_ref().and_then(|a| a[peer].as_ref());
        Ok(words
            .chunks_exact(8)
            .zip(lens)
            .map(|(w, &len)| {
                let at = u64::from_le_bytes(w.try_into().ok()?);
                arena?.region(usize::try_from(at).ok()?, len)
            })
            .collect())
    }

    /// Every rank tells every other where its `mine` regions lie ([`Comm::announce`]) and
    /// learns theirs, of `lens` bytes each: `Some(theirs)`, `theirs[p]` being rank p's
    /// regions as this rank sees them (empty for this rank), when every rank's regions are
    /// in its arena; `None` when any is not: every rank sees that alike, and all then take
    /// the algorithm without the single copy.
    pub fn share_regions(&self, tag: u8, mine: &[&[u8]], lens: &[usize]) -> Result<Option<Vec<Vec<&[u8]>>>> {
        let (n, r) = (self.world, self.rank);
        let others = || (1..n).map(move |k| (r + k) % n);
        let mut all = self.announce(tag, mine, others())?;
        let mut theirs = vec![vec![]; n];
        for p in others() {
            match self.regions_of(tag, p, lens)? {
                Some(regions) => theirs[p] = regions,
                None => all = false,
            }
        }
        Ok(all.then_some(theirs))
    }

    /// The end of a single-copy algorithm in which every rank read every other's
    /// buffers: each tells every other it is done reading, and leaves once all have said
    /// so (after which a rank's buffers are its caller's again).
    pub fn all_done(&self, tag: u8) -> Result<()> {
        let (n, r) = (self.world, self.rank);
        let others = || (1..n).map(move |k| (r + k) % n);
        others().try_for_each(|p| self.signal(tag, p, Signal::Done))?;
        others().try_for_each(|p| self.wait_signal(tag, p, Signal::Done))
    }

    /// A barrier through the links, for the start of a timed loop: a token goes round the
    /// ring twice, the first time to learn that every rank has arrived, the second to let
    /// them go, so the ranks leave within (n - 1) message times of each other. The store's
    /// barrier (a socket each) leaves them up to a millisecond apart: a one-way collective
    /// (a broadcast) then starts its timed loop on the root while a receiver is still
    /// waking up, and the root's time counts that wait.
    pub fn line_up(&self) -> Result<()> {
        let (n, r) = (self.world, self.rank);
        if n == 1 {
            return Ok(());
        }
        let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
        for round in 0..2 {
            if r != 0 {
                self.wait_signal(SEND_RECV_TAG, prev, Signal::Here)?;
            }
            // The second time round, the last rank keeps the token: rank 0 has gone.
            if round == 0 || r != n - 1 {
                self.signal(SEND_RECV_TAG, next, Signal::Here)?;
            }
            if r == 0 && round == 0 {
                self.wait_signal(SEND_RECV_TAG, prev, Signal::Here)?;
            }
        }
        Ok(())
    }

    /// Tells `peer` that this rank reached `what` (a step of a single-copy algorithm).
    pub fn signal(&self, tag: u8, peer: usize, what: Signal) -> Result<()> {
        self.send_tagged(tag, &[what as u8], peer)
            .with_context(|| format!("telling rank {peer} {}", what.says()))
    }

    /// Waits until `peer` says it reached `what`.
    pub fn wait_signal(&self, tag: u8, peer: usize, what: Signal) -> Result<()> {
        let mut got = [0u8];
        self.link(peer)
            .recv_into(tag, &mut got)
            .map_err(|e| self.lost(e, peer))
            .with_context(|| format!("waiting for rank {peer} to say {}", what.says()))?;
        match got[0] == what as u8 {
            true => Ok(()),
            false => Err(anyhow!(
                "rank {peer} sent signal {} where {} was expected",
                got[0],
                what.says()
            )),
        }
    }

    /// The link to `peer`.
    #[inline]
    pub fn link(&self, peer: usize) -> &dyn Link {
        self.links[peer].as_deref().expect("a link to every other rank")
    }

    /// Two working buffers of `len` bytes or more each, kept from call to call. A large
    /// one lies in the arena ([`HostMem`]), so that the other ranks can read it where it
    /// lies: the in-place all-to-all puts its blocks aside there, and the others copy
    /// them from there (single copy).
    pub fn scratch(&self, len: usize) -> MutexGuard<'_, (HostMem<u8>, HostMem<u8>)> {
        let mut s = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
        let (a, b) = &mut *s;
        for v in [a, b] {
            if v.len() < len {
                *v = HostMem::new(vec![0; len]);
            }
        }
        s
    }

    /// Sends `data` to `peer` (point-to-point).
    pub fn send<T: Element>(&self, data: &[T], peer: usize) -> Result<()> {
        self.send_tagged(SEND_RECV_TAG, as_bytes(data), peer)
            .with_context(|| format!("sending {} elements to {}", data.len(), self.peer_name(peer)))
    }

    /// Sends `data` to `peer` as one message of the collective with `tag`: a failure
    /// says what became of the peer ([`Comm::lost`]); the caller says which step it was.
    #[inline]
    pub fn send_tagged(&self, tag: u8, data: &[u8], peer: usize) -> Result<()> {
        self.link(peer).send(tag, data).map_err(|e| self.lost(e, peer))
    }

    /// Receives `data.len()` elements from `peer` (point-to-point).
    pub fn recv<T: Element>(&self, data: &mut [T], peer: usize) -> Result<()> {
        let n = data.len();
        self.link(peer)
            .recv_into(SEND_RECV_TAG, as_bytes_mut(data))
            .map_err(|e| self.lost(e, peer))
            .with_context(|| format!("receiving {n} elements from {}", self.peer_name(peer)))
    }

    /// One step of an algorithm: send `out` to `to` while `receive` reads `in_len` bytes
    /// from `from`, called once per slice with the slice's byte range.
    ///
    /// Every rank sends at the same time, so no rank may wait for its send to be received
    /// before it receives. A link that buffers a useful amount (shared memory) gets the
    /// message in slices that fit its buffer, and one thread alternates "send a slice,
    /// receive a slice", as NCCL's steps do. A message the link cannot buffer (a large
    /// one over TCP) is sent whole by the communicator's send thread, as NCCL's proxy
    /// thread sends over the network.
    pub fn exchange(
        &self,
        tag: u8,
        (out, to): (&[u8], usize),
        (in_len, from): (usize, usize),
        mut receive: impl FnMut(&dyn Link, Range<usize>) -> std::io::Result<()>,
    ) -> Result<()> {
        let (link_to, link_from) = (self.link(to), self.link(from));
        let (sends, recvs) = (slices(out.len(), link_to), slices(in_len, link_from));
        if sends.iter().all(|s| s.len() <= link_to.eager_limit()) {
            for k in 0..sends.count().max(recvs.count()) {
                if let Some(s) = sends.get(k) {
                    link_to.send(tag, &out[s]).map_err(|e| self.lost(e, to))?;
                }
                if let Some(r) = recvs.get(k) {
                    receive(link_from, r).map_err(|e| self.lost(e, from))?;
                }
            }
            return Ok(());
        }
        // One message, as a link that buffers little takes it: the send thread sends it.
        if let Some(sending) = (sends.count() == 1).then(|| self.send_aside(tag, out, to)).flatten() {
            let got = recvs
                .iter()
                .try_for_each(|r| receive(link_from, r))
                .map_err(|e| self.lost(e, from));
            let sent = sending.wait();
            got?;
            return sent.map_err(|e| self.lost(e, to));
        }
        thread::scope(|s| {
            let sender = s.spawn(|| sends.iter().try_for_each(|s| link_to.send(tag, &out[s])));
            let got = recvs
                .iter()
                .try_for_each(|r| receive(link_from, r))
                .map_err(|e| self.lost(e, from));
            let sent = sender
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("the sending thread panicked")));
            got?;
            sent.map_err(|e| self.lost(e, to))
        })
    }

    /// Hands `out` to this communicator's send thread for `to`, started on first use
    /// (a thread started per step cost about 300 µs a step where 8 ranks share 2 cores, as
    /// much as the step's message). `None` where the thread cannot be had: the caller
    /// sends from a thread of its own.
    fn send_aside<'a>(&self, tag: u8, out: &'a [u8], to: usize) -> Option<Sending<'a>> {
        let jobs = self.send_thread.get_or_init(start_send_thread).as_ref()?;
        let link = self.links[to].clone()?;
        let (done, result) = mpsc::sync_channel(1);
        let job = SendJob {
            link,
            tag,
            data: out.as_ptr(),
            len: out.len(),
            done,
        };
        jobs.send(job).ok()?;
        Some(Sending {
            result,
            waited: false,
            _out: std::marker::PhantomData,
        })
    }

    /// Receives a message of `len` bytes from `from` and, in the same pass, writes the
    /// message to `to`: `make(out, offset, piece)` fills `out` from each `piece` as it
    /// arrives, straight into the transport's buffer (a reduction's result needs no copy
    /// before it leaves).
    pub fn recv_then_send(
        &self,
        tag: u8,
        (from, to): (usize, usize),
        len: usize,
        mut make: impl FnMut(&mut [u8], usize, &[u8]),
    ) -> Result<()> {
        let mut received = Ok(());
        let sent = self.link(to).send_with(tag, len, &mut |out| {
            let got = self.link(from).recv_pieces(tag, len, &mut |off, piece| {
                make(&mut out[off..off + piece.len()], off, piece)
            });
            // Kept aside, so that the error names the rank it came from, not `to`.
            got.map_err(|e| {
                let kind = e.kind();
                received = Err(e);
                std::io::Error::from(kind)
            })
        });
        received.map_err(|e| self.lost(e, from))?;
        sent.map_err(|e| self.lost(e, to))
    }

    /// "(shm to rank 3)": how `peer` is reached, for messages.
    pub fn peer_name(&self, peer: usize) -> String {
        match &self.links[peer] {
            Some(l) => format!("({})", l.describe()),
            None => String::new(),
        }
    }

    /// Turns a link's error into what it means for the job.
    pub fn lost(&self, e: std::io::Error, peer: usize) -> anyhow::Error {
        use std::io::ErrorKind::*;
        // The world's number: on a split communicator, the rank a user can find.
        let peer = self.world_ranks[peer];
        // Typed, so that the rank asks the store whom to blame (`Session::explain`): a peer
        // that closed may have given up on a third rank, and one that sent nothing may be
        // waiting for one.
        let link = |timed_out: bool, message: String| {
            anyhow::Error::new(crate::error::LinkFailed {
                peer,
                timed_out,
                message,
            })
        };
        // A connection never made (TCP's, on first use): its own words name the address.
        if let Some(u) = e.get_ref().and_then(|i| i.downcast_ref::<Unconnected>()) {
            return link(u.timed_out, u.message.clone());
        }
        match e.kind() {
            UnexpectedEof | ConnectionReset | BrokenPipe | ConnectionAborted => link(
                false,
                format!("lost rank {peer}: its connection closed (it exited, crashed or was killed)"),
            ),
            WouldBlock | TimedOut => link(
                true,
                format!("nothing moved to or from rank {peer} for the whole --timeout: it is stuck or gone"),
            ),
            InvalidData => match e.get_ref().and_then(|i| i.downcast_ref::<Mismatch>()) {
                Some(m) => anyhow!(
                    "rank {peer} is in a {} while this rank is in a {}: every rank must call the same collectives \
                     in the same order",
                    (self.names)(m.theirs),
                    (self.names)(m.ours)
                ),
                // Another size, or a malformed message: the link's own words.
                None => anyhow!("{e}"),
            },
            _ => anyhow!("connection to rank {peer} failed: {e}"),
        }
    }
}

/// With `NCCL_DEBUG=INFO`, a rank with shared-memory or TCP links says at its end how
/// many channels or connections it made: the pairs connect on first use ([`shm::connect`],
/// [`tcp::connect`]), so this is what the job's collectives really used (a ring
/// all-reduce: one per rank).
struct ChannelReport {
    rank: usize,
    shm: bool,
    tcp: bool,
}

impl Drop for ChannelReport {
    fn drop(&mut self) {
        if !debug_info() {
            return;
        }
        let made = [
            (self.shm, shm::channels_made(), "shared-memory channel(s)"),
            (self.tcp, tcp::connections_made(), "TCP connection(s)"),
        ];
        let lines: String = made
            .iter()
            .filter(|(used, _, _)| *used)
            .map(|(_, count, what)| {
                format!(
                    "cpu INFO rank {}: {count} {what} made (pairs connect on first use)\n",
                    self.rank
                )
            })
            .collect();
        // One write, so that the ranks' lines do not interleave.
        let _ = std::io::Write::write_all(&mut std::io::stderr(), lines.as_bytes());
    }
}

/// What a rank tells another during a single-copy algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    /// "My part of the result is finished: read it."
    Finished = 1,
    /// "I have read all I needed from your buffers: you may leave."
    Done = 2,
    /// "I am at the start of the timed runs" ([`Comm::line_up`]).
    Here = 3,
}

impl Signal {
    fn says(self) -> &'static str {
        match self {
            Signal::Finished => "that its part of the result is finished",
            Signal::Done => "that it has read what it needed from this rank",
            Signal::Here => "that it reached the timed runs",
        }
    }
}

impl Comm {
    /// Connects a CPU-backend rank to its peers, as NCCL's init does for its ranks: the links, shared memory to the ranks on its machine and TCP
    /// to the others (or as `--transport` says), the choice for every pair ("0-1": shm), and
    /// whether every neighbour pair of the ring (i, i + 1) shares memory, so that the
    /// all-reduce may run piece by piece.
    /// Every rank takes part in both setups, even with no peer of that kind, because each
    /// setup gathers from every rank through the store.
    /// `via` is `--transport`; every wait lasts at most `timeout`; `network` (`--link`)
    /// makes every TCP link take the time of a simulated network's ([`SimulatedLink`]).
    pub fn connect(
        store: &mut Store,
        id: &Identity,
        host: &str,
        via: TransportChoice,
        timeout: Duration,
        network: Option<Network>,
        names: fn(u8) -> &'static str,
    ) -> Result<(Comm, BTreeMap<String, Via>)> {
        let (rank, world) = (id.rank, id.world_size);
        // Beats from now on, on a thread and a store connection of its own: a rank stopped
        // from here on is named as such by the others (no heartbeat), never confused with
        // the ranks that wait for it. Not rank 0: it hosts the store, which stops with it
        // (the others then say so), and it holds the most descriptors already.
        let heartbeat = (rank > 0).then(|| Heartbeat::start(store, id, timeout)).flatten();
        let cores = cores().map_err(|message| SharedError { message, usage: true })?;
        // One machine = one host name and one boot: two containers may share a name, not a
        // boot id. Each rank says how many cores it may run on, after its machine.
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
        let machine = format!("{host} {}\n{cores}", boot.trim());
        let said = store.share("cpu/machine", rank, world, machine.as_bytes(), "every rank's machine")?;
        let said: Vec<(String, usize)> = said
            .iter()
            .map(|k| {
                let text = String::from_utf8_lossy(k);
                let (machine, cores) = text.rsplit_once('\n').unwrap_or((&text, "1"));
                (machine.to_string(), cores.parse().unwrap_or(1))
            })
            .collect();
        let keys: Vec<String> = said.iter().map(|(k, _)| k.clone()).collect();
        // Some machine runs more ranks than the fewest cores any of its ranks may use: the
        // same answer on every rank, from what every rank said.
        let oversubscribed = said.iter().any(|(k, c)| keys.iter().filter(|o| *o == k).count() > *c);
        let table = transport::choose(&keys, via).map_err(|message| SharedError { message, usage: true })?;
        let every = || table.iter().flatten().flatten();
        if let Some(net) = network {
            simulable(&keys, every().any(|v| *v == Via::Tcp), &net)
                .map_err(|message| SharedError { message, usage: true })?;
        }

        let mut links: Vec<Option<Arc<dyn Link>>> = (0..world).map(|_| None).collect();
        if every().any(|v| *v == Via::Tcp) {
            let wanted: Vec<bool> = table[rank].iter().map(|v| *v == Some(Via::Tcp)).collect();
            let ip = tcp::local_ip_towards(&id.master_addr, id.store_port)?;
            for (peer, link) in tcp::connect(store, rank, &id.job_id, &wanted, ip, timeout)?
                .into_iter()
                .enumerate()
            {
                links[peer] = match (link, network) {
                    (Some(link), Some(net)) => Some(Arc::new(SimulatedLink::new(Box::new(link), net))),
                    (Some(link), None) => Some(Arc::new(link)),
                    (None, _) => None,
                };
            }
        }
        let any_shm = every().any(|v| *v == Via::Shm);
        if any_shm {
            shm::available()?;
            let peers: Vec<usize> = (0..world).filter(|p| table[rank][*p] == Some(Via::Shm)).collect();
            for link in shm::connect(store, rank, world, &peers, timeout)? {
                let peer = link.peer();
                links[peer] = Some(Arc::new(link));
            }
        }
        let mut pairs = BTreeMap::new();
        for (a, row) in table.iter().enumerate() {
            for (b, via) in row.iter().enumerate().skip(a + 1) {
                if let Some(via) = via {
                    pairs.insert(format!("{a}-{b}"), *via);
                }
            }
        }
        let ring_in_memory = (0..world).all(|a| world == 1 || table[a][(a + 1) % world] == Some(Via::Shm));
        // Results stream around the cache once the buffers of every rank on this host
        // together outgrow its last-level cache.
        let local = keys.iter().filter(|k| **k == keys[rank]).count();
        let llc = last_level_cache().map_err(|message| SharedError { message, usage: true })?;
        let core = core_cache(local, cores).map_err(|message| SharedError { message, usage: true })?;
        // One host for the whole job: each rank's large buffers go where the others can read them.
        let arenas = match world > 1 && every().all(|v| *v == Via::Shm) {
            true => host_memory::connect(store, rank, world)?,
            false => None,
        };
        let mut comm = Comm::new(rank, world, links, ring_in_memory, names, llc / local);
        comm.report.shm = any_shm;
        comm.report.tcp = table[rank].contains(&Some(Via::Tcp));
        comm.heartbeat = heartbeat.map(Arc::new);
        comm.shm_on_node = via != TransportChoice::Tcp;
        let comm = comm
            .with_core_cache(core.filter(|_| world > 1 && every().all(|v| *v == Via::Shm)))
            .with_peer_arenas(arenas)
            .oversubscribed_by(oversubscribed)
            .with_protocols(world > 1 && every().all(|v| *v == Via::Shm))
            .on_nodes(number_machines(&keys));
        Ok((comm, pairs))
    }
}

/// Whether `--link` can simulate this job's network: some pair of ranks must talk over
/// TCP (the simulated links are TCP's), and every rank must run under one kernel, whose
/// clock both ends of a link read (`keys`: each rank's `host boot-id`). Same answer on
/// every rank.
fn simulable(keys: &[String], tcp: bool, net: &Network) -> Result<(), String> {
    let link = format!("--link ({})", net.describe());
    if !tcp {
        return Err(format!(
            "{link}: no pair of ranks talks over TCP here (they share memory): run them as emulated nodes \
             (--nnodes, a host name each) or with --transport tcp"
        ));
    }
    let boot = |k: &String| k.rsplit(' ').next().unwrap_or_default().to_string();
    if keys.iter().any(|k| boot(k) != boot(&keys[0])) {
        return Err(format!(
            "{link} simulates the network between emulated nodes on one machine; these ranks run on several \
             machines, which have a real one: leave --link out"
        ));
    }
    Ok(())
}

/// Each machine's number, in the order of its first rank: `["b", "a", "b"]` is `[0, 1, 0]`.
fn number_machines(keys: &[String]) -> Vec<usize> {
    let mut seen: Vec<&String> = vec![];
    keys.iter()
        .map(|k| match seen.iter().position(|s| *s == k) {
            Some(i) => i,
            None => {
                seen.push(k);
                seen.len() - 1
            }
        })
        .collect()
}

/// How a message of `len` bytes over `link` is cut: into slices the link can buffer
/// when that is a useful amount (at least [`MIN_SLICE`]), else whole. Both ends of a link
/// cut alike, since they see the same kind of link. Always at least one slice, maybe empty.
fn slices(len: usize, link: &dyn Link) -> Slices {
    let size = match link.eager_limit() {
        e if e >= MIN_SLICE => e,
        _ => len.max(1),
    };
    Slices { len, size }
}

/// One message for the send thread ([`Comm::send_aside`]): `len` bytes at `data`, for
/// `link`, and where to say how it went.
struct SendJob {
    link: Arc<dyn Link>,
    tag: u8,
    data: *const u8,
    len: usize,
    done: mpsc::SyncSender<std::io::Result<()>>,
}

// SAFETY: `data` points to `len` bytes that the [`Sending`] made with the job borrows for
// its whole life, and a `Sending` does not end (even while unwinding) before the thread
// has answered on `done` or is gone: the bytes live, unchanged, while the thread reads
// them. The rest of the job is `Send` as it is.
unsafe impl Send for SendJob {}

/// A message being sent by the send thread: [`Sending::wait`] says how it went. Borrows
/// the message's bytes until then; dropped unwaited (a receive that panicked), it still
/// waits, so that the thread never reads bytes given back.
struct Sending<'a> {
    result: mpsc::Receiver<std::io::Result<()>>,
    waited: bool,
    _out: std::marker::PhantomData<&'a [u8]>,
}

impl Sending<'_> {
    /// Waits until the message is sent, or its send failed.
    fn wait(mut self) -> std::io::Result<()> {
        self.waited = true;
        self.result
            .recv()
            .unwrap_or_else(|_| Err(std::io::Error::other("the sending thread stopped")))
    }
}

impl Drop for Sending<'_> {
    fn drop(&mut self) {
        if !self.waited {
            // The thread answers, or drops `done` if it stops: either ends the wait.
            let _ = self.result.recv();
        }
    }
}

/// The send thread of a communicator: sends each job's message in turn and answers how
/// it went, until the communicator drops its end. `None` where no thread can be started.
fn start_send_thread() -> Option<mpsc::Sender<SendJob>> {
    let (jobs, queue) = mpsc::channel::<SendJob>();
    thread::Builder::new()
        .name("send".into())
        .spawn(move || {
            for job in queue {
                // SAFETY: as `SendJob` says, the bytes live and stay unchanged until the
                // answer below.
                let data = unsafe { std::slice::from_raw_parts(job.data, job.len) };
                let sent = job.link.send(job.tag, data);
                let _ = job.done.send(sent);
            }
        })
        .ok()?;
    Some(jobs)
}

/// A message of `len` bytes cut in slices of `size` (the last may be shorter; an empty
/// message is one empty slice). Computed, not collected: an exchange of a few bytes
/// costs less than an allocation.
#[derive(Clone, Copy)]
struct Slices {
    len: usize,
    size: usize,
}

impl Slices {
    /// How many slices.
    fn count(self) -> usize {
        self.len.div_ceil(self.size).max(1)
    }

    /// Slice `k`, if there is one.
    fn get(self, k: usize) -> Option<Range<usize>> {
        (k < self.count()).then(|| (k * self.size).min(self.len)..((k + 1) * self.size).min(self.len))
    }

    /// Every slice, in order.
    fn iter(self) -> impl Iterator<Item = Range<usize>> {
        (0..self.count()).filter_map(move |k| self.get(k))
    }
}

/// Chunk `i` of `n` nearly equal chunks of `len` elements (sizes differ by at most one;
/// some are empty when `len < n`).
pub fn chunk_range(len: usize, n: usize, i: usize) -> Range<usize> {
    let at = |k: usize| ((len as u128 * k as u128) / n as u128) as usize;
    at(i)..at(i + 1)
}

/// Two disjoint ranges of one slice (either may be empty), the first to read and the
/// second to write.
pub fn split_two<T>(data: &mut [T], a: Range<usize>, b: Range<usize>) -> (&[T], &mut [T]) {
    if a.end <= b.start {
        let (lo, hi) = data.split_at_mut(b.start);
        (&lo[a], &mut hi[..b.end - b.start])
    } else {
        debug_assert!(b.end <= a.start, "overlapping chunks {a:?} and {b:?}");
        let (lo, hi) = data.split_at_mut(a.start);
        (&hi[..a.end - a.start], &mut lo[b])
    }
}

/// Keeps a finished piece: copies `from` into the front of `dst`, around the cache when
/// the whole buffer is too large for it (`streaming`).
#[inline]
pub fn keep(dst: &mut [u8], from: &[u8], streaming: bool) {
    match streaming {
        true => copy_around_cache(&mut dst[..from.len()], from),
        false => dst[..from.len()].copy_from_slice(from),
    }
}

/// The cores this rank may run on: `NCCL_WORKBOOK_CORES` where set (a test, or a
/// machine whose cores are shared with other work), else what the system lets this
/// process use. A value the variable cannot mean is the user's error, said in one line.
fn cores() -> Result<usize, String> {
    match std::env::var("NCCL_WORKBOOK_CORES") {
        Ok(text) => match text.trim().parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!("NCCL_WORKBOOK_CORES={text}: a number of cores, at least 1")),
        },
        Err(_) => Ok(thread::available_parallelism().map_or(1, |n| n.get())),
    }
}

/// Whether `NCCL_DEBUG` asks for NCCL's INFO lines (INFO or TRACE), as NCCL reads it.
pub fn debug_info() -> bool {
    workbook_runtime::users_nccl_debug().is_some_and(|v| info_level(&v))
}

/// Whether an `NCCL_DEBUG` value prints INFO lines (INFO or TRACE, any case): the one
/// reading of the level, for the CPU backend's lines and for lesson 08's `--show-calls`.
pub fn info_level(level: &str) -> bool {
    matches!(level.trim().to_uppercase().as_str(), "INFO" | "TRACE")
}

/// The size of this machine's last-level cache: `NCCL_WORKBOOK_LLC` where set (`32M`: a
/// machine whose cache is shared with other guests, or a test), else the largest of the
/// highest-level caches `/sys` lists for CPU 0, else [`LLC_DEFAULT`]. A value the
/// variable cannot mean is the user's error, said in one line.
fn last_level_cache() -> Result<usize, String> {
    if let Ok(text) = std::env::var("NCCL_WORKBOOK_LLC") {
        return units::parse_size(&text)
            .map(|b| b as usize)
            .map_err(|why| format!("NCCL_WORKBOOK_LLC: {why}"));
    }
    let largest = sys_caches().into_iter().map(|c| (c.level, c.size)).max();
    Ok(largest.map_or(LLC_DEFAULT, |(_, size)| size))
}

/// How much of a rank's `share` of the last-level cache its buffers can fill and still
/// run from the cache: 3/4 (the rest holds other lines, and lines do not leave in the
/// order they came; glibc's `memcpy` goes around the cache from 3/4 of it too,
/// `__x86_shared_non_temporal_threshold`). The benchmark's `--fit` counts a size's rows
/// as from memory from there.
pub fn cache_room(share: usize) -> usize {
    share / 4 * 3
}

/// One cache `/sys` lists for CPU 0: its level, its size, and how many CPUs share it.
struct SysCache {
    level: u32,
    size: usize,
    sharing: usize,
}

/// The caches `/sys` lists for CPU 0 (none where it lists none, or is hidden), each
/// entry that cannot be read left out.
fn sys_caches() -> Vec<SysCache> {
    let Ok(dir) = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache") else {
        return vec![];
    };
    let read = |p: &std::path::Path, f: &str| std::fs::read_to_string(p.join(f)).ok();
    dir.flatten()
        .filter_map(|e| {
            let p = e.path();
            Some(SysCache {
                level: read(&p, "level")?.trim().parse().ok()?,
                size: units::parse_size(&read(&p, "size")?).ok()? as usize,
                sharing: read(&p, "shared_cpu_list").map_or(1, |l| cpu_count(l.trim()).max(1)),
            })
        })
        .collect()
}

/// This rank's share of its core's own cache, one of `local` ranks on a host where it
/// may run on `cores` CPUs ([`cores`]): `NCCL_WORKBOOK_L2` where set (`0`: none), else
/// the largest cache `/sys` lists for CPU 0 below the last level (an L2), over the ranks
/// that share it (the ranks spread over those CPUs, each pinned to its own where it can
/// be; a cache shared by several CPUs is shared by their ranks). `None` where `/sys` lists
/// one level or none.
fn core_cache(local: usize, cores: usize) -> Result<Option<usize>, String> {
    if let Ok(text) = std::env::var("NCCL_WORKBOOK_L2") {
        if text.trim() == "0" {
            return Ok(None);
        }
        return units::parse_size(&text)
            .map(|b| Some(b as usize))
            .map_err(|why| format!("NCCL_WORKBOOK_L2 (a size, or 0 for none): {why}"));
    }
    let caches = sys_caches();
    let Some(last) = caches.iter().map(|c| c.level).max() else {
        return Ok(None);
    };
    let Some(below) = caches
        .iter()
        .filter(|c| c.level < last)
        .max_by_key(|c| (c.level, c.size))
    else {
        return Ok(None);
    };
    let caches_in_use = (cores / below.sharing).max(1);
    Ok(Some(below.size / local.max(1).div_ceil(caches_in_use)))
}

/// How many CPUs a `/sys` CPU list names (`0-3,8`: 5); a part it cannot read counts
/// none.
fn cpu_count(list: &str) -> usize {
    let number = |t: &str| t.trim().parse::<usize>().ok();
    list.split(',')
        .filter_map(|part| match part.split_once('-') {
            Some((a, b)) => number(b)?.checked_sub(number(a)?).map(|d| d + 1),
            None => number(part).map(|_| 1),
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cpu_list_is_counted() {
        assert_eq!(cpu_count("0"), 1);
        assert_eq!(cpu_count("0-3,8"), 5);
        assert_eq!(cpu_count("0,64"), 2);
        assert_eq!(cpu_count(""), 0);
        assert_eq!(cpu_count("5-3,x,7"), 1, "a backwards range or a word counts none");
    }

    #[test]
    fn a_message_is_cut_in_whole_slices_and_an_empty_one_is_one_empty_slice() {
        let cut = |len, size| Slices { len, size }.iter().collect::<Vec<_>>();
        assert_eq!(cut(10, 4), vec![0..4, 4..8, 8..10]);
        assert_eq!(cut(8, 4), vec![0..4, 4..8]);
        assert_eq!(cut(3, 4), vec![0..3]);
        assert_eq!(cut(0, 1), vec![0..0]);
        let s = Slices { len: 10, size: 4 };
        assert_eq!((s.count(), s.get(2), s.get(3)), (3, Some(8..10), None));
    }

    #[test]
    fn a_mismatch_on_a_link_names_both_collectives() {
        let names = |tag: u8| if tag == 4 { "all-gather" } else { "reduce-scatter" };
        let cpu = Comm::new(0, 2, vec![None, None], false, names, LLC_DEFAULT);
        let err = cpu.lost(crate::transport::op_mismatch(1, 5, 4), 1);
        assert_eq!(
            err.to_string(),
            "rank 1 is in a reduce-scatter while this rank is in a all-gather: every rank must call the same \
             collectives in the same order"
        );
        let other = cpu.lost(crate::transport::len_mismatch(1, 3, 4), 1);
        assert!(
            other.to_string().contains("rank 1 sent 3 bytes where 4 were expected"),
            "{other}"
        );
    }

    #[test]
    fn machines_are_numbered_in_the_order_of_their_first_rank() {
        let keys = |k: &[&str]| k.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(number_machines(&keys(&["b", "a", "b", "c", "a"])), [0, 1, 0, 2, 1]);
        assert_eq!(number_machines(&keys(&["x"])), [0]);
    }

    #[test]
    fn chunks_cover_the_buffer_exactly_for_every_count_and_world() {
        for n in 1..=9 {
            for len in 0..=40 {
                let chunks: Vec<_> = (0..n).map(|i| chunk_range(len, n, i)).collect();
                assert_eq!(chunks[0].start, 0);
                assert_eq!(chunks[n - 1].end, len);
                for w in chunks.windows(2) {
                    assert_eq!(w[0].end, w[1].start);
                }
                let sizes: Vec<_> = chunks.iter().map(|c| c.len()).collect();
                assert!(
                    sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1,
                    "{len}/{n}: {sizes:?}"
                );
            }
        }
        assert_eq!(chunk_range(usize::MAX / 2, 3, 2).end, usize::MAX / 2);
    }

    #[test]
    fn split_two_gives_the_right_disjoint_pieces() {
        let mut v: Vec<i32> = (0..10).collect();
        let (a, b) = split_two(&mut v, 6..9, 1..3);
        assert_eq!(a, &[6, 7, 8]);
        assert_eq!(b, &mut [1, 2]);
        let (a, b) = split_two(&mut v, 0..2, 5..10);
        assert_eq!((a.len(), b.len()), (2, 5));
        // Empty chunks (count < world) sit anywhere, even where the other one starts.
        for (a, b) in [(0..0, 0..1), (0..1, 1..1), (3..3, 3..3), (4..4, 0..4), (10..10, 9..10)] {
            let (x, y) = split_two(&mut v, a.clone(), b.clone());
            assert_eq!((x.len(), y.len()), (a.len(), b.len()));
        }
    }
}
