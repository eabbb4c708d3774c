//! The CPU backend's communicator: links to every other rank and the steps the CPU
//! algorithms are made of (the algorithms themselves, and the choice between them, live
//! with their collective, in `common::collective`).
//!
//! The ranks sit in a ring, each sending to its right neighbour and receiving from its
//! left. Every link carries the same amount at the same time, so no rank is a
//! bottleneck, whatever the number of ranks.

//! How a rank connects (the links it makes, and what it says of them at its end) is in
//! [`connect`]; how a step's message is cut into slices and, when its link cannot buffer
//! it, sent by the communicator's send thread, in [`sending`]; what the machine says of
//! its cores and caches, in [`crate::machine`].

mod connect;
mod sending;

pub use crate::machine::cache_room;

use self::connect::ChannelReport;
use self::sending::{SendJob, slices};
use crate::element::{Element, as_bytes, as_bytes_mut};
use crate::heartbeat::Heartbeat;
use crate::host_memory::{self, HostMem, PeerArena};
use crate::transport::shm::copy_around_cache;
use crate::transport::{Link, Mismatch, Unconnected};
use anyhow::{Context, Result, anyhow};
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, mpsc};
use std::thread;
use workbook_runtime::failure::{Fact, WithFact};

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
    /// `--link` and `--timeout`, when some link of this rank is simulated: a message the
    /// simulated wire cannot carry within the timeout is refused before it is sent
    /// ([`carries`], with [`Comm::wire_limit`]).
    wire: Option<(crate::transport::simulated::Network, std::time::Duration)>,
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
            wire: None,
        }
    }

    /// The same rank, whose TCP links take the time of `net` (`--link`) and whose waits
    /// last at most `timeout`.
    pub fn on_wire(self, wire: Option<(crate::transport::simulated::Network, std::time::Duration)>) -> Comm {
        Comm { wire, ..self }
    }

    /// `--link` and `--timeout` where this rank has a simulated link to another of this
    /// communicator: what [`carries`] checks a message against.
    pub fn wire_limit(&self) -> Option<(crate::transport::simulated::Network, std::time::Duration)> {
        self.wire.filter(|_| self.world > 1)
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
            // Simulated where some pair of its ranks talks over TCP.
            wire: self.wire.filter(|_| !every_pair_in_memory),
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
            .fact(|| self.waiting(true, peer))
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
            .fact(|| self.waiting(false, peer))
    }

    /// The failure record's fact of a send (`sending`) or receive with `peer` that failed.
    fn waiting(&self, sending: bool, peer: usize) -> Fact {
        Fact::Waiting {
            sending,
            peer: self.world_ranks[peer],
            on_gpu: false,
        }
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

/// Whether a message of `bytes` crosses a simulated wire (`--link`, with `--timeout`;
/// `None`: no simulated link) in time: one line for the user when it does not.
pub fn carries(
    wire: Option<(crate::transport::simulated::Network, std::time::Duration)>,
    bytes: usize,
) -> Result<(), String> {
    wire.map_or(Ok(()), |(net, timeout)| net.carries(bytes, timeout))
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

/// Whether `NCCL_DEBUG` asks for NCCL's INFO lines (INFO or TRACE), as NCCL reads it.
pub fn debug_info() -> bool {
    workbook_runtime::users_nccl_debug().is_some_and(|v| info_level(&v))
}

/// Whether an `NCCL_DEBUG` value prints INFO lines (INFO or TRACE, any case): the one
/// reading of the level, for the CPU backend's lines and for lesson 08's `--show-calls`.
pub fn info_level(level: &str) -> bool {
    matches!(level.trim().to_uppercase().as_str(), "INFO" | "TRACE")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::LLC_DEFAULT;

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
