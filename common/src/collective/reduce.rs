//! Reduce (`ncclReduce`): the element-wise reduction of every rank's buffer, on the root
//! only. The other ranks' receive buffers are not written.

use super::tuner::Algorithm;
use super::{Collective, DeviceCall, HostCall, Shape, Source, once, same, whole};
use crate::backend::cpu::Cpu;
use crate::backend::nccl::Nccl;
use crate::record::{self, Dir, How};
use anyhow::{Context, Result};
use cudarc::nccl::sys;

/// Reduce.
pub const REDUCE: Collective = Collective {
    name: "reduce",
    title: "reduce",
    nccl_name: "ncclReduce",
    tag: 3,
    rooted: true,
    reduces: true,
    counts: same,
    in_place: whole,
    bus_factor: once,
    source,
    cpu,
    nccl,
};

/// The chain moves in pieces of this size, each reduced as it passes.
const PIECE: usize = 512 << 10;

fn source(shape: &Shape, rank: usize, i: usize) -> Source {
    match rank == shape.root {
        true => Source::Reduced { index: i },
        false => Source::Unchanged,
    }
}

fn nccl(n: &Nccl, c: &DeviceCall) -> Result<()> {
    n.call(c.call(&REDUCE, "count"), |comm, stream| unsafe {
        sys::ncclReduce(c.send, c.recv, c.count, c.datatype, c.op.nccl(), c.root, comm, stream)
    })
}

/// The broadcast's chain run backwards, as NCCL's ring reduce does: it starts at the rank
/// after the root, and each rank reduces its own piece into what arrives from the left and
/// passes it right, until the root receives the last partial result and adds its own.
/// Partial results live only in the links: no rank's buffer but the root's is written.
fn cpu(cpu: &Cpu, call: HostCall) -> Result<()> {
    let HostCall {
        send,
        buf,
        root,
        reduction: red,
        ..
    } = call;
    let (n, r, tag) = (cpu.world(), cpu.rank(), REDUCE.tag);
    let (left, right) = cpu.neighbours();
    let pos = (r + 2 * n - root - 1) % n; // 0 after the root, ..., n - 1 on the root
    let len = buf.len();
    // The chain is reduce's one algorithm: the tuner has nothing else to choose.
    let algo = cpu.choose(&REDUCE, len);
    debug_assert_eq!(algo, Algorithm::Chain);
    cpu.ran(&REDUCE, len, algo);
    if n == 1 {
        if let Some(src) = send {
            buf.copy_from_slice(src);
        }
        red.finish(buf, n);
        return Ok(());
    }
    for (i, start) in (0..len.max(1)).step_by(PIECE).enumerate() {
        let at = start..(start + PIECE).min(len);
        let step = |what: &str, peer: usize| format!("reduce to rank {root}: {what} piece {i} {}", cpu.peer_name(peer));
        if pos == n - 1 {
            // The root: the last partial result arrives, ours is reduced into it, and
            // the finished piece is ours.
            let dst = &mut buf[at.clone()];
            let mine = send.map(|s| &s[at.clone()]);
            let t = record::clock();
            cpu.link(left)
                .recv_pieces(tag, dst.len(), &mut |off, piece| {
                    let out = &mut dst[off..off + piece.len()];
                    match mine {
                        Some(mine) => (red.combine)(out, &mine[off..], piece),
                        None => (red.accumulate)(out, piece),
                    }
                })
                .map_err(|e| cpu.lost(e, left))
                .with_context(|| step("receiving", left))?;
            red.finish(dst, n);
            record::op(t, "recv", &[(Dir::Recv, left, dst, How::Reduce)]);
            continue;
        }
        let mine = send.map_or(&buf[at.clone()], |s| &s[at.clone()]);
        let t = record::clock();
        if pos == 0 {
            cpu.send_tagged(tag, mine, right)
                .with_context(|| step("sending", right))?;
            record::op(t, "send", &[(Dir::Send, right, mine, How::Copy)]);
        } else {
            cpu.recv_then_send(tag, (left, right), mine.len(), |out, off, inp| {
                (red.combine)(out, &mine[off..], inp)
            })
            .with_context(|| step("passing on", right))?;
            let parts = [
                (Dir::Recv, left, mine, How::Partial),
                (Dir::Send, right, mine, How::Partial),
            ];
            record::op(t, "recvReduceSend", &parts);
        }
    }
    Ok(())
}
