//! The ring all-reduce run piece by piece, as NCCL runs its ring.

use crate::cpu::{Cpu, chunk_range};
use crate::element::Reduction;
use crate::prims::Prims;
use crate::transport::shm::SLOT_BYTES;
use anyhow::Result;
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
pub fn all_reduce(cpu: &Cpu, send: Option<&[u8]>, data: &mut [u8], red: Reduction) -> Result<()> {
    let (n, r, e) = (cpu.world(), cpu.rank(), red.elem);
    let count = data.len() / e;
    let per = (SLOT_BYTES / e).max(1);
    let longest = (0..n).map(|c| chunk_range(count, n, c).len()).max().unwrap_or(0);
    let mut prims = Prims::new(cpu, Func::AllReduce, send, data, red);
    for k in 0..longest.div_ceil(per).max(1) {
        // Piece k of chunk c, in bytes (chunks differ by one element at most: a last
        // piece may be empty).
        let piece = |c: usize| {
            let chunk = chunk_range(count, n, c % n);
            let start = (chunk.start + k * per).min(chunk.end);
            start * e..(start + per).min(chunk.end) * e
        };
        prims.phase("reduce-scatter");
        // Step 0: our own piece of chunk r goes right.
        prims.send(piece(r))?;
        // n - 2 steps: reduce and pass on.
        for j in 2..n {
            prims.recv_reduce_send(piece(r + n + 1 - j))?;
        }
        // Step n - 1: the last reduction makes the result of chunk r + 1: kept, passed on.
        prims.recv_reduce_copy_send(piece(r + 1))?;
        prims.phase("all-gather");
        // n - 2 steps: a finished result, kept and passed on.
        for j in 1..n - 1 {
            prims.recv_copy_send(piece(r + n + 1 - j))?;
        }
        // The last finished result, kept.
        prims.recv(piece(r + 2))?;
    }
    Ok(())
}
