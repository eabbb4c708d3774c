//! The NCCL half: unique ids, communicators, all-reduce, broadcast and grouped
//! send/recv across processes (and threads), meeting through [`crate::exchange`].
//!
//! A collective runs when it is called: each rank publishes its call and its data, waits
//! for every rank's, checks that all called the same thing, and computes the result
//! itself. Inside `ncclGroupStart`/`ncclGroupEnd` the calls are queued and run at the
//! end: every rank first publishes everything (shares and sends), then completes, so the
//! order of calls inside a group does not matter, as with NCCL.
//!
//! Rules enforced, each with a WARN line saying what was broken:
//! 1. a CUDA context is current on the thread that makes a communicator (its device is the
//!    communicator's) and on every thread that uses it -> `ncclInvalidUsage`;
//! 2. `0 <= rank < nranks`, every rank of an id agreeing on `nranks`, no rank claimed
//!    twice -> `ncclInvalidArgument`;
//! 3. no two ranks of one host on one device -> `ncclInvalidUsage`, "Duplicate GPU detected";
//! 4. every rank calls the same collectives (kind, count, type, op, root) in the same
//!    order, and a matched send and recv have the same count and type -> `ncclInvalidUsage`
//!    on all of them;
//! 5. buffers are live device allocations of the communicator's device, whole count in
//!    range -> `ncclInvalidArgument`.
//!
//! A rank that fails publishes a failure marker, so the others fail at once with
//! `ncclRemoteError` instead of waiting out the timeout; the communicator is then broken
//! (every later call fails) and can only be destroyed or aborted.

use crate::driver::{current_device, stream_device};
use crate::exchange::{Card, Failure, Room, Wanted};
use crate::reduce::{DataType, Op, reduce};
use crate::{allowed, entry, memory, warn};
use std::cell::RefCell;
use std::collections::{BTreeSet, VecDeque};
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::io::Read;
use std::sync::Mutex;

/// `ncclResult_t`. Only codes of NCCL 2.18's enum (0..=7) are ever returned: cudarc
/// turns the number into a Rust enum (with the 2.22 bindings, 8 is `ncclNumResults`,
/// which cudarc takes for success).
pub type NcclResult = c_uint;
pub const SUCCESS: NcclResult = 0;
pub const SYSTEM_ERROR: NcclResult = 2;
pub const INTERNAL_ERROR: NcclResult = 3;
pub const INVALID_ARGUMENT: NcclResult = 4;
pub const INVALID_USAGE: NcclResult = 5;
pub const REMOTE_ERROR: NcclResult = 6;

/// The version reported: NCCL 2.18.3.
const VERSION: c_int = 21803;

/// `ncclUniqueId`: 128 bytes, passed by value to ncclCommInitRank. The double's ids are
/// `MAGIC`, 16 random bytes (the meeting folder's name), then who made it, for humans.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId {
    internal: [u8; 128],
}

const MAGIC: &[u8; 8] = b"NCCLDBL\x01";

/// One rank's communicator.
pub struct Comm {
    room: Room,
    rank: usize,
    nranks: usize,
    device: usize,
    /// Collectives issued so far (the number of the last one).
    seq: u64,
    /// Messages sent to / received from each peer so far.
    sent: Vec<u64>,
    received: Vec<u64>,
    /// This rank's collective shares not yet removed.
    unswept: VecDeque<u64>,
    /// Why the communicator is broken, if it is.
    broken: Option<String>,
    finalized: bool,
}

/// Live communicators (addresses): a destroyed or made-up one is refused, not used.
static COMMS: Mutex<BTreeSet<usize>> = Mutex::new(BTreeSet::new());

fn live(comm: *mut Comm) -> bool {
    COMMS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .contains(&(comm as usize))
}

thread_local! {
    /// ncclGroupStart depth, and the calls queued until the outermost ncclGroupEnd.
    static GROUP: RefCell<(usize, Vec<Pending>)> = const { RefCell::new((0, Vec::new())) };
}

fn in_group() -> bool {
    GROUP.with(|g| g.borrow().0 > 0)
}

/// A failure outside any communicator: WARN line and last error.
fn fail(code: NcclResult, rank: Option<usize>, why: &str) -> NcclResult {
    warn(rank, why);
    code
}

