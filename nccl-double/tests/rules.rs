//! The double enforces its rules: each test breaks one on purpose, through cudarc, in a
//! job of real processes (one per rank), and checks the error of the rank that broke it
//! (and that the others stop with ncclRemoteError, told by the failure marker, instead
//! of waiting for ever: real NCCL would leave them stuck until aborted). Errors of rules
//! 1, 2, 5 and 6 come from the call; rules 3 and 4 are found after it, and the probe
//! reads them from ncclCommGetAsyncError while it waits for the stream.

mod support;

use std::time::Duration;
use support::{Job, Out, all, failed_with, finish, probe, spawn};

/// Well under the runs' hard limit: the others were told, and stopped at once.
const FAST: Duration = Duration::from_secs(10);

fn fast(outs: &[Out]) {
    for o in outs {
        assert!(o.elapsed < FAST, "rank {} took {:?}:\n{}", o.rank, o.elapsed, all(outs));
    }
}

/// Rank 1 breaks `rule`; rank 0 must fail with ncclRemoteError, saying why.
fn one_breaks(op: &str, world: usize, rule: &str, code: &str, text: &str) -> Vec<Out> {
    let outs = Job::new(op, world).rank_args(1, &["--break", rule]).run();
    failed_with(&outs, 1, code, text);
    failed_with(&outs, 0, "ncclRemoteError", text);
    fast(&outs);
    outs
}

#[test]
fn rule_1_a_context_current_when_the_communicator_is_made() {
    let outs = one_breaks(
        "allreduce",
        2,
        "no-context",
        "ncclInvalidUsage",
        "with no CUDA context current on this thread",
    );
    assert!(
        all(&outs).contains("real NCCL would silently use device 0"),
        "{}",
        all(&outs)
    );
}

#[test]
fn rule_1_a_context_current_when_the_communicator_is_used() {
    one_breaks(
        "allreduce",
        2,
        "no-context-use",
        "ncclInvalidUsage",
        "with no CUDA context current on this thread",
    );
    one_breaks(
        "broadcast",
        2,
        "wrong-context-use",
        "ncclInvalidUsage",
        "on rank 1's communicator (device 1) while device 2's context is current on this thread",
    );
}

#[test]
fn rule_2_ranks_in_range_and_agreeing() {
    one_breaks(
        "allreduce",
        2,
        "rank-out-of-range",
        "ncclInvalidArgument",
        "rank must be in 0..2",
    );
    // Both see the disagreement in the other's card: from the init's call (blocking), or
    // from ncclCommGetAsyncError (non-blocking: the init itself said ncclInProgress).
    for mode in [&[][..], &["--nonblocking"][..]] {
        let outs = Job::new("allreduce", 2)
            .args(mode)
            .rank_args(1, &["--break", "world-mismatch"])
            .run();
        failed_with(
            &outs,
            0,
            "ncclInvalidArgument",
            "rank 1 joined a world of 3 ranks, this rank (0) one of 2",
        );
        failed_with(
            &outs,
            1,
            "ncclInvalidArgument",
            "rank 0 joined a world of 2 ranks, this rank (1) one of 3",
        );
        if !mode.is_empty() {
            assert!(
                outs[0]
                    .stderr
                    .contains("ncclCommInitRankConfig (ncclCommGetAsyncError) failed"),
                "{}",
                all(&outs)
            );
        }
        fast(&outs);
    }
    // Rank 1 claims rank 0 too: whichever comes second is refused, the other told.
    let outs = Job::new("allreduce", 2).rank_args(1, &["--break", "same-rank"]).run();
    let text = "two processes claim the same rank 0";
    assert!(outs.iter().all(|o| o.code == Some(1)), "{}", all(&outs));
    assert!(
        outs.iter().any(|o| o.stderr.contains("ncclInvalidArgument")),
        "{}",
        all(&outs)
    );
    assert!(outs.iter().all(|o| o.stderr.contains(text)), "{}", all(&outs));
    fast(&outs);
}

