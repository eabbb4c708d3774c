//! `--draw FILE.html`: one self-contained page that steps through the picture, a frame per
//! step (the start, then each step added), with previous, next and play. Nothing is
//! fetched: the frames are inline SVG, the script a few lines inside the page.

use crate::Panel;
use crate::picture::frame;

/// The page: every frame of `panels` under `title`.
pub fn html(title: &str, panels: &[Panel]) -> Result<String, String> {
    let steps = panels.iter().map(|p| p.steps.len()).max().unwrap_or(0);
    let mut frames = String::new();
    for s in 0..=steps {
        let svg = frame(title, panels, s)?;
        let hidden = if s == 0 { "" } else { " hidden" };
        frames.push_str(&format!(
            "<div class=\"frame\" data-step=\"{s}\"{hidden}>\n{svg}</div>\n"
        ));
    }
    Ok(format!(
        r#"<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<style>
body {{ font-family: sans-serif; margin: 1em; }}
nav {{ margin-bottom: 0.5em; }}
button {{ font-size: 1em; margin-right: 0.3em; }}
</style>
</head>
<body>
<nav>
<button id="previous" title="previous step (←)">◀ previous</button>
<button id="next" title="next step (→)">next ▶</button>
<button id="play" title="play every step (space)">play</button>
<span id="where"></span>
</nav>
{frames}<script>
const frames = document.querySelectorAll(".frame");
const last = frames.length - 1;
let at = 0, timer = null;
function show(k) {{
  at = Math.max(0, Math.min(last, k));
  frames.forEach((f, i) => f.hidden = i !== at);
  document.getElementById("where").textContent = at === 0 ? "the start" : `after step ${{at}} of ${{last}}`;
}}
function play() {{
  if (timer) {{ clearInterval(timer); timer = null; return; }}
  if (at === last) show(0);
  timer = setInterval(() => {{ if (at === last) {{ clearInterval(timer); timer = null; }} else show(at + 1); }}, 900);
}}
document.getElementById("previous").onclick = () => show(at - 1);
document.getElementById("next").onclick = () => show(at + 1);
document.getElementById("play").onclick = play;
document.addEventListener("keydown", e => {{
  if (e.key === "ArrowLeft") show(at - 1);
  if (e.key === "ArrowRight") show(at + 1);
  if (e.key === " ") {{ e.preventDefault(); play(); }}
}});
show(0);
</script>
</body>
</html>
"#,
        title = escape(title),
    ))
}

/// Text for HTML.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contributions::tests::ring;

    #[test]
    fn a_page_holds_a_frame_per_step_and_fetches_nothing() {
        let page = html("all-reduce", &[ring(3)]).unwrap();
        // The start and 4 steps; each frame one SVG, the later ones with more arrows.
        assert_eq!(page.matches("<div class=\"frame\"").count(), 5);
        assert_eq!(page.matches("<svg").count(), 5);
        let arrows: Vec<usize> = page
            .split("<div class=\"frame\"")
            .skip(1)
            .map(|f| f.matches("<polygon").count())
            .collect();
        assert_eq!(arrows, [0, 3, 6, 9, 12]);
        for fetch in ["<script src", "<link", "<img", "url(", "@import"] {
            assert!(!page.contains(fetch), "{fetch}");
        }
    }
}
