//! The collective, point-to-point and group entry points: `ncclAllReduce`,
//! `ncclBroadcast`, `ncclReduce`, `ncclAllGather`, `ncclReduceScatter`, `ncclSend`,
//! `ncclRecv`, `ncclGroupStart`, `ncclGroupEnd`. Each call checks its arguments at once
//! (rules 1, 2, 5 and 6; an error is returned by the call, as NCCL's argument checks
//! are), then queues its work on its stream and returns: `ncclSuccess` for a blocking
//! communicator, `ncclInProgress` for a non-blocking one (the caller then polls
//! `ncclCommGetAsyncError`, which for the double is over at once). Inside
//! `ncclGroupStart`/`ncclGroupEnd` the checked calls wait for the outermost end, where
//! each communicator's calls are queued as one unit.
//!
//! The buffers each collective uses, for `b` = count x the type's size, on rank `r` of
//! `n` (a buffer of 0 bytes is neither checked nor touched, so a NULL one is fine):
//!
//! | call | sendbuff | recvbuff | in place when |
//! |---|---|---|---|
//! | `ncclAllReduce` | b | b | `sendbuff == recvbuff` |
//! | `ncclBroadcast` | b on the root, else unused | b | `sendbuff == recvbuff` |
//! | `ncclReduce` | b | b on the root, else unused | `sendbuff == recvbuff` |
//! | `ncclAllGather` (count = sendcount) | b | n·b | `sendbuff == recvbuff + r·b` |
//! | `ncclReduceScatter` (count = recvcount) | n·b | b | `recvbuff == sendbuff + r·b` |

use super::comm::{Comm, live, usable};
use super::debug::CollLine;
use super::group::{self, Grouped};
use super::work::{Call, Kind, Region, Unit};
use super::{IN_PROGRESS, INTERNAL_ERROR, INVALID_ARGUMENT, INVALID_USAGE, NcclResult, SUCCESS, fail};
use crate::driver::{current_device, stream_key};
use crate::entry;
use crate::exchange::Failure;
use crate::memory;
use crate::reduce::{DataType, Op};
use crate::stream::Key;
use std::ffi::{c_int, c_uint, c_void};

/// Rule 1 (a context current, the communicator's) and the stream's device; the stream.
fn check_thread(c: &Comm, call: &str, stream: usize) -> Result<Key, Failure> {
    let rule = "a CUDA context must be current on every thread that makes or uses a communicator \
                (cudarc's Comm does not bind it: call ctx.bind_to_thread() first)";
    let (rank, device) = (c.rank(), c.device());
    match current_device() {
        None => {
            return Err(Failure::new(
                INVALID_USAGE,
                format!(
                    "{call} on rank {rank}'s communicator (device {device}) with no CUDA context current on this \
                     thread: {rule}"
                ),
            ));
        }
        Some(d) if d != device => {
            return Err(Failure::new(
                INVALID_USAGE,
                format!(
                    "{call} on rank {rank}'s communicator (device {device}) while device {d}'s context is current on \
                     this thread: {rule}"
                ),
            ));
        }
        Some(_) => {}
    }
    match stream_key(stream) {
        Ok(k) if k.device == device => Ok(k),
        Ok(k) => Err(Failure::new(
            INVALID_USAGE,
            format!(
                "{call}: the stream belongs to device {}, the communicator to device {device}",
                k.device
            ),
        )),
        Err(_) => Err(Failure::new(
            INVALID_ARGUMENT,
            format!("{call}: {stream:#x} is not a CUDA stream"),
        )),
    }
}

/// Rule 5: `bytes` at `ptr` are device memory of the communicator's device.
fn check_buffer(c: &Comm, call: &str, which: &str, ptr: usize, bytes: usize) -> Result<(), Failure> {
    match memory::check(ptr, bytes) {
        Ok(d) if d == c.device() => Ok(()),
        Ok(d) => Err(Failure::new(
            INVALID_ARGUMENT,
            format!(
                "{call} {which} {ptr:#x} is memory of device {d}, but the communicator is on device {}",
                c.device()
            ),
        )),
        Err(why) => Err(Failure::new(INVALID_ARGUMENT, format!("{call} {which}: {why}"))),
    }
}

