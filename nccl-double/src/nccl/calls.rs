//! The collective, point-to-point and group entry points. Each call checks its
//! arguments at once (rules 1 and 5; an error is returned by the call, as NCCL's argument
//! checks are), then queues its work on its stream and returns: `ncclSuccess` for a
//! blocking communicator, `ncclInProgress` for a non-blocking one (the caller then polls
//! `ncclCommGetAsyncError`, which for the double is over at once). Inside
//! `ncclGroupStart`/`ncclGroupEnd` the checked calls wait for the outermost end, where
//! each communicator's calls are queued as one unit.

use super::comm::{Comm, live, usable};
use super::group::{self, Grouped};
use super::work::{Call, Kind, Unit};
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

/// A checked call: queued now, or kept for the end of the open group.
fn submit(comm: *mut Comm, c: &Comm, call: Call, stream: Key) -> NcclResult {
    let kept = group::add(Grouped {
        comm: comm as usize,
        call,
        stream,
    });
    match kept {
        Ok(()) if c.blocking() => SUCCESS,
        Ok(()) => IN_PROGRESS,
        Err(g) => c.enqueue(Unit::new(vec![g.call], &[g.stream])),
    }
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
    let checked = (|| -> Result<(Call, Key), Failure> {
        let dtype = DataType::from_nccl(dtype).map_err(|e| Failure::new(INVALID_ARGUMENT, format!("{name}: {e}")))?;
        let call = match kind {
            Kind::AllReduce(op) => format!("ncclAllReduce(count={count}, {dtype}, {op})"),
            Kind::Broadcast(root) => format!("ncclBroadcast(count={count}, {dtype}, root={root})"),
        };
        let key = check_thread(c, &call, stream)?;
        let bytes = count
            .checked_mul(dtype.size())
            .ok_or_else(|| Failure::new(INVALID_ARGUMENT, format!("{call}: count too large")))?;
        if bytes > 0 {
            check_buffer(c, &call, "recvbuff", recv, bytes)?;
            let reads_send = match kind {
                Kind::AllReduce(_) => true,
                Kind::Broadcast(root) => root == c.rank(),
            };
            if reads_send {
                check_buffer(c, &call, "sendbuff", send, bytes)?;
                if send != recv && send < recv + bytes && recv < send + bytes {
                    return Err(Failure::new(
                        INVALID_ARGUMENT,
                        format!("{call}: sendbuff and recvbuff overlap without being the same (in place) buffer"),
                    ));
                }
            }
        }
        let call = Call::Collective {
            kind,
            dtype,
            count,
            send,
            recv,
            call,
        };
        Ok((call, key))
    })();
    match checked {
        Ok((call, key)) => submit(comm, c, call, key),
        Err(f) => c.fail(f),
    }
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

/// Copies `root`'s `sendbuff` into every rank's `recvbuff`.
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
        let Some(root) = usize::try_from(root).ok().filter(|&r| r < c.nranks()) else {
            let why = format!(
                "ncclBroadcast: root {root} is not a rank of this communicator (0..{})",
                c.nranks()
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

/// The checks of a send or receive before it is queued.
fn p2p(send: bool, buf: usize, count: usize, dtype: c_uint, peer: c_int, comm: *mut Comm, stream: usize) -> NcclResult {
    let name = if send { "ncclSend" } else { "ncclRecv" };
    let c = match usable(comm, name) {
        Ok(c) => c,
        Err(code) => return code,
    };
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
        Ok((call, key)) => submit(comm, c, call, key),
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
/// (or the first refusal, if a communicator failed meanwhile).
#[unsafe(no_mangle)]
pub extern "C" fn ncclGroupEnd() -> NcclResult {
    entry("ncclGroupEnd", INTERNAL_ERROR, || {
        let Some(calls) = group::end() else {
            return fail(INVALID_USAGE, None, "ncclGroupEnd without ncclGroupStart");
        };
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
        result
    })
}
