//! Simulated GPUs keep device memory, and the double's working copies, in host memory: a
//! process limited in address space (`ulimit -v`) can run out of it in the middle of a
//! collective. That must end the run in one line per rank (NCCL's system error, on the
//! call that failed), never in an allocation abort with a backtrace (issue 30, item 5).

use testkit::{LIMIT, Run, finish, spawn};

const BIN: &str = env!("CARGO_BIN_EXE_harness-probe");

#[test]
fn a_working_copy_the_double_cannot_make_is_one_line_not_an_abort() {
    // Needs `ulimit -v` (RLIMIT_AS), which any user may lower. Each rank holds 300 MiB of
    // "device" memory and reads back as much for the check; the double's reduction needs
    // one more copy of 300 MiB, over the 1.43 GiB each process may map. Before: "memory
    // allocation of 314572800 bytes failed", a backtrace and SIGABRT (nccl-double's
    // reduce.rs), and the other rank blaming it for the store.
    let r = limited(1_500_000, "300M");
    assert_eq!(r.code, Some(1), "{r}");
    for abort in ["memory allocation of", "stack backtrace", "panicked", "signal 6"] {
        assert!(!r.stderr.contains(abort), "{abort:?} in:\n{r}");
    }
    let said = r
        .stderr
        .lines()
        .find(|l| l.starts_with("error: rank ") && l.contains("with ncclSystemError"))
        .unwrap_or_else(|| panic!("no rank says NCCL's system error:\n{r}"));
    assert!(
        said.contains("no host memory left for a working copy of 314572800 bytes"),
        "{said}"
    );
    assert!(said.contains("ulimit -v"), "{said}");
}

#[test]
fn any_address_space_limit_ends_in_one_line_per_rank_never_an_abort() {
    // Needs `ulimit -v`. 256 MiB per rank under limits of 586, 781 and 977 MiB: depending
    // on the limit, the first to fail is the host buffer, the "device" memory
    // (cuMemAllocAsync: CUDA_ERROR_OUT_OF_MEMORY), the share the double publishes, or a
    // working copy. Before: cudarc's debug form (`DriverError(CUDA_ERROR_OUT_OF_MEMORY,
    // "out of memory")`) at 600,000 and 800,000 KiB, and at 1,000,000 KiB "memory allocation of
    // 268435508 bytes failed", a backtrace and SIGABRT (the double's publish).
    for kib in [600_000, 800_000, 1_000_000] {
        let r = limited(kib, "256M");
        assert!(matches!(r.code, Some(1 | 2)), "ulimit -v {kib}: {r}");
        for abort in [
            "memory allocation of",
            "stack backtrace",
            "panicked",
            "signal 6",
            "DriverError(",
        ] {
            assert!(!r.stderr.contains(abort), "ulimit -v {kib}: {abort:?} in:\n{r}");
        }
        // The rank that ran short says so, naming the limit, in its one line.
        assert!(
            r.stderr
                .lines()
                .any(|l| l.starts_with("error: rank ") && l.contains("ulimit -v")),
            "ulimit -v {kib}: no rank says the limit:\n{r}"
        );
    }
}

/// An all-reduce of `size` per rank on 2 simulated GPUs, in processes limited to `kib`
/// KiB of address space (`ulimit -v`).
fn limited(kib: u64, size: &str) -> Run {
    let mut cmd = std::process::Command::new("sh");
    cmd.args(["-c", &format!("ulimit -v {kib} && exec \"$0\" \"$@\""), BIN])
        .args([
            "--simulate-gpus",
            "2",
            "--nproc-per-node",
            "2",
            "--size",
            size,
            "--iters",
            "1",
        ])
        .args(["--timeout", testkit::TIMEOUT]);
    testkit::clear_job_env(&mut cmd);
    finish(spawn(cmd), LIMIT)
}
