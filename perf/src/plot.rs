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

mod glyphs;

use clap::Args;
use clap::builder::TypedValueParser as _;
use common::error;
use plotters::coord::Shift;
use plotters::element::{Drawable, PointCollection};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters_backend::{BackendCoord, DrawingErrorKind};
use serde_json::Value;
use std::collections::BTreeSet;
use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

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

/// One run to draw: who ran it, and its sweeps.
#[derive(Debug, Clone, Default)]
pub struct Run {
    /// Where it comes from: `this run`, or the stem of the file it was saved in.
    pub name: String,
    /// Number of ranks.
    pub ranks: usize,
    /// How ranks exchanged data: `shm`, `tcp`, `shm+tcp`, or empty (NCCL, one rank).
    pub transport: String,
    /// `cpu`, `nccl`, or another library's name (`gloo`, `mpi`).
    pub backend: String,
    /// The host(s) it ran on: `vm`, `a+b`, or `8 hosts`.
    pub host: String,
    /// One line each.
    pub sweeps: Vec<Sweep>,
}

/// One line of the picture: a collective, type and operator over sizes.
#[derive(Debug, Clone, Default)]
pub struct Sweep {
    /// nccl-tests' name: `all_reduce`.
    pub op: String,
    /// The element type: `float`.
    pub datatype: String,
    /// The operator, or empty when the collective reduces nothing.
    pub redop: String,
    /// The run's single-thread memcpy bandwidth, GB/s, when it measured it.
    pub memcpy_gbps: Option<f64>,
    /// (bytes, µs, busbw GB/s) per size, out of place: separate send and receive buffers.
    pub out_of_place: Vec<(f64, f64, f64)>,
    /// The same, in place: one buffer (empty where a saved result has no such column).
    pub in_place: Vec<(f64, f64, f64)>,
}

impl Sweep {
    /// What the label says of the placements: nothing when both are drawn (the legend's
    /// key tells solid from dashed), else the one there is.
    fn placement(&self) -> &'static str {
        match (self.out_of_place.is_empty(), self.in_place.is_empty()) {
            (false, false) | (true, true) => "",
            (false, true) => "out of place",
            (true, false) => "in place",
        }
    }
}

impl From<&common::report::Perf> for Sweep {
    /// This run's sweep, as its `--format json` would be read back.
    fn from(p: &common::report::Perf) -> Sweep {
        Sweep {
            // With -A, each algorithm a line of its own.
            op: match &p.nccl_algo {
                Some(a) => format!("{} ({a})", p.op),
                None => p.op.clone(),
            },
            datatype: p.datatype.clone(),
            redop: if p.redop == "none" {
                String::new()
            } else {
                p.redop.clone()
            },
            memcpy_gbps: Some(p.memcpy_gbps),
            out_of_place: p
                .rows
                .iter()
                .map(|r| (r.size as f64, r.out_of_place.time_us, r.out_of_place.busbw))
                .collect(),
            in_place: p
                .rows
                .iter()
                .map(|r| (r.size as f64, r.in_place.time_us, r.in_place.busbw))
                .collect(),
        }
    }
}

/// A backend as a line's label names it: NCCL on simulated GPUs says so (`--simulate-gpus`:
/// host memory, so no figure of the picture is a GPU's).
pub fn backend_label(backend: &str, simulated_gpus: Option<usize>) -> String {
    match simulated_gpus {
        Some(_) if backend == "nccl" => "nccl backend on simulated GPUs (host memory)".into(),
        _ => backend.into(),
    }
}

/// The largest result `--plot-with` reads: a sweep of every collective, operator and type
/// over 64 sizes is about 5 MiB of JSON.
pub const RESULT_MAX_BYTES: u64 = 64 << 20;

