//! The double binary tree, as NCCL builds it: `ncclGetBtree` and `ncclGetDtree`
//! (`src/graph/trees.cc`) over the nodes, a chain inside each node, joined as
//! `connectTrees` (`src/graph/connect.cc`) joins them with its `TREE` pattern: the first
//! rank of each node's chain is the one the other nodes see.
//!
//! Two trees: for an even number of nodes the second is the mirror of the first, for an
//! odd number the first shifted by one node, so that most nodes that are leaves in one
//! tree are inner nodes in the other, and each half of the data uses the links the other
//! half leaves idle. NCCL's comment, for 14 nodes (the first tree) and its mirror for 12:
//!
//! ```text
//! 0---------------8                   3----------------11
//!          ______/ \______            / \______
//!         4               12         /         7
//!       /   \            /  \       /        /   \
//!     2       6       10     \     1        5      9
//!    / \     / \     /  \     \   / \      / \    / \
//!   1   3   5   7   9   11    13 0   2    4   6  8   10
//! ```

/// One rank's place in one tree: the rank it sends its partial result to (`None`: the
/// root) and the ranks it receives from, in NCCL's order (the next rank of its node's
/// chain first, then the first ranks of its child nodes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tree {
    /// The parent.
    pub up: Option<usize>,
    /// The children.
    pub down: Vec<usize>,
}

/// `ncclGetBtree`: node `rank`'s parent and two children in the binary tree of `n` nodes
/// rooted at 0, which alternates leaves and inner nodes (the lowest set bit of a node's
/// number says its height).
pub fn btree(n: usize, rank: usize) -> (Option<usize>, [Option<usize>; 2]) {
    let (n, rank) = (n as i64, rank as i64);
    let mut bit = 1;
    while bit < n && bit & rank == 0 {
        bit <<= 1;
    }
    let some = |x: i64| (x >= 0).then_some(x as usize);
    if rank == 0 {
        // Its one child is above 0, so it is child 1, as NCCL numbers them.
        return (None, [None, if n > 1 { some(bit >> 1) } else { None }]);
    }
    let mut up = (rank ^ bit) | (bit << 1);
    if up >= n {
        up = rank ^ bit;
    }
    let mut low = bit >> 1;
    let down0 = if low == 0 { -1 } else { rank - low };
    let mut down1 = if low == 0 { -1 } else { rank + low };
    while down1 >= n {
        down1 = if low == 0 { -1 } else { rank + low };
        low >>= 1;
    }
    (some(up), [some(down0), some(down1)])
}

/// `ncclGetDtree`: node `rank`'s parent and children in both trees of `n` nodes. The
/// second is the first mirrored (`n` even) or shifted by one (`n` odd).
pub fn dtree(n: usize, rank: usize) -> [(Option<usize>, [Option<usize>; 2]); 2] {
    let first = btree(n, rank);
    let second = if n % 2 == 1 {
        let (u, d) = btree(n, (rank + n - 1) % n);
        let shift = |x: Option<usize>| x.map(|x| (x + 1) % n);
        (shift(u), d.map(shift))
    } else {
        let (u, d) = btree(n, n - 1 - rank);
        let mirror = |x: Option<usize>| x.map(|x| n - 1 - x);
        (mirror(u), d.map(mirror))
    };
    [first, second]
}

