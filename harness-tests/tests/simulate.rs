//! `--simulate-gpus` and `--show-calls`: the NCCL backend on simulated GPUs, one flag away,
//! and the NCCL and CUDA calls each rank makes, as it makes them. Real processes.

use testkit::{LIMIT, calls, command, finish, run, spawn, stage};

const BIN: &str = env!("CARGO_BIN_EXE_harness-probe");

/// The temporary folder `--simulate-gpus` makes for the launcher of pid `pid`.
fn simulator_folder(pid: u32) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("nccl-workbook-sim-{pid}"))
}

/// The position of the first call starting with `function(` at or after `from`.
fn find(calls: &[String], from: usize, function: &str) -> Option<usize> {
    let open = format!("{function}(");
    (from..calls.len()).find(|&i| calls[i].starts_with(&open))
}

#[test]
fn simulated_gpus_run_the_nccl_backend_and_say_so() {
    let child = spawn(command(
        BIN,
        &["--simulate-gpus", "3", "--init", "rank", "--format", "json"],
    ));
    let pid = child.id();
    let r = finish(child, LIMIT).ok();
    assert!(
        !simulator_folder(pid).exists(),
        "the simulator's folder was left behind"
    );
    let j = r.json();
    assert_eq!(j["backend"], "nccl", "{r}");
    assert_eq!(j["simulated_gpus"], 3, "{r}");
    assert_eq!(j["check"]["wrong"], 0, "{r}");
    assert_eq!(stage(&j, "after"), vec![vec![6.0; 4]; 3], "{r}");
    for (i, rank) in j["ranks"].as_array().unwrap().iter().enumerate() {
        assert_eq!(rank["device"], format!("cuda:{i}"), "{r}");
        assert_eq!(rank["device_name"], format!("simulated GPU {i} (host memory)"), "{r}");
    }
    // People read: the backend line, the device table and the time say "simulated".
    let r = run(BIN, &["--simulate-gpus", "2"]).ok();
    let out = &r.stdout;
    assert!(out.starts_with("backend: nccl on 2 simulated GPUs"), "{r}");
    assert!(out.contains("  GPU 1 | 2 | 2 | 2 | 2 |"), "{r}");
    let time = out.lines().position(|l| l.starts_with("Time: ")).expect("a time line");
    assert_eq!(
        out.lines().nth(time + 1).map(str::trim),
        Some("(simulated GPUs: host memory, not a GPU's speed)"),
        "{r}"
    );
}

#[test]
fn simulated_gpus_refuse_the_cpu_backend_and_bad_counts_in_one_line() {
    for args in [
        &["--simulate-gpus", "2", "--backend", "cpu"][..],
        &["--simulate-gpus", "0"],
        &["--simulate-gpus", "two"],
    ] {
        let r = run(BIN, args);
        assert_eq!(r.code, Some(2), "{args:?}: {r}");
        assert_eq!(r.stderr.lines().count(), 1, "{args:?}: {r}");
        assert!(r.stderr.contains("--simulate-gpus"), "{args:?}: {r}");
    }
}

