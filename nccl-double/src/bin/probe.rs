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
//! ```
//!
//! Types: `f32`, `f64`, `i32`, `i64`, `u32`, `u64`, `u8`, `i8`, and `f16`, `bf16` (2-byte
//! types the probe defines itself, with its own conversions: cudarc has them only with
//! its `f16` feature). Reductions: `sum`, `prod`, `max`, `min`, `avg`.
//!
//! Ops: `info`, `devices`, `present`, `driver` (one process, no job); `allreduce`,
//! `allreduce-inplace`, `broadcast`, `broadcast-inplace`, `reduce`, `reduce-inplace`
//! (the rooted ones: every root in turn unless `--root`), `allgather`,
//! `allgather-inplace`, `reducescatter`, `reducescatter-inplace` (count: NCCL's
//! sendcount, recvcount), `alltoall` (as nccl-tests: one group with a send and a recv
//! of `count` elements to and from every rank, itself included), `ring` and `pairs`
//! (send/recv inside a group); `raw` (finalize, then destroy); `watch` (a collective
//! whose peer may never come: watch the stream, then abort); `init-abort` (abort a
//! non-blocking init that cannot finish). A job op, type, reduction and count may each be
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

use cudarc::driver::sys as cu;
use cudarc::driver::{
    CudaContext, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, DriverError, ValidAsZeroBits,
};
use cudarc::nccl::result::{NcclError, NcclStatus};
use cudarc::nccl::{Comm, Id, NcclType, ReduceOp, result, sys};
use std::cell::Cell;
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
    /// Every count of `--count` (`count` is the one being run).
    counts: Vec<usize>,
    dtype: String,
    reduce: String,
    root: Option<usize>,
    repeat: usize,
    threads: bool,
    /// `raw` (cudarc's raw API, polling) or `safe` (cudarc's `Comm`).
    api: String,
    nonblocking: bool,
    /// Sleep before joining (holds a rank back).
    delay_ms: u64,
    /// Sleep before the first collective.
    op_delay_ms: u64,
    /// How long `watch` watches the stream.
    watch_ms: u64,
    /// How long `init-abort` waits before aborting.
    abort_after_ms: u64,
    /// Written once the communicator is made (for `--break hang`).
    ready_file: Option<PathBuf>,
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
        counts: vec![4],
        dtype: "f32".into(),
        reduce: "sum".into(),
        root: None,
        repeat: 1,
        threads: false,
        api: "raw".into(),
        nonblocking: false,
        delay_ms: 0,
        op_delay_ms: 0,
        watch_ms: 1500,
        abort_after_ms: 500,
        ready_file: None,
        brk: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--threads" => {
                a.threads = true;
                continue;
            }
            "--nonblocking" => {
                a.nonblocking = true;
                continue;
            }
            _ => {}
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
            "--count" => {
                a.counts = value.split(',').map(num).collect::<Result<_, _>>()?;
                a.count = a.counts[0];
            }
            "--dtype" => a.dtype = value,
            "--reduce" => a.reduce = value,
            "--root" => a.root = Some(num(&value)?),
            "--repeat" => a.repeat = num(&value)?,
            "--api" if value == "raw" || value == "safe" => a.api = value,
            "--delay-ms" => a.delay_ms = num(&value)? as u64,
            "--op-delay-ms" => a.op_delay_ms = num(&value)? as u64,
            "--watch-ms" => a.watch_ms = num(&value)? as u64,
            "--abort-after-ms" => a.abort_after_ms = num(&value)? as u64,
            "--ready-file" => a.ready_file = Some(value.into()),
            "--break" => a.brk = Some(value),
            _ => return Err(format!("unknown flag {flag} (or value {value})")),
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
                text(sys::ncclGetErrorString(e.0)),
                text(sys::ncclGetLastError(std::ptr::null_mut())),
            )
        };
        Fail(format!("{what} failed: {:?} ({s}): {last}", e.0))
    }
}

/// How an NCCL call ended, by name (`ncclSuccess`, `ncclInProgress`, `ncclInvalidUsage`...).
fn status(r: Result<NcclStatus, NcclError>) -> String {
    match r {
        Ok(NcclStatus::Success) => "ncclSuccess".into(),
        Ok(NcclStatus::InProgress) => "ncclInProgress".into(),
        Ok(NcclStatus::NumResults) => "ncclNumResults".into(),
        Err(e) => format!("{:?}", e.0),
    }
}

