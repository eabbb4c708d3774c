//! Ending communicators, stuck work and aborts: what cudarc's safe `Comm` cannot do, so
//! through the raw API only.

use crate::args::Args;
use crate::collectives::Collectives;
use crate::ffi::{Fail, nccl, status};
use crate::job::{misbehave, setup};
use crate::ms;
use crate::raw::Raw;
use crate::values::show;
use cudarc::driver::DevicePtrMut;
use cudarc::nccl::{Id, ReduceOp, result, sys};
use std::time::{Duration, Instant};

/// What cudarc's safe `Comm` cannot do (it only aborts): an all-reduce (after
/// `--op-delay-ms`), then `ncclCommFinalize` (timed: blocking, it waits for the work;
/// non-blocking, it says `ncclInProgress` and `ncclCommGetAsyncError` is polled until the
/// work is done), then `ncclCommDestroy`. Then two misuses: a collective on the
/// finalized communicator, and an abort of the destroyed one.
pub fn finalize(a: &Args, id: Id) -> Result<Vec<String>, Fail> {
    let (_device, _ctx, stream) = setup(a, a.rank)?;
    let (comm, mut lines) = Raw::join(&stream, a.rank, a.world, id, a.nonblocking)?;
    let mut buf = stream.clone_htod(&vec![(a.rank + 1) as f32; a.count])?;
    std::thread::sleep(Duration::from_millis(a.op_delay_ms));
    comm.all_reduce_in_place(&mut buf, &ReduceOp::Sum)?;
    let t = Instant::now();
    // SAFETY: a live communicator.
    let finalized = status(unsafe { result::comm_finalize(comm.comm()) });
    let finalize_ms = ms(t);
    let mut polls = 0;
    if finalized == "ncclInProgress" {
        polls = comm.wait_ready("ncclCommFinalize")?;
    } else if finalized != "ncclSuccess" {
        return Err(Fail(format!("ncclCommFinalize returned {finalized}")));
    }
    let settled_ms = ms(t);
    let out = stream.clone_dtoh(&buf)?;
    let (ptr, _written) = buf.device_ptr_mut(&stream);
    // SAFETY: an in-place all-reduce of a live device buffer, on purpose after finalize.
    let after_finalize = status(unsafe {
        result::all_reduce(
            ptr as _,
            ptr as _,
            a.count,
            sys::ncclDataType_t::ncclFloat32,
            sys::ncclRedOp_t::ncclSum,
            comm.comm(),
            stream.cu_stream() as _,
        )
    });
    let handle = comm.comm.replace(std::ptr::null_mut());
    // SAFETY: the communicator is live until destroyed, and not used after (but for the
    // abort, which the double refuses).
    unsafe { result::comm_destroy(handle) }.map_err(nccl("ncclCommDestroy"))?;
    // SAFETY: on purpose, the handle of the communicator just destroyed: the double
    // keeps the live communicators' addresses and refuses any other without using it.
    let abort_after_destroy = status(unsafe { result::comm_abort(handle) });
    lines.push(format!(
        "rank={} op=raw finalize={finalized} finalize_ms={finalize_ms} in_progress_polls={polls} \
         settled_ms={settled_ms} result={} after_finalize={after_finalize} abort_after_destroy={abort_after_destroy}",
        a.rank,
        show(&out)
    ));
    Ok(lines)
}

/// A collective whose peer may never make its call (the peer misbehaves with `--break`):
/// the call must return at once, the send buffer's free must not block, the stream must
/// stay busy for `--watch-ms` with no error reported, and `ncclCommAbort` must free the
/// stream at once. Reports each, timed.
pub fn watch(a: &Args, id: Id) -> Result<Vec<String>, Fail> {
    let (_device, _ctx, stream) = setup(a, a.rank)?;
    let (comm, mut lines) = Raw::join(&stream, a.rank, a.world, id, a.nonblocking)?;
    if let Some(done) = misbehave(a, a.rank, &comm) {
        return done;
    }
    let send = stream.clone_htod(&vec![1f32; a.count])?;
    let mut recv = stream.alloc_zeros::<f32>(a.count)?;
    let t = Instant::now();
    comm.all_reduce(&send, &mut recv, &ReduceOp::Sum)?;
    let call_ms = ms(t);
    let t = Instant::now();
    drop(send);
    let free_ms = ms(t);
    // An event recorded after the collective completes with it (cuEventQuery).
    let event = stream.record_event(None)?;
    let (mut busy, mut idle, mut states) = (0, 0, std::collections::BTreeSet::new());
    let end = Instant::now() + Duration::from_millis(a.watch_ms);
    while Instant::now() < end {
        if comm.stream_idle()? {
            idle += 1;
        } else {
            busy += 1;
        }
        states.insert(format!("{:?}", comm.state()?));
        std::thread::sleep(Duration::from_millis(10));
    }
    let event_done_while_stuck = event.is_complete();
    let t = Instant::now();
    comm.abort()?;
    let abort_ms = ms(t);
    let idle_after_abort = comm.stream_idle()?;
    // Neither waits any more: the work before them was dropped.
    event.synchronize()?;
    stream.synchronize()?;
    let event_done_after_abort = event.is_complete();
    drop(recv);
    let states: Vec<String> = states.into_iter().collect();
    lines.push(format!(
        "rank={} op=watch call_ms={call_ms} free_ms={free_ms} busy_polls={busy} idle_polls={idle} states={} \
         abort_ms={abort_ms} idle_after_abort={idle_after_abort} event_done_while_stuck={event_done_while_stuck} \
         event_done_after_abort={event_done_after_abort}",
        a.rank,
        states.join(",")
    ));
    Ok(lines)
}

/// A non-blocking init that cannot finish (a rank is missing): `ncclCommGetAsyncError`
/// must say `ncclInProgress` for `--abort-after-ms`, then `ncclCommAbort` must end it at
/// once.
pub fn init_abort(a: &Args, id: Id) -> Result<Vec<String>, Fail> {
    let (_device, _ctx, stream) = setup(a, a.rank)?;
    let comm = Raw::start(&stream, a.rank, a.world, id, true)?;
    let (mut polls, mut states) = (0, std::collections::BTreeSet::new());
    let end = Instant::now() + Duration::from_millis(a.abort_after_ms);
    while Instant::now() < end {
        states.insert(format!("{:?}", comm.state()?));
        polls += 1;
        std::thread::sleep(Duration::from_millis(5));
    }
    let t = Instant::now();
    comm.abort()?;
    let abort_ms = ms(t);
    let states: Vec<String> = states.into_iter().collect();
    Ok(vec![format!(
        "rank={} op=init-abort polls={polls} states={} abort_ms={abort_ms}",
        a.rank,
        states.join(",")
    )])
}
