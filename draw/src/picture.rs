//! The drawing: panels of lanes and arrows on plotters' SVG backend. Text stays SVG text
//! (the viewer's sans-serif font), so no font is carried or measured.

use crate::contributions::{self, Holds};
use crate::layout::{self, Layout};
use crate::{Panel, layout::LANE};
use plotters_backend::text_anchor::{HPos, Pos, VPos};
use plotters_backend::{
    BackendColor, BackendCoord, BackendStyle, BackendTextStyle, DrawingBackend, DrawingErrorKind, FontFamily,
};
use plotters_svg::SVGBackend;

/// The colour of an element holding every rank's contribution: the collective's result.
pub const COMPLETE: (u8, u8, u8) = (34, 45, 61);
/// An element holding nothing yet (a block an all-gather has not brought).
pub const EMPTY: (u8, u8, u8) = (255, 255, 255);

/// The colour of world rank `r`: the workbook's ([`crate::palette`]).
pub fn rank_colour(r: usize) -> (u8, u8, u8) {
    crate::palette::rank(r)
}

/// The colour of an element holding `holds` on a panel whose rows are the world's `ranks`:
/// nothing, one rank's, every rank's, or the mean of the ranks' it holds.
pub fn colour(holds: Holds, ranks: &[usize]) -> (u8, u8, u8) {
    let rows = ranks.len();
    if holds == 0 {
        return EMPTY;
    }
    if rows > 1 && holds == contributions::all(rows) {
        return COMPLETE;
    }
    let who: Vec<usize> = (0..rows.min(contributions::MAX_ROWS))
        .filter(|r| holds >> r & 1 == 1)
        .map(|r| ranks[r])
        .collect();
    let mean = |f: fn((u8, u8, u8)) -> u8| {
        (who.iter().map(|&r| f(rank_colour(r)) as usize).sum::<usize>() / who.len().max(1)) as u8
    };
    (mean(|c| c.0), mean(|c| c.1), mean(|c| c.2))
}

type Drawn = Result<(), DrawingErrorKind<std::io::Error>>;

/// The SVG of `panels` under `title`: one string, ready to write.
pub fn svg(title: &str, panels: &[Panel]) -> Result<String, String> {
    frame(title, panels, usize::MAX)
}

/// The picture as it stands after step `upto` (0: the start): the later columns and
/// their arrows left out, the size the whole picture's (the frames of a page align).
pub fn frame(title: &str, panels: &[Panel], upto: usize) -> Result<String, String> {
    let (layouts, size) = layout::place(panels);
    let mut out = String::new();
    {
        let mut b = SVGBackend::with_string(&mut out, size);
        draw(&mut b, title, panels, &layouts, upto).map_err(|e| format!("drawing the picture: {e}"))?;
        b.present().map_err(|e| format!("drawing the picture: {e}"))?;
    }
    Ok(out)
}

fn draw(b: &mut SVGBackend, title: &str, panels: &[Panel], layouts: &[Layout], upto: usize) -> Drawn {
    let (w, h) = b.get_size();
    b.draw_rect((0, 0), (w as i32, h as i32), &rgb((255, 255, 255)), true)?;
    let m = layout::MARGIN;
    b.draw_text(title, &Font::new(16, HPos::Left), (m, m))?;
    let pipelined = panels
        .iter()
        .flat_map(|p| &p.moves)
        .any(|m| m.how == crate::How::Partial);
    let mut ranks: Vec<usize> = panels.iter().flat_map(|p| p.ranks.iter().copied()).collect();
    ranks.sort_unstable();
    ranks.dedup();
    let combined = panels.iter().any(|p| p.reducing && p.ranks.len() > 1);
    legend(b, &ranks, combined, pipelined, (m, m + 30))?;
    for (p, l) in panels.iter().zip(layouts) {
        draw_panel(b, p, l, upto)?;
    }
    Ok(())
}

