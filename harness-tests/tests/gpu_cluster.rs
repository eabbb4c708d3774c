//! What the course's first job on a real GPU cluster would meet, played on the NCCL test
//! double (nccl-double/), which behaves as the real driver and NCCL do here: devices
//! honour `CUDA_VISIBLE_DEVICES` and have bus ids and UUIDs, and a collective whose peer
//! never comes never finishes (no deadline of its own), until the communicator is aborted.
//!
//! One test per thing that would break: per-task GPU binding, a dead or frozen peer on
//! the GPU, which NCCL is loaded (and `LD_PRELOAD`), how the communicator ends, and the
//! bad inputs around them.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::thread::sleep;
use std::time::{Duration, Instant};
use testkit::{LIMIT, Run, finish, free_port, nccl_command, spawn};

const BIN: &str = env!("CARGO_BIN_EXE_harness-probe");

/// The backend line a run on the double prints first, with `gpus` GPUs.
fn backend_line(gpus: usize) -> String {
    let gpus = if gpus == 1 {
        "1 GPU".into()
    } else {
        format!("{gpus} GPUs")
    };
    format!(
        "backend: nccl, found {gpus} and NCCL 2.18.3 ({})",
        testkit::nccl_double_file().display()
    )
}

/// Rank `rank` of `world` started by hand on `port`, on the double with `gpus` devices.
fn by_hand(world: usize, rank: usize, port: u16, gpus: usize, extra: &[&str]) -> Command {
    let (w, r, p) = (world.to_string(), rank.to_string(), port.to_string());
    let mut args = vec![
        "--backend",
        "nccl",
        "--world-size",
        &w,
        "--rank",
        &r,
        "--master-port",
        &p,
    ];
    args.extend_from_slice(extra);
    nccl_command(BIN, &args, gpus)
}

/// Runs every command to the end, side by side.
fn all(cmds: Vec<Command>) -> Vec<Run> {
    let children: Vec<Child> = cmds.into_iter().map(spawn).collect();
    children.into_iter().map(|c| finish(c, LIMIT)).collect()
}

// ---------------------------------------------------------------------------------
// 1. One GPU per task: Slurm's --gpus-per-task=1 gives each task its own
//    CUDA_VISIBLE_DEVICES, and each task sees its GPU as device 0.

#[test]
fn each_task_given_its_own_gpu_as_slurm_binds_them_runs() {
    let port = free_port();
    let cmds = (0..4)
        .map(|r| {
            let mut cmd = by_hand(4, r, port, 4, &["--format", "json", "--init", "rank"]);
            cmd.env("CUDA_VISIBLE_DEVICES", r.to_string());
            cmd
        })
        .collect();
    let runs = all(cmds);
    for run in &runs {
        assert_eq!(run.code, Some(0), "{run}");
    }
    let j = runs[0].json();
    assert_eq!(j["check"]["wrong"], 0, "{}", runs[0]);
    for (r, info) in j["ranks"].as_array().unwrap().iter().enumerate() {
        // Every rank's device 0, and every one a different GPU.
        assert_eq!(info["device"], "cuda:0", "{}", runs[0]);
        assert_eq!(
            info["device_name"],
            format!("simulated GPU {r} (host memory)"),
            "{}",
            runs[0]
        );
    }
}

/// Two tasks by hand, both given GPU 1 (`CUDA_VISIBLE_DEVICES=1`) of 4, each command
/// changed by `more(rank, cmd)`, run to the end.
fn two_tasks_on_gpu_1(more: impl Fn(usize, &mut Command)) -> Vec<Run> {
    let port = free_port();
    let cmds = (0..2)
        .map(|r| {
            let mut cmd = by_hand(2, r, port, 4, &[]);
            cmd.env("CUDA_VISIBLE_DEVICES", "1");
            more(r, &mut cmd);
            cmd
        })
        .collect();
    all(cmds)
}

