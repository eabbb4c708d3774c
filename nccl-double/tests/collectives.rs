//! The double works: real jobs of 1 to 5 processes (and threads) run every NCCL
//! collective (all-reduce, broadcast, reduce, all-gather, reduce-scatter, and all-to-all
//! as grouped send/recv) through cudarc and its real dynamic-loading path (the raw API
//! polling the stream, blocking and non-blocking communicators, and the safe `Comm`), in
//! place and out of place, for every type (half precision included) and reduction, and
//! get NCCL's results. Also: how cudarc finds the double, and the refusal without NCCL_DOUBLE=1.

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

/// An element type as the probe names it, and how the double reduces it.
#[derive(Clone, Copy, Debug)]
enum Ty {
    Int {
        bits: u32,
        signed: bool,
    },
    F32,
    F64,
    /// Rounded to `p` significant bits, exponents down to `emin` (then subnormal), largest
    /// finite `max`: binary16 (11, -14, 65504) and bfloat16 (8, -126, ~3.4e38).
    Half {
        p: i32,
        emin: i32,
        max: f64,
    },
}

impl Ty {
    fn of(name: &str) -> Ty {
        match name {
            "i8" => Ty::Int { bits: 8, signed: true },
            "u8" => Ty::Int { bits: 8, signed: false },
            "i32" => Ty::Int { bits: 32, signed: true },
            "u32" => Ty::Int {
                bits: 32,
                signed: false,
            },
            "i64" => Ty::Int { bits: 64, signed: true },
            "u64" => Ty::Int {
                bits: 64,
                signed: false,
            },
            "f32" => Ty::F32,
            "f64" => Ty::F64,
            "f16" => Ty::Half {
                p: 11,
                emin: -14,
                max: 65504.0,
            },
            "bf16" => Ty::Half {
                p: 8,
                emin: -126,
                max: (2.0 - 2f64.powi(-7)) * 2f64.powi(127),
            },
            _ => panic!("no type {name}"),
        }
    }

    /// `red` of every rank's element `xs` (rank order), as NCCL defines it: integer sums
    /// and products wrap, integer avg is the wrapped sum / n truncated toward zero; f32 in
    /// f32; halves in f32, rounded once to nearest even (past the largest: infinity).
    fn fold(self, red: &str, xs: &[f64]) -> f64 {
        let n = xs.len();
        let f32s = |xs: &[f64]| -> f32 {
            let v: Vec<f32> = xs.iter().map(|x| *x as f32).collect();
            match red {
                "sum" => v.iter().fold(0.0, |a, b| a + b),
                "prod" => v.iter().fold(1.0, |a, b| a * b),
                "max" => v.iter().fold(f32::MIN, |a, b| a.max(*b)),
                "min" => v.iter().fold(f32::MAX, |a, b| a.min(*b)),
                "avg" => v.iter().fold(0.0, |a, b| a + b) / n as f32,
                _ => panic!("{red}"),
            }
        };
        match self {
            Ty::Int { bits, signed } => {
                let m = 1i128 << bits;
                let wrap = |v: i128| {
                    let w = v.rem_euclid(m);
                    if signed && w >= m / 2 { w - m } else { w }
                };
                let v: Vec<i128> = xs.iter().map(|x| *x as i128).collect();
                let r = match red {
                    "sum" => wrap(v.iter().sum()),
                    "prod" => wrap(v.iter().product()),
                    "max" => *v.iter().max().unwrap(),
                    "min" => *v.iter().min().unwrap(),
                    "avg" => wrap(v.iter().sum()) / n as i128,
                    _ => panic!("{red}"),
                };
                r as f64
            }
            Ty::F64 => match red {
                "sum" => xs.iter().sum(),
                "prod" => xs.iter().product(),
                "max" => xs.iter().copied().fold(f64::MIN, f64::max),
                "min" => xs.iter().copied().fold(f64::MAX, f64::min),
                "avg" => xs.iter().sum::<f64>() / n as f64,
                _ => panic!("{red}"),
            },
            Ty::F32 => f64::from(f32s(xs)),
            Ty::Half { p, emin, max } => {
                let v = f64::from(f32s(xs));
                if v == 0.0 {
                    return v;
                }
                let e = (v.abs().log2().floor() as i32).max(emin);
                let ulp = 2f64.powi(e - (p - 1));
                let r = (v / ulp).round_ties_even() * ulp;
                if r.abs() > max { r.signum() * f64::INFINITY } else { r }
            }
        }
    }
}

