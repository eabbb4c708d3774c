//! The CUDA driver half: devices, primary contexts, the thread's current context,
//! streams and events (handles only), and device memory as tracked host memory.

use crate::{allowed, guard};
use std::cell::Cell;
use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

pub type CuResult = c_uint;
pub const SUCCESS: CuResult = 0;
pub const INVALID_VALUE: CuResult = 1;
pub const NOT_INITIALIZED: CuResult = 3;
pub const NO_DEVICE: CuResult = 100;
pub const INVALID_DEVICE: CuResult = 101;
pub const INVALID_CONTEXT: CuResult = 201;

/// A context handle is `CTX_BASE + device`: one primary context per device.
const CTX_BASE: usize = 0xC0_0000;

thread_local! {
    /// The context current on this thread (0: none), as the real driver keeps it.
    static CURRENT: Cell<usize> = const { Cell::new(0) };
}

/// Live device allocations: start address -> (length, device).
static ALLOCS: Mutex<BTreeMap<usize, (usize, usize)>> = Mutex::new(BTreeMap::new());
static HANDLES: AtomicU64 = AtomicU64::new(0x5000);

/// How many devices the double pretends to have (`NCCL_DOUBLE_DEVICES`, default 4).
pub fn device_count() -> usize {
    std::env::var("NCCL_DOUBLE_DEVICES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4)
}

/// The device whose context is current on this thread, if any.
pub fn current_device() -> Option<usize> {
    let ctx = CURRENT.with(Cell::get);
    (ctx >= CTX_BASE && ctx < CTX_BASE + device_count()).then(|| ctx - CTX_BASE)
}

/// Checks that `[ptr, ptr+len)` lies in one live allocation; returns its device.
pub fn device_range(ptr: usize, len: usize) -> Result<usize, String> {
    let allocs = ALLOCS.lock().unwrap_or_else(|p| p.into_inner());
    match allocs.range(..=ptr).next_back() {
        Some((start, (size, dev))) if ptr + len <= start + size => Ok(*dev),
        Some((start, (size, _))) if ptr < start + size => Err(format!(
            "{len} bytes at {ptr:#x} run past the end of the allocation at {start:#x} ({size} bytes)"
        )),
        _ => Err(format!(
            "{ptr:#x} is not device memory (not allocated by cuMemAlloc, or freed)"
        )),
    }
}

fn new_handle() -> usize {
    HANDLES.fetch_add(1, Ordering::Relaxed) as usize
}

#[unsafe(no_mangle)]
pub extern "C" fn cuInit(_flags: c_uint) -> CuResult {
    if allowed() { SUCCESS } else { NO_DEVICE }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDriverGetVersion(v: *mut c_int) -> CuResult {
    guard(INVALID_VALUE, || {
        unsafe { *v = 12000 };
        SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CuResult {
    if !allowed() {
        return NOT_INITIALIZED;
    }
    unsafe { *count = device_count() as c_int };
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGet(dev: *mut c_int, ordinal: c_int) -> CuResult {
    if !allowed() {
        return NOT_INITIALIZED;
    }
    if ordinal < 0 || ordinal as usize >= device_count() {
        return INVALID_DEVICE;
    }
    unsafe { *dev = ordinal };
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: c_int) -> CuResult {
    let text = format!("NCCL test double GPU {dev} (host memory)\0");
    let n = text.len().min(len.max(0) as usize);
    if n == 0 {
        return INVALID_VALUE;
    }
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr().cast(), name, n);
        *name.add(n - 1) = 0;
    }
    SUCCESS
}

/// Every attribute reads 0: in particular no memory pools, so cudarc uses plain
/// cuMemAlloc/cuMemFree.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetAttribute(v: *mut c_int, _attr: c_uint, _dev: c_int) -> CuResult {
    unsafe { *v = 0 };
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(ctx: *mut usize, dev: c_int) -> CuResult {
    if dev < 0 || dev as usize >= device_count() {
        return INVALID_DEVICE;
    }
    unsafe { *ctx = CTX_BASE + dev as usize };
    SUCCESS
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(_dev: c_int) -> CuResult {
    SUCCESS
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetCurrent(ctx: usize) -> CuResult {
    CURRENT.with(|c| c.set(ctx));
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetCurrent(ctx: *mut usize) -> CuResult {
    unsafe { *ctx = CURRENT.with(Cell::get) };
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetDevice(dev: *mut c_int) -> CuResult {
    match current_device() {
        Some(d) => {
            unsafe { *dev = d as c_int };
            SUCCESS
        }
        None => INVALID_CONTEXT,
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSynchronize() -> CuResult {
    if current_device().is_some() {
        SUCCESS
    } else {
        INVALID_CONTEXT
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamCreate(stream: *mut usize, _flags: c_uint) -> CuResult {
    unsafe { *stream = new_handle() };
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventCreate(event: *mut usize, _flags: c_uint) -> CuResult {
    unsafe { *event = new_handle() };
    SUCCESS
}

macro_rules! no_op {
    ($($name:ident($($arg:ident: $t:ty),*);)*) => {$(
        #[unsafe(no_mangle)]
        pub extern "C" fn $name($($arg: $t),*) -> CuResult {
            $(let _ = $arg;)*
            SUCCESS
        }
    )*};
}

// Work completes when it is issued, so every wait is already over.
no_op! {
    cuStreamDestroy_v2(s: usize);
    cuStreamSynchronize(s: usize);
    cuEventDestroy_v2(e: usize);
    cuEventRecord(e: usize, s: usize);
    cuEventSynchronize(e: usize);
    cuStreamWaitEvent(s: usize, e: usize, flags: c_uint);
}

fn alloc(dptr: *mut usize, size: usize) -> CuResult {
    let Some(dev) = current_device() else {
        return INVALID_CONTEXT;
    };
    if size == 0 {
        return INVALID_VALUE;
    }
    // Uninitialised device memory reads as 0xFF bytes: NaN as floats, so it shows.
    let mem = vec![0xFFu8; size].into_boxed_slice();
    let ptr = Box::into_raw(mem) as *mut u8 as usize;
    ALLOCS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(ptr, (size, dev));
    unsafe { *dptr = ptr };
    SUCCESS
}

fn free(ptr: usize) -> CuResult {
    if current_device().is_none() {
        eprintln!("nccl-double WARN: cuMemFree({ptr:#x}) on a thread with no current context: the memory leaks");
        return INVALID_CONTEXT;
    }
    match ALLOCS.lock().unwrap_or_else(|p| p.into_inner()).remove(&ptr) {
        Some((size, _)) => {
            drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr as *mut u8, size)) });
            SUCCESS
        }
        None => INVALID_VALUE,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut usize, size: usize) -> CuResult {
    guard(INVALID_VALUE, || alloc(dptr, size))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync(dptr: *mut usize, size: usize, _stream: usize) -> CuResult {
    guard(INVALID_VALUE, || alloc(dptr, size))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFree_v2(ptr: usize) -> CuResult {
    guard(INVALID_VALUE, || free(ptr))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFreeAsync(ptr: usize, _stream: usize) -> CuResult {
    guard(INVALID_VALUE, || free(ptr))
}

fn copy(dst: usize, src: usize, n: usize, device_side: usize) -> CuResult {
    if let Err(why) = device_range(device_side, n) {
        eprintln!("nccl-double WARN: memcpy: {why}");
        return INVALID_VALUE;
    }
    unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, n) };
    SUCCESS
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyHtoD_v2(dst: usize, src: *const c_void, n: usize) -> CuResult {
    guard(INVALID_VALUE, || copy(dst, src as usize, n, dst))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyHtoDAsync_v2(dst: usize, src: *const c_void, n: usize, _s: usize) -> CuResult {
    guard(INVALID_VALUE, || copy(dst, src as usize, n, dst))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyDtoH_v2(dst: *mut c_void, src: usize, n: usize) -> CuResult {
    guard(INVALID_VALUE, || copy(dst as usize, src, n, src))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: usize, n: usize, _s: usize) -> CuResult {
    guard(INVALID_VALUE, || copy(dst as usize, src, n, src))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD8Async(dst: usize, value: u8, n: usize, _s: usize) -> CuResult {
    guard(INVALID_VALUE, || match device_range(dst, n) {
        Ok(_) => {
            unsafe { std::ptr::write_bytes(dst as *mut u8, value, n) };
            SUCCESS
        }
        Err(_) => INVALID_VALUE,
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorString(err: CuResult, out: *mut *const c_char) -> CuResult {
    let text: &'static std::ffi::CStr = match err {
        SUCCESS => c"no error",
        INVALID_VALUE => c"invalid argument",
        NOT_INITIALIZED => c"initialization error",
        NO_DEVICE => c"no CUDA-capable device is detected",
        INVALID_DEVICE => c"invalid device ordinal",
        INVALID_CONTEXT => c"invalid device context",
        _ => c"unknown error",
    };
    unsafe { *out = text.as_ptr().cast() };
    SUCCESS
}