impl Comm {
    /// Fails this rank: the communicator is broken, and the other ranks are told.
    fn fail(&mut self, f: Failure) -> NcclResult {
        self.room
            .mark_failed(&crate::exchange::cause(self.rank, f.code == REMOTE_ERROR, &f.why));
        self.broken.get_or_insert_with(|| f.why.clone());
        warn(Some(self.rank), &f.why);
        f.code
    }

    /// Rule 1 (a context current, the communicator's) and the stream's device.
    fn check_thread(&self, call: &str, stream: usize) -> Result<(), Failure> {
        let rule = "a CUDA context must be current on every thread that makes or uses a communicator \
                    (cudarc's Comm does not bind it: call ctx.bind_to_thread() first)";
        match current_device() {
            None => {
                return Err(Failure::new(
                    INVALID_USAGE,
                    format!(
                        "{call} on rank {}'s communicator (device {}) with no CUDA context current on this thread: {rule}",
                        self.rank, self.device
                    ),
                ));
            }
            Some(d) if d != self.device => {
                return Err(Failure::new(
                    INVALID_USAGE,
                    format!(
                        "{call} on rank {}'s communicator (device {}) while device {d}'s context is current on this thread: {rule}",
                        self.rank, self.device
                    ),
                ));
            }
            Some(_) => {}
        }
        match stream_device(stream) {
            Ok(d) if d == self.device => Ok(()),
            Ok(d) => Err(Failure::new(
                INVALID_USAGE,
                format!(
                    "{call}: the stream belongs to device {d}, the communicator to device {}",
                    self.device
                ),
            )),
            Err(_) => Err(Failure::new(
                INVALID_ARGUMENT,
                format!("{call}: {stream:#x} is not a CUDA stream"),
            )),
        }
    }

    /// Rule 5: `bytes` at `ptr` are device memory of this communicator's device.
    fn check_buffer(&self, call: &str, which: &str, ptr: usize, bytes: usize) -> Result<(), Failure> {
        match memory::check(ptr, bytes) {
            Ok(d) if d == self.device => Ok(()),
            Ok(d) => Err(Failure::new(
                INVALID_ARGUMENT,
                format!(
                    "{call} {which} {ptr:#x} is memory of device {d}, but the communicator is on device {}",
                    self.device
                ),
            )),
            Err(why) => Err(Failure::new(INVALID_ARGUMENT, format!("{call} {which}: {why}"))),
        }
    }

    /// Removes this rank's collective shares that every rank has finished reading.
    fn sweep(&mut self) {
        let Some(&oldest) = self.unswept.front() else {
            return;
        };
        let mut done = u64::MAX;
        for r in 0..self.nranks {
            let d = self
                .room
                .read(&format!("done-{r}"))
                .and_then(|b| String::from_utf8_lossy(&b).trim().parse().ok())
                .unwrap_or(0);
            done = done.min(d);
            if done < oldest {
                return;
            }
        }
        while self.unswept.front().is_some_and(|&s| s <= done) {
            let s = self.unswept.pop_front().unwrap_or_default();
            self.room.remove(&format!("op-{s}-{}", self.rank));
        }
    }
}

/// Looks up a communicator handed in by the caller: live, not broken, not finalized.
fn usable<'a>(comm: *mut Comm, call: &str) -> Result<&'a mut Comm, NcclResult> {
    if comm.is_null() {
        return Err(fail(
            INVALID_ARGUMENT,
            None,
            &format!("{call}: the communicator is NULL"),
        ));
    }
    if !live(comm) {
        return Err(fail(
            INVALID_ARGUMENT,
            None,
            &format!("{call}: {comm:p} is not a live communicator (already destroyed or aborted?)"),
        ));
    }
    // SAFETY: live communicators are boxes made by ncclCommInitRank and not yet freed;
    // NCCL (like the double) requires that one communicator is used by one thread at a time.
    let c = unsafe { &mut *comm };
    if let Some(why) = &c.broken {
        let why = format!("{call} on a communicator that already failed ({why}): it can only be destroyed or aborted");
        warn(Some(c.rank), &why);
        return Err(INVALID_USAGE);
    }
    if c.finalized {
        return Err(fail(
            INVALID_USAGE,
            Some(c.rank),
            &format!("{call} on a finalized communicator"),
        ));
    }
    Ok(c)
}

