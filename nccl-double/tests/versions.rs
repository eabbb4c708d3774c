//! What changes with the NCCL version the double plays (`NCCL_DOUBLE_VERSION`): from
//! NCCL 2.23, every operation of a non-blocking communicator of several ranks is launched
//! by a helper thread; the call says `ncclInProgress`, `ncclCommGetAsyncError` says so
//! until the helper has run, and a call made before it says `ncclSuccess` is refused
//! (NCCL's `ncclCommEnsureReady`: "Attempt to use communicator before the previous
//! operation returned ncclSuccess"). Before 2.23, the same loop starts no thread. On one
//! rank no version starts one: NCCL puts a one-rank collective on the stream at once
//! (`ncclLaunchOneRank`), and the call says `ncclSuccess` (seen on an H200 with NCCL
//! 2.28.3). Played with `nccl-double-bare` (a bare loop of all-reduces).

mod support;

use std::process::Command;

const BARE: &str = env!("CARGO_BIN_EXE_nccl-double-bare");

/// A bare loop of 20 all-reduces on a non-blocking communicator of `world` ranks, playing
/// NCCL `version`: how rank 0 ended, and the helper threads the double started in it.
fn bare(version: &str, world: usize, extra: &[&str]) -> (support::Out, u64) {
    bare_with(version, world, extra, &[])
}

/// [`bare`], with the variables `env` set for every rank.
fn bare_with(version: &str, world: usize, extra: &[&str], env: &[(&str, &str)]) -> (support::Out, u64) {
    let tag = format!("{}-{version}-{world}-{}-{}", std::process::id(), extra.len(), env.len());
    let tmp = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let id = tmp.join(format!("bare-id-{tag}"));
    let stats = |r: usize| tmp.join(format!("bare-stats-{tag}-{r}"));
    let _ = std::fs::remove_file(&id);
    let ranks: Vec<_> = (0..world)
        .map(|r| {
            let _ = std::fs::remove_file(stats(r));
            let mut cmd = Command::new(BARE);
            cmd.args(["--rank", &r.to_string(), "--world", &world.to_string()])
                .args([
                    "--id-file",
                    id.to_str().unwrap(),
                    "--iters",
                    "20",
                    "--warmup",
                    "1",
                    "--nonblocking",
                ])
                .args(extra)
                .envs(env.iter().copied())
                .env("LD_LIBRARY_PATH", support::lib_dir())
                .env("NCCL_DOUBLE", "1")
                .env("NCCL_DOUBLE_DEVICES", world.to_string())
                .env("NCCL_DOUBLE_DIR", support::meet_dir())
                .env("NCCL_DOUBLE_VERSION", version)
                .env("NCCL_DOUBLE_STATS", stats(r))
                .env("CUDA_VISIBLE_DEVICES", r.to_string()) // each rank its own GPU
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
            support::Running::new(r, cmd.spawn().unwrap())
        })
        .collect();
    let outs: Vec<support::Out> = ranks.into_iter().map(|r| r.finish().0).collect();
    let helpers = std::fs::read_to_string(stats(0))
        .ok()
        .and_then(|s| s.trim().strip_prefix("helper_threads=")?.parse().ok())
        .unwrap_or(u64::MAX);
    let _ = std::fs::remove_file(&id);
    for r in 0..world {
        let _ = std::fs::remove_file(stats(r));
    }
    (outs.into_iter().next().unwrap(), helpers)
}

#[test]
fn from_2_23_every_call_of_a_non_blocking_communicator_has_a_helper_thread() {
    // Polled to ncclSuccess after each call: it runs, one helper per all-reduce (21).
    let (out, helpers) = bare("22304", 2, &[]);
    assert_eq!(out.code, Some(0), "{out}");
    assert_eq!(helpers, 21, "{out}");
    // Before 2.23: none.
    let (out, helpers) = bare("22203", 2, &[]);
    assert_eq!((out.code, helpers), (Some(0), 0), "{out}");
    // One rank: none either, on any version (ncclLaunchOneRank).
    let (out, helpers) = bare("22803", 1, &[]);
    assert_eq!((out.code, helpers), (Some(0), 0), "{out}");
    // Not polled: the second call comes while the first one's helper may still run. On
    // 2.23 it is refused (or, if the helper was quick, a later one is): the loop fails.
    let (out, _) = bare("22304", 2, &["--no-poll"]);
    assert_eq!(out.code, Some(1), "{out}");
    assert!(
        out.stderr
            .contains("Attempt to use communicator before the previous operation returned ncclSuccess"),
        "{out}"
    );
    // Before 2.23, nothing to wait for: the same loop runs.
    let (out, _) = bare("22203", 2, &["--no-poll"]);
    assert_eq!(out.code, Some(0), "{out}");
}

#[test]
fn nccl_comm_blocking_overrides_the_config_as_nccl_reads_the_environment_over_it() {
    // NCCL's envConfigOverride (init.cc, 2.18 to 2.30): NCCL_COMM_BLOCKING=1 makes the
    // non-blocking config blocking: no call says ncclInProgress, no helper thread starts.
    let (out, helpers) = bare_with("22304", 2, &[], &[("NCCL_COMM_BLOCKING", "1")]);
    assert_eq!((out.code, helpers), (Some(0), 0), "{out}");
    // A value NCCL ignores (not 0 or 1) leaves the config as it is: a helper per call.
    let (out, helpers) = bare_with("22304", 2, &[], &[("NCCL_COMM_BLOCKING", "2")]);
    assert_eq!((out.code, helpers), (Some(0), 21), "{out}");
}
