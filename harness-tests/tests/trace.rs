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
        let (late, skew) = (last_start - first_end - error, cpu_clock_skew_us);
        assert!(
            late <= 0.0 || late <= skew(),
            "{what}: a rank's {cat} {k} ended at {first_end:.1} µs, before another's started at {last_start:.1} \
             µs (stated error {error} µs; this kernel's clock differs across CPUs by at most {:.1} µs): {:?}",
            skew(),
            per.values().map(|v| v[k]).collect::<Vec<_>>()
        );
    }
}

/// A clock whose offset moves by seconds during the run (stepped, or a store that lies:
/// an offset of -12,514 s was taken and a µs bound still claimed) is not aligned: its
/// label says so, the bound is claimed for the other ranks only, and the run's line names
/// the rank.
#[test]
fn a_clock_that_cannot_be_aligned_is_said_and_claims_no_bound() {
    let (r, doc) = traced(
        "jump",
        &[
            "--nproc-per-node",
            "2",
            "--transport",
            "tcp",
            "--count",
            "1000",
            "--iters",
            "4",
        ],
        &[("NCCL_WORKBOOK_FAULT", "clock-jump:1:5000000")],
    );
    let line = r
        .stdout
        .lines()
        .find(|l| l.starts_with("Trace: "))
        .unwrap_or_else(|| panic!("{r}"));
    assert!(line.contains("but rank 1's, which could not be aligned"), "{line}");
    assert_eq!(
        doc["otherData"]["unaligned_ranks"],
        serde_json::json!([1]),
        "{}",
        doc["otherData"]
    );
    let clocks = doc["otherData"]["clocks"].as_array().unwrap();
    assert_eq!(clocks[1]["aligned"], false, "{}", clocks[1]);
    assert!(
        clocks[1]["failed"].as_str().unwrap().contains("its offset moved by 5"),
        "{}",
        clocks[1]
    );
    let label = events(&doc)
        .iter()
        .find(|e| e["name"] == "process_labels" && e["pid"] == 1)
        .unwrap();
    assert!(
        label["args"]["labels"].as_str().unwrap().contains("clock NOT aligned"),
        "{label}"
    );
    // Rank 0's is the reference: the bound left is its own (nothing to be off by).
    assert!(num(&doc["otherData"], "clock_error_us") < 1.0, "{}", doc["otherData"]);
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
            let early = num(s, "ts") - num(f, "ts") - error;
            assert!(
                early <= 0.0 || early <= cpu_clock_skew_us(),
                "{what}: received before sent, beyond the stated error {error} µs and the {:.1} µs by which this \
                 kernel's clock may differ across CPUs: {s} {f}",
                cpu_clock_skew_us()
            );
        }
    }
}

/// How far apart, at most, this kernel's monotonic clock reads on two of the CPUs this
/// process may run on, in µs: measured once, and only when a check would fail without it.
/// Ranks under one kernel share its clock, and the trace says so (error 0); a virtual
/// machine whose CPUs' counters were set apart (a restored snapshot) breaks that by as
/// much, for any program: the test allows it, measured, and prints it.
fn cpu_clock_skew_us() -> f64 {
    static SKEW: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *SKEW.get_or_init(|| {
        let cpus = allowed_cpus();
        cpus.iter()
            .skip(1)
            .map(|&b| skew_between(cpus[0], b))
            .fold(0.0, f64::max)
    })
}

fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity fills it for
    // this thread, within the size given.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let ok = unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) } == 0;
    // SAFETY: CPU_ISSET reads the set filled above, for indices below CPU_SETSIZE.
    (0..libc::CPU_SETSIZE as usize)
        .filter(|&c| ok && unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

fn pin(cpu: usize) {
    // SAFETY: as in allowed_cpus; CPU_SET writes inside the set; the call pins this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set);
    }
}

/// The clock the trace reads (CLOCK_MONOTONIC), signed for differences.
fn monotonic_ns() -> i64 {
    common::trace::monotonic_ns() as i64
}