// ---------------------------------------------------------------------------------
// Version, ids, errors.

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclGetVersion(version: *mut c_int) -> NcclResult {
    entry("ncclGetVersion", INTERNAL_ERROR, || {
        if !allowed() {
            return SYSTEM_ERROR;
        }
        if version.is_null() {
            return fail(INVALID_ARGUMENT, None, "ncclGetVersion: version is NULL");
        }
        unsafe { *version = VERSION };
        SUCCESS
    })
}

/// 16 random bytes from the kernel (so two jobs never share a folder).
fn random_bytes() -> [u8; 16] {
    let mut b = [0u8; 16];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .is_err()
    {
        use std::hash::{BuildHasher, Hasher};
        for chunk in b.chunks_mut(8) {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u128(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_nanos(),
            );
            h.write_u32(std::process::id());
            chunk.copy_from_slice(&h.finish().to_ne_bytes());
        }
    }
    b
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclGetUniqueId(id: *mut UniqueId) -> NcclResult {
    entry("ncclGetUniqueId", INTERNAL_ERROR, || {
        if !allowed() {
            return SYSTEM_ERROR;
        }
        if id.is_null() {
            return fail(INVALID_ARGUMENT, None, "ncclGetUniqueId: uniqueId is NULL");
        }
        let mut internal = [0u8; 128];
        internal[..8].copy_from_slice(MAGIC);
        internal[8..24].copy_from_slice(&random_bytes());
        let who = format!(
            "nccl-double id by pid {} on {}",
            std::process::id(),
            crate::exchange::real_host()
        );
        let n = who.len().min(128 - 32 - 1);
        internal[32..32 + n].copy_from_slice(&who.as_bytes()[..n]);
        unsafe { *id = UniqueId { internal } };
        SUCCESS
    })
}

/// NCCL 2.18's texts.
#[unsafe(no_mangle)]
pub extern "C" fn ncclGetErrorString(result: NcclResult) -> *const c_char {
    entry("ncclGetErrorString", c"internal error".as_ptr(), || {
        let s: &'static CStr = match result {
            0 => c"no error",
            1 => c"unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
            2 => c"unhandled system error (run with NCCL_DEBUG=INFO for details)",
            3 => c"internal error - please report this issue to the NCCL developers",
            4 => c"invalid argument (run with NCCL_DEBUG=WARN for details)",
            5 => c"invalid usage (run with NCCL_DEBUG=WARN for details)",
            6 => c"remote process exited or there was a network error",
            7 => c"NCCL operation in progress",
            _ => c"unknown result code",
        };
        s.as_ptr()
    })
}

/// The last failure's text, as NCCL keeps it (the communicator is not used).
#[unsafe(no_mangle)]
pub extern "C" fn ncclGetLastError(_comm: *mut Comm) -> *const c_char {
    entry("ncclGetLastError", c"".as_ptr(), crate::last_error)
}

// ---------------------------------------------------------------------------------
// Making and ending communicators.

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommInitRank(out: *mut *mut Comm, nranks: c_int, id: UniqueId, rank: c_int) -> NcclResult {
    entry("ncclCommInitRank", INTERNAL_ERROR, || {
        if !allowed() {
            return SYSTEM_ERROR;
        }
        let who = usize::try_from(rank).ok();
        if out.is_null() {
            return fail(INVALID_ARGUMENT, who, "ncclCommInitRank: comm is NULL");
        }
        match init(nranks, &id, rank) {
            Ok(comm) => {
                let comm = Box::into_raw(Box::new(comm));
                COMMS.lock().unwrap_or_else(|p| p.into_inner()).insert(comm as usize);
                unsafe { *out = comm };
                SUCCESS
            }
            Err(f) => fail(f.code, who, &f.why),
        }
    })
}