/// Reads a result saved with `--format json` (or a file in the same form that another
/// library's benchmark wrote: `bench/compare-mpi.sh --save-results`): a regular file of
/// at most [`RESULT_MAX_BYTES`], whose path is taken as the OS gives it (any bytes).
pub fn load(file: OsString) -> Result<Run, String> {
    let path = Path::new(&file);
    let cannot = |e: std::io::Error| format!("cannot read it ({})", common::output_file::reason(&e));
    let regular = |m: &std::fs::Metadata| -> Result<(), String> {
        match m.is_file() {
            true => Ok(()),
            false => Err(format!(
                "it is {}, not a regular file; save a result with 07-nccl-perf --format json > FILE",
                common::output_file::kind(m)
            )),
        }
    };
    // Looked at before it is opened: opening a FIFO would wait for a writer.
    regular(&std::fs::metadata(path).map_err(cannot)?)?;
    let opened = std::fs::File::open(path).map_err(cannot)?;
    let meta = opened.metadata().map_err(cannot)?;
    regular(&meta)?;
    let too_long = || {
        format!(
            "it is longer than the {} MiB a result may be; save a result with 07-nccl-perf --format json > FILE",
            RESULT_MAX_BYTES >> 20
        )
    };
    if meta.len() > RESULT_MAX_BYTES {
        return Err(too_long());
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    opened
        .take(RESULT_MAX_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(cannot)?;
    if bytes.len() as u64 > RESULT_MAX_BYTES {
        return Err(too_long()); // it grew while read
    }
    let json: Value = serde_json::from_slice(&bytes)
        .map_err(|e| format!("it is not JSON ({e}); save a result with 07-nccl-perf --format json > FILE"))?;
    let name = path
        .file_stem()
        .map_or(path.to_string_lossy(), |s| s.to_string_lossy())
        .into_owned();
    Run::from_json(&json, &name)
}

fn reason(text: &str) -> String {
    text.split(" (os error").next().unwrap_or(text).to_lowercase()
}

/// The largest value of each column a result may hold: far above any machine's (a
/// petabyte, eleven days, a petabyte a second), far below what would make the picture's
/// scales endless.
const MAX_SIZE: f64 = (1u64 << 50) as f64;
const MAX_TIME_US: f64 = 1e12;
const MAX_GBPS: f64 = 1e6;

/// `value` of `column` when it is a number from 0 to `max`, else why not.
fn in_range(value: f64, column: &str, max: f64) -> Result<f64, String> {
    match value.is_finite() && (0.0..=max).contains(&value) {
        true => Ok(value),
        false => {
            let shown = match value.abs() >= 1e6 {
                true => format!("{value:e}"),
                false => format!("{value}"),
            };
            Err(format!("{column} {shown} is out of range: 0 to {max:e}"))
        }
    }
}

impl Run {
    /// A run from its JSON report; `name` says where it came from.
    pub fn from_json(json: &Value, name: &str) -> Result<Run, String> {
        let not = |what: &str| {
            format!("it is not a benchmark result ({what}); save one with 07-nccl-perf --format json > FILE")
        };
        let ranks = json["world_size"].as_u64().ok_or_else(|| not("no world_size"))? as usize;
        let sweeps: Vec<&Value> = match json["sweeps"].as_array() {
            Some(all) => all.iter().collect(),
            None if json["rows"].is_array() => vec![json],
            None => return Err(not("no rows: is it another example's output?")),
        };
        let text = |v: &Value, key: &str| v[key].as_str().unwrap_or_default().to_string();
        let transports: BTreeSet<&str> = match json["transports"].as_object() {
            Some(map) => map.values().filter_map(Value::as_str).collect(),
            None => json["transport"].as_str().into_iter().collect(),
        };
        let hosts: BTreeSet<&str> = match json["ranks"].as_array() {
            Some(ranks) => ranks.iter().filter_map(|r| r["host"].as_str()).collect(),
            None => json["host"].as_str().into_iter().collect(),
        };
        let simulated = json["simulated_gpus"].as_u64().map(|n| n as usize);
        let backend = match json["backend"].as_str() {
            Some(b) => backend_label(b, simulated),
            None if text(json, "call").starts_with("MPI_") => "mpi".into(),
            None => String::new(),
        };
        let mut run = Run {
            name: name.into(),
            ranks,
            transport: transports.into_iter().collect::<Vec<_>>().join("+"),
            backend,
            host: match hosts.len() {
                0..=2 => hosts.into_iter().collect::<Vec<_>>().join("+"),
                n => format!("{n} hosts"),
            },
            sweeps: vec![],
        };
        for s in sweeps {
            let (mut out_of_place, mut in_place) = (vec![], vec![]);
            for row in s["rows"].as_array().into_iter().flatten() {
                // Open MPI's broadcast has one buffer: in place only.
                let places = [
                    (&mut out_of_place, &row["out_of_place"]),
                    (&mut in_place, &row["in_place"]),
                ];
                let (Some(size), true) = (row["size"].as_f64(), places.iter().any(|(_, p)| p.is_object())) else {
                    return Err(not("a row without a size or a time"));
                };
                let size = in_range(size, "size", MAX_SIZE).map_err(|e| not(&e))?;
                for (points, p) in places.into_iter().filter(|(_, p)| p.is_object()) {
                    match (p["time_us"].as_f64(), p["busbw"].as_f64()) {
                        (Some(t), Some(b)) => points.push((
                            size,
                            in_range(t, "time_us", MAX_TIME_US).map_err(|e| not(&e))?,
                            in_range(b, "busbw", MAX_GBPS).map_err(|e| not(&e))?,
                        )),
                        _ => return Err(not("a row without time_us or busbw")),
                    }
                }
            }
            let redop = text(s, "redop");
            let memcpy_gbps = match s["memcpy_gbps"].as_f64().or(json["memcpy_gbps"].as_f64()) {
                Some(g) => Some(in_range(g, "memcpy_gbps", MAX_GBPS).map_err(|e| not(&e))?),
                None => None,
            };
            run.sweeps.push(Sweep {
                op: text(s, "op"),
                datatype: text(s, "type"),
                redop: if redop == "none" { String::new() } else { redop },
                memcpy_gbps,
                out_of_place,
                in_place,
            });
        }
        if run
            .sweeps
            .iter()
            .all(|s| s.out_of_place.is_empty() && s.in_place.is_empty())
        {
            return Err(not("no rows"));
        }
        Ok(run)
    }

    /// What tells this run's lines apart from another run's: ranks, transport, backend, host.
    fn parts(&self) -> [String; 4] {
        let plural = if self.ranks == 1 { "" } else { "s" };
        [
            format!("{} rank{plural}", self.ranks),
            self.transport.clone(),
            match self.backend.as_str() {
                "" => String::new(),
                b if b.contains("backend") => b.to_string(),
                b => format!("{b} backend"),
            },
            match self.host.as_str() {
                "" => String::new(),
                h => format!("on {h}"),
            },
        ]
    }
}

/// The bundled font (DejaVu Sans; its licence is beside it).
static DEJAVU_SANS: &[u8] = include_bytes!("../fonts/DejaVuSans.ttf");

/// The bundled font, registered once as plotters' `sans-serif` (the SVG's text widths).
fn register_font() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // The bytes are a valid font, checked by the tests; a failure would only lose text.
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, DEJAVU_SANS);
    });
}

