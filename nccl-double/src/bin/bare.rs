//! `nccl-double-bare`: a TEST FIXTURE (a yardstick, not a tool). One rank of a job that
//! times a bare loop of NCCL all-reduces as nccl-tests times it, with nothing around the
//! calls: a blocking communicator (nccl-tests' default), `--warmup` calls and a wait, then
//! `--iters` calls back to back and one wait (`cuStreamQuery` and
//! `ncclCommGetAsyncError` until the stream is idle). With `--nonblocking`, the
//! communicator is non-blocking, and every call that says `ncclInProgress` is polled to
//! `ncclSuccess` before the next, as NCCL 2.23 and later require (`--no-poll` breaks that
//! rule on purpose: the double then refuses the next call, as NCCL does).
//!
//! ```text
//! nccl-double-bare --rank R --world N --id-file PATH [--bytes B] [--iters K] [--warmup W] [--nonblocking [--no-poll]]
//! ```
//!
//! Prints `rank=R bytes=B iters=K issue_us=X time_us=Y`: per call, the host's time to
//! issue it (nccl-tests' cputime) and the time until all had finished.
//! `bench/nccl-overhead.sh` sets it beside `07-nccl-perf` on the double, to measure what
//! the workbook's harness adds to each call.

use cudarc::driver::sys::{self as cu, cudaError_enum as Cu};
use cudarc::driver::{CudaContext, DevicePtr, DevicePtrMut};
use cudarc::nccl::sys::{self, ncclResult_t as R};
use std::ffi::c_char;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[path = "shared/id_file.rs"]
mod id_file;

fn main() -> ExitCode {
    match run() {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

/// `--name value` from the command line, parsed.
fn arg<T: std::str::FromStr>(name: &str, default: Option<T>) -> Result<T, String> {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == name) {
        Some(i) => args
            .get(i + 1)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("{name} needs a value")),
        None => default.ok_or_else(|| format!("{name} is needed")),
    }
}

fn check(r: R, what: &str) -> Result<R, String> {
    match r {
        R::ncclSuccess | R::ncclInProgress => Ok(r),
        e => Err(format!("{what}: {e:?}")),
    }
}

fn run() -> Result<String, String> {
    let (rank, world): (usize, usize) = (arg("--rank", Some(0))?, arg("--world", Some(1))?);
    let (bytes, iters, warmup): (usize, u32, u32) = (
        arg("--bytes", Some(8))?,
        arg("--iters", Some(1000))?,
        arg("--warmup", Some(5))?,
    );
    let id_path: String = arg("--id-file", None)?;
    let nonblocking = std::env::args().any(|a| a == "--nonblocking");
    let poll = !std::env::args().any(|a| a == "--no-poll");

    let ctx = CudaContext::new(0).map_err(|e| format!("{e:?}"))?;
    ctx.bind_to_thread().map_err(|e| format!("{e:?}"))?;
    let stream = ctx.default_stream();
    let make = || {
        let id = cudarc::nccl::result::get_uniqueid().map_err(|e| format!("ncclGetUniqueId: {e:?}"))?;
        Ok(id.internal.map(|c| c as u8))
    };
    let id = id_file::share(Path::new(&id_path), rank, Duration::from_secs(20), make)?;
    let id = sys::ncclUniqueId {
        internal: id.map(|b| b as c_char),
    };
    // SAFETY: plain data; the fields through splitShare are set, 44 bytes given.
    let mut config: sys::ncclConfig_t = unsafe { std::mem::zeroed() };
    config.size = std::mem::offset_of!(sys::ncclConfig_t, splitShare) + 4;
    config.magic = 0xcafe_beef;
    config.version = 21700;
    config.blocking = i32::from(!nonblocking);
    (config.cgaClusterSize, config.minCTAs, config.maxCTAs, config.splitShare) =
        (i32::MIN, i32::MIN, i32::MIN, i32::MIN);
    let mut comm = std::ptr::null_mut();
    // SAFETY: valid out-pointer and config; the id by value.
    let r = unsafe { sys::ncclCommInitRankConfig(&mut comm, world as i32, id, rank as i32, &mut config) };
    check(r, "ncclCommInitRankConfig")?;
    let ready = |comm| -> Result<(), String> {
        loop {
            let mut state = R::ncclSuccess;
            // SAFETY: a live communicator and a place for the answer.
            check(
                unsafe { sys::ncclCommGetAsyncError(comm, &mut state) },
                "ncclCommGetAsyncError",
            )?;
            match check(state, "the communicator")? {
                R::ncclSuccess => return Ok(()),
                _ => std::thread::yield_now(),
            }
        }
    };
    ready(comm)?;

    let count = bytes.div_ceil(4).max(1);
    let send = stream.clone_htod(&vec![1f32; count]).map_err(|e| format!("{e:?}"))?;
    let mut recv = stream.alloc_zeros::<f32>(count).map_err(|e| format!("{e:?}"))?;
    let (s, _r) = send.device_ptr(&stream);
    let (d, _w) = recv.device_ptr_mut(&stream);
    let cu_stream = stream.cu_stream();
    let call = || -> Result<(), String> {
        // SAFETY: device buffers of `count` floats of this context, on its stream.
        let r = unsafe {
            sys::ncclAllReduce(
                s as _,
                d as _,
                count,
                sys::ncclDataType_t::ncclFloat32,
                sys::ncclRedOp_t::ncclSum,
                comm,
                cu_stream as _,
            )
        };
        if check(r, "ncclAllReduce")? == R::ncclInProgress && poll {
            ready(comm)?;
        }
        Ok(())
    };
    // nccl-tests' testStreamSynchronize: the stream, and NCCL's errors, polled.
    let wait = || -> Result<(), String> {
        loop {
            // SAFETY: this context's stream, current on this thread.
            match unsafe { cu::cuStreamQuery(cu_stream) } {
                Cu::CUDA_SUCCESS => return Ok(()),
                Cu::CUDA_ERROR_NOT_READY => {}
                e => return Err(format!("cuStreamQuery: {e:?}")),
            }
            let mut state = R::ncclSuccess;
            // SAFETY: a live communicator and a place for the answer.
            check(
                unsafe { sys::ncclCommGetAsyncError(comm, &mut state) },
                "ncclCommGetAsyncError",
            )?;
            check(state, "NCCL")?;
            std::thread::yield_now();
        }
    };
    for _ in 0..warmup {
        call()?;
    }
    wait()?;
    let start = Instant::now();
    for _ in 0..iters {
        call()?;
    }
    let issued = start.elapsed();
    wait()?;
    let total = start.elapsed();
    // SAFETY: everything finished; not used after.
    unsafe {
        check(sys::ncclCommFinalize(comm), "ncclCommFinalize")?;
        ready(comm)?;
        check(sys::ncclCommDestroy(comm), "ncclCommDestroy")?;
    }
    let per = |t: Duration| t.as_secs_f64() * 1e6 / f64::from(iters.max(1));
    Ok(format!(
        "rank={rank} bytes={} iters={iters} issue_us={:.2} time_us={:.2}",
        count * 4,
        per(issued),
        per(total)
    ))
}
