//! Device memory as host memory: every allocation is an aligned host allocation whose
//! address is the `CUdeviceptr`, recorded in a table so that every use can be checked
//! (is it device memory at all, still live, on which device, is the whole range inside).

use std::alloc::Layout;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// CUDA aligns allocations to at least 256 bytes; so does the double.
const ALIGN: usize = 256;

/// One live allocation.
#[derive(Clone, Copy, Debug)]
pub struct Allocation {
    pub size: usize,
    pub device: usize,
}

/// Live allocations by start address.
static TABLE: Mutex<BTreeMap<usize, Allocation>> = Mutex::new(BTreeMap::new());

fn table() -> std::sync::MutexGuard<'static, BTreeMap<usize, Allocation>> {
    TABLE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Allocates `size` bytes for `device`, filled with 0xFF so that uninitialised floats
/// read as NaN. `None` if the host is out of memory.
pub fn alloc(size: usize, device: usize) -> Option<usize> {
    let layout = Layout::from_size_align(size.max(1), ALIGN).ok()?;
    // SAFETY: the layout has a non-zero size.
    let ptr = unsafe { std::alloc::alloc(layout) };
    if ptr.is_null() {
        return None;
    }
    // SAFETY: `ptr` is a fresh allocation of `size` bytes.
    unsafe { std::ptr::write_bytes(ptr, 0xFF, size) };
    table().insert(ptr as usize, Allocation { size, device });
    Some(ptr as usize)
}

/// Frees the allocation that starts at `ptr`; `None` if there is none.
pub fn free(ptr: usize) -> Option<Allocation> {
    let a = table().remove(&ptr)?;
    // SAFETY: `ptr` came from `alloc` with this layout and was still in the table.
    unsafe { std::alloc::dealloc(ptr as *mut u8, Layout::from_size_align_unchecked(a.size.max(1), ALIGN)) };
    Some(a)
}

/// The allocation that starts exactly at `ptr`, if it is live (what a free may be given).
pub fn starting_at(ptr: usize) -> Option<Allocation> {
    table().get(&ptr).copied()
}

/// Frees every allocation of `device` (its context is gone); returns how many there were
/// and their total size.
pub fn free_device(device: usize) -> (usize, usize) {
    let ptrs: Vec<usize> = table()
        .iter()
        .filter(|(_, a)| a.device == device)
        .map(|(p, _)| *p)
        .collect();
    let bytes = ptrs.iter().filter_map(|p| free(*p)).map(|a| a.size).sum();
    (ptrs.len(), bytes)
}

/// Checks that `[ptr, ptr + len)` lies inside one live allocation; returns its device,
/// or a sentence saying what is wrong.
pub fn check(ptr: usize, len: usize) -> Result<usize, String> {
    check_in(&table(), ptr, len)
}

/// [`check`] on a table already locked.
fn check_in(t: &BTreeMap<usize, Allocation>, ptr: usize, len: usize) -> Result<usize, String> {
    match t.range(..=ptr).next_back() {
        Some((&start, a)) if ptr - start < a.size.max(1) => {
            if len <= a.size - (ptr - start) {
                Ok(a.device)
            } else {
                Err(format!(
                    "{len} bytes at {ptr:#x} run past the end of the device allocation at {start:#x} \
                     ({} bytes, {} left from {ptr:#x})",
                    a.size,
                    a.size - (ptr - start)
                ))
            }
        }
        _ if ptr == 0 => Err("the pointer is NULL".into()),
        _ => Err(format!(
            "{ptr:#x} is not device memory: not allocated by the CUDA driver, or already freed \
             (a host pointer?)"
        )),
    }
}

/// Why device memory could not be read into host memory.
#[derive(Debug)]
pub enum Unread {
    /// The range is no longer device memory (freed, or never allocated).
    Gone(String),
    /// Host memory has no room for the copy ([`no_room`]).
    NoRoom(String),
}

/// `head` followed by bytes `[ptr, ptr + len)` of device memory, in one buffer allocated
/// fallibly (a share or a message the double publishes), checked and copied under the
/// table's lock, so that a free on another thread cannot come in between (queued NCCL
/// work reads buffers later, on a worker).
pub fn read_after(head: &[u8], ptr: usize, len: usize) -> Result<Vec<u8>, Unread> {
    let mut out = Vec::new();
    out.try_reserve_exact(head.len() + len)
        .map_err(|_| Unread::NoRoom(no_room(head.len() + len)))?;
    out.extend_from_slice(head);
    if len == 0 {
        return Ok(out);
    }
    let held = table();
    check_in(&held, ptr, len).map_err(Unread::Gone)?;
    // SAFETY: the range was checked above, under the table's lock, which a free takes too.
    out.extend_from_slice(unsafe { std::slice::from_raw_parts(ptr as *const u8, len) });
    Ok(out)
}

/// A copy of `data` in host memory, or why there is none: the double keeps its "device"
/// memory and its working copies in the host's memory, and a process limited in address
/// space (`ulimit -v`) may have no room for one more; that must end in an error, never in
/// an allocation abort.
pub fn try_copy(data: &[u8]) -> Result<Vec<u8>, String> {
    let mut v = Vec::new();
    v.try_reserve_exact(data.len()).map_err(|_| no_room(data.len()))?;
    v.extend_from_slice(data);
    Ok(v)
}

/// Why a working copy of `bytes` bytes could not be made.
pub fn no_room(bytes: usize) -> String {
    format!(
        "the test double has no host memory left for a working copy of {bytes} bytes (it keeps device memory in \
         the host's: is the address space limited, ulimit -v?)"
    )
}

/// Writes `data` at `ptr` if the range is still live device memory (see [`read_after`]).
pub fn write_checked(ptr: usize, data: &[u8]) -> Result<(), String> {
    let held = table();
    check_in(&held, ptr, data.len())?;
    write(ptr, data);
    Ok(())
}

/// Writes `data` at `ptr`. The range must have passed [`check`].
pub fn write(ptr: usize, data: &[u8]) {
    if data.is_empty() {
        return;
    }
    // SAFETY: the caller checked that the range lies inside a live allocation; `copy`
    // allows `data` to overlap it.
    unsafe { std::ptr::copy(data.as_ptr(), ptr as *mut u8, data.len()) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_checked_and_fresh_memory_is_nan() {
        let p = alloc(16, 2).unwrap();
        assert_eq!(p % ALIGN, 0);
        assert_eq!(check(p, 16), Ok(2));
        assert_eq!(check(p + 8, 8), Ok(2));
        assert!(check(p + 8, 9).unwrap_err().contains("run past the end"));
        let f = f32::from_ne_bytes(read_after(&[], p, 4).unwrap().try_into().unwrap());
        assert!(f.is_nan());
        let host = [0u8; 4];
        assert!(
            check(host.as_ptr() as usize, 4)
                .unwrap_err()
                .contains("not device memory")
        );
        assert_eq!(free(p).map(|a| a.size), Some(16));
        assert!(check(p, 1).is_err());
        assert!(free(p).is_none());
    }
}
