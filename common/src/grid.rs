//! The grid of a model-parallel job, as Megatron lays it out: rows of `tp` consecutive
//! ranks (the tensor-parallel groups, inside a node), whose columns are the
//! data-parallel groups (across nodes). Lesson 09 splits the world along both.

use crate::error::SharedError;
use anyhow::Result;

/// The length of a row: `--tp` if given, else `per_node` (the ranks of one node, so that
/// each row stays inside a node). It must divide the `world`'s ranks into whole rows; a
/// length that does not is the user's error, alike on every rank (rank 0 says it).
pub fn row_length(tp: Option<usize>, per_node: usize, world: usize) -> Result<usize> {
    let (len, said) = match tp {
        Some(t) => (t, format!("--tp {t}")),
        None => (
            per_node,
            format!("{per_node} rank(s) on the first node (the default of --tp)"),
        ),
    };
    if len == 0 || !world.is_multiple_of(len) {
        return Err(SharedError {
            message: format!(
                "{said}: the {world} ranks do not make whole rows of {len}: give --tp a divisor of {world}"
            ),
            usage: true,
        }
        .into());
    }
    Ok(len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_length_must_divide_the_world() {
        assert_eq!(row_length(None, 2, 8).unwrap(), 2);
        assert_eq!(row_length(Some(4), 2, 8).unwrap(), 4);
        assert!(row_length(Some(3), 2, 8).is_err());
        assert!(row_length(Some(0), 2, 8).is_err());
        assert!(row_length(None, 3, 4).is_err());
    }
}
