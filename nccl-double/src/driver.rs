//! The CUDA driver half: initialisation, devices (as `CUDA_VISIBLE_DEVICES` shows them,
//! [`crate::devices`]), primary contexts, the thread's current context, streams and
//! events in stream order ([`crate::stream`]), and device memory ([`crate::memory`]).
//!
//! Exported: what cudarc 0.19 (`cuda-12000`) calls for
//! `CudaContext::{device_count, new, name, uuid, bind_to_thread, default_stream,
//! new_stream}`, `CudaStream::{clone_htod, alloc_zeros, clone_dtoh, memcpy_htod,
//! memcpy_dtoh, synchronize}`, dropping all of these, and `{:?}` of a `DriverError`;
//! plus `cuDriverGetVersion`, `cuDeviceGetPCIBusId`, `cuStreamQuery`, `cuEventQuery` and
//! `cuEventSynchronize`, which a program polling NCCL work needs; `cuStreamWaitEvent`,
//! which orders two streams; and PTX modules and kernel launches ([`kernels`]).
//!
//! Stream order: NCCL work queued on a stream keeps it busy until it finishes (for ever
//! if a peer never comes). The driver's own calls on a stream act once the work issued
//! before them is done: copies (host memory is pageable, so they are synchronous for the
//! host, as on a GPU), memsets and allocations block until then; `cuMemFreeAsync` never
//! blocks (the free is deferred); `cuStreamQuery` and `cuEventQuery` only look.
//!
//! Like an A100, the devices report memory pools, so cudarc allocates with
//! `cuMemAllocAsync` and frees with `cuMemFreeAsync`, the path it takes on the real
//! cluster (a path on which dropping a buffer does not bind the context first).

use crate::stream::{self, Key};
use crate::{allowed, devices, entry, memory, warn};
use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{LazyLock, Mutex, MutexGuard};

/// `CUresult`. Only codes that exist in cudarc's `cudaError_enum` are ever returned
/// (cudarc turns the number into a Rust enum: any other value is undefined behaviour).
pub type CuResult = c_uint;
pub const SUCCESS: CuResult = 0;
pub const INVALID_VALUE: CuResult = 1;
pub const OUT_OF_MEMORY: CuResult = 2;
pub const NOT_INITIALIZED: CuResult = 3;
pub const NO_DEVICE: CuResult = 100;
pub const INVALID_DEVICE: CuResult = 101;
pub const INVALID_CONTEXT: CuResult = 201;
pub const INVALID_HANDLE: CuResult = 400;
pub const NOT_READY: CuResult = 600;
pub const UNKNOWN: CuResult = 999;

/// `CUdeviceptr`.
type DevicePtr = u64;
/// `CUcontext`, `CUstream`, `CUevent`: opaque pointers, made up here.
type Handle = usize;

/// The primary context of visible device `d` is the handle `CTX_BASE + d * CTX_STEP`
/// (one process's visible devices never change, so visible ordinals name them well).
const CTX_BASE: usize = 0x00c0_de00_0000;
const CTX_STEP: usize = 0x1000;

/// Whether `cuInit` succeeded in this process (until it has, the driver refuses all but
/// `cuInit`, `cuDriverGetVersion` and `cuGetErrorString`, as the real one does).
static INITIALIZED: AtomicBool = AtomicBool::new(false);

/// How many devices this process sees (`CUDA_VISIBLE_DEVICES` applied).
pub fn device_count() -> usize {
    devices::visible().len()
}

thread_local! {
    /// The context current on this thread (0: none), as the real driver keeps it.
    static CURRENT: Cell<Handle> = const { Cell::new(0) };
}

/// Retain counts of the primary contexts, by visible device.
static RETAINED: Mutex<Vec<usize>> = Mutex::new(Vec::new());
/// Streams made by `cuStreamCreate`, and the device each belongs to.
static STREAMS: LazyLock<Mutex<HashMap<Handle, usize>>> = LazyLock::new(|| Mutex::new(HashMap::new()));
/// Events made by `cuEventCreate`.
static EVENTS: LazyLock<Mutex<HashMap<Handle, Event>>> = LazyLock::new(|| Mutex::new(HashMap::new()));
static NEXT_HANDLE: AtomicUsize = AtomicUsize::new(0x5e00_0000);

