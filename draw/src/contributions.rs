//! Whose contributions each element holds after each step, worked out from the messages:
//! a receive that copies replaces the elements' set with the message's, one that reduces
//! adds the message's to it, and a partial result (pipelined) is the union passed on,
//! kept nowhere. A message carries what its sender held at the start of its step.

use crate::{How, Move, Panel, Source};
use std::collections::HashMap;

/// The ranks (rows) whose contributions an element holds: bit r for row r.
pub type Holds = u128;

/// The most rows a panel may have ([`Holds`]' bits).
pub const MAX_ROWS: usize = 128;

/// `frames[s][r][i]`: what element i of row r holds after step s (step 0: the start).
pub fn frames(panel: &Panel) -> Vec<Vec<Vec<Holds>>> {
    let rows = panel.labels.len().min(MAX_ROWS);
    let mut now: Vec<Vec<Holds>> = (0..rows).map(|r| start(panel, r)).collect();
    let mut frames = vec![now.clone()];
    // The partial results each row made, by the elements they stand for (and the last).
    let mut partial: Vec<HashMap<(usize, usize), Vec<Holds>>> = vec![HashMap::new(); rows];
    let mut last_partial: Vec<Vec<Holds>> = vec![Vec::new(); rows];
    for step in 1..=panel.steps.len() {
        let moves: Vec<&Move> = panel
            .moves
            .iter()
            .filter(|m| m.step == step && m.from < rows && m.to < rows)
            .collect();
        // What each message carries: its sender's, as the step began.
        let carried: Vec<Vec<Holds>> = moves
            .iter()
            .map(|m| match m.source {
                Source::SendBuffer(a, b) => vec![1 << m.from; b.saturating_sub(a)],
                Source::Buffer(a, b) => slice(&now[m.from], a, b),
                Source::PartialOf(a, b) => partial[m.from]
                    .get(&(a, b))
                    .cloned()
                    .unwrap_or_else(|| slice(&now[m.from], a, b)),
                Source::Partial => last_partial[m.from].clone(),
            })
            .collect();
        for (m, carried) in moves.iter().zip(carried) {
            let Some((a, b)) = m.into else {
                last_partial[m.to] = carried;
                continue;
            };
            let mine = &mut now[m.to];
            let (a, b) = (a.min(mine.len()), b.min(mine.len()));
            match m.how {
                How::Copy => {
                    for (cell, got) in mine[a..b].iter_mut().zip(&carried) {
                        *cell = *got;
                    }
                }
                How::Reduce => {
                    for (cell, got) in mine[a..b].iter_mut().zip(&carried) {
                        *cell |= *got;
                    }
                }
                How::Partial => {
                    let made: Vec<Holds> = mine[a..b].iter().zip(&carried).map(|(x, y)| x | y).collect();
                    partial[m.to].insert((a, b), made.clone());
                    last_partial[m.to] = made;
                }
            }
        }
        frames.push(now.clone());
    }
    frames
}

/// What row `r` holds at the start: its own contribution in every element of a reduction;
/// otherwise in the elements it never receives (its own block of an all-gather, the root's
/// buffer of a broadcast), and nothing yet in the others.
fn start(panel: &Panel, r: usize) -> Vec<Holds> {
    let mut own = vec![1 << r; panel.len];
    if !panel.reducing {
        for m in panel.moves.iter().filter(|m| m.to == r) {
            if let Some((a, b)) = m.into {
                for cell in own.iter_mut().take(b).skip(a) {
                    *cell = 0;
                }
            }
        }
    }
    own
}

fn slice(v: &[Holds], a: usize, b: usize) -> Vec<Holds> {
    v.get(a.min(v.len())..b.min(v.len())).unwrap_or_default().to_vec()
}

/// Every row's bit, for a panel of `rows` rows: what an element holds once complete.
pub fn all(rows: usize) -> Holds {
    match rows {
        MAX_ROWS.. => Holds::MAX,
        n => (1 << n) - 1,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The ring all-reduce on `n` ranks, one element a chunk: reduce-scatter then all-gather,
    /// as the CPU backend's ring records it.
    pub fn ring(n: usize) -> Panel {
        let mut moves = vec![];
        for s in 0..n - 1 {
            for r in 0..n {
                let chunk = (r + n - s) % n;
                let to = (r + 1) % n;
                moves.push(Move {
                    step: s + 1,
                    from: r,
                    to,
                    source: Source::Buffer(chunk, chunk + 1),
                    into: Some((chunk, chunk + 1)),
                    how: How::Reduce,
                    read: false,
                });
            }
        }
        for s in 0..n - 1 {
            for r in 0..n {
                let chunk = (r + 1 + n - s) % n;
                moves.push(Move {
                    step: n + s,
                    from: r,
                    to: (r + 1) % n,
                    source: Source::Buffer(chunk, chunk + 1),
                    into: Some((chunk, chunk + 1)),
                    how: How::Copy,
                    read: false,
                });
            }
        }
        Panel {
            caption: format!("all-reduce on {n} ranks, ring"),
            labels: (0..n).map(|r| format!("rank {r}")).collect(),
            ranks: (0..n).collect(),
            len: n,
            bounds: (0..=n).collect(),
            steps: (1..=2 * (n - 1)).map(|s| format!("step {s}")).collect(),
            reducing: true,
            moves,
        }
    }

    #[test]
    fn the_ring_ends_with_every_element_holding_every_rank() {
        let p = ring(4);
        let f = frames(&p);
        assert_eq!(f.len(), 7);
        assert_eq!(f[0][2], [4, 4, 4, 4], "each rank its own at the start");
        // After the reduce-scatter (3 steps) rank r holds every rank's in chunk r + 1.
        for r in 0..4 {
            assert_eq!(f[3][r][(r + 1) % 4], all(4), "rank {r}: {:?}", f[3][r]);
        }
        assert!(f[6].iter().flatten().all(|h| *h == all(4)), "{:?}", f[6]);
    }

    #[test]
    fn an_all_gather_starts_with_each_rank_holding_its_own_block_only() {
        let mut p = ring(3);
        p.reducing = false;
        p.moves.retain(|m| m.how == How::Copy);
        for m in &mut p.moves {
            m.step -= 2;
        }
        p.steps.truncate(2);
        let f = frames(&p);
        // Rank 0 receives chunks 0 (step 1) and 2 (step 2): it starts with chunk 1, its own
        // in this ring's numbering.
        assert_eq!(f[0][0], [0, 1, 0]);
        assert_eq!(f[2][0], [1 << 2, 1, 1 << 1], "every block, each from its owner");
    }
}