/// The colours' key: each rank's, the blend, the result.
fn legend(b: &mut SVGBackend, ranks: &[usize], combined: bool, pipelined: bool, (x, y): BackendCoord) -> Drawn {
    let mut x = x;
    let key = |b: &mut SVGBackend, c: (u8, u8, u8), text: &str, x: &mut i32| -> Drawn {
        b.draw_rect((*x, y), (*x + 14, y + 14), &rgb(c), true)?;
        b.draw_rect((*x, y), (*x + 14, y + 14), &rgb((150, 150, 150)), false)?;
        b.draw_text(text, &Font::new(12, HPos::Left), (*x + 19, y + 1))?;
        *x += 24 + 7 * text.len() as i32;
        Ok(())
    };
    for &r in ranks.iter().take(crate::palette::TEN.len()) {
        key(b, rank_colour(r), &format!("rank {r}'s"), &mut x)?;
    }
    if combined {
        key(b, colour(0b11, &[0, 1, 2]), "k/n: k ranks' combined", &mut x)?;
        key(b, COMPLETE, "every rank's: the result", &mut x)?;
    }
    key(b, EMPTY, "nothing yet", &mut x)?;
    let mut arrows = "arrow: a message, in its sender's colour (dotted: a read of the peer's memory)".to_string();
    if pipelined {
        arrows
            .push_str("; pipelined: a partial result travels in the messages, a buffer changes once its chunk is done");
    }
    b.draw_text(&arrows, &Font::new(12, HPos::Left), (layout::MARGIN, y + 22))
}

fn draw_panel(b: &mut SVGBackend, p: &Panel, l: &Layout, upto: usize) -> Drawn {
    let mut frames = contributions::frames(p);
    frames.truncate(upto.saturating_add(1));
    b.draw_text(&p.caption, &Font::new(13, HPos::Left), (layout::MARGIN, l.top))?;
    for s in 0..=l.steps.min(upto) {
        let name = match s {
            0 => "start",
            s => &p.steps[s - 1],
        };
        let x = l.column_x(s) + l.column() / 2;
        b.draw_text(name, &Font::new(11, HPos::Center), (x, l.top + 22))?;
    }
    for (r, label) in p.labels.iter().enumerate() {
        let y = l.lane_y(r) + LANE / 2 - 6;
        b.draw_text(label, &Font::new(12, HPos::Left), (layout::MARGIN, y))?;
    }
    for (s, frame) in frames.iter().enumerate() {
        for (r, holds) in frame.iter().enumerate() {
            for (i, h) in holds.iter().enumerate() {
                draw_cell(b, l, &p.ranks, (s, r, i), *h)?;
            }
        }
    }
    for m in &p.moves {
        if m.step == 0 || m.step > l.steps.min(upto) || m.from >= l.rows || m.to >= l.rows {
            continue;
        }
        arrow(b, l.arrow(m.step, m.from, m.to), rank_colour(p.ranks[m.from]), m.read)?;
    }
    Ok(())
}

fn draw_cell(b: &mut SVGBackend, l: &Layout, ranks: &[usize], (s, r, i): (usize, usize, usize), h: Holds) -> Drawn {
    let (a, z) = l.cell_box(s, r, i);
    let c = colour(h, ranks);
    b.draw_rect(a, z, &rgb(c), true)?;
    b.draw_rect(a, z, &rgb((200, 200, 200)), false)?;
    let n = h.count_ones() as usize;
    let text = match n {
        0 => return Ok(()),
        _ if n == l.rows && l.rows > 1 => "all".to_string(),
        1 => ranks[h.trailing_zeros() as usize].to_string(),
        n => format!("{n}/{}", l.rows),
    };
    if l.cell < 7 * text.len() as i32 {
        return Ok(());
    }
    let ink = match c == COMPLETE {
        true => (255, 255, 255),
        false => (20, 20, 20),
    };
    let font = Font::new(10, HPos::Center).colour(ink);
    b.draw_text(&text, &font, ((a.0 + z.0) / 2, (a.1 + z.1) / 2 - 5))
}