#[test]
fn two_tasks_given_the_same_gpu_are_refused_naming_both_and_the_gpu() {
    let runs = two_tasks_on_gpu_1(|_, _| {});
    let said = &runs[0].stderr;
    assert_eq!(runs[0].code, Some(2), "{}", runs[0]);
    assert!(
        said.contains("ranks 0 and 1 are both on GPU GPU-")
            && said.contains("(simulated GPU 1 (host memory), PCI bus ")
            && said.contains("NCCL refuses two ranks on one GPU (\"Duplicate GPU detected\")"),
        "{}",
        runs[0]
    );
    assert_eq!(said.lines().count(), 1, "one line:\n{}", runs[0]);
    // Refused before NCCL was asked for anything.
    assert!(!said.contains("nccl-double WARN"), "{}", runs[0]);
}

/// NCCL's rule is one GPU per rank *of a host as NCCL tells hosts apart* (`NCCL_HOSTID`,
/// else the machine): two tasks on one GPU that set their own `NCCL_HOSTID` are two
/// nodes of one GPU each to NCCL, which runs them (`bench/gpu-nodes.sh` rehearses a
/// cluster so on one real GPU). The workbook refuses what NCCL refuses, no more.
#[test]
fn two_tasks_on_one_gpu_with_their_own_nccl_hostid_run_as_two_nodes() {
    for run in two_tasks_on_gpu_1(|r, cmd| {
        cmd.env("NCCL_HOSTID", format!("node-{r}"));
    }) {
        assert_eq!(run.code, Some(0), "{run}");
        assert!(!run.stderr.contains("Duplicate GPU"), "{run}");
    }
}

/// Four ranks by hand on two emulated nodes of two GPUs, placed cyclically as `srun
/// --distribution=cyclic` places them: ranks 0 and 2 on node-a, 1 and 3 on node-b (local
/// ranks 0 and 1 on each), each rank with `extra` arguments.
fn cyclic(extra: &[&str]) -> Vec<Run> {
    let port = free_port();
    let cmds = (0..4)
        .map(|r| {
            let mut cmd = by_hand(4, r, port, 2, extra);
            cmd.env("SLURMD_NODENAME", ["node-a", "node-b"][r % 2]);
            cmd
        })
        .collect();
    all(cmds)
}

