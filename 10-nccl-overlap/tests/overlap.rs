//! The overlap lesson as real multi-process jobs: every way's results checked element by
//! element on 1 to 4 ranks, on the CPU backend, on the NCCL test double and on two
//! emulated nodes; bad input; a rank killed while the others wait on their handles.

use testkit::{LIMIT, command, finish, nccl_command, spawn};

const BIN: &str = env!("CARGO_BIN_EXE_10-nccl-overlap");

/// A small model: 3 layers of 12·16² + 13·16 = 3280 parameters, buckets of 1 layer or so.
const SMALL: [&str; 8] = [
    "--layers",
    "3",
    "--hidden",
    "16",
    "--compute-us",
    "200",
    "--bucket-mb",
    "0.01",
];

/// Checks a job's report: every check passed, and the four ways with their collectives:
/// one all-reduce; one per bucket (the model's 38 KiB in buckets of 10 KiB or a little
/// more: 4, the last one shorter); one all-gather per layer, twice.
fn check(j: &serde_json::Value, ctx: &str) {
    assert_eq!(j["check"]["ok"], true, "{ctx}");
    let ways = j["overlap"].as_array().unwrap_or_else(|| panic!("no ways: {ctx}"));
    let count: Vec<u64> = ways.iter().map(|w| w["collectives"].as_u64().unwrap()).collect();
    assert_eq!(count, [1, 4, 3, 3], "{ctx}");
    for w in ways {
        let (step, computing) = (w["step_ms"].as_f64().unwrap(), w["computing_ms"].as_f64().unwrap());
        assert!(computing > 0.0 && step >= computing, "{w}: {ctx}");
    }
}

#[test]
fn every_way_averages_and_gathers_right_on_1_to_4_ranks() {
    for world in 1..=4 {
        let w = world.to_string();
        let args = [&["--nproc-per-node", &w, "--format", "json"][..], &SMALL].concat();
        let r = finish(spawn(command(BIN, &args)), LIMIT).ok();
        check(&r.json(), &format!("{world} ranks: {r}"));
    }
}

