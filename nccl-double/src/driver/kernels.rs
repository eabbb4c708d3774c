//! Kernels: modules loaded from PTX (`cuModuleLoadData`), their functions
//! (`cuModuleGetFunction`) and launches (`cuLaunchKernel`), which is what a program that
//! carries its own PTX calls (cudarc's `result::module` and `result::launch_kernel`).
//!
//! The double runs no GPU code. It reads a PTX module's entry names, and it *plays* the
//! one kernel it knows, the workbook's `workbook_spin(u64 ns)` (a layer's computation,
//! lesson 10): its stream is busy for `ns` nanoseconds once the work before it is done, as
//! on a GPU, where the kernel spins on the GPU's clock. Launching any other kernel is
//! refused with CUDA_ERROR_NOT_SUPPORTED and a line that says so.

use super::{
    CuResult, Handle, INITIALIZED, INVALID_CONTEXT, INVALID_HANDLE, INVALID_VALUE, NOT_INITIALIZED, SUCCESS, UNKNOWN,
    lock, new_handle,
};
use crate::stream;
use crate::{allowed, entry, warn};
use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_uint, c_void};
use std::sync::atomic::Ordering;
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

const INVALID_PTX: CuResult = 218;
const NOT_FOUND: CuResult = 500;
const NOT_SUPPORTED: CuResult = 801;

/// The kernel the double plays, and the longest launch it accepts (a kernel asked to
/// spin longer is surely a wrong argument).
const SPIN: &str = "workbook_spin";
const LONGEST: Duration = Duration::from_secs(600);

/// Loaded modules: the names of their entries.
static MODULES: LazyLock<Mutex<HashMap<Handle, Vec<String>>>> = LazyLock::new(|| Mutex::new(HashMap::new()));
/// Functions got from a module: the module and the entry's name.
static FUNCTIONS: LazyLock<Mutex<HashMap<Handle, (Handle, String)>>> = LazyLock::new(|| Mutex::new(HashMap::new()));

/// The entries a PTX text declares (`.entry NAME(`), or why it is not PTX.
fn entries(ptx: &str) -> Result<Vec<String>, String> {
    for directive in [".version", ".target"] {
        if !ptx.lines().any(|l| l.trim_start().starts_with(directive)) {
            return Err(format!("the module has no {directive} directive: not PTX text"));
        }
    }
    let names: Vec<String> = ptx
        .split(".entry")
        .skip(1)
        .filter_map(|rest| {
            let name: String = rest
                .trim_start()
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '$'))
                .collect();
            (!name.is_empty()).then_some(name)
        })
        .collect();
    if names.is_empty() {
        return Err("the PTX declares no .entry (no kernel)".into());
    }
    Ok(names)
}

/// Loads a module from a PTX image (a NUL-terminated text; cubins are not played).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadData(module: *mut Handle, image: *const c_void) -> CuResult {
    entry("cuModuleLoadData", UNKNOWN, || {
        require_init!();
        non_null!(module, image);
        attempt!(super::current_device().ok_or(INVALID_CONTEXT));
        // SAFETY: `image` was checked non-null; the API's contract is that a PTX image is
        // a NUL-terminated text.
        let text = unsafe { CStr::from_ptr(image.cast::<c_char>()) }.to_string_lossy();
        let names = match entries(&text) {
            Ok(names) => names,
            Err(why) => {
                warn(None, &format!("cuModuleLoadData: {why}"));
                return INVALID_PTX;
            }
        };
        let h = new_handle();
        lock(&MODULES).insert(h, names);
        // SAFETY: `module` was checked non-null above; the caller's out-parameter.
        unsafe { *module = h };
        SUCCESS
    })
}

/// The kernel `name` of a loaded module (CUDA_ERROR_NOT_FOUND if the module has none).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleGetFunction(function: *mut Handle, module: Handle, name: *const c_char) -> CuResult {
    entry("cuModuleGetFunction", UNKNOWN, || {
        require_init!();
        non_null!(function, name);
        // SAFETY: `name` was checked non-null; the API takes a NUL-terminated name.
        let name = unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned();
        match lock(&MODULES).get(&module) {
            None => return INVALID_HANDLE,
            Some(names) if !names.contains(&name) => return NOT_FOUND,
            Some(_) => {}
        }
        let h = new_handle();
        lock(&FUNCTIONS).insert(h, (module, name));
        // SAFETY: `function` was checked non-null above; the caller's out-parameter.
        unsafe { *function = h };
        SUCCESS
    })
}

/// Unloads a module: its functions go with it.
#[unsafe(no_mangle)]
pub extern "C" fn cuModuleUnload(module: Handle) -> CuResult {
    entry("cuModuleUnload", UNKNOWN, || {
        require_init!();
        if lock(&MODULES).remove(&module).is_none() {
            return INVALID_HANDLE;
        }
        lock(&FUNCTIONS).retain(|_, (m, _)| *m != module);
        SUCCESS
    })
}

/// Launches a kernel on `stream`: the double plays `workbook_spin(ns)` by keeping the
/// stream busy for `ns` once the work before it is done, and refuses any other.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuLaunchKernel(
    function: Handle,
    grid_x: c_uint,
    grid_y: c_uint,
    grid_z: c_uint,
    block_x: c_uint,
    block_y: c_uint,
    block_z: c_uint,
    _shared_bytes: c_uint,
    stream: Handle,
    params: *mut *mut c_void,
    _extra: *mut *mut c_void,
) -> CuResult {
    entry("cuLaunchKernel", UNKNOWN, || {
        require_init!();
        let key = attempt!(super::stream_key(stream));
        let Some((_, name)) = lock(&FUNCTIONS).get(&function).cloned() else {
            return INVALID_HANDLE;
        };
        if [grid_x, grid_y, grid_z, block_x, block_y, block_z].contains(&0) {
            warn(None, "cuLaunchKernel: a grid or block dimension of 0");
            return INVALID_VALUE;
        }
        if name != SPIN {
            warn(
                None,
                &format!("cuLaunchKernel: the double plays only the workbook's kernel {SPIN}, not {name}"),
            );
            return NOT_SUPPORTED;
        }
        non_null!(params);
        // SAFETY: `params` was checked non-null; for a kernel of one parameter the API
        // passes an array of one pointer, to the u64 argument.
        let arg = unsafe { *params };
        if arg.is_null() {
            warn(None, "cuLaunchKernel: NULL pointer to workbook_spin's argument");
            return INVALID_VALUE;
        }
        // SAFETY: the kernel's one argument is a u64, read where the caller put it.
        let ns = unsafe { arg.cast::<u64>().read_unaligned() };
        let time = Duration::from_nanos(ns);
        if time > LONGEST {
            warn(None, &format!("cuLaunchKernel: {SPIN} asked to spin for {time:?}"));
            return INVALID_VALUE;
        }
        stream::busy_for(key, time);
        SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use super::entries;

    #[test]
    fn a_modules_entries_are_read_from_its_ptx() {
        let ptx = ".version 7.0\n.target sm_70\n.visible .entry workbook_spin(\n .param .u64 p\n)\n{ ret; }\n";
        assert_eq!(entries(ptx).unwrap(), ["workbook_spin"]);
        assert!(entries("\x7fELF").unwrap_err().contains("not PTX"));
        assert!(
            entries(".version 7.0\n.target sm_70\n")
                .unwrap_err()
                .contains("no .entry")
        );
    }
}
