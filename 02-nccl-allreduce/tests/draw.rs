//! `--draw FILE.svg` as a student runs it: the picture rendered to pixels by a real SVG
//! renderer (resvg), looked at where the draw crate's layout puts each cell and arrow;
//! the ring's and the tree's pictures differ; bad input is one line and exit 2.

use testkit::{LIMIT, command, finish, spawn};
use workbook_draw::layout::{HEADER, Layout, MARGIN};
use workbook_draw::picture::{COMPLETE, rank_colour};

const BIN: &str = env!("CARGO_BIN_EXE_02-nccl-allreduce");

/// Runs the lesson on 4 ranks, 8 elements, with `algo`, drawing to a file of the test's:
/// the SVG, and what the run printed.
fn draw(algo: &str) -> (String, String) {
    // A file of this call's own: the tests run side by side.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("nccl-workbook-draw-{algo}-{}-{n}.svg", std::process::id()));
    let args = [
        "--nproc-per-node",
        "4",
        "--count",
        "8",
        "--draw",
        path.to_str().unwrap(),
    ];
    let mut cmd = command(BIN, &args);
    cmd.env("NCCL_ALGO", algo);
    let r = finish(spawn(cmd), LIMIT).ok();
    let svg = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("no picture ({e}): {r}"));
    let _ = std::fs::remove_file(&path);
    (svg, r.stdout)
}

/// The picture's pixels.
fn render(svg: &str) -> resvg::tiny_skia::Pixmap {
    let tree = resvg::usvg::Tree::from_str(svg, &resvg::usvg::Options::default()).expect("the SVG parses");
    let size = tree.size().to_int_size();
    let mut pixels = resvg::tiny_skia::Pixmap::new(size.width(), size.height()).expect("a size");
    resvg::render(&tree, resvg::tiny_skia::Transform::default(), &mut pixels.as_mut());
    pixels
}

fn pixel(p: &resvg::tiny_skia::Pixmap, (x, y): (i32, i32)) -> (u8, u8, u8) {
    let c = p.pixel(x as u32, y as u32).expect("inside the picture");
    (c.red(), c.green(), c.blue())
}

/// The geometry of one panel of 4 lanes of 8 elements in `chunks` chunks over `steps` steps.
fn layout(steps: usize, chunks: usize) -> Layout {
    let panel = workbook_draw::Panel {
        caption: String::new(),
        labels: vec![String::new(); 4],
        ranks: (0..4).collect(),
        len: 8,
        bounds: (0..=chunks).map(|c| c * 8 / chunks).collect(),
        steps: vec![String::new(); steps],
        reducing: true,
        moves: vec![],
    };
    Layout::new(&panel, MARGIN + HEADER)
}

#[test]
fn the_rings_picture_has_its_lanes_and_arrows_where_the_record_says() {
    let (svg, out) = draw("ring");
    assert!(out.contains("Drawn: all-reduce on 4 ranks, ring"), "{out}");
    assert!(out.contains("8 elements in 4 chunks, 6 steps"), "{out}");
    let p = render(&svg);
    let l = layout(6, 4);
    for r in 0..4 {
        for i in 0..8 {
            // At the start each lane is its rank's colour; at the end every cell the result.
            assert_eq!(
                pixel(&p, l.cell_centre(0, r, i)),
                rank_colour(r),
                "start, rank {r}, element {i}"
            );
            let end = l.cell_centre(6, r, i);
            // (the cell's middle holds its "all"; a little above it is the fill)
            assert_eq!(
                pixel(&p, (end.0 - 1, end.1 - 9)),
                COMPLETE,
                "end, rank {r}, element {i}"
            );
        }
        // Step 1's arrow from rank r to its right neighbour, in rank r's colour, near its
        // start (the arrow back from rank 3 to rank 0 crosses the others further on).
        let (a, b) = l.arrow(1, r, (r + 1) % 4);
        let at = (a.0 + (b.0 - a.0) * 15 / 100, a.1 + (b.1 - a.1) * 15 / 100);
        // (the line is 2 pixels wide and smoothed: its colour is found within 2 pixels)
        let want = rank_colour(r);
        let found = (-2..=2).any(|dx| pixel(&p, (at.0 + dx, at.1)) == want);
        assert!(found, "step 1's arrow from rank {r} is not at {at:?}");
    }
    // One arrowhead per message: 2 (n - 1) steps of n messages.
    assert_eq!(svg.matches("<polygon").count(), 24);
}

