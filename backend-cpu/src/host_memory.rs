//! Buffers the other ranks of a host can read: the CPU backend's large buffers live in an
//! *arena*, one anonymous shared-memory file per rank (`memfd_create`) that every other
//! rank on the host maps at start-up, as NCCL's P2P transport maps a peer GPU's memory
//! through CUDA IPC. A collective can then copy straight from a peer's buffer into its
//! own: one copy per byte, where a message through a shared-memory slot takes two (the
//! sender's into the slot, the receiver's out of it).
//!
//! Nothing outlives the job: the arena has no name, and the kernel frees it when the last
//! process that maps it exits. Where it cannot be made or mapped (a limit on address
//! space, `/proc` hidden, `NCCL_P2P_DISABLE=1`), buffers are plain heap memory and the
//! collectives send messages, as before.

use crate::rendezvous::Store;
use anyhow::Result;
use std::collections::BTreeMap;
use std::ffi::CString;
use std::io;
use std::ops::{Deref, DerefMut};
use std::sync::{Mutex, OnceLock};

/// Buffers from this size go in the arena. Smaller ones would gain nothing (they go
/// direct, [`crate::SMALL`]) and would cost a page each.
pub const ARENA_MIN: usize = 16 << 10;
const PAGE: usize = 4096;
/// A freed block smaller than this keeps its pages (see `Arena::release`): glibc's malloc
/// keeps freed blocks up to its largest mmap threshold, 32 MiB on 64-bit systems.
const KEEP_BELOW: usize = 32 << 20;
/// What `/proc/PID/fd/N` of a rank's arena points to.
const NAME: &str = "nccl-workbook-arena";

/// This process's arena: a region of address space backed by a shared-memory file, and
/// which parts of it are free (offset → length, in pages).
struct Arena {
    base: *mut u8,
    size: usize,
    fd: libc::c_int,
    free: Mutex<BTreeMap<usize, usize>>,
}

// SAFETY: the arena's memory is handed out in disjoint blocks, each owned by one
// `HostMem`; the free list is behind a lock.
unsafe impl Send for Arena {}
unsafe impl Sync for Arena {}

static ARENA: OnceLock<Option<Arena>> = OnceLock::new();

impl Arena {
    /// An arena of twice the machine's memory (address space only: pages exist once
    /// written), or `None` where the system refuses one.
    fn create() -> Option<Arena> {
        // SAFETY: plain system calls; every result is checked.
        unsafe {
            let mut info: libc::sysinfo = std::mem::zeroed();
            if libc::sysinfo(&mut info) != 0 {
                return None;
            }
            let size = (2 * info.totalram as u128 * info.mem_unit as u128).min(1 << 44) as usize / PAGE * PAGE;
            let name = CString::new(NAME).ok()?;
            let fd = libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC);
            if fd < 0 {
                return None;
            }
            let base = match libc::ftruncate(fd, size as libc::off_t) {
                0 => libc::mmap(
                    std::ptr::null_mut(),
                    size,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_NORESERVE,
                    fd,
                    0,
                ),
                _ => libc::MAP_FAILED,
            };
            if base == libc::MAP_FAILED {
                libc::close(fd);
                return None;
            }
            Some(Arena {
                base: base.cast(),
                size,
                fd,
                free: Mutex::new(BTreeMap::from([(0, size)])),
            })
        }
    }

    /// The first free block of `bytes` (rounded up to pages), as an offset.
    fn alloc(&self, bytes: usize) -> Option<usize> {
        let len = bytes.div_ceil(PAGE) * PAGE;
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        let (&at, &room) = free.iter().find(|(_, room)| **room >= len)?;
        free.remove(&at);
        if room > len {
            free.insert(at + len, room - len);
        }
        Some(at)
    }

    /// Gives a block back: it joins its free neighbours, and a large one's pages are
    /// returned to the system (a hole in the file). A block under [`KEEP_BELOW`] keeps its
    /// pages for the next buffer, as malloc keeps them: a hole costs a page fault per page
    /// on the next use, in every rank that maps the arena (chapter 7's packed broadcast
    /// makes and drops a 121 KiB buffer per call: 1.2-1.7 ms a call with holes, against
    /// 0.2-0.3 ms on the heap, on 4 ranks of a 2-core VM).
    fn release(&self, at: usize, bytes: usize) {
        let pages = bytes.div_ceil(PAGE) * PAGE;
        if pages >= KEEP_BELOW {
            // SAFETY: the block is this arena's and no longer in use.
            unsafe {
                libc::fallocate(
                    self.fd,
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    at as libc::off_t,
                    pages as libc::off_t,
                );
            }
        }
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        let (mut start, mut len) = (at, pages);
        if let Some((&before, &room)) = free.range(..at).next_back()
            && before + room == at
        {
            free.remove(&before);
            start = before;
            len += room;
        }
        if let Some(room) = free.remove(&(at + pages)) {
            len += room;
        }
        free.insert(start, len);
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: our own mapping and file, no longer used.
        unsafe {
            libc::munmap(self.base.cast(), self.size);
            libc::close(self.fd);
        }
    }
}

