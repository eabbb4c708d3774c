//! The channel files in `/dev/shm`: named after their maker's pid, made by the sender on
//! first use (locked, reserved, mapped, renamed ready), opened by the receiver, their
//! large regions reserved when first needed, descriptors kept aside for them, and the
//! files of ended or dead processes removed; what `/dev/shm` holds and how much a job
//! takes, and the test hooks that fake a full one.

use super::ShmLink;
use super::layout::{ALWAYS_BYTES, CHANNEL_BYTES, Channel, MAGIC, region};
use super::wait::process_alive;
use crate::transport::protocol::Protocol;
use anyhow::{Result, bail};
use std::ffi::CString;
use std::io;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::time::{Duration, Instant};

/// Where channel files live, and how their names start: `nccl-workbook-<creator's
/// pid>-<from>-to-<to>`. The pid says whose a file is, so that files of dead processes
/// can be found and removed.
const DIR: &str = "/dev/shm";
const PREFIX: &str = "nccl-workbook-";

impl Channel {
    /// Maps the channel file at `path` (creating and sizing it when `create`).
    pub(super) fn map(path: &str, create: bool) -> io::Result<Channel> {
        let c_path = CString::new(path).map_err(io::Error::other)?;
        let flags = if create {
            libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC
        } else {
            libc::O_RDWR | libc::O_CLOEXEC
        };
        // SAFETY: plain system calls on a file we name; every result is checked.
        unsafe {
            let fd = libc::open(c_path.as_ptr(), flags, 0o600);
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            // The creator holds a shared lock while it lives: the kernel drops it when the
            // process ends, however it ends, and every namespace sees it (a pid does not).
            if create && libc::flock(fd, libc::LOCK_SH) != 0 {
                let e = io::Error::last_os_error();
                libc::close(fd);
                libc::unlink(c_path.as_ptr());
                return Err(e);
            }
            // Reserve the memory now: a file only sized (ftruncate) on a full tmpfs would
            // map fine and then kill this process with SIGBUS at its first write.
            if create {
                let r = match fault_shm_full() {
                    true => libc::ENOSPC,
                    // The part every message uses; the large slots and the LL and LL128
                    // rings are reserved by the sender when first needed (`reserve`).
                    false => libc::posix_fallocate(fd, 0, ALWAYS_BYTES as libc::off_t),
                };
                if r != 0 {
                    libc::close(fd);
                    libc::unlink(c_path.as_ptr());
                    return Err(match r {
                        libc::ENOSPC => io::Error::other(full_message()),
                        r => io::Error::from_raw_os_error(r),
                    });
                }
            }
            let base = libc::mmap(
                std::ptr::null_mut(),
                CHANNEL_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                // Not MAP_POPULATE, which would reserve the regions not used yet: the
                // part every message uses is populated below, the others when reserved.
                libc::MAP_SHARED,
                fd,
                0,
            );
            let lock = match create {
                true => fd,
                false => {
                    libc::close(fd);
                    -1
                }
            };
            if base == libc::MAP_FAILED {
                let e = io::Error::last_os_error();
                if lock >= 0 {
                    libc::close(lock);
                }
                return Err(e);
            }
            let channel = Channel {
                base: base.cast(),
                lock,
            };
            // Every page of the part every message uses mapped now, not at its first use:
            // a page touched for the first time in a timed run costs a fault on each side.
            channel.populate(0..ALWAYS_BYTES);
            if create {
                channel.header().magic.store(MAGIC, Release);
            } else if channel.header().magic.load(Acquire) != MAGIC {
                return Err(io::Error::other(format!("{path} is not a channel of this program")));
            }
            Ok(channel)
        }
    }

    /// Maps the pages of `range` now (reserved already: no page is made here, so no
    /// `SIGBUS` on a full `/dev/shm`). Where the kernel lacks `MADV_POPULATE_WRITE`
    /// (before 5.14) they are mapped at their first use instead.
    pub(super) fn populate(&self, range: std::ops::Range<usize>) {
        // SAFETY: the range lies inside this channel's mapping; madvise only maps pages.
        unsafe {
            libc::madvise(
                self.base.add(range.start).cast(),
                range.end - range.start,
                libc::MADV_POPULATE_WRITE,
            );
        }
    }
}

