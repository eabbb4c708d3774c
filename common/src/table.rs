//! Tables: what the student sees of every rank's buffer.
//!
//! One row per rank, in rank order, gathered to rank 0 so rows never interleave. The
//! course's layout: the row's label outside the grid, the buffer's first elements inside.
//!
//! ```text
//! Before broadcast:
//!         +----+----+----+----+
//!   CPU 0 | 42 | 42 | 42 | 42 |
//!         +----+----+----+----+
//!   CPU 1 | 0  | 0  | 0  | 0  |
//!         +----+----+----+----+
//! ```

use colored::Colorize;
use tabled::builder::Builder;
use tabled::settings::Style;

/// Renders a stage table. `changed[r][i]` marks cells that differ from the previous
/// stage: they are shown in bold green when colour is on (`--color`, `NO_COLOR`).
/// `more` is the number of elements each buffer holds beyond those shown.
pub fn stage(
    title: &str,
    labels: &[String],
    rows: &[Vec<String>],
    changed: Option<&[Vec<bool>]>,
    more: usize,
) -> String {
    let mut b = Builder::default();
    for (r, row) in rows.iter().enumerate() {
        let mut cells: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(i, v)| match changed.and_then(|c| c.get(r)).and_then(|c| c.get(i)) {
                Some(true) => v.green().bold().to_string(),
                _ => v.clone(),
            })
            .collect();
        if more > 0 {
            cells.push(format!("… {more} more"));
        }
        b.push_record(cells);
    }
    let grid = b.build().with(Style::ascii()).to_string();
    let width = labels.iter().map(|l| l.chars().count()).max().unwrap_or(0);
    let mut out = format!("{title}\n");
    let mut labels = labels.iter();
    for line in grid.lines() {
        // Grid lines start with '+'; every other line is a rank's row.
        let label = if line.starts_with('+') {
            ""
        } else {
            labels.next().map(String::as_str).unwrap_or("")
        };
        out.push_str(&format!("  {label:>width$} {line}\n"));
    }
    out
}

/// Renders a stage table whose buffers are cut into blocks (all-gather's `n` blocks, one
/// from each rank): a header row names each block (`labels_of_blocks[b]`, spanning the
/// block's columns), and `rows[r]` holds rank r's shown cells, `per_block` per block.
pub fn blocks(
    title: &str,
    labels: &[String],
    block_labels: &[String],
    rows: &[Vec<String>],
    changed: Option<&[Vec<bool>]>,
    per_block: usize,
) -> String {
    use tabled::settings::object::Cell;
    use tabled::settings::{Modify, Span};
    let mut b = Builder::default();
    let mut head = vec![String::new(); block_labels.len() * per_block];
    for (i, l) in block_labels.iter().enumerate() {
        head[i * per_block] = l.clone();
    }
    b.push_record(head);
    // A header wider than its block's cells would widen the block's first column only:
    // give every column of the block an equal share of the header's width instead.
    let share = |block: usize| {
        let label = block_labels.get(block).map_or(0, |l| l.chars().count()) + 2; // with its padding
        let inner = 3 * per_block - 1; // every column's padding, and the separators between
        label.saturating_sub(inner).div_ceil(per_block.max(1))
    };
    for (r, row) in rows.iter().enumerate() {
        b.push_record(row.iter().enumerate().map(|(i, v)| {
            let v = format!("{v:<w$}", w = share(i / per_block.max(1)));
            match changed.and_then(|c| c.get(r)).and_then(|c| c.get(i)) {
                Some(true) => v.green().bold().to_string(),
                _ => v,
            }
        }));
    }
    let mut table = b.build();
    table.with(Style::ascii());
    if per_block > 1 {
        for i in 0..block_labels.len() {
            table.with(Modify::new(Cell::new(0, i * per_block)).with(Span::column(per_block as isize)));
        }
    }
    let grid = table.to_string();
    let width = labels.iter().map(|l| l.chars().count()).max().unwrap_or(0);
    let mut out = format!("{title}\n");
    let mut labels = std::iter::once("").chain(labels.iter().map(String::as_str));
    for line in grid.lines() {
        let label = if line.starts_with('+') {
            ""
        } else {
            labels.next().unwrap_or("")
        };
        out.push_str(&format!("  {label:>width$} {line}\n"));
    }
    out
}

/// Renders a table with a header row (hello world's roll call).
pub fn with_header(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut b = Builder::default();
    b.push_record(header.iter().map(|h| h.to_string()));
    for row in rows {
        b.push_record(row.clone());
    }
    b.build().with(Style::ascii()).to_string()
}

/// A number as the tables show it: `42`, not `42.0` (the buffers' tables and `--steps`).
pub fn number(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stage_table_has_one_labelled_row_per_rank() {
        colored::control::set_override(false);
        let labels = vec!["CPU 0".to_string(), "CPU 1".to_string()];
        let rows = vec![vec!["42".to_string(); 2], vec!["0".to_string(); 2]];
        let t = stage("Before broadcast:", &labels, &rows, None, 0);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "Before broadcast:");
        assert_eq!(lines[1], "        +----+----+");
        assert_eq!(lines[2], "  CPU 0 | 42 | 42 |");
        assert_eq!(lines[4], "  CPU 1 | 0  | 0  |");
        assert_eq!(lines.len(), 6);
        let t = stage("After:", &labels, &rows, None, 5);
        assert!(t.contains("| 42 | 42 | … 5 more |"), "{t}");
    }

    #[test]
    fn a_block_table_names_each_block_above_its_cells() {
        colored::control::set_override(false);
        let labels = vec!["CPU 0".to_string(), "CPU 1".to_string()];
        let blocks = vec!["from rank 0".to_string(), "from rank 1".to_string()];
        let rows = vec![["1", "1", "2", "2"].iter().map(|s| s.to_string()).collect(); 2];
        let t = blocks_table(&labels, &blocks, &rows);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "After all-gather:");
        assert!(lines[2].trim_start().starts_with("| from rank 0"), "{t}");
        assert!(lines[2].contains("| from rank 1"), "{t}");
        assert!(lines[4].starts_with("  CPU 0 | 1"), "{t}");
        assert!(lines[6].starts_with("  CPU 1 | 1"), "{t}");
    }

    fn blocks_table(labels: &[String], names: &[String], rows: &[Vec<String>]) -> String {
        blocks("After all-gather:", labels, names, rows, None, 2)
    }
}
