//! All-reduce (`ncclAllReduce`): every rank's buffer becomes the element-wise reduction
//! (sum, product, max, min or average) of every rank's buffer.

use super::ring::all_gather_steps;
use super::single_copy::reduce_into;
use super::tuner::Algorithm;
use super::{Collective, DeviceCall, HostCall, Shape, Source, same, whole};
use crate::backend::cpu::{Cpu, Signal, chunk_range, keep, split_two};
use crate::backend::nccl::Nccl;
use crate::element::Reduction;
use crate::record::{self, Dir, How};
use crate::transport::shm::SLOT_BYTES;
use anyhow::{Context, Result};
use cudarc::nccl::sys;

/// All-reduce.
pub const ALL_REDUCE: Collective = Collective {
    name: "all_reduce",
    title: "all-reduce",
    nccl_name: "ncclAllReduce",
    tag: 2,
    rooted: false,
    reduces: true,
    counts: same,
    in_place: whole,
    bus_factor,
    source,
    cpu,
    nccl,
};

/// Each rank sends (and receives) 2(n-1)/n of the buffer: nccl-tests' factor.
fn bus_factor(ranks: usize) -> f64 {
    match ranks {
        0 => 0.0,
        n => 2.0 * (n - 1) as f64 / n as f64,
    }
}

fn source(_: &Shape, _rank: usize, i: usize) -> Source {
    Source::Reduced { index: i }
}

fn nccl(n: &Nccl, c: &DeviceCall) -> Result<()> {
    n.call(c.call(&ALL_REDUCE, "count"), |comm, stream| unsafe {
        sys::ncclAllReduce(c.send, c.recv, c.count, c.datatype, c.op.nccl(), comm, stream)
    })
}

/// Ring all-reduce: reduce-scatter, then all-gather.
///
/// The buffer is cut into `n` chunks. In the reduce-scatter, each of `n - 1` steps sends
/// one chunk right and reduces the chunk arriving from the left into ours; after it, rank
/// r holds the full result of chunk r+1. The all-gather then passes the finished chunks
/// around the ring, `n - 1` steps again, until every rank has every chunk. Each rank
/// sends 2(n-1)/n of the buffer in all: nccl-tests' busbw factor.
///
/// This is the ring step by step, as the lesson draws it ([`ring`]). The tuner
/// ([`super::tuner::choose`]) picks it only over TCP or under `--steps` on two ranks:
/// when every link of the ring shares memory, the same ring runs piece by piece instead
/// ([`pipelined`]), which saves the buffer's partial results; a small buffer skips the
/// ring altogether ([`direct`]), and a large one on one host is read where it lies, in
/// the other ranks' memory ([`single_copy`]).
fn cpu(cpu: &Cpu, call: HostCall) -> Result<()> {
    let HostCall {
        send,
        buf: data,
        reduction: red,
        ..
    } = call;
    let n = cpu.world();
    let algo = cpu.choose(&ALL_REDUCE, data.len());
    if n == 1 {
        cpu.ran(&ALL_REDUCE, data.len(), algo);
        if let Some(src) = send {
            data.copy_from_slice(src);
        }
        red.finish(data, n);
        return Ok(());
    }
    match algo {
        Algorithm::Direct => direct(cpu, send, data, red),
        Algorithm::SingleCopy => single_copy(cpu, send, data, red),
        Algorithm::RingPipelined => pipelined(cpu, send, data, red),
        _ => ring(cpu, send, data, red),
    }
}

