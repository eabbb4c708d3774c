//! How each line looks: its colour (the palette's, in turn) and the mark at each of its
//! points, filled out of place and open in place, and drawn with a stroke in the legend.

use plotters::element::{Drawable, PointCollection};
use plotters::prelude::*;
use plotters_backend::{BackendCoord, DrawingErrorKind};

/// The lines' colours, in order: the workbook's ten ([`workbook_draw::palette`]), the
/// ranks' colours in `--draw`; tests look for them in the picture.
pub const PALETTE: [(u8, u8, u8); 10] = workbook_draw::palette::TEN;
/// Line `i`'s colour: the palette's, in turn.
pub(super) fn colour(i: usize) -> RGBColor {
    let (r, g, b) = workbook_draw::palette::line(i);
    RGBColor(r, g, b)
}

/// The mark at each point of line `i` (a circle, then, once the colours have all been
/// used, a triangle, a square, a cross, so that no two lines look alike), filled out of
/// place and open in place; in the legend, with a stroke of the line through it.
pub(super) struct Mark<C> {
    at: C,
    line: usize,
    in_legend: bool,
    filled: bool,
}

pub(super) fn mark<C>(line: usize, at: C, filled: bool) -> Mark<C> {
    Mark {
        at,
        line,
        in_legend: false,
        filled,
    }
}

/// Line `i` as its legend shows it, from `at` rightwards: a stroke and its mark.
pub(super) fn sample(line: usize, at: BackendCoord) -> Mark<BackendCoord> {
    Mark {
        at,
        line,
        in_legend: true,
        filled: true,
    }
}

impl<'a, C> PointCollection<'a, C> for &'a Mark<C> {
    type Point = &'a C;
    type IntoIter = std::iter::Once<&'a C>;
    fn point_iter(self) -> Self::IntoIter {
        std::iter::once(&self.at)
    }
}

impl<C, DB: DrawingBackend> Drawable<DB> for Mark<C> {
    fn draw<I: Iterator<Item = BackendCoord>>(
        &self,
        mut at: I,
        backend: &mut DB,
        _: (u32, u32),
    ) -> Result<(), DrawingErrorKind<DB::ErrorType>> {
        let Some((mut x, y)) = at.next() else {
            return Ok(());
        };
        let color = colour(self.line);
        if self.in_legend {
            backend.draw_path([(x, y), (x + 24, y)], &color.stroke_width(3))?;
            x += 12;
        }
        let fill = match self.filled {
            true => color.filled(),
            false => color.stroke_width(2),
        };
        let filled = self.filled;
        match self.line / PALETTE.len() % 4 {
            0 => backend.draw_circle((x, y), 4, &fill, filled),
            1 if filled => backend.fill_polygon([(x, y - 6), (x - 6, y + 4), (x + 6, y + 4)], &fill),
            1 => backend.draw_path([(x, y - 6), (x - 6, y + 4), (x + 6, y + 4), (x, y - 6)], &fill),
            2 => backend.draw_rect((x - 4, y - 4), (x + 4, y + 4), &fill, filled),
            _ => {
                let pen = color.stroke_width(2);
                backend.draw_line((x - 4, y - 4), (x + 4, y + 4), &pen)?;
                backend.draw_line((x - 4, y + 4), (x + 4, y - 4), &pen)
            }
        }
    }
}
