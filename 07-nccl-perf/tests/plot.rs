//! The benchmark's pictures, made by real runs and read back: a PNG is decoded and must
//! be a plot (its size, many colours, the lines' colours), an SVG must hold its lines
//! and its legend as text, saved runs overlay, and bad requests end in one line, exit 2,
//! before any rank starts. No test looks at a time.

use std::collections::HashSet;
use std::path::PathBuf;
use testkit::{Run, run};
use workbook_perf::plot::{PALETTE, SIZE};

const BIN: &str = env!("CARGO_BIN_EXE_07-nccl-perf");

/// A small, quick sweep.
const SWEEP: &str = "-b 4 -e 64K -f 8 -n 2 -w 1";

/// A fresh folder for one test's files.
fn folder(test: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("plot-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn perf(line: &str) -> Run {
    let words: Vec<&str> = line.split_whitespace().collect();
    run(BIN, &words)
}

/// A PNG's width, height and RGB pixels.
fn decode(path: &PathBuf) -> (u32, u32, Vec<[u8; 3]>) {
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut reader = png::Decoder::new(std::io::BufReader::new(file)).read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    let channels = info.color_type.samples();
    assert!(channels >= 3, "{:?}", info.color_type);
    let pixels = buf[..info.buffer_size()]
        .chunks(channels)
        .map(|p| [p[0], p[1], p[2]])
        .collect();
    (info.width, info.height, pixels)
}

/// Pixels of a line's colour.
fn of_colour(pixels: &[[u8; 3]], (r, g, b): (u8, u8, u8)) -> usize {
    pixels.iter().filter(|p| **p == [r, g, b]).count()
}

/// Checks that `path` is a real plot with `lines` lines in it.
fn check_png(path: &PathBuf, lines: usize) {
    let (w, h, pixels) = decode(path);
    assert_eq!(w, SIZE.0);
    // The legend is below the panels: the picture is taller than they are.
    assert!(h > SIZE.1, "{h} pixels high for {lines} lines");
    let colours: HashSet<[u8; 3]> = pixels.iter().copied().collect();
    assert!(colours.len() > 50, "{} colours: a blank picture?", colours.len());
    let drawn = pixels.iter().filter(|p| **p != [255, 255, 255]).count();
    assert!(drawn > pixels.len() / 50, "{drawn} of {} pixels drawn", pixels.len());
    for (i, colour) in PALETTE.iter().take(lines).enumerate() {
        assert!(
            of_colour(&pixels, *colour) > 200,
            "line {i}'s colour {colour:?} is missing"
        );
    }
    if lines < PALETTE.len() {
        assert_eq!(of_colour(&pixels, PALETTE[lines]), 0, "more lines than {lines}");
    }
}

#[test]
fn a_run_draws_a_png_of_busbw_and_time_against_size() {
    let dir = folder("png");
    let png = dir.join("perf.png");
    let r = perf(&format!("{SWEEP} --plot {}", png.display())).ok();
    assert!(
        r.stdout.contains(&format!("# Plot: {} (1 line: ", png.display())),
        "{r}"
    );
    check_png(&png, 1);
    // With --format json, stdout stays one JSON document; the picture is drawn all the same.
    let svg = dir.join("perf.svg");
    let r = perf(&format!("{SWEEP} --format json --plot {}", svg.display())).ok();
    assert_eq!(r.json()["op"], "all_reduce", "{r}");
    assert!(std::fs::read_to_string(&svg).unwrap().contains("<svg"));
}

#[test]
fn many_lines_get_their_legend_below_the_panels() {
    // Every collective and type: 30 lines, one size each.
    let png = folder("many").join("many.png");
    let r = perf(&format!(
        "--coll all -d all -b 64 -e 64 -n 1 -w 0 --plot {}",
        png.display()
    ))
    .ok();
    assert!(r.stdout.contains("(30 lines: "), "{r}");
    check_png(&png, 30);
}

#[test]
fn saved_runs_overlay_this_one_or_each_other() {
    let dir = folder("overlay");
    let mut saved = vec![];
    for n in [2, 3] {
        let r = perf(&format!("{SWEEP} --nproc-per-node {n} --format json")).ok();
        let file = dir.join(format!("shm-{n}.json"));
        std::fs::write(&file, &r.stdout).unwrap();
        saved.push(format!("--plot-with {}", file.display()));
    }
    // Saved runs only: no rank starts.
    let png = dir.join("saved.png");
    let r = perf(&format!("--plot {} {} --no-run", png.display(), saved.join(" "))).ok();
    assert_eq!(
        r.stdout.trim(),
        format!("# Plot: {} (2 lines: busbw and time against size)", png.display())
    );
    check_png(&png, 2);
    // This run (1 rank) and a saved one, as an SVG: lines, legend and title as text.
    let svg = dir.join("both.svg");
    perf(&format!(
        "{SWEEP} --nproc-per-node 1 --plot {} {}",
        svg.display(),
        saved[0]
    ))
    .ok();
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.contains("<svg"), "{text}");
    assert!(text.contains("<polyline") || text.contains("<path"), "{text}");
    let texts: Vec<&str> = text
        .split("<text")
        .skip(1)
        .filter_map(|t| t.split_once('>')?.1.split_once("</text>").map(|(s, _)| s.trim()))
        .collect();
    // The legend: this run has no transport (1 rank), the saved one shared memory.
    for label in ["1 rank", "2 ranks, shm", "busbw (GB/s), log scale"] {
        assert!(texts.contains(&label), "no text '{label}' in the SVG: {texts:?}");
    }
    for words in ["07-nccl-perf: all_reduce, float, sum", "memcpy, 1 thread"] {
        assert!(
            texts.iter().any(|t| t.contains(words)),
            "no '{words}' in the SVG: {texts:?}"
        );
    }
}

