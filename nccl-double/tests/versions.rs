//! What changes with the NCCL version the double plays (`NCCL_DOUBLE_VERSION`): from
//! NCCL 2.23, every operation of a non-blocking communicator is launched by a helper
//! thread; the call says `ncclInProgress`, `ncclCommGetAsyncError` says so until the
//! helper has run, and a call made before it says `ncclSuccess` is refused (NCCL's
//! `ncclCommEnsureReady`: "Attempt to use communicator before the previous operation
//! returned ncclSuccess"). Before 2.23, the same loop starts no thread. Played with
//! `nccl-double-bare` (a bare loop of all-reduces), one rank.

mod support;

use std::process::Command;

const BARE: &str = env!("CARGO_BIN_EXE_nccl-double-bare");

/// A bare loop of 20 all-reduces on a non-blocking communicator, playing NCCL `version`:
/// how it ended, and the helper threads the double started.
fn bare(version: &str, extra: &[&str]) -> (support::Out, u64) {
    let tag = format!("{}-{version}-{}", std::process::id(), extra.len());
    let tmp = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let (id, stats) = (
        tmp.join(format!("bare-id-{tag}")),
        tmp.join(format!("bare-stats-{tag}")),
    );
    let _ = std::fs::remove_file(&id);
    let _ = std::fs::remove_file(&stats);
    let mut cmd = Command::new(BARE);
    cmd.args([
        "--id-file",
        id.to_str().unwrap(),
        "--iters",
        "20",
        "--warmup",
        "1",
        "--nonblocking",
    ])
    .args(extra)
    .env("LD_LIBRARY_PATH", support::lib_dir())
    .env("NCCL_DOUBLE", "1")
    .env("NCCL_DOUBLE_DIR", support::meet_dir())
    .env("NCCL_DOUBLE_VERSION", version)
    .env("NCCL_DOUBLE_STATS", &stats)
    .env_remove("CUDA_VISIBLE_DEVICES")
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped());
    let out = support::finish(0, cmd.spawn().unwrap());
    let helpers = std::fs::read_to_string(&stats)
        .ok()
        .and_then(|s| s.trim().strip_prefix("helper_threads=")?.parse().ok())
        .unwrap_or(u64::MAX);
    let _ = std::fs::remove_file(&id);
    let _ = std::fs::remove_file(&stats);
    (out, helpers)
}

#[test]
fn from_2_23_every_call_of_a_non_blocking_communicator_has_a_helper_thread() {
    // Polled to ncclSuccess after each call: it runs, one helper per all-reduce (21).
    let (out, helpers) = bare("22304", &[]);
    assert_eq!(out.code, Some(0), "{out}");
    assert_eq!(helpers, 21, "{out}");
    // Before 2.23: none.
    let (out, helpers) = bare("22203", &[]);
    assert_eq!((out.code, helpers), (Some(0), 0), "{out}");
    // Not polled: the second call comes while the first one's helper may still run. On
    // 2.23 it is refused (or, if the helper was quick, a later one is): the loop fails.
    let (out, _) = bare("22304", &["--no-poll"]);
    assert_eq!(out.code, Some(1), "{out}");
    assert!(
        out.stderr
            .contains("Attempt to use communicator before the previous operation returned ncclSuccess"),
        "{out}"
    );
    // Before 2.23, nothing to wait for: the same loop runs.
    let (out, _) = bare("22203", &["--no-poll"]);
    assert_eq!(out.code, Some(0), "{out}");
}