/// An event: where it was last recorded (the stream and its mark then), if it was.
#[derive(Clone, Copy, Default)]
struct Event {
    recorded: Option<(Key, u64)>,
}

/// Locks a table, ignoring poisoning (a panic is already reported by [`entry`]).
fn lock<T>(m: &'static Mutex<T>) -> MutexGuard<'static, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn retained(device: usize) -> usize {
    lock(&RETAINED).get(device).copied().unwrap_or(0)
}

fn context_device(ctx: Handle) -> Option<usize> {
    let d = ctx.checked_sub(CTX_BASE)? / CTX_STEP;
    (ctx == CTX_BASE + d * CTX_STEP && d < device_count()).then_some(d)
}

/// The device whose (live) context is current on this thread, if any.
pub fn current_device() -> Option<usize> {
    context_device(CURRENT.with(Cell::get)).filter(|&d| retained(d) > 0)
}

/// The device of `stream`: the current context's for the NULL (default) stream.
pub fn stream_device(stream: Handle) -> Result<usize, CuResult> {
    if stream == 0 || stream == 0x1 || stream == 0x2 {
        // NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD: the current context's.
        current_device().ok_or(INVALID_CONTEXT)
    } else {
        lock(&STREAMS).get(&stream).copied().ok_or(INVALID_HANDLE)
    }
}

/// The stream `stream` as [`crate::stream`] tracks it.
pub fn stream_key(stream: Handle) -> Result<Key, CuResult> {
    stream_device(stream).map(|d| Key::new(d, stream))
}

/// Fails with NOT_INITIALIZED unless `cuInit` succeeded (and the double may act).
macro_rules! require_init {
    () => {
        if !allowed() || !INITIALIZED.load(Ordering::Acquire) {
            return NOT_INITIALIZED;
        }
    };
}

/// Fails with INVALID_VALUE if a pointer the caller must provide is NULL.
macro_rules! non_null {
    ($($p:ident),*) => {
        $(if $p.is_null() {
            warn(None, concat!("NULL pointer `", stringify!($p), "` given to the CUDA driver"));
            return INVALID_VALUE;
        })*
    };
}

/// Unwraps a `Result<_, CuResult>`, returning the error code from the function.
macro_rules! attempt {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(code) => return code,
        }
    };
}

/// A visible ordinal given by the caller, checked.
fn check_device(dev: c_int) -> Result<usize, CuResult> {
    usize::try_from(dev)
        .ok()
        .filter(|&d| d < device_count())
        .ok_or(INVALID_DEVICE)
}

/// The physical device behind the visible ordinal `dev`.
fn physical_device(dev: c_int) -> Result<usize, CuResult> {
    check_device(dev).and_then(|d| devices::physical(d).ok_or(INVALID_DEVICE))
}

/// Writes `text` and a NUL into the caller's `buf` of `len` bytes, cut to fit.
///
/// # Safety
/// `buf` must be writable for `len` bytes.
unsafe fn write_c_string(text: &str, buf: *mut c_char, len: usize) {
    let n = text.len().min(len - 1);
    // SAFETY: the caller's buffer holds `len` bytes, as the driver API requires.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr().cast(), buf, n);
        *buf.add(n) = 0;
    }
}

/// Initialises the driver: CUDA_ERROR_NO_DEVICE when no device is visible
/// (`CUDA_VISIBLE_DEVICES` empty or starting with an invalid entry), as the real driver
/// says, and also when `NCCL_DOUBLE=1` is missing (the safety catch). After a failed
/// `cuInit` every other call returns CUDA_ERROR_NOT_INITIALIZED, as on a real driver
/// (`cuDeviceGetCount` included: cudarc's `device_count()` never gets that far).
#[unsafe(no_mangle)]
pub extern "C" fn cuInit(_flags: c_uint) -> CuResult {
    entry("cuInit", UNKNOWN, || {
        if !allowed() || device_count() == 0 {
            return NO_DEVICE;
        }
        INITIALIZED.store(true, Ordering::Release);
        SUCCESS
    })
}