/// The lines' colours, in order (Tableau 10): tests look for them in the picture.
pub const PALETTE: [(u8, u8, u8); 10] = [
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (127, 127, 127),
    (188, 189, 34),
    (23, 190, 207),
];

/// The size in pixels (PNG) or units (SVG) of the two panels with the title; the legend
/// below them makes the picture taller by [`legend_height`].
pub const SIZE: (u32, u32) = (1400, 600);

/// The legend below the panels: its columns, and the height of a row.
const LEGEND_COLUMNS: usize = 3;
const LEGEND_ROW: u32 = 22;

/// The height of the legend of `lines` lines, with its key to the placements (solid: out
/// of place, dashed: in place) on a row of its own when `key`.
pub fn legend_height(lines: usize, key: bool) -> u32 {
    (lines.div_ceil(LEGEND_COLUMNS) + usize::from(key)) as u32 * LEGEND_ROW + 16
}

/// Draws `runs` into `target`; the title and each line's label say what tells them
/// apart. Returns how many lines were drawn.
pub fn draw(target: &Target, runs: &[Run]) -> Result<usize, String> {
    register_font();
    let picture = Picture::of(runs);
    let drawn = match target.format {
        Format::Png => match glyphs::Glyphs::new(BitMapBackend::new(&target.path, picture.size()), DEJAVU_SANS) {
            Some(png) => picture.draw_on(png.into_drawing_area()),
            None => Err("the bundled font is not a font".into()),
        },
        Format::Svg => picture.draw_on(SVGBackend::new(&target.path, picture.size()).into_drawing_area()),
    };
    drawn.map_err(|e| format!("--plot {}: {e}", target.path.display()))?;
    Ok(picture.lines.len())
}

