//! The CPU backend: the ring algorithms NCCL and Gloo use, over plain links.
//!
//! The ranks sit in a ring, each sending to its right neighbour and receiving from its
//! left. Every link carries the same amount at the same time, so no rank is a
//! bottleneck, whatever the number of ranks.

use super::{Element, as_bytes, as_bytes_mut};
use crate::args::RunArgs;
use crate::error::SharedError;
use crate::launch::Identity;
use crate::rendezvous::Store;
use crate::transport::shm::copy_around_cache;
use crate::transport::{self, Via, shm, tcp};
use crate::transport::{Link, Op};
use anyhow::{Context, Result, anyhow};
use std::collections::BTreeMap;
use std::ops::Range;
use std::thread;

/// A broadcast moves in pieces of this size, so that each rank forwards one piece while
/// the next one is still arriving (a pipeline).
const BROADCAST_PIECE: usize = 512 << 10;
/// Results are written around the cache (non-temporal stores) for buffers from this
/// size: larger than the caches, so nothing would be read back from them anyway.
const STREAM_ABOVE: usize = 16 << 20;
/// A link that buffers at least this much gets ring steps in slices, in one thread.
const MIN_SLICE: usize = 256 << 10;
/// An all-reduce reduces what arrives in pieces of this size, while the rest is in flight.
const REDUCE_PIECE: usize = 256 << 10;

/// The pipelined all-reduce moves pieces of this size round the ring: one shared-memory
/// slot each, so that a piece is reduced straight into the slot it leaves in.
const RING_PIECE: usize = crate::transport::shm::SLOT_BYTES;

/// A rank of the CPU backend: its place in the world, and a link to every other rank.
pub struct Cpu {
    rank: usize,
    world: usize,
    links: Vec<Option<Box<dyn Link>>>,
    pipelined: bool,
}

impl Cpu {
    /// A CPU backend for `rank` of `world` over `links` (`links[rank]` is `None`).
    /// `pipelined`: every link of the ring (rank i to i + 1) buffers several pieces (they
    /// all share memory), so the all-reduce may run piece by piece round the whole ring;
    /// every rank must be told the same.
    pub fn new(rank: usize, world: usize, links: Vec<Option<Box<dyn Link>>>, pipelined: bool) -> Cpu {
        Cpu {
            rank,
            world,
            links,
            pipelined,
        }
    }

    fn link(&self, peer: usize) -> &dyn Link {
        self.links[peer].as_deref().expect("a link to every other rank")
    }

