//! Drawing a picture into its file: a PNG (through [`super::glyphs`], for text placed
//! glyph by glyph) or an SVG, both with the bundled font; and a drawing error as the
//! one line a person reads.

use super::glyphs;
use super::picture::Picture;
use super::{Format, Run, Target};
use plotters::prelude::*;
use plotters_backend::DrawingErrorKind;

/// The bundled font (DejaVu Sans; its licence is beside it).
static DEJAVU_SANS: &[u8] = include_bytes!("../../fonts/DejaVuSans.ttf");

/// The bundled font, registered once as plotters' `sans-serif` (the SVG's text widths).
fn register_font() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // The bytes are a valid font, checked by the tests; a failure would only lose text.
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, DEJAVU_SANS);
    });
}
/// Draws `runs` into `target`; the title and each line's label say what tells them
/// apart. Returns how many lines were drawn.
pub fn draw(target: &Target, runs: &[Run]) -> Result<usize, String> {
    register_font();
    let picture = Picture::of(runs);
    // Drawn whole or not at all: into a file beside the target, renamed over it once
    // complete (common::output_file); a device (/dev/null) is drawn on directly.
    let device = common::output_file::is_device(&target.path);
    let into = match device {
        true => target.path.clone(),
        false => common::output_file::part_of(&target.path),
    };
    let drawn = match target.format {
        Format::Png => match glyphs::Glyphs::new(BitMapBackend::new(&into, picture.size()), DEJAVU_SANS) {
            Some(png) => picture.draw_on(png.into_drawing_area()),
            None => Err("the bundled font is not a font".into()),
        },
        Format::Svg => picture.draw_on(SVGBackend::new(&into, picture.size()).into_drawing_area()),
    };
    let renamed = |()| match device {
        true => Ok(()),
        false => std::fs::rename(&into, &target.path).map_err(|e| common::output_file::reason(&e)),
    };
    if let Err(e) = drawn.and_then(renamed) {
        if !device {
            let _ = std::fs::remove_file(&into);
        }
        return Err(format!("--plot {}: {e}", target.path.display()));
    }
    Ok(picture.lines.len())
}

/// The bitmap backend's error (plotters does not name its type).
type PngError = <BitMapBackend<'static> as DrawingBackend>::ErrorType;

/// A drawing error as one line a person reads (`no space left on device`): plotters
/// prints its bitmap errors in Rust's debug form (`ImageError(IoError(Os { code: 28, ..`).
pub(super) fn readable<E: std::error::Error + Send + Sync + 'static>(e: &DrawingAreaErrorKind<E>) -> String {
    let DrawingAreaErrorKind::BackendError(kind) = e else {
        return e.to_string();
    };
    let e = match kind {
        DrawingErrorKind::DrawingError(e) => e,
        DrawingErrorKind::FontError(f) => return format!("the font: {}", reason(&f.to_string())),
    };
    let any: &dyn std::any::Any = e;
    if let Some(io) = any.downcast_ref::<std::io::Error>() {
        return common::output_file::reason(io); // SVG
    }
    match any.downcast_ref::<PngError>() {
        Some(PngError::IOError(io)) => common::output_file::reason(io),
        // image's error shows the I/O error's own words.
        Some(PngError::ImageError(image)) => reason(&image.to_string()),
        Some(PngError::InvalidBuffer) => "the picture's buffer does not have its size".into(),
        None => reason(&e.to_string()),
    }
}
fn reason(text: &str) -> String {
    text.split(" (os error").next().unwrap_or(text).to_lowercase()
}