#[test]
fn rule_3_two_ranks_of_one_host_on_one_gpu_is_a_duplicate_gpu() {
    // One GPU for two ranks on one host: NCCL compares hosts and PCI bus ids, and each
    // rank names itself first.
    let outs = Job::new("allreduce", 2).env("NCCL_DOUBLE_DEVICES", "1").run();
    for (r, other) in [(0, 1), (1, 0)] {
        failed_with(
            &outs,
            r,
            "ncclInvalidUsage",
            &format!("Duplicate GPU detected : rank {r} and rank {other} both on CUDA device 0000:1B:00.0"),
        );
    }
    fast(&outs);
    // The same on two "hosts" is fine.
    let outs = Job::new("allreduce", 2)
        .env("NCCL_DOUBLE_DEVICES", "1")
        .rank_env(0, "NCCL_DOUBLE_HOST", "node-a")
        .rank_env(1, "NCCL_DOUBLE_HOST", "node-b")
        .run();
    support::all_ok(&outs);
}

#[test]
fn rule_3_every_rank_loads_the_same_nccl_version() {
    let outs = Job::new("allreduce", 2)
        .rank_env(1, "NCCL_DOUBLE_VERSION", "22105")
        .run();
    failed_with(
        &outs,
        0,
        "ncclInvalidUsage",
        "Mismatched NCCL version detected : rank 1 version 22105 rank 0 version 21803",
    );
    failed_with(
        &outs,
        1,
        "ncclInvalidUsage",
        "Mismatched NCCL version detected : rank 0 version 21803 rank 1 version 22105",
    );
    fast(&outs);
}

#[test]
fn rule_4_every_rank_calls_the_same_collective() {
    let both = |op: &str, world: usize, rule: &str, text: &str| {
        let outs = Job::new(op, world).rank_args(1, &["--break", rule]).run();
        for r in 0..world {
            failed_with(&outs, r, "ncclInvalidUsage", text);
            failed_with(&outs, r, "ncclInvalidUsage", "collective mismatch");
        }
        fast(&outs);
    };
    both(
        "allreduce",
        2,
        "mismatch-count",
        "rank 0 called ncclAllReduce(count=4, ncclFloat32, ncclSum) but rank 1 called ncclAllReduce(count=5, ncclFloat32, ncclSum)",
    );
    both(
        "allreduce",
        2,
        "mismatch-op",
        "rank 1 called ncclAllReduce(count=4, ncclFloat32, ncclMax)",
    );
    both(
        "allreduce",
        2,
        "mismatch-dtype",
        "rank 1 called ncclAllReduce(count=4, ncclFloat64, ncclSum)",
    );
    both(
        "allreduce",
        3,
        "mismatch-kind",
        "rank 0 called ncclAllReduce(count=4, ncclFloat32, ncclSum) but rank 1 called ncclBroadcast(count=4, ncclFloat32, root=0)",
    );
    both(
        "broadcast-inplace",
        3,
        "mismatch-root",
        "rank 0 called ncclBroadcast(count=4, ncclFloat32, root=0) but rank 1 called ncclBroadcast(count=4, ncclFloat32, root=1)",
    );
}