    /// Ring all-reduce: reduce-scatter, then all-gather. In place when `src` is `None`;
    /// otherwise `data` receives the sum of every rank's `src` (out of place, as
    /// `ncclAllReduce(sendbuff, recvbuff)` with two buffers).
    ///
    /// The buffer is cut into `world` chunks. In the reduce-scatter, each of `world - 1`
    /// steps sends one chunk right and adds the chunk arriving from the left into ours;
    /// after it, rank r holds the full sum of chunk r+1. The all-gather then passes the
    /// finished chunks around the ring, `world - 1` steps again, until every rank has
    /// every chunk. Each rank sends 2(n-1)/n of the buffer in all: nccl-tests' busbw factor.
    ///
    /// This is the ring step by step, as the lesson draws it. When every link of the ring
    /// shares memory and there are three ranks or more, the same ring runs piece by piece
    /// instead ([`Cpu::all_reduce_pipelined`]), which saves the buffer's partial sums.
    pub fn all_reduce_sum<T: Element>(&self, src: Option<&[T]>, data: &mut [T]) -> Result<()> {
        let (n, r) = (self.world, self.rank);
        // The session checked that `src` and `data` have one length, at its edge.
        if let (Some(src), 1) = (src, n) {
            data.copy_from_slice(src);
        }
        if n == 1 {
            return Ok(());
        }
        // Two ranks have no partial sum to pass on, and the step-by-step ring, with its
        // larger messages, measured faster for them.
        if self.pipelined && n > 2 {
            return self.all_reduce_pipelined(src, data);
        }
        let len = data.len();
        let chunk = |i: usize| chunk_range(len, n, i);
        let streaming = size_of_val(data) >= STREAM_ABOVE;
        let mut scratch = vec![T::default(); (REDUCE_PIECE / size_of::<T>()).max(1)];
        for step in 0..n - 1 {
            let (send, recv) = ((r + n - step) % n, (r + 2 * n - step - 1) % n);
            let (partial, acc) = split_two(data, chunk(send), chunk(recv));
            // Out of place, the first chunk sent and every chunk added to come from `src`.
            let out = match src {
                Some(src) if step == 0 => &src[chunk(send)],
                _ => partial,
            };
            let mine = src.map(|src| &src[chunk(recv)]);
            self.exchange(Op::AllReduce, out, size_of_val(acc), |link, slice| {
                link.recv_pieces(
                    Op::AllReduce,
                    slice.len(),
                    as_bytes_mut(&mut scratch),
                    &mut |off, piece| {
                        let at = (slice.start + off) / size_of::<T>();
                        match mine {
                            Some(mine) => add_from(&mut acc[at..], &mine[at..], piece),
                            None => add_into(&mut acc[at..], piece),
                        }
                    },
                )
            })
            .with_context(|| format!("all-reduce, reduce-scatter step {} of {}", step + 1, n - 1))?;
        }
        for step in 0..n - 1 {
            let (send, recv) = ((r + 1 + n - step) % n, (r + n - step) % n);
            let (out, dst) = split_two(data, chunk(send), chunk(recv));
            let dst = as_bytes_mut(dst);
            self.exchange(Op::AllReduce, out, dst.len(), |link, slice| match streaming {
                true => link.recv_into_streaming(Op::AllReduce, &mut dst[slice]),
                false => link.recv_into(Op::AllReduce, &mut dst[slice]),
            })
            .with_context(|| format!("all-reduce, all-gather step {} of {}", step + 1, n - 1))?;
        }
        Ok(())
    }

