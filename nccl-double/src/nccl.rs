//! The NCCL half: unique ids, communicators, collectives and send/recv across
//! processes, meeting through files in `/dev/shm/nccl-double-<id>/`.
//!
//! Each rank writes its share of a collective as one file (written under a temporary
//! name, then renamed, so a reader never sees half of it), waits for every rank's share,
//! checks that all ranks called the same thing, and computes the result itself.

use crate::driver::{current_device, device_range};
use crate::{allowed, guard};
use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

type NcclResult = c_uint;
const SUCCESS: NcclResult = 0;
const SYSTEM_ERROR: NcclResult = 2;
const INTERNAL_ERROR: NcclResult = 3;
const INVALID_ARGUMENT: NcclResult = 4;
const INVALID_USAGE: NcclResult = 5;
const REMOTE_ERROR: NcclResult = 6;

/// `ncclUniqueId`: 128 bytes, passed by value to ncclCommInitRank.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId {
    internal: [u8; 128],
}

const ID_MAGIC: &[u8; 8] = b"NCCLDBL1";

/// A communicator: one rank's place in one job.
pub struct Comm {
    dir: PathBuf,
    rank: usize,
    nranks: usize,
    device: usize,
    seq: u64,
    /// Messages sent to each peer so far, and received from each.
    sent: Vec<u64>,
    received: Vec<u64>,
}

thread_local! {
    static LAST_ERROR: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    /// Send/recv calls queued between ncclGroupStart and ncclGroupEnd.
    static GROUP: RefCell<(usize, Vec<P2p>)> = const { RefCell::new((0, Vec::new())) };
}

struct P2p {
    send: bool,
    buf: usize,
    bytes: usize,
    peer: usize,
    comm: *mut Comm,
}

/// Records and prints a failure: NCCL's last error, and a WARN line as NCCL_DEBUG=WARN would.
fn fail(code: NcclResult, rank: Option<usize>, why: String) -> NcclResult {
    let who = rank.map(|r| format!(" rank {r}")).unwrap_or_default();
    // One write per line: lines of several ranks never interleave.
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        format!("nccl-double WARN{who}: {why}\n").as_bytes(),
    );
    LAST_ERROR.with(|e| *e.borrow_mut() = format!("{why}\0").into_bytes());
    code
}

fn timeout() -> Duration {
    Duration::from_secs(
        std::env::var("NCCL_DOUBLE_TIMEOUT_S")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(60),
    )
}

/// This rank's host, for the Duplicate GPU rule: `NCCL_DOUBLE_HOST`, else the node name
/// Slurm gave the task (emulated nodes share one real host), else the hostname.
fn host() -> String {
    std::env::var("NCCL_DOUBLE_HOST")
        .or_else(|_| std::env::var("SLURMD_NODENAME"))
        .unwrap_or_else(|_| {
            fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_string())
                .unwrap_or_default()
        })
}

/// Writes `data` to `path` so that readers see all of it or nothing.
fn publish(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_file_name(format!(
        ".tmp-{}-{}",
        std::process::id(),
        path.file_name().unwrap().to_string_lossy()
    ));
    fs::write(&tmp, data)?;
    fs::rename(&tmp, path)
}

