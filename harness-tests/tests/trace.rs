//! `--trace FILE` read as a viewer reads it, from real multi-process jobs: every rank's
//! times on one clock (ordered across ranks within the error the file states), an arrow
//! from each send to its receive, the steps named as `--steps` names them, slices that
//! nest, and the count the run prints is the count the file holds.

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use testkit::{LIMIT, Run, command, finish, spawn};

const BIN: &str = env!("CARGO_BIN_EXE_harness-probe");

/// Runs the all-reduce on the CPU backend with `args`, `env` set, tracing into a fresh
/// folder: the run (checked OK) and the trace's document.
fn traced(name: &str, args: &[&str], env: &[(&str, &str)]) -> (Run, Value) {
    let dir = std::env::temp_dir().join(format!("nccl-workbook-trace-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("trace.json");
    let mut all = vec!["--backend", "cpu", "--trace", file.to_str().unwrap()];
    all.extend_from_slice(args);
    let mut cmd = command(BIN, &all);
    cmd.envs(env.iter().copied());
    let r = finish(spawn(cmd), LIMIT).ok();
    let text = std::fs::read_to_string(&file);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(r.stdout.contains("Check: OK"), "{r}");
    (r, serde_json::from_str(&text.unwrap()).unwrap())
}

fn events(doc: &Value) -> &[Value] {
    doc["traceEvents"].as_array().unwrap()
}

fn num(e: &Value, key: &str) -> f64 {
    e[key].as_f64().unwrap_or_else(|| panic!("no {key} in {e}"))
}

/// The slices of category `cat`, by rank, in the order written (each rank's in time order).
fn slices<'a>(doc: &'a Value, cat: &str) -> BTreeMap<u64, Vec<&'a Value>> {
    let mut out: BTreeMap<u64, Vec<&Value>> = BTreeMap::new();
    for e in events(doc).iter().filter(|e| e["ph"] == "X" && e["cat"] == cat) {
        out.entry(e["pid"].as_u64().unwrap()).or_default().push(e);
    }
    for v in out.values_mut() {
        v.sort_by(|a, b| num(a, "ts").total_cmp(&num(b, "ts")));
    }
    out
}

/// The error the file states for its clocks, in µs.
fn stated_error(doc: &Value) -> f64 {
    doc["otherData"]["clock_error_us"]
        .as_f64()
        .unwrap_or_else(|| panic!("no clock_error_us in the trace's otherData: {}", doc["otherData"]))
}

/// The k-th call named `name` of every rank (a barrier, an all-reduce) overlaps every
/// other rank's k-th: none ends before another starts, beyond `error`.
fn overlapping(doc: &Value, cat: &str, name: &str, error: f64, what: &str) {
    let mut per = slices(doc, cat);
    for calls in per.values_mut() {
        calls.retain(|e| e["name"] == name);
    }
    let calls = per.values().map(Vec::len).min().unwrap_or(0);
    assert!(calls > 0, "{what}: no {cat} in the trace");
    for k in 0..calls {
        let last_start = per.values().map(|v| num(v[k], "ts")).fold(f64::MIN, f64::max);
        let first_end = per
            .values()
            .map(|v| num(v[k], "ts") + num(v[k], "dur"))
            .fold(f64::MAX, f64::min);
        assert!(
            first_end + error >= last_start,
            "{what}: a rank's {cat} {k} ended at {first_end:.1} µs, before another's started at {last_start:.1} \
             µs (stated error {error} µs): {:?}",
            per.values().map(|v| v[k]).collect::<Vec<_>>()
        );
    }
}

