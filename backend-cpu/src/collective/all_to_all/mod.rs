//! All-to-all: every rank's buffer is `n` blocks of `count` elements; block j of rank i
//! goes to rank j, where it lands as block i. NCCL has no call for it: programs (and
//! nccl-tests' `alltoall`) group one `ncclSend` and one `ncclRecv` per peer.
//!
//! Its algorithms on the CPU backend, one file each, and their table: a small buffer
//! [`direct`], every block straight to its rank; else the [`pairwise`] exchange, `n - 1`
//! steps, or on one host each rank copies its blocks straight from the others' send
//! buffers ([`single_copy`]). This rank's own block is a copy (`own_block`).

pub mod direct;
pub mod pairwise;
pub mod single_copy;

use super::{HostCall, Row, always, reads_peers, small};
use crate::cpu::{Cpu, keep};
use crate::element::Reduction;
use crate::record;
use crate::tuner::Algorithm;

/// All-to-all's algorithms, as the tuner weighs them ([`crate::tuner::choose`]).
pub const ALGORITHMS: &[Row] = &[
    Row {
        algorithm: Algorithm::Direct,
        label: "direct: every block straight to its rank, all the sends first (a small message)",
        can: small,
        // Every send goes before the first receive: in place, nothing need go aside.
        run: |cpu, c| {
            let block = own_block(cpu, &c.send, c.buf, c.count * c.elem());
            direct::all_to_all(cpu, c.send, c.buf, block, c.reduction)
        },
    },
    Row {
        algorithm: Algorithm::SingleCopy,
        label: "single-copy: every rank copies its block of every other rank's send buffer",
        can: reads_peers,
        run: |cpu, c| with_input(cpu, c, single_copy::all_to_all),
    },
    Row {
        algorithm: Algorithm::Pairwise,
        label: "pairwise: at step s each rank sends to rank + s and receives from rank - s",
        can: always,
        run: |cpu, c| with_input(cpu, c, pairwise::all_to_all),
    },
];

/// Puts this rank's own block (`block` bytes) where it belongs in `buf`, out of place
/// (in place it is there already); returns `block`.
fn own_block(cpu: &Cpu, send: &Option<&[u8]>, buf: &mut [u8], block: usize) -> usize {
    let r = cpu.rank();
    let own = r * block..(r + 1) * block;
    if let Some(s) = send {
        // A buffer larger than the caches is written around them (nothing reads it back soon).
        let streaming = cpu.streams(buf.len());
        keep(&mut buf[own.clone()], &s[own.clone()], streaming);
    }
    record::wrote(&buf[own]);
    block
}

/// An all-to-all algorithm on the blocks to send, the receive buffer, the block's bytes.
type Blocks = fn(&Cpu, &[u8], &mut [u8], usize, Reduction) -> anyhow::Result<()>;

/// Runs `algo` on the blocks to send (`src`) and the receive buffer, once this rank's own
/// block is in place. Blocks leave while others arrive: in place, the blocks to send are
/// put aside first, since the receives overwrite them (the copy aside lies in the arena
/// too when it is large, [`Cpu::scratch`]).
fn with_input(cpu: &Cpu, c: HostCall, algo: Blocks) -> anyhow::Result<()> {
    let (n, r) = (cpu.world(), cpu.rank());
    let block = own_block(cpu, &c.send, c.buf, c.count * c.elem());
    let streaming = cpu.streams(c.buf.len());
    let buf = c.buf;
    let blk = |i: usize| i * block..(i + 1) * block;
    let mut aside = None;
    let src: &[u8] = match c.send {
        Some(s) => s,
        None => {
            let mut guard = cpu.scratch(buf.len());
            for i in (0..n).filter(|&i| i != r) {
                keep(&mut guard.0[blk(i)], &buf[blk(i)], streaming);
            }
            &aside.insert(guard).0[..buf.len()]
        }
    };
    algo(cpu, src, buf, block, c.reduction)
}
