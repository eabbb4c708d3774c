//! EXERCISES.md itself, read as text: every question's folded answer, every chapter's
//! goal and time, no dates, the glossary and the links within the file. Apart from the
//! chapters' tests (chapters_*.rs), which run the binaries: this one runs none.

/// Every question of EXERCISES.md has its answer folded under it, of at most 12 lines;
/// every chapter opens with its goal and time; no line holds a date; the introduction
/// links the glossary, which defines the terms it promises: one entry of at most two lines
/// per term, each with its own anchor, in alphabetical order; and every link within the
/// file lands on an anchor of it.
#[test]
fn every_question_has_a_folded_answer_and_the_glossary_is_there() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../EXERCISES.md");
    let text = std::fs::read_to_string(path).unwrap();
    let questions: Vec<&str> = text.split("**Question ").skip(1).collect();
    assert!(questions.len() >= 15, "{} questions", questions.len());
    for q in &questions {
        let name = q.split("**").next().unwrap();
        let before_next_heading = q.split("\n## ").next().unwrap();
        assert!(
            before_next_heading.contains("<details><summary>Answer</summary>"),
            "question {name} has no folded answer"
        );
    }
    // A workbook, not a lab notebook: every answer short, every chapter opening with its
    // goal and its time, no dates (the figures of a day are in docs/measured.md).
    for answer in text.split("<details><summary>Answer</summary>\n").skip(1) {
        let body = answer.split("</details>").next().unwrap().trim_matches('\n');
        let lines = body.lines().count();
        assert!(lines <= 12, "an answer of {lines} lines (at most 12): {body:.80}…");
    }
    for chapter in text.split("\n## ").skip(1) {
        let (title, body) = chapter.split_once('\n').unwrap();
        if title.starts_with(|c: char| c.is_ascii_digit()) || title.starts_with("Appendix") {
            let opening = body.trim_start().split("\n\n").next().unwrap();
            assert!(
                opening.starts_with("**Goal:**") && opening.contains("**Time:**"),
                "chapter {title:?} does not open with its goal and time"
            );
        }
    }
    let dated = text.lines().find(|l| {
        l.as_bytes().windows(10).any(|w| {
            w.iter().enumerate().all(|(i, b)| match i {
                4 | 7 => *b == b'-',
                _ => b.is_ascii_digit(),
            }) && w.starts_with(b"20")
        })
    });
    assert_eq!(dated, None, "a date in EXERCISES.md");
    let intro = text.split("\n## ").next().unwrap();
    assert!(
        intro.contains("[glossary](#glossary)"),
        "the introduction links the glossary"
    );
    let glossary = text.split("\n## Glossary\n").nth(1).expect("a glossary");
    let glossary = glossary.split("\n## ").next().unwrap();
    // Each entry: `- <a id="glossary-TERM"></a>**Term**...`, then at most one more line.
    let mut entries: Vec<Vec<&str>> = Vec::new();
    for line in glossary.lines().filter(|l| !l.trim().is_empty()) {
        if line.starts_with("- ") {
            entries.push(vec![line]);
        } else {
            assert!(line.starts_with("  "), "a glossary line outside an entry: {line:?}");
            entries.last_mut().expect("an entry").push(line);
        }
    }
    let mut ids = Vec::new();
    for entry in &entries {
        let id = entry[0]
            .strip_prefix("- <a id=\"")
            .and_then(|rest| rest.split_once("\"></a>**"))
            .map(|(id, _)| id)
            .unwrap_or_else(|| panic!("an entry without its anchor: {:?}", entry[0]));
        assert!(entry.len() <= 2, "the entry {id} has {} lines", entry.len());
        ids.push(id);
    }
    let mut sorted = ids.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(ids, sorted, "the glossary's entries, in alphabetical order, once each");
    for term in [
        "algbw",
        "algorithm",
        "all-gather",
        "all-to-all",
        "alpha-beta",
        "busbw",
        "channel",
        "chunk",
        "communicator",
        "deadlock",
        "eager",
        "futex",
        "group",
        "hierarchical-all-reduce",
        "kernel",
        "local-rank",
        "net",
        "nvlink",
        "p2p",
        "pipeline",
        "protocol",
        "rank",
        "reduce-scatter",
        "rendezvous",
        "rendezvous-protocol",
        "ring",
        "root",
        "shm",
        "single-copy",
        "spinning",
        "split",
        "store",
        "stream",
        "transport",
        "tree",
        "tuner",
        "world",
    ] {
        let id = format!("glossary-{term}");
        assert!(ids.contains(&id.as_str()), "the glossary has no {term}");
        assert!(
            intro.contains(&format!("(#{id})")),
            "the introduction does not link {term}"
        );
    }
    // Every `](#anchor)` of the file: an `<a id>` of it, or a heading's (GitHub's slug).
    let mut anchors: Vec<String> = text
        .split("<a id=\"")
        .skip(1)
        .map(|rest| rest.split('"').next().unwrap().to_string())
        .collect();
    for heading in text.lines().filter(|l| l.starts_with('#')) {
        let title = heading.trim_start_matches('#').trim().to_lowercase();
        let slug: String = title
            .chars()
            .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        anchors.push(slug);
    }
    for link in text.split("](#").skip(1) {
        let anchor = link.split(')').next().unwrap();
        assert!(anchors.iter().any(|a| a == anchor), "the link #{anchor} lands nowhere");
    }
}
