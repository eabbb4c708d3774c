//! The overlap's picture (lesson 10's `--draw`): one rank's step, each way, on one time
//! axis: the layers it computed on one lane, the collectives its stream ran on the next
//! (a thin line from when each was issued to when it started: queued behind the one
//! before), and under them, in red, the time the step was not computing: the exposed
//! communication, what overlap tries to hide.

use crate::picture::{Font, Stroke, rgb};
use plotters_backend::DrawingBackend;
use plotters_backend::text_anchor::HPos;
use plotters_svg::SVGBackend;

/// One way of running a step, as rank 0 saw it; times in seconds since the step began.
#[derive(Clone, Debug)]
pub struct Way {
    /// "DDP: buckets all-reduced as they fill".
    pub name: String,
    /// When the step ended.
    pub step: f64,
    /// Each layer computed: its start and end.
    pub computing: Vec<(f64, f64)>,
    /// Each collective of the stream.
    pub collectives: Vec<Bar>,
}

/// A collective on the stream: when it was issued, and when it ran.
#[derive(Clone, Debug)]
pub struct Bar {
    /// Its number on the stream, from 1.
    pub seq: usize,
    pub issued: f64,
    pub ran: (f64, f64),
}

/// Computing: the layers' colour.
pub const COMPUTING: (u8, u8, u8) = (118, 183, 178);
/// Communicating: the collectives' colour.
pub const COMMUNICATING: (u8, u8, u8) = (242, 142, 43);
/// Exposed: the step not computing.
pub const EXPOSED: (u8, u8, u8) = (225, 87, 89);

/// The picture's width.
pub const WIDTH: i32 = 1000;
/// The lanes' names, left of the time axis.
pub const LABEL: i32 = 130;
/// Above the first way: the title, the legend and the time axis.
pub const HEADER: i32 = 96;
/// One way: its name, then its lanes.
pub const WAY: i32 = 100;
const RIGHT: i32 = 30;

/// Which lane of a way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lane {
    Computing,
    Communicating,
    Exposed,
}

/// Where lane `lane` of way `w` lies: its top and bottom, in pixels.
pub fn lane(w: usize, lane: Lane) -> (i32, i32) {
    let top = HEADER + w as i32 * WAY + 22;
    match lane {
        Lane::Computing => (top, top + 20),
        Lane::Communicating => (top + 26, top + 46),
        Lane::Exposed => (top + 52, top + 62),
    }
}

/// The time axis: seconds to a pixel column, for a picture whose longest step is `longest`.
#[derive(Clone, Copy, Debug)]
pub struct Axis {
    longest: f64,
}

impl Axis {
    /// The axis for `ways`.
    pub fn of(ways: &[Way]) -> Axis {
        let longest = ways.iter().map(|w| w.step).fold(0.0, f64::max);
        Axis {
            longest: if longest > 0.0 { longest } else { 1e-3 },
        }
    }

    /// The pixel column of time `t`.
    pub fn x(&self, t: f64) -> i32 {
        let span = (WIDTH - LABEL - RIGHT) as f64;
        LABEL + (t.clamp(0.0, self.longest) / self.longest * span).round() as i32
    }

    /// The ticks, in ms: a round step giving at most ten.
    fn ticks(&self) -> Vec<f64> {
        let ms = self.longest * 1e3;
        let step = [
            0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0,
        ]
        .into_iter()
        .find(|s| ms / s <= 10.0)
        .unwrap_or(10_000.0);
        (0..).map(|k| k as f64 * step).take_while(|t| *t <= ms + 1e-9).collect()
    }
}

/// The parts of `[0, step]` where no layer was computing: the exposed time.
pub fn exposed(way: &Way) -> Vec<(f64, f64)> {
    let mut busy = way.computing.clone();
    busy.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (mut out, mut at) = (vec![], 0.0);
    for (start, end) in busy {
        if start > at {
            out.push((at, start.min(way.step)));
        }
        at = f64::max(at, end);
    }
    if at < way.step {
        out.push((at, way.step));
    }
    out.retain(|(a, b)| b > a);
    out
}

/// The SVG of `ways` under `title`.
pub fn svg(title: &str, ways: &[Way]) -> Result<String, String> {
    let size = (WIDTH as u32, (HEADER + ways.len() as i32 * WAY + 10) as u32);
    let mut out = String::new();
    {
        let mut b = SVGBackend::with_string(&mut out, size);
        draw(&mut b, title, ways).map_err(|e| format!("drawing the timeline: {e}"))?;
        b.present().map_err(|e| format!("drawing the timeline: {e}"))?;
    }
    Ok(out)
}