    /// The same ring all-reduce, run piece by piece as NCCL runs it: each chunk is cut
    /// into pieces, and piece k of every chunk goes all the way round the ring (all
    /// `2(n-1)` steps) before piece k + 1 starts. A piece arriving from the left is
    /// reduced straight into the message to the right, so partial sums never touch the
    /// buffer: only the finished sums are written to it, once. NCCL's names for the
    /// steps of one piece:
    ///
    /// - `send`: the first step sends this rank's own piece;
    /// - `recvReduceSend` (n - 2 times): partial sum in, plus ours, out to the right;
    /// - `recvReduceCopySend`: the last addition: the full sum, kept and passed on;
    /// - `recvCopySend` (n - 2 times): a finished sum, kept and passed on;
    /// - `recv`: the last finished sum, kept.
    ///
    /// Only for rings whose every link buffers a few pieces (shared memory): a rank sends
    /// before it receives, so each link must hold a piece while its receiver is busy. (A
    /// TCP socket promises to hold only a little; NCCL gives its network links a helper
    /// thread for that, which this backend does not have.)
    fn all_reduce_pipelined<T: Element>(&self, src: Option<&[T]>, data: &mut [T]) -> Result<()> {
        let (n, r) = (self.world, self.rank);
        let len = data.len();
        let per = (RING_PIECE / size_of::<T>()).max(1);
        let longest = (0..n).map(|c| chunk_range(len, n, c).len()).max().unwrap_or(0);
        let streaming = size_of_val(data) >= STREAM_ABOVE;
        let mut scratch = vec![0u8; REDUCE_PIECE];
        let op = Op::AllReduce;
        for k in 0..longest.div_ceil(per).max(1) {
            // Piece k of chunk c (chunks differ by one element at most: a last piece may be empty).
            let piece = |c: usize| {
                let chunk = chunk_range(len, n, c % n);
                let start = (chunk.start + k * per).min(chunk.end);
                start..(start + per).min(chunk.end)
            };
            let step = |what: &str| format!("all-reduce, piece {k}: {what}");
            // Reduce-scatter: our own piece of chunk r goes right...
            let own = piece(r);
            let first = src.map_or(&data[own.clone()], |src| &src[own]);
            self.link((r + 1) % n)
                .send(op, as_bytes(first))
                .map_err(|e| self.lost(e, (r + 1) % n))
                .with_context(|| step("send"))?;
            // ...then each partial sum arriving from the left gets ours added and goes on.
            for s in 0..n - 2 {
                let p = piece(r + 2 * n - s - 1);
                let mine = src.map_or(&data[p.clone()], |src| &src[p]);
                self.recv_then_send(size_of_val(mine), &mut scratch, |out, off, inp| {
                    sum_bytes(out, &mine[off / size_of::<T>()..], inp)
                })
                .with_context(|| step("recvReduceSend"))?;
            }
            // The last addition makes the full sum of chunk r + 1: passed on, and kept.
            let p = piece(r + 1);
            let bytes = size_of_val(&data[p.clone()]);
            self.recv_then_send(bytes, &mut scratch, |out, off, inp| {
                let at = p.start + off / size_of::<T>();
                let mine = src.map_or(&data[at..p.end], |src| &src[at..p.end]);
                sum_bytes(out, mine, inp);
                keep(as_bytes_mut(&mut data[at..p.end]), out, streaming);
            })
            .with_context(|| step("recvReduceCopySend"))?;
            // All-gather: each finished sum arriving from the left is kept and passed on...
            for s in 0..n - 2 {
                let p = piece(r + n - s);
                let dst = as_bytes_mut(&mut data[p]);
                self.recv_then_send(dst.len(), &mut scratch, |out, off, inp| {
                    out.copy_from_slice(inp);
                    keep(&mut dst[off..], inp, streaming);
                })
                .with_context(|| step("recvCopySend"))?;
            }
            // ...and the last one only kept.
            let left = (r + n - 1) % n;
            let dst = as_bytes_mut(&mut data[piece(r + 2)]);
            match streaming {
                true => self.link(left).recv_into_streaming(op, dst),
                false => self.link(left).recv_into(op, dst),
            }
            .map_err(|e| self.lost(e, left))
            .with_context(|| step("recv"))?;
        }
        Ok(())
    }

    /// Receives a message from the left neighbour and, in the same pass, writes the
    /// message to the right: `make(out, offset, piece)` fills `out` from each `piece`
    /// as it arrives, straight into the transport's buffer.
    fn recv_then_send(
        &self,
        len: usize,
        scratch: &mut [u8],
        mut make: impl FnMut(&mut [u8], usize, &[u8]),
    ) -> Result<()> {
        let (left, right) = ((self.rank + self.world - 1) % self.world, (self.rank + 1) % self.world);
        let mut received = Ok(());
        let sent = self.link(right).send_with(Op::AllReduce, len, &mut |out| {
            let got = self
                .link(left)
                .recv_pieces(Op::AllReduce, len, scratch, &mut |off, piece| {
                    make(&mut out[off..off + piece.len()], off, piece)
                });
            // Kept aside, so that the error names the left neighbour, not the right.
            got.map_err(|e| {
                let kind = e.kind();
                received = Err(e);
                std::io::Error::from(kind)
            })
        });
        received.map_err(|e| self.lost(e, left))?;
        sent.map_err(|e| self.lost(e, right))
    }