/// Joins the job of `id` as `rank` of `nranks`: rules 1, 2 and 3.
fn init(nranks: c_int, id: &UniqueId, rank: c_int) -> Result<Comm, Failure> {
    let call = format!("ncclCommInitRank(rank {rank} of {nranks})");
    if in_group() {
        return Err(Failure::new(
            INVALID_USAGE,
            format!("{call} inside ncclGroupStart/ncclGroupEnd is not supported by the test double"),
        ));
    }
    if id.internal[..8] != MAGIC[..] {
        let why = if id.internal.iter().all(|b| *b == 0) {
            "the unique id is all zeros: it was never filled in (rank 0 makes it with ncclGetUniqueId and every rank must receive it)"
        } else {
            "the unique id was not made by ncclGetUniqueId (of this test double)"
        };
        return Err(Failure::new(INVALID_ARGUMENT, format!("{call}: {why}")));
    }
    let name: String = id.internal[8..24].iter().map(|b| format!("{b:02x}")).collect();
    let in_range = nranks >= 1 && rank >= 0 && rank < nranks;
    let (r, n) = (rank.max(0) as usize, nranks.max(1) as usize);
    let room = Room::open(&name, r, n)?;
    if !in_range {
        let why = format!("{call}: rank must be in 0..{nranks} (and nranks at least 1)");
        room.mark_failed(&format!("a process failed: {why}"));
        return Err(Failure::new(INVALID_ARGUMENT, why));
    }
    // Rule 1: the device is the current context's.
    let Some(device) = current_device() else {
        let why = format!(
            "{call} with no CUDA context current on this thread: NCCL takes the device from the calling \
             thread's current context (real NCCL would silently use device 0). Make the rank's device current \
             first: CudaContext::new(device) on this thread, or ctx.bind_to_thread()"
        );
        room.mark_failed(&format!("rank {r} failed: {why}"));
        room.leave();
        return Err(Failure::new(INVALID_USAGE, why));
    };
    let card = Card::mine(n, device);
    // Rule 2: nobody else has this rank.
    if !room.claim(&format!("rank-{r}"), &card.to_bytes())? {
        let other = room.read(&format!("rank-{r}")).and_then(|b| Card::parse(&b));
        let why = format!(
            "{call}: two processes claim the same rank {r}: {} joined as rank {r} first; every rank of a job \
             needs its own rank",
            other.map_or("another process".into(), |c| format!("pid {} on {}", c.pid, c.host))
        );
        room.mark_failed(&format!("a process failed: {why}"));
        return Err(Failure::new(INVALID_ARGUMENT, why));
    }
    let mut comm = Comm {
        room,
        rank: r,
        nranks: n,
        device,
        seq: 0,
        sent: vec![0; n],
        received: vec![0; n],
        unswept: VecDeque::new(),
        broken: None,
        finalized: false,
    };
    match join(&comm, &call, &card) {
        Ok(()) => Ok(comm),
        Err(f) => {
            comm.room
                .mark_failed(&crate::exchange::cause(r, f.code == REMOTE_ERROR, &f.why));
            comm.room.leave();
            comm.broken = Some(f.why.clone());
            Err(f)
        }
    }
}

/// Waits for every rank's card, checking rule 2 (same world size) as they arrive and
/// rule 3 (no duplicate GPU) when all are there.
fn join(comm: &Comm, call: &str, mine: &Card) -> Result<(), Failure> {
    let wanted: Vec<Wanted> = (0..comm.nranks)
        .map(|r| Wanted {
            name: format!("rank-{r}"),
            from: r,
        })
        .collect();
    let cards = comm
        .room
        .wait(&wanted, "every rank to join (ncclCommInitRank)", &mut |r, b| {
            let c =
                Card::parse(b).ok_or_else(|| Failure::new(SYSTEM_ERROR, format!("rank {r}'s card is unreadable")))?;
            if c.nranks != comm.nranks {
                return Err(Failure::new(
                    INVALID_ARGUMENT,
                    format!(
                        "{call}: rank {r} joined a world of {} ranks, this rank ({}) one of {}: every rank must give \
                     the same nranks",
                        c.nranks, comm.rank, comm.nranks
                    ),
                ));
            }
            Ok(())
        })?;
    let cards: Vec<Card> = cards.iter().filter_map(|b| Card::parse(b)).collect();
    let mut pairs = Vec::new();
    for a in 0..cards.len() {
        for b in a + 1..cards.len() {
            if cards[a].host == cards[b].host && cards[a].device == cards[b].device {
                pairs.push((a, b));
            }
        }
    }
    // The pair this rank is in, if any (as NCCL reports it), else the first.
    let pair = pairs
        .iter()
        .find(|(a, b)| *a == comm.rank || *b == comm.rank)
        .or(pairs.first());
    if let Some(&(a, b)) = pair {
        return Err(Failure::new(
            INVALID_USAGE,
            format!(
                "Duplicate GPU detected : rank {a} and rank {b} both on CUDA device {} (host \"{}\"; NCCL refuses \
                 two ranks of one host on one GPU)",
                cards[a].device, mine.host
            ),
        ));
    }
    Ok(())
}

