//! Several calls of one collective run as one: what the CPU backend does with the
//! collectives of a group (`common`'s `Session::group`) that share their kind, root,
//! operator and type. Their buffers are copied into one buffer, the collective runs once
//! on it, and the result is copied back into each call's buffer: one call's fixed cost
//! (its latency, α) instead of one per call, for the price of two copies. NCCL does the
//! same inside a group, where it can: the group's collectives go to the GPU in one launch.
//!
//! The layout works for every collective. A buffer of a collective is made of blocks:
//! one for broadcast, reduce and all-reduce; one per rank for an all-gather's receive
//! buffer, a reduce-scatter's send buffer and both of an all-to-all's (and, in place, the
//! one buffer of those three). The packed buffer has as many blocks, and its block b
//! holds every call's block b, one after another in the order the calls were made. Its
//! block `rank` is then every call's block `rank`: NCCL's in-place layouts (the send
//! region at block `rank` of the receive buffer, or the other way round) hold for the
//! packed buffer as they hold for each call's.

/// Copies `parts`, each made of `blocks` blocks of its own length, into `out`: block b of
/// `out` holds block b of every part, in order. `out` must have the parts' length in all.
pub fn pack<T: Copy>(parts: &[&[T]], blocks: usize, out: &mut [T]) {
    let total: usize = parts.iter().map(|p| p.len() / blocks.max(1)).sum();
    for b in 0..blocks {
        let mut at = b * total;
        for part in parts {
            let len = part.len() / blocks;
            out[at..at + len].copy_from_slice(&part[b * len..(b + 1) * len]);
            at += len;
        }
    }
}

/// The reverse of [`pack`]: each part gets its blocks back from `packed`.
pub fn unpack<T: Copy>(packed: &[T], blocks: usize, parts: &mut [&mut [T]]) {
    let total: usize = parts.iter().map(|p| p.len() / blocks.max(1)).sum();
    for b in 0..blocks {
        let mut at = b * total;
        for part in parts.iter_mut() {
            let len = part.len() / blocks;
            part[b * len..(b + 1) * len].copy_from_slice(&packed[at..at + len]);
            at += len;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_puts_every_calls_block_b_in_block_b_and_unpacking_gives_them_back() {
        // Two calls on 3 ranks, an all-gather's receive buffers: 3 blocks of 2 and of 1.
        let a = [1, 1, 2, 2, 3, 3];
        let b = [10, 20, 30];
        let mut out = [0; 9];
        pack(&[&a, &b], 3, &mut out);
        assert_eq!(out, [1, 1, 10, 2, 2, 20, 3, 3, 30]);
        let (mut a2, mut b2) = ([0; 6], [0; 3]);
        unpack(&out, 3, &mut [&mut a2, &mut b2]);
        assert_eq!((a2, b2), (a, b));
        // One block (a broadcast): the calls one after the other.
        let mut out = [0; 9];
        pack(&[&a, &b], 1, &mut out);
        assert_eq!(out, [1, 1, 2, 2, 3, 3, 10, 20, 30]);
        // Empty calls take no room.
        let mut out = [0; 3];
        pack(&[&[], &b], 3, &mut out);
        assert_eq!(out, b);
    }
}