/// `rank`'s place in both trees, when rank `r` runs on node `nodes[r]` (numbered from 0
/// in the order of their first rank, as the CPU communicator numbers its machines).
pub fn trees(nodes: &[usize], rank: usize) -> [Tree; 2] {
    let node = nodes[rank];
    let count = nodes.iter().max().map_or(1, |m| m + 1);
    let first_of = |v: usize| nodes.iter().position(|&x| x == v).expect("every node has a rank");
    let chain: Vec<usize> = (0..nodes.len()).filter(|&r| nodes[r] == node).collect();
    let i = chain.iter().position(|&r| r == rank).expect("the rank is on its node");
    dtree(count, node).map(|(up, down)| {
        let mut tree = Tree {
            up: i.checked_sub(1).map(|j| chain[j]),
            down: chain.get(i + 1).copied().into_iter().collect(),
        };
        if i == 0 {
            tree.up = up.map(first_of);
            tree.down.extend(down.into_iter().flatten().map(first_of));
        }
        tree
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every node's parent in the first tree of `n` nodes.
    fn parents(n: usize, tree: usize) -> Vec<Option<usize>> {
        (0..n).map(|r| dtree(n, r)[tree].0).collect()
    }

    #[test]
    fn the_first_tree_of_14_is_nccls_drawing() {
        // 0-8; 8: 4, 12; 4: 2, 6; 12: 10, 13; 2: 1, 3; 6: 5, 7; 10: 9, 11.
        let want = [
            None,
            Some(2),
            Some(4),
            Some(2),
            Some(8),
            Some(6),
            Some(4),
            Some(6),
            Some(0),
        ];
        assert_eq!(parents(14, 0)[..9], want);
        assert_eq!(parents(14, 0)[9..], [Some(10), Some(12), Some(10), Some(8), Some(12)]);
        assert_eq!(btree(14, 12), (Some(8), [Some(10), Some(13)]));
        assert_eq!(btree(14, 0), (None, [None, Some(8)]));
    }

    #[test]
    fn the_second_tree_is_the_mirror_for_12_and_the_shift_for_13() {
        // Mirror of 12: 11 the root, 3 under it, 1 and 7 under 3 (NCCL's drawing).
        let m = parents(12, 1);
        assert_eq!(
            (m[3], m[11], m[7], m[1], m[0], m[10]),
            (Some(11), None, Some(3), Some(3), Some(1), Some(9))
        );
        // Shift of 13: 1 at the top, 9 under it, 5 and 0 under 9.
        let s = parents(13, 1);
        assert_eq!(
            (s[1], s[9], s[5], s[0], s[12]),
            (None, Some(1), Some(9), Some(9), Some(11))
        );
    }

    #[test]
    fn every_tree_of_every_size_spans_all_nodes_and_agrees_with_itself() {
        for n in 1..=40 {
            for t in 0..2 {
                let roots = (0..n).filter(|&r| dtree(n, r)[t].0.is_none()).count();
                assert_eq!(roots, 1, "{n} nodes, tree {t}");
                for r in 0..n {
                    let (up, down) = dtree(n, r)[t];
                    if let Some(u) = up {
                        assert!(dtree(n, u)[t].1.contains(&Some(r)), "{n}: {r}'s parent {u} lacks it");
                    }
                    for d in down.into_iter().flatten() {
                        assert_eq!(dtree(n, d)[t].0, Some(r), "{n}: {r}'s child {d}");
                    }
                    // Walking up ends at the root within log2(n) + 1 steps: no cycle.
                    let (mut at, mut steps) = (r, 0);
                    while let Some(u) = dtree(n, at)[t].0 {
                        (at, steps) = (u, steps + 1);
                        assert!(steps <= 7, "{n} nodes: a cycle from {r}");
                    }
                }
            }
        }
    }

    #[test]
    fn inside_a_node_the_ranks_form_a_chain_under_its_first_rank() {
        // Three nodes of two ranks (0,1 | 2,3 | 4,5), then a node of one.
        let nodes = [0, 0, 1, 1, 2, 2];
        let t = trees(&nodes, 0);
        // Node 0 is the first tree's root; rank 0 receives from the next rank of its
        // chain (1), then from node 2's first rank (4): ncclGetBtree(3, 0)'s one child.
        assert_eq!(
            t[0],
            Tree {
                up: None,
                down: vec![1, 4]
            }
        );
        assert_eq!(
            trees(&nodes, 1)[0],
            Tree {
                up: Some(0),
                down: vec![]
            }
        );
        assert_eq!(
            trees(&nodes, 5)[1],
            Tree {
                up: Some(4),
                down: vec![]
            }
        );
        // One node: both trees are the chain 0 - 1 - 2.
        for t in trees(&[0, 0, 0], 1) {
            assert_eq!(
                t,
                Tree {
                    up: Some(0),
                    down: vec![2]
                }
            );
        }
    }
}
