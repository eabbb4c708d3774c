//! The pipelined chain broadcast: NCCL's ring broadcast.

use crate::cpu::Cpu;
use crate::element::Reduction;
use crate::prims::Prims;
use anyhow::Result;
use workbook_runtime::Func;

/// ...and of at least this size, below which a piece costs more in waits than it saves.
const MIN_PIECE: usize = 32 << 10;

/// A broadcast moves in pieces of at most this size, so that each rank forwards one piece
/// while the next one is still arriving (a pipeline).
const PIECE: usize = 512 << 10;

/// Pipelined chain broadcast (NCCL's ring broadcast, `runRing` in `broadcast.h`): the
/// root sends its buffer piece by piece to its right neighbour; every rank keeps each piece
/// and forwards it to the next as soon as it has it, so the pieces flow round the ring like
/// water down a pipe, and the rank before the root only keeps them. Out of place, the root
/// copies each piece into its own buffer while it travels.
pub fn broadcast(cpu: &Cpu, root_src: Option<&[u8]>, buf: &mut [u8], root: usize, red: Reduction) -> Result<()> {
    let (n, r) = (cpu.world(), cpu.rank());
    let pos = (r + n - root) % n;
    // On a chain of three ranks or more, at least 8 pieces, so that a buffer of a few
    // hundred KiB flows down the chain too (one piece would cross one link after the
    // other); at most PIECE each. Two ranks have no chain: smaller pieces only add waits.
    let size = match n {
        ..=2 => PIECE,
        _ => (buf.len() / 8).clamp(MIN_PIECE, PIECE),
    };
    let len = buf.len();
    let mut prims = Prims::new(cpu, Func::Broadcast, root_src, buf, red);
    for start in (0..len).step_by(size.max(1)) {
        let at = start..(start + size).min(len);
        match pos {
            0 => prims.copy_send(at)?,
            _ if pos == n - 1 => prims.recv(at)?,
            _ => prims.recv_copy_send(at)?,
        }
    }
    Ok(())
}