#[test]
fn each_rank_shows_its_nccl_and_cuda_calls_in_order() {
    let r = run(
        BIN,
        &["--simulate-gpus", "2", "--show-calls", "--count", "6", "--op", "max"],
    )
    .ok();
    for rank in 0..2 {
        let c = calls(&r.stdout, rank);
        // The order every NCCL program follows, on this rank.
        let ctx = find(&c, 0, "cuInit").expect("cuInit");
        let id = find(&c, ctx, "ncclGetUniqueId");
        assert_eq!(id.is_some(), rank == 0, "only rank 0 makes the unique id:\n{r}");
        let init = find(&c, ctx, "ncclCommInitRankConfig").expect("ncclCommInitRankConfig");
        assert!(
            c[init].contains("nranks=2, ") && c[init].contains(&format!("rank={rank}, config={{size=44, blocking=0}}")),
            "{}",
            c[init]
        );
        let upload = find(&c, init, "cuMemcpyHtoDAsync_v2").expect("the copy to the GPU");
        assert!(c[upload].contains("ByteCount=24"), "{}", c[upload]);
        let reduce = find(&c, upload, "ncclAllReduce").expect("ncclAllReduce");
        assert!(
            c[reduce].contains("count=6, datatype=ncclFloat32, op=ncclMax, comm=0x"),
            "{}",
            c[reduce]
        );
        let query = find(&c, reduce, "cuStreamQuery").expect("the wait for the GPU");
        assert!(
            c[query].contains("until the GPU had finished all-reduce (ncclAllReduce)"),
            "{}",
            c[query]
        );
        let download = find(&c, query, "cuMemcpyDtoHAsync_v2").expect("the copy back");
        // The timed runs go to a blocking communicator of the same ranks, split once from
        // the first: its warm-up and 5 timed calls, then its finalize and destroy first.
        // The split says ncclSuccess, as NCCL's does on a non-blocking parent, and is
        // polled on the parent all the same.
        let split = find(&c, download, "ncclCommSplit").expect("ncclCommSplit");
        assert!(
            c[split].contains(&format!("color=0, key={rank}, "))
                && c[split].contains("config={size=44, blocking=1}) = ncclSuccess"),
            "{}",
            c[split]
        );
        assert!(
            c[split + 1].starts_with("ncclCommGetAsyncError(") && c[split + 1].contains("until NCCL was done"),
            "{}",
            c[split + 1]
        );
        let fin = find(&c, split, "ncclCommFinalize").expect("ncclCommFinalize");
        let fin = find(&c, fin + 1, "ncclCommFinalize").expect("the first communicator's ncclCommFinalize");
        find(&c, fin, "ncclCommDestroy").expect("ncclCommDestroy");
        // 1 checked, then the timed loop's: 1 warm-up and 5 timed.
        assert_eq!(c.iter().filter(|l| l.starts_with("ncclAllReduce(")).count(), 7, "{r}");
    }
    // Without the flag, no call is shown.
    let quiet = run(BIN, &["--simulate-gpus", "2"]).ok();
    assert!(calls(&quiet.stdout, 0).is_empty(), "{quiet}");
}

#[test]
fn calls_go_to_stderr_when_stdout_is_json() {
    let r = run(BIN, &["--simulate-gpus", "2", "--show-calls", "--format", "json"]).ok();
    assert_eq!(r.json()["check"]["wrong"], 0, "{r}");
    assert!(
        calls(&r.stderr, 1).iter().any(|c| c.starts_with("ncclAllReduce(")),
        "{r}"
    );
}

#[test]
fn the_cpu_backend_says_it_makes_no_nccl_call() {
    let r = run(BIN, &["--backend", "cpu", "--show-calls"]).ok();
    assert!(
        r.stdout.lines().any(
            |l| l.starts_with("--show-calls: the CPU backend makes no NCCL or CUDA call")
                && l.ends_with("add --simulate-gpus N")
        ),
        "{r}"
    );
    assert!(calls(&r.stdout, 0).is_empty(), "{r}");
}

#[test]
fn a_program_copied_alone_says_in_one_line_that_it_needs_the_simulator() {
    // Copied out of cargo's target folder, without the simulator: its folder's name is
    // no cargo profile, and nothing is built there (no cargo "profile `x` is not defined").
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("copied-alone-{}", std::process::id()))
        .join("x");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let copy = dir.join("harness-probe");
    std::fs::copy(BIN, &copy).unwrap();
    let r = run(&copy.to_string_lossy(), &["--simulate-gpus", "2"]);
    let _ = std::fs::remove_dir_all(dir.parent().unwrap());
    assert_eq!(r.code, Some(2), "{r}");
    assert_eq!(r.stderr.lines().count(), 1, "{r}");
    assert!(
        r.stderr
            .starts_with("error: --simulate-gpus needs the simulator (libnccl_double.so) beside this program"),
        "{r}"
    );
    assert!(
        !r.stderr.contains("not defined") && !r.stderr.contains("building"),
        "{r}"
    );
    assert!(r.stdout.is_empty(), "{r}");
}