/// Leaves and frees a communicator (destroy and abort are the same here: nothing is ever
/// in flight, since collectives complete when called).
fn end(comm: *mut Comm, call: &str) -> NcclResult {
    if comm.is_null() {
        return SUCCESS;
    }
    if !COMMS.lock().unwrap_or_else(|p| p.into_inner()).remove(&(comm as usize)) {
        return fail(
            INVALID_ARGUMENT,
            None,
            &format!(
                "{call}({comm:p}): not a live communicator. Destroyed twice? (cudarc's Comm calls ncclCommAbort \
                 when dropped: after destroying it yourself, std::mem::forget the Comm)"
            ),
        );
    }
    // SAFETY: the pointer was live (made by ncclCommInitRank) and is now unregistered.
    let c = unsafe { Box::from_raw(comm) };
    c.room.leave();
    SUCCESS
}

#[unsafe(no_mangle)]
pub extern "C" fn ncclCommAbort(comm: *mut Comm) -> NcclResult {
    entry("ncclCommAbort", INTERNAL_ERROR, || end(comm, "ncclCommAbort"))
}

#[unsafe(no_mangle)]
pub extern "C" fn ncclCommDestroy(comm: *mut Comm) -> NcclResult {
    entry("ncclCommDestroy", INTERNAL_ERROR, || end(comm, "ncclCommDestroy"))
}

/// Nothing is ever pending, so finalizing only forbids further use.
#[unsafe(no_mangle)]
pub extern "C" fn ncclCommFinalize(comm: *mut Comm) -> NcclResult {
    entry("ncclCommFinalize", INTERNAL_ERROR, || {
        match usable(comm, "ncclCommFinalize") {
            Ok(c) => {
                c.finalized = true;
                SUCCESS
            }
            Err(code) => code,
        }
    })
}

// ---------------------------------------------------------------------------------
// Collectives and send/recv.

#[derive(Clone, Copy)]
enum Kind {
    AllReduce(Op),
    Broadcast(usize),
}

/// A call waiting to run (at once, or at the end of its group).
enum Pending {
    Collective {
        comm: *mut Comm,
        kind: Kind,
        dtype: DataType,
        count: usize,
        send: usize,
        recv: usize,
        call: String,
        seq: u64,
    },
    Send {
        comm: *mut Comm,
        peer: usize,
        dtype: DataType,
        count: usize,
        buf: usize,
        n: u64,
    },
    Recv {
        comm: *mut Comm,
        peer: usize,
        dtype: DataType,
        count: usize,
        buf: usize,
        n: u64,
    },
}

impl Pending {
    fn comm(&self) -> *mut Comm {
        match self {
            Self::Collective { comm, .. } | Self::Send { comm, .. } | Self::Recv { comm, .. } => *comm,
        }
    }
}

/// Runs `op` now, or queues it if a group is open.
fn submit(op: Pending) -> NcclResult {
    let op = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.0 > 0 {
            g.1.push(op);
            None
        } else {
            Some(op)
        }
    });
    match op {
        None => SUCCESS,
        Some(op) => run(vec![op]),
    }
}

/// Runs calls in three steps: publish every share and message; complete every
/// collective and receive; wait until every send was received.
fn run(mut ops: Vec<Pending>) -> NcclResult {
    for op in &mut ops {
        if let Err((comm, f)) = publish(op) {
            return fail_op(comm, f);
        }
    }
    for op in ops.iter().filter(|o| !matches!(o, Pending::Send { .. })) {
        if let Err(f) = complete(op) {
            return fail_op(op.comm(), f);
        }
    }
    for op in ops.iter().filter(|o| matches!(o, Pending::Send { .. })) {
        if let Err(f) = complete(op) {
            return fail_op(op.comm(), f);
        }
    }
    SUCCESS
}

fn fail_op(comm: *mut Comm, f: Failure) -> NcclResult {
    if live(comm) {
        // SAFETY: live communicator, used by this thread.
        unsafe { &mut *comm }.fail(f)
    } else {
        fail(f.code, None, &f.why)
    }
}