/// The ring step by step (see [`cpu`]).
fn ring(cpu: &Cpu, send: Option<&[u8]>, data: &mut [u8], red: Reduction) -> Result<()> {
    let (n, r) = (cpu.world(), cpu.rank());
    let (tag, e) = (ALL_REDUCE.tag, red.elem);
    let (left, right) = cpu.neighbours();
    let count = data.len() / e;
    let chunk = |i: usize| {
        let c = chunk_range(count, n, i);
        c.start * e..c.end * e
    };
    let streaming = cpu.streams(data.len());
    cpu.ran(&ALL_REDUCE, data.len(), Algorithm::Ring);
    record::phase("reduce-scatter");
    for step in 0..n - 1 {
        let t = record::clock();
        let (sent, got) = ((r + n - step) % n, (r + 2 * n - step - 1) % n);
        let (partial, acc) = split_two(data, chunk(sent), chunk(got));
        // Out of place, the first chunk sent and every chunk reduced come from `send`.
        let out = match send {
            Some(src) if step == 0 => &src[chunk(sent)],
            _ => partial,
        };
        let mine = send.map(|src| &src[chunk(got)]);
        cpu.exchange(tag, (out, right), (acc.len(), left), |link, slice| {
            link.recv_pieces(tag, slice.len(), &mut |off, piece| {
                let at = slice.start + off;
                let dst = &mut acc[at..at + piece.len()];
                match mine {
                    Some(mine) => (red.combine)(dst, &mine[at..], piece),
                    None => (red.accumulate)(dst, piece),
                }
            })
        })
        .with_context(|| format!("all-reduce, reduce-scatter step {} of {}", step + 1, n - 1))?;
        record::op(
            t,
            "send/recv",
            &[(Dir::Send, right, out, How::Copy), (Dir::Recv, left, acc, How::Reduce)],
        );
    }
    // Rank r now holds chunk r + 1 finished: average it before it travels.
    let own = chunk((r + 1) % n);
    red.finish(&mut data[own.clone()], n);
    record::wrote(&data[own]);
    all_gather_steps(cpu, tag, data, &chunk, 1, streaming, "all-reduce, all-gather")
}

/// A small all-reduce, direct: every rank sends its whole buffer to every other rank,
/// then reduces the `n` buffers itself, in rank order (0 ⊕ 1 ⊕ 2 …), so every rank gets
/// the same bits. One message time where the ring takes 2(n - 1): for a few bytes the
/// time per message (α) is everything, and the bytes sent (n - 1 buffers instead of
/// 2(n - 1)/n) cost nothing. NCCL makes the same trade with its tree and its LL protocol.
///
/// The sends go first, to every peer: a small message fits the link's buffer (a shared
/// memory slot, a socket's buffer), so no rank waits for another to receive.
fn direct(cpu: &Cpu, src: Option<&[u8]>, data: &mut [u8], red: Reduction) -> Result<()> {
    let (n, r, tag) = (cpu.world(), cpu.rank(), ALL_REDUCE.tag);
    cpu.ran(&ALL_REDUCE, data.len(), Algorithm::Direct);
    for k in 1..n {
        let peer = (r + k) % n;
        let mine = src.unwrap_or(data);
        let t = record::clock();
        cpu.send_tagged(tag, mine, peer)
            .with_context(|| format!("all-reduce: sending this rank's buffer {}", cpu.peer_name(peer)))?;
        record::op(t, "send", &[(Dir::Send, peer, mine, How::Copy)]);
    }
    // In place, rank 0's buffer lands on this rank's own first: keep a copy of it.
    let kept = match (src, r) {
        (None, 1..) => data.to_vec(),
        _ => vec![],
    };
    for from in 0..n {
        let t = record::clock();
        if from == r {
            match (r, src) {
                (0, Some(src)) => data.copy_from_slice(src),
                (0, None) => {} // rank 0's own buffer is where the sum starts
                _ => (red.accumulate)(data, src.unwrap_or(&kept)),
            }
            continue;
        }
        let link = cpu.link(from);
        match from {
            0 => link.recv_into(tag, data),
            // Reduced where it arrives (a shared-memory slot), piece by piece.
            _ => link.recv_pieces(tag, data.len(), &mut |off, piece| {
                (red.accumulate)(&mut data[off..off + piece.len()], piece)
            }),
        }
        .map_err(|e| cpu.lost(e, from))
        .with_context(|| format!("all-reduce: receiving rank {from}'s buffer {}", cpu.peer_name(from)))?;
        let how = if from == 0 { How::Copy } else { How::Reduce };
        record::op(t, "recv", &[(Dir::Recv, from, data, how)]);
    }
    red.finish(data, n);
    Ok(())
}

