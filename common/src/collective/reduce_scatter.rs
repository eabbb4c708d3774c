//! Reduce-scatter (`ncclReduceScatter`): every rank contributes `n × count` elements;
//! rank i receives block i of their element-wise reduction (`count` elements).

use super::single_copy::reduce_into;
use super::tuner::Algorithm;
use super::{Collective, DeviceCall, HostCall, Shape, Source, all_but_own};
use crate::backend::cpu::{Cpu, split_two};
use crate::backend::nccl::Nccl;
use crate::element::Reduction;
use anyhow::{Context, Result};
use cudarc::nccl::sys;

/// Reduce-scatter.
pub const REDUCE_SCATTER: Collective = Collective {
    name: "reduce_scatter",
    title: "reduce-scatter",
    nccl_name: "ncclReduceScatter",
    tag: 5,
    rooted: false,
    reduces: true,
    counts: |count, ranks| (ranks * count, count),
    // NCCL's in-place reduce-scatter: recvbuff == sendbuff + rank × count.
    in_place: |count, _ranks, rank| (0, rank * count),
    bus_factor: all_but_own,
    source,
    cpu,
    nccl,
};

fn source(shape: &Shape, rank: usize, i: usize) -> Source {
    Source::Reduced {
        index: rank * shape.count + i,
    }
}

fn nccl(n: &Nccl, c: &DeviceCall) -> Result<()> {
    n.call(c.call(&REDUCE_SCATTER, "recvcount"), |comm, stream| unsafe {
        sys::ncclReduceScatter(c.send, c.recv, c.count, c.datatype, c.op.nccl(), comm, stream)
    })
}

/// The ring reduce-scatter, the first half of the ring all-reduce: in each of `n - 1`
/// steps a rank sends a partial result to the right and reduces its own block into the
/// partial result arriving from the left. Block `r - 1` leaves rank r first; the partial
/// results go round the ring, each gaining one rank's block per step, and the one that
/// reaches rank r last is block r, reduced over every rank: rank r's result.
///
/// The partial results travel through two working buffers of one block, never through
/// the send buffer: in place, the other blocks of the buffer keep their values, as with
/// NCCL. On one host, when the tuner says so ([`super::tuner::choose`]), each rank reduces
/// its block straight from the others' buffers instead ([`single_copy`]).
fn cpu(cpu: &Cpu, call: HostCall) -> Result<()> {
    let block = call.count * call.elem();
    let (n, r) = (cpu.world(), cpu.rank());
    let HostCall {
        send,
        buf,
        reduction: red,
        ..
    } = call;
    let blk = |i: usize| i * block..(i + 1) * block;
    let algo = cpu.choose(&REDUCE_SCATTER, n * block);
    if n == 1 {
        cpu.ran(&REDUCE_SCATTER, n * block, algo);
        if let Some(src) = send {
            buf.copy_from_slice(&src[blk(0)]);
        }
        red.finish(buf, n);
        return Ok(());
    }
    if algo == Algorithm::SingleCopy {
        let input = send.unwrap_or(&*buf);
        let tag = REDUCE_SCATTER.tag;
        if let Some(theirs) = cpu
            .share_regions(tag, &[input], &[n * block])
            .context("reduce-scatter")?
        {
            return single_copy(cpu, send, buf, block, &theirs, red);
        }
    }
    cpu.ran(&REDUCE_SCATTER, n * block, Algorithm::Ring);
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

/// A large reduce-scatter on one host, single copy: every rank has told the others where
/// its send buffer lies (`theirs`, [`Cpu::share_regions`]); rank r reduces block r of
/// every rank's straight from their memory into its result (in place, its own block r,
/// which no other rank reads), then all say they are done reading.
fn single_copy(
    cpu: &Cpu,
    send: Option<&[u8]>,
    buf: &mut [u8],
    block: usize,
    theirs: &[Vec<&[u8]>],
    red: Reduction,
) -> Result<()> {
    use crate::record::{self, Dir, How};
    let (n, r) = (cpu.world(), cpu.rank());
    let mine = r * block..(r + 1) * block;
    cpu.ran(&REDUCE_SCATTER, n * block, Algorithm::SingleCopy);
    let t = record::clock();
    let result = match send {
        Some(_) => &mut buf[..],
        None => &mut buf[mine.clone()],
    };
    let own = send.map(|s| &s[mine.clone()]);
    reduce_into(cpu, result, own, |p| &theirs[p][0][mine.clone()], red);
    red.finish(result, n);
    let parts: Vec<_> = (1..n)
        .map(|k| (Dir::Recv, (r + k) % n, &*result, How::Reduce))
        .collect();
    record::op(t, "read", &parts);
    cpu.all_done(REDUCE_SCATTER.tag).context("reduce-scatter")
}

/// One ring step: `partial` goes right while the partial result arriving from the left
/// is reduced with `mine` (or, with `None`, into what `dst` holds: in place) into `dst`.
fn step(cpu: &Cpu, partial: &[u8], dst: &mut [u8], mine: Option<&[u8]>, red: Reduction) -> Result<()> {
    let tag = REDUCE_SCATTER.tag;
    let (left, right) = cpu.neighbours();
    let t = crate::record::clock();
    cpu.exchange(tag, (partial, right), (partial.len(), left), |link, slice| {
        link.recv_pieces(tag, slice.len(), &mut |off, piece| {
            let at = slice.start + off;
            let out = &mut dst[at..at + piece.len()];
            match mine {
                Some(mine) => (red.combine)(out, &mine[at..], piece),
                None => (red.accumulate)(out, piece),
            }
        })
    })?;
    use crate::record::{Dir, How};
    crate::record::op(
        t,
        "send/recv",
        &[
            (Dir::Send, right, partial, How::Copy),
            (Dir::Recv, left, dst, How::Reduce),
        ],
    );
    Ok(())
}
