//! The double binary tree all-reduce: NCCL's Tree.

use crate::collective::tree::{self, Tree};
use crate::cpu::Cpu;
use crate::element::Reduction;
use crate::prims::{Prims, Src};
use anyhow::Result;
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
    let trees = tree::trees(cpu.nodes(), cpu.rank());
    let pieces = pieces(data.len(), red.elem);
    let mut prims = Prims::new(cpu, Func::AllReduce, send, data, red);
    // No phases for --steps: while one tree comes down, the other may still go up on
    // another rank, so the steps are numbered over the whole collective.
    for (t, at) in in_turn(&pieces) {
        up(&mut prims, &trees[t], at.clone(), red, cpu.world())?;
    }
    for (t, at) in in_turn(&pieces) {
        down(&mut prims, &trees[t], at.clone())?;
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

/// The pieces of both trees, the first tree's then the second's: `(tree, bytes)`.
fn in_turn(pieces: &[Vec<Range<usize>>; 2]) -> impl Iterator<Item = (usize, &Range<usize>)> {
    (0..2).flat_map(move |t| pieces[t].iter().map(move |at| (t, at)))
}

/// One piece up a tree: the children's partial results reduced into this rank's
/// elements, then sent to the parent (or, at the root, finished).
fn up(prims: &mut Prims, tree: &Tree, at: Range<usize>, red: Reduction, n: usize) -> Result<()> {
    for (j, &child) in tree.down.iter().enumerate() {
        match j {
            // The first child's partial result and this rank's own elements.
            0 => prims.recv_reduce_copy_from(child, at.clone())?,
            _ => prims.recv_reduce_from(child, at.clone())?,
        }
    }
    // A leaf sends its own elements, as they are; an inner rank its partial result, which
    // it keeps (the finished piece overwrites it on the way down).
    let from = if tree.down.is_empty() { Src::Input } else { Src::Output };
    match tree.up {
        Some(parent) => prims.send_to(parent, from, at),
        // The root: the piece is finished (ncclAvg divides it here, once).
        None => {
            red.finish(&mut prims.output()[at], n);
            Ok(())
        }
    }
}

/// One piece down a tree: the finished piece from the parent, passed to the children.
fn down(prims: &mut Prims, tree: &Tree, at: Range<usize>) -> Result<()> {
    if let Some(parent) = tree.up {
        prims.recv_from(parent, at.clone())?;
    }
    for &child in &tree.down {
        prims.send_to(child, Src::Output, at.clone())?;
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