/// The same for the collectives added later: rank 1 is given another `--op`, `--count`,
/// `--dtype`, `--reduce` or `--root` than the others.
#[test]
fn rule_4_every_rank_calls_the_same_reduce_all_gather_and_reduce_scatter() {
    let cases: [(&str, usize, &[&str], &str); 6] = [
        (
            "allgather",
            2,
            &["--count", "5"],
            "rank 0 called ncclAllGather(sendcount=4, ncclFloat32) but rank 1 called ncclAllGather(sendcount=5, ncclFloat32)",
        ),
        (
            "allgather",
            2,
            &["--op", "reducescatter"],
            "rank 0 called ncclAllGather(sendcount=4, ncclFloat32) but rank 1 called ncclReduceScatter(recvcount=4, ncclFloat32, ncclSum)",
        ),
        (
            "reducescatter",
            2,
            &["--reduce", "max"],
            "rank 0 called ncclReduceScatter(recvcount=4, ncclFloat32, ncclSum) but rank 1 called ncclReduceScatter(recvcount=4, ncclFloat32, ncclMax)",
        ),
        (
            "reducescatter",
            2,
            &["--dtype", "bf16"],
            "rank 1 called ncclReduceScatter(recvcount=4, ncclBfloat16, ncclSum)",
        ),
        (
            "reduce",
            3,
            &["--root", "1"],
            "rank 0 called ncclReduce(count=4, ncclFloat32, ncclSum, root=0) but rank 1 called ncclReduce(count=4, ncclFloat32, ncclSum, root=1)",
        ),
        (
            "reduce",
            2,
            &["--dtype", "f16"],
            "rank 1 called ncclReduce(count=4, ncclFloat16, ncclSum, root=0)",
        ),
    ];
    for (op, world, other, text) in cases {
        let outs = Job::new(op, world).rank_args(1, other).run();
        for r in 0..world {
            failed_with(&outs, r, "ncclInvalidUsage", text);
            failed_with(&outs, r, "ncclInvalidUsage", "collective mismatch at call #1");
        }
        fast(&outs);
    }
}

#[test]
fn rule_4_a_matched_send_and_recv_have_one_size() {
    let outs = Job::new("pairs", 2).rank_args(1, &["--break", "recv-size"]).run();
    let text = "ncclRecv of 5 x ncclFloat32 by rank 1 from rank 0 does not match ncclSend of 4 x ncclFloat32 by rank 0";
    failed_with(&outs, 0, "ncclInvalidUsage", text);
    failed_with(&outs, 1, "ncclInvalidUsage", text);
    fast(&outs);
}

#[test]
fn rule_5_buffers_are_live_device_memory_of_the_communicators_device() {
    one_breaks(
        "allreduce",
        2,
        "host-buffer",
        "ncclInvalidArgument",
        "is not device memory",
    );
    one_breaks("allreduce", 2, "freed-buffer", "ncclInvalidArgument", "already freed");
    one_breaks("allreduce", 2, "count-too-large", "ncclInvalidArgument", "16 bytes at");
    one_breaks(
        "allreduce",
        2,
        "count-too-large",
        "ncclInvalidArgument",
        "run past the end",
    );
    one_breaks(
        "allreduce",
        2,
        "other-device-buffer",
        "ncclInvalidArgument",
        "is memory of device 2, but the communicator is on device 1",
    );
}

/// All-gather's recvbuff holds world x sendcount elements, reduce-scatter's sendbuff
/// world x recvcount: one element short is refused. A non-root's recvbuff is not used by
/// ncclReduce, so it is not checked (NULL on odd non-roots is covered in
/// tests/collectives.rs; here it even overlaps the sendbuff).
#[test]
fn rule_5_buffers_hold_every_byte_the_collective_uses() {
    one_breaks(
        "allgather",
        2,
        "recv-too-small",
        "ncclInvalidArgument",
        "ncclAllGather(sendcount=4, ncclFloat32) recvbuff: 32 bytes at 0x",
    );
    one_breaks(
        "allgather",
        2,
        "recv-too-small",
        "ncclInvalidArgument",
        "run past the end",
    );
    one_breaks(
        "reducescatter",
        2,
        "send-too-small",
        "ncclInvalidArgument",
        "ncclReduceScatter(recvcount=4, ncclFloat32, ncclSum) sendbuff: 32 bytes at 0x",
    );
    let outs = Job::new("reduce", 2)
        .args(&["--root", "0"])
        .rank_args(1, &["--break", "overlap"])
        .run();
    support::all_ok(&outs);
}