    /// Pipelined ring broadcast: the root sends its buffer piece by piece to its right
    /// neighbour; every rank forwards each piece to the next as soon as it has it, so the
    /// pieces flow round the ring like water down a pipe. In place when `src` is `None`;
    /// otherwise the root sends from `src` (and copies it into its own `data`).
    pub fn broadcast<T: Element>(&self, src: Option<&[T]>, data: &mut [T], root: usize) -> Result<()> {
        let (n, r) = (self.world, self.rank);
        let pos = (r + n - root) % n; // this rank's distance from the root along the ring
        // Out of place, the root sends from `src` and copies each piece into its own
        // `data` after sending it, while the piece travels.
        let root_src = src.filter(|_| pos == 0).map(as_bytes);
        let (left, right) = ((r + n - 1) % n, (r + 1) % n);
        let streaming = size_of_val(data) >= STREAM_ABOVE;
        let bytes = as_bytes_mut(data);
        for (i, piece) in bytes.chunks_mut(BROADCAST_PIECE).enumerate() {
            let at = |what: &str, peer: usize| {
                format!("broadcast from rank {root}: {what} piece {i} {}", self.peer_name(peer))
            };
            if pos > 0 {
                let link = self.link(left);
                match streaming && pos == n - 1 {
                    // The last rank of the chain only stores what it receives.
                    true => link.recv_into_streaming(Op::Broadcast, piece),
                    false => link.recv_into(Op::Broadcast, piece),
                }
                .map_err(|e| self.lost(e, left))
                .with_context(|| at("receiving", left))?;
            }
            let mine = root_src.map(|s| &s[i * BROADCAST_PIECE..][..piece.len()]);
            if pos < n - 1 {
                self.link(right)
                    .send(Op::Broadcast, mine.unwrap_or(piece))
                    .map_err(|e| self.lost(e, right))
                    .with_context(|| at("sending", right))?;
            }
            if let Some(mine) = mine {
                keep(piece, mine, streaming);
            }
        }
        Ok(())
    }

    /// Sends `data` to `peer` (point-to-point).
    pub fn send<T: Element>(&self, data: &[T], peer: usize) -> Result<()> {
        self.link(peer)
            .send(Op::PointToPoint, as_bytes(data))
            .map_err(|e| self.lost(e, peer))
            .with_context(|| format!("sending {} elements to {}", data.len(), self.peer_name(peer)))
    }

    /// Receives `data.len()` elements from `peer` (point-to-point).
    pub fn recv<T: Element>(&self, data: &mut [T], peer: usize) -> Result<()> {
        let n = data.len();
        self.link(peer)
            .recv_into(Op::PointToPoint, as_bytes_mut(data))
            .map_err(|e| self.lost(e, peer))
            .with_context(|| format!("receiving {n} elements from {}", self.peer_name(peer)))
    }

    /// One ring step: send `out` to the right neighbour while `receive` reads `in_len`
    /// bytes from the left, called once per slice with the slice's byte range.
    ///
    /// Every rank sends at the same time, so no rank may wait for its send to be received
    /// before it receives. A link that buffers a useful amount (the shared-memory ring)
    /// gets the message in slices that fit its buffer, and one thread alternates "send
    /// a slice, receive a slice", as NCCL's steps do. A message the link cannot buffer
    /// (a large one over TCP) is sent whole by a second thread.
    fn exchange<T: Element>(
        &self,
        op: Op,
        out: &[T],
        in_len: usize,
        mut receive: impl FnMut(&dyn Link, Range<usize>) -> std::io::Result<()>,
    ) -> Result<()> {
        let (left, right) = ((self.rank + self.world - 1) % self.world, (self.rank + 1) % self.world);
        let (to, from) = (self.link(right), self.link(left));
        let bytes = as_bytes(out);
        let (sends, recvs) = (slices(bytes.len(), to), slices(in_len, from));
        if sends.iter().all(|s| s.len() <= to.eager_limit()) {
            for k in 0..sends.len().max(recvs.len()) {
                if let Some(s) = sends.get(k) {
                    to.send(op, &bytes[s.clone()]).map_err(|e| self.lost(e, right))?;
                }
                if let Some(r) = recvs.get(k) {
                    receive(from, r.clone()).map_err(|e| self.lost(e, left))?;
                }
            }
            return Ok(());
        }
        thread::scope(|s| {
            let sender = s.spawn(|| sends.iter().try_for_each(|s| to.send(op, &bytes[s.clone()])));
            let got = recvs
                .iter()
                .try_for_each(|r| receive(from, r.clone()))
                .map_err(|e| self.lost(e, left));
            let sent = sender
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("the sending thread panicked")));
            got?;
            sent.map_err(|e| self.lost(e, right))
        })
    }

    fn peer_name(&self, peer: usize) -> String {
        match &self.links[peer] {
            Some(l) => format!("({})", l.describe()),
            None => String::new(),
        }
    }

    /// Turns a socket error into what it means for the job.
    fn lost(&self, e: std::io::Error, peer: usize) -> anyhow::Error {
        use std::io::ErrorKind::*;
        match e.kind() {
            UnexpectedEof | ConnectionReset | BrokenPipe | ConnectionAborted => {
                anyhow!("lost rank {peer}: its connection closed (it exited, crashed or was killed)")
            }
            WouldBlock | TimedOut => {
                anyhow!("nothing moved to or from rank {peer} for the whole --timeout: it is stuck or gone")
            }
            InvalidData => anyhow!("{e}"),
            _ => anyhow!("connection to rank {peer} failed: {e}"),
        }
    }
}

