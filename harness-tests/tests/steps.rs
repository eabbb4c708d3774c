//! `--steps` and `--trace` on the all-reduce, as real multi-process jobs: the printed
//! steps follow the ring's schedule with the partial sums a ring computes (worked out
//! here, independently), and the trace holds what ran.

use serde_json::Value;
use testkit::{LIMIT, Run, command, finish, run, spawn};

const BIN: &str = env!("CARGO_BIN_EXE_harness-probe");

/// The numbers of a printed row: `| 1  1  |[4][4] |` → [1, 1, 4, 4], and which changed.
fn cells(row: &str) -> Vec<(f64, bool)> {
    let mut out = vec![];
    for word in row.replace('|', " ").split_whitespace() {
        let changed = word.starts_with('[');
        for v in word.split(['[', ']']).filter(|v| !v.is_empty()) {
            out.push((v.parse().unwrap_or_else(|_| panic!("a number in '{row}'")), changed));
        }
    }
    out
}

/// The printed steps: for each heading, each rank's row values, changed cells and words.
type Printed = Vec<(String, Vec<(Vec<(f64, bool)>, String)>)>;

fn printed(stdout: &str, world: usize) -> Printed {
    let mut out: Printed = vec![];
    let mut lines = stdout.lines().skip_while(|l| !l.starts_with("Steps of all-reduce"));
    lines.next().expect("a Steps block");
    for line in lines {
        if line.is_empty() {
            break;
        }
        if line.trim_start().starts_with('(') || (line.starts_with("    ") && !line.contains('|')) {
            continue; // the legend, the chunks' names
        }
        if !line.starts_with("    ") {
            out.push((line.trim().to_string(), vec![]));
            continue;
        }
        let after_label = &line[line.find('|').expect("a row")..];
        let (row, words) = after_label.rsplit_once("|  ").unwrap_or((after_label, ""));
        out.last_mut()
            .expect("a heading")
            .1
            .push((cells(row), words.to_string()));
    }
    for (heading, rows) in &out {
        assert_eq!(rows.len(), world, "{heading}: one row per rank");
    }
    out
}

/// Chunk i of n over `len` elements, as the ring cuts a buffer.
fn chunk(len: usize, n: usize, i: usize) -> std::ops::Range<usize> {
    len * (i % n) / n..len * (i % n + 1) / n
}

/// The ring step by step, simulated: each rank's buffer after each of the 2(n-1) steps,
/// with the chunk each rank sent and received at that step.
fn ring(n: usize, len: usize) -> Vec<Vec<(Vec<f64>, usize, usize)>> {
    let mut bufs: Vec<Vec<f64>> = (0..n).map(|r| vec![(r + 1) as f64; len]).collect();
    let mut out = vec![];
    for step in 0..2 * (n - 1) {
        let reduce = step < n - 1;
        let s = step % (n - 1);
        // Reduce-scatter: rank r sends chunk r - s; all-gather: chunk r + 1 - s.
        let sent = |r: usize| if reduce { (r + n - s) % n } else { (r + 1 + n - s) % n };
        let before = bufs.clone();
        let mut this = vec![];
        for (r, buf) in bufs.iter_mut().enumerate() {
            let left = (r + n - 1) % n;
            for i in chunk(len, n, sent(left)) {
                buf[i] = if reduce {
                    buf[i] + before[left][i]
                } else {
                    before[left][i]
                };
            }
            this.push((buf.clone(), sent(r), sent(left)));
        }
        out.push(this);
    }
    out
}