#[test]
fn rule_2_a_root_is_a_rank_of_the_communicator() {
    one_breaks(
        "reduce",
        3,
        "root-out-of-range",
        "ncclInvalidArgument",
        "ncclReduce: root 3 is not a rank of this communicator (0..3)",
    );
    one_breaks(
        "broadcast",
        2,
        "root-out-of-range",
        "ncclInvalidArgument",
        "ncclBroadcast: root 2 is not a rank of this communicator (0..2)",
    );
}

/// Rule 6: send and receive buffers that overlap are in place exactly as NCCL lays it
/// out, or refused (real NCCL computes garbage); inside a group, no call touches memory
/// another call writes (an in-place all-to-all).
#[test]
fn rule_6_overlapping_buffers_are_in_place_as_nccl_documents_or_refused() {
    let layout = "overlap without being in place: ";
    let garbage = "any other overlap is refused (real NCCL does not check this and silently computes garbage)";
    let cases: [(&str, &[&str], &str); 5] = [
        (
            "allgather",
            &[],
            "an all-gather is in place only when sendbuff == recvbuff + rank * sendcount * size (here 0x",
        ),
        (
            "reducescatter",
            &[],
            "a reduce-scatter is in place only when recvbuff == sendbuff + rank * recvcount * size (here 0x",
        ),
        (
            "allreduce",
            &[],
            "an all-reduce is in place only when sendbuff == recvbuff;",
        ),
        // Rank 1 is the root: the one rank whose both buffers the call uses.
        (
            "reduce",
            &["--root", "1"],
            "a reduce is in place only when sendbuff == recvbuff;",
        ),
        (
            "broadcast",
            &["--root", "1"],
            "a broadcast is in place only when sendbuff == recvbuff;",
        ),
    ];
    for (op, args, text) in cases {
        let outs = Job::new(op, 2).args(args).rank_args(1, &["--break", "overlap"]).run();
        for t in [layout, text, garbage] {
            failed_with(&outs, 1, "ncclInvalidArgument", t);
            failed_with(&outs, 0, "ncclRemoteError", t);
        }
        fast(&outs);
    }
    one_breaks(
        "alltoall",
        2,
        "overlap",
        "ncclInvalidArgument",
        "ncclRecv(count=4, ncclFloat32, peer=0): its recvbuff 0x",
    );
    one_breaks(
        "alltoall",
        2,
        "overlap",
        "ncclInvalidArgument",
        "of ncclSend(count=4, ncclFloat32, peer=0), made before it in this group",
    );
}

#[test]
fn rule_5_the_driver_refuses_a_host_pointer_as_device_memory() {
    let o = finish(0, spawn(probe(&["--op", "driver", "--break", "dtoh-host-pointer"])));
    assert_eq!(o.code, Some(1), "{o}");
    assert!(
        o.stderr.contains(
            "clone_dtoh from a host pointer failed: DriverError(CUDA_ERROR_INVALID_VALUE, \"invalid argument\")"
        ),
        "{o}"
    );
    assert!(o.stderr.contains("nccl-double WARN: cuMemcpyDtoHAsync: 0x"), "{o}");
    assert!(o.stderr.contains("is not device memory"), "{o}");
}

/// Not a rule of the double but a trap of cudarc: a buffer dropped on a thread with no
/// current context is not freed, and the error comes back from an unrelated call.
#[test]
fn a_buffer_dropped_on_a_thread_without_a_context_is_said_loudly() {
    let o = finish(0, spawn(probe(&["--op", "driver", "--break", "free-without-context"])));
    assert_eq!(o.code, Some(1), "{o}");
    assert!(
        o.stderr.contains("cuMemFreeAsync(0x") && o.stderr.contains("on a thread with no current CUDA context"),
        "{o}"
    );
    assert!(
        o.stderr.contains(
            "ctx.name() after a buffer was dropped on another thread failed: DriverError(CUDA_ERROR_INVALID_CONTEXT"
        ),
        "{o}"
    );
    assert!(
        o.stderr
            .contains("destroyed with 1 allocation(s) (16 bytes) never freed"),
        "{o}"
    );
}
