//! Ranks: the one check that a number names a rank of the world, said the same way
//! wherever the number comes from (a flag, a variable, a peer, a rank joining the store).

/// Whether `rank` is a rank of a world of `world` ranks. The error is one line that says
/// where the number came from (`what`: "--root", "SLURM_PROCID", "peer"...) and which
/// ranks there are: `--root 4 is not a rank: the world has ranks 0 to 3`.
pub fn check(rank: usize, world: usize, what: &str) -> Result<(), String> {
    match world {
        _ if rank < world => Ok(()),
        0 => Err(format!(
            "{what} {rank} is not a rank: the world has no ranks (a world size of 0)"
        )),
        1 => Err(format!("{what} {rank} is not a rank: the world has one rank, 0")),
        _ => Err(format!(
            "{what} {rank} is not a rank: the world has ranks 0 to {}",
            world - 1
        )),
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
            check(0, 0, "SLURM_PROCID").unwrap_err(),
            "SLURM_PROCID 0 is not a rank: the world has no ranks (a world size of 0)"
        );
    }
}
