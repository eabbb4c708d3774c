//! The ring reduce-scatter: the first half of the ring all-reduce.

use crate::cpu::{Cpu, split_two};
use crate::element::Reduction;
use crate::prims;
use anyhow::{Context, Result};
use workbook_runtime::Func;

/// The ring reduce-scatter, the first half of the ring all-reduce: in each of `n - 1`
/// steps a rank sends a partial result to the right and reduces its own block into the
/// partial result arriving from the left. Block `r - 1` leaves rank r first; the partial
/// results go round the ring, each gaining one rank's block per step, and the one that
/// reaches rank r last is block r, reduced over every rank: rank r's result.
///
/// The partial results travel through two working buffers of one block, never through
/// the send buffer: in place, the other blocks of the buffer keep their values, as with
/// NCCL.
pub fn reduce_scatter(cpu: &Cpu, send: Option<&[u8]>, buf: &mut [u8], block: usize, red: Reduction) -> Result<()> {
    let (n, r) = (cpu.world(), cpu.rank());
    let blk = |i: usize| i * block..(i + 1) * block;
    let mut working = cpu.scratch(block);
    let (a, b) = &mut *working;
    let (mut out, mut into) = (&mut a[..block], &mut b[..block]);
    for s in 0..n - 1 {
        let (sent, got) = ((r + 2 * n - s - 1) % n, (r + 2 * n - s - 2) % n);
        let what = || format!("reduce-scatter step {} of {}", s + 1, n - 1);
        if s < n - 2 {
            // Our block `got` is reduced into the partial result arriving from the left.
            let src: &[u8] = send.unwrap_or(&*buf);
            let first = &src[blk(sent)];
            let partial = if s == 0 { first } else { &*out };
            step(cpu, partial, into, Some(&src[blk(got)]), red).with_context(what)?;
            std::mem::swap(&mut out, &mut into);
            continue;
        }
        // The last step: the partial result of block r arrives and becomes ours.
        let result = match send {
            Some(src) => {
                let partial = if s == 0 { &src[blk(sent)] } else { &*out };
                step(cpu, partial, &mut buf[..], Some(&src[blk(r)]), red).with_context(what)?;
                &mut buf[..]
            }
            None if s == 0 => {
                let (partial, dst) = split_two(buf, blk(sent), blk(r));
                step(cpu, partial, dst, None, red).with_context(what)?;
                &mut buf[blk(r)]
            }
            None => {
                step(cpu, out, &mut buf[blk(r)], None, red).with_context(what)?;
                &mut buf[blk(r)]
            }
        };
        red.finish(result, n);
    }
    Ok(())
}

/// One ring step: `partial` goes right while the partial result arriving from the left
/// is reduced with `mine` (or, with `None`, into what `dst` holds: in place) into `dst`.
fn step(cpu: &Cpu, partial: &[u8], dst: &mut [u8], mine: Option<&[u8]>, red: Reduction) -> Result<()> {
    let (prev, next) = cpu.neighbours();
    let what = || {
        let world = |r: usize| cpu.world_rank(r);
        format!(
            "send/recv of {} bytes (from rank {}, to rank {})",
            partial.len(),
            world(prev),
            world(next)
        )
    };
    prims::send_recv_reduce((cpu, Func::ReduceScatter, red, (prev, next)), partial, dst, mine, &what)
}