impl ShmLink {
    /// Reserves the region of `out` that `p` writes (its ring, or the large slots), the
    /// first time this side needs it: a channel that carries small messages alone takes
    /// [`ALWAYS_BYTES`] of `/dev/shm`, not [`CHANNEL_BYTES`]. Reserved with
    /// `posix_fallocate`, so a full `/dev/shm` is an error here, in one line, never a
    /// `SIGBUS` at a write; then flagged for the receiver ([`Header::reserved`](super::layout::Header::reserved)).
    pub(super) fn reserve(&self, p: Protocol) -> io::Result<()> {
        let i = p as usize;
        if self.reserved[i].load(Relaxed) {
            return Ok(());
        }
        let out = self.out()?;
        let range = region(p);
        let r = match fault_shm_full() {
            true => libc::ENOSPC,
            // SAFETY: `lock` is this side's open descriptor of the file it made (the
            // sender makes `out`); the range lies inside the channel.
            false => unsafe {
                libc::posix_fallocate(
                    out.lock,
                    range.start as libc::off_t,
                    (range.end - range.start) as libc::off_t,
                )
            },
        };
        match r {
            0 => {}
            libc::ENOSPC => return Err(io::Error::other(full_message())),
            r => return Err(io::Error::from_raw_os_error(r)),
        }
        out.populate(range);
        out.header().reserved[i].store(1, Release);
        self.reserved[i].store(true, Relaxed);
        Ok(())
    }
}

/// Whether `e` says this process (or the system) has no descriptor left to open a file.
fn out_of_descriptors(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

/// Gives one descriptor of the [`RESERVE`] back, for an open to retry at once; false
/// when none is left.
fn release_reserve() -> bool {
    match RESERVE.lock().unwrap_or_else(|p| p.into_inner()).pop() {
        Some(fd) => {
            // SAFETY: a descriptor of the reserve, opened by `reserve_descriptors`, closed once.
            unsafe { libc::close(fd) };
            true
        }
        None => false,
    }
}

/// Descriptors held aside from start-up (`/dev/null` opened), so that a channel made or
/// opened on first use finds one even when the rest of the process took them all (the
/// store's host, say, serving many connections under a low `ulimit -n`): eagerly, every
/// channel was open before the store served anyone else.
static RESERVE: Mutex<Vec<libc::c_int>> = Mutex::new(Vec::new());

/// Fills the [`RESERVE`] up to two descriptors, as far as the limit allows.
pub(super) fn reserve_descriptors() {
    let mut reserve = RESERVE.lock().unwrap_or_else(|p| p.into_inner());
    while reserve.len() < 2 {
        // SAFETY: opens a file by a valid C string; the result is checked.
        let fd = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        if fd < 0 {
            return;
        }
        reserve.push(fd);
    }
}

/// The name of the channel from rank `from` to rank `to`, made by process `owner` (the
/// sender): `/dev/shm/nccl-workbook-<owner>-<from>-to-<to>`.
fn channel_name(owner: u32, from: usize, to: usize) -> String {
    format!("{DIR}/{PREFIX}{owner}-{from}-to-{to}")
}

/// Channels this process has made (as a sender) so far: what `NCCL_DEBUG=INFO` reports,
/// and the measure that the pairs connect on first use.
static MADE: AtomicU64 = AtomicU64::new(0);

/// How many shared-memory channels this process has made so far (one per peer it sent to).
pub fn channels_made() -> u64 {
    MADE.load(Relaxed)
}

impl ShmLink {
    /// The channel this rank writes to the peer, made at the first call ([`connect`](super::connect)).
    #[inline]
    pub(super) fn out(&self) -> io::Result<&Channel> {
        match self.out.get() {
            Some(c) => Ok(c),
            None => self.make_out(),
        }
    }

    /// [`ShmLink::out`] the first time: makes the channel.
    #[inline(never)]
    fn make_out(&self) -> io::Result<&Channel> {
        let _one = self.making[0].lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = self.out.get() {
            return Ok(c);
        }
        let path = channel_name(std::process::id(), self.rank, self.peer);
        let part = format!("{path}.part");
        let make = || {
            // Not while the process removes its files to end ([`remove_on_exit`]).
            let _making = MAKING.read().unwrap_or_else(|p| p.into_inner());
            Channel::map(&part, true).and_then(|c| match std::fs::rename(&part, &path) {
                Ok(()) => Ok(c),
                Err(e) => {
                    let _ = std::fs::remove_file(&part);
                    Err(e)
                }
            })
        };
        // Out of descriptors may pass (the store closes strangers past its limit): tried
        // again until the timeout.
        let (start, mut pause) = (Instant::now(), Duration::from_micros(100));
        let made = loop {
            match make() {
                Err(e) if out_of_descriptors(&e) && release_reserve() => {}
                Err(e) if out_of_descriptors(&e) && start.elapsed() < self.timeout => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(20));
                }
                made => break made,
            }
        };
        let channel = made.map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("making the shared-memory channel {path} to rank {}: {e}", self.peer),
            )
        })?;
        MADE.fetch_add(1, Relaxed);
        reserve_descriptors();
        fault_die_in_setup(self.rank);
        Ok(self.out.get_or_init(|| channel))
    }

    /// The channel the peer writes to this rank, opened at the first call: waits until
    /// the peer has made it (at its first send), its process is gone, or the whole
    /// timeout passed with nothing made ([`connect`](super::connect)).
    #[inline]
    pub(super) fn inbox(&self) -> io::Result<&Channel> {
        match self.inbox.get() {
            Some(c) => Ok(c),
            None => self.open_inbox(),
        }
    }

    /// [`ShmLink::inbox`] the first time: opens the channel.
    #[inline(never)]
    fn open_inbox(&self) -> io::Result<&Channel> {
        let _one = self.making[1].lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = self.inbox.get() {
            return Ok(c);
        }
        let path = channel_name(self.peer_pid, self.peer, self.rank);
        let start = Instant::now();
        let mut pause = Duration::from_micros(20);
        loop {
            match Channel::map(&path, false) {
                Ok(channel) => {
                    // This rank is the channel's only other user: its name is no longer needed.
                    let _ = std::fs::remove_file(&path);
                    reserve_descriptors();
                    return Ok(self.inbox.get_or_init(|| channel));
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                // Out of descriptors may pass (the store closes strangers past its limit).
                Err(e) if out_of_descriptors(&e) && release_reserve() => continue,
                Err(e) if out_of_descriptors(&e) && start.elapsed() < self.timeout => {}
                Err(e) => {
                    return Err(io::Error::new(
                        e.kind(),
                        format!("opening rank {}'s shared-memory channel {path}: {e}", self.peer),
                    ));
                }
            }
            // The name is looked for again after the pid is seen gone: a sender may make
            // its channel, send and exit in between.
            if !process_alive(self.peer_pid) && !std::path::Path::new(&path).exists() {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("rank {} (pid {}) is gone", self.peer, self.peer_pid),
                ));
            }
            if start.elapsed() >= self.timeout {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "nothing moved for the whole timeout",
                ));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(2));
        }
    }
}

