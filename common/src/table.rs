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
/// stage: they are shown in bold green when colour is on (see [`crate::output`]).
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

/// Renders a table with a header row (hello world's roll call).
pub fn with_header(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut b = Builder::default();
    b.push_record(header.iter().map(|h| h.to_string()));
    for row in rows {
        b.push_record(row.clone());
    }
    b.build().with(Style::ascii()).to_string()
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
}
