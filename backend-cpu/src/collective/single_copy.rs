//! What the single-copy algorithms share (each collective's own algorithm lives in its
//! file, as the ring's shared steps live in `ring.rs`): on one host, a rank reads the
//! other ranks' buffers where they lie ([`crate::host_memory`]) instead of
//! receiving them, and reduces straight from them.

use crate::cpu::Cpu;
use crate::element::Reduction;

/// A reduction runs in pieces of this size: a piece of the result stays in the cache
/// while every rank's piece is added to it.
const PIECE: usize = 64 << 10;

/// `acc` becomes the reduction of every rank's elements for it: this rank's (`own`, out
/// of place; in place they are already in `acc`), then each other rank's (`theirs(p)`,
/// the same elements of rank p's input, read where they lie), in rank order from this
/// rank on. A rank for which `theirs` is `None` is left out (its caller adds it as it
/// arrives). In pieces, so that each piece of `acc` stays in the cache.
pub(super) fn reduce_into<'a>(
    cpu: &Cpu,
    acc: &mut [u8],
    own: Option<&[u8]>,
    theirs: impl Fn(usize) -> Option<&'a [u8]>,
    red: Reduction,
) {
    let (n, r) = (cpu.world(), cpu.rank());
    for start in (0..acc.len()).step_by(PIECE) {
        let at = start..(start + PIECE).min(acc.len());
        let piece = &mut acc[at.clone()];
        let mut others = (1..n).filter_map(|k| theirs((r + k) % n)).map(|t| &t[at.clone()]);
        // Out of place, the first other rank's piece is combined with this rank's as it
        // is written: one pass over the piece, not a copy and then a pass.
        if let Some(own) = own {
            match others.next() {
                Some(first) => (red.combine)(piece, &own[at.clone()], first),
                None => piece.copy_from_slice(&own[at.clone()]),
            }
        }
        for other in others {
            (red.accumulate)(piece, other);
        }
    }
}