/// A timeline of many buckets shows the first twelve, says how many it leaves out, and
/// ends with the last bucket (the one the step waits for): 3 layers of 12 tensors, a
/// bucket each and a last one.
#[test]
fn a_long_timeline_ends_with_its_last_bucket() {
    let args = [&["--nproc-per-node", "1"][..], &SMALL[..6], &["--bucket-mb", "0.0001"]].concat();
    let r = finish(spawn(command(BIN, &args)), LIMIT).ok();
    let way: Vec<&str> = r
        .stdout
        .lines()
        .skip_while(|l| !l.starts_with("DDP: buckets"))
        .skip(1)
        .take_while(|l| l.starts_with("    "))
        .collect();
    assert_eq!(way.len(), 14, "{r}");
    assert!(way[11].starts_with("    all-reduce 12 ("), "{r}");
    let more: usize = way[12]
        .strip_prefix("    … ")
        .and_then(|t| t.strip_suffix(" more"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no '… N more': {r}"));
    assert!(
        way[13].starts_with(&format!("    all-reduce {} (", 12 + more + 1)),
        "{r}"
    );
}

#[test]
fn on_simulated_gpus_and_on_two_emulated_nodes() {
    let args = [
        &["--backend", "nccl", "--nproc-per-node", "2", "--format", "json"][..],
        &SMALL,
    ]
    .concat();
    let r = finish(spawn(nccl_command(BIN, &args, 2)), LIMIT).ok();
    let j = r.json();
    check(&j, &format!("simulated GPUs: {r}"));
    // NCCL's kernels run on the GPU: the stream's busy time is not the host's to measure.
    assert!(j["overlap"][1]["communicating_ms"].is_null(), "{r}");

    let runs = testkit::two_nodes(|node, job| {
        let args = [job, &["--nproc-per-node", "1", "--link", "50us,10Gbps"][..], &SMALL].concat();
        let mut cmd = command(BIN, &args);
        cmd.env("SLURMD_NODENAME", format!("node{node}"));
        cmd
    });
    let runs = runs.map(|r| r.ok());
    let j = runs[0].json();
    check(&j, &format!("two emulated nodes: {}", runs[0]));
    assert!(
        j["overlap"][1]["communicating_ms"].as_f64().unwrap() > 0.0,
        "{}",
        runs[0]
    );
}

/// On NCCL, the collectives go to a stream of their own, each after an event recorded on
/// the compute stream, and the layers are kernels there: a collective may not finish
/// before the kernels issued before it, however early the host issued it. With two
/// layers of 150 ms and a tiny model, DDP's one all-reduce (issued right after the two
/// launches) is waited no sooner than 300 ms after the step began; without the order it
/// would be done in a millisecond or two. `--show-calls` shows the streams and events.
#[test]
fn on_simulated_gpus_a_collective_waits_for_the_kernels_issued_before_it() {
    let args = [
        "--backend",
        "nccl",
        "--nproc-per-node",
        "2",
        "--format",
        "json",
        "--layers",
        "2",
        "--hidden",
        "8",
        "--compute-us",
        "150000",
        "--iters",
        "1",
        "--show-calls",
    ];
    let r = finish(spawn(nccl_command(BIN, &args, 2)), LIMIT).ok();
    let j = r.json();
    assert_eq!(j["check"]["ok"], true, "{r}");
    let ddp = &j["streams"][0]["collectives"][0];
    let (issued, waited) = (ddp["issued"].as_f64().unwrap(), ddp["waited"].as_f64().unwrap());
    assert!(issued < 0.15, "issued before the kernels ran: {ddp}");
    assert!(waited >= 0.3, "the all-reduce ended before the layers' kernels: {ddp}");
    // FSDP's step ends when its last kernel does.
    assert!(j["overlap"][2]["step_ms"].as_f64().unwrap() >= 300.0, "{r}");
    let out = format!("{}\n{}", r.stdout, r.stderr);
    // Each rank writes a line in one piece: two ranks' lines never share one.
    let mixed: Vec<&str> = out.lines().filter(|l| l.matches(" │ ").count() > 1).collect();
    assert!(mixed.is_empty(), "ranks' --show-calls lines mixed: {mixed:?}");
    let calls = testkit::calls(&out, 0).join("\n");
    for line in [
        "cuModuleLoadData(",
        "cuLaunchKernel(",
        "the communication stream waits for it",
        "cuEventQuery(",
        "(Work::wait)",
    ] {
        assert!(calls.contains(line), "no {line:?} in --show-calls: {r}");
    }
}

/// `--draw`: rank 0's last step of each way on one time axis, a bar per layer and per
/// collective (the pixels are the draw crate's tests'); the page holds the same picture;
/// NCCL's kernels are out of the host's sight, so it is refused there, before the run.
#[test]
fn draw_pictures_the_four_timelines() {
    let dir = std::env::temp_dir();
    let id = std::process::id();
    for page in ["svg", "html"] {
        let path = dir.join(format!("nccl-workbook-overlap-{id}.{page}"));
        let args = [&["--nproc-per-node", "2", "--draw", path.to_str().unwrap()][..], &SMALL].concat();
        let r = finish(spawn(command(BIN, &args)), LIMIT).ok();
        assert!(r.stdout.contains("Drawn: the timelines of 4 ways written to"), "{r}");
        let drawn = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("no picture ({e}): {r}"));
        let _ = std::fs::remove_file(&path);
        let fill = |c: (u8, u8, u8)| {
            drawn
                .matches(&format!("fill=\"#{:02X}{:02X}{:02X}\"", c.0, c.1, c.2))
                .count()
        };
        use workbook_draw::timeline::{COMMUNICATING, COMPUTING};
        // The legend's key, then 1 + 4 + 3 + 3 collectives and 4 ways of 3 layers.
        assert_eq!(fill(COMMUNICATING), 1 + 11, "{r}");
        assert_eq!(fill(COMPUTING), 1 + 12, "{r}");
        for way in ["then one all-reduce", "as they fill", "when needed", "prefetched"] {
            assert!(drawn.contains(way), "{way}: {r}");
        }
        if page == "html" {
            assert!(
                drawn.starts_with("<!DOCTYPE html>") && drawn.contains("<svg"),
                "{drawn}"
            );
            assert!(!drawn.contains("src=") && !drawn.contains("href="), "nothing fetched");
        }
    }
    let svg = dir.join(format!("nccl-workbook-overlap-nccl-{id}.svg"));
    let args = [&["--nproc-per-node", "2", "--draw", svg.to_str().unwrap()][..], &SMALL].concat();
    let r = finish(spawn(nccl_command(BIN, &args, 2)), LIMIT);
    assert_eq!(r.code, Some(2), "{r}");
    assert!(r.stderr.contains("--backend cpu"), "{r}");
    assert!(!svg.exists());
}

/// A bucket the simulated link cannot carry within --timeout is refused as it is issued
/// on the stream, in one line, exit 2.
#[test]
fn a_bucket_too_large_for_the_link_and_the_timeout_is_refused() {
    // Two layers of 12·64² + 13·64 parameters: 390 KiB of gradients in one bucket, 3.2 s
    // at 1 Mbit/s.
    let args = [
        "--nproc-per-node",
        "2",
        "--transport",
        "tcp",
        "--link",
        "0,1Mbps",
        "--timeout",
        "2",
        "--layers",
        "2",
        "--hidden",
        "64",
        "--compute-us",
        "200",
    ];
    let r = finish(spawn(command(BIN, &args)), LIMIT);
    assert_eq!(r.code, Some(2), "{r}");
    let errors: Vec<&str> = r.stderr.lines().filter(|l| l.starts_with("error")).collect();
    assert_eq!(errors.len(), 1, "{r}");
    assert!(errors[0].contains("longer than --timeout (2 s)"), "{r}");
}

#[test]
fn bad_input_is_one_line_and_exit_2() {
    for (args, says) in [
        (vec!["--bucket-mb", "0"], "a bucket holds more than 0 MiB"),
        (vec!["--bucket-mb", "lots"], "a size in MiB"),
        (vec!["--layers", "0"], "--layers"),
        (vec!["--compute-us", "0"], "--compute-us"),
        (vec!["--layers", "1024", "--hidden", "16384"], "memory"),
    ] {
        let all = [&["--nproc-per-node", "2"][..], &args].concat();
        let r = finish(spawn(command(BIN, &all)), LIMIT);
        assert_eq!(r.code, Some(2), "{args:?}: {r}");
        let errors: Vec<&str> = r.stderr.lines().filter(|l| l.starts_with("error")).collect();
        // One line, also where each rank finds it (the memory its host has): said once.
        assert_eq!(errors.len(), 1, "{args:?}: {r}");
        assert!(errors[0].contains(says), "{args:?}: {r}");
        assert!(!r.stderr.contains("panicked"), "{args:?}: {r}");
    }
}

/// A model too large for the memory is refused before it is made, in one line, exit 2,
/// under `ulimit -v`: where the ranks decide together (before: rank 0 refused, and rank 1
/// passed its own check and failed on rank 0; or the check passed and the results' copy
/// ended in Rust's "memory allocation failed" and SIGABRT), and on simulated GPUs, whose
/// memory is this host's (before: no check; a model larger than the host met the
/// out-of-memory killer).
#[test]
fn a_model_too_large_is_refused_in_one_line_on_every_backend() {
    let limited = |kib: &str, args: &[&str]| {
        let mut cmd = std::process::Command::new("sh");
        cmd.args(["-c", &format!("ulimit -v {kib} && exec \"$0\" \"$@\""), BIN]);
        cmd.args(["--nproc-per-node", "2", "--layers", "16", "--iters", "1"])
            .args(args);
        testkit::clear_job_env(&mut cmd);
        cmd.env_remove("RUST_BACKTRACE");
        finish(spawn(cmd), LIMIT)
    };
    let runs = [
        limited("950000", &["--hidden", "512"]),
        limited("1000000", &["--hidden", "512"]),
        limited("3000000", &["--hidden", "1024", "--simulate-gpus", "2"]),
    ];
    for r in runs {
        assert_eq!(r.code, Some(2), "{r}");
        let errors: Vec<&str> = r.stderr.lines().filter(|l| l.starts_with("error")).collect();
        assert_eq!(errors.len(), 1, "{r}");
        assert!(errors[0].contains("the model (--layers, --hidden): rank "), "{r}");
        for abort in ["memory allocation of", "backtrace", "panicked", "signal"] {
            assert!(!r.stderr.contains(abort), "{abort:?}: {r}");
        }
    }
}

#[test]
fn a_rank_killed_while_the_others_wait_on_handles_is_named_within_the_timeout() {
    for nccl in [false, true] {
        let args = [
            &[
                "--nproc-per-node",
                "3",
                "--timeout",
                "5",
                "--backend",
                if nccl { "nccl" } else { "cpu" },
            ][..],
            &SMALL,
        ]
        .concat();
        let mut cmd = match nccl {
            true => nccl_command(BIN, &args, 3),
            false => command(BIN, &args),
        };
        cmd.env("NCCL_WORKBOOK_FAULT", "die-on-stream:1");
        let started = std::time::Instant::now();
        let r = finish(spawn(cmd), LIMIT);
        let ctx = format!("nccl {nccl}, after {:?}: {r}", started.elapsed());
        assert_eq!(r.code, Some(1), "{ctx}");
        assert!(started.elapsed() < std::time::Duration::from_secs(5 + 5), "{ctx}");
        assert!(
            r.stderr.contains("launcher: rank 1 failed first (killed by signal 9"),
            "{ctx}"
        );
        assert!(!r.stderr.contains("panicked"), "{ctx}");
    }
}