/// CUDA 12.0, the version cudarc is built against here (works before `cuInit`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CuResult {
    entry("cuDriverGetVersion", UNKNOWN, || {
        non_null!(version);
        // SAFETY: `version` was checked non-null above; it is the caller's out-parameter, writable (the API's contract).
        unsafe { *version = 12000 };
        SUCCESS
    })
}

/// The number of visible devices.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CuResult {
    entry("cuDeviceGetCount", UNKNOWN, || {
        require_init!();
        non_null!(count);
        // SAFETY: `count` was checked non-null above; it is the caller's out-parameter, writable (the API's contract).
        unsafe { *count = device_count() as c_int };
        SUCCESS
    })
}

/// The device handle of a visible ordinal: the ordinal itself.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGet(device: *mut c_int, ordinal: c_int) -> CuResult {
    entry("cuDeviceGet", UNKNOWN, || {
        require_init!();
        non_null!(device);
        attempt!(check_device(ordinal));
        // SAFETY: `device` was checked non-null above; it is the caller's out-parameter, writable (the API's contract).
        unsafe { *device = ordinal };
        SUCCESS
    })
}

/// The name of the physical device behind `device`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, device: c_int) -> CuResult {
    entry("cuDeviceGetName", UNKNOWN, || {
        require_init!();
        non_null!(name);
        let p = attempt!(physical_device(device));
        if len <= 0 {
            return INVALID_VALUE;
        }
        // SAFETY: `name` was checked non-null and `len` positive above; the caller's buffer holds `len` bytes (the API's contract).
        unsafe { write_c_string(&devices::name(p), name, len as usize) };
        SUCCESS
    })
}

/// The PCI bus id of the physical device behind `dev` (`0000:1B:00.0`, NUL-terminated).
/// A buffer too short for all of it is refused with CUDA_ERROR_INVALID_VALUE.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetPCIBusId(bus_id: *mut c_char, len: c_int, dev: c_int) -> CuResult {
    entry("cuDeviceGetPCIBusId", UNKNOWN, || {
        require_init!();
        non_null!(bus_id);
        let p = attempt!(physical_device(dev));
        let text = devices::bus_id(p);
        if len <= text.len() as c_int {
            warn(
                None,
                &format!(
                    "cuDeviceGetPCIBusId: a buffer of {len} bytes is too short for \"{text}\" and its NUL ({} bytes)",
                    text.len() + 1
                ),
            );
            return INVALID_VALUE;
        }
        // SAFETY: `bus_id` was checked non-null and `len` positive above; the caller's buffer holds `len` bytes (the API's contract).
        unsafe { write_c_string(&text, bus_id, len as usize) };
        SUCCESS
    })
}

/// `CUuuid`: 16 bytes.
#[repr(C)]
pub struct CuUuid {
    bytes: [u8; 16],
}

/// The UUID of the physical device behind `dev` (see [`devices::uuid`]).
fn get_uuid(name: &'static str, uuid: *mut CuUuid, dev: c_int) -> CuResult {
    entry(name, UNKNOWN, || {
        require_init!();
        non_null!(uuid);
        let p = attempt!(physical_device(dev));
        // SAFETY: `uuid` was checked non-null above; it is the caller's out-parameter, writable (the API's contract).
        unsafe { (*uuid).bytes = devices::uuid(p) };
        SUCCESS
    })
}

/// The device's UUID (the CUDA 9.2 entry point cudarc 0.19 calls for CUDA 12).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid(uuid: *mut CuUuid, dev: c_int) -> CuResult {
    get_uuid("cuDeviceGetUuid", uuid, dev)
}

/// The device's UUID (the CUDA 11.4 entry point; the same here: no MIG).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut CuUuid, dev: c_int) -> CuResult {
    get_uuid("cuDeviceGetUuid_v2", uuid, dev)
}