/// The first step of a call: publish this rank's share or message.
fn publish(op: &mut Pending) -> Result<(), (*mut Comm, Failure)> {
    let comm_ptr = op.comm();
    if !live(comm_ptr) {
        return Err((
            comm_ptr,
            Failure::new(INVALID_ARGUMENT, "the communicator was destroyed inside the group"),
        ));
    }
    // SAFETY: live communicator, used by this thread.
    let c = unsafe { &mut *comm_ptr };
    let on = |f: Failure| (comm_ptr, f);
    match op {
        Pending::Collective {
            kind,
            dtype,
            count,
            send,
            call,
            seq,
            ..
        } => {
            c.sweep();
            c.seq += 1;
            *seq = c.seq;
            let mut share = format!("{call}\n").into_bytes();
            let has_data = match kind {
                Kind::AllReduce(_) => true,
                Kind::Broadcast(root) => *root == c.rank,
            };
            if has_data {
                share.extend(memory::read(*send, *count * dtype.size()));
            }
            c.room
                .publish(&format!("op-{}-{}", c.seq, c.rank), &share)
                .map_err(on)?;
            c.unswept.push_back(c.seq);
        }
        Pending::Send {
            peer,
            dtype,
            count,
            buf,
            n,
            ..
        } => {
            *n = c.sent[*peer];
            c.sent[*peer] += 1;
            let mut msg = format!("{count} {dtype}\n").into_bytes();
            msg.extend(memory::read(*buf, *count * dtype.size()));
            c.room
                .publish(&format!("msg-{}-{}-{n}", c.rank, peer), &msg)
                .map_err(on)?;
        }
        Pending::Recv { peer, n, .. } => {
            *n = c.received[*peer];
            c.received[*peer] += 1;
        }
    }
    Ok(())
}

/// The second step: wait for the others and finish the call.
fn complete(op: &Pending) -> Result<(), Failure> {
    // SAFETY: checked live in `publish`, used by this thread.
    let c = unsafe { &mut *op.comm() };
    match op {
        Pending::Collective {
            kind,
            dtype,
            count,
            recv,
            call,
            seq,
            ..
        } => {
            let wanted: Vec<Wanted> = (0..c.nranks)
                .map(|r| Wanted {
                    name: format!("op-{seq}-{r}"),
                    from: r,
                })
                .collect();
            let what = format!("every rank's collective #{seq} ({call})");
            let shares = c.room.wait(&wanted, &what, &mut |_, _| Ok(()))?;
            // Rule 4: all ranks made the same call (compared with rank 0's, so every rank
            // reports the same pair).
            let split = |b: &[u8]| -> (String, Vec<u8>) {
                let nl = b.iter().position(|x| *x == b'\n').unwrap_or(b.len());
                (
                    String::from_utf8_lossy(&b[..nl]).into_owned(),
                    b[(nl + 1).min(b.len())..].to_vec(),
                )
            };
            let shares: Vec<(String, Vec<u8>)> = shares.iter().map(|b| split(b)).collect();
            if let Some((r, (theirs, _))) = shares.iter().enumerate().find(|(_, (s, _))| *s != shares[0].0) {
                return Err(Failure::new(
                    INVALID_USAGE,
                    format!(
                        "collective mismatch at call #{seq}: rank 0 called {} but rank {r} called {theirs}. Every \
                         rank must call the same collectives (same count, type, op and root) in the same order \
                         (real NCCL would hang or corrupt data)",
                        shares[0].0
                    ),
                ));
            }
            let bytes = *count * dtype.size();
            let result = match kind {
                Kind::AllReduce(o) => {
                    let parts: Vec<&[u8]> = shares.iter().map(|(_, d)| &d[..]).collect();
                    reduce(&parts, *dtype, *o)
                }
                Kind::Broadcast(root) => shares[*root].1.clone(),
            };
            if result.len() != bytes {
                return Err(Failure::new(
                    INTERNAL_ERROR,
                    format!("collective #{seq}: {} bytes of data for {bytes}", result.len()),
                ));
            }
            if bytes > 0 {
                memory::write(*recv, &result);
            }
            c.room
                .publish(&format!("done-{}", c.rank), seq.to_string().as_bytes())?;
        }
        Pending::Recv {
            peer,
            dtype,
            count,
            buf,
            n,
            ..
        } => {
            let name = format!("msg-{peer}-{}-{n}", c.rank);
            let what = format!("message #{n} from rank {peer} (ncclRecv of {count} x {dtype})");
            let msg = c.room.wait(
                &[Wanted {
                    name: name.clone(),
                    from: *peer,
                }],
                &what,
                &mut |_, _| Ok(()),
            )?;
            let msg = &msg[0];
            let nl = msg.iter().position(|x| *x == b'\n').unwrap_or(msg.len());
            let header = String::from_utf8_lossy(&msg[..nl]).into_owned();
            let data = &msg[(nl + 1).min(msg.len())..];
            c.room.remove(&name);
            let ack = format!("ack-{peer}-{}-{n}", c.rank);
            if header != format!("{count} {dtype}") {
                let (sc, st) = header.split_once(' ').unwrap_or((&header, "?"));
                let why = format!(
                    "ncclRecv of {count} x {dtype} by rank {} from rank {peer} does not match ncclSend of {sc} x {st} \
                     by rank {peer} (message #{n} between them): a matched send and recv must have the same count and type",
                    c.rank
                );
                c.room.publish(&ack, format!("error\n{why}").as_bytes())?;
                return Err(Failure::new(INVALID_USAGE, why));
            }
            memory::write(*buf, data);
            c.room.publish(&ack, b"ok")?;
        }
        Pending::Send {
            peer, dtype, count, n, ..
        } => {
            let name = format!("ack-{}-{peer}-{n}", c.rank);
            let what = format!(
                "rank {peer} to receive message #{n} (ncclSend of {count} x {dtype}; a send completes only when the \
                 peer posts the matching ncclRecv: sends and receives that must progress together belong in one \
                 ncclGroupStart/ncclGroupEnd)"
            );
            let ack = c.room.wait(
                &[Wanted {
                    name: name.clone(),
                    from: *peer,
                }],
                &what,
                &mut |_, _| Ok(()),
            )?;
            c.room.remove(&name);
            if let Some(why) = String::from_utf8_lossy(&ack[0]).strip_prefix("error\n") {
                return Err(Failure::new(INVALID_USAGE, why.to_string()));
            }
        }
    }
    Ok(())
}