/// Makes this process's arena (once), if the system allows one.
fn arena() -> Option<&'static Arena> {
    ARENA.get_or_init(Arena::create).as_ref()
}

/// Where `bytes` lie in this process's arena, as an offset: `None` when they are
/// elsewhere (a small buffer, or no arena).
pub fn offset_of(bytes: &[u8]) -> Option<usize> {
    let a = ARENA.get()?.as_ref()?;
    let at = (bytes.as_ptr() as usize).checked_sub(a.base as usize)?;
    (at + bytes.len() <= a.size).then_some(at)
}

/// A CPU-backend buffer: in the arena when it is large and there is one, else on the heap.
pub struct HostMem<T: Copy + Send + Sync + 'static> {
    mem: Mem<T>,
}

enum Mem<T> {
    Heap(Vec<T>),
    /// `len` elements at offset `at` of `arena`.
    Arena {
        arena: &'static Arena,
        at: usize,
        len: usize,
    },
}

// SAFETY: an arena block belongs to this buffer alone, as a Vec's memory does.
unsafe impl<T: Copy + Send + Sync + 'static> Send for HostMem<T> {}
unsafe impl<T: Copy + Send + Sync + 'static> Sync for HostMem<T> {}

impl<T: Copy + Send + Sync + 'static> HostMem<T> {
    /// `data`, moved into the arena when it is large enough ([`ARENA_MIN`]) and the
    /// ranks of this host share their arenas.
    pub fn new(data: Vec<T>) -> HostMem<T> {
        let bytes = std::mem::size_of_val(data.as_slice());
        let place = match ARENA.get() {
            Some(Some(a)) if bytes >= ARENA_MIN && !heap_only() => a.alloc(bytes).map(|at| (a, at)),
            _ => None,
        };
        let Some((arena, at)) = place else {
            return HostMem { mem: Mem::Heap(data) };
        };
        // SAFETY: the block is fresh, page-aligned and holds `bytes`.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), arena.base.add(at).cast::<T>(), data.len()) };
        HostMem {
            mem: Mem::Arena {
                arena,
                at,
                len: data.len(),
            },
        }
    }
}

impl<T: Copy + Send + Sync + 'static> Deref for HostMem<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match &self.mem {
            Mem::Heap(v) => v,
            // SAFETY: the block is this buffer's, page-aligned, `len` elements long.
            Mem::Arena { arena, at, len } => unsafe { std::slice::from_raw_parts(arena.base.add(*at).cast(), *len) },
        }
    }
}

impl<T: Copy + Send + Sync + 'static> DerefMut for HostMem<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match &mut self.mem {
            Mem::Heap(v) => v,
            // SAFETY: as for `deref`; `&mut self` makes it the only reference.
            Mem::Arena { arena, at, len } => unsafe {
                std::slice::from_raw_parts_mut(arena.base.add(*at).cast(), *len)
            },
        }
    }
}

impl<T: Copy + Send + Sync + 'static> Drop for HostMem<T> {
    fn drop(&mut self) {
        if let Mem::Arena { arena, at, len } = self.mem {
            arena.release(at, len * size_of::<T>());
        }
    }
}

/// `NCCL_WORKBOOK_FAULT=heap-buffers`: every buffer on the heap, as one made outside
/// the backend would be, while the arenas are still shared: the single-copy algorithms
/// must then notice and send messages (a test hook, read once).
fn heap_only() -> bool {
    static ASKED: OnceLock<bool> = OnceLock::new();
    *ASKED.get_or_init(|| crate::fault::asked("heap-buffers", None).is_some())
}

/// Another rank's arena, mapped read-only into this process.
pub struct PeerArena {
    base: *const u8,
    size: usize,
}

// SAFETY: read-only shared memory; the collectives read a region only while its owner
// has said it will not write it (see the single-copy algorithms).
unsafe impl Send for PeerArena {}
unsafe impl Sync for PeerArena {}

impl PeerArena {
    /// Maps the arena that process `pid` holds as its file `fd`, of `size` bytes, through
    /// `/proc/PID/fd/FD` (allowed between processes of one user).
    fn open(pid: u32, fd: i32, size: usize) -> io::Result<PeerArena> {
        let path = format!("/proc/{pid}/fd/{fd}");
        let target = std::fs::read_link(&path)?;
        if !target.to_string_lossy().contains(NAME) {
            return Err(io::Error::other(format!("{path} is not a rank's arena")));
        }
        let c_path = CString::new(path).map_err(io::Error::other)?;
        // SAFETY: plain system calls; every result is checked.
        unsafe {
            let f = libc::open(c_path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
            if f < 0 {
                return Err(io::Error::last_os_error());
            }
            let base = libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ,
                libc::MAP_SHARED | libc::MAP_NORESERVE,
                f,
                0,
            );
            libc::close(f);
            if base == libc::MAP_FAILED {
                return Err(io::Error::last_os_error());
            }
            Ok(PeerArena {
                base: base.cast(),
                size,
            })
        }
    }

