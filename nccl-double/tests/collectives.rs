//! The double works: real jobs of 1, 2 and 4 processes (and threads) run collectives and
//! send/recv through cudarc and its real dynamic-loading path (the raw API polling the
//! stream, blocking and non-blocking communicators, and the safe `Comm`), and get NCCL's
//! results. Also: how cudarc finds the double, and the refusal without NCCL_DOUBLE=1.

mod support;

use support::{Job, all, all_ok, fields, finish, probe, spawn};

/// Rank r's element i is r + 1 + i: the sum over n ranks is n(n+1)/2 + n*i.
fn sums(world: usize, count: usize) -> Vec<f64> {
    (0..count)
        .map(|i| (world * (world + 1) / 2 + world * i) as f64)
        .collect()
}

#[test]
fn all_reduce_sums_f32_on_1_2_and_4_processes() {
    for world in [1, 2, 4] {
        for op in ["allreduce", "allreduce-inplace"] {
            let job = Job::new(op, world).args(&["--count", "5"]);
            let outs = job.run();
            all_ok(&outs);
            for o in &outs {
                assert_eq!(o.results(), [sums(world, 5)], "{}", all(&outs));
            }
            assert!(job.left_nothing_behind(), "the meeting folder stayed:\n{}", all(&outs));
        }
    }
}

#[test]
fn broadcast_from_every_root_on_1_2_and_4_processes() {
    for world in [1, 2, 4] {
        for op in ["broadcast", "broadcast-inplace"] {
            let outs = Job::new(op, world).args(&["--count", "3"]).run();
            all_ok(&outs);
            let expected: Vec<Vec<f64>> = (0..world)
                .map(|root| (0..3).map(|i| (100 * root + i) as f64).collect())
                .collect();
            for o in &outs {
                assert_eq!(o.results(), expected, "{}", all(&outs));
            }
        }
    }
}

#[test]
fn send_recv_in_a_group_between_pairs_and_around_a_ring() {
    for (op, world) in [("pairs", 2), ("pairs", 4), ("ring", 1), ("ring", 2), ("ring", 4)] {
        let outs = Job::new(op, world).args(&["--count", "3"]).run();
        all_ok(&outs);
        for o in &outs {
            let from = if op == "ring" {
                (o.rank + world - 1) % world
            } else {
                o.rank ^ 1
            };
            let expected: Vec<f64> = (0..3).map(|i| (1000 * (from + 1) + i) as f64).collect();
            assert_eq!(o.results(), [expected], "{op} on {world}:\n{}", all(&outs));
        }
    }
}

/// Every operation on several types, 3 ranks as threads of one process (as cudarc's own
/// tests run them).
#[test]
fn every_reduction_and_type_with_ranks_as_threads() {
    let world = 3usize;
    // Element i of rank r is r + 1 + i.
    let v = |r: usize, i: usize| (r + 1 + i) as f64;
    type Expected<'a> = &'a dyn Fn(usize) -> f64;
    let cases: [(&str, &str, Expected); 9] = [
        ("f32", "sum", &|i| (0..world).map(|r| v(r, i)).sum()),
        ("f64", "prod", &|i| (0..world).map(|r| v(r, i)).product()),
        ("i32", "max", &|i| v(world - 1, i)),
        ("i32", "min", &|i| v(0, i)),
        ("f32", "avg", &|i| {
            (0..world).map(|r| v(r, i)).sum::<f64>() / world as f64
        }),
        ("i64", "avg", &|i| {
            ((0..world).map(|r| v(r, i)).sum::<f64>() / world as f64).floor()
        }),
        ("u8", "sum", &|i| (0..world).map(|r| v(r, i)).sum()),
        ("u64", "prod", &|i| (0..world).map(|r| v(r, i)).product()),
        ("i8", "sum", &|i| (0..world).map(|r| v(r, i)).sum()),
    ];
    for (dtype, red, expect) in cases {
        let mut cmd = probe(&["--op", "allreduce", "--threads", "--world", "3", "--count", "4"]);
        cmd.args(["--dtype", dtype, "--reduce", red]);
        let o = finish(0, spawn(cmd));
        assert_eq!(o.code, Some(0), "{o}");
        let expected: Vec<f64> = (0..4).map(expect).collect();
        assert_eq!(o.results(), vec![expected; world], "{dtype} {red}: {o}");
    }
}

