//! The double binary tree all-reduce: NCCL's Tree.

use crate::collective::tree::{self, Tree};
use crate::cpu::Cpu;
use crate::element::Reduction;
use crate::record::{self, Dir, How};
use crate::tuner::Algorithm;
use anyhow::{Context, Result};
use std::ops::Range;
use workbook_runtime::Func;

/// Each tree's half moves in pieces of at most this size...
const PIECE: usize = 512 << 10;
/// ...and at least this size, below which a piece costs more in waits than it saves.
const MIN_PIECE: usize = 32 << 10;

/// The double binary tree ([`tree::trees`]), as NCCL's Tree runs an all-reduce
/// (`runTreeUpDown`): the buffer is split in two halves, one per tree. Up each tree, every
/// rank receives its children's partial results, reduces its own elements into them and
/// sends the sum to its parent, piece by piece, until the root holds the finished piece;
/// then down the same tree, every rank receives the finished piece from its parent and
/// passes it to its children. Latency: about 2·log₂(nodes) message times (plus the chains
/// inside the nodes), against the ring's 2(n − 1); every rank sends its half to one parent
/// and the whole to its children, so its bandwidth is at most the ring's.
///
/// NCCL runs the two trees at once, each on channels of its own; here one thread runs
/// them one after the other: the first tree up, piece by piece, then the second, then
/// both down. The same order on every rank, so that no rank waits for one that waits for
/// it (a piece that one child has sent waits in the link until its parent has taken the
/// other child's). Taking the trees a piece of each in turn instead would tie them: the
/// first tree's root, an inner rank of the second, would pass the second tree's piece on
/// only after the first tree's had come all the way up, and every piece would pay the
/// whole depth's latency (measured on 8 emulated nodes over `--link 500us,10Gbps`: 4.5
/// times slower at 1 MiB).
pub fn all_reduce(cpu: &Cpu, send: Option<&[u8]>, data: &mut [u8], red: Reduction) -> Result<()> {
    let (n, r) = (cpu.world(), cpu.rank());
    cpu.ran(Func::AllReduce, data.len(), Algorithm::Tree);
    let trees = tree::trees(cpu.nodes(), r);
    let pieces = pieces(data.len(), red.elem);
    // No phases for --steps: while one tree comes down, the other may still go up on
    // another rank, so the steps are numbered over the whole collective.
    for (i, at) in in_turn(&pieces) {
        up(cpu, &trees[at.0], at.0, i, send, data, at.1.clone(), red, n)?;
    }
    for (i, at) in in_turn(&pieces) {
        down(cpu, &trees[at.0], at.0, i, data, at.1.clone())?;
    }
    Ok(())
}

/// Each tree's pieces: tree 0 takes the first half of the elements (the larger, if they
/// are odd), tree 1 the rest; each half is cut into pieces of whole elements, at least 8
/// where the half allows, between [`MIN_PIECE`] and [`PIECE`].
fn pieces(len: usize, elem: usize) -> [Vec<Range<usize>>; 2] {
    let elems = len / elem;
    let cut = elems.div_ceil(2) * elem;
    [0..cut, cut..len].map(|half| {
        let size = (half.len() / 8).clamp(MIN_PIECE, PIECE).next_multiple_of(elem);
        (half.start..half.end)
            .step_by(size)
            .map(|s| s..(s + size).min(half.end))
            .collect()
    })
}

/// The pieces of both trees, the first tree's then the second's: `(piece number, (tree,
/// bytes))`.
fn in_turn(pieces: &[Vec<Range<usize>>; 2]) -> Vec<(usize, (usize, &Range<usize>))> {
    (0..2)
        .flat_map(|t| pieces[t].iter().enumerate().map(move |(i, at)| (i, (t, at))))
        .collect()
}

/// One piece up tree `t`: the children's partial results reduced into this rank's
/// elements, then sent to the parent (or, at the root, finished).
#[allow(clippy::too_many_arguments)]
fn up(
    cpu: &Cpu,
    tree: &Tree,
    t: usize,
    i: usize,
    send: Option<&[u8]>,
    data: &mut [u8],
    at: Range<usize>,
    red: Reduction,
    n: usize,
) -> Result<()> {
    let tag = Func::AllReduce.tag();
    let step = |what: &str, peer: usize| format!("all-reduce, tree {t} up: {what} piece {i} {}", cpu.peer_name(peer));
    let mine = send.map(|s| &s[at.clone()]);
    let dst = &mut data[at];
    for (j, &child) in tree.down.iter().enumerate() {
        let t0 = record::clock();
        cpu.link(child)
            .recv_pieces(tag, dst.len(), &mut |off, piece| {
                let out = &mut dst[off..off + piece.len()];
                match (j, mine) {
                    // The first child's partial result and this rank's own elements.
                    (0, Some(mine)) => (red.combine)(out, &mine[off..off + piece.len()], piece),
                    _ => (red.accumulate)(out, piece),
                }
            })
            .map_err(|e| cpu.lost(e, child))
            .with_context(|| step("receiving", child))?;
        record::op(t0, "recv", &[(Dir::Recv, child, dst, How::Reduce)]);
    }
    // A leaf sends its own elements, as they are; an inner rank its partial result, which
    // it keeps (the finished piece overwrites it on the way down).
    let out: &[u8] = match (tree.down.is_empty(), mine) {
        (true, Some(mine)) => mine,
        _ => dst,
    };
    match tree.up {
        Some(parent) => {
            let t0 = record::clock();
            cpu.send_tagged(tag, out, parent)
                .with_context(|| step("sending", parent))?;
            record::op(t0, "send", &[(Dir::Send, parent, out, How::Copy)]);
        }
        // The root: the piece is finished (ncclAvg divides it here, once).
        None => red.finish(dst, n),
    }
    Ok(())
}

/// One piece down tree `t`: the finished piece from the parent, passed to the children.
fn down(cpu: &Cpu, tree: &Tree, t: usize, i: usize, data: &mut [u8], at: Range<usize>) -> Result<()> {
    let tag = Func::AllReduce.tag();
    let step = |what: &str, peer: usize| format!("all-reduce, tree {t} down: {what} piece {i} {}", cpu.peer_name(peer));
    let piece = &mut data[at];
    if let Some(parent) = tree.up {
        let t0 = record::clock();
        cpu.link(parent)
            .recv_into(tag, piece)
            .map_err(|e| cpu.lost(e, parent))
            .with_context(|| step("receiving", parent))?;
        record::op(t0, "recv", &[(Dir::Recv, parent, piece, How::Copy)]);
    }
    for &child in &tree.down {
        let t0 = record::clock();
        cpu.send_tagged(tag, piece, child)
            .with_context(|| step("sending", child))?;
        record::op(t0, "send", &[(Dir::Send, child, piece, How::Copy)]);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_halves_and_their_pieces_cover_the_buffer_in_whole_elements() {
        for (len, elem) in [(0, 4), (4, 4), (12, 4), (8 << 20, 8), ((1 << 20) + 6, 2), (100, 1)] {
            let p = pieces(len, elem);
            let all: Vec<&Range<usize>> = p[0].iter().chain(&p[1]).collect();
            let mut at = 0;
            for r in &all {
                assert_eq!(r.start, at, "{len}/{elem}");
                assert_eq!(r.start % elem, 0);
                at = r.end;
            }
            assert_eq!(at, len, "{len}/{elem}: {p:?}");
        }
        // 8 MiB: 4 MiB per tree, in 8 pieces each of 512 KiB.
        assert_eq!(pieces(8 << 20, 4).map(|h| h.len()), [8, 8]);
    }
}