#[test]
fn steps_of_the_step_by_step_ring_follow_its_schedule_and_partial_sums() {
    for (n, count) in [(3usize, 6usize), (4, 7)] {
        let job = cpu_job(n, "tcp", count, &["--init", "rank", "--steps", "--iters", "3"]);
        let r = finish(spawn(job), LIMIT).ok();
        assert!(r.stdout.contains("Check: OK"), "{r}");
        // One block: the checked run only, not the three timed ones.
        assert_eq!(r.stdout.matches("Steps of all-reduce").count(), 1, "{r}");
        assert!(r.stdout.contains("the ring step by step"), "{r}");
        let steps = printed(&r.stdout, n);
        let want = ring(n, count);
        assert_eq!(steps.len(), 1 + want.len(), "start + 2(n-1) steps: {r}");
        assert_eq!(steps[0].0, "start");
        for (rank, (row, _)) in steps[0].1.iter().enumerate() {
            assert!(
                row.iter().all(|(v, changed)| *v == (rank + 1) as f64 && !changed),
                "{r}"
            );
        }
        for (k, ((heading, rows), want)) in steps[1..].iter().zip(&want).enumerate() {
            let (phase, i) = if k < n - 1 {
                ("reduce-scatter", k + 1)
            } else {
                ("all-gather", k + 2 - n)
            };
            assert_eq!(heading, &format!("{phase} step {i} of {}", n - 1), "{r}");
            for (rank, ((row, words), (values, sent, got))) in rows.iter().zip(want).enumerate() {
                let shown: Vec<f64> = row.iter().map(|(v, _)| *v).collect();
                assert_eq!(&shown, values, "{heading}, rank {rank}: {r}");
                // Exactly the cells of the chunk that came in are marked as changed
                // (those whose value changed: an all-gather may bring what is there).
                let prev = if k == 0 {
                    vec![(rank + 1) as f64; count]
                } else {
                    want_prev(&ring(n, count), k, rank)
                };
                for (i, (v, changed)) in row.iter().enumerate() {
                    assert_eq!(*changed, *v != prev[i], "{heading}, rank {rank}, cell {i}: {r}");
                }
                let (right, left) = ((rank + 1) % n, (rank + n - 1) % n);
                let plus = if k < n - 1 { " (+)" } else { "" };
                assert_eq!(
                    words,
                    &format!("sent chunk {sent} → rank {right}, got chunk {got} from rank {left}{plus}"),
                    "{heading}, rank {rank}: {r}"
                );
            }
        }
    }
}

fn want_prev(steps: &[Vec<(Vec<f64>, usize, usize)>], k: usize, rank: usize) -> Vec<f64> {
    steps[k - 1][rank].0.clone()
}

#[test]
fn steps_of_the_pipelined_ring_keep_partial_sums_out_of_the_buffer() {
    let args = "--backend cpu --nproc-per-node 3 --count 6 --init rank --transport shm --steps --iters 2";
    let r = run(BIN, &args.split_whitespace().collect::<Vec<_>>()).ok();
    assert!(r.stdout.contains("the ring piece by piece (pipelined)"), "{r}");
    let steps = printed(&r.stdout, 3);
    let headings: Vec<&str> = steps.iter().map(|(h, _)| h.as_str()).collect();
    assert_eq!(
        headings,
        [
            "start",
            "reduce-scatter step 1 of 2",
            "reduce-scatter step 2 of 2",
            "all-gather step 1 of 2",
            "all-gather step 2 of 2"
        ],
        "{r}"
    );
    // After the first step no buffer has changed: the partial sums travel on.
    for (rank, (row, words)) in steps[1].1.iter().enumerate() {
        assert!(row.iter().all(|(v, c)| *v == (rank + 1) as f64 && !c), "{r}");
        assert!(words.contains("a partial sum sent on next step, not kept"), "{r}");
    }
    // After the second, each rank holds the full sum (6) of chunk rank + 1, and only it.
    for (rank, (row, _)) in steps[2].1.iter().enumerate() {
        let own = chunk(6, 3, rank + 1);
        for (i, (v, changed)) in row.iter().enumerate() {
            let want = if own.contains(&i) { 6.0 } else { (rank + 1) as f64 };
            assert_eq!((*v, *changed), (want, own.contains(&i)), "rank {rank}, cell {i}: {r}");
        }
    }
    for (row, _) in &steps[4].1 {
        assert!(row.iter().all(|(v, _)| *v == 6.0), "{r}");
    }
}

