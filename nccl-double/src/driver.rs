//! The CUDA driver half: devices, primary contexts, the thread's current context,
//! streams and events, and device memory (kept by [`crate::memory`]).
//!
//! Only what cudarc 0.19 (`cuda-12000`) calls for the workbook's use is exported:
//! `CudaContext::{device_count, new, name, bind_to_thread, default_stream, new_stream}`,
//! `CudaStream::{clone_htod, alloc_zeros, clone_dtoh, memcpy_htod, memcpy_dtoh,
//! synchronize}`, dropping all of these, and `{:?}` of a `DriverError`; plus
//! `cuDriverGetVersion`. Work completes when it is issued (there are no kernels), so
//! every wait is already over, and an async copy is a copy.
//!
//! Like an A100, the devices report memory pools, so cudarc allocates with
//! `cuMemAllocAsync` and frees with `cuMemFreeAsync`, the path it takes on the real
//! cluster (a path on which dropping a buffer does not bind the context first).

use crate::{allowed, entry, memory, warn};
use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

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
pub const UNKNOWN: CuResult = 999;

/// `CUdeviceptr`.
type DevicePtr = u64;
/// `CUcontext`, `CUstream`, `CUevent`: opaque pointers, made up here.
type Handle = usize;

/// The primary context of device `d` is the handle `CTX_BASE + d * CTX_STEP`.
const CTX_BASE: usize = 0x00c0_de00_0000;
const CTX_STEP: usize = 0x1000;

/// How many devices the double pretends to have (`NCCL_DOUBLE_DEVICES`, default 4).
pub fn device_count() -> usize {
    static COUNT: OnceLock<usize> = OnceLock::new();
    *COUNT.get_or_init(|| crate::env_number("NCCL_DOUBLE_DEVICES", 4) as usize)
}

thread_local! {
    /// The context current on this thread (0: none), as the real driver keeps it.
    static CURRENT: Cell<Handle> = const { Cell::new(0) };
}

/// Retain counts of the primary contexts, by device.
static RETAINED: Mutex<Vec<usize>> = Mutex::new(Vec::new());
/// Streams and events made by the double, and the device each belongs to.
static STREAMS: Mutex<Option<HashMap<Handle, usize>>> = Mutex::new(None);
static EVENTS: Mutex<Option<HashMap<Handle, usize>>> = Mutex::new(None);
static NEXT_HANDLE: AtomicUsize = AtomicUsize::new(0x5e00_0000);

fn with_handles<R>(
    table: &Mutex<Option<HashMap<Handle, usize>>>,
    f: impl FnOnce(&mut HashMap<Handle, usize>) -> R,
) -> R {
    f(table
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert_with(HashMap::new))
}

fn retained(device: usize) -> usize {
    RETAINED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(device)
        .copied()
        .unwrap_or(0)
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
        with_handles(&STREAMS, |s| s.get(&stream).copied()).ok_or(INVALID_HANDLE)
    }
}