#[test]
fn a_cyclic_placement_is_refused_naming_the_device_rule_that_runs_it() {
    // rank % device_count puts ranks 0 and 2 on GPU 0 of node-a: refused, and the
    // placement named as the cause, with the option that fixes it.
    let runs = cyclic(&[]);
    let said = &runs[0].stderr;
    assert_eq!(runs[0].code, Some(2), "{}", runs[0]);
    assert!(
        said.contains("ranks 0 and 2 are both on GPU GPU-")
            && said.contains("of host node-a: NCCL refuses two ranks on one GPU")
            && said.contains(
                "the placement is cyclic-like (ranks 0 and 2 are local ranks 0 and 1 of host node-a, so rank % \
                 device_count is not the local rank here"
            )
            && said.contains("--device-rule local-rank"),
        "{}",
        runs[0]
    );
    assert_eq!(said.lines().count(), 1, "one line:\n{}", runs[0]);
    // The local rank's rule: every rank a GPU of its own, and the right sum.
    let runs = cyclic(&["--device-rule", "local-rank", "--init", "rank", "--format", "json"]);
    for run in &runs {
        assert_eq!(run.code, Some(0), "{run}");
    }
    let j = runs[0].json();
    assert_eq!(j["check"]["wrong"], 0, "{}", runs[0]);
    let placed: Vec<(String, String)> = j["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["host"].as_str().unwrap().into(), r["device"].as_str().unwrap().into()))
        .collect();
    let expect = [
        ("node-a", "cuda:0"),
        ("node-b", "cuda:0"),
        ("node-a", "cuda:1"),
        ("node-b", "cuda:1"),
    ];
    assert_eq!(
        placed,
        expect.map(|(h, d)| (h.to_string(), d.to_string())),
        "{}",
        runs[0]
    );
}

#[test]
fn cuda_visible_devices_naming_no_gpu_is_one_line_and_exit_2() {
    for (visible, says) in [
        ("", "CUDA_VISIBLE_DEVICES is set but empty, which hides every GPU"),
        ("-1", "CUDA_VISIBLE_DEVICES=-1: the CUDA driver stops at \"-1\""),
        ("0,7", "CUDA_VISIBLE_DEVICES=0,7: the CUDA driver stops at \"7\""),
        (
            "GPU-00000000-dead-beef",
            "the CUDA driver stops at \"GPU-00000000-dead-beef\"",
        ),
    ] {
        for backend in ["nccl", "auto"] {
            let mut cmd = nccl_command(BIN, &["--backend", backend], 4);
            cmd.env("CUDA_VISIBLE_DEVICES", visible);
            let run = finish(spawn(cmd), LIMIT);
            let ctx = format!("CUDA_VISIBLE_DEVICES={visible:?}, --backend {backend}:\n{run}");
            assert_eq!(run.code, Some(2), "{ctx}");
            assert!(run.stderr.contains(says), "{ctx}");
            assert_eq!(run.stderr.lines().count(), 1, "{ctx}");
            assert!(run.stdout.is_empty(), "{ctx}");
        }
    }
    // A valid list, in its own order: GPUs 2 and 0 are this job's devices 0 and 1.
    let mut cmd = nccl_command(BIN, &["--format", "json"], 4);
    cmd.env("CUDA_VISIBLE_DEVICES", "2,0");
    let run = finish(spawn(cmd), LIMIT).ok();
    let names: Vec<String> = run.json()["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["device_name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        names,
        ["simulated GPU 2 (host memory)", "simulated GPU 0 (host memory)"],
        "{run}"
    );
}

// ---------------------------------------------------------------------------------
// 2. A peer that dies or freezes in the middle of a collective: NCCL would wait for ever.

/// Whether a survivor's message names `gone` as the rank that failed.
fn names(run: &Run, gone: usize) -> bool {
    let e = &run.stderr;
    e.contains(&format!("rank {gone} failed"))
        || e.contains(&format!("rank {gone} stopped responding"))
        || e.contains(&format!("ranks {gone},"))
        || (gone == 0 && e.contains("rank 0, which hosts the store, stopped answering or is gone"))
}

/// Three ranks by hand in a long run of large all-reduces; after a while, `signal` goes
/// to rank `victim`. Every other rank must end within --timeout plus a few seconds (its
/// abort, which hangs on the double as on NCCL, has 2 s of its own), exit 1 and name it;
/// then nothing of the job is left running.
fn peer_lost_during_a_large_all_reduce(signal: i32, victim: usize) {
    const TIMEOUT: u64 = 6;
    let port = free_port();
    let t = TIMEOUT.to_string();
    let trace = |r: usize| {
        testkit::nccl_double_dir().with_file_name(format!("trace-lost-{}-{signal}-{victim}-{r}", std::process::id()))
    };
    // The double's meeting folder of a killed rank stays behind (as a real NCCL's
    // shared-memory files would): keep it under target/, and remove it at the end.
    let rooms = testkit::nccl_double_dir().with_file_name(format!("rooms-{}-{signal}-{victim}", std::process::id()));
    std::fs::create_dir_all(&rooms).unwrap();
    let mut ranks: Vec<Child> = (0..3)
        .map(|r| {
            let mut cmd = by_hand(3, r, port, 4, &["--size", "4M", "--iters", "100000", "--timeout", &t]);
            let _ = std::fs::remove_file(trace(r));
            cmd.env("NCCL_DOUBLE_TRACE", trace(r)).env("NCCL_DOUBLE_DIR", &rooms);
            spawn(cmd)
        })
        .collect();
    // Whatever happens below, no rank of this job outlives the test.
    let _reaper = Reaper(ranks.iter().map(|c| c.id()).collect());
    sleep(Duration::from_millis(2500)); // well into the timed all-reduces
    assert!(testkit::signal(ranks[victim].id(), signal));
    let hit = Instant::now();
    let victim_child = ranks.remove(victim);
    for (i, child) in ranks.into_iter().enumerate() {
        let r = if i < victim { i } else { i + 1 };
        let run = finish(child, LIMIT);
        let took = hit.elapsed();
        let ctx = format!("signal {signal} to rank {victim}; rank {r} after {took:?}:\n{run}");
        assert!(took < Duration::from_secs(TIMEOUT + 5), "too slow: {ctx}");
        assert_eq!(run.code, Some(1), "{ctx}");
        assert!(names(&run, victim), "rank {victim} is not named: {ctx}");
        assert!(!run.stderr.contains("internal error"), "{ctx}");
        // NCCL's abort waits for the node's other ranks, and the victim is one of them (the
        // double plays NCCL issues #1013 and #1777): the abort's own deadline ends the rank,
        // in the same one line.
        let said: Vec<&str> = run.stderr.lines().filter(|l| l.starts_with("error: ")).collect();
        assert_eq!(said.len(), 1, "{ctx}");
        assert!(
            said[0].contains("; then NCCL's abort (ncclCommAbort) did not return in 2 s"),
            "{ctx}"
        );
        // It left NCCL by aborting the communicator (which stops its kernels).
        let calls = std::fs::read_to_string(trace(r)).unwrap_or_default();
        let _ = std::fs::remove_file(trace(r));
        assert!(
            calls.lines().any(|l| l == "ncclCommAbort"),
            "no ncclCommAbort: {ctx}\n{calls}"
        );
    }
    let _ = std::fs::remove_file(trace(victim));
    // The frozen one is still there (nothing can end it but a signal): end it.
    let mut victim_child = victim_child;
    let _ = victim_child.kill();
    let _ = victim_child.wait();
    let _ = std::fs::remove_dir_all(&rooms);
}

/// Kills these processes if the test fails on the way (a failed assertion must not leave
/// ranks running): those that are still this test's children, not yet reaped.
struct Reaper(Vec<u32>);

impl Drop for Reaper {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let me = std::process::id().to_string();
        for pid in &self.0 {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let parent = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1));
            if parent == Some(me.as_str()) {
                testkit::signal(*pid, 9);
            }
        }
    }
}