/// Rule 6 inside a group: the calls of a group have no order between them (real NCCL
/// runs them at once), so memory one of them writes must not be read or written by
/// another. Checked against the calls of this thread's open group made before.
fn check_group(call: &Call) -> Result<(), Failure> {
    let (reads, writes) = (call.reads(), call.writes());
    let clash = group::find(|g| {
        let (their_reads, their_writes) = (g.call.reads(), g.call.writes());
        let pairs = [(writes, their_reads), (writes, their_writes), (reads, their_writes)];
        pairs.into_iter().find_map(|(mine, theirs)| match (mine, theirs) {
            (Some(m), Some(t)) if m.overlaps(&t) => Some((m, t, g.call.describe())),
            _ => None,
        })
    });
    match clash {
        None => Ok(()),
        Some((mine, theirs, other)) => Err(Failure::new(
            INVALID_ARGUMENT,
            format!(
                "{}: its {mine} overlaps the {theirs} of {other}, made before it in this group: the calls of a \
                 group run with no order between them, so memory that one call writes must be neither read nor \
                 written by another call of the group (an in-place all-to-all, sendbuff == recvbuff, is such a \
                 group: NCCL does not support it; real NCCL does not check this and silently computes garbage)",
                call.describe()
            ),
        )),
    }
}

/// A checked call: queued now, or kept for the end of the open group.
fn submit(comm: *mut Comm, c: &Comm, call: Call, stream: Key) -> NcclResult {
    if let Err(f) = check_group(&call) {
        return c.fail(f);
    }
    // NCCL's taskAppend (enqueue.cc, 2.18 to 2.30), before any group: a collective of no
    // elements is dropped, and one on a communicator of one rank is put on the stream at
    // once (ncclLaunchOneRank), inside a group or not, with no task for the group: the
    // call says ncclSuccess, non-blocking or not (seen on an H200, NCCL 2.28.3, 2026-11-26).
    if let Call::Collective {
        send_bytes, recv_bytes, ..
    } = &call
    {
        if *send_bytes == 0 && *recv_bytes == 0 {
            return SUCCESS;
        }
        if c.nranks() == 1 {
            return c.launch_now(Unit::new(vec![call], &[stream]));
        }
    }
    let kept = group::add(Grouped {
        comm: comm as usize,
        call,
        stream,
    });
    match kept {
        // Kept for ncclGroupEnd: ncclEnqueueCheck returns the communicator's state, which
        // is ncclSuccess until the group ends (blocking or not).
        Ok(()) => SUCCESS,
        Err(g) => c.enqueue(Unit::new(vec![g.call], &[g.stream])),
    }
}

/// Rule 6 for one collective: sendbuff and recvbuff either do not overlap or are laid
/// out in place as NCCL documents it (see the table above).
fn check_in_place(call: &str, kind: Kind, rank: usize, send: Region, recv: Region) -> Result<(), Failure> {
    let block = match kind {
        Kind::AllGather => send.bytes,
        Kind::ReduceScatter(_) => recv.bytes,
        _ => 0,
    };
    let (in_place, layout) = match kind {
        Kind::AllGather => {
            let at = recv.at.wrapping_add(rank * block);
            (
                send.at == at,
                format!(
                    "an all-gather is in place only when sendbuff == recvbuff + rank * sendcount * size \
                     (here {:#x} + {rank} * {block} = {at:#x})",
                    recv.at
                ),
            )
        }
        Kind::ReduceScatter(_) => {
            let at = send.at.wrapping_add(rank * block);
            (
                recv.at == at,
                format!(
                    "a reduce-scatter is in place only when recvbuff == sendbuff + rank * recvcount * size \
                     (here {:#x} + {rank} * {block} = {at:#x})",
                    send.at
                ),
            )
        }
        Kind::AllReduce(_) | Kind::Broadcast(_) | Kind::Reduce(..) => {
            let name = match kind {
                Kind::AllReduce(_) => "an all-reduce",
                Kind::Broadcast(_) => "a broadcast",
                _ => "a reduce",
            };
            (
                send.at == recv.at,
                format!("{name} is in place only when sendbuff == recvbuff"),
            )
        }
    };
    if in_place || !send.overlaps(&recv) {
        return Ok(());
    }
    Err(Failure::new(
        INVALID_ARGUMENT,
        format!(
            "{call}: {send} and {recv} overlap without being in place: {layout}; any other overlap is \
             refused (real NCCL does not check this and silently computes garbage)"
        ),
    ))
}