    /// `len` bytes at `offset` of the peer's arena, or `None` outside it.
    pub fn region(&self, offset: usize, len: usize) -> Option<&[u8]> {
        let end = offset.checked_add(len)?;
        // SAFETY: inside the mapping, which lives as long as `self`.
        (end <= self.size).then(|| unsafe { std::slice::from_raw_parts(self.base.add(offset), len) })
    }
}

impl Drop for PeerArena {
    fn drop(&mut self) {
        // SAFETY: our own mapping, no longer referenced.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.size) };
    }
}

/// Makes this rank's arena and maps every other rank's, all ranks being on one host:
/// `Some(arenas)` (`arenas[rank]` is `None`) when every rank mapped every other one's,
/// `None` when any could not (every rank gets the same answer, agreed through the store),
/// or when `NCCL_P2P_DISABLE=1` asks for messages only, as it asks NCCL.
pub fn connect(store: &mut Store, rank: usize, world: usize) -> Result<Option<Vec<Option<PeerArena>>>> {
    let disabled = std::env::var("NCCL_P2P_DISABLE").is_ok_and(|v| v.trim() == "1");
    let mine = match (!disabled).then(arena).flatten() {
        Some(a) => [
            &std::process::id().to_le_bytes()[..],
            &a.fd.to_le_bytes(),
            &(a.size as u64).to_le_bytes(),
        ]
        .concat(),
        _ => vec![],
    };
    let all = store.share("cpu/arena", rank, world, &mine, "every rank's arena")?;
    let mut peers: Vec<Option<PeerArena>> = (0..world).map(|_| None).collect();
    let mut ok = !mine.is_empty();
    for (peer, theirs) in all.iter().enumerate().filter(|(p, _)| *p != rank) {
        let opened = match theirs.len() {
            16 => {
                let word = |r: std::ops::Range<usize>| theirs[r].try_into().unwrap_or([0; 4]);
                let size = u64::from_le_bytes(theirs[8..16].try_into().unwrap_or([0; 8]));
                PeerArena::open(
                    u32::from_le_bytes(word(0..4)),
                    i32::from_le_bytes(word(4..8)),
                    size as usize,
                )
                .ok()
            }
            _ => None,
        };
        ok &= opened.is_some();
        peers[peer] = opened;
    }
    let agreed = store.share(
        "cpu/arena-ok",
        rank,
        world,
        &[ok as u8],
        "whether every rank maps every arena",
    )?;
    Ok(agreed.iter().all(|v| v.as_slice() == [1]).then_some(peers))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::ManuallyDrop;

    /// An arena's bookkeeping without its memory (no file, no mapping, never dropped):
    /// what `alloc` and `release` work on, where the system refuses a real arena.
    fn bookkeeping_only(pages: usize) -> ManuallyDrop<Arena> {
        ManuallyDrop::new(Arena {
            base: std::ptr::null_mut(),
            size: pages * PAGE,
            fd: -1,
            free: Mutex::new(BTreeMap::from([(0, pages * PAGE)])),
        })
    }

    #[test]
    fn blocks_are_disjoint_and_freed_blocks_merge() {
        // A real arena where the system gives one, else the same free list without memory:
        // the blocks' bookkeeping is checked either way.
        let real = Arena::create();
        let stand_in;
        let a: &Arena = match &real {
            Some(a) => a,
            None => {
                stand_in = bookkeeping_only(64);
                &stand_in
            }
        };
        let x = a.alloc(10).unwrap();
        let y = a.alloc(PAGE + 1).unwrap();
        let z = a.alloc(PAGE).unwrap();
        assert_eq!((x, y, z), (0, PAGE, 3 * PAGE));
        a.release(y, PAGE + 1);
        assert_eq!(a.alloc(2 * PAGE), Some(PAGE), "the hole is reused");
        a.release(PAGE, 2 * PAGE);
        a.release(x, 10);
        a.release(z, PAGE);
        assert_eq!(
            *a.free.lock().unwrap(),
            BTreeMap::from([(0, a.size)]),
            "all one block again"
        );
    }

    #[test]
    fn a_large_buffer_lives_in_the_arena_and_reads_back() {
        // In the arena where there is one; on the heap where there is none (and then no
        // offset may be claimed for it). Both read back and write through.
        let in_arena = arena().is_some() && !heap_only();
        let data: Vec<i32> = (0..100_000).collect();
        let mut mem = HostMem::new(data.clone());
        assert_eq!(
            offset_of(crate::element::as_bytes(&mem[..])).is_some(),
            in_arena,
            "a large buffer in the arena exactly when there is one"
        );
        assert_eq!(&mem[..], &data[..]);
        mem[7] = -1;
        assert_eq!(mem[7], -1);
        let small = HostMem::new(vec![1i32; 10]);
        assert_eq!(offset_of(crate::element::as_bytes(&small[..])), None);
        assert_eq!(&small[..], &[1; 10]);
    }
}
