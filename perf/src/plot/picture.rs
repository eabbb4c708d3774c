//! The picture's layout: which parts of the lines' descriptions go in the title and
//! which in each label, the bounds, the two panels (busbw and time against size, on log
//! scales) and the one legend below them, whose rows make the picture taller.

use super::axes::{decades, minor_ticks, number_label, powers, size_label, size_ticks, span};
use super::marks::{colour, mark, sample};
use super::render::readable;
use super::runs::Run;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

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
/// What is drawn: the lines with their labels, the bounds, the title.
pub(super) struct Picture {
    title: String,
    pub(super) lines: Vec<Line>,
    /// (GB/s, label) of each memcpy bound.
    bounds: Vec<(f64, String)>,
}

pub(super) struct Line {
    label: String,
    /// (bytes, µs, busbw GB/s): out of place, drawn solid.
    out_of_place: Vec<(f64, f64, f64)>,
    /// The same in place, drawn dashed.
    in_place: Vec<(f64, f64, f64)>,
}

impl Picture {
    pub(super) fn of(runs: &[Run]) -> Picture {
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

    pub(super) fn draw_on<DB: DrawingBackend>(&self, root: DrawingArea<DB, Shift>) -> Result<(), String>
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
    pub(super) fn size(&self) -> (u32, u32) {
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
#[derive(Clone, Copy, PartialEq, Eq)]
enum Panel {
    Busbw,
    Time,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plot::Sweep;
    use serde_json::{Value, json};
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
}
