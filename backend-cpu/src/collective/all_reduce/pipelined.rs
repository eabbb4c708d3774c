//! The ring all-reduce run piece by piece, as NCCL runs its ring.

use crate::cpu::{Cpu, chunk_range, keep};
use crate::record::{self, Dir, How};
use crate::transport::shm::SLOT_BYTES;
use crate::tuner::Algorithm;
use anyhow::{Context, Result};
use workbook_runtime::Func;

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
pub fn all_reduce(cpu: &Cpu, src: Option<&[u8]>, data: &mut [u8], red: crate::element::Reduction) -> Result<()> {
    let (n, r, e, tag) = (cpu.world(), cpu.rank(), red.elem, Func::AllReduce.tag());
    let (left, right) = cpu.neighbours();
    let count = data.len() / e;
    let per = (SLOT_BYTES / e).max(1);
    let longest = (0..n).map(|c| chunk_range(count, n, c).len()).max().unwrap_or(0);
    let streaming = cpu.streams(data.len());
    cpu.ran(Func::AllReduce, data.len(), Algorithm::RingPipelined);
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
