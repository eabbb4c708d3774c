//! `nccl-double-probe`: a TEST FIXTURE of the `nccl-double` package, not a tool. It plays
//! one rank of an NCCL job through cudarc, exactly as a correct program would
//! (`CudaContext::new(device)` on the rank's thread, `default_stream`, `clone_htod`, a
//! communicator, collectives, `clone_dtoh`, ...), so that the tests in `tests/` can prove
//! that the test double works when loaded through cudarc's real dynamic-loading path,
//! and that it catches each rule when one rank breaks it on purpose (`--break`).
//!
//! ```text
//! nccl-double-probe --op OP[,OP...] [--rank R --world N --id-file PATH] [--device D]
//!     [--count C[,C...]] [--dtype T[,T...]] [--reduce R[,R...]]
//!     [--root R] [--repeat K] [--threads] [--api raw|safe] [--nonblocking]
//!     [--delay-ms MS] [--op-delay-ms MS] [--watch-ms MS] [--abort-after-ms MS]
//!     [--ready-file PATH] [--break RULE]
//!     [--color C] [--key K] [--split-config CONFIG] [--first allreduce]
//! ```
//!
//! Types: `f32`, `f64`, `i32`, `i64`, `u32`, `u64`, `u8`, `i8`, and `f16`, `bf16` (2-byte
//! types the probe defines itself, with its own exactly rounded conversions: see
//! [`values::F16`] for why not `half`'s). Reductions: `sum`, `prod`, `max`, `min`, `avg`.
//!
//! Ops: `info`, `devices`, `present`, `driver` (one process, no job); `allreduce`,
//! `allreduce-inplace`, `broadcast`, `broadcast-inplace`, `reduce`, `reduce-inplace`
//! (the rooted ones: every root in turn unless `--root`), `allgather`,
//! `allgather-inplace`, `reducescatter`, `reducescatter-inplace` (count: NCCL's
//! sendcount, recvcount), `alltoall` (as nccl-tests: one group with a send and a recv
//! of `count` elements to and from every rank, itself included), `ring` and `pairs`
//! (send/recv inside a group); `raw` (finalize, then destroy); `watch` (a collective
//! whose peer may never come: watch the stream, then abort); `init-abort` (abort a
//! non-blocking init that cannot finish); `split` (`ncclCommSplit` by `--color` and
//! `--key`, then the new communicator's count, rank and an all-reduce on it). A job op, type, reduction and count may each be
//! a comma-separated list: the probe runs every combination in turn, in the order given
//! (reductions only for the ops that reduce), on one communicator. Rank 0 writes the
//! unique id to `--id-file` (temporary name, then rename); the other ranks wait for it
//! (at most `--id-timeout` s). With `--threads`, this one process runs all `--world`
//! ranks, one thread each, as cudarc's own tests do.
//!
//! `--break` for the new collectives' rules: `root-out-of-range` (broadcast, reduce: root
//! = world), `overlap` (all-reduce, a broadcast's root, reduce: sendbuff one element past
//! recvbuff; all-gather, reduce-scatter: the in-place call with the other buffer at
//! offset 0, in place on rank 0 only; all-to-all: receiving into the blocks sent),
//! `recv-too-small` (all-gather), `send-too-small` (reduce-scatter): a buffer one element
//! short of the `world * count` the call uses.
//!
//! The communicator: by default through cudarc's raw API, as a program that polls NCCL
//! does: after queuing work it waits until `cuStreamQuery` says the stream is idle,
//! reading `ncclCommGetAsyncError` meanwhile (the double reports the ranks' disagreements
//! there); `--nonblocking` makes it with `ncclCommInitRankConfig` and `blocking = 0` and
//! polls `ncclCommGetAsyncError` after every call that says `ncclInProgress`. With
//! `--api safe`, through cudarc's safe `Comm` instead (`Comm::from_rank`, dropped with
//! `ncclCommAbort`), waiting with `stream.synchronize()`.
//!
//! Rank r's input element i is `r + 1 + i` (all-reduce, reduce, and reduce-scatter's
//! `world * count` elements), `100 * root + i` from a broadcast root, `r * count + i + 1`
//! for all-gather (so the gathered result is 1, 2, ... `world * count`), `(r * world + p)
//! * count + i + 1` in the block for peer p of an all-to-all, and `1000 * (r + 1) + i`
//! for ring and pairs. Receive buffers start as 99s ([`UNTOUCHED`]). An out-of-place
//! reduce's non-roots pass a NULL recvbuff on odd ranks (as cudarc's safe `reduce` with
//! `None`: `result=` is then empty) and a buffer of 99s on even ones, which must stay so;
//! in place, a non-root's buffer must keep its input. Buffers of count 0 are one element
//! long (the driver refuses 0-byte allocations), given as empty views. Prints one line
//! per result (`rank=R ... result=v,v,v`; the new collectives' lines also say `reduce=`,
//! `count=` and `root=` where they apply) on stdout; on failure, `error: rank R: ...` on
//! stderr (with NCCL's error string and `ncclGetLastError`) and exit code 1.
//!
//! The modules, by concern: [`args`] (the command line), [`ffi`] (failures, and the one
//! wrapper of cudarc's safe NCCL calls), [`values`] (element types, test values, result
//! lines), [`collectives`] (what is done with a communicator) through [`raw`] (cudarc's
//! raw API, with the one wrapper of its calls) or [`safe`] (its `Comm`), [`device`] (the
//! ops of one process), [`job`] (a rank of a job), [`ops`] (the job ops, one function per
//! family) and [`lifecycle`] (finalize, stuck work, aborts).

mod args;
mod collectives;
mod device;
mod ffi;
#[path = "../shared/id_file.rs"]
mod id_file;
mod job;
mod lifecycle;
mod ops;
mod raw;
mod safe;
mod values;

use args::parse_args;
use device::{devices, driver, info, present};
use ffi::Fail;
use job::{rank, shared_id, threads};
use lifecycle::{finalize, init_abort, split, watch};
use std::process::ExitCode;
use std::time::Instant;

/// Milliseconds since `t`.
fn ms(t: Instant) -> u128 {
    t.elapsed().as_millis()
}

/// Runs the op the command line names and prints its lines: exit 0; 1 on a failure (one
/// line naming the rank), 2 on a usage error, 3 if something panicked.
fn main() -> ExitCode {
    let a = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("usage error: {e}");
            return ExitCode::from(2);
        }
    };
    let result = std::panic::catch_unwind(|| match a.op.as_str() {
        "info" => info().map(|l| vec![l]),
        "devices" => devices(),
        "present" => Ok(vec![present()]),
        "driver" => driver(&a).map(|l| vec![l]),
        "raw" => shared_id(&a).and_then(|id| finalize(&a, id)),
        "watch" => shared_id(&a).and_then(|id| watch(&a, id)),
        "init-abort" => shared_id(&a).and_then(|id| init_abort(&a, id)),
        "split" => shared_id(&a).and_then(|id| split(&a, id)),
        _ if a.threads => threads(&a),
        _ => shared_id(&a).and_then(|id| rank(&a, a.rank, id)),
    });
    match result {
        Ok(Ok(lines)) => {
            for l in lines {
                println!("{l}");
            }
            ExitCode::SUCCESS
        }
        Ok(Err(Fail(why))) => {
            eprintln!("error: rank {}: {why}", a.rank);
            ExitCode::from(1)
        }
        Err(_) => {
            eprintln!("error: rank {}: panicked (see above)", a.rank);
            ExitCode::from(3)
        }
    }
}