#[test]
fn a_barrier_bracketed_collective_lines_up_across_ranks_within_the_stated_error() {
    // Four ranks on this machine (one clock), then rank 1's clock 5 s ahead: it must be
    // measured through the store, and the trace must still line the ranks up.
    for (n, via, fault) in [
        ("4", "shm", None),
        ("3", "tcp", None),
        ("3", "shm", Some("clock:1:5000000")),
        ("2", "tcp", Some("clock:1:-3000000")),
    ] {
        let env: Vec<(&str, &str)> = fault.iter().map(|f| ("NCCL_WORKBOOK_FAULT", *f)).collect();
        let what = format!("{n} ranks over {via}, {fault:?}");
        let (_, doc) = traced(
            &format!("order-{n}-{via}-{}", fault.is_some()),
            &[
                "--nproc-per-node",
                n,
                "--transport",
                via,
                "--count",
                "1000",
                "--iters",
                "4",
            ],
            &env,
        );
        let error = stated_error(&doc);
        let clocks = doc["otherData"]["clocks"].as_array().unwrap();
        assert_eq!(clocks.len(), n.parse::<usize>().unwrap(), "{what}");
        match fault {
            // One kernel: one clock, nothing to be off by but the reading of each start.
            None => assert!(error < 5.0, "{what}: {}", doc["otherData"]),
            // Measured: an error, and rank 1's clock found ahead by what the hook put it
            // ahead (it is the same clock underneath), to within that error.
            Some(f) => {
                let ahead: f64 = f.rsplit(':').next().unwrap().parse().unwrap();
                let (offset, own) = (num(&clocks[1], "offset_us"), num(&clocks[1], "error_us"));
                assert!(error > 0.0 && own <= error, "{what}");
                assert!(
                    (offset + ahead).abs() <= own + 0.01,
                    "{what}: rank 1's offset {offset} ± {own} µs"
                );
            }
        }
        // The timed runs' barrier, then each all-reduce (every rank's needs every other's data).
        overlapping(&doc, "wait", "barrier", error, &what);
        overlapping(&doc, "collective", "all-reduce", error, &what);
        // A message is received after it was sent.
        let flows = flows(&doc);
        assert!(!flows.is_empty(), "{what}");
        for (s, f) in flows {
            assert!(
                num(s, "ts") <= num(f, "ts") + error,
                "{what}: received before sent: {s} {f}"
            );
        }
    }
}

/// Every flow: its start and its finish, paired by id.
fn flows(doc: &Value) -> Vec<(&Value, &Value)> {
    let mut finishes: BTreeMap<u64, Vec<&Value>> = BTreeMap::new();
    for e in events(doc).iter().filter(|e| e["ph"] == "f") {
        finishes.entry(e["id"].as_u64().unwrap()).or_default().push(e);
    }
    events(doc)
        .iter()
        .filter(|e| e["ph"] == "s")
        .map(|s| {
            let f = finishes
                .get(&s["id"].as_u64().unwrap())
                .map(Vec::as_slice)
                .unwrap_or_default();
            assert_eq!(f.len(), 1, "one finish for {s}: {f:?}");
            (s, f[0])
        })
        .collect()
}

/// The one slice of `cat` (any of `cats`) on `pid`/`tid` that holds `ts`.
fn holding<'a>(doc: &'a Value, pid: &Value, tid: &Value, ts: f64, cats: &[&str]) -> Vec<&'a Value> {
    events(doc)
        .iter()
        .filter(|e| e["ph"] == "X" && e["pid"] == *pid && e["tid"] == *tid)
        .filter(|e| cats.iter().any(|c| e["cat"] == *c))
        .filter(|e| num(e, "ts") <= ts && ts <= num(e, "ts") + num(e, "dur"))
        .collect()
}

#[test]
fn every_send_has_one_arrow_to_its_receive_and_slices_nest() {
    for (n, via, algo) in [
        ("3", "shm", "Ring"),
        ("4", "shm", "Ring"),
        ("3", "tcp", "Ring"),
        ("4", "shm", ""),
    ] {
        let what = format!("{n} ranks over {via}, NCCL_ALGO={algo}");
        let (_, doc) = traced(
            &format!("flows-{n}-{via}-{algo}"),
            &[
                "--nproc-per-node",
                n,
                "--transport",
                via,
                "--count",
                "12",
                "--iters",
                "3",
            ],
            &[("NCCL_ALGO", algo)],
        );
        let sends: Vec<&Value> = events(&doc)
            .iter()
            .filter(|e| e["ph"] == "X" && e["cat"] == "send")
            .collect();
        assert!(!sends.is_empty(), "{what}");
        let flows = flows(&doc);
        for send in &sends {
            let (t0, t1) = (num(send, "ts"), num(send, "ts") + num(send, "dur"));
            let mine: Vec<_> = flows
                .iter()
                .filter(|(s, _)| s["pid"] == send["pid"] && s["tid"] == send["tid"])
                .filter(|(s, _)| t0 <= num(s, "ts") && num(s, "ts") <= t1)
                .collect();
            assert_eq!(mine.len(), 1, "{what}: one arrow from {send}");
            let (s, f) = mine[0];
            assert_eq!((&s["cat"], &s["name"]), (&f["cat"], &f["name"]), "{what}");
            assert_eq!(f["bp"], "e", "{what}: {f}");
            // It binds to this send alone, and ends in one receive on the peer: the same
            // message (bytes, number) from this rank.
            assert_eq!(
                holding(&doc, &s["pid"], &s["tid"], num(s, "ts"), &["send"]).len(),
                1,
                "{s}"
            );
            let recv = holding(&doc, &f["pid"], &f["tid"], num(f, "ts"), &["recv", "reduce"]);
            assert_eq!(recv.len(), 1, "{what}: the receive of {send}: {recv:?}");
            assert_eq!(recv[0]["pid"], send["args"]["peer"], "{what}");
            assert_eq!(recv[0]["args"]["peer"], send["pid"], "{what}");
            assert_eq!(recv[0]["args"]["bytes"], send["args"]["bytes"], "{what}");
            assert_eq!(recv[0]["args"]["message"], send["args"]["message"], "{what}");
        }
        assert_eq!(flows.len(), sends.len(), "{what}: an arrow for each send, no more");
        // In a viewer's terms: on each track, slices nest (none overlaps another in part).
        let mut tracks: BTreeMap<(u64, u64), Vec<(f64, f64)>> = BTreeMap::new();
        for e in events(&doc).iter().filter(|e| e["ph"] == "X") {
            let key = (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap());
            tracks
                .entry(key)
                .or_default()
                .push((num(e, "ts"), num(e, "ts") + num(e, "dur")));
        }
        for (track, mut spans) in tracks {
            spans.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
            let mut open: Vec<f64> = vec![];
            for (a, b) in spans {
                while open.last().is_some_and(|end| *end <= a) {
                    open.pop();
                }
                if let Some(end) = open.last() {
                    assert!(
                        b <= *end + 1e-6,
                        "{what}: track {track:?}: [{a}, {b}] overlaps a slice ending at {end}"
                    );
                }
                open.push(b);
            }
        }
    }
}