#[test]
fn steps_of_a_maximum_say_what_was_kept_not_added() {
    let args = "--backend cpu --nproc-per-node 3 --count 3 --init rank --op max --steps --iters 1";
    let r = run(BIN, &args.split_whitespace().collect::<Vec<_>>()).ok();
    let steps = printed(&r.stdout, 3);
    assert_eq!(steps.len(), 5, "{r}");
    assert!(
        r.stdout
            .contains("(max) the chunk that came in was compared with this rank's own"),
        "{r}"
    );
    assert!(
        r.stdout.contains("each rank holds the full maximum of one chunk"),
        "{r}"
    );
    assert!(!r.stdout.contains("(+)") && !r.stdout.contains(" sum"), "{r}");
    // After the reduce-scatter each rank holds the maximum (3) of its chunk.
    for (rank, (row, words)) in steps[2].1.iter().enumerate() {
        assert!(words.contains("(max)"), "{r}");
        assert_eq!(row[(rank + 1) % 3], (3.0, rank != 2), "rank {rank}: {r}");
    }
}

#[test]
fn steps_change_no_result_and_say_when_they_cannot_show() {
    // JSON: the same results, and stdout stays one JSON document.
    let args = "--backend cpu --nproc-per-node 3 --count 5 --init rank --steps --iters 1 --format json";
    let j = run(BIN, &args.split_whitespace().collect::<Vec<_>>()).ok().json();
    assert_eq!(j["check"]["ok"], true);
    assert_eq!(testkit::stage(&j, "after"), vec![vec![6.0; 5]; 3]);
    // A buffer too large to show: one line, and the run goes on.
    let args = "--backend cpu --nproc-per-node 2 --count 100 --steps --iters 1";
    let r = run(BIN, &args.split_whitespace().collect::<Vec<_>>()).ok();
    let said: Vec<&str> = r.stdout.lines().filter(|l| l.contains("--steps")).collect();
    assert_eq!(said.len(), 1, "{r}");
    assert!(said[0].contains("at most 64"), "{r}");
    assert!(r.stdout.contains("Check: OK"), "{r}");
    // One rank: nothing moves, and it says so once.
    let r = run(
        BIN,
        &["--backend", "cpu", "--nproc-per-node", "1", "--steps", "--iters", "2"],
    )
    .ok();
    let said: Vec<&str> = r.stdout.lines().filter(|l| l.starts_with("--steps")).collect();
    assert_eq!(
        said,
        ["--steps: no rank sent or received anything, so there is no step to show"],
        "{r}"
    );
}

/// A trace file in a fresh temporary folder, removed when dropped.
struct TempTrace(std::path::PathBuf);