/// Runs `op` (a list) on 1 to 5 processes (8 GPUs, so that 5 ranks have one each) with
/// `args`, and checks every result line against `expect(world, rank, line's fields)`;
/// `lines(world)` is how many result lines each rank must print.
fn on_1_to_5_processes(
    op: &str,
    args: &[&str],
    lines: impl Fn(usize) -> usize,
    expect: impl Fn(usize, usize, &std::collections::HashMap<&str, &str>) -> Vec<f64>,
) {
    for world in 1..=5 {
        let job = Job::new(op, world).args(args).env("NCCL_DOUBLE_DEVICES", "8");
        let outs = job.run();
        all_ok(&outs);
        for o in &outs {
            let lines_of = o.stdout.lines().filter(|l| fields(l).contains_key("result"));
            assert_eq!(lines_of.clone().count(), lines(world), "world {world}:\n{o}");
            for (line, got) in lines_of.zip(o.results()) {
                assert_eq!(got, expect(world, o.rank, &fields(line)), "world {world}: {line}");
            }
        }
        assert!(job.left_nothing_behind(), "{}", all(&outs));
    }
}

/// The field `key` of a result line, as a number.
fn num(f: &std::collections::HashMap<&str, &str>, key: &str) -> usize {
    f[key].parse().unwrap()
}

/// Types and reductions the new collectives' tests run (every reduction, a type of each
/// size and kind, and the two half types), and counts: 0, 1 (less than most worlds), 3.
const TYPES: &str = "f32,i8,u8,i64,f16,bf16";
const REDUCTIONS: &str = "sum,prod,max,min,avg";
const COUNTS: &str = "0,1,3";

#[test]
fn reduce_to_every_root_in_and_out_of_place_on_1_to_5_processes() {
    let args = ["--dtype", TYPES, "--reduce", REDUCTIONS, "--count", COUNTS];
    // Rank r's element i is r + 1 + i. The root gets the reduction; an out-of-place
    // non-root passes NULL (odd ranks: no result) or a buffer of 99s that stays so; in
    // place, a non-root's buffer keeps its input.
    on_1_to_5_processes(
        "reduce,reduce-inplace",
        &args,
        |world| 2 * 6 * 5 * 3 * world,
        |world, rank, f| {
            let (root, count) = (num(f, "root"), num(f, "count"));
            let ty = Ty::of(f["dtype"]);
            (0..count)
                .filter(|_| rank == root || f["op"] == "reduce-inplace" || rank % 2 == 0)
                .map(|i| {
                    let xs: Vec<f64> = (0..world).map(|q| (q + 1 + i) as f64).collect();
                    match () {
                        _ if rank == root => ty.fold(f["reduce"], &xs),
                        _ if f["op"] == "reduce-inplace" => xs[rank],
                        _ => 99.0,
                    }
                })
                .collect()
        },
    );
}

#[test]
fn all_gather_in_and_out_of_place_on_1_to_5_processes() {
    // Rank r's sendcount elements are r * count + 1 ...: gathered, 1, 2, ... world * count.
    let args = [
        "--dtype",
        "f32,f64,i8,u8,i32,u32,i64,u64,f16,bf16",
        "--count",
        "0,1,2,3",
    ];
    on_1_to_5_processes(
        "allgather,allgather-inplace",
        &args,
        |_| 2 * 10 * 4,
        |world, _, f| (1..=world * num(f, "count")).map(|v| v as f64).collect(),
    );
}