/// The attributes cudarc asks for, answered as an A100 would. Any other is refused
/// (with a warning) rather than answered with a made-up number.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetAttribute(value: *mut c_int, attribute: c_uint, device: c_int) -> CuResult {
    entry("cuDeviceGetAttribute", UNKNOWN, || {
        require_init!();
        non_null!(value);
        attempt!(check_device(device));
        let v = match attribute {
            115 => 1,  // MEMORY_POOLS_SUPPORTED: cudarc then uses cuMemAllocAsync/cuMemFreeAsync
            75 => 8,   // COMPUTE_CAPABILITY_MAJOR
            76 => 0,   // COMPUTE_CAPABILITY_MINOR
            16 => 108, // MULTIPROCESSOR_COUNT
            41 => 1,   // UNIFIED_ADDRESSING
            _ => {
                warn(
                    None,
                    &format!("cuDeviceGetAttribute: attribute {attribute} is not modelled by the double"),
                );
                return INVALID_VALUE;
            }
        };
        // SAFETY: `value` was checked non-null above; it is the caller's out-parameter, writable (the API's contract).
        unsafe { *value = v };
        SUCCESS
    })
}

/// Retains the primary context of a visible device.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(ctx: *mut Handle, device: c_int) -> CuResult {
    entry("cuDevicePrimaryCtxRetain", UNKNOWN, || {
        require_init!();
        non_null!(ctx);
        let d = attempt!(check_device(device));
        let mut r = lock(&RETAINED);
        if r.len() < device_count() {
            r.resize(device_count(), 0);
        }
        r[d] += 1;
        // SAFETY: `ctx` was checked non-null above; it is the caller's out-parameter, writable (the API's contract).
        unsafe { *ctx = CTX_BASE + d * CTX_STEP };
        SUCCESS
    })
}

/// Releases a primary context; when the last user lets go, the context is destroyed and
/// with it the device's memory: frees still deferred behind unfinished work happen now,
/// and any other allocation left is reported: it was leaked, most likely by a buffer
/// dropped on a thread with no current context.
#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(device: c_int) -> CuResult {
    entry("cuDevicePrimaryCtxRelease_v2", UNKNOWN, || {
        require_init!();
        let d = attempt!(check_device(device));
        let mut r = lock(&RETAINED);
        match r.get_mut(d) {
            Some(n) if *n > 0 => *n -= 1,
            _ => return INVALID_CONTEXT,
        }
        if r[d] == 0 {
            drop(r);
            for p in stream::forget_frees(d) {
                memory::free(p);
            }
            let (count, bytes) = memory::free_device(d);
            if count > 0 {
                warn(
                    None,
                    &format!(
                        "the context of device {d} was destroyed with {count} allocation(s) ({bytes} bytes) \
                         never freed: leaked (a buffer dropped on a thread with no current context?)"
                    ),
                );
            }
        }
        SUCCESS
    })
}

/// Makes `ctx` (0: none) current on this thread.
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetCurrent(ctx: Handle) -> CuResult {
    entry("cuCtxSetCurrent", UNKNOWN, || {
        require_init!();
        if ctx != 0 && context_device(ctx).is_none() {
            warn(None, &format!("cuCtxSetCurrent({ctx:#x}): not a context of the double"));
            return INVALID_CONTEXT;
        }
        CURRENT.with(|c| c.set(ctx));
        SUCCESS
    })
}

/// The context current on this thread (0: none).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetCurrent(ctx: *mut Handle) -> CuResult {
    entry("cuCtxGetCurrent", UNKNOWN, || {
        require_init!();
        non_null!(ctx);
        // SAFETY: `ctx` was checked non-null above; it is the caller's out-parameter, writable (the API's contract).
        unsafe { *ctx = CURRENT.with(Cell::get) };
        SUCCESS
    })
}

/// Blocks until every stream of the current context's device has finished its work
/// (for ever if some never does).
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSynchronize() -> CuResult {
    entry("cuCtxSynchronize", UNKNOWN, || {
        require_init!();
        match current_device() {
            Some(d) => {
                let _blocked = crate::teardown::blocking("cuCtxSynchronize");
                stream::wait_device(d);
                SUCCESS
            }
            None => INVALID_CONTEXT,
        }
    })
}

/// A fresh handle for a stream or event.
fn new_handle() -> Handle {
    NEXT_HANDLE.fetch_add(0x10, Ordering::Relaxed)
}