#[test]
fn a_rank_killed_during_a_large_all_reduce_is_named_within_the_timeout() {
    for victim in [1, 0] {
        peer_lost_during_a_large_all_reduce(9, victim);
    }
}

#[test]
fn a_rank_frozen_during_a_large_all_reduce_is_named_within_the_timeout() {
    for victim in [2, 0] {
        peer_lost_during_a_large_all_reduce(19, victim); // SIGSTOP
    }
}

// ---------------------------------------------------------------------------------
// 3. Which NCCL: named (file and version) before anything can fail, the preloaded one
//    used, and versions refused that the bindings do not support or the ranks disagree on.

#[test]
fn which_nccl_is_said_first_before_anything_can_fail() {
    // Rank 0 alone of two: it fails waiting for rank 1, but has said which NCCL first.
    let run = finish(spawn(by_hand(2, 0, free_port(), 2, &["--timeout", "2"])), LIMIT);
    assert_eq!(run.code, Some(1), "{run}");
    assert_eq!(run.stdout.lines().next(), Some(backend_line(2).as_str()), "{run}");
}

/// A folder under target/ with the double under `names` (links), and `copies` (copies:
/// another file, so another library with its own state, as a second NCCL install is).
fn folder(name: &str, names: &[&str], copies: &[&str]) -> PathBuf {
    let dir = testkit::nccl_double_dir().with_file_name(format!("nccl-double-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for n in names {
        std::os::unix::fs::symlink(testkit::nccl_double_file(), dir.join(n)).unwrap();
    }
    for n in copies {
        std::fs::copy(testkit::nccl_double_file(), dir.join(n)).unwrap();
    }
    dir
}

#[test]
fn an_nccl_preloaded_with_ld_preload_is_the_one_used_and_named() {
    // Seed 003's cluster: the venv's libnccl.so.2 preloaded on the command, while
    // another NCCL (here a copy of the double: another library) is on the path.
    let preload = folder("preload", &["libnccl.so.2"], &[]).join("libnccl.so.2");
    let path = folder("other-nccl", &["libcuda.so", "libcuda.so.1"], &["libnccl.so"]);
    let mut cmd = nccl_command(BIN, &["--backend", "nccl"], 2);
    cmd.env("LD_LIBRARY_PATH", &path).env("LD_PRELOAD", &preload);
    let run = finish(spawn(cmd), LIMIT).ok();
    assert_eq!(run.stdout.lines().next(), Some(backend_line(2).as_str()), "{run}");
    assert!(run.stdout.contains("Check: OK, all 2 ranks hold 2"), "{run}");
}

/// The path of the C library this test runs with: a real library that is not NCCL.
fn libc_path() -> PathBuf {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| {
            Path::new(p)
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("libc.so"))
        })
        .map(PathBuf::from)
        .expect("libc in /proc/self/maps")
}