#[test]
fn reduce_scatter_in_and_out_of_place_on_1_to_5_processes() {
    let args = ["--dtype", TYPES, "--reduce", REDUCTIONS, "--count", COUNTS];
    // Rank q's element j (of world * count) is q + 1 + j; rank r gets block r.
    on_1_to_5_processes(
        "reducescatter,reducescatter-inplace",
        &args,
        |_| 2 * 6 * 5 * 3,
        |world, rank, f| {
            let count = num(f, "count");
            let ty = Ty::of(f["dtype"]);
            (0..count)
                .map(|i| {
                    let xs: Vec<f64> = (0..world).map(|q| (q + 1 + rank * count + i) as f64).collect();
                    ty.fold(f["reduce"], &xs)
                })
                .collect()
        },
    );
}

/// nccl-tests' all-to-all: one group with a send and a recv to and from every rank,
/// itself included, block p of each buffer for rank p.
#[test]
fn all_to_all_as_grouped_sends_and_recvs_to_every_rank_itself_included_on_1_to_5_processes() {
    let args = ["--dtype", TYPES, "--count", COUNTS];
    // Rank r's block for peer p holds (r * world + p) * count + 1 ...; rank r receives
    // block r of every rank p, in block p.
    on_1_to_5_processes(
        "alltoall",
        &args,
        |_| 6 * 3,
        |world, rank, f| {
            let count = num(f, "count");
            (0..world * count)
                .map(|j| ((j / count * world + rank) * count + j % count + 1) as f64)
                .collect()
        },
    );
}

/// The new collectives through cudarc's safe `Comm` (`reduce` with `None` on odd
/// non-roots, `reduce_in_place`, `all_gather`, `reduce_scatter`, grouped `send`/`recv`)
/// and through non-blocking communicators.
#[test]
fn the_new_collectives_through_cudarc_safe_comm_and_non_blocking_communicators() {
    for mode in [&["--api", "safe"][..], &["--nonblocking"][..]] {
        let outs = Job::new("reduce,reduce-inplace,allgather,reducescatter,alltoall", 3)
            .args(mode)
            .args(&["--count", "2", "--dtype", "f32,bf16", "--reduce", "sum"])
            .run();
        all_ok(&outs);
        for o in &outs {
            let r = o.rank;
            let reduced = |root: usize| -> Vec<f64> {
                match () {
                    _ if r == root => vec![6.0, 9.0],
                    _ if r % 2 == 1 => vec![],
                    _ => vec![99.0, 99.0],
                }
            };
            let in_place = |root: usize| -> Vec<f64> {
                if r == root {
                    vec![6.0, 9.0]
                } else {
                    vec![(r + 1) as f64, (r + 2) as f64]
                }
            };
            let mut expected: Vec<Vec<f64>> = Vec::new();
            for _ in 0..2 {
                expected.extend((0..3).map(reduced));
            }
            for _ in 0..2 {
                expected.extend((0..3).map(in_place));
            }
            for _ in 0..2 {
                expected.push((1..=6).map(f64::from).collect());
            }
            // Block r of q + 1 + j, summed over 3 ranks: 6 + 3j.
            for _ in 0..2 {
                expected.push(vec![(6 + 3 * 2 * r) as f64, (9 + 3 * 2 * r) as f64]);
            }
            let a2a: Vec<f64> = (0..6).map(|j| ((j / 2 * 3 + r) * 2 + j % 2 + 1) as f64).collect();
            expected.extend([a2a.clone(), a2a]);
            assert_eq!(o.results(), expected, "{mode:?}:\n{}", all(&outs));
        }
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
    assert!(o.stdout.trim().ends_with(" name=simulated GPU 2 (host memory)"), "{o}");
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
            "names=simulated GPU 0 (host memory);simulated GPU 1 (host memory);\
             simulated GPU 2 (host memory)"
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
        ("reduce,allgather,reducescatter", 2),
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
        "ncclReduce",
        "ncclAllGather",
        "ncclReduceScatter",
        "ncclGroupStart",
        "ncclSend",
        "ncclRecv",
        "ncclGroupEnd",
        "ncclCommAbort",
    ] {
        assert!(called.contains(s), "{s} was not called: {called:?}");
    }
}