impl Cpu {
    /// Connects a CPU-backend rank to its peers, as NCCL's init does for its ranks: the links, shared memory to the ranks on its machine and TCP
    /// to the others (or as `--transport` says), the choice for every pair ("0-1": shm), and
    /// whether every neighbour pair of the ring (i, i + 1) shares memory, so that the
    /// all-reduce may run piece by piece.
    /// Every rank takes part in both setups, even with no peer of that kind, because each
    /// setup gathers from every rank through the store.
    pub fn connect(
        store: &mut Store,
        id: &Identity,
        host: &str,
        run: &RunArgs,
    ) -> Result<(Cpu, BTreeMap<String, Via>)> {
        let (rank, world) = (id.rank, id.world_size);
        // One machine = one host name and one boot: two containers may share a name, not a boot id.
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
        let machine = format!("{host} {}", boot.trim());
        let keys = store.share("cpu/machine", rank, world, machine.as_bytes(), "every rank's machine")?;
        let keys: Vec<String> = keys.iter().map(|k| String::from_utf8_lossy(k).into_owned()).collect();
        let table = transport::choose(&keys, run.transport).map_err(|message| SharedError { message, usage: true })?;
        let every = || table.iter().flatten().flatten();

        let mut links: Vec<Option<Box<dyn Link>>> = (0..world).map(|_| None).collect();
        if every().any(|v| *v == Via::Tcp) {
            let wanted: Vec<bool> = table[rank].iter().map(|v| *v == Some(Via::Tcp)).collect();
            let ip = tcp::local_ip_towards(&id.master_addr, id.store_port)?;
            for (peer, link) in tcp::connect_mesh(store, rank, &id.job_id, &wanted, ip, run.timeout)?
                .into_iter()
                .enumerate()
            {
                if let Some(link) = link {
                    links[peer] = Some(Box::new(link));
                }
            }
        }
        if every().any(|v| *v == Via::Shm) {
            shm::available()?;
            let peers: Vec<usize> = (0..world).filter(|p| table[rank][*p] == Some(Via::Shm)).collect();
            for link in shm::connect(store, rank, world, &peers, run.timeout)? {
                let peer = link.peer();
                links[peer] = Some(Box::new(link));
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
        Ok((Cpu::new(rank, world, links, ring_in_memory), pairs))
    }
}

/// How a message of `len` bytes over `link` is cut: into slices the link can buffer
/// when that is a useful amount (at least [`MIN_SLICE`]), else whole. Both ends of a link
/// cut alike, since they see the same kind of link. Always at least one slice, maybe empty.
fn slices(len: usize, link: &dyn Link) -> Vec<Range<usize>> {
    let size = match link.eager_limit() {
        e if e >= MIN_SLICE => e,
        _ => len.max(1),
    };
    let mut out: Vec<Range<usize>> = (0..len).step_by(size).map(|a| a..(a + size).min(len)).collect();
    if out.is_empty() {
        out.push(0..0);
    }
    out
}

/// Chunk `i` of `n` nearly equal chunks of `len` elements (sizes differ by at most one;
/// some are empty when `len < n`).
pub fn chunk_range(len: usize, n: usize, i: usize) -> Range<usize> {
    let at = |k: usize| ((len as u128 * k as u128) / n as u128) as usize;
    at(i)..at(i + 1)
}

/// Two disjoint ranges of one slice (either may be empty), the first to read and the
/// second to write.
pub(crate) fn split_two<T>(data: &mut [T], a: Range<usize>, b: Range<usize>) -> (&[T], &mut [T]) {
    if a.end <= b.start {
        let (lo, hi) = data.split_at_mut(b.start);
        (&lo[a], &mut hi[..b.end - b.start])
    } else {
        debug_assert!(b.end <= a.start, "overlapping chunks {a:?} and {b:?}");
        let (lo, hi) = data.split_at_mut(a.start);
        (&hi[..a.end - a.start], &mut lo[b])
    }
}

/// Adds the elements in `piece` (raw bytes from the wire) into the front of `acc`:
/// a plain loop over slices, which the compiler vectorises.
fn add_into<T: Element>(acc: &mut [T], piece: &[u8]) {
    let n = piece.len() / size_of::<T>();
    for (i, a) in acc[..n].iter_mut().enumerate() {
        // SAFETY: in bounds; read_unaligned because wire bytes carry no alignment promise.
        let v: T = unsafe { std::ptr::read_unaligned(piece.as_ptr().cast::<T>().add(i)) };
        *a = a.sum(v);
    }
}

/// Writes `mine + piece` into `out`, a transport's buffer: the pipelined ring's
/// reduction, one pass over each input.
fn sum_bytes<T: Element>(out: &mut [u8], mine: &[T], piece: &[u8]) {
    // SAFETY: every bit pattern is a valid T (Element's contract); a buffer that is not
    // aligned for T (none of ours) goes through a scratch copy instead.
    match unsafe { out.align_to_mut::<T>() } {
        ([], out, []) => add_from(out, mine, piece),
        _ => {
            let mut tmp = vec![T::default(); piece.len() / size_of::<T>()];
            add_from(&mut tmp, mine, piece);
            out.copy_from_slice(as_bytes(&tmp));
        }
    }
}

/// Keeps a finished piece: copies `from` into the front of `dst`, around the cache when
/// the whole buffer is too large for it (`streaming`).
fn keep(dst: &mut [u8], from: &[u8], streaming: bool) {
    match streaming {
        true => copy_around_cache(&mut dst[..from.len()], from),
        false => dst[..from.len()].copy_from_slice(from),
    }
}

/// Writes `mine + piece` (raw bytes from the wire) into the front of `dst`: the
/// out-of-place reduction, one pass over each input, nothing copied first.
fn add_from<T: Element>(dst: &mut [T], mine: &[T], piece: &[u8]) {
    let n = piece.len() / size_of::<T>();
    for (i, (d, m)) in dst[..n].iter_mut().zip(&mine[..n]).enumerate() {
        // SAFETY: in bounds; read_unaligned because wire bytes carry no alignment promise.
        let v: T = unsafe { std::ptr::read_unaligned(piece.as_ptr().cast::<T>().add(i)) };
        *d = m.sum(v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn add_into_adds_unaligned_bytes() {
        let mut acc = [1.0f32, 2.0, 3.0];
        let mut wire = vec![0u8];
        wire.extend_from_slice(as_bytes(&[10.0f32, 20.0]));
        add_into(&mut acc, &wire[1..]);
        assert_eq!(acc, [11.0, 22.0, 3.0]);
    }
}
