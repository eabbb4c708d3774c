//! NVTX ranges: named spans that Nsight Systems (`nsys profile`) shows on its timeline
//! beside the GPU's kernels, so a lesson's phases (the collective, the check, the timed
//! runs) and each NCCL call can be found there.
//!
//! NVTX's library (`libnvToolsExt.so.1`, shipped with the CUDA toolkit) is opened at
//! the first range, with `dlopen`; where it is not there, ranges do nothing. Nothing
//! here fails or panics. Without a profiler attached, NVTX's calls return at once.
//!
//! ```ignore
//! let _range = common::nvtx::range("ncclAllReduce"); // popped when dropped
//! ```

use std::ffi::{CString, c_char, c_int};
use std::sync::OnceLock;

type Push = unsafe extern "C" fn(*const c_char) -> c_int;
type Pop = unsafe extern "C" fn() -> c_int;

static FNS: OnceLock<Option<(Push, Pop)>> = OnceLock::new();

fn load() -> Option<(Push, Pop)> {
    // SAFETY: dlopen and dlsym with NUL-terminated names; the library is never closed, so
    // the functions stay valid for the life of the process. Their C types are NVTX's.
    unsafe {
        let lib = ["libnvToolsExt.so.1", "libnvToolsExt.so"].iter().find_map(|name| {
            let name = CString::new(*name).ok()?;
            let h = libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
            (!h.is_null()).then_some(h)
        })?;
        let push = libc::dlsym(lib, c"nvtxRangePushA".as_ptr());
        let pop = libc::dlsym(lib, c"nvtxRangePop".as_ptr());
        if push.is_null() || pop.is_null() {
            return None;
        }
        Some((
            std::mem::transmute::<*mut libc::c_void, Push>(push),
            std::mem::transmute::<*mut libc::c_void, Pop>(pop),
        ))
    }
}

/// Whether NVTX's library was found (opening it on the first call).
pub fn available() -> bool {
    FNS.get_or_init(load).is_some()
}

/// An NVTX range, open until dropped.
#[must_use = "the range is closed when this guard is dropped"]
pub struct Range {
    open: bool,
    /// NVTX's ranges are per thread: the guard stays on its thread (not Send).
    _here: std::marker::PhantomData<*const ()>,
}

/// Opens a range named `name` (`nvtxRangePushA`); it is closed (`nvtxRangePop`) when the
/// guard is dropped. Does nothing without NVTX's library.
pub fn range(name: &str) -> Range {
    let Some((push, _)) = FNS.get_or_init(load) else {
        return Range {
            open: false,
            _here: std::marker::PhantomData,
        };
    };
    // A name with a NUL in it is cut there.
    let name = CString::new(name.split('\0').next().unwrap_or_default()).unwrap_or_default();
    // SAFETY: a valid C string for the duration of the call; NVTX copies it.
    unsafe { push(name.as_ptr()) };
    Range {
        open: true,
        _here: std::marker::PhantomData,
    }
}

impl Drop for Range {
    fn drop(&mut self) {
        if self.open
            && let Some(Some((_, pop))) = FNS.get()
        {
            // SAFETY: closes the range this guard opened, on the thread that opened it
            // (the guard is not Send).
            unsafe { pop() };
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn ranges_do_nothing_harmful_with_or_without_the_library() {
        let _ = super::available();
        let outer = super::range("outer");
        {
            let _inner = super::range("in\0ner");
        }
        drop(outer);
    }
}