/// The checks every collective makes before it is queued.
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
    if let Some(f) = super::injected(name) {
        return c.fail(f);
    }
    let checked = (|| -> Result<(Call, Key), Failure> {
        let dtype = DataType::from_nccl(dtype).map_err(|e| Failure::new(INVALID_ARGUMENT, format!("{name}: {e}")))?;
        let call = kind.describe(count, dtype);
        let key = check_thread(c, &call, stream)?;
        super::tuning::check_call(kind, dtype, count, c.nranks(), c.tuned())?;
        let (send_bytes, recv_bytes) = count
            .checked_mul(dtype.size())
            .and_then(|b| kind.sizes(c.rank(), c.nranks(), b))
            .ok_or_else(|| Failure::new(INVALID_ARGUMENT, format!("{call}: count too large")))?;
        if recv_bytes > 0 {
            check_buffer(c, &call, "recvbuff", recv, recv_bytes)?;
        }
        if send_bytes > 0 {
            check_buffer(c, &call, "sendbuff", send, send_bytes)?;
        }
        if send_bytes > 0 && recv_bytes > 0 {
            let region = |name, at, bytes| Region { name, at, bytes };
            check_in_place(
                &call,
                kind,
                c.rank(),
                region("sendbuff", send, send_bytes),
                region("recvbuff", recv, recv_bytes),
            )?;
        }
        let call = Call::Collective {
            kind,
            dtype,
            send,
            send_bytes,
            recv,
            recv_bytes,
            call,
        };
        Ok((call, key))
    })();
    match checked {
        Ok((call, key)) => {
            let (op, root) = match kind {
                Kind::AllReduce(op) | Kind::ReduceScatter(op) => (op.to_nccl(), 0),
                Kind::Reduce(op, root) => (op.to_nccl(), root),
                Kind::Broadcast(root) => (0, root),
                Kind::AllGather => (0, 0),
            };
            CollLine {
                op_name: name.trim_start_matches("nccl"),
                op_count: c.op_count(),
                sendbuff: send,
                recvbuff: recv,
                count,
                datatype: dtype,
                op,
                root: root as c_int,
                comm: comm as usize,
                nranks: c.nranks(),
                stream,
                device: c.device(),
            }
            .print();
            submit(comm, c, call, key)
        }
        Err(f) => c.fail(f),
    }
}

/// The operation for NCCL's number, then `then` with it; an unknown one is refused with
/// `ncclInvalidArgument` (if the communicator can be used at all).
fn with_op(name: &str, comm: *mut Comm, op: c_uint, then: impl FnOnce(Op) -> NcclResult) -> NcclResult {
    match Op::from_nccl(op) {
        Ok(op) => then(op),
        Err(e) => match usable(comm, name) {
            Ok(c) => c.fail(Failure::new(INVALID_ARGUMENT, format!("{name}: {e}"))),
            Err(code) => code,
        },
    }
}

/// `root` if it is a rank of the communicator; else it is refused with
/// `ncclInvalidArgument` (if the communicator can be used at all).
fn check_root(name: &str, comm: *mut Comm, root: c_int) -> Result<usize, NcclResult> {
    let c = usable(comm, name)?;
    usize::try_from(root).ok().filter(|&r| r < c.nranks()).ok_or_else(|| {
        let why = format!(
            "{name}: root {root} is not a rank of this communicator (0..{})",
            c.nranks()
        );
        c.fail(Failure::new(INVALID_ARGUMENT, why))
    })
}

/// Sums (or another reduction of) every rank's `sendbuff` into every rank's `recvbuff`.
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
        with_op("ncclAllReduce", comm, op, |op| {
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
    })
}

/// Copies `root`'s `sendbuff` into every rank's `recvbuff` (`sendbuff` is used on the
/// root only).
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
        let root = match check_root("ncclBroadcast", comm, root) {
            Ok(r) => r,
            Err(code) => return code,
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

/// Reduces every rank's `sendbuff` (`count` elements) into `root`'s `recvbuff`. A
/// non-root's `recvbuff` is neither checked nor written (it may be NULL), as with NCCL.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn ncclReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_uint,
    op: c_uint,
    root: c_int,
    comm: *mut Comm,
    stream: usize,
) -> NcclResult {
    entry("ncclReduce", INTERNAL_ERROR, || {
        let root = match check_root("ncclReduce", comm, root) {
            Ok(r) => r,
            Err(code) => return code,
        };
        with_op("ncclReduce", comm, op, |op| {
            let (s, r) = (sendbuff as usize, recvbuff as usize);
            collective(
                "ncclReduce",
                comm,
                Kind::Reduce(op, root),
                s,
                r,
                count,
                datatype,
                stream,
            )
        })
    })
}

/// Gathers every rank's `sendcount` elements into every rank's `recvbuff`, rank i's at
/// offset `i * sendcount`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclAllGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: c_uint,
    comm: *mut Comm,
    stream: usize,
) -> NcclResult {
    entry("ncclAllGather", INTERNAL_ERROR, || {
        let (s, r) = (sendbuff as usize, recvbuff as usize);
        collective(
            "ncclAllGather",
            comm,
            Kind::AllGather,
            s,
            r,
            sendcount,
            datatype,
            stream,
        )
    })
}

/// Reduces every rank's `sendbuff` (`nranks * recvcount` elements) element by element;
/// rank i's `recvbuff` gets block i (`recvcount` elements) of the result.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclReduceScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: c_uint,
    op: c_uint,
    comm: *mut Comm,
    stream: usize,
) -> NcclResult {
    entry("ncclReduceScatter", INTERNAL_ERROR, || {
        with_op("ncclReduceScatter", comm, op, |op| {
            let (s, r) = (sendbuff as usize, recvbuff as usize);
            collective(
                "ncclReduceScatter",
                comm,
                Kind::ReduceScatter(op),
                s,
                r,
                recvcount,
                datatype,
                stream,
            )
        })
    })
}

