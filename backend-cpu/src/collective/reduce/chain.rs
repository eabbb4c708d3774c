//! The chain reduce: NCCL's ring reduce, the broadcast's chain run backwards.

use crate::cpu::Cpu;
use crate::element::Reduction;
use crate::record::{self, Dir, How};
use anyhow::{Context, Result};
use workbook_runtime::Func;

/// The chain moves in pieces of this size, each reduced as it passes.
const PIECE: usize = 512 << 10;

/// The broadcast's chain run backwards, as NCCL's ring reduce does: it starts at the rank
/// after the root, and each rank reduces its own piece into what arrives from the left and
/// passes it right, until the root receives the last partial result and adds its own.
/// Partial results live only in the links: no rank's buffer but the root's is written.
pub fn reduce(cpu: &Cpu, send: Option<&[u8]>, buf: &mut [u8], root: usize, red: Reduction) -> Result<()> {
    let (n, r, tag) = (cpu.world(), cpu.rank(), Func::Reduce.tag());
    let (left, right) = cpu.neighbours();
    let pos = (r + 2 * n - root - 1) % n; // 0 after the root, ..., n - 1 on the root
    let len = buf.len();
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