#[test]
fn a_network_plugin_preloaded_is_not_taken_for_nccl() {
    // NCCL's network plugins are named libnccl-net*.so and are not NCCL (no
    // ncclGetVersion): here a harmless library under that name.
    let plugin = folder("plugin", &[], &[]).join("libnccl-net-x.so");
    std::os::unix::fs::symlink(libc_path(), &plugin).unwrap();
    let mut cmd = nccl_command(BIN, &["--backend", "auto"], 2);
    cmd.env("LD_PRELOAD", &plugin);
    let run = finish(spawn(cmd), LIMIT);
    assert!(!run.stderr.contains("internal error"), "{run}");
    let run = run.ok();
    assert_eq!(run.stdout.lines().next(), Some(backend_line(2).as_str()), "{run}");
    assert!(run.stdout.contains("Check: OK, all 2 ranks hold 2"), "{run}");
}

/// A command on the double's CUDA driver only (linked in a folder of its own, `name`,
/// returned too): no NCCL on `LD_LIBRARY_PATH`, and no variable of this machine's that
/// points at one.
fn without_nccl_on_the_path(name: &str, args: &[&str]) -> (Command, PathBuf) {
    let cuda_only = folder(name, &["libcuda.so", "libcuda.so.1"], &[]);
    let home = testkit::nccl_double_dir().with_file_name("empty-home");
    std::fs::create_dir_all(&home).unwrap();
    let mut cmd = nccl_command(BIN, args, 2);
    cmd.env("LD_LIBRARY_PATH", &cuda_only)
        .env("HOME", &home)
        .env_remove("NCCL_HOME")
        .env_remove("NCCL_LIBRARY")
        .env_remove("VIRTUAL_ENV")
        .env_remove("CONDA_PREFIX")
        .env_remove("LD_PRELOAD");
    (cmd, cuda_only)
}

#[test]
fn condas_nccl_in_conda_prefix_lib_is_found() {
    // `conda install nccl` puts libnccl.so.2 in $CONDA_PREFIX/lib.
    let prefix = folder("conda", &[], &[]);
    let lib = prefix.join("lib");
    std::fs::create_dir_all(&lib).unwrap();
    std::os::unix::fs::symlink(testkit::nccl_double_file(), lib.join("libnccl.so.2")).unwrap();
    let (mut cmd, _) = without_nccl_on_the_path("cuda-only-conda", &["--backend", "nccl"]);
    cmd.env("CONDA_PREFIX", &prefix);
    let run = finish(spawn(cmd), LIMIT).ok();
    assert_eq!(run.stdout.lines().next(), Some(backend_line(2).as_str()), "{run}");
    assert!(run.stdout.contains("Check: OK, all 2 ranks hold 2"), "{run}");
}