#[test]
fn the_traces_steps_are_named_as_steps_names_them() {
    for (n, algo) in [("3", ""), ("4", "Ring"), ("2", "Ring")] {
        let what = format!("{n} ranks, NCCL_ALGO={algo}");
        let (r, doc) = traced(
            &format!("names-{n}-{algo}"),
            &["--nproc-per-node", n, "--count", "6", "--iters", "2", "--steps"],
            &[("NCCL_ALGO", algo), ("NO_COLOR", "1")],
        );
        // The headings `--steps` printed: "  reduce-scatter step 1 of 2".
        let printed: BTreeSet<String> = r
            .stdout
            .lines()
            .skip_while(|l| !l.starts_with("Steps of all-reduce"))
            .take_while(|l| !l.is_empty())
            .filter(|l| l.starts_with("  ") && !l.starts_with("   ") && !l.starts_with("  (") && l.contains("step "))
            .map(|l| l.trim().to_string())
            .collect();
        assert!(!printed.is_empty(), "{what}: {r}");
        // The steps the trace names in the same (first) all-reduce, on every rank.
        let colls = slices(&doc, "collective");
        let mut named = BTreeSet::new();
        for cat in ["send", "recv", "reduce"] {
            for (pid, parts) in slices(&doc, cat) {
                let first = colls[&pid][0];
                let (a, b) = (num(first, "ts"), num(first, "ts") + num(first, "dur"));
                for p in parts.into_iter().filter(|p| a <= num(p, "ts") && num(p, "ts") <= b) {
                    let step = p["args"]["step"]
                        .as_str()
                        .unwrap_or_else(|| panic!("{what}: no step in {p}"));
                    named.insert(step.to_string());
                }
            }
        }
        assert_eq!(named, printed, "{what}");
        // Each step slice's name says its steps, none past its phase's count.
        for (_, steps) in slices(&doc, "step") {
            for s in steps {
                let name = s["name"].as_str().unwrap();
                for said in s["args"]["steps"].as_array().unwrap() {
                    let said = said.as_str().unwrap();
                    let (k, of) = said.rsplit_once(" of ").unwrap();
                    let k: usize = k.rsplit(' ').next().unwrap().parse().unwrap();
                    assert!(k <= of.parse().unwrap(), "{what}: {said}");
                }
                assert!(name.contains(" of "), "{what}: {name}");
            }
        }
    }
}

#[test]
fn the_printed_count_is_the_number_of_events_in_the_file() {
    for (n, more) in [("3", vec!["--steps"]), ("2", vec!["--iters", "5"])] {
        let mut args = vec!["--nproc-per-node", n, "--count", "6"];
        args.extend(more);
        let (r, doc) = traced(&format!("count-{n}"), &args, &[]);
        let line = r
            .stdout
            .lines()
            .find(|l| l.starts_with("Trace: "))
            .expect("a Trace line");
        let said: usize = line["Trace: ".len()..]
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(said, events(&doc).len(), "{line}");
    }
}