#[test]
fn a_thousand_collectives_leave_nothing_behind() {
    let job = Job::new("allreduce", 2).args(&["--count", "1000", "--repeat", "500"]);
    let outs = job.run();
    all_ok(&outs);
    for o in &outs {
        assert_eq!(o.results(), vec![sums(2, 1000); 500]);
    }
    assert!(job.left_nothing_behind(), "{}", all(&outs));
    let job = Job::new("broadcast", 2).args(&["--repeat", "250"]);
    all_ok(&job.run());
    assert!(job.left_nothing_behind());
}

/// The same jobs through cudarc's safe `Comm` (`Comm::from_rank`, waiting with
/// `stream.synchronize()`, dropped with `ncclCommAbort`), and through non-blocking
/// communicators (`ncclCommInitRankConfig` with `blocking = 0`: every call says
/// `ncclInProgress`, and the probe polls `ncclCommGetAsyncError`).
#[test]
fn the_same_jobs_through_cudarc_safe_comm_and_non_blocking_communicators() {
    let modes: [(&[&str], usize); 2] = [(&["--api", "safe"], 1), (&["--nonblocking", "--repeat", "2"], 2)];
    for (mode, reps) in modes {
        let job = Job::new("allreduce", 2).args(mode).args(&["--count", "3"]);
        let outs = job.run();
        all_ok(&outs);
        for o in &outs {
            assert_eq!(o.results(), vec![sums(2, 3); reps], "{mode:?}:\n{}", all(&outs));
        }
        assert!(job.left_nothing_behind(), "{}", all(&outs));
        let outs = Job::new("broadcast-inplace", 2).args(mode).run();
        all_ok(&outs);
        let outs = Job::new("ring", 2).args(mode).args(&["--count", "2"]).run();
        all_ok(&outs);
        for o in &outs {
            let from = (o.rank + 1) % 2;
            let expected: Vec<f64> = (0..2).map(|i| (1000 * (from + 1) + i) as f64).collect();
            assert_eq!(o.results(), vec![expected; reps], "{mode:?}:\n{}", all(&outs));
        }
    }
}

#[test]
fn the_driver_copies_both_ways_on_a_second_stream_and_fresh_memory_reads_nan() {
    let o = finish(0, spawn(probe(&["--op", "driver", "--device", "2", "--count", "3"])));
    assert_eq!(o.code, Some(0), "{o}");
    let f = fields(o.stdout.trim());
    assert!(
        o.stdout.trim().ends_with(" name=NCCL test double GPU 2 (host memory)"),
        "{o}"
    );
    assert_eq!(f["zeros"], "0,0,0", "{o}");
    assert_eq!(f["roundtrip"], "0.5,1.5,2.5", "{o}");
    assert_eq!(f["fresh_is_nan"], "true", "{o}");
    assert!(o.stderr.is_empty(), "{o}");
}

#[test]
fn info_says_how_many_gpus_their_names_and_the_versions() {
    let mut cmd = probe(&["--op", "info"]);
    cmd.env("NCCL_DOUBLE_DEVICES", "3");
    let o = finish(0, spawn(cmd));
    assert_eq!(o.code, Some(0), "{o}");
    let line = o.stdout.trim();
    assert!(
        line.starts_with("devices=3 nccl_version=21803 driver_version=12000 names="),
        "{o}"
    );
    assert!(
        line.ends_with(
            "names=NCCL test double GPU 0 (host memory);NCCL test double GPU 1 (host memory);\
             NCCL test double GPU 2 (host memory)"
        ),
        "{o}"
    );
    // NCCL_DOUBLE_VERSION plays another NCCL (here 2.21.5).
    let mut cmd = probe(&["--op", "info"]);
    cmd.env("NCCL_DOUBLE_VERSION", "22105");
    let o = finish(0, spawn(cmd));
    assert_eq!(o.code, Some(0), "{o}");
    assert!(o.stdout.starts_with("devices=4 nccl_version=22105 "), "{o}");
}

