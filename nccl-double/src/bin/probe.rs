//! `nccl-double-probe`: a TEST FIXTURE of the `nccl-double` package, not a tool. It plays
//! one rank of an NCCL job through cudarc's safe API, exactly as a correct program would
//! (`CudaContext::new(device)` on the rank's thread, `default_stream`, `Comm::from_rank`,
//! `clone_htod`, `all_reduce`, `clone_dtoh`, ...), so that the tests in `tests/` can
//! prove that the test double works when loaded through cudarc's real dynamic-loading
//! path, and that it catches each rule when one rank breaks it on purpose (`--break`).
//!
//! ```text
//! nccl-double-probe --op OP [--rank R --world N --id-file PATH] [--device D]
//!     [--count C] [--dtype f32|f64|i32|i64|u32|u64|u8|i8] [--reduce sum|prod|max|min|avg]
//!     [--root R] [--repeat K] [--threads] [--break RULE]
//! ```
//!
//! Ops: `info`, `present`, `driver` (one process, no job); `allreduce`,
//! `allreduce-inplace`, `broadcast`, `broadcast-inplace` (every root in turn unless
//! `--root`), `ring` and `pairs` (send/recv inside a group). Rank 0 writes the unique id
//! to `--id-file` (temporary name, then rename); the other ranks wait for it (at most
//! `--id-timeout` s). With `--threads`, this one process runs all `--world` ranks, one
//! thread each, as cudarc's own tests do.
//!
//! Rank r's input element i is `r + 1 + i` (`100 * root + i` from a broadcast root, and
//! `1000 * (r + 1) + i` for send/recv). Prints one line per result
//! (`rank=R ... result=v,v,v`) on stdout; on failure, `error: rank R: ...` on stderr
//! (with NCCL's error string and `ncclGetLastError`) and exit code 1.

use cudarc::driver::{
    CudaContext, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, DriverError, ValidAsZeroBits,
};
use cudarc::nccl::result::NcclError;
use cudarc::nccl::{Comm, Id, NcclType, ReduceOp, group_end, group_start};
use std::ffi::{CStr, c_char};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the command line asked for.
#[derive(Clone, Debug)]
struct Args {
    op: String,
    rank: usize,
    world: usize,
    id_file: Option<PathBuf>,
    id_timeout: u64,
    device: Option<usize>,
    count: usize,
    dtype: String,
    reduce: String,
    root: Option<usize>,
    repeat: usize,
    threads: bool,
    brk: Option<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        op: "allreduce".into(),
        rank: 0,
        world: 1,
        id_file: None,
        id_timeout: 20,
        device: None,
        count: 4,
        dtype: "f32".into(),
        reduce: "sum".into(),
        root: None,
        repeat: 1,
        threads: false,
        brk: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--threads" {
            a.threads = true;
            continue;
        }
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let num = |v: &str| v.parse::<usize>().map_err(|_| format!("{flag} {v}: not a number"));
        match flag.as_str() {
            "--op" => a.op = value,
            "--rank" => a.rank = num(&value)?,
            "--world" => a.world = num(&value)?,
            "--id-file" => a.id_file = Some(value.into()),
            "--id-timeout" => a.id_timeout = num(&value)? as u64,
            "--device" => a.device = Some(num(&value)?),
            "--count" => a.count = num(&value)?,
            "--dtype" => a.dtype = value,
            "--reduce" => a.reduce = value,
            "--root" => a.root = Some(num(&value)?),
            "--repeat" => a.repeat = num(&value)?,
            "--break" => a.brk = Some(value),
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    Ok(a)
}

/// A failure, said as one line.
struct Fail(String);

impl From<DriverError> for Fail {
    fn from(e: DriverError) -> Self {
        Fail(format!("CUDA driver: {e:?}"))
    }
}

fn cuda(what: &str) -> impl FnOnce(DriverError) -> Fail + '_ {
    move |e| Fail(format!("{what} failed: {e:?}"))
}