/// The pids of this job's ranks that share this host ([`remember_job`]): whose files a
/// rank that ends at once may remove once they are gone.
static JOB: std::sync::OnceLock<Vec<u32>> = std::sync::OnceLock::new();

/// Notes the pids of this job's ranks on this host, and has this process remove, if it
/// ends at once (a signal, a deadline: [`workbook_runtime::error::clean_up_at_exit`]), its
/// own channel files and those of these ranks that are gone (killed outright, they could
/// not), so that a job whose launcher was killed leaves nothing.
pub fn remember_job(pids: Vec<u32>) {
    let _ = JOB.set(pids);
    workbook_runtime::error::clean_up_at_exit(remove_on_exit);
}

/// Held (shared) while a channel file is made, taken whole by [`remove_on_exit`] and
/// never given back: no file is made after the process removed its files to end.
static MAKING: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// What [`remember_job`] registers.
fn remove_on_exit() {
    // A file being made (microseconds) is waited for, a little; then none is made again.
    let start = Instant::now();
    loop {
        match MAKING.try_write() {
            Ok(held) => {
                std::mem::forget(held);
                break;
            }
            Err(_) if start.elapsed() < Duration::from_millis(200) => std::thread::sleep(Duration::from_micros(100)),
            Err(_) => break,
        }
    }
    let me = std::process::id();
    let job = JOB.get().map(Vec::as_slice).unwrap_or_default();
    remove_files(|owner, path| owner == me || (job.contains(&owner) && !process_alive(owner) && !locked(path)));
}

/// Removes every channel file that `pids` created (the launcher, once its ranks ended).
pub fn remove_files_of(pids: &[u32]) {
    remove_files(|owner, _| pids.contains(&owner));
}

/// Removes the channel files of processes that are gone: what a job killed with its
/// launcher (or killed in the instant before its ranks opened them) left behind. A file
/// is gone only if its creator's pid is not alive *and* no process holds its lock: a job
/// in another pid namespace (a container, `unshare -p`) has pids this one cannot see,
/// but its ranks hold the locks of the files they made ([`Channel`]'s `lock`). A file
/// younger than [`SETTLING`] is left too: its creator may not hold its lock yet.
pub fn remove_dead_files() {
    remove_files(|owner, path| !process_alive(owner) && settled(path) && !locked(path));
}