/// A large all-reduce on one host, single copy: every rank reads the other ranks'
/// buffers where they lie ([`crate::backend::host_memory`]) instead of receiving them.
/// The buffer is cut into `n` chunks, and rank r makes chunk r:
///
/// 1. every rank tells every other where its buffers are;
/// 2. reduce-scatter: rank r reduces chunk r of every rank's buffer into its own, in
///    pieces that stay in the cache (its own ⊕ rank r+1's ⊕ …), then says it is finished;
/// 3. all-gather: rank r copies every other rank's finished chunk into its buffer;
/// 4. each rank tells every other that it is done reading, and leaves once all have.
///
/// Each byte crosses between ranks once per phase, read where it lies, as the ring's
/// 2(n-1)/n of the buffer per rank, but with one copy where a shared slot takes two, and
/// no rank waits for another's steps (with more ranks than cores, whoever runs makes
/// progress). Every chunk is computed once, so every rank holds the same bits. If any
/// rank's buffer is outside its arena, all ranks see it in step 1 and run the ring.
fn single_copy(cpu: &Cpu, src: Option<&[u8]>, data: &mut [u8], red: Reduction) -> Result<()> {
    let (n, r, e, tag) = (cpu.world(), cpu.rank(), red.elem, ALL_REDUCE.tag);
    let others = || (1..n).map(move |k| (r + k) % n);
    let count = data.len() / e;
    let chunk = |i: usize| {
        let c = chunk_range(count, n, i);
        c.start * e..c.end * e
    };
    let len = data.len();
    // (input, result) of every rank, as this rank sees them.
    let Some(theirs) = cpu
        .share_regions(tag, &[src.unwrap_or(data), data], &[len, len])
        .context("all-reduce")?
    else {
        return pipelined(cpu, src, data, red);
    };
    let peer = |p: usize| (theirs[p][0], theirs[p][1]);
    cpu.ran(&ALL_REDUCE, len, Algorithm::SingleCopy);

    record::phase("reduce-scatter");
    let own = chunk(r);
    let t = record::clock();
    let mine = src.map(|s| &s[own.clone()]);
    reduce_into(cpu, &mut data[own.clone()], mine, |p| &peer(p).0[own.clone()], red);
    red.finish(&mut data[own.clone()], n);
    let mine = &data[own.clone()];
    let parts: Vec<_> = others().map(|p| (Dir::Recv, p, mine, How::Reduce)).collect();
    record::op(t, "read", &parts);
    others()
        .try_for_each(|p| cpu.signal(tag, p, Signal::Finished))
        .context("all-reduce, reduce-scatter")?;

    record::phase("all-gather");
    let streaming = cpu.streams(len);
    for p in others() {
        cpu.wait_signal(tag, p, Signal::Finished)
            .context("all-reduce, all-gather")?;
        let t = record::clock();
        let c = chunk(p);
        keep(&mut data[c.clone()], &peer(p).1[c.clone()], streaming);
        record::op(t, "read", &[(Dir::Recv, p, &data[c], How::Copy)]);
    }
    cpu.all_done(tag).context("all-reduce")
}

