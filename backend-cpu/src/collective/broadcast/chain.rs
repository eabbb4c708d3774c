//! The pipelined chain broadcast: NCCL's ring broadcast.

use crate::cpu::{Cpu, keep};
use crate::record::{self, Dir, How};
use crate::tuner::Algorithm;
use anyhow::{Context, Result};
use workbook_runtime::Func;

/// ...and of at least this size, below which a piece costs more in waits than it saves.
const MIN_PIECE: usize = 32 << 10;

/// A broadcast moves in pieces of at most this size, so that each rank forwards one piece
/// while the next one is still arriving (a pipeline).
const PIECE: usize = 512 << 10;

/// Pipelined chain broadcast (NCCL's ring broadcast): the root sends its buffer piece by
/// piece to its right neighbour; every rank forwards each piece to the next as soon as it
/// has it, so the pieces flow round the ring like water down a pipe. Out of place, the
/// root sends from `root_src` and copies each piece into its own buffer after sending
/// it, while the piece travels.
pub fn broadcast(cpu: &Cpu, root_src: Option<&[u8]>, buf: &mut [u8], root: usize) -> Result<()> {
    let (n, r) = (cpu.world(), cpu.rank());
    let pos = (r + n - root) % n;
    let (left, right) = cpu.neighbours();
    let streaming = cpu.streams(buf.len());
    let tag = Func::Broadcast.tag();
    cpu.ran(Func::Broadcast, buf.len(), Algorithm::Chain);
    // On a chain of three ranks or more, at least 8 pieces, so that a buffer of a few
    // hundred KiB flows down the chain too (one piece would cross one link after the
    // other); at most PIECE each. Two ranks have no chain: smaller pieces only add waits.
    let size = match n {
        ..=2 => PIECE,
        _ => (buf.len() / 8).clamp(MIN_PIECE, PIECE),
    };
    for (i, piece) in buf.chunks_mut(size).enumerate() {
        let at =
            |what: &str, peer: usize| format!("broadcast from rank {root}: {what} piece {i} {}", cpu.peer_name(peer));
        if pos > 0 {
            let t = record::clock();
            let link = cpu.link(left);
            match streaming && pos == n - 1 {
                // The last rank of the chain only stores what it receives.
                true => link.recv_into_streaming(tag, piece),
                false => link.recv_into(tag, piece),
            }
            .map_err(|e| cpu.lost(e, left))
            .with_context(|| at("receiving", left))?;
            record::op(t, "recv", &[(Dir::Recv, left, piece, How::Copy)]);
        }
        let mine = root_src.map(|s| &s[i * size..][..piece.len()]);
        if pos < n - 1 {
            let t = record::clock();
            let out = mine.unwrap_or(piece);
            cpu.send_tagged(tag, out, right).with_context(|| at("sending", right))?;
            record::op(t, "send", &[(Dir::Send, right, out, How::Copy)]);
        }
        if let Some(mine) = mine {
            keep(piece, mine, streaming);
            record::wrote(piece);
        }
    }
    Ok(())
}