/// How long a channel file may go unlocked after it is made (its creator opens it, then
/// locks it, microseconds apart).
const SETTLING: Duration = Duration::from_secs(2);

/// Whether `path` was last changed at least [`SETTLING`] ago.
fn settled(path: &std::path::Path) -> bool {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|age| age >= SETTLING)
}

/// Whether some process holds the lock of the channel file at `path` (its live creator).
fn locked(path: &std::path::Path) -> bool {
    let Ok(c_path) = CString::new(std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str())) else {
        return true;
    };
    // SAFETY: plain system calls on a path we name and a descriptor we own and close.
    unsafe {
        let fd = libc::open(c_path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW);
        if fd < 0 {
            // Gone already, or not ours to read: not ours to remove either.
            return true;
        }
        let held = libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) != 0;
        libc::close(fd);
        held
    }
}

fn remove_files(of: impl Fn(u32, &std::path::Path) -> bool) {
    let Ok(dir) = std::fs::read_dir(DIR) else {
        return;
    };
    // SAFETY: no arguments.
    let me = unsafe { libc::getuid() };
    for entry in dir.flatten() {
        let name = entry.file_name();
        let owner = name
            .to_str()
            .and_then(|n| n.strip_prefix(PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok());
        let mine = entry
            .metadata()
            .is_ok_and(|m| std::os::unix::fs::MetadataExt::uid(&m) == me);
        if let Some(owner) = owner
            && mine
            && of(owner, &entry.path())
        {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Bytes of `/dev/shm` that `ranks` ranks on one host are sure to take for their
/// channels: the pairs connect on first use ([`connect`](super::connect)), so what a job takes depends on
/// what it runs; counted here is a ring each way, two channels per rank (a ring
/// all-reduce makes one per rank, a tree one per parent and child). Collectives that
/// reach every rank from every rank (small messages sent direct, the single-copy
/// algorithms' announcements, all-to-all) connect more pairs, up to `ranks × (ranks - 1)`
/// channels; a full `/dev/shm` then fails them in one line ([`full_message`]).
pub fn bytes_for(ranks: usize) -> u64 {
    match ranks {
        0 | 1 => 0,
        2 => 2 * CHANNEL_BYTES as u64,
        _ => 2 * ranks as u64 * CHANNEL_BYTES as u64,
    }
}

/// Bytes of one channel in `/dev/shm` (reserved when it is made).
pub const fn channel_bytes() -> u64 {
    CHANNEL_BYTES as u64
}

/// `/dev/shm`'s free and total bytes.
pub fn space() -> Option<(u64, u64)> {
    let path = CString::new(DIR).ok()?;
    // SAFETY: a valid path and a zeroed struct for the answer.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return None;
    }
    let unit = st.f_frsize as u64;
    let free = st.f_bavail as u64 * unit;
    // Test hook: `NCCL_WORKBOOK_FAULT=shm-free:BYTES` says that much is free (tests cannot
    // fill the machine's /dev/shm, and 1024 ranks' rings fit in most).
    let free = crate::fault::asked("shm-free", None)
        .and_then(|v| v.first()?.parse::<u64>().ok())
        .map_or(free, |pretend| pretend.min(free));
    Some((free, st.f_blocks as u64 * unit))
}

/// What a full `/dev/shm` means for the job, in one line.
fn full_message() -> String {
    let (free, total) = space().unwrap_or((0, 0));
    format!(
        "{DIR} is full ({} free of {}): stop what fills it, start fewer ranks per host, or use --transport tcp",
        crate::units::human_bytes(free as usize),
        crate::units::human_bytes(total as usize)
    )
}

/// Test hook: `NCCL_WORKBOOK_FAULT=shm-full` makes creating a channel fail as on a full
/// `/dev/shm` (tests cannot fill the machine's).
fn fault_shm_full() -> bool {
    crate::fault::asked("shm-full", None).is_some()
}

/// Test hook: `NCCL_WORKBOOK_FAULT=die-in-shm-setup:RANK` kills that rank (SIGKILL) once
/// it has created its channels, before its peers open them.
fn fault_die_in_setup(rank: usize) {
    if crate::fault::asked("die-in-shm-setup", Some(rank)).is_some() {
        // SAFETY: sends a signal to this process.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    }
}

/// Fails unless shared memory can be used here, saying why.
pub fn available() -> Result<()> {
    if !std::path::Path::new("/dev/shm").is_dir() {
        bail!("there is no /dev/shm on this host");
    }
    Ok(())
}