/// Makes a stream of the current context's device.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamCreate(stream: *mut Handle, _flags: c_uint) -> CuResult {
    entry("cuStreamCreate", UNKNOWN, || {
        require_init!();
        non_null!(stream);
        let d = attempt!(current_device().ok_or(INVALID_CONTEXT));
        let h = new_handle();
        lock(&STREAMS).insert(h, d);
        // SAFETY: `stream` was checked non-null above; it is the caller's out-parameter, writable (the API's contract).
        unsafe { *stream = h };
        SUCCESS
    })
}

/// Destroys a stream: the handle goes at once; work still queued on it finishes (or
/// stays stuck) as the real driver lets it.
#[unsafe(no_mangle)]
pub extern "C" fn cuStreamDestroy_v2(stream: Handle) -> CuResult {
    entry("cuStreamDestroy_v2", UNKNOWN, || {
        require_init!();
        match lock(&STREAMS).remove(&stream) {
            Some(_) => SUCCESS,
            None => INVALID_HANDLE,
        }
    })
}

/// Blocks until the work issued on the stream so far is done: for ever if it never is
/// (a collective whose peer never comes), as on a GPU.
#[unsafe(no_mangle)]
pub extern "C" fn cuStreamSynchronize(stream: Handle) -> CuResult {
    entry("cuStreamSynchronize", UNKNOWN, || {
        require_init!();
        let _blocked = crate::teardown::blocking("cuStreamSynchronize");
        stream::wait_issued(attempt!(stream_key(stream)));
        SUCCESS
    })
}

/// CUDA_SUCCESS when the stream is idle, CUDA_ERROR_NOT_READY while work is unfinished.
#[unsafe(no_mangle)]
pub extern "C" fn cuStreamQuery(stream: Handle) -> CuResult {
    entry("cuStreamQuery", UNKNOWN, || {
        require_init!();
        if stream::idle(attempt!(stream_key(stream))) {
            SUCCESS
        } else {
            NOT_READY
        }
    })
}

/// Orders the stream after the event: work issued on `stream` from now on starts once the
/// work before the event's record is done (nothing to wait for if it never was recorded).
#[unsafe(no_mangle)]
pub extern "C" fn cuStreamWaitEvent(stream: Handle, event: Handle, _flags: c_uint) -> CuResult {
    entry("cuStreamWaitEvent", UNKNOWN, || {
        require_init!();
        let key = attempt!(stream_key(stream));
        if let Some((on, mark)) = attempt!(recorded(event)) {
            stream::wait_for(key, on, mark);
        }
        SUCCESS
    })
}

/// Makes an event (never recorded: complete).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventCreate(event: *mut Handle, _flags: c_uint) -> CuResult {
    entry("cuEventCreate", UNKNOWN, || {
        require_init!();
        non_null!(event);
        attempt!(current_device().ok_or(INVALID_CONTEXT));
        let h = new_handle();
        lock(&EVENTS).insert(h, Event::default());
        // SAFETY: `event` was checked non-null above; it is the caller's out-parameter, writable (the API's contract).
        unsafe { *event = h };
        SUCCESS
    })
}

/// Records the event on the stream: it completes when the work issued before it does.
#[unsafe(no_mangle)]
pub extern "C" fn cuEventRecord(event: Handle, stream: Handle) -> CuResult {
    entry("cuEventRecord", UNKNOWN, || {
        require_init!();
        let key = attempt!(stream_key(stream));
        match lock(&EVENTS).get_mut(&event) {
            Some(e) => {
                e.recorded = Some((key, stream::mark(key)));
                SUCCESS
            }
            None => INVALID_HANDLE,
        }
    })
}

/// Where `event` was recorded, if it was (`Err`: not an event).
fn recorded(event: Handle) -> Result<Option<(Key, u64)>, CuResult> {
    lock(&EVENTS).get(&event).map(|e| e.recorded).ok_or(INVALID_HANDLE)
}

/// CUDA_SUCCESS when the work before the event's record is done (or it was never
/// recorded), CUDA_ERROR_NOT_READY while it is not.
#[unsafe(no_mangle)]
pub extern "C" fn cuEventQuery(event: Handle) -> CuResult {
    entry("cuEventQuery", UNKNOWN, || {
        require_init!();
        match attempt!(recorded(event)) {
            Some((key, mark)) if !stream::done_before(key, mark) => NOT_READY,
            _ => SUCCESS,
        }
    })
}