/// NCCL's error with its name, NCCL's string for it and `ncclGetLastError`, read through
/// cudarc's `sys` bindings as the workbook does.
fn nccl(what: &str) -> impl FnOnce(NcclError) -> Fail + '_ {
    move |e| {
        let text = |p: *const c_char| {
            if p.is_null() {
                String::new()
            } else {
                // SAFETY: NCCL returns NUL-terminated strings that stay valid.
                unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
            }
        };
        // SAFETY: plain C calls; ncclGetLastError accepts a NULL communicator.
        let (s, last) = unsafe {
            (
                text(cudarc::nccl::sys::ncclGetErrorString(e.0)),
                text(cudarc::nccl::sys::ncclGetLastError(std::ptr::null_mut())),
            )
        };
        Fail(format!("{what} failed: {:?} ({s}): {last}", e.0))
    }
}

/// The element types the probe can run, with conversions for its test values.
trait Value: DeviceRepr + ValidAsZeroBits + NcclType + Copy + Send + Sync + 'static {
    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
}

macro_rules! value {
    ($($t:ty),*) => {$(
        impl Value for $t {
            fn from_f64(v: f64) -> Self { v as $t }
            fn to_f64(self) -> f64 { self as f64 }
        }
    )*};
}
value!(f32, f64, i32, i64, u32, u64, u8, i8);

/// The values as `a,b,c`; past 10 000 of them, only the first 16 and `...`.
fn show<T: Value>(v: &[T]) -> String {
    let shown = if v.len() > 10_000 { &v[..16] } else { v };
    let mut s = shown
        .iter()
        .map(|x| x.to_f64().to_string())
        .collect::<Vec<_>>()
        .join(",");
    if shown.len() < v.len() {
        s.push_str(",...");
    }
    s
}

fn reduce_op(name: &str) -> Result<ReduceOp, Fail> {
    Ok(match name {
        "sum" => ReduceOp::Sum,
        "prod" => ReduceOp::Prod,
        "max" => ReduceOp::Max,
        "min" => ReduceOp::Min,
        "avg" => ReduceOp::Avg,
        _ => return Err(Fail(format!("unknown reduction {name}"))),
    })
}

