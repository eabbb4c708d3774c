//! Text on a bitmap, glyph by glyph, where each glyph belongs.
//!
//! plotters' own `ab_glyph` text drops each glyph's left side bearing, so that narrow
//! letters drift left (`al l_gather`, `1 0.0`). [`Glyphs`] wraps a bitmap backend: it
//! hands every shape to it unchanged and draws text itself with `ab_glyph`, from the
//! same bundled font, at the positions the font gives (advances, kerning, bearings).

use ab_glyph::{Font, FontRef, ScaleFont, point};
use plotters_backend::text_anchor::{HPos, VPos};
use plotters_backend::{BackendColor, BackendCoord, BackendStyle, BackendTextStyle, DrawingBackend, DrawingErrorKind};

/// A backend whose text is drawn with `font`, all else by `inner`.
pub struct Glyphs<B> {
    inner: B,
    font: FontRef<'static>,
}

impl<B> Glyphs<B> {
    /// Wraps `inner`; `None` when `font` is not a font.
    pub fn new(inner: B, font: &'static [u8]) -> Option<Glyphs<B>> {
        Some(Glyphs {
            inner,
            font: FontRef::try_from_slice(font).ok()?,
        })
    }

    /// Each glyph of `text` at `size`, placed on a baseline at the font's ascent, and the
    /// text's width and height.
    fn layout(&self, text: &str, size: f64) -> (Vec<ab_glyph::Glyph>, f32, f32) {
        let font = self.font.as_scaled(size as f32);
        let (mut x, mut glyphs) = (0.0, vec![]);
        let mut prev = None;
        for c in text.chars() {
            let id = font.glyph_id(c);
            if let Some(p) = prev {
                x += font.kern(p, id);
            }
            glyphs.push(id.with_scale_and_position(font.scale(), point(x, font.ascent())));
            x += font.h_advance(id);
            prev = Some(id);
        }
        (glyphs, x, font.height())
    }
}

type Drawn<E> = Result<(), DrawingErrorKind<E>>;

impl<B: DrawingBackend> DrawingBackend for Glyphs<B> {
    type ErrorType = B::ErrorType;

    fn get_size(&self) -> (u32, u32) {
        self.inner.get_size()
    }

    fn ensure_prepared(&mut self) -> Drawn<B::ErrorType> {
        self.inner.ensure_prepared()
    }

    fn present(&mut self) -> Drawn<B::ErrorType> {
        self.inner.present()
    }

    fn draw_pixel(&mut self, point: BackendCoord, color: BackendColor) -> Drawn<B::ErrorType> {
        self.inner.draw_pixel(point, color)
    }

    fn draw_line<S: BackendStyle>(&mut self, from: BackendCoord, to: BackendCoord, style: &S) -> Drawn<B::ErrorType> {
        self.inner.draw_line(from, to, style)
    }

    fn draw_rect<S: BackendStyle>(
        &mut self,
        upper_left: BackendCoord,
        bottom_right: BackendCoord,
        style: &S,
        fill: bool,
    ) -> Drawn<B::ErrorType> {
        self.inner.draw_rect(upper_left, bottom_right, style, fill)
    }

    fn draw_path<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        path: I,
        style: &S,
    ) -> Drawn<B::ErrorType> {
        self.inner.draw_path(path, style)
    }

    fn draw_circle<S: BackendStyle>(
        &mut self,
        center: BackendCoord,
        radius: u32,
        style: &S,
        fill: bool,
    ) -> Drawn<B::ErrorType> {
        self.inner.draw_circle(center, radius, style, fill)
    }

    fn fill_polygon<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        vert: I,
        style: &S,
    ) -> Drawn<B::ErrorType> {
        self.inner.fill_polygon(vert, style)
    }

    fn blit_bitmap(&mut self, pos: BackendCoord, size: (u32, u32), src: &[u8]) -> Drawn<B::ErrorType> {
        self.inner.blit_bitmap(pos, size, src)
    }

    fn draw_text<S: BackendTextStyle>(&mut self, text: &str, style: &S, pos: BackendCoord) -> Drawn<B::ErrorType> {
        let color = style.color();
        if color.alpha == 0.0 {
            return Ok(());
        }
        let (glyphs, width, height) = self.layout(text, style.size());
        // Where the text's top left corner is, from the anchor `pos` names.
        let dx = match style.anchor().h_pos {
            HPos::Left => 0.0,
            HPos::Center => -width / 2.0,
            HPos::Right => -width,
        };
        let dy = match style.anchor().v_pos {
            VPos::Top => 0.0,
            VPos::Center => -height / 2.0,
            VPos::Bottom => -height,
        };
        let turn = style.transform();
        let mut pixels = vec![];
        for glyph in glyphs {
            let Some(outline) = self.font.outline_glyph(glyph) else {
                continue; // a space
            };
            let at = outline.px_bounds().min;
            outline.draw(|x, y, coverage| {
                let x = (at.x + x as f32 + dx).round() as i32;
                let y = (at.y + y as f32 + dy).round() as i32;
                let (x, y) = turn.transform(x, y);
                pixels.push(((pos.0 + x, pos.1 + y), coverage));
            });
        }
        for (point, coverage) in pixels {
            let alpha = color.alpha * f64::from(coverage.min(1.0));
            self.inner.draw_pixel(point, BackendColor { alpha, rgb: color.rgb })?;
        }
        Ok(())
    }

    fn estimate_text_size<S: BackendTextStyle>(
        &self,
        text: &str,
        style: &S,
    ) -> Result<(u32, u32), DrawingErrorKind<B::ErrorType>> {
        let (_, width, height) = self.layout(text, style.size());
        Ok((width.ceil() as u32, height.ceil() as u32))
    }
}