/// The SVG in a page of its own (`--draw FILE.html`): nothing fetched.
pub fn html(title: &str, ways: &[Way]) -> Result<String, String> {
    let svg = svg(title, ways)?;
    let title = title.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
    Ok(format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{title}</title>\n</head>\n<body>\n{svg}\n</body>\n</html>\n"
    ))
}

type Drawn = Result<(), plotters_backend::DrawingErrorKind<std::io::Error>>;

fn draw(b: &mut SVGBackend, title: &str, ways: &[Way]) -> Drawn {
    let (w, h) = b.get_size();
    b.draw_rect((0, 0), (w as i32, h as i32), &rgb((255, 255, 255)), true)?;
    b.draw_text(title, &Font::new(16, HPos::Left), (20, 14))?;
    let mut x = 20;
    for (colour, text) in [
        (COMPUTING, "computing (a layer)"),
        (
            COMMUNICATING,
            "a collective running on the stream (its number; the thin line: issued, queued)",
        ),
        (EXPOSED, "exposed: the step not computing"),
    ] {
        b.draw_rect((x, 44), (x + 14, 58), &rgb(colour), true)?;
        b.draw_text(text, &Font::new(12, HPos::Left), (x + 19, 45))?;
        x += 34 + (6.2 * text.len() as f64) as i32;
    }
    let axis = Axis::of(ways);
    let grey = rgb((205, 205, 205));
    let bottom = HEADER + ways.len() as i32 * WAY;
    for t in axis.ticks() {
        let x = axis.x(t / 1e3);
        b.draw_line((x, HEADER - 8), (x, bottom), &Stroke(grey, 1))?;
        b.draw_text(&format!("{t}"), &Font::new(11, HPos::Center), (x, HEADER - 24))?;
    }
    b.draw_text("ms", &Font::new(11, HPos::Right), (LABEL - 10, HEADER - 24))?;
    for (i, way) in ways.iter().enumerate() {
        draw_way(b, &axis, i, way)?;
    }
    Ok(())
}