impl TempTrace {
    fn new(name: &str) -> TempTrace {
        let dir = std::env::temp_dir().join(format!("nccl-workbook-trace-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        TempTrace(dir)
    }
    fn file(&self) -> std::path::PathBuf {
        self.0.join("trace.json")
    }
}

impl Drop for TempTrace {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn spans<'a>(events: &'a [Value], pid: usize, cat: &str) -> Vec<&'a Value> {
    events
        .iter()
        .filter(|e| e["ph"] == "X" && e["pid"] == pid && e["cat"] == cat)
        .collect()
}

/// The all-reduce on the CPU backend, `n` ranks over `via`, `count` elements, then `more`.
fn cpu_job(n: usize, via: &str, count: usize, more: &[&str]) -> std::process::Command {
    let (w, c) = (n.to_string(), count.to_string());
    let mut args = vec![
        "--backend",
        "cpu",
        "--nproc-per-node",
        &w,
        "--count",
        &c,
        "--transport",
        via,
    ];
    args.extend_from_slice(more);
    command(BIN, &args)
}

/// Runs the all-reduce on `n` ranks over `via`, `count` elements, `iters` timed runs and
/// `env` set, tracing into a fresh file named after `name`: the run, checked OK, and the
/// trace's document.
fn traced(name: &str, n: usize, via: &str, count: usize, iters: usize, env: &[(&str, &str)]) -> (Run, Value) {
    let dir = TempTrace::new(name);
    let file = dir.file();
    let iters = iters.to_string();
    let mut cmd = cpu_job(n, via, count, &["--iters", &iters, "--trace", file.to_str().unwrap()]);
    cmd.envs(env.iter().copied());
    let r = finish(spawn(cmd), LIMIT).ok();
    assert!(r.stdout.contains("Check: OK"), "{r}");
    let doc = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    (r, doc)
}

fn within(child: &Value, parent: &Value) -> bool {
    let (t, d) = (child["ts"].as_f64().unwrap(), child["dur"].as_f64().unwrap());
    let (pt, pd) = (parent["ts"].as_f64().unwrap(), parent["dur"].as_f64().unwrap());
    t >= pt - 1e-3 && t + d <= pt + pd + 1e-3
}

#[test]
fn the_trace_has_a_track_per_rank_and_the_rings_steps_and_bytes_inside_each_collective() {
    let count = 6usize;
    let iters = 3usize;
    for (n, via) in [(2usize, "shm"), (3, "tcp"), (3, "shm")] {
        // 24 bytes would go direct, rank to rank (see the next test): NCCL's own
        // variable asks for the ring at every size.
        let (r, doc) = traced(&format!("{n}-{via}"), n, via, count, iters, &[("NCCL_ALGO", "Ring")]);
        assert!(r.stdout.contains("ui.perfetto.dev"), "{r}");
        assert_eq!(doc["displayTimeUnit"], "ns");
        let events = doc["traceEvents"].as_array().unwrap();
        let bytes = count * 4;
        for rank in 0..n {
            let name = events
                .iter()
                .find(|e| e["ph"] == "M" && e["name"] == "process_name" && e["pid"] == rank)
                .unwrap_or_else(|| panic!("no track for rank {rank}: {r}"));
            assert!(
                name["args"]["name"]
                    .as_str()
                    .unwrap()
                    .starts_with(&format!("rank {rank} (")),
                "{name}"
            );
            // Collectives, steps and waits on the rank's own track; sends and receives on
            // their link's (a track per peer and direction, named for it).
            for e in events.iter().filter(|e| e["ph"] == "X") {
                let own = ["collective", "step", "wait"].iter().any(|c| e["cat"] == *c);
                assert_eq!(own, e["tid"] == e["pid"], "{e}");
                if !own {
                    let track = events
                        .iter()
                        .find(|m| {
                            m["ph"] == "M" && m["name"] == "thread_name" && m["pid"] == e["pid"] && m["tid"] == e["tid"]
                        })
                        .unwrap_or_else(|| panic!("no name for the track of {e}"));
                    let arrow = if e["cat"] == "send" { "→" } else { "←" };
                    let want = format!("rank {} {arrow} rank {}", e["pid"], e["args"]["peer"]);
                    assert_eq!(track["args"]["name"], want.as_str());
                }
            }
            // The checked run, the one that lines the ranks up after the barrier (CPU
            // backend), and the timed ones.
            let colls = spans(events, rank, "collective");
            assert_eq!(colls.len(), 2 + iters, "{n} ranks over {via}, rank {rank}: {r}");
            let steps = spans(events, rank, "step");
            let sends = spans(events, rank, "send");
            for coll in &colls {
                assert_eq!(coll["name"], "all-reduce");
                assert_eq!(coll["args"]["bytes"], bytes);
                let inside: Vec<_> = steps.iter().filter(|s| within(s, coll)).collect();
                assert!(!inside.is_empty(), "{coll}");
                let sent: u64 = sends
                    .iter()
                    .filter(|s| within(s, coll))
                    .map(|s| s["args"]["bytes"].as_u64().unwrap())
                    .sum();
                // Each rank sends 2(n-1)/n of the buffer.
                assert_eq!(
                    sent as usize,
                    2 * (n - 1) * bytes / n,
                    "{n} ranks over {via}, rank {rank}"
                );
            }
            // Every step lies in a collective, every send and receive in a step.
            for s in &steps {
                assert!(colls.iter().any(|c| within(s, c)), "{s}");
            }
            for cat in ["send", "recv", "reduce"] {
                for s in spans(events, rank, cat) {
                    assert!(steps.iter().any(|p| within(s, p)), "{s}");
                    assert!(s["args"]["peer"].as_u64().unwrap() < n as u64);
                }
            }
            let firsts: Vec<&str> = steps.iter().take(1).map(|s| s["name"].as_str().unwrap()).collect();
            assert!(firsts[0].starts_with("reduce-scatter step 1"), "{firsts:?}");
            assert!(!spans(events, rank, "wait").is_empty(), "the timed runs' barrier");
        }
    }
}

#[test]
fn a_small_buffer_goes_direct_from_every_rank_to_every_rank() {
    let count = 6usize;
    for (n, via) in [(2usize, "shm"), (3, "tcp"), (4, "shm")] {
        let (r, doc) = traced(&format!("direct-{n}-{via}"), n, via, count, 2, &[]);
        let events = doc["traceEvents"].as_array().unwrap();
        let bytes = (count * 4) as u64;
        for rank in 0..n {
            // The checked run, the one that lines the ranks up, the two timed ones.
            let colls = spans(events, rank, "collective");
            assert_eq!(colls.len(), 4, "{r}");
            for coll in &colls {
                assert!(
                    coll["args"]["algorithm"].as_str().unwrap().starts_with("direct"),
                    "{coll}"
                );
                // Its whole buffer to each other rank, and each other rank's buffer in.
                for cat in ["send", "recv", "reduce"] {
                    let mut peers: Vec<u64> = spans(events, rank, cat)
                        .into_iter()
                        .filter(|s| within(s, coll))
                        .map(|s| {
                            assert_eq!(s["args"]["bytes"].as_u64(), Some(bytes), "{s}");
                            s["args"]["peer"].as_u64().unwrap()
                        })
                        .collect();
                    peers.sort();
                    let others = (0..n as u64).filter(|&p| p != rank as u64);
                    let want: Vec<u64> = match cat {
                        "send" => others.collect(),
                        // Rank 0's buffer is copied in, the others' are reduced into it.
                        "recv" => others.filter(|&p| p == 0).collect(),
                        _ => others.filter(|&p| p != 0).collect(),
                    };
                    assert_eq!(peers, want, "rank {rank}, {cat}, {n} ranks over {via}");
                }
            }
        }
    }
}

#[test]
fn a_trace_into_a_missing_folder_is_refused_before_anything_runs() {
    let r = run(
        BIN,
        &["--backend", "cpu", "--trace", "/nonexistent-folder/x/trace.json"],
    );
    assert_eq!(r.code, Some(2), "{r}");
    assert_eq!(r.stderr.lines().count(), 1, "{r}");
    assert!(r.stderr.contains("there is no folder /nonexistent-folder/x"), "{r}");
    assert!(r.stdout.is_empty(), "{r}");
    // A folder where no file can be created: refused before the run too (a file that
    // cannot be written after all, the disk full, is trace.rs's test: one line, exit 0).
    let r = run(
        BIN,
        &[
            "--backend",
            "cpu",
            "--iters",
            "1",
            "--trace",
            "/proc/no-trace-here.json",
        ],
    );
    assert_eq!(r.code, Some(2), "{r}");
    assert!(r.stdout.is_empty(), "{r}");
    let errors: Vec<&str> = r.stderr.lines().collect();
    assert_eq!(errors.len(), 1, "{r}");
    assert!(
        errors[0].starts_with("error: --trace /proc/no-trace-here.json: cannot write in the folder /proc"),
        "{r}"
    );
}

#[test]
fn on_nccl_steps_say_why_in_one_line_and_the_trace_times_each_collective() {
    let dir = TempTrace::new("nccl");
    let file = dir.file();
    let args = [
        "--simulate-gpus",
        "2",
        "--count",
        "4",
        "--steps",
        "--iters",
        "2",
        "--trace",
        file.to_str().unwrap(),
    ];
    let r = run(BIN, &args).ok();
    let said: Vec<&str> = r.stdout.lines().filter(|l| l.starts_with("--steps")).collect();
    assert_eq!(said.len(), 1, "{r}");
    assert!(
        said[0].contains("inside its own kernels") && said[0].contains("--show-calls"),
        "{r}"
    );
    assert!(!r.stdout.contains("Steps of"), "{r}");
    assert!(r.stdout.contains("Check: OK"), "{r}");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let events = doc["traceEvents"].as_array().unwrap();
    for rank in 0..2 {
        let colls = spans(events, rank, "collective");
        assert_eq!(
            colls.len(),
            4,
            "the checked run, the timed loop's warm-up and two timed ones: {r}"
        );
        assert!(
            colls
                .iter()
                .all(|c| c["name"] == "all-reduce" && c["args"]["bytes"] == 16)
        );
        assert!(
            spans(events, rank, "wait")
                .iter()
                .any(|w| w["name"].as_str().unwrap().starts_with("synchronize"))
        );
        // Each collective made one NCCL call, timed inside it with its bytes.
        let calls: Vec<&Value> = spans(events, rank, "call")
            .into_iter()
            .filter(|c| c["name"] == "ncclAllReduce")
            .collect();
        assert_eq!(calls.len(), 4, "one ncclAllReduce per collective: {r}");
        for (call, coll) in calls.iter().zip(&colls) {
            assert_eq!(call["args"]["bytes"], 16, "{call}");
            assert!(within(call, coll), "{call} inside {coll}");
        }
    }
}

#[test]
fn steps_and_trace_together_show_one_run_and_time_them_all() {
    let dir = TempTrace::new("both");
    let file = dir.file();
    let args = [
        "--backend",
        "cpu",
        "--nproc-per-node",
        "2",
        "--count",
        "4",
        "--steps",
        "--iters",
        "4",
        "--trace",
        file.to_str().unwrap(),
    ];
    let r = run(BIN, &args).ok();
    assert_eq!(r.stdout.matches("Steps of all-reduce").count(), 1, "{r}");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let events = doc["traceEvents"].as_array().unwrap();
    // The checked run, the one that lines the ranks up after the barrier, 4 timed ones.
    assert_eq!(spans(events, 0, "collective").len(), 6, "{r}");
    assert_eq!(
        spans(events, 1, "step").len(),
        6 * 2,
        "two steps per all-reduce on 2 ranks: {r}"
    );
}

#[test]
fn a_large_buffer_on_one_host_is_read_where_it_lies_unless_it_cannot_be() {
    // 480 000 bytes: past the direct switch, split evenly among 2, 3 and 4 ranks. On one
    // host each rank reads its chunk of every other rank's buffer and then every other
    // rank's finished chunk, straight from their memory: 2(n-1)/n of the buffer in, nothing
    // sent. NCCL_P2P_DISABLE=1, TCP, or buffers outside the shared arenas (the test hook)
    // bring the ring back. (NCCL_ALGO=single-copy: the tuner would keep the ring for
    // this size on a host with cores enough; what cannot copy still takes the ring.)
    let count = 120_000usize;
    // Ranks, transport, a variable set, the algorithm the trace must name.
    type Case<'a> = (usize, &'a str, Option<(&'a str, &'a str)>, &'a str);
    let cases: [Case; 6] = [
        (2, "shm", None, "single-copy"),
        (3, "shm", None, "single-copy"),
        (4, "shm", None, "single-copy"),
        (3, "shm", Some(("NCCL_P2P_DISABLE", "1")), "ring-pipelined"),
        (
            3,
            "shm",
            Some(("NCCL_WORKBOOK_FAULT", "heap-buffers")),
            "ring-pipelined",
        ),
        (3, "tcp", None, "ring: the ring step by step"),
    ];
    for (n, via, env, algorithm) in cases {
        let name = format!("single-{n}-{via}-{}", env.map_or("", |e| e.0));
        let env: Vec<_> = env.into_iter().chain([("NCCL_ALGO", "single-copy")]).collect();
        let (r, doc) = traced(&name, n, via, count, 2, &env);
        let events = doc["traceEvents"].as_array().unwrap();
        for rank in 0..n {
            let colls = spans(events, rank, "collective");
            assert_eq!(colls.len(), 4, "{r}");
            for coll in &colls {
                let said = coll["args"]["algorithm"].as_str().unwrap();
                assert!(said.starts_with(algorithm), "{n} ranks, {env:?}: {said}");
                if algorithm != "single-copy" {
                    continue;
                }
                let bytes_of = |cat: &str| -> u64 {
                    spans(events, rank, cat)
                        .into_iter()
                        .filter(|s| within(s, coll))
                        .map(|s| s["args"]["bytes"].as_u64().unwrap())
                        .sum()
                };
                let chunk = (count * 4 / n) as u64;
                assert_eq!(bytes_of("send"), 0, "rank {rank} of {n}: nothing sent");
                assert_eq!(
                    bytes_of("reduce"),
                    (n as u64 - 1) * chunk,
                    "rank {rank} of {n}: its chunk of each"
                );
                assert_eq!(
                    bytes_of("recv"),
                    (n as u64 - 1) * chunk,
                    "rank {rank} of {n}: each finished chunk"
                );
            }
        }
    }
}