/// Fails with NOT_INITIALIZED unless the double may act (as the real driver does before
/// a successful cuInit).
macro_rules! require_init {
    () => {
        if !allowed() {
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

fn check_device(dev: c_int) -> Result<usize, CuResult> {
    usize::try_from(dev)
        .ok()
        .filter(|&d| d < device_count())
        .ok_or(INVALID_DEVICE)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuInit(_flags: c_uint) -> CuResult {
    entry("cuInit", UNKNOWN, || if allowed() { SUCCESS } else { NO_DEVICE })
}

/// CUDA 12.0, the version cudarc is built against here.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CuResult {
    entry("cuDriverGetVersion", UNKNOWN, || {
        non_null!(version);
        unsafe { *version = 12000 };
        SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CuResult {
    entry("cuDeviceGetCount", UNKNOWN, || {
        require_init!();
        non_null!(count);
        unsafe { *count = device_count() as c_int };
        SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGet(device: *mut c_int, ordinal: c_int) -> CuResult {
    entry("cuDeviceGet", UNKNOWN, || {
        require_init!();
        non_null!(device);
        match check_device(ordinal) {
            Ok(_) => {
                unsafe { *device = ordinal };
                SUCCESS
            }
            Err(e) => e,
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, device: c_int) -> CuResult {
    entry("cuDeviceGetName", UNKNOWN, || {
        require_init!();
        non_null!(name);
        let d = match check_device(device) {
            Ok(d) => d,
            Err(e) => return e,
        };
        if len <= 0 {
            return INVALID_VALUE;
        }
        let text = format!("NCCL test double GPU {d} (host memory)");
        let n = text.len().min(len as usize - 1);
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr().cast(), name, n);
            *name.add(n) = 0;
        }
        SUCCESS
    })
}

/// The attributes cudarc asks for, answered as an A100 would. Any other is refused
/// (with a warning) rather than answered with a made-up number.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetAttribute(value: *mut c_int, attribute: c_uint, device: c_int) -> CuResult {
    entry("cuDeviceGetAttribute", UNKNOWN, || {
        require_init!();
        non_null!(value);
        if let Err(e) = check_device(device) {
            return e;
        }
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
        unsafe { *value = v };
        SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(ctx: *mut Handle, device: c_int) -> CuResult {
    entry("cuDevicePrimaryCtxRetain", UNKNOWN, || {
        require_init!();
        non_null!(ctx);
        let d = match check_device(device) {
            Ok(d) => d,
            Err(e) => return e,
        };
        let mut r = RETAINED.lock().unwrap_or_else(|p| p.into_inner());
        if r.len() < device_count() {
            r.resize(device_count(), 0);
        }
        r[d] += 1;
        unsafe { *ctx = CTX_BASE + d * CTX_STEP };
        SUCCESS
    })
}

/// Releases a primary context; when the last user lets go, the context is destroyed and
/// with it any memory still allocated on the device, which is reported: it was leaked,
/// most likely by a buffer dropped on a thread with no current context.
#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(device: c_int) -> CuResult {
    entry("cuDevicePrimaryCtxRelease_v2", UNKNOWN, || {
        require_init!();
        let d = match check_device(device) {
            Ok(d) => d,
            Err(e) => return e,
        };
        let mut r = RETAINED.lock().unwrap_or_else(|p| p.into_inner());
        match r.get_mut(d) {
            Some(n) if *n > 0 => *n -= 1,
            _ => return INVALID_CONTEXT,
        }
        if r[d] == 0 {
            drop(r);
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

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetCurrent(ctx: *mut Handle) -> CuResult {
    entry("cuCtxGetCurrent", UNKNOWN, || {
        require_init!();
        non_null!(ctx);
        unsafe { *ctx = CURRENT.with(Cell::get) };
        SUCCESS
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSynchronize() -> CuResult {
    entry("cuCtxSynchronize", UNKNOWN, || {
        require_init!();
        if current_device().is_some() {
            SUCCESS
        } else {
            INVALID_CONTEXT
        }
    })
}

fn new_handle(table: &Mutex<Option<HashMap<Handle, usize>>>) -> Result<Handle, CuResult> {
    let d = current_device().ok_or(INVALID_CONTEXT)?;
    let h = NEXT_HANDLE.fetch_add(0x10, Ordering::Relaxed);
    with_handles(table, |t| t.insert(h, d));
    Ok(h)
}

fn drop_handle(table: &Mutex<Option<HashMap<Handle, usize>>>, h: Handle) -> CuResult {
    match with_handles(table, |t| t.remove(&h)) {
        Some(_) => SUCCESS,
        None => INVALID_HANDLE,
    }
}

fn known(table: &Mutex<Option<HashMap<Handle, usize>>>, h: Handle) -> bool {
    with_handles(table, |t| t.contains_key(&h))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamCreate(stream: *mut Handle, _flags: c_uint) -> CuResult {
    entry("cuStreamCreate", UNKNOWN, || {
        require_init!();
        non_null!(stream);
        match new_handle(&STREAMS) {
            Ok(h) => {
                unsafe { *stream = h };
                SUCCESS
            }
            Err(e) => e,
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamDestroy_v2(stream: Handle) -> CuResult {
    entry("cuStreamDestroy_v2", UNKNOWN, || {
        require_init!();
        drop_handle(&STREAMS, stream)
    })
}

/// Work completes when issued: a stream is always idle.
#[unsafe(no_mangle)]
pub extern "C" fn cuStreamSynchronize(stream: Handle) -> CuResult {
    entry("cuStreamSynchronize", UNKNOWN, || {
        require_init!();
        stream_device(stream).map_or_else(|e| e, |_| SUCCESS)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamWaitEvent(stream: Handle, event: Handle, _flags: c_uint) -> CuResult {
    entry("cuStreamWaitEvent", UNKNOWN, || {
        require_init!();
        if let Err(e) = stream_device(stream) {
            return e;
        }
        if known(&EVENTS, event) { SUCCESS } else { INVALID_HANDLE }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventCreate(event: *mut Handle, _flags: c_uint) -> CuResult {
    entry("cuEventCreate", UNKNOWN, || {
        require_init!();
        non_null!(event);
        match new_handle(&EVENTS) {
            Ok(h) => {
                unsafe { *event = h };
                SUCCESS
            }
            Err(e) => e,
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventRecord(event: Handle, stream: Handle) -> CuResult {
    entry("cuEventRecord", UNKNOWN, || {
        require_init!();
        if let Err(e) = stream_device(stream) {
            return e;
        }
        if known(&EVENTS, event) { SUCCESS } else { INVALID_HANDLE }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventDestroy_v2(event: Handle) -> CuResult {
    entry("cuEventDestroy_v2", UNKNOWN, || {
        require_init!();
        drop_handle(&EVENTS, event)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync(dptr: *mut DevicePtr, size: usize, stream: Handle) -> CuResult {
    entry("cuMemAllocAsync", UNKNOWN, || {
        require_init!();
        non_null!(dptr);
        let device = match stream_device(stream) {
            Ok(d) => d,
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
        match memory::alloc(size, device) {
            Some(p) => {
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

/// Frees device memory. On the NULL stream this needs a current context, which cudarc's
/// `CudaSlice::drop` does not make sure of: dropped on a thread with no current context,
/// the free fails, cudarc keeps the error in the context's `error_state` (to resurface
/// from some later, unrelated call), and the memory leaks. Said loudly here.
#[unsafe(no_mangle)]
pub extern "C" fn cuMemFreeAsync(dptr: DevicePtr, stream: Handle) -> CuResult {
    entry("cuMemFreeAsync", UNKNOWN, || {
        require_init!();
        if let Err(e) = stream_device(stream) {
            if e == INVALID_CONTEXT {
                warn(
                    None,
                    &format!(
                        "cuMemFreeAsync({dptr:#x}) on a thread with no current CUDA context: the free fails and \
                         the memory leaks. cudarc hides this error (CudaSlice::drop stores it in the context's \
                         error_state, and a later unrelated call returns it): bind the context \
                         (ctx.bind_to_thread()) on the thread that drops device buffers"
                    ),
                );
            }
            return e;
        }
        match memory::free(dptr as usize) {
            Some(_) => SUCCESS,
            None => {
                warn(
                    None,
                    &format!("cuMemFreeAsync({dptr:#x}): not the start of a live device allocation"),
                );
                INVALID_VALUE
            }
        }
    })
}

/// A copy to or from device memory: `device` must lie in one live allocation.
fn copy(name: &str, dst: usize, src: usize, bytes: usize, device: usize, stream: Handle) -> CuResult {
    if let Err(e) = stream_device(stream) {
        warn(
            None,
            &format!("{name}: no CUDA context current on this thread (or unknown stream)"),
        );
        return e;
    }
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
    // SAFETY: the device side is checked; the host side is the caller's promise, as with
    // the real driver.
    unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, bytes) };
    SUCCESS
}

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

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD8Async(dst: DevicePtr, value: u8, count: usize, stream: Handle) -> CuResult {
    entry("cuMemsetD8Async", UNKNOWN, || {
        require_init!();
        if let Err(e) = stream_device(stream) {
            return e;
        }
        if count == 0 {
            return SUCCESS;
        }
        match memory::check(dst as usize, count) {
            Ok(_) => {
                memory::write(dst as usize, &vec![value; count]);
                SUCCESS
            }
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
            UNKNOWN => c"unknown error",
            _ => {
                unsafe { *text = std::ptr::null() };
                return INVALID_VALUE;
            }
        };
        unsafe { *text = s.as_ptr() };
        SUCCESS
    })
}