#[test]
fn plot_at_its_defaults_sweeps_sizes_and_draws_both_placements() {
    // No -b, -e or -f: the default sweep is one size (32 MiB), one dot; --plot sweeps.
    let dir = folder("defaults");
    let png = dir.join("perf.png");
    // (-n 1 -w 0: fewer runs per size, the same sizes.)
    let r = perf(&format!("-n 1 -w 0 --format json --plot {}", png.display())).ok();
    let json = r.json();
    let rows = json["rows"].as_array().expect("rows");
    let sizes: Vec<u64> = rows.iter().filter_map(|r| r["size"].as_u64()).collect();
    assert!(sizes.len() >= 8, "{sizes:?}");
    assert!(sizes.windows(2).all(|w| w[1] > w[0]), "{sizes:?}");
    assert_eq!((sizes[0], *sizes.last().unwrap()), (8, 32 << 20), "{sizes:?}");
    for row in rows {
        for place in ["out_of_place", "in_place"] {
            assert!(
                row[place]["time_us"].as_f64().is_some_and(|t| t > 0.0),
                "{place}: {row}"
            );
        }
    }
    check_png(&png, 1);
    // As text: the line's label and the key to the placements once each: one legend for
    // the picture, not one per panel.
    let svg = dir.join("perf.svg");
    perf(&format!("{SWEEP} --coll broadcast --plot {}", svg.display())).ok();
    let text = std::fs::read_to_string(&svg).unwrap();
    let texts = svg_texts(&text);
    for label in [
        "broadcast, float",
        "out of place (send and receive buffers)",
        "in place (one buffer)",
    ] {
        let n = texts.iter().filter(|t| **t == label).count();
        assert_eq!(n, 1, "'{label}' {n} times in the SVG: {texts:?}");
    }
}

/// The texts of an SVG, in order.
fn svg_texts(svg: &str) -> Vec<&str> {
    svg.split("<text")
        .skip(1)
        .filter_map(|t| t.split_once('>')?.1.split_once("</text>").map(|(s, _)| s.trim()))
        .collect()
}

/// Checks a refusal: exit 2, one line on stderr that says `why`, nothing started.
fn refused(r: &Run, why: &str) {
    assert_eq!(r.code, Some(2), "{r}");
    assert_eq!(r.stderr.trim().lines().count(), 1, "{r}");
    assert!(r.stderr.contains(why), "{r}");
    assert!(!r.stderr.contains("panicked"), "{r}");
    assert!(r.stdout.is_empty(), "a rank started:\n{r}");
}

#[test]
fn a_plot_that_cannot_be_made_is_refused_in_one_line_before_any_rank_starts() {
    let dir = folder("bad");
    refused(
        &perf(&format!("{SWEEP} --plot {}", dir.join("perf.pdf").display())),
        ".png or an .svg",
    );
    refused(&perf(&format!("{SWEEP} --plot /no/such/folder/perf.png")), "no folder");
    let missing = dir.join("missing.json");
    refused(
        &perf(&format!(
            "{SWEEP} --plot {} --plot-with {}",
            dir.join("p.png").display(),
            missing.display()
        )),
        "cannot read it",
    );
    let garbage = dir.join("garbage.json");
    std::fs::write(&garbage, "# nccl-tests text, not JSON\n").unwrap();
    refused(
        &perf(&format!(
            "--plot {} --plot-with {} --no-run",
            dir.join("p.png").display(),
            garbage.display()
        )),
        "is not JSON",
    );
    let hello = dir.join("hello.json");
    std::fs::write(
        &hello,
        r#"{"example": "00-nccl-hello-world", "world_size": 2, "ranks": []}"#,
    )
    .unwrap();
    refused(
        &perf(&format!(
            "--plot {} --plot-with {} --no-run",
            dir.join("p.png").display(),
            hello.display()
        )),
        "not a benchmark result",
    );
    refused(&perf("--no-run"), "--plot");
    assert!(!dir.join("p.png").exists());
}