#[test]
fn the_tree_is_another_picture() {
    let (ring, _) = draw("ring");
    let (tree, out) = draw("tree");
    assert!(out.contains("Drawn: all-reduce on 4 ranks, tree"), "{out}");
    let (a, b) = (render(&ring), render(&tree));
    assert!(a.data() != b.data(), "the ring and the tree drew the same picture");
    // Up and down two trees of 4 ranks: 12 messages, not the ring's 24.
    assert_eq!(tree.matches("<polygon").count(), 12);
    // Every lane ends holding the result there too.
    let steps = out
        .split(" steps (")
        .next()
        .and_then(|s| s.rsplit(", ").next())
        .unwrap();
    let l = layout(steps.parse().unwrap(), 2);
    for r in 0..4 {
        let end = l.cell_centre(l.steps, r, 0);
        assert_eq!(pixel(&b, (end.0 - 1, end.1 - 9)), COMPLETE, "rank {r}: {out}");
    }
}

#[test]
fn a_page_steps_through_the_picture_and_fetches_nothing() {
    let path = std::env::temp_dir().join(format!("nccl-workbook-draw-page-{}.html", std::process::id()));
    let args = [
        "--nproc-per-node",
        "3",
        "--count",
        "6",
        "--draw",
        path.to_str().unwrap(),
    ];
    let r = finish(spawn(command(BIN, &args)), LIMIT).ok();
    let page = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("no page ({e}): {r}"));
    let _ = std::fs::remove_file(&path);
    // The ring on 3 ranks: the start and 4 steps, a frame each, each one SVG that renders.
    let frames: Vec<&str> = page.split("<div class=\"frame\"").skip(1).collect();
    assert_eq!(frames.len(), 5, "{r}");
    for (k, f) in frames.iter().enumerate() {
        let svg = &f[f.find("<svg").unwrap()..f.find("</svg>").unwrap() + 6];
        render(svg);
        // Step k adds its 3 messages.
        assert_eq!(svg.matches("<polygon").count(), 3 * k, "frame {k}");
    }
    for fetch in ["<script src", "<link", "<img", "url(", "@import"] {
        assert!(!page.contains(fetch), "the page fetches something: {fetch}");
    }
}

#[test]
fn bad_input_is_one_line_and_exit_2_before_the_run() {
    let dir = std::env::temp_dir();
    let png = dir.join("nccl-workbook-draw.png");
    let missing = dir.join("no-such-folder-here").join("x.svg");
    for (args, says) in [
        (
            vec!["--draw", png.to_str().unwrap()],
            "name a file ending in .svg (the picture) or .html",
        ),
        (vec!["--draw", missing.to_str().unwrap()], "there is no folder"),
        (vec!["--draw", dir.to_str().unwrap()], "ending in .svg"),
        (
            vec!["--count", "100", "--draw", "x.svg"],
            "pictures are drawn for buffers of at most 64",
        ),
    ] {
        let r = finish(
            spawn(command(BIN, &[&["--nproc-per-node", "2"][..], &args].concat())),
            LIMIT,
        );
        assert_eq!(r.code, Some(2), "{args:?}: {r}");
        assert_eq!(r.stderr.trim().lines().count(), 1, "{args:?}: {r}");
        assert!(r.stderr.contains(says), "{args:?}: {r}");
        assert!(!r.stdout.contains("Check:"), "refused before the run: {r}");
    }
    // On NCCL (simulated GPUs) the steps run inside NCCL's kernels: nothing to draw.
    let svg = dir.join(format!("nccl-workbook-draw-nccl-{}.svg", std::process::id()));
    let args = ["--nproc-per-node", "2", "--draw", svg.to_str().unwrap()];
    let r = finish(spawn(testkit::nccl_command(BIN, &args, 2)), LIMIT);
    assert_eq!(r.code, Some(2), "{r}");
    assert!(r.stderr.contains("--backend cpu"), "{r}");
    assert!(!svg.exists());
}