/// Rank 0 makes the id and writes it to the file; the others wait for the file.
fn shared_id(a: &Args) -> Result<Id, Fail> {
    let Some(path) = a.id_file.clone() else {
        if a.world == 1 {
            return Id::new().map_err(nccl("ncclGetUniqueId"));
        }
        return Err(Fail("--id-file is needed with --world > 1".into()));
    };
    if a.rank == 0 {
        let id = Id::new().map_err(nccl("ncclGetUniqueId"))?;
        let bytes: Vec<u8> = id.internal().iter().map(|c| *c as u8).collect();
        let tmp = path.with_file_name(format!(".{}.tmp", std::process::id()));
        std::fs::write(&tmp, &bytes)
            .and_then(|()| std::fs::rename(&tmp, &path))
            .map_err(|e| Fail(format!("writing the id to {}: {e}", path.display())))?;
        return Ok(id);
    }
    let deadline = Instant::now() + Duration::from_secs(a.id_timeout);
    loop {
        if let Ok(b) = std::fs::read(&path)
            && b.len() == 128
        {
            let mut internal = [0 as c_char; 128];
            for (i, x) in internal.iter_mut().zip(b) {
                *i = x as c_char;
            }
            return Ok(Id::uninit(internal));
        }
        if Instant::now() > deadline {
            return Err(Fail(format!("no id in {} after {} s", path.display(), a.id_timeout)));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

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
        "present" => Ok(vec![present()]),
        "driver" => driver(&a).map(|l| vec![l]),
        "raw" => shared_id(&a).and_then(|id| raw(&a, id)),
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

/// All ranks in this process, one thread each.
fn threads(a: &Args) -> Result<Vec<String>, Fail> {
    let id = Id::new().map_err(nccl("ncclGetUniqueId"))?;
    let handles: Vec<_> = (0..a.world)
        .map(|r| {
            let a = a.clone();
            std::thread::spawn(move || rank(&a, r, id))
        })
        .collect();
    let mut lines = Vec::new();
    for h in handles {
        lines.extend(h.join().map_err(|_| Fail("a rank's thread panicked".into()))??);
    }
    Ok(lines)
}

/// Device count, NCCL's version and every device's name.
fn info() -> Result<String, Fail> {
    let n = CudaContext::device_count().map_err(cuda("CudaContext::device_count"))?;
    let version = cudarc::nccl::result::get_nccl_version().map_err(nccl("ncclGetVersion"))?;
    let mut driver = 0;
    // SAFETY: a plain C call with a valid pointer.
    unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver) }
        .result()
        .map_err(cuda("cuDriverGetVersion"))?;
    let mut names = Vec::new();
    for d in 0..n as usize {
        names.push(CudaContext::new(d)?.name()?);
    }
    Ok(format!(
        "devices={n} nccl_version={version} driver_version={driver} names={}",
        names.join(";")
    ))
}

/// Whether cudarc finds a CUDA driver and an NCCL library to load.
fn present() -> String {
    // SAFETY: these only try to load the libraries.
    let (cuda, nccl) = unsafe {
        (
            cudarc::driver::sys::is_culib_present(),
            cudarc::nccl::sys::is_culib_present(),
        )
    };
    format!("cuda_present={cuda} nccl_present={nccl}")
}

/// The driver alone: a second stream, copies both ways, fresh memory, and two misuses.
fn driver(a: &Args) -> Result<String, Fail> {
    let ctx = CudaContext::new(a.device.unwrap_or(0))?;
    if a.brk.as_deref() == Some("free-without-context") {
        // With the default stream only, as the workbook uses cudarc (once a context has
        // other streams, cudarc binds it before a free, to wait for the buffer's events).
        let doomed = ctx.default_stream().clone_htod(&[1f32, 2.0, 3.0, 4.0])?;
        // Dropped on a thread where no context is current: the free fails quietly.
        std::thread::spawn(move || drop(doomed))
            .join()
            .map_err(|_| Fail("drop thread panicked".into()))?;
        ctx.name()
            .map_err(cuda("ctx.name() after a buffer was dropped on another thread"))?;
    }
    let stream = ctx.new_stream()?;
    let input: Vec<f32> = (0..a.count).map(|i| i as f32 + 0.5).collect();
    let mut dev = stream.alloc_zeros::<f32>(a.count)?;
    let zeros = stream.clone_dtoh(&dev)?;
    stream.memcpy_htod(&input, &mut dev)?;
    let mut back = vec![0f32; a.count];
    stream.memcpy_dtoh(&dev, &mut back)?;
    stream.synchronize()?;
    // SAFETY: read back only to show that fresh device memory is not zeroed.
    let fresh: CudaSlice<f32> = unsafe { stream.alloc(a.count) }?;
    let fresh = stream.clone_dtoh(&fresh)?;
    match a.brk.as_deref() {
        Some("dtoh-host-pointer") => {
            let host = vec![0f32; a.count];
            // SAFETY: on purpose: a host address where a device pointer belongs.
            let fake: CudaSlice<f32> = unsafe { stream.upgrade_device_ptr(host.as_ptr() as u64, a.count) };
            let r = stream.clone_dtoh(&fake);
            fake.leak();
            r.map_err(cuda("clone_dtoh from a host pointer"))?;
        }
        Some("free-without-context") | None => {}
        Some(other) => return Err(Fail(format!("--break {other} is not for --op driver"))),
    }
    Ok(format!(
        "zeros={} roundtrip={} fresh_is_nan={} name={}",
        show(&zeros),
        show(&back),
        fresh.iter().all(|x| x.is_nan()),
        ctx.name()?
    ))
}

/// One rank: context, stream, communicator, then the operation.
fn rank(a: &Args, rank: usize, id: Id) -> Result<Vec<String>, Fail> {
    let count = CudaContext::device_count().map_err(cuda("CudaContext::device_count"))? as usize;
    let device = a.device.unwrap_or(rank % count.max(1));
    let ctx = CudaContext::new(device).map_err(cuda("CudaContext::new"))?;
    let stream = ctx.default_stream();
    let brk = a.brk.as_deref().unwrap_or("");
    let (join_rank, join_world) = match brk {
        "rank-out-of-range" => (a.world, a.world),
        "world-mismatch" => (rank, a.world + 1),
        "same-rank" => (0, a.world),
        _ => (rank, a.world),
    };
    if brk == "no-context" {
        // The context was made on this thread; the communicator on another, where no
        // context is current.
        let s = stream.clone();
        return std::thread::spawn(move || {
            Comm::from_rank(s, join_rank, join_world, id)
                .map(drop)
                .map_err(nccl("Comm::from_rank"))
        })
        .join()
        .map_err(|_| Fail("thread panicked".into()))?
        .map(|()| vec!["unexpectedly joined".into()]);
    }
    let comm = Comm::from_rank(stream.clone(), join_rank, join_world, id).map_err(nccl("Comm::from_rank"))?;
    match brk {
        "crash" => std::process::exit(3),
        "exit-early" => return close(comm).map(|()| vec![format!("rank={rank} left early")]),
        _ => {}
    }
    let mut lines = Vec::new();
    let run = (|| -> Result<(), Fail> {
        for _ in 0..a.repeat {
            macro_rules! typed {
                ($t:ty) => {
                    op::<$t>(a, rank, device, &comm, &stream, &mut lines)
                };
            }
            match a.dtype.as_str() {
                "f32" => typed!(f32),
                "f64" => typed!(f64),
                "i32" => typed!(i32),
                "i64" => typed!(i64),
                "u32" => typed!(u32),
                "u64" => typed!(u64),
                "u8" => typed!(u8),
                "i8" => typed!(i8),
                t => Err(Fail(format!("unknown dtype {t}"))),
            }?;
        }
        Ok(())
    })();
    let closed = close(comm);
    run?;
    closed?;
    Ok(lines)
}

/// cudarc's raw API, for what its safe `Comm` cannot do: finalize and then destroy the
/// communicator (the safe `Comm` only aborts it when dropped). Then two misuses: a
/// collective on the finalized communicator, and an abort of the destroyed one.
fn raw(a: &Args, id: Id) -> Result<Vec<String>, Fail> {
    use cudarc::nccl::{result, sys};
    let n = CudaContext::device_count()? as usize;
    let ctx = CudaContext::new(a.device.unwrap_or(a.rank % n))?;
    let stream = ctx.default_stream();
    let sys_id = sys::ncclUniqueId {
        internal: *id.internal(),
    };
    let mut comm = std::mem::MaybeUninit::uninit();
    // SAFETY: cudarc's thin wrappers, used as NCCL's documentation says.
    let comm = unsafe {
        result::comm_init_rank(comm.as_mut_ptr(), a.world as i32, sys_id, a.rank as i32)
            .map_err(nccl("ncclCommInitRank"))?;
        comm.assume_init()
    };
    let mut buf = stream.clone_htod(&vec![(a.rank + 1) as f32; a.count])?;
    let all_reduce = |buf: &mut CudaSlice<f32>| {
        let (ptr, _record) = buf.device_ptr_mut(&stream);
        // SAFETY: an in-place all-reduce of a live device buffer.
        unsafe {
            result::all_reduce(
                ptr as _,
                ptr as _,
                a.count,
                sys::ncclDataType_t::ncclFloat32,
                sys::ncclRedOp_t::ncclSum,
                comm,
                stream.cu_stream() as _,
            )
        }
    };
    all_reduce(&mut buf).map_err(nccl("ncclAllReduce"))?;
    let out = stream.clone_dtoh(&buf)?;
    let status = |r: Result<result::NcclStatus, NcclError>| r.map_or_else(|e| format!("{:?}", e.0), |_| "ok".into());
    // SAFETY: the communicator is live until destroyed, and not used after (but for the
    // abort, which the double refuses).
    unsafe { result::comm_finalize(comm) }.map_err(nccl("ncclCommFinalize"))?;
    let after_finalize = status(all_reduce(&mut buf));
    unsafe { result::comm_destroy(comm) }.map_err(nccl("ncclCommDestroy"))?;
    let abort_after_destroy = status(unsafe { result::comm_abort(comm) });
    Ok(vec![format!(
        "rank={} op=raw result={} after_finalize={after_finalize} abort_after_destroy={abort_after_destroy}",
        a.rank,
        show(&out)
    )])
}

/// Drops the communicator (cudarc's Drop calls ncclCommAbort and panics if it fails).
fn close(comm: Comm) -> Result<(), Fail> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(comm)))
        .map_err(|_| Fail("dropping the Comm panicked (ncclCommAbort failed)".into()))
}

