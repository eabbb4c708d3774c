//! The benchmark's picture (`--plot perf.png`): busbw and time against size, both on log
//! scales, one line per sweep of each run drawn (this one, and results saved before with
//! `--format json`: shm against TCP, 2 against 4 ranks, ours against Gloo or Open MPI),
//! and a reference, the single-thread memcpy bandwidth in memory, as a dashed line.
//!
//! Both placements are drawn in a sweep's colour: out of place (separate send and receive
//! buffers, nccl-tests' first columns) as a solid line with filled marks, in place (one
//! buffer) as a dashed line with open marks; a saved result with one placement only has
//! that one (its label says which). One legend for the whole picture, below both panels.
//! Text is drawn with a font the workspace bundles (DejaVu Sans, `perf/fonts/`), so that
//! a machine with no fonts installed draws the same picture.
//!
//! Here the flags (`--plot`, `--plot-with`, `--no-run`); beside it, the runs drawn
//! (`runs`), the layout of title, panels and legend (`picture`), the axes (`axes`), the
//! lines' colours and marks (`marks`), and the PNG or SVG written (`render`, `glyphs`).

mod axes;
mod glyphs;
mod marks;
mod picture;
mod render;
mod runs;

pub use marks::PALETTE;
pub use picture::{SIZE, legend_height};
pub use render::draw;
pub use runs::{RESULT_MAX_BYTES, Run, Sweep, backend_label, load};

use clap::Args;
use clap::builder::TypedValueParser as _;
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use workbook_runtime::error;

/// The flags that ask for a picture.
#[derive(Args, Debug, Clone, Default)]
#[command(next_help_heading = "Plot")]
pub struct PlotArgs {
    /// Draw busbw and time against size into FILE after the table: a .png or an .svg
    /// (the extension picks which), written by rank 0.
    #[arg(long, value_name = "FILE", value_parser = clap::builder::OsStringValueParser::new().try_map(parse_target))]
    pub plot: Option<Target>,
    /// Draw this result too, saved before with `--format json > RESULT.json` (repeatable,
    /// at most 64 MiB each): shm against TCP, 2 against 4 ranks, ours against Gloo.
    #[arg(long = "plot-with", value_name = "RESULT.json", requires = "plot",
          value_parser = clap::builder::OsStringValueParser::new().try_map(load))]
    pub plot_with: Vec<Run>,
    /// Measure nothing: only draw the --plot-with results into --plot.
    #[arg(long, requires_all = ["plot", "plot_with"])]
    pub no_run: bool,
}

/// Where a picture goes, and in which format.
#[derive(Debug, Clone)]
pub struct Target {
    /// The file.
    pub path: PathBuf,
    /// PNG or SVG, from the file's extension.
    pub format: Format,
}

/// The formats a picture can be written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// A bitmap: what a README or a chat shows.
    Png,
    /// Vector graphics, with the text as text.
    Svg,
}

/// `perf.png` or `perf.svg`, in a folder that exists, where this process may write: checked
/// when the flags are read, so that a picture that cannot be written stops the run
/// before it starts, not after it. The path is taken as the OS gives it (any bytes).
pub fn parse_target(s: OsString) -> Result<Target, String> {
    let path = PathBuf::from(s);
    let ext = path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
    let format = match ext.as_deref() {
        Some("png") => Format::Png,
        Some("svg") => Format::Svg,
        _ => return Err("a plot is a .png or an .svg file (its extension picks the format)".into()),
    };
    common::output_file::check(&path, "a plot")?;
    Ok(Target { path, format })
}
/// `--no-run`: draws the saved results only, and says where; no rank starts.
pub fn draw_saved(args: &PlotArgs) -> ExitCode {
    let Some(target) = &args.plot else {
        error::say_line("error: --no-run draws into --plot FILE, which is missing (see --help)");
        return ExitCode::from(error::EXIT_USAGE);
    };
    match draw(target, &args.plot_with) {
        Ok(n) => {
            workbook_runtime::error::print_line(
                &format!("# Plot: {} ({})", target.path.display(), lines(n)),
                workbook_runtime::error::OnClosed::Drop,
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            error::say_line(&format!("error: {e}"));
            ExitCode::from(error::EXIT_FAILURE)
        }
    }
}

/// `1 line`, `3 lines`: what a picture holds, as the output says it.
pub fn lines(n: usize) -> String {
    format!("{n} line{}: busbw and time against size", if n == 1 { "" } else { "s" })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_png_or_svg() {
        assert_eq!(parse_target("perf.PNG".into()).unwrap().format, Format::Png);
        assert_eq!(parse_target("perf.svg".into()).unwrap().format, Format::Svg);
        assert!(parse_target("perf.pdf".into()).unwrap_err().contains(".png or an .svg"));
        assert!(
            parse_target("/no/such/folder/perf.png".into())
                .unwrap_err()
                .contains("no folder")
        );
    }
}
