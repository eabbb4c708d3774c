//! The grid of a model-parallel job, as Megatron lays it out: rows of `tp` consecutive
//! ranks (the tensor-parallel groups, inside a node), whose columns are the
//! data-parallel groups (across nodes). Lesson 09 splits the world along both; exercise
//! 12's hierarchy is the same grid, a node per row.

use anyhow::Result;
use workbook_runtime::error::SharedError;

/// The length of a row: `given` by `flag` (`--tp`), else `per_node` (the ranks of one
/// node, so that each row stays inside a node). It must divide the `world`'s ranks into
/// whole rows; a length that does not is the user's error, alike on every rank (rank 0
/// says it).
pub fn row_length(flag: &str, given: Option<usize>, per_node: usize, world: usize) -> Result<usize> {
    let (len, said) = match given {
        Some(t) => (t, format!("{flag} {t}")),
        None => (
            per_node,
            format!("{per_node} rank(s) on the first node (the default of {flag})"),
        ),
    };
    if len == 0 || !world.is_multiple_of(len) {
        return Err(shared(format!(
            "{said}: the {world} ranks do not make whole rows of {len}: give {flag} a divisor of {world}"
        )));
    }
    Ok(len)
}

/// The length of each of `parts` equal shards of a buffer of `count` elements (a
/// reduce-scatter's), which they must divide: else the user's error, alike on every rank,
/// naming the flag that gave the size (`said`: "--count 7", "--size 6").
pub fn shard_len(count: usize, parts: usize, said: &str) -> Result<usize> {
    match count.is_multiple_of(parts) {
        true => Ok(count / parts),
        false => Err(shared(format!(
            "{said}: {count} element(s), not a multiple of the {parts} ranks per node, among which the buffer is cut in \
             equal shards"
        ))),
    }
}

/// A usage error every rank meets alike.
fn shared(message: String) -> anyhow::Error {
    SharedError { message, usage: true }.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_length_must_divide_the_world_and_a_shard_the_count() {
        assert_eq!(row_length("--tp", None, 2, 8).unwrap(), 2);
        assert_eq!(row_length("--tp", Some(4), 2, 8).unwrap(), 4);
        assert!(row_length("--tp", Some(3), 2, 8).is_err());
        assert!(row_length("--tp", Some(0), 2, 8).is_err());
        assert!(row_length("--tp", None, 3, 4).is_err());
        assert_eq!(shard_len(12, 4, "--count 12").unwrap(), 3);
        assert!(shard_len(10, 4, "--count 10").is_err());
    }
}