/// The bitmap backend's error (plotters does not name its type).
type PngError = <BitMapBackend<'static> as DrawingBackend>::ErrorType;

/// A drawing error as one line a person reads (`no space left on device`): plotters
/// prints its bitmap errors in Rust's debug form (`ImageError(IoError(Os { code: 28, ..`).
fn readable<E: std::error::Error + Send + Sync + 'static>(e: &DrawingAreaErrorKind<E>) -> String {
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

/// `--no-run`: draws the saved results only, and says where; no rank starts.
pub fn draw_saved(args: &PlotArgs) -> ExitCode {
    let Some(target) = &args.plot else {
        error::say_line("error: --no-run draws into --plot FILE, which is missing (see --help)");
        return ExitCode::from(error::EXIT_USAGE);
    };
    match draw(target, &args.plot_with) {
        Ok(n) => {
            common::error::print_line(
                &format!("# Plot: {} ({})", target.path.display(), lines(n)),
                common::error::OnClosed::Drop,
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

/// What is drawn: the lines with their labels, the bounds, the title.
struct Picture {
    title: String,
    lines: Vec<Line>,
    /// (GB/s, label) of each memcpy bound.
    bounds: Vec<(f64, String)>,
}

struct Line {
    label: String,
    /// (bytes, µs, busbw GB/s): out of place, drawn solid.
    out_of_place: Vec<(f64, f64, f64)>,
    /// The same in place, drawn dashed.
    in_place: Vec<(f64, f64, f64)>,
}

impl Picture {
    fn of(runs: &[Run]) -> Picture {
        // Every line's description: the run's parts, then the sweep's. Parts that every
        // line shares go in the title; the others make the line's label.
        let mut described = vec![];
        for run in runs {
            for s in &run.sweeps {
                let mut parts = vec![
                    s.op.clone(),
                    s.datatype.clone(),
                    s.redop.clone(),
                    s.placement().to_string(),
                ];
                parts.extend(run.parts());
                described.push((parts, run, s));
            }
        }
        let width = described.first().map_or(0, |(p, _, _)| p.len());
        let shared: Vec<bool> = (0..width)
            .map(|i| described.iter().all(|(p, _, _)| p[i] == described[0].0[i]))
            .collect();
        let join = |parts: &[String], keep: &dyn Fn(usize) -> bool| -> String {
            let kept: Vec<&str> = (0..parts.len())
                .filter(|i| keep(*i) && !parts[*i].is_empty())
                .map(|i| parts[i].as_str())
                .collect();
            kept.join(", ")
        };
        let title = match described.first().map(|(parts, _, _)| join(parts, &|i| shared[i])) {
            Some(common) if !common.is_empty() => format!("07-nccl-perf: {common}"),
            _ => "07-nccl-perf".into(),
        };
        let mut lines: Vec<Line> = described
            .iter()
            .map(|(parts, _, s)| Line {
                // One line alone (or the same setup twice): the sweep names it.
                label: match join(parts, &|i| !shared[i]) {
                    l if l.is_empty() => join(parts, &|i| i < 3),
                    l => l,
                },
                out_of_place: s.out_of_place.clone(),
                in_place: s.in_place.clone(),
            })
            .collect();
        // Lines that still read alike (the same setup run twice) say where they come from.
        let labels: Vec<String> = lines.iter().map(|l| l.label.clone()).collect();
        for (line, (_, run, _)) in lines.iter_mut().zip(&described) {
            if labels.iter().filter(|l| **l == line.label).count() > 1 {
                line.label = format!("{} ({})", line.label, run.name);
            }
        }
        // One bound per host: the first run's measurement there (named by its host when
        // the runs come from several).
        let mut per_host: Vec<(f64, &str)> = vec![];
        for run in runs {
            if let Some(gbps) = run.sweeps.iter().find_map(|s| s.memcpy_gbps)
                && per_host.iter().all(|(_, h)| *h != run.host)
            {
                per_host.push((gbps, &run.host));
            }
        }
        let several = per_host.len() > 1;
        let bounds = per_host
            .into_iter()
            .map(|(gbps, host)| match several {
                true => (gbps, format!("memcpy, 1 thread: {gbps:.1} GB/s on {host}")),
                false => (gbps, format!("memcpy, 1 thread: {gbps:.1} GB/s")),
            })
            .collect();
        Picture { title, lines, bounds }
    }

    fn draw_on<DB: DrawingBackend>(&self, root: DrawingArea<DB, Shift>) -> Result<(), String>
    where
        DB::ErrorType: 'static,
    {
        let fail = |e: DrawingAreaErrorKind<DB::ErrorType>| readable(&e);
        root.fill(&WHITE).map_err(fail)?;
        let root = root.titled(&self.title, ("sans-serif", 24)).map_err(fail)?;
        let below = self.size().1 - SIZE.1;
        let (panels, legend) = root.split_vertically(root.dim_in_pixel().1 - below);
        let (left, right) = panels.split_horizontally(SIZE.0 / 2);
        self.panel(&left, Panel::Busbw).map_err(fail)?;
        self.panel(&right, Panel::Time).map_err(fail)?;
        self.legend(&legend).map_err(fail)?;
        root.present().map_err(fail)
    }

    /// Whether the legend has a key to the placements: some line has both, or the lines
    /// differ in which one they have.
    fn key(&self) -> bool {
        let solid = self.lines.iter().any(|l| !l.out_of_place.is_empty());
        let dashed = self.lines.iter().any(|l| !l.in_place.is_empty());
        solid && dashed
    }

    /// [`SIZE`], taller by the rows of the legend below the panels.
    fn size(&self) -> (u32, u32) {
        (SIZE.0, SIZE.1 + legend_height(self.lines.len(), self.key()))
    }

    /// The picture's one legend, in columns under both panels (so that it hides no line):
    /// the key to the placements on the first row, then each line's colour and label.
    fn legend<DB: DrawingBackend>(
        &self,
        area: &DrawingArea<DB, Shift>,
    ) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
        let rows = self.lines.len().div_ceil(LEGEND_COLUMNS);
        let width = (SIZE.0 as i32 - 80) / LEGEND_COLUMNS as i32;
        let font = ("sans-serif", 14)
            .into_font()
            .color(&BLACK)
            .pos(Pos::new(HPos::Left, VPos::Center));
        let mut top = 8;
        if self.key() {
            let grey = RGBColor(90, 90, 90);
            let keys = [
                (false, "out of place (send and receive buffers)"),
                (true, "in place (one buffer)"),
            ];
            for (k, (dashed, text)) in keys.into_iter().enumerate() {
                let x = 80 + k as i32 * width;
                let stroke = grey.stroke_width(3);
                match dashed {
                    false => area.draw(&PathElement::new(vec![(x, top), (x + 24, top)], stroke))?,
                    true => {
                        for d in [0, 10, 20] {
                            area.draw(&PathElement::new(vec![(x + d, top), (x + d + 5, top)], stroke))?;
                        }
                    }
                }
                area.draw(&Text::new(text, (x + 34, top), font.clone()))?;
            }
            top += LEGEND_ROW as i32;
        }
        for (i, line) in self.lines.iter().enumerate() {
            let x = 80 + (i / rows) as i32 * width;
            let y = top + (i % rows) as i32 * LEGEND_ROW as i32;
            area.draw(&sample(i, (x, y)))?;
            area.draw(&Text::new(line.label.as_str(), (x + 34, y), font.clone()))?;
        }
        Ok(())
    }

    fn panel<DB: DrawingBackend>(
        &self,
        area: &DrawingArea<DB, Shift>,
        panel: Panel,
    ) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
        let value = |p: &(f64, f64, f64)| match panel {
            Panel::Busbw => p.2,
            Panel::Time => p.1,
        };
        let points = || {
            self.lines
                .iter()
                .flat_map(|l| l.out_of_place.iter().chain(l.in_place.iter()))
        };
        let sizes: Vec<f64> = points().map(|p| p.0).filter(|v| *v > 0.0).collect();
        let mut values: Vec<f64> = points().map(value).filter(|v| *v > 0.0).collect();
        if panel == Panel::Busbw {
            // Room above each bound for its label.
            values.extend(self.bounds.iter().map(|b| b.0 * 3.0));
        }
        let (x0, x1) = span(&sizes, 1.0);
        let (y0, y1) = span(&values, 10.0);
        let (x0, x1) = (x0 / 1.25, x1 * 1.25);
        // Whole decades, with room for the marks of the lowest and highest points.
        let (y0, y1) = decades(y0 / 1.2, y1 * 1.2);
        let (caption, y_desc) = match panel {
            Panel::Busbw => ("Bus bandwidth", "busbw (GB/s)"),
            Panel::Time => ("Time per operation", "time (µs)"),
        };
        let mut chart = ChartBuilder::on(area)
            .caption(caption, ("sans-serif", 18))
            .margin(14)
            .x_label_area_size(48)
            .y_label_area_size(72)
            .build_cartesian_2d(
                (x0..x1)
                    .log_scale()
                    .with_key_points(size_ticks(x0, x1))
                    .with_light_points(powers(x0, x1, 2.0)),
                (y0..y1)
                    .log_scale()
                    .with_key_points(powers(y0, y1, 10.0))
                    .with_light_points(minor_ticks(y0, y1)),
            )?;
        chart
            .configure_mesh()
            .x_desc("size (bytes, log scale)")
            .y_desc(format!("{y_desc}, log scale"))
            .x_label_formatter(&|v| size_label(*v))
            .y_label_formatter(&|v| number_label(*v))
            .label_style(("sans-serif", 14))
            .axis_desc_style(("sans-serif", 15))
            .bold_line_style(RGBColor(205, 205, 205))
            .light_line_style(RGBColor(238, 238, 238))
            .draw()?;
        for (i, line) in self.lines.iter().enumerate() {
            let color = colour(i);
            let series = |points: &[(f64, f64, f64)]| -> Vec<(f64, f64)> {
                points
                    .iter()
                    .map(|p| (p.0, value(p)))
                    .filter(|p| p.0 > 0.0 && p.1 > 0.0)
                    .collect()
            };
            let (solid, dashed) = (series(&line.out_of_place), series(&line.in_place));
            chart.draw_series(LineSeries::new(solid.clone(), color.stroke_width(3)))?;
            chart.draw_series(solid.into_iter().map(|p| mark(i, p, true)))?;
            chart.draw_series(DashedLineSeries::new(dashed.clone(), 9, 6, color.stroke_width(2)))?;
            chart.draw_series(dashed.into_iter().map(|p| mark(i, p, false)))?;
        }
        if panel == Panel::Busbw {
            // Bounds of several hosts may lie close: their labels stand side by side.
            for (k, (gbps, label)) in self.bounds.iter().enumerate() {
                let dashed = DashedLineSeries::new(vec![(x0, *gbps), (x1, *gbps)], 10, 6, BLACK.stroke_width(2));
                chart.draw_series(dashed)?;
                let text = ("sans-serif", 14)
                    .into_font()
                    .color(&BLACK)
                    .pos(Pos::new(HPos::Left, VPos::Bottom));
                chart.draw_series(std::iter::once(
                    EmptyElement::at((x0, *gbps)) + Text::new(label.clone(), (8 + 290 * k as i32, -6), text),
                ))?;
            }
        }
        Ok(())
    }
}

/// Line `i`'s colour: the palette's, in turn.
fn colour(i: usize) -> RGBColor {
    let (r, g, b) = PALETTE[i % PALETTE.len()];
    RGBColor(r, g, b)
}

/// The mark at each point of line `i` (a circle, then, once the colours have all been
/// used, a triangle, a square, a cross, so that no two lines look alike), filled out of
/// place and open in place; in the legend, with a stroke of the line through it.
struct Mark<C> {
    at: C,
    line: usize,
    in_legend: bool,
    filled: bool,
}

fn mark<C>(line: usize, at: C, filled: bool) -> Mark<C> {
    Mark {
        at,
        line,
        in_legend: false,
        filled,
    }
}

/// Line `i` as its legend shows it, from `at` rightwards: a stroke and its mark.
fn sample(line: usize, at: BackendCoord) -> Mark<BackendCoord> {
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

#[derive(Clone, Copy, PartialEq, Eq)]
enum Panel {
    Busbw,
    Time,
}

/// The smallest and largest of `values`, or around `fallback` when there are none.
fn span(values: &[f64], fallback: f64) -> (f64, f64) {
    let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = values.iter().copied().fold(0.0, f64::max);
    match lo.is_finite() && hi > 0.0 {
        true if hi > lo => (lo, hi),
        true => (lo / 2.0, hi * 2.0),
        false => (fallback / 10.0, fallback * 10.0),
    }
}

/// `lo..hi` widened to whole decades: every power of ten is a labelled line.
fn decades(lo: f64, hi: f64) -> (f64, f64) {
    (
        10f64.powf((lo.log10() + 1e-9).floor()),
        10f64.powf((hi.log10() - 1e-9).ceil()),
    )
}

/// The powers of `base` from `lo` to `hi`.
fn powers(lo: f64, hi: f64, base: f64) -> Vec<f64> {
    // (A hair of slack: log10(1e-4) may come out as -3.9999999999999996.)
    let first = (lo.log(base) - 1e-9).ceil() as i32;
    let last = (hi.log(base) + 1e-9).floor() as i32;
    // Values are bounded when read (a petabyte at most): never an endless axis.
    (first..=last.min(first.saturating_add(4096)))
        .map(|k| base.powi(k))
        .collect()
}

/// 2, 3, ... 9 times each power of ten, for the faint lines.
fn minor_ticks(lo: f64, hi: f64) -> Vec<f64> {
    powers(lo / 10.0, hi, 10.0)
        .into_iter()
        .flat_map(|d| (2..10).map(move |m| d * m as f64))
        .filter(|v| *v > lo && *v < hi)
        .collect()
}

/// Labelled sizes: every 2nd, 3rd, ... power of two, so that at most 9 are labelled.
fn size_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let all = powers(lo, hi, 2.0);
    let step = all.len().div_ceil(9).max(1);
    all.into_iter().step_by(step).collect()
}

/// `4 B`, `32 KiB`, `64 MiB`.
fn size_label(bytes: f64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < units.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{} {}", number_label(v), units[unit])
}

/// `0.01`, `3`, `1000`, `1e4`: short, and never `0.30000000000000004`.
fn number_label(v: f64) -> String {
    if v >= 1e4 {
        return format!("1e{}", v.log10().round());
    }
    let rounded: f64 = format!("{v:.3e}").parse().unwrap_or(v);
    format!("{rounded}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ticks_and_labels_read_as_people_write_them() {
        assert_eq!(size_label(4.0), "4 B");
        assert_eq!(size_label(65536.0), "64 KiB");
        assert_eq!(size_label(64.0 * 1048576.0), "64 MiB");
        assert_eq!(number_label(0.001), "0.001");
        assert_eq!(number_label(0.1 + 0.2), "0.3");
        assert_eq!(number_label(1e6), "1e6");
        assert_eq!(decades(0.03, 12.0), (0.01, 100.0));
        assert_eq!(decades(0.00014, 10.0), (1e-4, 10.0));
        assert_eq!(powers(1e-4, 1e-2, 10.0).len(), 3);
        assert_eq!(powers(3.0, 70.0, 2.0), [4.0, 8.0, 16.0, 32.0, 64.0]);
        assert!(size_ticks(4.0, 64.0 * 1048576.0).len() <= 9);
        assert_eq!(minor_ticks(1.0, 10.0).len(), 8);
    }

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

    fn result(ranks: usize, via: &str) -> Value {
        json!({"backend": "cpu", "world_size": ranks, "transports": {"0-1": via},
               "ranks": [{"host": "vm"}], "op": "all_reduce", "type": "float", "redop": "sum",
               "memcpy_gbps": 10.0,
               "rows": [{"size": 4, "out_of_place": {"time_us": 10.0, "busbw": 0.001}},
                        {"size": 1024, "out_of_place": {"time_us": 20.0, "busbw": 0.1}}]})
    }

    fn p_sweep() -> Sweep {
        Sweep {
            out_of_place: vec![(4.0, 1.0, 0.1)],
            ..Sweep::default()
        }
    }

    #[test]
    fn labels_say_what_tells_lines_apart_and_the_title_the_rest() {
        let a = Run::from_json(&result(2, "shm"), "a").unwrap();
        let b = Run::from_json(&result(4, "shm"), "b").unwrap();
        let p = Picture::of(&[a.clone(), b]);
        assert_eq!(
            p.title,
            "07-nccl-perf: all_reduce, float, sum, out of place, shm, cpu backend, on vm"
        );
        let labels: Vec<&str> = p.lines.iter().map(|l| l.label.as_str()).collect();
        assert_eq!(labels, ["2 ranks", "4 ranks"]);
        assert_eq!(p.bounds.len(), 1);
        // The same setup twice: the file names tell them apart.
        let again = Run {
            name: "again".into(),
            ..a.clone()
        };
        let p = Picture::of(&[a, again]);
        assert_eq!(p.lines[1].label, "all_reduce, float, sum (again)");
        // One legend, below the panels: one row for two lines (no key: out of place only).
        assert_eq!(p.size(), (SIZE.0, SIZE.1 + LEGEND_ROW + 16));
        // Many lines: the legend grows, and the picture with it.
        let many = Run {
            sweeps: vec![p_sweep(); 12],
            ..Run::from_json(&result(2, "tcp"), "m").unwrap()
        };
        let p = Picture::of(&[many]);
        assert_eq!(p.size(), (SIZE.0, SIZE.1 + 4 * LEGEND_ROW + 16));
    }

    #[test]
    fn saved_results_are_read_or_refused_with_a_reason() {
        let mpi = json!({"op": "broadcast", "call": "MPI_Bcast", "world_size": 2, "type": "float",
                         "redop": "sum", "rows": [{"size": 4, "out_of_place": null,
                         "in_place": {"time_us": 1.0, "busbw": 0.004}}]});
        let run = Run::from_json(&mpi, "mpi").unwrap();
        assert_eq!(
            (run.backend.as_str(), run.sweeps[0].in_place[0]),
            ("mpi", (4.0, 1.0, 0.004))
        );
        let hello = json!({"example": "00-nccl-hello-world", "world_size": 2, "ranks": []});
        assert!(
            Run::from_json(&hello, "h")
                .unwrap_err()
                .contains("not a benchmark result")
        );
        assert!(
            Run::from_json(&json!([1, 2]), "x")
                .unwrap_err()
                .contains("no world_size")
        );
    }
}
