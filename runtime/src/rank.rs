//! Ranks: the one check that a number names a rank of the world, said the same way
//! wherever the number comes from (a flag, a variable, a peer, a rank joining the store).

/// Whether `rank` is a rank of a world of `world` ranks. The error is one line that says
/// where the number came from (`what`: "--root", "SLURM_PROCID", "peer"...) and which
/// ranks there are: `--root 4 is not a rank: the world has ranks 0 to 3`.
#[inline]
pub fn check(rank: usize, world: usize, what: &str) -> Result<(), String> {
    check_in(rank, world, what, "the world")
}

/// [`check`] for a communicator of `size` ranks that `whose` names ("the communicator of
/// color 1", for a split one): the same line, saying whose ranks they are.
#[inline]
pub fn check_in(rank: usize, size: usize, what: &str, whose: &str) -> Result<(), String> {
    match rank < size {
        true => Ok(()),
        false => Err(not_a_rank(rank, size, what, whose)),
    }
}

#[cold]
fn not_a_rank(rank: usize, size: usize, what: &str, whose: &str) -> String {
    match size {
        0 => format!("{what} {rank} is not a rank: {whose} has no ranks (a world size of 0)"),
        1 => format!("{what} {rank} is not a rank: {whose} has one rank, 0"),
        _ => format!("{what} {rank} is not a rank: {whose} has ranks 0 to {}", size - 1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_wording_and_no_underflow() {
        assert_eq!(check(3, 4, "--root"), Ok(()));
        assert_eq!(
            check(4, 4, "--root").unwrap_err(),
            "--root 4 is not a rank: the world has ranks 0 to 3"
        );
        assert_eq!(
            check(1, 1, "peer").unwrap_err(),
            "peer 1 is not a rank: the world has one rank, 0"
        );
        assert_eq!(
            check_in(2, 2, "--root", "the communicator of color 1").unwrap_err(),
            "--root 2 is not a rank: the communicator of color 1 has ranks 0 to 1"
        );
        assert_eq!(
            check(0, 0, "SLURM_PROCID").unwrap_err(),
            "SLURM_PROCID 0 is not a rank: the world has no ranks (a world size of 0)"
        );
    }
}

/// The most ranks a job may have: what the workbook's store on rank 0 is sized for (each
/// rank holds a connection to it, and every rank's tables hold every rank).
pub const MAX_WORLD: usize = 65_536;

/// Checks a world size given by `what` (`--world-size`, `WORLD_SIZE`, ...) against
/// [`MAX_WORLD`], before anything is sized by it.
pub fn check_world(world: usize, what: &str) -> Result<(), String> {
    match world {
        0 => Err(format!("{what} 0: a world needs at least one rank")),
        w if w > MAX_WORLD => Err(format!(
            "{what} {w}: the workbook runs at most {MAX_WORLD} ranks in one job"
        )),
        _ => Ok(()),
    }
}

/// Ranks as a person reads them, however many: "rank 3", "ranks 2, 3", "ranks 0, 4–9
/// (7 ranks)"; runs of consecutive ranks as ranges, at most 8 runs, then "…" and how many
/// in all (a timeout with 99,999 missing ranks is one short line, not 600 kB).
pub fn list(ranks: &[u64]) -> String {
    let mut sorted = ranks.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut runs: Vec<(u64, u64)> = vec![];
    for r in &sorted {
        match runs.last_mut() {
            Some((_, end)) if *end + 1 == *r => *end = *r,
            _ => runs.push((*r, *r)),
        }
    }
    const SHOWN: usize = 8;
    let mut text = runs
        .iter()
        .take(SHOWN)
        .map(|&(a, b)| match b - a {
            0 => a.to_string(),
            1 => format!("{a}, {b}"),
            _ => format!("{a}–{b}"),
        })
        .collect::<Vec<_>>()
        .join(", ");
    if runs.len() > SHOWN {
        text.push_str(", …");
    }
    let n = sorted.len();
    match n {
        1 => format!("rank {text}"),
        _ if runs.len() > SHOWN || runs.iter().any(|(a, b)| b - a > 1) => format!("ranks {text} ({n} ranks)"),
        _ => format!("ranks {text}"),
    }
}

#[cfg(test)]
mod list_tests {
    use super::list;

    #[test]
    fn ranks_read_as_ranges_and_a_multitude_as_a_count() {
        assert_eq!(list(&[3]), "rank 3");
        assert_eq!(list(&[3, 2]), "ranks 2, 3");
        assert_eq!(list(&[0, 4, 5, 6, 7, 8, 9]), "ranks 0, 4–9 (7 ranks)");
        let many: Vec<u64> = (1..100_000).collect();
        assert_eq!(list(&many), "ranks 1–99999 (99999 ranks)");
        let sparse: Vec<u64> = (0..100).map(|r| r * 2).collect();
        let said = list(&sparse);
        assert_eq!(said, "ranks 0, 2, 4, 6, 8, 10, 12, 14, … (100 ranks)");
    }
}