/// Milliseconds since `t`.
fn ms(t: Instant) -> u128 {
    t.elapsed().as_millis()
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

/// `ncclFloat16` (IEEE binary16), as its bits: cudarc knows `half::f16` only with its
/// `f16` feature, which the workspace does not enable. The conversions are the probe's
/// own, in f64 arithmetic, independent of the double's.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[repr(transparent)]
struct F16(u16);

/// `ncclBfloat16` (the top half of a float32), as its bits.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[repr(transparent)]
struct Bf16(u16);

// SAFETY: plain 2-byte values, valid for every bit pattern (zero included).
unsafe impl DeviceRepr for F16 {}
unsafe impl ValidAsZeroBits for F16 {}
unsafe impl DeviceRepr for Bf16 {}
unsafe impl ValidAsZeroBits for Bf16 {}

impl NcclType for F16 {
    fn as_nccl_type() -> sys::ncclDataType_t {
        sys::ncclDataType_t::ncclFloat16
    }
}

impl NcclType for Bf16 {
    /// NCCL's `ncclBfloat16` is 9. cudarc's nccl-02024 bindings name it; its nccl-02022
    /// ones do not (NCCL's header declares it only where CUDA's bf16 type exists), where 9
    /// is `ncclNumTypes`. The number works with both.
    fn as_nccl_type() -> sys::ncclDataType_t {
        // SAFETY: 9 is a variant of the enum in each of cudarc 0.19's NCCL bindings
        // (ncclBfloat16, or ncclNumTypes where bfloat16 is missing).
        unsafe { std::mem::transmute::<u32, sys::ncclDataType_t>(9) }
    }
}

impl Value for F16 {
    fn from_f64(v: f64) -> Self {
        F16(encode_float(v, 10, 5))
    }
    fn to_f64(self) -> f64 {
        decode_float(self.0, 10, 5)
    }
}

impl Value for Bf16 {
    fn from_f64(v: f64) -> Self {
        Bf16(encode_float(v, 7, 8))
    }
    fn to_f64(self) -> f64 {
        decode_float(self.0, 7, 8)
    }
}

/// `v` as the bits of a 16-bit IEEE-style float with `m` mantissa bits and `e` exponent
/// bits, rounded to nearest, ties to even (too large: infinity).
fn encode_float(v: f64, m: u32, e: u32) -> u16 {
    let bias = (1i32 << (e - 1)) - 1;
    let inf = ((1u32 << e) - 1) << m;
    let sign = if v.is_sign_negative() { 1u32 << (m + e) } else { 0 };
    if v.is_nan() {
        return (inf | 1 << (m - 1)) as u16;
    }
    let a = v.abs();
    let min_normal = 2f64.powi(1 - bias);
    let bits = if a < min_normal {
        // Subnormal: units of the smallest one (rounding up to min_normal gives its bits).
        (a / 2f64.powi(1 - bias - m as i32)).round_ties_even() as u32
    } else if a.is_infinite() {
        inf
    } else {
        let mut x = a.log2().floor() as i32;
        while 2f64.powi(x) > a {
            x -= 1;
        }
        while 2f64.powi(x + 1) <= a {
            x += 1;
        }
        let mut sig = (a / 2f64.powi(x) * 2f64.powi(m as i32)).round_ties_even() as u32;
        if sig == 2 << m {
            (x, sig) = (x + 1, 1 << m);
        }
        if x > bias {
            inf
        } else {
            (((x + bias) as u32) << m) | (sig - (1 << m))
        }
    };
    (sign | bits) as u16
}

/// The value of the bits [`encode_float`] makes.
fn decode_float(b: u16, m: u32, e: u32) -> f64 {
    let bias = (1i32 << (e - 1)) - 1;
    let sign = if (b >> (m + e)) & 1 == 1 { -1.0 } else { 1.0 };
    let ex = (u32::from(b) >> m) & ((1 << e) - 1);
    let man = u32::from(b) & ((1 << m) - 1);
    let magnitude = if ex == 0 {
        f64::from(man) * 2f64.powi(1 - bias - m as i32)
    } else if ex == (1 << e) - 1 {
        if man == 0 { f64::INFINITY } else { f64::NAN }
    } else {
        f64::from(man + (1 << m)) * 2f64.powi(ex as i32 - bias - m as i32)
    };
    sign * magnitude
}

/// What receive buffers hold before a collective: a result never written keeps it.
const UNTOUCHED: f64 = 99.0;

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

/// cudarc's safe reduction as the raw API's.
fn raw_op(op: &ReduceOp) -> sys::ncclRedOp_t {
    match op {
        ReduceOp::Sum => sys::ncclRedOp_t::ncclSum,
        ReduceOp::Prod => sys::ncclRedOp_t::ncclProd,
        ReduceOp::Max => sys::ncclRedOp_t::ncclMax,
        ReduceOp::Min => sys::ncclRedOp_t::ncclMin,
        ReduceOp::Avg => sys::ncclRedOp_t::ncclAvg,
    }
}

#[path = "shared/id_file.rs"]
mod id_file;

/// Rank 0 makes the id and writes it to the file; the others wait for the file.
fn shared_id(a: &Args) -> Result<Id, Fail> {
    let Some(path) = a.id_file.clone() else {
        if a.world == 1 {
            return Id::new().map_err(nccl("ncclGetUniqueId"));
        }
        return Err(Fail("--id-file is needed with --world > 1".into()));
    };
    let make = || {
        let id = Id::new().map_err(|e| format!("ncclGetUniqueId: {e:?}"))?;
        Ok(id.internal().map(|c| c as u8))
    };
    let bytes = id_file::share(&path, a.rank, Duration::from_secs(a.id_timeout), make).map_err(Fail)?;
    Ok(Id::uninit(bytes.map(|b| b as c_char)))
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
        "devices" => devices(),
        "present" => Ok(vec![present()]),
        "driver" => driver(&a).map(|l| vec![l]),
        "raw" => shared_id(&a).and_then(|id| finalize(&a, id)),
        "watch" => shared_id(&a).and_then(|id| watch(&a, id)),
        "init-abort" => shared_id(&a).and_then(|id| init_abort(&a, id)),
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
    let version = result::get_nccl_version().map_err(nccl("ncclGetVersion"))?;
    let mut driver = 0;
    // SAFETY: a plain C call with a valid pointer.
    unsafe { cu::cuDriverGetVersion(&mut driver) }
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

/// The devices as the driver shows them: what cuInit says, what cuDeviceGetCount says
/// then, and each device's bus id, UUID (both entry points) and name; also that a bus id
/// buffer one byte too short is refused.
fn devices() -> Result<Vec<String>, Fail> {
    // SAFETY: plain C calls with valid pointers.
    let init = unsafe { cu::cuInit(0) };
    let mut n = 0;
    let counted = unsafe { cu::cuDeviceGetCount(&mut n) };
    let count = if counted == cu::CUresult::CUDA_SUCCESS {
        n.to_string()
    } else {
        format!("{counted:?}")
    };
    let mut lines = vec![format!("init={init:?} count={count}")];
    if init != cu::CUresult::CUDA_SUCCESS {
        return Ok(lines);
    }
    for i in 0..n {
        let dev = cudarc::driver::result::device::get(i)?;
        let name = cudarc::driver::result::device::get_name(dev)?;
        let mut bus = [0 as c_char; 32];
        // SAFETY: the buffer holds the length given.
        unsafe { cu::cuDeviceGetPCIBusId(bus.as_mut_ptr(), bus.len() as i32, dev) }
            .result()
            .map_err(cuda("cuDeviceGetPCIBusId"))?;
        // SAFETY: NUL-terminated by the driver.
        let bus = unsafe { CStr::from_ptr(bus.as_ptr()) }.to_string_lossy().into_owned();
        let mut short = [0 as c_char; 32];
        // SAFETY: as above, with a length one short of the id and its NUL.
        let short = unsafe { cu::cuDeviceGetPCIBusId(short.as_mut_ptr(), bus.len() as i32, dev) };
        let uuid = cudarc::driver::result::device::get_uuid(dev)?;
        let mut v2 = std::mem::MaybeUninit::<cu::CUuuid>::uninit();
        // SAFETY: a plain C call with a valid pointer.
        unsafe { cu::cuDeviceGetUuid_v2(v2.as_mut_ptr(), dev) }
            .result()
            .map_err(cuda("cuDeviceGetUuid_v2"))?;
        // SAFETY: written by the successful call.
        let v2 = unsafe { v2.assume_init() };
        let hex: String = uuid.bytes.iter().map(|b| format!("{:02x}", *b as u8)).collect();
        let text = format!(
            "GPU-{}-{}-{}-{}-{}",
            &hex[..8],
            &hex[8..12],
            &hex[12..16],
            &hex[16..20],
            &hex[20..]
        );
        lines.push(format!(
            "device={i} bus={bus} uuid={text} uuid_v2_same={} short_bus_buffer={short:?} name={name}",
            v2.bytes == uuid.bytes
        ));
    }
    Ok(lines)
}

/// Whether cudarc finds a CUDA driver and an NCCL library to load.
fn present() -> String {
    // SAFETY: these only try to load the libraries.
    let (cuda, nccl) = unsafe { (cu::is_culib_present(), sys::is_culib_present()) };
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

// ---------------------------------------------------------------------------------
// The communicator, two ways.

/// What the probe does with a communicator, whichever API it goes through. Every method
/// queues the work; [`Collectives::settle`] waits until it is done (or failed).
trait Collectives {
    fn all_reduce<T: Value>(&self, send: &CudaSlice<T>, recv: &mut CudaSlice<T>, op: &ReduceOp) -> Result<(), Fail>;
    fn all_reduce_in_place<T: Value>(&self, buf: &mut CudaSlice<T>, op: &ReduceOp) -> Result<(), Fail>;
    fn broadcast<T: Value>(&self, send: Option<&CudaSlice<T>>, recv: &mut CudaSlice<T>, root: i32) -> Result<(), Fail>;
    fn broadcast_in_place<T: Value>(&self, buf: &mut CudaSlice<T>, root: i32) -> Result<(), Fail>;
    /// `ncclReduce`; `recv` `None` passes a NULL recvbuff (fine on a non-root).
    fn reduce<T: Value, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &self,
        send: &S,
        recv: Option<&mut R>,
        op: &ReduceOp,
        root: i32,
    ) -> Result<(), Fail>;
    fn reduce_in_place<T: Value, R: DevicePtrMut<T>>(&self, buf: &mut R, op: &ReduceOp, root: i32) -> Result<(), Fail>;
    /// `ncclAllGather` with sendcount `send.len()`.
    fn all_gather<T: Value, S: DevicePtr<T>, R: DevicePtrMut<T>>(&self, send: &S, recv: &mut R) -> Result<(), Fail>;
    /// `ncclAllGather` of `count` elements from `buf + at` into `buf` (in place when `at`
    /// is `rank * count`).
    fn all_gather_in_place<T: Value, R: DevicePtrMut<T>>(
        &self,
        buf: &mut R,
        at: usize,
        count: usize,
    ) -> Result<(), Fail>;
    /// `ncclReduceScatter` with recvcount `recv.len()`.
    fn reduce_scatter<T: Value, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &self,
        send: &S,
        recv: &mut R,
        op: &ReduceOp,
    ) -> Result<(), Fail>;
    /// `ncclReduceScatter` of `buf` into `count` elements at `buf + at` (in place when
    /// `at` is `rank * count`).
    fn reduce_scatter_in_place<T: Value, R: DevicePtrMut<T>>(
        &self,
        buf: &mut R,
        at: usize,
        count: usize,
        op: &ReduceOp,
    ) -> Result<(), Fail>;
    fn send<T: Value, S: DevicePtr<T>>(&self, buf: &S, peer: i32) -> Result<(), Fail>;
    fn recv<T: Value, R: DevicePtrMut<T>>(&self, buf: &mut R, peer: i32) -> Result<(), Fail>;
    fn group_start(&self) -> Result<(), Fail> {
        result::group_start().map(drop).map_err(nccl("ncclGroupStart"))
    }
    fn group_end(&self) -> Result<(), Fail>;
    /// Waits until the queued work is done; an error NCCL found meanwhile is a failure.
    fn settle(&self, what: &str) -> Result<(), Fail>;
}

/// A communicator through cudarc's raw API, as a program that polls NCCL uses it: ended
/// with `ncclCommAbort` when dropped, unless ended before.
struct Raw {
    comm: Cell<sys::ncclComm_t>,
    stream: Arc<CudaStream>,
    nonblocking: bool,
}

impl Raw {
    /// Calls the init (`ncclCommInitRankConfig` with `blocking = 0` if `nonblocking`,
    /// else `ncclCommInitRank`) and returns as soon as it does.
    fn start(stream: &Arc<CudaStream>, rank: usize, world: usize, id: Id, nonblocking: bool) -> Result<Self, Fail> {
        let id = sys::ncclUniqueId {
            internal: *id.internal(),
        };
        let mut comm = std::ptr::null_mut();
        if nonblocking {
            // NCCL_CONFIG_INITIALIZER, then blocking = 0.
            let version = result::get_nccl_version().map_err(nccl("ncclGetVersion"))?;
            let mut config = sys::ncclConfig_t {
                size: std::mem::size_of::<sys::ncclConfig_t>(),
                magic: 0xcafe_beef,
                version: version as u32,
                blocking: 0,
                cgaClusterSize: i32::MIN,
                minCTAs: i32::MIN,
                maxCTAs: i32::MIN,
                netName: std::ptr::null(),
                splitShare: i32::MIN,
            };
            // SAFETY: valid pointers; the id by value.
            unsafe { result::comm_init_rank_config(&mut comm, world as i32, id, rank as i32, &mut config) }
                .map_err(nccl("ncclCommInitRankConfig"))?;
        } else {
            // SAFETY: as above.
            unsafe { result::comm_init_rank(&mut comm, world as i32, id, rank as i32) }
                .map_err(nccl("ncclCommInitRank"))?;
        }
        Ok(Self {
            comm: Cell::new(comm),
            stream: stream.clone(),
            nonblocking,
        })
    }

    /// [`Raw::start`], then (non-blocking) polls until the init is over; with the report
    /// line of a non-blocking init (how often it was still in progress, and how long).
    fn join(
        stream: &Arc<CudaStream>,
        rank: usize,
        world: usize,
        id: Id,
        nonblocking: bool,
    ) -> Result<(Self, Vec<String>), Fail> {
        let t = Instant::now();
        let comm = Self::start(stream, rank, world, id, nonblocking)?;
        if !nonblocking {
            return Ok((comm, Vec::new()));
        }
        let polls = comm.wait_ready("ncclCommInitRankConfig")?;
        let line = format!(
            "rank={rank} init=nonblocking in_progress_polls={polls} init_ms={}",
            ms(t)
        );
        Ok((comm, vec![line]))
    }

    /// The handle.
    fn comm(&self) -> sys::ncclComm_t {
        self.comm.get()
    }

    /// `ncclCommGetAsyncError`.
    fn state(&self) -> Result<sys::ncclResult_t, Fail> {
        let mut state = sys::ncclResult_t::ncclSuccess;
        // SAFETY: a live communicator and a valid pointer.
        unsafe { sys::ncclCommGetAsyncError(self.comm(), &mut state) }
            .result()
            .map_err(nccl("ncclCommGetAsyncError"))?;
        Ok(state)
    }

    /// Polls `ncclCommGetAsyncError` while it says `ncclInProgress`; an error is a
    /// failure. Returns how many polls said `ncclInProgress`.
    fn wait_ready(&self, after: &str) -> Result<u64, Fail> {
        let mut polls = 0;
        loop {
            match self.state()? {
                sys::ncclResult_t::ncclSuccess => return Ok(polls),
                sys::ncclResult_t::ncclInProgress => polls += 1,
                e => return Err(nccl(&format!("{after} (ncclCommGetAsyncError)"))(NcclError(e))),
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// A call's result: an error fails; `ncclInProgress` (non-blocking) is waited out.
    fn called(&self, what: &str, r: Result<NcclStatus, NcclError>) -> Result<(), Fail> {
        match r.map_err(nccl(what))? {
            NcclStatus::Success => Ok(()),
            NcclStatus::InProgress if self.nonblocking => self.wait_ready(what).map(drop),
            other => Err(Fail(format!(
                "{what} returned {} on a blocking communicator",
                status(Ok(other))
            ))),
        }
    }

    /// Whether the stream has finished its work (`cuStreamQuery`).
    fn stream_idle(&self) -> Result<bool, Fail> {
        // SAFETY: the stream of a live context.
        match unsafe { cu::cuStreamQuery(self.stream.cu_stream()) } {
            cu::CUresult::CUDA_SUCCESS => Ok(true),
            cu::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            e => Err(cuda("cuStreamQuery")(DriverError(e))),
        }
    }

    /// `ncclCommAbort` (once).
    fn abort(&self) -> Result<(), Fail> {
        let comm = self.comm.replace(std::ptr::null_mut());
        if comm.is_null() {
            return Ok(());
        }
        // SAFETY: a live communicator, ended once.
        unsafe { result::comm_abort(comm) }
            .map(drop)
            .map_err(nccl("ncclCommAbort"))
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        if let Err(Fail(why)) = self.abort() {
            eprintln!("{why}");
        }
    }
}

impl Collectives for Raw {
    fn all_reduce<T: Value>(&self, send: &CudaSlice<T>, recv: &mut CudaSlice<T>, op: &ReduceOp) -> Result<(), Fail> {
        let n = send.len();
        let (s, _read) = send.device_ptr(&self.stream);
        let (r, _written) = recv.device_ptr_mut(&self.stream);
        // SAFETY: live device buffers of n elements (or not, on purpose, for --break).
        let res = unsafe {
            result::all_reduce(
                s as _,
                r as _,
                n,
                T::as_nccl_type(),
                raw_op(op),
                self.comm(),
                self.stream.cu_stream() as _,
            )
        };
        self.called("all_reduce", res)
    }

    fn all_reduce_in_place<T: Value>(&self, buf: &mut CudaSlice<T>, op: &ReduceOp) -> Result<(), Fail> {
        let n = buf.len();
        let (p, _written) = buf.device_ptr_mut(&self.stream);
        // SAFETY: as above.
        let res = unsafe {
            result::all_reduce(
                p as _,
                p as _,
                n,
                T::as_nccl_type(),
                raw_op(op),
                self.comm(),
                self.stream.cu_stream() as _,
            )
        };
        self.called("all_reduce_in_place", res)
    }

    fn broadcast<T: Value>(&self, send: Option<&CudaSlice<T>>, recv: &mut CudaSlice<T>, root: i32) -> Result<(), Fail> {
        let n = recv.len();
        let (s, _read) = send.map(|b| b.device_ptr(&self.stream)).unzip();
        let (r, _written) = recv.device_ptr_mut(&self.stream);
        // SAFETY: as above; sendbuff is only read on the root.
        let res = unsafe {
            result::broadcast(
                s.map_or(std::ptr::null(), |p| p as _),
                r as _,
                n,
                T::as_nccl_type(),
                root,
                self.comm(),
                self.stream.cu_stream() as _,
            )
        };
        self.called("broadcast", res)
    }

    fn broadcast_in_place<T: Value>(&self, buf: &mut CudaSlice<T>, root: i32) -> Result<(), Fail> {
        let n = buf.len();
        let (p, _written) = buf.device_ptr_mut(&self.stream);
        // SAFETY: as above.
        let res = unsafe {
            result::broadcast(
                p as _,
                p as _,
                n,
                T::as_nccl_type(),
                root,
                self.comm(),
                self.stream.cu_stream() as _,
            )
        };
        self.called("broadcast_in_place", res)
    }

    fn reduce<T: Value, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &self,
        send: &S,
        recv: Option<&mut R>,
        op: &ReduceOp,
        root: i32,
    ) -> Result<(), Fail> {
        let n = send.len();
        let (s, _read) = send.device_ptr(&self.stream);
        let (r, _written) = recv.map(|b| b.device_ptr_mut(&self.stream)).unzip();
        // SAFETY: live device buffers of n elements (or not, on purpose, for --break);
        // recvbuff is only written on the root.
        let res = unsafe {
            result::reduce(
                s as _,
                r.map_or(std::ptr::null_mut(), |p| p as _),
                n,
                T::as_nccl_type(),
                raw_op(op),
                root,
                self.comm(),
                self.stream.cu_stream() as _,
            )
        };
        self.called("reduce", res)
    }

    fn reduce_in_place<T: Value, R: DevicePtrMut<T>>(&self, buf: &mut R, op: &ReduceOp, root: i32) -> Result<(), Fail> {
        let n = buf.len();
        let (p, _written) = buf.device_ptr_mut(&self.stream);
        // SAFETY: as above.
        let res = unsafe {
            result::reduce(
                p as _,
                p as _,
                n,
                T::as_nccl_type(),
                raw_op(op),
                root,
                self.comm(),
                self.stream.cu_stream() as _,
            )
        };
        self.called("reduce_in_place", res)
    }

    fn all_gather<T: Value, S: DevicePtr<T>, R: DevicePtrMut<T>>(&self, send: &S, recv: &mut R) -> Result<(), Fail> {
        let n = send.len();
        let (s, _read) = send.device_ptr(&self.stream);
        let (r, _written) = recv.device_ptr_mut(&self.stream);
        // SAFETY: as above.
        let res = unsafe {
            result::all_gather(
                s as _,
                r as _,
                n,
                T::as_nccl_type(),
                self.comm(),
                self.stream.cu_stream() as _,
            )
        };
        self.called("all_gather", res)
    }

    fn all_gather_in_place<T: Value, R: DevicePtrMut<T>>(
        &self,
        buf: &mut R,
        at: usize,
        count: usize,
    ) -> Result<(), Fail> {
        let (p, _written) = buf.device_ptr_mut(&self.stream);
        let s = p + (at * std::mem::size_of::<T>()) as u64;
        // SAFETY: as above.
        let res = unsafe {
            result::all_gather(
                s as _,
                p as _,
                count,
                T::as_nccl_type(),
                self.comm(),
                self.stream.cu_stream() as _,
            )
        };
        self.called("all_gather_in_place", res)
    }

    fn reduce_scatter<T: Value, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &self,
        send: &S,
        recv: &mut R,
        op: &ReduceOp,
    ) -> Result<(), Fail> {
        let n = recv.len();
        let (s, _read) = send.device_ptr(&self.stream);
        let (r, _written) = recv.device_ptr_mut(&self.stream);
        // SAFETY: as above.
        let res = unsafe {
            result::reduce_scatter(
                s as _,
                r as _,
                n,
                T::as_nccl_type(),
                raw_op(op),
                self.comm(),
                self.stream.cu_stream() as _,
            )
        };
        self.called("reduce_scatter", res)
    }

    fn reduce_scatter_in_place<T: Value, R: DevicePtrMut<T>>(
        &self,
        buf: &mut R,
        at: usize,
        count: usize,
        op: &ReduceOp,
    ) -> Result<(), Fail> {
        let (p, _written) = buf.device_ptr_mut(&self.stream);
        let r = p + (at * std::mem::size_of::<T>()) as u64;
        // SAFETY: as above.
        let res = unsafe {
            result::reduce_scatter(
                p as _,
                r as _,
                count,
                T::as_nccl_type(),
                raw_op(op),
                self.comm(),
                self.stream.cu_stream() as _,
            )
        };
        self.called("reduce_scatter_in_place", res)
    }

    fn send<T: Value, S: DevicePtr<T>>(&self, buf: &S, peer: i32) -> Result<(), Fail> {
        let (p, _read) = buf.device_ptr(&self.stream);
        // SAFETY: as above.
        let res = unsafe {
            result::send(
                p as _,
                buf.len(),
                T::as_nccl_type(),
                peer,
                self.comm(),
                self.stream.cu_stream() as _,
            )
        };
        self.called("send", res)
    }

    fn recv<T: Value, R: DevicePtrMut<T>>(&self, buf: &mut R, peer: i32) -> Result<(), Fail> {
        let n = buf.len();
        let (p, _written) = buf.device_ptr_mut(&self.stream);
        // SAFETY: as above.
        let res = unsafe {
            result::recv(
                p as _,
                n,
                T::as_nccl_type(),
                peer,
                self.comm(),
                self.stream.cu_stream() as _,
            )
        };
        self.called("recv", res)
    }

    fn group_end(&self) -> Result<(), Fail> {
        self.called("ncclGroupEnd", result::group_end())
    }

    /// Polls `cuStreamQuery` until the stream is idle, reading `ncclCommGetAsyncError`
    /// at every look: the way to wait for NCCL without hanging on a failed peer.
    fn settle(&self, what: &str) -> Result<(), Fail> {
        loop {
            let idle = self.stream_idle()?;
            match self.state()? {
                sys::ncclResult_t::ncclSuccess if idle => return Ok(()),
                sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress => {}
                e => return Err(nccl(&format!("{what} (ncclCommGetAsyncError)"))(NcclError(e))),
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// cudarc's safe `Comm` (which aborts the communicator when dropped).
struct Safe {
    comm: Comm,
}

impl Collectives for Safe {
    fn all_reduce<T: Value>(&self, send: &CudaSlice<T>, recv: &mut CudaSlice<T>, op: &ReduceOp) -> Result<(), Fail> {
        self.comm
            .all_reduce(send, recv, op)
            .map(drop)
            .map_err(nccl("all_reduce"))
    }

    fn all_reduce_in_place<T: Value>(&self, buf: &mut CudaSlice<T>, op: &ReduceOp) -> Result<(), Fail> {
        self.comm
            .all_reduce_in_place(buf, op)
            .map(drop)
            .map_err(nccl("all_reduce_in_place"))
    }

    fn broadcast<T: Value>(&self, send: Option<&CudaSlice<T>>, recv: &mut CudaSlice<T>, root: i32) -> Result<(), Fail> {
        self.comm
            .broadcast(send, recv, root)
            .map(drop)
            .map_err(nccl("broadcast"))
    }

    fn broadcast_in_place<T: Value>(&self, buf: &mut CudaSlice<T>, root: i32) -> Result<(), Fail> {
        self.comm
            .broadcast_in_place(buf, root)
            .map(drop)
            .map_err(nccl("broadcast_in_place"))
    }

    fn reduce<T: Value, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &self,
        send: &S,
        recv: Option<&mut R>,
        op: &ReduceOp,
        root: i32,
    ) -> Result<(), Fail> {
        self.comm.reduce(send, recv, op, root).map(drop).map_err(nccl("reduce"))
    }

    fn reduce_in_place<T: Value, R: DevicePtrMut<T>>(&self, buf: &mut R, op: &ReduceOp, root: i32) -> Result<(), Fail> {
        self.comm
            .reduce_in_place(buf, op, root)
            .map(drop)
            .map_err(nccl("reduce_in_place"))
    }

    fn all_gather<T: Value, S: DevicePtr<T>, R: DevicePtrMut<T>>(&self, send: &S, recv: &mut R) -> Result<(), Fail> {
        self.comm.all_gather(send, recv).map(drop).map_err(nccl("all_gather"))
    }

    fn all_gather_in_place<T: Value, R: DevicePtrMut<T>>(
        &self,
        _buf: &mut R,
        _at: usize,
        _count: usize,
    ) -> Result<(), Fail> {
        Err(Fail(
            "cudarc's safe Comm has no in-place all-gather (its sendbuff would borrow the recvbuff it is part of)"
                .into(),
        ))
    }

    fn reduce_scatter<T: Value, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &self,
        send: &S,
        recv: &mut R,
        op: &ReduceOp,
    ) -> Result<(), Fail> {
        self.comm
            .reduce_scatter(send, recv, op)
            .map(drop)
            .map_err(nccl("reduce_scatter"))
    }

    fn reduce_scatter_in_place<T: Value, R: DevicePtrMut<T>>(
        &self,
        _buf: &mut R,
        _at: usize,
        _count: usize,
        _op: &ReduceOp,
    ) -> Result<(), Fail> {
        Err(Fail(
            "cudarc's safe Comm has no in-place reduce-scatter (its recvbuff would borrow the sendbuff it is part of)"
                .into(),
        ))
    }

    fn send<T: Value, S: DevicePtr<T>>(&self, buf: &S, peer: i32) -> Result<(), Fail> {
        self.comm.send(buf, peer).map_err(nccl("send"))
    }

    fn recv<T: Value, R: DevicePtrMut<T>>(&self, buf: &mut R, peer: i32) -> Result<(), Fail> {
        self.comm.recv(buf, peer).map(drop).map_err(nccl("recv"))
    }

    fn group_end(&self) -> Result<(), Fail> {
        result::group_end().map(drop).map_err(nccl("ncclGroupEnd"))
    }

    fn settle(&self, _what: &str) -> Result<(), Fail> {
        self.comm.stream().synchronize().map_err(cuda("stream.synchronize"))
    }
}

// ---------------------------------------------------------------------------------
// A rank of a job.

/// The rank's device, context and stream (after `--delay-ms`).
fn setup(a: &Args, rank: usize) -> Result<(usize, Arc<CudaContext>, Arc<CudaStream>), Fail> {
    std::thread::sleep(Duration::from_millis(a.delay_ms));
    let count = CudaContext::device_count().map_err(cuda("CudaContext::device_count"))? as usize;
    let device = a.device.unwrap_or(rank % count.max(1));
    let ctx = CudaContext::new(device).map_err(cuda("CudaContext::new"))?;
    let stream = ctx.default_stream();
    Ok((device, ctx, stream))
}

/// What a rank that breaks the job on purpose does once it has joined: `crash` (exit
/// without ending the communicator), `exit-early` (abort it and exit: it never calls the
/// collective), `hang` (write `--ready-file`, then never call anything: the test kills
/// or stops it). `None`: carry on.
fn misbehave(a: &Args, rank: usize, comm: &Raw) -> Option<Result<Vec<String>, Fail>> {
    match a.brk.as_deref() {
        Some("crash") => std::process::exit(3),
        Some("exit-early") => Some(comm.abort().map(|()| vec![format!("rank={rank} left early")])),
        Some("hang") => {
            if let Some(f) = &a.ready_file {
                let _ = std::fs::write(f, b"joined");
            }
            loop {
                std::thread::sleep(Duration::from_secs(1));
            }
        }
        _ => None,
    }
}

/// One rank: context, stream, communicator, then the operation.
fn rank(a: &Args, rank: usize, id: Id) -> Result<Vec<String>, Fail> {
    let (device, ctx, stream) = setup(a, rank)?;
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
        let (s, nonblocking) = (stream.clone(), a.nonblocking);
        return std::thread::spawn(move || Raw::join(&s, join_rank, join_world, id, nonblocking).map(drop))
            .join()
            .map_err(|_| Fail("thread panicked".into()))?
            .map(|()| vec!["unexpectedly joined".into()]);
    }
    if a.api == "safe" {
        let comm = Comm::from_rank(stream.clone(), join_rank, join_world, id).map_err(nccl("Comm::from_rank"))?;
        let comm = Safe { comm };
        let mut lines = Vec::new();
        let run = session(a, rank, device, &ctx, &comm, &stream, &mut lines);
        // cudarc's Drop calls ncclCommAbort and panics if it fails.
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(comm)))
            .map_err(|_| Fail("dropping the Comm panicked (ncclCommAbort failed)".into()))?;
        return run.map(|()| lines);
    }
    let (comm, mut lines) = Raw::join(&stream, join_rank, join_world, id, a.nonblocking)?;
    if let Some(done) = misbehave(a, rank, &comm) {
        return done;
    }
    session(a, rank, device, &ctx, &comm, &stream, &mut lines)?;
    comm.abort()?;
    Ok(lines)
}

/// `--repeat` times the operation, for the element type `--dtype`.
fn session<C: Collectives>(
    a: &Args,
    rank: usize,
    device: usize,
    ctx: &Arc<CudaContext>,
    comm: &C,
    stream: &Arc<CudaStream>,
    lines: &mut Vec<String>,
) -> Result<(), Fail> {
    std::thread::sleep(Duration::from_millis(a.op_delay_ms));
    for _ in 0..a.repeat {
        for op_name in a.op.split(',') {
            let reduces = matches!(
                op_name,
                "allreduce"
                    | "allreduce-inplace"
                    | "reduce"
                    | "reduce-inplace"
                    | "reducescatter"
                    | "reducescatter-inplace"
            );
            let reductions: Vec<&str> = if reduces {
                a.reduce.split(',').collect()
            } else {
                vec![a.reduce.split(',').next().unwrap_or_default()]
            };
            for dtype in a.dtype.split(',') {
                for red in &reductions {
                    for count in &a.counts {
                        let one = Args {
                            op: op_name.into(),
                            dtype: dtype.into(),
                            reduce: red.to_string(),
                            count: *count,
                            ..a.clone()
                        };
                        typed_op(&one, rank, device, ctx, comm, stream, lines)?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// [`op`] for the element type `--dtype`.
fn typed_op<C: Collectives>(
    a: &Args,
    rank: usize,
    device: usize,
    ctx: &Arc<CudaContext>,
    comm: &C,
    stream: &Arc<CudaStream>,
    lines: &mut Vec<String>,
) -> Result<(), Fail> {
    macro_rules! typed {
        ($t:ty) => {
            op::<$t, C>(a, rank, device, ctx, comm, stream, lines)
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
        "f16" => typed!(F16),
        "bf16" => typed!(Bf16),
        t => Err(Fail(format!("unknown dtype {t}"))),
    }
}

/// `data` on the device: a buffer of at least one element (the driver refuses 0-byte
/// allocations), of which the call uses `data.len()`.
fn upload<T: Value>(stream: &Arc<CudaStream>, data: &[T]) -> Result<CudaSlice<T>, Fail> {
    if data.is_empty() {
        return Ok(stream.alloc_zeros::<T>(1)?);
    }
    Ok(stream.clone_htod(data)?)
}

/// The first `n` elements of `buf`, read back.
fn download<T: Value>(stream: &Arc<CudaStream>, buf: &CudaSlice<T>, n: usize) -> Result<Vec<T>, Fail> {
    let mut v = stream.clone_dtoh(buf)?;
    v.truncate(n);
    Ok(v)
}

/// A second handle on `n` elements of `buf` from element `at` on (`--break overlap`):
/// leaked on purpose with [`CudaSlice::leak`] once used, as `buf` owns the memory.
fn alias<T: Value>(stream: &Arc<CudaStream>, buf: &mut CudaSlice<T>, at: usize, n: usize) -> CudaSlice<T> {
    let (p, rec) = buf.device_ptr_mut(stream);
    drop(rec);
    // SAFETY: on purpose: memory `buf` owns, seen twice; never freed through this handle.
    unsafe { stream.upgrade_device_ptr::<T>(p + (at * std::mem::size_of::<T>()) as u64, n) }
}

/// A buffer that claims `n` elements over an allocation of `n - 1` (`--break
/// *-too-small`): leaked on purpose with [`CudaSlice::leak`] once used.
fn one_short<T: Value>(stream: &Arc<CudaStream>, data: &[T]) -> Result<CudaSlice<T>, Fail> {
    let short = upload(stream, &data[..data.len().saturating_sub(1)])?;
    // SAFETY: on purpose: one element more than was allocated.
    Ok(unsafe { stream.upgrade_device_ptr::<T>(short.leak(), data.len()) })
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
fn op<T: Value, C: Collectives>(
    a: &Args,
    rank: usize,
    device: usize,
    ctx: &Arc<CudaContext>,
    comm: &C,
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
                    comm.broadcast_in_place(&mut buf, 0)?;
                    return comm.settle("broadcast_in_place");
                }
                "mismatch-dtype" => {
                    let send = stream.clone_htod(&vec![1f64; count])?;
                    let mut recv = stream.alloc_zeros::<f64>(count)?;
                    comm.all_reduce(&send, &mut recv, &reduce_op(red)?)?;
                    return comm.settle("all_reduce");
                }
                "overlap" => {
                    // sendbuff one element past recvbuff, in one buffer.
                    let mut buf = stream.clone_htod(&values(&|i| (rank + i) as f64, count + 1))?;
                    let send = alias(stream, &mut buf, 1, count);
                    let r = comm.all_reduce(&send, &mut buf, &reduce_op(red)?);
                    send.leak();
                    r?;
                    return comm.settle("all_reduce");
                }
                _ => {}
            }
            let input = values(&|i| (rank + 1 + i) as f64, count);
            let op = reduce_op(red)?;
            let out = if a.op == "allreduce-inplace" {
                let mut buf = stream.clone_htod(&input)?;
                let _other = misuse_context(brk, device)?;
                comm.all_reduce_in_place(&mut buf, &op)?;
                comm.settle("all_reduce_in_place")?;
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
                        ctx.bind_to_thread()?;
                        let mut recv = stream.alloc_zeros::<T>(count)?;
                        comm.all_reduce(&there, &mut recv, &op)?;
                        return comm.settle("all_reduce");
                    }
                    _ => stream.clone_htod(&input)?,
                };
                let mut recv = stream.alloc_zeros::<T>(count)?;
                let _other = misuse_context(brk, device)?;
                let r = comm.all_reduce(&send, &mut recv, &op);
                if matches!(brk, "host-buffer" | "freed-buffer" | "count-too-large") {
                    send.leak();
                }
                r?;
                comm.settle("all_reduce")?;
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
                    "root-out-of-range" => root_arg = world as i32,
                    _ => {}
                }
                let data = values(&|i| (100 * root + i) as f64, count);
                let out = if brk == "overlap" && rank == root {
                    // sendbuff one element past recvbuff, in one buffer.
                    let mut buf = stream.clone_htod(&values(&|i| (100 * root + i) as f64, count + 1))?;
                    let send = alias(stream, &mut buf, 1, count);
                    let mut recv = alias(stream, &mut buf, 0, count);
                    let r = comm.broadcast(Some(&send), &mut recv, root_arg);
                    send.leak();
                    recv.leak();
                    r?;
                    comm.settle("broadcast")?;
                    stream.clone_dtoh(&buf)?
                } else if a.op == "broadcast-inplace" {
                    let mut buf = if rank == root {
                        stream.clone_htod(&data)?
                    } else {
                        stream.alloc_zeros::<T>(count)?
                    };
                    let _other = misuse_context(brk, device)?;
                    comm.broadcast_in_place(&mut buf, root_arg)?;
                    comm.settle("broadcast_in_place")?;
                    stream.clone_dtoh(&buf)?
                } else {
                    let send = if rank == root {
                        Some(stream.clone_htod(&data)?)
                    } else {
                        None
                    };
                    let mut recv = stream.alloc_zeros::<T>(count)?;
                    let _other = misuse_context(brk, device)?;
                    comm.broadcast(send.as_ref(), &mut recv, root_arg)?;
                    comm.settle("broadcast")?;
                    stream.clone_dtoh(&recv)?
                };
                lines.push(format!("{head} root={root} result={}", show(&out)));
            }
        }
        "reduce" | "reduce-inplace" => {
            let roots: Vec<usize> = a.root.map_or_else(|| (0..world).collect(), |r| vec![r]);
            let (count, red) = (a.count, a.reduce.as_str());
            let op = reduce_op(red)?;
            for root in roots {
                let root_arg = if brk == "root-out-of-range" {
                    world as i32
                } else {
                    root as i32
                };
                let input = values(&|i| (rank + 1 + i) as f64, count);
                let out = if a.op == "reduce-inplace" {
                    let mut buf = upload(stream, &input)?;
                    comm.reduce_in_place(&mut buf.slice_mut(..count), &op, root_arg)?;
                    comm.settle("reduce_in_place")?;
                    Some(download(stream, &buf, count)?)
                } else if brk == "overlap" {
                    // sendbuff one element past recvbuff, in one buffer.
                    let mut buf = upload(stream, &values(&|i| (rank + i) as f64, count + 1))?;
                    let send = alias(stream, &mut buf, 1, count);
                    let r = comm.reduce(&send, Some(&mut buf.slice_mut(..count)), &op, root_arg);
                    send.leak();
                    r?;
                    comm.settle("reduce")?;
                    Some(download(stream, &buf, count)?)
                } else if rank != root && rank % 2 == 1 {
                    // A non-root's recvbuff is not used: NULL, as cudarc's reduce(.., None, ..).
                    let send = upload(stream, &input)?;
                    comm.reduce(&send.slice(..count), None::<&mut CudaSlice<T>>, &op, root_arg)?;
                    comm.settle("reduce")?;
                    None
                } else {
                    let send = upload(stream, &input)?;
                    let mut recv = upload(stream, &values(&|_| UNTOUCHED, count))?;
                    comm.reduce(&send.slice(..count), Some(&mut recv.slice_mut(..count)), &op, root_arg)?;
                    comm.settle("reduce")?;
                    Some(download(stream, &recv, count)?)
                };
                let out = out.map(|v| show(&v)).unwrap_or_default();
                lines.push(format!("{head} reduce={red} count={count} root={root} result={out}"));
            }
        }
        "allgather" | "allgather-inplace" => {
            let count = a.count;
            let total = world * count;
            let input = values(&|i| (rank * count + i + 1) as f64, count);
            let out = if a.op == "allgather-inplace" || brk == "overlap" {
                // This rank's block of recvbuff holds its input; sendbuff points at it (or,
                // for --break overlap, at the start of recvbuff: not in place on rank > 0).
                let at = if brk == "overlap" { 0 } else { rank * count };
                let mut all = values(&|_| UNTOUCHED, total);
                all[rank * count..(rank + 1) * count].copy_from_slice(&input);
                let mut buf = upload(stream, &all)?;
                comm.all_gather_in_place(&mut buf.slice_mut(..total), at, count)?;
                comm.settle("all_gather_in_place")?;
                download(stream, &buf, total)?
            } else {
                let send = upload(stream, &input)?;
                let untouched = values(&|_| UNTOUCHED, total);
                let mut recv = if brk == "recv-too-small" {
                    one_short(stream, &untouched)?
                } else {
                    upload(stream, &untouched)?
                };
                let r = comm.all_gather(&send.slice(..count), &mut recv.slice_mut(..total));
                if brk == "recv-too-small" {
                    recv.leak();
                    return r.and(Err(Fail(
                        "all_gather into a recvbuff one element short was accepted".into(),
                    )));
                }
                r?;
                comm.settle("all_gather")?;
                download(stream, &recv, total)?
            };
            lines.push(format!("{head} count={count} result={}", show(&out)));
        }
        "reducescatter" | "reducescatter-inplace" => {
            let (count, red) = (a.count, a.reduce.as_str());
            let op = reduce_op(red)?;
            let total = world * count;
            let input = values(&|i| (rank + 1 + i) as f64, total);
            let out = if a.op == "reducescatter-inplace" || brk == "overlap" {
                // recvbuff is this rank's block of sendbuff (or, for --break overlap, its
                // start: not in place on rank > 0).
                let at = if brk == "overlap" { 0 } else { rank * count };
                let mut buf = upload(stream, &input)?;
                comm.reduce_scatter_in_place(&mut buf.slice_mut(..total), at, count, &op)?;
                comm.settle("reduce_scatter_in_place")?;
                download(stream, &buf, total)?[at..at + count].to_vec()
            } else {
                let send = if brk == "send-too-small" {
                    one_short(stream, &input)?
                } else {
                    upload(stream, &input)?
                };
                let mut recv = upload(stream, &values(&|_| UNTOUCHED, count))?;
                let r = comm.reduce_scatter(&send.slice(..total), &mut recv.slice_mut(..count), &op);
                if brk == "send-too-small" {
                    send.leak();
                }
                r?;
                comm.settle("reduce_scatter")?;
                download(stream, &recv, count)?
            };
            lines.push(format!("{head} reduce={red} count={count} result={}", show(&out)));
        }
        "alltoall" => {
            // nccl-tests' all-to-all: block p of sendbuff goes to rank p, block p of
            // recvbuff comes from rank p, every rank (itself included) in one group.
            let count = a.count;
            let total = world * count;
            let input = values(&|j| ((rank * world + j / count) * count + j % count + 1) as f64, total);
            let mut send = upload(stream, &input)?;
            let mut recv = upload(stream, &values(&|_| UNTOUCHED, total))?;
            comm.group_start()?;
            for p in 0..world {
                let block = p * count..(p + 1) * count;
                comm.send(&send.slice(block.clone()), p as i32)?;
                if brk == "overlap" {
                    // In place: receiving into the block just sent.
                    comm.recv(&mut send.slice_mut(block), p as i32)?;
                } else {
                    comm.recv(&mut recv.slice_mut(block), p as i32)?;
                }
            }
            comm.group_end()?;
            comm.settle("ncclGroupEnd")?;
            let out = download(stream, &recv, total)?;
            lines.push(format!("{head} count={count} result={}", show(&out)));
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
            comm.group_start()?;
            comm.send(&send, to as i32)?;
            comm.recv(&mut recv, from as i32)?;
            comm.group_end()?;
            comm.settle("ncclGroupEnd")?;
            let out = stream.clone_dtoh(&recv)?;
            lines.push(format!("{head} from={from} result={}", show(&out)));
        }
        other => return Err(Fail(format!("unknown op {other}"))),
    }
    Ok(())
}

// ---------------------------------------------------------------------------------
// Ending communicators, stuck work, aborts.

/// What cudarc's safe `Comm` cannot do (it only aborts): an all-reduce (after
/// `--op-delay-ms`), then `ncclCommFinalize` (timed: blocking, it waits for the work;
/// non-blocking, it says `ncclInProgress` and `ncclCommGetAsyncError` is polled until the
/// work is done), then `ncclCommDestroy`. Then two misuses: a collective on the
/// finalized communicator, and an abort of the destroyed one.
fn finalize(a: &Args, id: Id) -> Result<Vec<String>, Fail> {
    let (_device, _ctx, stream) = setup(a, a.rank)?;
    let (comm, mut lines) = Raw::join(&stream, a.rank, a.world, id, a.nonblocking)?;
    let mut buf = stream.clone_htod(&vec![(a.rank + 1) as f32; a.count])?;
    std::thread::sleep(Duration::from_millis(a.op_delay_ms));
    comm.all_reduce_in_place(&mut buf, &ReduceOp::Sum)?;
    let t = Instant::now();
    // SAFETY: a live communicator.
    let finalized = status(unsafe { result::comm_finalize(comm.comm()) });
    let finalize_ms = ms(t);
    let mut polls = 0;
    if finalized == "ncclInProgress" {
        polls = comm.wait_ready("ncclCommFinalize")?;
    } else if finalized != "ncclSuccess" {
        return Err(Fail(format!("ncclCommFinalize returned {finalized}")));
    }
    let settled_ms = ms(t);
    let out = stream.clone_dtoh(&buf)?;
    let (ptr, _written) = buf.device_ptr_mut(&stream);
    // SAFETY: an in-place all-reduce of a live device buffer, on purpose after finalize.
    let after_finalize = status(unsafe {
        result::all_reduce(
            ptr as _,
            ptr as _,
            a.count,
            sys::ncclDataType_t::ncclFloat32,
            sys::ncclRedOp_t::ncclSum,
            comm.comm(),
            stream.cu_stream() as _,
        )
    });
    let handle = comm.comm.replace(std::ptr::null_mut());
    // SAFETY: the communicator is live until destroyed, and not used after (but for the
    // abort, which the double refuses).
    unsafe { result::comm_destroy(handle) }.map_err(nccl("ncclCommDestroy"))?;
    let abort_after_destroy = status(unsafe { result::comm_abort(handle) });
    lines.push(format!(
        "rank={} op=raw finalize={finalized} finalize_ms={finalize_ms} in_progress_polls={polls} \
         settled_ms={settled_ms} result={} after_finalize={after_finalize} abort_after_destroy={abort_after_destroy}",
        a.rank,
        show(&out)
    ));
    Ok(lines)
}

/// A collective whose peer may never make its call (the peer misbehaves with `--break`):
/// the call must return at once, the send buffer's free must not block, the stream must
/// stay busy for `--watch-ms` with no error reported, and `ncclCommAbort` must free the
/// stream at once. Reports each, timed.
fn watch(a: &Args, id: Id) -> Result<Vec<String>, Fail> {
    let (_device, _ctx, stream) = setup(a, a.rank)?;
    let (comm, mut lines) = Raw::join(&stream, a.rank, a.world, id, a.nonblocking)?;
    if let Some(done) = misbehave(a, a.rank, &comm) {
        return done;
    }
    let send = stream.clone_htod(&vec![1f32; a.count])?;
    let mut recv = stream.alloc_zeros::<f32>(a.count)?;
    let t = Instant::now();
    comm.all_reduce(&send, &mut recv, &ReduceOp::Sum)?;
    let call_ms = ms(t);
    let t = Instant::now();
    drop(send);
    let free_ms = ms(t);
    // An event recorded after the collective completes with it (cuEventQuery).
    let event = stream.record_event(None)?;
    let (mut busy, mut idle, mut states) = (0, 0, std::collections::BTreeSet::new());
    let end = Instant::now() + Duration::from_millis(a.watch_ms);
    while Instant::now() < end {
        if comm.stream_idle()? {
            idle += 1;
        } else {
            busy += 1;
        }
        states.insert(format!("{:?}", comm.state()?));
        std::thread::sleep(Duration::from_millis(10));
    }
    let event_done_while_stuck = event.is_complete();
    let t = Instant::now();
    comm.abort()?;
    let abort_ms = ms(t);
    let idle_after_abort = comm.stream_idle()?;
    // Neither waits any more: the work before them was dropped.
    event.synchronize()?;
    stream.synchronize()?;
    let event_done_after_abort = event.is_complete();
    drop(recv);
    let states: Vec<String> = states.into_iter().collect();
    lines.push(format!(
        "rank={} op=watch call_ms={call_ms} free_ms={free_ms} busy_polls={busy} idle_polls={idle} states={} \
         abort_ms={abort_ms} idle_after_abort={idle_after_abort} event_done_while_stuck={event_done_while_stuck} \
         event_done_after_abort={event_done_after_abort}",
        a.rank,
        states.join(",")
    ));
    Ok(lines)
}

/// A non-blocking init that cannot finish (a rank is missing): `ncclCommGetAsyncError`
/// must say `ncclInProgress` for `--abort-after-ms`, then `ncclCommAbort` must end it at
/// once.
fn init_abort(a: &Args, id: Id) -> Result<Vec<String>, Fail> {
    let (_device, _ctx, stream) = setup(a, a.rank)?;
    let comm = Raw::start(&stream, a.rank, a.world, id, true)?;
    let (mut polls, mut states) = (0, std::collections::BTreeSet::new());
    let end = Instant::now() + Duration::from_millis(a.abort_after_ms);
    while Instant::now() < end {
        states.insert(format!("{:?}", comm.state()?));
        polls += 1;
        std::thread::sleep(Duration::from_millis(5));
    }
    let t = Instant::now();
    comm.abort()?;
    let abort_ms = ms(t);
    let states: Vec<String> = states.into_iter().collect();
    Ok(vec![format!(
        "rank={} op=init-abort polls={polls} states={} abort_ms={abort_ms}",
        a.rank,
        states.join(",")
    )])
}