/// The checks every collective makes before it is submitted.
#[allow(clippy::too_many_arguments)]
fn collective(
    name: &str,
    comm: *mut Comm,
    kind: Kind,
    send: usize,
    recv: usize,
    count: usize,
    dtype: c_uint,
    stream: usize,
) -> NcclResult {
    let c = match usable(comm, name) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let checked = (|| -> Result<Pending, Failure> {
        let dtype = DataType::from_nccl(dtype).map_err(|e| Failure::new(INVALID_ARGUMENT, format!("{name}: {e}")))?;
        let call = match kind {
            Kind::AllReduce(op) => format!("ncclAllReduce(count={count}, {dtype}, {op})"),
            Kind::Broadcast(root) => format!("ncclBroadcast(count={count}, {dtype}, root={root})"),
        };
        c.check_thread(&call, stream)?;
        let bytes = count
            .checked_mul(dtype.size())
            .ok_or_else(|| Failure::new(INVALID_ARGUMENT, format!("{call}: count too large")))?;
        if bytes > 0 {
            c.check_buffer(&call, "recvbuff", recv, bytes)?;
            let reads_send = match kind {
                Kind::AllReduce(_) => true,
                Kind::Broadcast(root) => root == c.rank,
            };
            if reads_send {
                c.check_buffer(&call, "sendbuff", send, bytes)?;
                if send != recv && send < recv + bytes && recv < send + bytes {
                    return Err(Failure::new(
                        INVALID_ARGUMENT,
                        format!("{call}: sendbuff and recvbuff overlap without being the same (in place) buffer"),
                    ));
                }
            }
        }
        Ok(Pending::Collective {
            comm,
            kind,
            dtype,
            count,
            send,
            recv,
            call,
            seq: 0,
        })
    })();
    match checked {
        Ok(op) => submit(op),
        Err(f) => c.fail(f),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclAllReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_uint,
    op: c_uint,
    comm: *mut Comm,
    stream: usize,
) -> NcclResult {
    entry("ncclAllReduce", INTERNAL_ERROR, || {
        let op = match Op::from_nccl(op) {
            Ok(op) => op,
            Err(e) => {
                return match usable(comm, "ncclAllReduce") {
                    Ok(c) => c.fail(Failure::new(INVALID_ARGUMENT, format!("ncclAllReduce: {e}"))),
                    Err(code) => code,
                };
            }
        };
        let (s, r) = (sendbuff as usize, recvbuff as usize);
        collective(
            "ncclAllReduce",
            comm,
            Kind::AllReduce(op),
            s,
            r,
            count,
            datatype,
            stream,
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclBroadcast(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_uint,
    root: c_int,
    comm: *mut Comm,
    stream: usize,
) -> NcclResult {
    entry("ncclBroadcast", INTERNAL_ERROR, || {
        let c = match usable(comm, "ncclBroadcast") {
            Ok(c) => c,
            Err(code) => return code,
        };
        let Some(root) = usize::try_from(root).ok().filter(|&r| r < c.nranks) else {
            let why = format!(
                "ncclBroadcast: root {root} is not a rank of this communicator (0..{})",
                c.nranks
            );
            return c.fail(Failure::new(INVALID_ARGUMENT, why));
        };
        let (s, r) = (sendbuff as usize, recvbuff as usize);
        collective(
            "ncclBroadcast",
            comm,
            Kind::Broadcast(root),
            s,
            r,
            count,
            datatype,
            stream,
        )
    })
}

fn p2p(send: bool, buf: usize, count: usize, dtype: c_uint, peer: c_int, comm: *mut Comm, stream: usize) -> NcclResult {
    let name = if send { "ncclSend" } else { "ncclRecv" };
    let c = match usable(comm, name) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let checked = (|| -> Result<Pending, Failure> {
        let dtype = DataType::from_nccl(dtype).map_err(|e| Failure::new(INVALID_ARGUMENT, format!("{name}: {e}")))?;
        let call = format!("{name}(count={count}, {dtype}, peer={peer})");
        let peer = usize::try_from(peer).ok().filter(|&p| p < c.nranks).ok_or_else(|| {
            Failure::new(
                INVALID_ARGUMENT,
                format!("{call}: peer is not a rank of 0..{}", c.nranks),
            )
        })?;
        c.check_thread(&call, stream)?;
        let bytes = count
            .checked_mul(dtype.size())
            .ok_or_else(|| Failure::new(INVALID_ARGUMENT, format!("{call}: count too large")))?;
        if bytes > 0 {
            c.check_buffer(&call, if send { "sendbuff" } else { "recvbuff" }, buf, bytes)?;
        }
        Ok(if send {
            Pending::Send {
                comm,
                peer,
                dtype,
                count,
                buf,
                n: 0,
            }
        } else {
            Pending::Recv {
                comm,
                peer,
                dtype,
                count,
                buf,
                n: 0,
            }
        })
    })();
    match checked {
        Ok(op) => submit(op),
        Err(f) => c.fail(f),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclSend(
    sendbuff: *const c_void,
    count: usize,
    datatype: c_uint,
    peer: c_int,
    comm: *mut Comm,
    stream: usize,
) -> NcclResult {
    entry("ncclSend", INTERNAL_ERROR, || {
        p2p(true, sendbuff as usize, count, datatype, peer, comm, stream)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclRecv(
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_uint,
    peer: c_int,
    comm: *mut Comm,
    stream: usize,
) -> NcclResult {
    entry("ncclRecv", INTERNAL_ERROR, || {
        p2p(false, recvbuff as usize, count, datatype, peer, comm, stream)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn ncclGroupStart() -> NcclResult {
    entry("ncclGroupStart", INTERNAL_ERROR, || {
        GROUP.with(|g| g.borrow_mut().0 += 1);
        SUCCESS
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn ncclGroupEnd() -> NcclResult {
    entry("ncclGroupEnd", INTERNAL_ERROR, || {
        let ops = GROUP.with(|g| {
            let mut g = g.borrow_mut();
            match g.0 {
                0 => None,
                1 => {
                    g.0 = 0;
                    Some(std::mem::take(&mut g.1))
                }
                _ => {
                    g.0 -= 1;
                    Some(Vec::new())
                }
            }
        });
        match ops {
            None => fail(INVALID_USAGE, None, "ncclGroupEnd without ncclGroupStart"),
            Some(ops) => run(ops),
        }
    })
}