/// Blocks until the work before the event's record is done (for ever if it never is).
#[unsafe(no_mangle)]
pub extern "C" fn cuEventSynchronize(event: Handle) -> CuResult {
    entry("cuEventSynchronize", UNKNOWN, || {
        require_init!();
        if let Some((key, mark)) = attempt!(recorded(event)) {
            let _blocked = crate::teardown::blocking("cuEventSynchronize");
            stream::wait_before(key, mark);
        }
        SUCCESS
    })
}

/// Destroys an event.
#[unsafe(no_mangle)]
pub extern "C" fn cuEventDestroy_v2(event: Handle) -> CuResult {
    entry("cuEventDestroy_v2", UNKNOWN, || {
        require_init!();
        match lock(&EVENTS).remove(&event) {
            Some(_) => SUCCESS,
            None => INVALID_HANDLE,
        }
    })
}

/// Allocates device memory in stream order: once the stream's earlier work is done.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync(dptr: *mut DevicePtr, size: usize, stream: Handle) -> CuResult {
    entry("cuMemAllocAsync", UNKNOWN, || {
        require_init!();
        non_null!(dptr);
        let key = match stream_key(stream) {
            Ok(k) => k,
            Err(e) => {
                warn(
                    None,
                    &format!("cuMemAllocAsync({size} bytes): no CUDA context current on this thread"),
                );
                return e;
            }
        };
        if size == 0 {
            warn(
                None,
                "cuMemAllocAsync of 0 bytes (the driver refuses a 0-byte allocation)",
            );
            return INVALID_VALUE;
        }
        let _blocked = crate::teardown::blocking("cuMemAllocAsync");
        stream::wait_issued(key);
        match memory::alloc(size, key.device) {
            Some(p) => {
                // SAFETY: `dptr` was checked non-null above; it is the caller's out-parameter, writable (the API's contract).
                unsafe { *dptr = p as DevicePtr };
                SUCCESS
            }
            None => {
                warn(None, &format!("cuMemAllocAsync: out of (host) memory for {size} bytes"));
                OUT_OF_MEMORY
            }
        }
    })
}

/// Frees device memory in stream order, without blocking: at once on an idle stream,
/// else when the work issued before the free is done (or dropped by an abort).
///
/// On the NULL stream this needs a current context, which cudarc's `CudaSlice::drop`
/// does not make sure of: dropped on a thread with no current context, the free fails,
/// cudarc keeps the error in the context's `error_state` (to resurface from some later,
/// unrelated call), and the memory leaks. Said loudly here.
#[unsafe(no_mangle)]
pub extern "C" fn cuMemFreeAsync(dptr: DevicePtr, stream: Handle) -> CuResult {
    entry("cuMemFreeAsync", UNKNOWN, || {
        require_init!();
        let key = match stream_key(stream) {
            Ok(k) => k,
            Err(e) => {
                if e == INVALID_CONTEXT {
                    warn(
                        None,
                        &format!(
                            "cuMemFreeAsync({dptr:#x}) on a thread with no current CUDA context: the free fails \
                             and the memory leaks. cudarc hides this error (CudaSlice::drop stores it in the \
                             context's error_state, and a later unrelated call returns it): bind the context \
                             (ctx.bind_to_thread()) on the thread that drops device buffers"
                        ),
                    );
                }
                return e;
            }
        };
        let ptr = dptr as usize;
        if memory::starting_at(ptr).is_none() || stream::free_pending(ptr) {
            warn(
                None,
                &format!("cuMemFreeAsync({dptr:#x}): not the start of a live device allocation"),
            );
            return INVALID_VALUE;
        }
        stream::free_after(key, ptr);
        SUCCESS
    })
}

/// A copy to or from device memory, once the stream's earlier work is done: `device`
/// (one of `dst` and `src`) must lie in one live allocation.
fn copy(name: &str, dst: usize, src: usize, bytes: usize, device: usize, stream: Handle) -> CuResult {
    let key = match stream_key(stream) {
        Ok(k) => k,
        Err(e) => {
            warn(
                None,
                &format!("{name}: no CUDA context current on this thread (or unknown stream)"),
            );
            return e;
        }
    };
    if bytes == 0 {
        return SUCCESS;
    }
    if dst == 0 || src == 0 {
        warn(None, &format!("{name}: NULL pointer"));
        return INVALID_VALUE;
    }
    if let Err(why) = memory::check(device, bytes) {
        warn(None, &format!("{name}: {why}"));
        return INVALID_VALUE;
    }
    let _blocked = crate::teardown::blocking(name);
    stream::wait_issued(key);
    // SAFETY: the device side is checked; the host side is the caller's promise, as with
    // the real driver.
    unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, bytes) };
    SUCCESS
}