impl Comm {
    /// Waits until every file in `paths` exists; fails if a rank published a failure.
    fn wait_all(&self, paths: &[PathBuf], what: &str) -> Result<Vec<Vec<u8>>, (NcclResult, String)> {
        let deadline = Instant::now() + timeout();
        loop {
            if let Some(failed) = (0..self.nranks).find(|r| self.dir.join(format!("failed-{r}")).exists()) {
                // The file holds the first failure's cause: pass it on, not wrapped again.
                let cause = fs::read_to_string(self.dir.join(format!("failed-{failed}"))).unwrap_or_default();
                return Err((REMOTE_ERROR, format!("{cause} (this rank was waiting for {what})")));
            }
            if paths.iter().all(|p| p.exists()) {
                return paths
                    .iter()
                    .map(|p| fs::read(p).map_err(|e| (SYSTEM_ERROR, format!("reading {}: {e}", p.display()))))
                    .collect();
            }
            if Instant::now() > deadline {
                let missing: Vec<String> = paths
                    .iter()
                    .filter(|p| !p.exists())
                    .map(|p| p.display().to_string())
                    .collect();
                return Err((
                    REMOTE_ERROR,
                    format!("timed out waiting for {what}: missing {}", missing.join(", ")),
                ));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Marks this rank failed, so the others stop waiting for it, and gone: a failed
    /// communicator is not used again, and the last rank out removes the folder.
    fn give_up(&self, code: NcclResult, why: String) -> NcclResult {
        // Others read this to fail at once: it names the first rank that failed, and why.
        let cause = match why.split_once(" (this rank was waiting for ") {
            Some((first, _)) if code == REMOTE_ERROR => first.to_string(),
            _ => format!("rank {} failed: {why}", self.rank),
        };
        let _ = publish(&self.dir.join(format!("failed-{}", self.rank)), cause.as_bytes());
        self.mark_left();
        fail(code, Some(self.rank), why)
    }

    fn mark_left(&self) {
        let _ = publish(&self.dir.join(format!("left-{}", self.rank)), b"");
        if (0..self.nranks).all(|r| self.dir.join(format!("left-{r}")).exists()) {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }

    /// The rules every use of a communicator must follow.
    fn check_use(&self, buffers: &[(usize, usize)]) -> Result<(), (NcclResult, String)> {
        match current_device() {
            None => {
                return Err((
                    INVALID_USAGE,
                    "no CUDA context is current on this thread (bind the context first)".into(),
                ));
            }
            Some(d) if d != self.device => {
                return Err((
                    INVALID_USAGE,
                    format!(
                        "the current context is device {d}, the communicator's is {}",
                        self.device
                    ),
                ));
            }
            Some(_) => {}
        }
        for &(ptr, len) in buffers {
            match device_range(ptr, len) {
                Ok(d) if d == self.device => {}
                Ok(d) => {
                    return Err((
                        INVALID_ARGUMENT,
                        format!("buffer {ptr:#x} is on device {d}, not {}", self.device),
                    ));
                }
                Err(why) => return Err((INVALID_ARGUMENT, why)),
            }
        }
        Ok(())
    }

    /// One collective: publish this rank's call and data, wait for every rank's, check
    /// that all called the same thing, and return every rank's data.
    fn collective(&mut self, call: &str, data: &[u8]) -> Result<Vec<Vec<u8>>, (NcclResult, String)> {
        self.seq += 1;
        let mut share = format!("{call}\n").into_bytes();
        share.extend_from_slice(data);
        let mine = self.dir.join(format!("op-{}-{}", self.seq, self.rank));
        publish(&mine, &share).map_err(|e| (SYSTEM_ERROR, format!("writing {}: {e}", mine.display())))?;
        let paths: Vec<PathBuf> = (0..self.nranks)
            .map(|r| self.dir.join(format!("op-{}-{r}", self.seq)))
            .collect();
        let shares = self.wait_all(&paths, &format!("every rank's call #{} ({call})", self.seq))?;
        // Every rank is at this call, so all have read the previous one: tidy it.
        let _ = fs::remove_file(self.dir.join(format!("op-{}-{}", self.seq - 1, self.rank)));
        let mut out = Vec::with_capacity(shares.len());
        for (r, share) in shares.into_iter().enumerate() {
            let nl = share.iter().position(|b| *b == b'\n').unwrap_or(share.len());
            let theirs = String::from_utf8_lossy(&share[..nl]).into_owned();
            if theirs != call {
                return Err((
                    INVALID_USAGE,
                    format!(
                        "collective mismatch at call #{}: rank {} called {call}, rank {r} called {theirs}",
                        self.seq, self.rank
                    ),
                ));
            }
            out.push(share[(nl + 1).min(share.len())..].to_vec());
        }
        Ok(out)
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclGetVersion(version: *mut c_int) -> NcclResult {
    if !allowed() {
        return fail(SYSTEM_ERROR, None, "NCCL_DOUBLE=1 is not set".into());
    }
    unsafe { *version = 21803 };
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclGetUniqueId(id: *mut UniqueId) -> NcclResult {
    if !allowed() {
        return fail(SYSTEM_ERROR, None, "NCCL_DOUBLE=1 is not set".into());
    }
    let mut internal = [0u8; 128];
    internal[..8].copy_from_slice(ID_MAGIC);
    let random = format!("{:016x}{:016x}", random_u64(), random_u64());
    internal[8..40].copy_from_slice(random.as_bytes());
    unsafe { *id = UniqueId { internal } };
    SUCCESS
}

fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(Instant::now().elapsed().as_nanos() ^ std::process::id() as u128);
    h.finish()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommInitRank(out: *mut *mut Comm, nranks: c_int, id: UniqueId, rank: c_int) -> NcclResult {
    guard(INTERNAL_ERROR, || {
        if !allowed() {
            return fail(SYSTEM_ERROR, None, "NCCL_DOUBLE=1 is not set".into());
        }
        let who = (rank >= 0).then_some(rank as usize);
        if nranks < 1 || rank < 0 || rank >= nranks {
            return fail(
                INVALID_ARGUMENT,
                who,
                format!("rank {rank} is out of range for {nranks} ranks"),
            );
        }
        if &id.internal[..8] != ID_MAGIC {
            return fail(
                INVALID_ARGUMENT,
                who,
                "the unique id was not made by ncclGetUniqueId (never shared?)".into(),
            );
        }
        let Some(device) = current_device() else {
            return fail(
                INVALID_USAGE,
                who,
                "ncclCommInitRank with no CUDA context current on this thread: NCCL would silently use device 0 \
                 (make the device's context current first)"
                    .into(),
            );
        };
        let name = String::from_utf8_lossy(&id.internal[8..40]).into_owned();
        let comm = Comm {
            dir: PathBuf::from(format!("/dev/shm/nccl-double-{name}")),
            rank: rank as usize,
            nranks: nranks as usize,
            device,
            seq: 0,
            sent: vec![0; nranks as usize],
            received: vec![0; nranks as usize],
        };
        if let Err(e) = fs::create_dir_all(&comm.dir) {
            return fail(SYSTEM_ERROR, who, format!("creating {}: {e}", comm.dir.display()));
        }
        let me = comm.dir.join(format!("rank-{rank}"));
        if me.exists() {
            return comm.give_up(
                INVALID_ARGUMENT,
                format!("rank {rank} joined twice: two processes claim the same rank"),
            );
        }
        let card = format!("{nranks} {device} {} {}", std::process::id(), host());
        if let Err(e) = publish(&me, card.as_bytes()) {
            return fail(SYSTEM_ERROR, who, format!("writing {}: {e}", me.display()));
        }
        let paths: Vec<PathBuf> = (0..nranks).map(|r| comm.dir.join(format!("rank-{r}"))).collect();
        let cards = match comm.wait_all(&paths, "every rank to join") {
            Ok(c) => c,
            Err((code, why)) => return comm.give_up(code, why),
        };
        let cards: Vec<Vec<String>> = cards
            .iter()
            .map(|c| String::from_utf8_lossy(c).splitn(4, ' ').map(str::to_string).collect())
            .collect();
        for (r, c) in cards.iter().enumerate() {
            if c.first().map(String::as_str) != Some(&nranks.to_string()) {
                return comm.give_up(
                    INVALID_ARGUMENT,
                    format!("rank {r} joined a world of {} ranks, rank {rank} one of {nranks}", c[0]),
                );
            }
            if r != rank as usize && c.get(3) == Some(&host()) && c.get(1) == Some(&device.to_string()) {
                let (a, b) = (r.min(rank as usize), r.max(rank as usize));
                return comm.give_up(
                    INVALID_USAGE,
                    format!("Duplicate GPU detected : rank {a} and rank {b} both on CUDA device {device}"),
                );
            }
        }
        unsafe { *out = Box::into_raw(Box::new(comm)) };
        SUCCESS
    })
}

fn elem_size(dtype: c_uint) -> Option<usize> {
    match dtype {
        0 | 1 => Some(1),     // int8, uint8
        2 | 3 | 7 => Some(4), // int32, uint32, float32
        4 | 5 | 8 => Some(8), // int64, uint64, float64
        _ => None,
    }
}

/// Reduces `x` into `acc` elementwise for `dtype` and `op` (sum, prod, max, min).
fn reduce(acc: &mut [u8], x: &[u8], dtype: c_uint, op: c_uint) {
    macro_rules! each {
        ($t:ty) => {{
            let n = std::mem::size_of::<$t>();
            for (a, b) in acc.chunks_exact_mut(n).zip(x.chunks_exact(n)) {
                let (p, q) = (
                    <$t>::from_ne_bytes(a.try_into().unwrap()),
                    <$t>::from_ne_bytes(b.try_into().unwrap()),
                );
                let r = match op {
                    1 => p * q,
                    2 => {
                        if p > q {
                            p
                        } else {
                            q
                        }
                    }
                    3 => {
                        if p < q {
                            p
                        } else {
                            q
                        }
                    }
                    _ => p + q,
                };
                a.copy_from_slice(&r.to_ne_bytes());
            }
        }};
    }
    match dtype {
        0 => each!(i8),
        1 => each!(u8),
        2 => each!(i32),
        3 => each!(u32),
        4 => each!(i64),
        5 => each!(u64),
        7 => each!(f32),
        _ => each!(f64),
    }
}

fn comm_ref<'a>(comm: *mut Comm) -> Result<&'a mut Comm, NcclResult> {
    if comm.is_null() {
        return Err(fail(INVALID_ARGUMENT, None, "null communicator".into()));
    }
    Ok(unsafe { &mut *comm })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclAllReduce(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_uint,
    op: c_uint,
    comm: *mut Comm,
    _stream: usize,
) -> NcclResult {
    guard(INTERNAL_ERROR, || {
        let c = match comm_ref(comm) {
            Ok(c) => c,
            Err(code) => return code,
        };
        let Some(size) = elem_size(dtype).filter(|_| op <= 3) else {
            return c.give_up(INVALID_ARGUMENT, format!("unsupported type {dtype} or op {op}"));
        };
        let bytes = count * size;
        let mut run = || -> Result<(), (NcclResult, String)> {
            c.check_use(&[(send as usize, bytes), (recv as usize, bytes)])?;
            let data = unsafe { std::slice::from_raw_parts(send as *const u8, bytes) }.to_vec();
            let shares = c.collective(&format!("AllReduce(count={count}, type={dtype}, op={op})"), &data)?;
            let mut acc = shares[0].clone();
            for s in &shares[1..] {
                reduce(&mut acc, s, dtype, op);
            }
            unsafe { std::ptr::copy_nonoverlapping(acc.as_ptr(), recv as *mut u8, bytes) };
            Ok(())
        };
        let result = run();
        match result {
            Ok(()) => SUCCESS,
            Err((code, why)) => c.give_up(code, why),
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclBroadcast(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_uint,
    root: c_int,
    comm: *mut Comm,
    _stream: usize,
) -> NcclResult {
    guard(INTERNAL_ERROR, || {
        let c = match comm_ref(comm) {
            Ok(c) => c,
            Err(code) => return code,
        };
        let Some(size) = elem_size(dtype) else {
            return c.give_up(INVALID_ARGUMENT, format!("unsupported type {dtype}"));
        };
        let bytes = count * size;
        let mut run = || -> Result<(), (NcclResult, String)> {
            if root < 0 || root as usize >= c.nranks {
                return Err((
                    INVALID_ARGUMENT,
                    format!("root {root} is out of range for {} ranks", c.nranks),
                ));
            }
            let is_root = root as usize == c.rank;
            let mut bufs = vec![(recv as usize, bytes)];
            if is_root {
                bufs.push((send as usize, bytes));
            }
            c.check_use(&bufs)?;
            let data = if is_root {
                unsafe { std::slice::from_raw_parts(send as *const u8, bytes) }.to_vec()
            } else {
                vec![]
            };
            let shares = c.collective(&format!("Broadcast(count={count}, type={dtype}, root={root})"), &data)?;
            let theirs = &shares[root as usize];
            unsafe { std::ptr::copy(theirs.as_ptr(), recv as *mut u8, bytes) };
            Ok(())
        };
        let result = run();
        match result {
            Ok(()) => SUCCESS,
            Err((code, why)) => c.give_up(code, why),
        }
    })
}

fn p2p(send: bool, buf: usize, count: usize, dtype: c_uint, peer: c_int, comm: *mut Comm) -> NcclResult {
    let c = match comm_ref(comm) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let Some(size) = elem_size(dtype) else {
        return c.give_up(INVALID_ARGUMENT, format!("unsupported type {dtype}"));
    };
    if peer < 0 || peer as usize >= c.nranks || peer as usize == c.rank {
        return c.give_up(
            INVALID_ARGUMENT,
            format!("peer {peer} is not another rank of {}", c.nranks),
        );
    }
    if let Err((code, why)) = c.check_use(&[(buf, count * size)]) {
        return c.give_up(code, why);
    }
    let op = P2p {
        send,
        buf,
        bytes: count * size,
        peer: peer as usize,
        comm,
    };
    let queued = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.0 > 0 {
            g.1.push(op);
            None
        } else {
            Some(op)
        }
    });
    match queued {
        None => SUCCESS,
        Some(op) => run_p2p(&[op]),
    }
}

/// Runs send/recv calls: every send first (they never block), then every receive.
fn run_p2p(ops: &[P2p]) -> NcclResult {
    for op in ops.iter().filter(|o| o.send) {
        let c = unsafe { &mut *op.comm };
        let n = c.sent[op.peer];
        c.sent[op.peer] += 1;
        let data = unsafe { std::slice::from_raw_parts(op.buf as *const u8, op.bytes) };
        let path = c.dir.join(format!("p2p-{}-{}-{n}", c.rank, op.peer));
        if let Err(e) = publish(&path, data) {
            return c.give_up(SYSTEM_ERROR, format!("writing {}: {e}", path.display()));
        }
    }
    for op in ops.iter().filter(|o| !o.send) {
        let c = unsafe { &mut *op.comm };
        let n = c.received[op.peer];
        c.received[op.peer] += 1;
        let path = c.dir.join(format!("p2p-{}-{}-{n}", op.peer, c.rank));
        let data = match c.wait_all(
            std::slice::from_ref(&path),
            &format!("message {n} from rank {}", op.peer),
        ) {
            Ok(mut d) => d.remove(0),
            Err((code, why)) => return c.give_up(code, why),
        };
        if data.len() != op.bytes {
            return c.give_up(
                INVALID_USAGE,
                format!(
                    "rank {} sent {} bytes but rank {} receives {}",
                    op.peer,
                    data.len(),
                    c.rank,
                    op.bytes
                ),
            );
        }
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), op.buf as *mut u8, op.bytes) };
        let _ = fs::remove_file(&path);
    }
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclSend(
    buf: *const c_void,
    count: usize,
    dtype: c_uint,
    peer: c_int,
    comm: *mut Comm,
    _s: usize,
) -> NcclResult {
    guard(INTERNAL_ERROR, || p2p(true, buf as usize, count, dtype, peer, comm))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclRecv(
    buf: *mut c_void,
    count: usize,
    dtype: c_uint,
    peer: c_int,
    comm: *mut Comm,
    _s: usize,
) -> NcclResult {
    guard(INTERNAL_ERROR, || p2p(false, buf as usize, count, dtype, peer, comm))
}

#[unsafe(no_mangle)]
pub extern "C" fn ncclGroupStart() -> NcclResult {
    GROUP.with(|g| g.borrow_mut().0 += 1);
    SUCCESS
}

#[unsafe(no_mangle)]
pub extern "C" fn ncclGroupEnd() -> NcclResult {
    guard(INTERNAL_ERROR, || {
        let ops = GROUP.with(|g| {
            let mut g = g.borrow_mut();
            g.0 = g.0.saturating_sub(1);
            if g.0 == 0 { std::mem::take(&mut g.1) } else { Vec::new() }
        });
        run_p2p(&ops)
    })
}

/// Leaves the communicator: removes this rank's files; the last one out removes the folder.
fn leave(comm: *mut Comm) -> NcclResult {
    if comm.is_null() {
        return SUCCESS;
    }
    let c = unsafe { Box::from_raw(comm) };
    // This rank's share of the last collective may still be unread by a slower rank:
    // only when every rank has left is the folder surely no longer needed.
    c.mark_left();
    SUCCESS
}

#[unsafe(no_mangle)]
pub extern "C" fn ncclCommAbort(comm: *mut Comm) -> NcclResult {
    guard(INTERNAL_ERROR, || leave(comm))
}

#[unsafe(no_mangle)]
pub extern "C" fn ncclCommDestroy(comm: *mut Comm) -> NcclResult {
    guard(INTERNAL_ERROR, || leave(comm))
}

#[unsafe(no_mangle)]
pub extern "C" fn ncclCommFinalize(_comm: *mut Comm) -> NcclResult {
    SUCCESS
}

#[unsafe(no_mangle)]
pub extern "C" fn ncclGetErrorString(code: NcclResult) -> *const c_char {
    let text: &'static std::ffi::CStr = match code {
        SUCCESS => c"no error",
        SYSTEM_ERROR => c"unhandled system error",
        INTERNAL_ERROR => c"internal error",
        INVALID_ARGUMENT => c"invalid argument",
        INVALID_USAGE => c"invalid usage",
        REMOTE_ERROR => c"remote process exited or there was a network error",
        _ => c"unknown result code",
    };
    text.as_ptr().cast()
}

#[unsafe(no_mangle)]
pub extern "C" fn ncclGetLastError(_comm: *mut Comm) -> *const c_char {
    LAST_ERROR.with(|e| {
        let e = e.borrow();
        if e.is_empty() {
            c"".as_ptr().cast()
        } else {
            e.as_ptr().cast()
        }
    })
}
