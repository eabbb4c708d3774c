//! Where everything of a picture lies, in pixels: what [`crate::picture`] draws by, and
//! what the tests look at.

use crate::Panel;

/// Around the picture.
pub const MARGIN: i32 = 20;
/// The title and the legend above the panels.
pub const HEADER: i32 = 70;
/// A panel's caption and its steps' names, above its lanes.
pub const PANEL_HEAD: i32 = 46;
/// Between panels.
pub const PANEL_GAP: i32 = 24;
/// The rows' names, left of the lanes.
pub const LABEL: i32 = 70;
/// A lane's height, and the space between two.
pub const LANE: i32 = 26;
pub const LANE_GAP: i32 = 16;
/// Between two steps' columns: where the arrows go.
pub const GAP: i32 = 56;
/// Between two chunks of a buffer.
pub const CHUNK_GAP: i32 = 4;

/// A cell's width for a buffer of `len` elements: a column about 200 pixels wide, a cell
/// between 6 and 28.
pub fn cell(len: usize) -> i32 {
    (200 / len.max(1) as i32).clamp(6, 28)
}

/// One panel's geometry, placed at `top`.
#[derive(Clone, Debug)]
pub struct Layout {
    pub top: i32,
    pub rows: usize,
    pub steps: usize,
    pub len: usize,
    pub bounds: Vec<usize>,
    pub cell: i32,
}

impl Layout {
    /// The panel's geometry, its top at `top`.
    pub fn new(panel: &Panel, top: i32) -> Layout {
        Layout {
            top,
            rows: panel.labels.len(),
            steps: panel.steps.len(),
            len: panel.len,
            bounds: panel.bounds.clone(),
            cell: cell(panel.len),
        }
    }

    /// A column's width: the cells and the gaps between chunks.
    pub fn column(&self) -> i32 {
        self.len as i32 * self.cell + self.chunks_before(self.len) * CHUNK_GAP
    }

    /// How many chunk boundaries lie before element `i` (not counting the first).
    fn chunks_before(&self, i: usize) -> i32 {
        self.bounds.iter().filter(|&&b| b > 0 && b <= i && b < self.len).count() as i32
    }

    /// Where step `s`'s column begins (step 0: the start).
    pub fn column_x(&self, s: usize) -> i32 {
        MARGIN + LABEL + s as i32 * (self.column() + GAP)
    }

    /// The top of row `r`'s lane.
    pub fn lane_y(&self, r: usize) -> i32 {
        self.top + PANEL_HEAD + r as i32 * (LANE + LANE_GAP)
    }

    /// Element `i`'s cell in step `s`'s column, row `r`: top left and bottom right.
    pub fn cell_box(&self, s: usize, r: usize, i: usize) -> ((i32, i32), (i32, i32)) {
        let x = self.column_x(s) + i as i32 * self.cell + self.chunks_before(i) * CHUNK_GAP;
        let y = self.lane_y(r);
        ((x, y), (x + self.cell - 1, y + LANE))
    }

    /// The middle of a cell.
    pub fn cell_centre(&self, s: usize, r: usize, i: usize) -> (i32, i32) {
        let ((x0, y0), (x1, y1)) = self.cell_box(s, r, i);
        ((x0 + x1) / 2, (y0 + y1) / 2)
    }

    /// An arrow of step `s` (s ≥ 1), from row `from`'s lane in the column before to row
    /// `to`'s in step s's: its two ends, in the gap between the columns.
    pub fn arrow(&self, s: usize, from: usize, to: usize) -> ((i32, i32), (i32, i32)) {
        let x0 = self.column_x(s - 1) + self.column() + 4;
        let x1 = self.column_x(s) - 4;
        let mid = |r: usize| self.lane_y(r) + LANE / 2;
        ((x0, mid(from)), (x1, mid(to)))
    }

    /// The panel's height.
    pub fn height(&self) -> i32 {
        PANEL_HEAD + self.rows as i32 * (LANE + LANE_GAP)
    }

    /// The panel's width, margins included.
    pub fn width(&self) -> i32 {
        self.column_x(self.steps + 1) - GAP + MARGIN
    }
}

/// Every panel's geometry, one under the other below the header, and the picture's size.
pub fn place(panels: &[Panel]) -> (Vec<Layout>, (u32, u32)) {
    let mut top = MARGIN + HEADER;
    let mut out = vec![];
    for p in panels {
        let l = Layout::new(p, top);
        top += l.height() + PANEL_GAP;
        out.push(l);
    }
    // Text is as wide as its characters, about: the captions must fit too.
    let text = panels.iter().map(|p| p.caption.chars().count()).max().unwrap_or(0) as i32 * 8 + 2 * MARGIN;
    let width = out.iter().map(Layout::width).max().unwrap_or(400).max(text).max(900);
    (out, (width as u32, (top - PANEL_GAP + MARGIN) as u32))
}