/// Device to device: after the stream's work (the double copies at once, in order).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoDAsync_v2(
    dst: DevicePtr,
    src: DevicePtr,
    bytes: usize,
    stream: Handle,
) -> CuResult {
    entry("cuMemcpyDtoDAsync_v2", UNKNOWN, || {
        require_init!();
        if bytes > 0
            && let Err(why) = memory::check(src as usize, bytes)
        {
            warn(None, &format!("cuMemcpyDtoDAsync: the source {why}"));
            return INVALID_VALUE;
        }
        copy(
            "cuMemcpyDtoDAsync",
            dst as usize,
            src as usize,
            bytes,
            dst as usize,
            stream,
        )
    })
}

/// Host to device: synchronous for the host (pageable memory), after the stream's work.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2(
    dst: DevicePtr,
    src: *const c_void,
    bytes: usize,
    stream: Handle,
) -> CuResult {
    entry("cuMemcpyHtoDAsync_v2", UNKNOWN, || {
        require_init!();
        copy(
            "cuMemcpyHtoDAsync",
            dst as usize,
            src as usize,
            bytes,
            dst as usize,
            stream,
        )
    })
}

/// Device to host: synchronous for the host (pageable memory), after the stream's work.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2(
    dst: *mut c_void,
    src: DevicePtr,
    bytes: usize,
    stream: Handle,
) -> CuResult {
    entry("cuMemcpyDtoHAsync_v2", UNKNOWN, || {
        require_init!();
        copy(
            "cuMemcpyDtoHAsync",
            dst as usize,
            src as usize,
            bytes,
            src as usize,
            stream,
        )
    })
}

/// Sets `count` bytes to `value`, after the stream's earlier work.
#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD8Async(dst: DevicePtr, value: u8, count: usize, stream: Handle) -> CuResult {
    entry("cuMemsetD8Async", UNKNOWN, || {
        require_init!();
        let key = attempt!(stream_key(stream));
        if count == 0 {
            return SUCCESS;
        }
        if let Err(why) = memory::check(dst as usize, count) {
            warn(None, &format!("cuMemsetD8Async: {why}"));
            return INVALID_VALUE;
        }
        let _blocked = crate::teardown::blocking("cuMemsetD8Async");
        stream::wait_issued(key);
        match memory::write_checked(dst as usize, &vec![value; count]) {
            Ok(()) => SUCCESS,
            Err(why) => {
                warn(None, &format!("cuMemsetD8Async: {why}"));
                INVALID_VALUE
            }
        }
    })
}

/// The texts of the real driver for the codes the double returns.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorString(error: CuResult, text: *mut *const c_char) -> CuResult {
    entry("cuGetErrorString", UNKNOWN, || {
        non_null!(text);
        let s: &'static CStr = match error {
            SUCCESS => c"no error",
            INVALID_VALUE => c"invalid argument",
            OUT_OF_MEMORY => c"out of memory",
            NOT_INITIALIZED => c"initialization error",
            NO_DEVICE => c"no CUDA-capable device is detected",
            INVALID_DEVICE => c"invalid device ordinal",
            INVALID_CONTEXT => c"invalid device context",
            INVALID_HANDLE => c"invalid resource handle",
            NOT_READY => c"device not ready",
            UNKNOWN => c"unknown error",
            _ => {
                // SAFETY: `text` was checked non-null above; it is the caller's out-parameter, writable (the API's contract).
                unsafe { *text = std::ptr::null() };
                return INVALID_VALUE;
            }
        };
        // SAFETY: `text` was checked non-null above; it is the caller's out-parameter, writable (the API's contract).
        unsafe { *text = s.as_ptr() };
        SUCCESS
    })
}

mod kernels;