#[test]
fn without_libnccl_the_message_lists_every_place_looked() {
    let prefix = folder("conda-without-nccl", &[], &[]);
    let home = Path::new("/nowhere/nccl-home");
    let (mut cmd, cuda_only) = without_nccl_on_the_path("cuda-only-none", &["--backend", "nccl"]);
    cmd.env("CONDA_PREFIX", &prefix).env("NCCL_HOME", home);
    let run = finish(spawn(cmd), LIMIT);
    assert_eq!(run.code, Some(1), "{run}");
    assert_eq!(run.stderr.lines().count(), 1, "{run}");
    for place in [
        "found 2 GPUs but no libnccl".to_string(),
        "NCCL_LIBRARY (unset)".into(),
        "the libraries already loaded (LD_PRELOAD)".into(),
        "cudarc's own names".into(),
        format!("NCCL_HOME ({0}/lib, {0}/lib64)", home.display()),
        format!("LD_LIBRARY_PATH ({})", cuda_only.display()),
        format!(
            "the active environment's wheels (nvidia/nccl/lib in python3.*/{{site,dist}}-packages of {}/lib)",
            prefix.display()
        ),
        format!("conda's own lib folder ({}/lib)", prefix.display()),
        "/usr/local/cuda/lib64".into(),
    ] {
        assert!(run.stderr.contains(&place), "{place:?} not named:\n{run}");
    }
}

#[test]
fn nccl_library_naming_a_folder_or_not_nccl_is_one_line_and_exit_2() {
    let dir = folder("named-folder", &["libnccl.so.2"], &[]);
    let text = dir.join("notes.txt");
    std::fs::write(&text, "not a library").unwrap();
    let cases = [
        (dir.clone(), "is a folder: name the library file in it"),
        (dir.join("missing.so"), "there is no such file"),
        (text, "is not a library this program can load"),
        (libc_path(), "is not NCCL: it has no ncclGetVersion"),
    ];
    for (value, says) in cases {
        let mut cmd = nccl_command(BIN, &["--backend", "nccl"], 2);
        cmd.env("NCCL_LIBRARY", &value);
        let run = finish(spawn(cmd), LIMIT);
        let ctx = format!("NCCL_LIBRARY={}:\n{run}", value.display());
        assert_eq!(run.code, Some(2), "{ctx}");
        assert!(run.stderr.contains(says), "{ctx}");
        assert_eq!(run.stderr.lines().count(), 1, "{ctx}");
    }
}

#[test]
fn an_nccl_older_than_the_bindings_support_is_refused_naming_both_versions() {
    let mut cmd = nccl_command(BIN, &["--backend", "nccl"], 2);
    cmd.env("NCCL_DOUBLE_VERSION", "21705");
    let run = finish(spawn(cmd), LIMIT);
    assert_eq!(run.code, Some(2), "{run}");
    assert!(
        run.stderr.contains(&format!(
            "NCCL 2.17.5 ({}) is older than NCCL 2.18.0, the oldest this workbook supports",
            testkit::nccl_double_file().display()
        )),
        "{run}"
    );
    // --backend auto runs on the CPU instead, and says why.
    let mut cmd = nccl_command(BIN, &[], 2);
    cmd.env("NCCL_DOUBLE_VERSION", "21705");
    let run = finish(spawn(cmd), LIMIT).ok();
    assert!(
        run.stdout
            .starts_with("backend: cpu, because found 2 GPUs but NCCL 2.17.5"),
        "{run}"
    );
}

#[test]
fn ranks_that_load_different_nccl_versions_are_refused_naming_both() {
    let [a, b] = testkit::two_nodes(|n, args| {
        let mut cmd = nccl_command(BIN, &[&["--backend", "nccl"], args].concat(), 2);
        cmd.env("SLURMD_NODENAME", ["node-a", "node-b"][n])
            .env("NCCL_DOUBLE_VERSION", ["21803", "22105"][n]);
        cmd
    });
    let file = testkit::nccl_double_file();
    let expect = format!(
        "rank 0 loads NCCL 2.18.3 ({0}) but rank 2 loads NCCL 2.21.5 ({0}): every rank must use the same NCCL version",
        file.display()
    );
    assert_eq!(a.code, Some(2), "{a}\n{b}");
    assert!(a.stderr.contains(&expect), "{a}\n{b}");
    assert_ne!(b.code, Some(0), "{b}");
}