#[test]
fn cudarc_finds_the_double_only_through_the_library_path() {
    let present = |dir: Option<&std::path::Path>| {
        let mut cmd = probe(&["--op", "present"]);
        match dir {
            Some(d) => cmd.env("LD_LIBRARY_PATH", d),
            None => cmd.env_remove("LD_LIBRARY_PATH"),
        };
        let o = finish(0, spawn(cmd));
        assert_eq!(o.code, Some(0), "{o}");
        o.stdout.trim().to_string()
    };
    // This machine has no CUDA driver and no NCCL of its own.
    assert_eq!(present(None), "cuda_present=false nccl_present=false");
    assert_eq!(present(Some(support::lib_dir())), "cuda_present=true nccl_present=true");
    // cudarc never asks for libnccl.so.2, the only name NCCL's runtime packages ship.
    let so2 = support::link_dir("so2-only", &["libcuda.so.1", "libnccl.so.2"]);
    assert_eq!(present(Some(&so2)), "cuda_present=true nccl_present=false");
}

#[test]
fn without_nccl_double_1_it_refuses_and_says_why() {
    let mut cmd = probe(&["--op", "info"]);
    cmd.env_remove("NCCL_DOUBLE");
    let o = finish(0, spawn(cmd));
    assert_eq!(o.code, Some(1), "{o}");
    assert_eq!(
        o.stderr.lines().next(),
        Some("nccl-double: refusing to act as CUDA/NCCL: NCCL_DOUBLE=1 is not set (this library is a test double)"),
        "{o}"
    );
    assert!(o.stderr.contains("CUDA_ERROR_NO_DEVICE"), "{o}");
    assert_eq!(o.stderr.matches("refusing").count(), 1, "{o}");
    // NCCL refuses as well.
    let mut cmd = probe(&["--op", "allreduce"]);
    cmd.env("NCCL_DOUBLE", "0");
    let o = finish(0, spawn(cmd));
    assert_eq!(o.code, Some(1), "{o}");
    assert!(o.stderr.contains("ncclGetUniqueId failed: ncclSystemError"), "{o}");
}

/// Which entry points cudarc really calls for the workbook's uses (written to a file by
/// the double with NCCL_DOUBLE_TRACE), and that each is one the double exports.
#[test]
fn the_symbols_cudarc_calls() {
    let trace = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("trace-{}", std::process::id()));
    let _ = std::fs::remove_file(&trace);
    let t = trace.to_str().unwrap();
    for (op, world) in [
        ("allreduce", 2),
        ("allreduce-inplace", 1),
        ("broadcast", 2),
        ("ring", 2),
    ] {
        all_ok(&Job::new(op, world).env("NCCL_DOUBLE_TRACE", t).run());
        all_ok(
            &Job::new(op, world)
                .args(&["--api", "safe"])
                .env("NCCL_DOUBLE_TRACE", t)
                .run(),
        );
    }
    all_ok(
        &Job::new("raw", 2)
            .args(&["--nonblocking"])
            .env("NCCL_DOUBLE_TRACE", t)
            .run(),
    );
    for op in ["info", "driver", "devices"] {
        let mut cmd = probe(&["--op", op]);
        cmd.env("NCCL_DOUBLE_TRACE", t);
        assert_eq!(finish(0, spawn(cmd)).code, Some(0));
    }
    let called: std::collections::BTreeSet<String> = std::fs::read_to_string(&trace)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    println!("cudarc called {} symbols: {called:?}", called.len());
    for s in [
        "cuInit",
        "cuDeviceGetCount",
        "cuDeviceGet",
        "cuDeviceGetName",
        "cuDeviceGetPCIBusId",
        "cuDeviceGetUuid",
        "cuDeviceGetUuid_v2",
        "cuStreamQuery",
        "cuStreamSynchronize",
        "cuDevicePrimaryCtxRetain",
        "cuDeviceGetAttribute",
        "cuCtxGetCurrent",
        "cuCtxSetCurrent",
        "cuMemAllocAsync",
        "cuEventCreate",
        "cuMemcpyHtoDAsync_v2",
        "cuMemsetD8Async",
        "cuMemcpyDtoHAsync_v2",
        "cuMemFreeAsync",
        "cuEventDestroy_v2",
        "cuDevicePrimaryCtxRelease_v2",
        "ncclGetUniqueId",
        "ncclCommInitRank",
        "ncclCommInitRankConfig",
        "ncclCommGetAsyncError",
        "ncclCommFinalize",
        "ncclCommDestroy",
        "ncclAllReduce",
        "ncclBroadcast",
        "ncclGroupStart",
        "ncclSend",
        "ncclRecv",
        "ncclGroupEnd",
        "ncclCommAbort",
    ] {
        assert!(called.contains(s), "{s} was not called: {called:?}");
    }
}
