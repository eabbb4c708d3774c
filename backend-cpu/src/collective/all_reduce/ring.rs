//! The ring all-reduce, step by step, as lesson 02 draws it.

use crate::collective::ring::all_gather_steps;
use crate::cpu::{Cpu, chunk_range, split_two};
use crate::element::Reduction;
use crate::record::{self, Dir, How};
use crate::tuner::Algorithm;
use anyhow::{Context, Result};
use workbook_runtime::Func;

/// The ring all-reduce step by step: reduce-scatter, then all-gather, `n - 1` steps each
/// (the choice between the all-reduce's algorithms: [`super`]).
pub fn all_reduce(cpu: &Cpu, send: Option<&[u8]>, data: &mut [u8], red: Reduction) -> Result<()> {
    let (n, r) = (cpu.world(), cpu.rank());
    let (tag, e) = (Func::AllReduce.tag(), red.elem);
    let (left, right) = cpu.neighbours();
    let count = data.len() / e;
    let chunk = |i: usize| {
        let c = chunk_range(count, n, i);
        c.start * e..c.end * e
    };
    let streaming = cpu.streams(data.len());
    cpu.ran(Func::AllReduce, data.len(), Algorithm::Ring);
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