// ---------------------------------------------------------------------------------
// 5. How the communicator ends: finalize then destroy on success, abort on failure.

/// The NCCL and CUDA entry points a run called, by every process of it.
fn traced(extra_env: &[(&str, &str)], args: &[&str]) -> (Run, String) {
    let trace = testkit::nccl_double_dir().with_file_name(format!("trace-{}-{}", std::process::id(), args.len()));
    let _ = std::fs::remove_file(&trace);
    let mut cmd = nccl_command(BIN, args, 2);
    cmd.env("NCCL_DOUBLE_TRACE", &trace);
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    let run = finish(spawn(cmd), LIMIT);
    let calls = std::fs::read_to_string(&trace).unwrap_or_default();
    let _ = std::fs::remove_file(&trace);
    (run, calls)
}

#[test]
fn the_communicator_is_finalized_and_destroyed_and_aborted_only_on_failure() {
    let (run, calls) = traced(&[], &["--backend", "nccl"]);
    assert_eq!(run.code, Some(0), "{run}");
    for call in ["ncclCommInitRankConfig", "ncclCommFinalize", "ncclCommDestroy"] {
        assert!(calls.lines().any(|l| l == call), "{call} not called:\n{calls}\n{run}");
    }
    assert!(
        !calls.lines().any(|l| l == "ncclCommAbort"),
        "aborted on success:\n{calls}"
    );
    // A wrong result is a failure of the run, not of NCCL: still a clean end.
    let (run, calls) = traced(&[("NCCL_WORKBOOK_FAULT", "corrupt:1:0")], &["--backend", "nccl"]);
    assert_eq!(run.code, Some(1), "{run}");
    assert!(!calls.lines().any(|l| l == "ncclCommAbort"), "{calls}");
    assert!(!run.stderr.contains("internal error"), "{run}");
}

#[test]
fn the_launcher_names_the_frozen_rank_and_leaves_nothing_running() {
    let mut cmd = nccl_command(
        BIN,
        &[
            "--backend",
            "nccl",
            "--nproc-per-node",
            "3",
            "--size",
            "4M",
            "--iters",
            "100000",
            "--timeout",
            "6",
        ],
        4,
    );
    let rooms = testkit::nccl_double_dir().with_file_name(format!("rooms-launcher-{}", std::process::id()));
    std::fs::create_dir_all(&rooms).unwrap();
    cmd.env("NCCL_DOUBLE_DIR", &rooms);
    let launcher = spawn(cmd);
    let pid = launcher.id();
    // The launcher's children, in rank order, once all three are there.
    let kids: Vec<u32> = (0..500)
        .find_map(|_| {
            let kids = testkit::children(pid);
            sleep(Duration::from_millis(20));
            (kids.len() == 3).then_some(kids)
        })
        .expect("the launcher's three ranks");
    let _reaper = Reaper(kids.clone());
    sleep(Duration::from_millis(2500));
    assert!(testkit::signal(kids[1], 19)); // SIGSTOP
    let hit = Instant::now();
    let run = finish(launcher, LIMIT);
    assert!(hit.elapsed() < Duration::from_secs(6 + 5), "{run}");
    assert_eq!(run.code, Some(1), "{run}");
    assert!(
        run.stderr
            .contains("launcher: rank 1 was frozen (its process was stopped: SIGSTOP, or a debugger); then rank"),
        "{run}"
    );
    assert!(run.stderr.contains("rank 1 stopped responding"), "{run}");
    // The frozen rank was killed with the others: nothing of the job is left.
    sleep(Duration::from_millis(200));
    for k in kids {
        assert!(
            testkit::ended(k),
            "rank pid {k} is still there: state {:?}",
            testkit::process_state(k)
        );
    }
    let _ = std::fs::remove_dir_all(&rooms);
}