fn draw_way(b: &mut SVGBackend, axis: &Axis, i: usize, way: &Way) -> Drawn {
    let top = HEADER + i as i32 * WAY;
    let hidden = exposed(way).iter().map(|(a, b)| b - a).sum::<f64>();
    b.draw_text(
        &format!(
            "{}: step {:.1} ms, exposed {:.1} ms",
            way.name,
            way.step * 1e3,
            hidden * 1e3
        ),
        &Font::new(13, HPos::Left),
        (20, top + 2),
    )?;
    let label = |b: &mut SVGBackend, text: &str, (y0, y1): (i32, i32)| {
        b.draw_text(text, &Font::new(11, HPos::Right), (LABEL - 10, (y0 + y1) / 2 - 7))
    };
    let rows = [Lane::Computing, Lane::Communicating, Lane::Exposed].map(|l| lane(i, l));
    label(b, "computing", rows[0])?;
    label(b, "communicating", rows[1])?;
    label(b, "exposed", rows[2])?;
    let bar = |b: &mut SVGBackend, (t0, t1): (f64, f64), (y0, y1): (i32, i32), colour| {
        let (x0, x1) = (axis.x(t0), axis.x(t1).max(axis.x(t0) + 1));
        b.draw_rect((x0, y0), (x1, y1), &rgb(colour), true)?;
        b.draw_rect((x0, y0), (x1, y1), &rgb((255, 255, 255)), false)
    };
    for &span in &way.computing {
        bar(b, span, rows[0], COMPUTING)?;
    }
    for c in &way.collectives {
        let (y0, y1) = rows[1];
        let (xi, x0) = (axis.x(c.issued), axis.x(c.ran.0));
        if x0 > xi {
            b.draw_line((xi, (y0 + y1) / 2), (x0, (y0 + y1) / 2), &Stroke(rgb(COMMUNICATING), 1))?;
            b.draw_line((xi, y0 + 5), (xi, y1 - 5), &Stroke(rgb(COMMUNICATING), 1))?;
        }
        bar(b, c.ran, rows[1], COMMUNICATING)?;
        if axis.x(c.ran.1) - x0 >= 16 {
            let centre = (x0 + axis.x(c.ran.1)) / 2;
            b.draw_text(
                &c.seq.to_string(),
                &Font::new(11, HPos::Center).colour((255, 255, 255)),
                (centre, y0 + 4),
            )?;
        }
    }
    // The gaps between two layers (a few µs) are counted in the title, not drawn.
    for (t0, t1) in exposed(way) {
        let (x0, x1) = (axis.x(t0), axis.x(t1));
        if x1 > x0 {
            b.draw_rect((x0, rows[2].0), (x1, rows[2].1), &rgb(EXPOSED), true)?;
        }
    }
    let end = axis.x(way.step);
    b.draw_line(
        (end, rows[0].0 - 4),
        (end, rows[2].1 + 4),
        &Stroke(rgb((20, 20, 20)), 2),
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn way(computing: Vec<(f64, f64)>, collectives: Vec<Bar>, step: f64) -> Way {
        Way {
            name: "a way".into(),
            step,
            computing,
            collectives,
        }
    }

    #[test]
    fn what_is_not_computing_is_exposed() {
        let w = way(vec![(0.0, 1.0), (1.0, 2.0), (3.0, 4.0)], vec![], 5.0);
        assert_eq!(exposed(&w), vec![(2.0, 3.0), (4.0, 5.0)]);
        assert_eq!(exposed(&way(vec![], vec![], 2.0)), vec![(0.0, 2.0)]);
        assert!(exposed(&way(vec![(0.0, 2.0)], vec![], 2.0)).is_empty());
    }

    #[test]
    fn the_axis_spans_the_longest_step_with_round_ticks() {
        let a = Axis::of(&[way(vec![], vec![], 0.0237), way(vec![], vec![], 0.010)]);
        assert_eq!(a.x(0.0), LABEL);
        assert_eq!(a.x(0.0237), WIDTH - RIGHT);
        assert_eq!(a.ticks(), vec![0.0, 5.0, 10.0, 15.0, 20.0]);
    }

    /// The picture rendered to pixels: the lanes hold their colours where the times say,
    /// and nothing where they do not.
    #[test]
    fn the_rendered_timeline_has_each_bar_where_its_times_are() {
        let serial = way(
            vec![(0.0, 0.004), (0.004, 0.008)],
            vec![Bar {
                seq: 1,
                issued: 0.008,
                ran: (0.008, 0.012),
            }],
            0.012,
        );
        let overlapped = way(
            vec![(0.0, 0.004), (0.004, 0.008)],
            vec![Bar {
                seq: 1,
                issued: 0.004,
                ran: (0.005, 0.009),
            }],
            0.009,
        );
        let svg = svg("t", &[serial, overlapped]).unwrap();
        let tree = resvg::usvg::Tree::from_str(&svg, &resvg::usvg::Options::default()).unwrap();
        let size = tree.size().to_int_size();
        let mut pixmap = resvg::tiny_skia::Pixmap::new(size.width(), size.height()).unwrap();
        resvg::render(&tree, resvg::tiny_skia::Transform::default(), &mut pixmap.as_mut());
        let axis = Axis { longest: 0.012 };
        let at = |t: f64, (y0, y1): (i32, i32)| {
            let p = pixmap.pixel(axis.x(t) as u32, ((y0 + y1) / 2) as u32).unwrap();
            (p.red(), p.green(), p.blue())
        };
        // Way 0: computing, then the all-reduce alone, all of it exposed.
        assert_eq!(at(0.003, lane(0, Lane::Computing)), COMPUTING);
        assert_eq!(at(0.0105, lane(0, Lane::Computing)), (255, 255, 255));
        assert_eq!(at(0.003, lane(0, Lane::Communicating)), (255, 255, 255));
        assert_eq!(at(0.0105, lane(0, Lane::Communicating)), COMMUNICATING);
        assert_eq!(at(0.0105, lane(0, Lane::Exposed)), EXPOSED);
        assert_eq!(at(0.003, lane(0, Lane::Exposed)), (255, 255, 255));
        // Way 1: the all-reduce under the second layer, only its last ms exposed.
        assert_eq!(at(0.0065, lane(1, Lane::Communicating)), COMMUNICATING);
        assert_eq!(at(0.0065, lane(1, Lane::Exposed)), (255, 255, 255));
        assert_eq!(at(0.0085, lane(1, Lane::Exposed)), EXPOSED);
        assert_eq!(at(0.0105, lane(1, Lane::Exposed)), (255, 255, 255));
    }
}
