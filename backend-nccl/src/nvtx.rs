//! NVTX ranges: named spans that Nsight Systems (`nsys profile`) shows on its timeline
//! beside the GPU's kernels, so a lesson's phases (the collective, the check, the timed
//! runs) and each NCCL call can be found there.
//!
//! NVTX's library (`libnvToolsExt.so.1`, shipped with the CUDA toolkit) is opened at
//! the first range, with `dlopen`; where it is not there, ranges do nothing. Nothing
//! here fails or panics. Without a profiler attached, NVTX's calls return at once.
//!
//! ```ignore
//! let _range = workbook_nccl::nvtx::range("ncclAllReduce"); // popped when dropped
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
    use std::ffi::CString;

    /// Whether NVTX's library can be opened, asked of the loader apart from `load`.
    fn loader_finds_nvtx() -> bool {
        ["libnvToolsExt.so.1", "libnvToolsExt.so"].iter().any(|name| {
            let name = CString::new(*name).unwrap();
            // SAFETY: a NUL-terminated name; a handle found is closed again at once (the
            // library stays loaded while `load`'s handle holds it).
            unsafe {
                let h = libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
                !h.is_null() && libc::dlclose(h) == 0
            }
        })
    }

    #[test]
    fn a_range_is_opened_exactly_when_nvtx_is_there_whatever_its_name() {
        // Where the library is, every range is pushed (a name with a NUL in it too: cut,
        // not dropped) and popped when dropped; where it is not, no range is open and no
        // call is made.
        let there = super::available();
        assert_eq!(there, loader_finds_nvtx(), "available() disagrees with the loader");
        let outer = super::range("outer");
        assert_eq!(outer.open, there);
        {
            let inner = super::range("in\0ner");
            assert_eq!(inner.open, there);
            let empty = super::range("");
            assert_eq!(empty.open, there);
        }
        drop(outer);
        assert_eq!(super::FNS.get().map(Option::is_some), Some(there));
    }
}