/// A ping-pong between a thread on CPU `a` and one on CPU `b`, each stamping the moment
/// it passes the ball: if `b`'s clock reads δ ahead of `a`'s, a pass a → b reads at least
/// δ and a pass b → a at least −δ, so |δ| ≤ the larger of the two quickest passes, in µs.
fn skew_between(a: usize, b: usize) -> f64 {
    use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::SeqCst};
    const PASSES: u64 = 20_000;
    let (ball, stamp) = (AtomicU64::new(0), AtomicI64::new(0));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let player = |cpu: usize, odd: bool| {
        pin(cpu);
        let mut quickest = i64::MAX;
        for i in 0..PASSES {
            let mine = 2 * i + u64::from(odd);
            while ball.load(SeqCst) != mine {
                if std::time::Instant::now() > deadline {
                    return quickest;
                }
                std::hint::spin_loop();
            }
            if mine > 0 {
                quickest = quickest.min(monotonic_ns() - stamp.load(SeqCst));
            }
            stamp.store(monotonic_ns(), SeqCst);
            ball.store(mine + 1, SeqCst);
        }
        quickest
    };
    // Both on threads of their own: the test's thread stays unpinned, as do the ranks
    // it starts afterwards (a child inherits its parent's CPUs).
    let (ab, ba) = std::thread::scope(|s| {
        let (on_b, on_a) = (s.spawn(|| player(b, true)), s.spawn(|| player(a, false)));
        (on_b.join().unwrap(), on_a.join().unwrap())
    });
    match (ab, ba) {
        (i64::MAX, _) | (_, i64::MAX) => 0.0, // no pass each way in time: nothing measured, nothing allowed
        _ => ab.max(ba).max(0) as f64 / 1e3,
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

/// Runs the all-reduce on the CPU backend tracing into `file` (created in a fresh folder
/// when `file` is `None`): the run, and the file's text if there is one.
fn traced_raw(name: &str, file: Option<&str>, args: &[&str]) -> (Run, Option<String>) {
    let dir = std::env::temp_dir().join(format!("nccl-workbook-trace-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = file.map_or_else(|| dir.join("trace.json"), std::path::PathBuf::from);
    let mut all = vec!["--backend", "cpu", "--trace", path.to_str().unwrap()];
    all.extend_from_slice(args);
    let r = finish(spawn(command(BIN, &all)), LIMIT);
    let text = file.is_none().then(|| std::fs::read_to_string(&path).ok()).flatten();
    let _ = std::fs::remove_dir_all(&dir);
    (r, text)
}

/// The events of each rank's own track (its collectives, steps, waits): what the cap counts.
fn own_track(doc: &Value) -> BTreeMap<u64, usize> {
    let mut out = BTreeMap::new();
    for e in events(doc).iter().filter(|e| e["ph"] == "X" && e["pid"] == e["tid"]) {
        *out.entry(e["pid"].as_u64().unwrap()).or_default() += 1;
    }
    out
}

/// Issue 30, item 2: 8 ranks and 1,000 iterations gathered 28 MB of trace in one frame of
/// the store (its limit is 16 MiB), and the job died with every rank blaming another. The
/// trace is gathered in bounded pieces: the run ends as it would without `--trace`.
#[test]
fn a_long_run_of_eight_ranks_is_traced_without_failing() {
    let (r, text) = traced_raw(
        "long-8",
        None,
        &["--nproc-per-node", "8", "--count", "4", "--iters", "800"],
    );
    assert_eq!(r.code, Some(0), "{r}");
    assert!(r.stdout.contains("Check: OK"), "{r}");
    assert!(!r.stderr.contains("error") && !r.stderr.contains("launcher:"), "{r}");
    let text = text.unwrap_or_else(|| panic!("no trace written:\n{r}"));
    let doc: Value = serde_json::from_str(&text).expect("the trace is one JSON document");
    // Every rank's own track, and its links, hold events.
    let per = own_track(&doc);
    assert_eq!(
        per.keys().copied().collect::<Vec<_>>(),
        (0..8).collect::<Vec<_>>(),
        "{r}"
    );
    assert!(per.values().all(|n| *n > 1000), "{per:?}");
    assert!(!flows(&doc).is_empty());
    // The count printed is the file's; the file says what each rank kept and dropped.
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
    let kept = doc["otherData"]["kept"].as_array().expect("otherData.kept");
    assert_eq!(kept.len(), 8);
    eprintln!(
        "8 ranks × 800 iterations: {} events, {:.1} MB, in {:?}",
        events(&doc).len(),
        text.len() as f64 / 1e6,
        r.elapsed
    );
}

/// Past the cap of events per rank, the later events are dropped: counted per rank in the
/// file (its metadata, and a label on the rank) and said in one line on the terminal.
#[test]
fn events_past_the_cap_are_dropped_and_counted_in_the_file_and_on_the_terminal() {
    let (r, text) = traced_raw(
        "cap-2",
        None,
        &["--nproc-per-node", "2", "--count", "4", "--iters", "15000"],
    );
    assert_eq!(r.code, Some(0), "{r}");
    assert!(r.stdout.contains("Check: OK"), "{r}");
    let doc: Value = serde_json::from_str(&text.expect("a trace")).expect("the trace is one JSON document");
    let cap = doc["otherData"]["events_per_rank_cap"]
        .as_u64()
        .expect("the cap in otherData") as usize;
    let kept = doc["otherData"]["kept"].as_array().expect("otherData.kept");
    let per = own_track(&doc);
    assert_eq!(per.len(), 2, "{per:?}");
    let mut total = 0;
    for (rank, k) in kept.iter().enumerate() {
        let (held, dropped) = (k["events"].as_u64().unwrap() as usize, k["dropped"].as_u64().unwrap());
        assert_eq!(k["rank"], rank, "{k}");
        assert_eq!(held, cap, "rank {rank} keeps its first {cap} events: {k}");
        assert!(
            dropped > 0,
            "rank {rank}: 15,000 all-reduces record more than {cap} events: {k}"
        );
        assert!(per[&(rank as u64)] <= cap, "{per:?}");
        total += dropped;
        // Said on the rank's own label, where a viewer shows it.
        let label = events(&doc)
            .iter()
            .find(|e| e["name"] == "process_labels" && e["pid"] == rank)
            .unwrap();
        assert!(
            label["args"]["labels"].as_str().unwrap().contains("not kept"),
            "{label}"
        );
        // And the rank's colour in --draw, in words (the viewer picks slices' colours).
        let colour = ["blue in --draw", "orange in --draw"][rank];
        assert!(label["args"]["labels"].as_str().unwrap().contains(colour), "{label}");
    }
    let said: Vec<&str> = r.stdout.lines().filter(|l| l.contains("not kept")).collect();
    assert_eq!(said.len(), 1, "one line says what was dropped:\n{r}");
    let total = total.to_string();
    let grouped = total
        .as_bytes()
        .rchunks(3)
        .rev()
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect::<Vec<_>>();
    assert!(
        said[0].contains(&grouped.join(",")),
        "the line names the {total} events dropped: {}",
        said[0]
    );
}

/// A trace that cannot be written at the end (the disk is full) is one line naming the
/// file, after the run's output: the ranks did not fail, and nothing says they did.
#[test]
fn a_trace_that_cannot_be_written_is_one_line_and_the_run_stays_right() {
    let (r, _) = traced_raw(
        "full",
        Some("/dev/full"),
        &["--nproc-per-node", "2", "--count", "4", "--iters", "3"],
    );
    assert!(r.stdout.contains("Check: OK"), "{r}");
    assert_eq!(r.code, Some(0), "the run itself went right:\n{r}");
    let lines: Vec<&str> = r.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line:\n{r}");
    assert!(
        lines[0].contains("/dev/full") && lines[0].contains("No space left"),
        "{r}"
    );
    assert!(!r.stderr.contains("launcher") && !r.stderr.contains("failed"), "{r}");
}

/// Outputs that cannot be written are refused before the run, in one line: a FIFO (which
/// would block the writer), a folder nobody may create files in.
#[test]
fn a_trace_path_that_cannot_be_written_is_refused_before_the_run() {
    let dir = std::env::temp_dir().join(format!("nccl-workbook-trace-test-{}-fifo", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = dir.join("pipe.json");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    for (path, says) in [
        (fifo.to_str().unwrap(), "FIFO"),
        ("/proc/trace.json", "cannot write in the folder /proc"),
    ] {
        let (r, _) = traced_raw("refused", Some(path), &["--nproc-per-node", "2", "--count", "4"]);
        assert_eq!(r.code, Some(2), "{path}: {r}");
        assert!(!r.stdout.contains("Check"), "{path}: refused before the run: {r}");
        let lines: Vec<&str> = r.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{path}: one line: {r}");
        assert!(lines[0].contains(path) && lines[0].contains(says), "{path}: {r}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