/// The same ring all-reduce, run piece by piece as NCCL runs it: each chunk is cut into
/// pieces, and piece k of every chunk goes all the way round the ring (all `2(n-1)`
/// steps) before piece k + 1 starts. A piece arriving from the left is reduced straight
/// into the message to the right, so partial results never touch the buffer: only the
/// finished ones are written to it, once. NCCL's names for the steps of one piece:
///
/// - `send`: the first step sends this rank's own piece;
/// - `recvReduceSend` (n - 2 times): partial result in, ours reduced in, out to the right;
/// - `recvReduceCopySend`: the last reduction: the full result, kept and passed on;
/// - `recvCopySend` (n - 2 times): a finished result, kept and passed on;
/// - `recv`: the last finished result, kept.
///
/// Only for rings whose every link buffers a few pieces (shared memory): a rank sends
/// before it receives, so each link must hold a piece while its receiver is busy. (A TCP
/// socket promises to hold only a little; NCCL gives its network links a helper thread
/// for that, which this backend does not have.)
fn pipelined(cpu: &Cpu, src: Option<&[u8]>, data: &mut [u8], red: crate::element::Reduction) -> Result<()> {
    let (n, r, e, tag) = (cpu.world(), cpu.rank(), red.elem, ALL_REDUCE.tag);
    let (left, right) = cpu.neighbours();
    let count = data.len() / e;
    let per = (SLOT_BYTES / e).max(1);
    let longest = (0..n).map(|c| chunk_range(count, n, c).len()).max().unwrap_or(0);
    let streaming = cpu.streams(data.len());
    cpu.ran(&ALL_REDUCE, data.len(), Algorithm::RingPipelined);
    for k in 0..longest.div_ceil(per).max(1) {
        // Piece k of chunk c, in bytes (chunks differ by one element at most: a last
        // piece may be empty).
        let piece = |c: usize| {
            let chunk = chunk_range(count, n, c % n);
            let start = (chunk.start + k * per).min(chunk.end);
            start * e..(start + per).min(chunk.end) * e
        };
        let step = |what: &str| format!("all-reduce, piece {k}: {what}");
        // Reduce-scatter: our own piece of chunk r goes right...
        record::phase("reduce-scatter");
        let own = piece(r);
        let first = src.map_or(&data[own.clone()], |src| &src[own]);
        let t = record::clock();
        cpu.send_tagged(tag, first, right).with_context(|| step("send"))?;
        record::op(t, "send", &[(Dir::Send, right, first, How::Copy)]);
        // ...then each partial result arriving from the left gets ours reduced in and goes on.
        for s in 0..n - 2 {
            let p = piece(r + 2 * n - s - 1);
            let mine = src.map_or(&data[p.clone()], |src| &src[p]);
            let t = record::clock();
            cpu.recv_then_send(tag, (left, right), mine.len(), |out, off, inp| {
                (red.combine)(out, &mine[off..], inp)
            })
            .with_context(|| step("recvReduceSend"))?;
            let part = [
                (Dir::Recv, left, mine, How::Partial),
                (Dir::Send, right, mine, How::Partial),
            ];
            record::op(t, "recvReduceSend", &part);
        }
        // The last reduction makes the full result of chunk r + 1: passed on, and kept.
        let p = piece(r + 1);
        let t = record::clock();
        cpu.recv_then_send(tag, (left, right), p.len(), |out, off, inp| {
            let at = p.start + off..p.end;
            let mine = src.map_or(&data[at.clone()], |src| &src[at.clone()]);
            (red.combine)(out, mine, inp);
            red.finish(out, n);
            keep(&mut data[at], out, streaming);
        })
        .with_context(|| step("recvReduceCopySend"))?;
        let done = &data[p];
        record::op(
            t,
            "recvReduceCopySend",
            &[
                (Dir::Recv, left, done, How::Reduce),
                (Dir::Send, right, done, How::Copy),
            ],
        );
        record::phase("all-gather");
        // All-gather: each finished result arriving from the left is kept and passed on...
        for s in 0..n - 2 {
            let dst = &mut data[piece(r + n - s)];
            let t = record::clock();
            cpu.recv_then_send(tag, (left, right), dst.len(), |out, off, inp| {
                out.copy_from_slice(inp);
                keep(&mut dst[off..], inp, streaming);
            })
            .with_context(|| step("recvCopySend"))?;
            record::op(
                t,
                "recvCopySend",
                &[(Dir::Recv, left, dst, How::Copy), (Dir::Send, right, dst, How::Copy)],
            );
        }
        // ...and the last one only kept.
        let dst = &mut data[piece(r + 2)];
        let t = record::clock();
        match streaming {
            true => cpu.link(left).recv_into_streaming(tag, dst),
            false => cpu.link(left).recv_into(tag, dst),
        }
        .map_err(|e| cpu.lost(e, left))
        .with_context(|| step("recv"))?;
        record::op(t, "recv", &[(Dir::Recv, left, dst, How::Copy)]);
    }
    Ok(())
}