/// Right before a collective (cudarc binds the context again for every copy): leaves no
/// context current (`no-context-use`) or another device's (`wrong-context-use`).
fn misuse_context(brk: &str, device: usize) -> Result<Option<Arc<CudaContext>>, Fail> {
    match brk {
        "no-context-use" => {
            // SAFETY: unbinding the context, on purpose.
            unsafe { cudarc::driver::result::ctx::set_current(std::ptr::null_mut()) }?;
            Ok(None)
        }
        // Making another device's context makes it current on this thread.
        "wrong-context-use" => {
            let n = CudaContext::device_count()? as usize;
            Ok(Some(CudaContext::new((device + 1) % n)?))
        }
        _ => Ok(None),
    }
}

/// Runs the operation once for element type `T`.
fn op<T: Value>(
    a: &Args,
    rank: usize,
    device: usize,
    comm: &Comm,
    stream: &Arc<CudaStream>,
    lines: &mut Vec<String>,
) -> Result<(), Fail> {
    let brk = a.brk.as_deref().unwrap_or("");
    let world = a.world;
    let values = |f: &dyn Fn(usize) -> f64, n: usize| -> Vec<T> { (0..n).map(|i| T::from_f64(f(i))).collect() };
    let head = format!("rank={rank} device={device} op={} dtype={}", a.op, a.dtype);
    match a.op.as_str() {
        "allreduce" | "allreduce-inplace" => {
            let mut count = a.count;
            let mut red = a.reduce.as_str();
            match brk {
                "mismatch-count" => count += 1,
                "mismatch-op" => red = if red == "max" { "min" } else { "max" },
                "mismatch-kind" => {
                    let mut buf = stream.clone_htod(&values(&|i| i as f64, count))?;
                    comm.broadcast_in_place(&mut buf, 0)
                        .map_err(nccl("broadcast_in_place"))?;
                    return Ok(());
                }
                "mismatch-dtype" => {
                    let send = stream.clone_htod(&vec![1f64; count])?;
                    let mut recv = stream.alloc_zeros::<f64>(count)?;
                    comm.all_reduce(&send, &mut recv, &reduce_op(red)?)
                        .map_err(nccl("all_reduce"))?;
                    return Ok(());
                }
                _ => {}
            }
            let input = values(&|i| (rank + 1 + i) as f64, count);
            let op = reduce_op(red)?;
            let out = if a.op == "allreduce-inplace" {
                let mut buf = stream.clone_htod(&input)?;
                let _other = misuse_context(brk, device)?;
                comm.all_reduce_in_place(&mut buf, &op)
                    .map_err(nccl("all_reduce_in_place"))?;
                stream.clone_dtoh(&buf)?
            } else {
                let send = match brk {
                    "host-buffer" => {
                        // SAFETY: on purpose: host memory posing as device memory.
                        unsafe { stream.upgrade_device_ptr::<T>(input.as_ptr() as u64, count) }
                    }
                    "freed-buffer" => {
                        let gone = stream.clone_htod(&input)?;
                        let (ptr, rec) = gone.device_ptr(stream);
                        drop(rec);
                        drop(gone);
                        // SAFETY: on purpose: memory that was just freed.
                        unsafe { stream.upgrade_device_ptr::<T>(ptr, count) }
                    }
                    "count-too-large" => {
                        let short = stream.clone_htod(&input[..count - 1])?;
                        // SAFETY: on purpose: one element more than was allocated.
                        unsafe { stream.upgrade_device_ptr::<T>(short.leak(), count) }
                    }
                    "other-device-buffer" => {
                        let other = CudaContext::new((device + 1) % CudaContext::device_count()? as usize)?;
                        let there = other.default_stream().clone_htod(&input)?;
                        comm.context().bind_to_thread()?;
                        let mut recv = stream.alloc_zeros::<T>(count)?;
                        comm.all_reduce(&there, &mut recv, &op).map_err(nccl("all_reduce"))?;
                        return Ok(());
                    }
                    _ => stream.clone_htod(&input)?,
                };
                let mut recv = stream.alloc_zeros::<T>(count)?;
                let _other = misuse_context(brk, device)?;
                let r = comm.all_reduce(&send, &mut recv, &op);
                if matches!(brk, "host-buffer" | "freed-buffer" | "count-too-large") {
                    send.leak();
                }
                r.map_err(nccl("all_reduce"))?;
                stream.clone_dtoh(&recv)?
            };
            lines.push(format!("{head} reduce={red} result={}", show(&out)));
        }
        "broadcast" | "broadcast-inplace" => {
            let roots: Vec<usize> = a.root.map_or_else(|| (0..world).collect(), |r| vec![r]);
            for root in roots {
                let mut count = a.count;
                let mut root_arg = root as i32;
                match brk {
                    "mismatch-root" => root_arg = ((root + 1) % world) as i32,
                    "mismatch-count" => count += 1,
                    _ => {}
                }
                let data = values(&|i| (100 * root + i) as f64, count);
                let out = if a.op == "broadcast-inplace" {
                    let mut buf = if rank == root {
                        stream.clone_htod(&data)?
                    } else {
                        stream.alloc_zeros::<T>(count)?
                    };
                    let _other = misuse_context(brk, device)?;
                    comm.broadcast_in_place(&mut buf, root_arg)
                        .map_err(nccl("broadcast_in_place"))?;
                    stream.clone_dtoh(&buf)?
                } else {
                    let send = if rank == root {
                        Some(stream.clone_htod(&data)?)
                    } else {
                        None
                    };
                    let mut recv = stream.alloc_zeros::<T>(count)?;
                    let _other = misuse_context(brk, device)?;
                    comm.broadcast(send.as_ref(), &mut recv, root_arg)
                        .map_err(nccl("broadcast"))?;
                    stream.clone_dtoh(&recv)?
                };
                lines.push(format!("{head} root={root} result={}", show(&out)));
            }
        }
        "ring" | "pairs" => {
            let (to, from) = if a.op == "ring" {
                ((rank + 1) % world, (rank + world - 1) % world)
            } else {
                (rank ^ 1, rank ^ 1)
            };
            let send = stream.clone_htod(&values(&|i| (1000 * (rank + 1) + i) as f64, a.count))?;
            let recv_count = if brk == "recv-size" { a.count + 1 } else { a.count };
            let mut recv = stream.alloc_zeros::<T>(recv_count)?;
            group_start().map_err(nccl("ncclGroupStart"))?;
            comm.send(&send, to as i32).map_err(nccl("send"))?;
            comm.recv(&mut recv, from as i32).map_err(nccl("recv"))?;
            group_end().map_err(nccl("ncclGroupEnd"))?;
            let out = stream.clone_dtoh(&recv)?;
            lines.push(format!("{head} from={from} result={}", show(&out)));
        }
        other => return Err(Fail(format!("unknown op {other}"))),
    }
    Ok(())
}