/// An arrow from `from` to `to`, with its head at `to`: solid, or dotted for a read.
fn arrow(b: &mut SVGBackend, (from, to): (BackendCoord, BackendCoord), c: (u8, u8, u8), dotted: bool) -> Drawn {
    let style = Stroke(rgb(c), 2);
    let (dx, dy) = ((to.0 - from.0) as f64, (to.1 - from.1) as f64);
    let len = (dx * dx + dy * dy).sqrt().max(1.0);
    let (ux, uy) = (dx / len, dy / len);
    // The shaft stops where the head begins.
    let head = 9.0;
    let base = (to.0 as f64 - ux * head, to.1 as f64 - uy * head);
    match dotted {
        false => b.draw_line(from, (base.0 as i32, base.1 as i32), &style)?,
        true => {
            let mut t = 0.0;
            while t + 4.0 < len - head {
                let at = |d: f64| ((from.0 as f64 + ux * d) as i32, (from.1 as f64 + uy * d) as i32);
                b.draw_line(at(t), at(t + 4.0), &style)?;
                t += 8.0;
            }
        }
    }
    let side = (-uy * 4.5, ux * 4.5);
    let points = [
        to,
        ((base.0 + side.0) as i32, (base.1 + side.1) as i32),
        ((base.0 - side.0) as i32, (base.1 - side.1) as i32),
    ];
    b.fill_polygon(points, &rgb(c))
}

pub(crate) fn rgb(c: (u8, u8, u8)) -> BackendColor {
    BackendColor { alpha: 1.0, rgb: c }
}

/// A line's colour and width.
pub(crate) struct Stroke(pub(crate) BackendColor, pub(crate) u32);

impl BackendStyle for Stroke {
    fn color(&self) -> BackendColor {
        self.0
    }
    fn stroke_width(&self) -> u32 {
        self.1
    }
}

/// Text as the SVG backend writes it: a size, an anchor and a colour; the viewer's
/// sans-serif font draws it.
pub(crate) struct Font {
    size: f64,
    anchor: Pos,
    colour: BackendColor,
}

impl Font {
    pub(crate) fn new(size: u32, h: HPos) -> Font {
        // The SVG backend writes a size of size / 1.24 (plotters' points to pixels).
        Font {
            size: size as f64 * 1.24,
            anchor: Pos::new(h, VPos::Top),
            colour: rgb((20, 20, 20)),
        }
    }

    pub(crate) fn colour(mut self, c: (u8, u8, u8)) -> Font {
        self.colour = rgb(c);
        self
    }
}

impl BackendTextStyle for Font {
    type FontError = std::fmt::Error;

    fn color(&self) -> BackendColor {
        self.colour
    }
    fn size(&self) -> f64 {
        self.size
    }
    fn anchor(&self) -> Pos {
        self.anchor
    }
    fn family(&self) -> FontFamily<'_> {
        FontFamily::SansSerif
    }
    /// Not used by the SVG backend, which leaves the layout to the viewer: an estimate.
    fn layout_box(&self, text: &str) -> Result<((i32, i32), (i32, i32)), Self::FontError> {
        let w = (text.chars().count() as f64 * self.size * 0.55) as i32;
        Ok(((0, 0), (w, self.size as i32)))
    }
    /// Not used by the SVG backend (it writes text as text).
    fn draw<E, F: FnMut(i32, i32, BackendColor) -> Result<(), E>>(
        &self,
        _text: &str,
        _pos: BackendCoord,
        _draw: F,
    ) -> Result<Result<(), E>, Self::FontError> {
        Ok(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contributions::tests::ring;

    #[test]
    fn a_blend_is_the_mean_and_every_rank_is_the_result() {
        let four = [0, 1, 2, 3];
        assert_eq!(colour(0, &four), EMPTY);
        assert_eq!(colour(1 << 2, &four), crate::palette::TEN[2]);
        assert_eq!(colour(0b1111, &four), COMPLETE);
        let (a, b) = (crate::palette::TEN[0], crate::palette::TEN[1]);
        assert_eq!(colour(0b11, &four).0, ((a.0 as usize + b.0 as usize) / 2) as u8);
        // A split's rows are world ranks: row 0 of ranks [2, 3] is rank 2's colour.
        assert_eq!(colour(1, &[2, 3]), crate::palette::TEN[2]);
    }

    #[test]
    fn the_svg_has_a_cell_per_element_per_step_and_an_arrow_per_message() {
        let p = ring(4);
        let s = svg("all-reduce", std::slice::from_ref(&p)).unwrap();
        assert!(s.starts_with("<svg"), "{}", &s[..80]);
        // Cells are filled rectangles (and their outlines); arrowheads are polygons.
        assert_eq!(s.matches("<polygon").count(), p.moves.len());
        assert!(
            s.matches("<rect").count() >= 2 * 7 * 4 * 4,
            "7 columns of 4 lanes of 4 cells"
        );
    }
}