/// The checks of a send or receive before it is queued.
fn p2p(send: bool, buf: usize, count: usize, dtype: c_uint, peer: c_int, comm: *mut Comm, stream: usize) -> NcclResult {
    let name = if send { "ncclSend" } else { "ncclRecv" };
    let c = match usable(comm, name) {
        Ok(c) => c,
        Err(code) => return code,
    };
    if let Some(f) = super::injected(name) {
        return c.fail(f);
    }
    let checked = (|| -> Result<(Call, Key), Failure> {
        let dtype = DataType::from_nccl(dtype).map_err(|e| Failure::new(INVALID_ARGUMENT, format!("{name}: {e}")))?;
        let call = format!("{name}(count={count}, {dtype}, peer={peer})");
        let peer = usize::try_from(peer).ok().filter(|&p| p < c.nranks()).ok_or_else(|| {
            Failure::new(
                INVALID_ARGUMENT,
                format!("{call}: peer is not a rank of 0..{}", c.nranks()),
            )
        })?;
        let key = check_thread(c, &call, stream)?;
        let bytes = count
            .checked_mul(dtype.size())
            .ok_or_else(|| Failure::new(INVALID_ARGUMENT, format!("{call}: count too large")))?;
        if bytes > 0 {
            check_buffer(c, &call, if send { "sendbuff" } else { "recvbuff" }, buf, bytes)?;
        }
        let call = if send {
            Call::Send {
                peer,
                dtype,
                count,
                buf,
            }
        } else {
            Call::Recv {
                peer,
                dtype,
                count,
                buf,
            }
        };
        Ok((call, key))
    })();
    match checked {
        Ok((call, key)) => {
            // As NCCL's ncclSend and ncclRecv fill their ncclInfo: no sendbuff, the buffer
            // as recvbuff, the peer as root.
            CollLine {
                op_name: if send { "Send" } else { "Recv" },
                op_count: c.op_count(),
                sendbuff: 0,
                recvbuff: buf,
                count,
                datatype: dtype,
                op: 0,
                root: peer,
                comm: comm as usize,
                nranks: c.nranks(),
                stream,
                device: c.device(),
            }
            .print();
            submit(comm, c, call, key)
        }
        Err(f) => c.fail(f),
    }
}

/// Sends `count` elements to `peer` (completes when the peer has received them).
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

/// Receives `count` elements from `peer`.
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

/// Opens a group (groups nest; only the outermost end queues the calls).
#[unsafe(no_mangle)]
pub extern "C" fn ncclGroupStart() -> NcclResult {
    entry("ncclGroupStart", INTERNAL_ERROR, || {
        group::start();
        SUCCESS
    })
}

/// Closes a group; at the outermost end, queues each communicator's calls as one unit:
/// `ncclInProgress` if a non-blocking communicator is among them, else `ncclSuccess`
/// (or the first refusal, if a communicator failed meanwhile). A group in which a call
/// failed runs nothing and returns that call's error; the aborts queued into it (NCCL
/// 2.22 on, [`group`]) run after its calls, or are lost with it.
#[unsafe(no_mangle)]
pub extern "C" fn ncclGroupEnd() -> NcclResult {
    entry("ncclGroupEnd", INTERNAL_ERROR, || {
        let Some(ended) = group::end() else {
            return fail(INVALID_USAGE, None, "ncclGroupEnd without ncclGroupStart");
        };
        if let Some(error) = ended.error {
            drop(ended.calls);
            super::comm::lose_aborts(&ended.aborts);
            return error;
        }
        let calls = ended.calls;
        // Each communicator's calls, in issue order, communicators in order of first call.
        let mut units: Vec<(usize, Vec<Call>, Vec<Key>)> = Vec::new();
        for g in calls {
            match units.iter_mut().find(|(c, _, _)| *c == g.comm) {
                Some((_, calls, keys)) => {
                    calls.push(g.call);
                    keys.push(g.stream);
                }
                None => units.push((g.comm, vec![g.call], vec![g.stream])),
            }
        }
        let mut result = SUCCESS;
        for (comm, calls, keys) in units {
            let comm = comm as *mut Comm;
            let code = if live(comm) {
                // SAFETY: live, see `usable`.
                unsafe { &*comm }.enqueue(Unit::new(calls, &keys))
            } else {
                fail(
                    INVALID_ARGUMENT,
                    None,
                    "ncclGroupEnd: a communicator of the group was destroyed inside the group",
                )
            };
            if result == SUCCESS || (result == IN_PROGRESS && code != SUCCESS) {
                result = code;
            }
        }
        for comm in ended.aborts {
            super::comm::abort_queued(comm as *mut Comm);
        }
        result
    })
}
