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

/// `ncclCommSplit` of the job's communicator by `--color` and `--key` (default: the rank),
/// with the config `--split-config`, after `--first allreduce` (an all-reduce on the
/// parent, whose failure is taken: its state is reported). A non-blocking parent is
/// polled until the split is done. Then, if this rank got a communicator, its
/// `ncclCommCount` and `ncclCommUserRank`, and an in-place all-reduce on it of `parent
/// rank + 1` (the raw result of the call, then the sum: which ranks are in it). Reports
/// `rank=R op=split color=C key=K first=… split=… newcomm=null|set count=… user_rank=…
/// child_call=… sum=…` and exits 0 whatever the split said.
pub fn split(a: &Args, id: Id) -> Result<Vec<String>, Fail> {
    let (_device, _ctx, stream) = setup(a, a.rank)?;
    let (comm, mut lines) = Raw::join(&stream, a.rank, a.world, id, a.nonblocking)?;
    let first = match a.first.as_deref() {
        None => "none".to_string(),
        Some("allreduce") => {
            let mut buf = stream.clone_htod(&[1f32])?;
            let done = comm
                .all_reduce_in_place(&mut buf, &ReduceOp::Sum)
                .and_then(|()| comm.settle("all_reduce"));
            match done {
                Ok(()) => "ok".to_string(),
                Err(_) => format!("failed,parent_state={:?}", comm.state()?),
            }
        }
        Some(other) => return Err(Fail(format!("unknown --first {other}"))),
    };
    let version = result::get_nccl_version().map_err(nccl("ncclGetVersion"))?;
    // NCCL_CONFIG_INITIALIZER, then what --split-config asks.
    let mut config = sys::ncclConfig_t {
        size: std::mem::size_of::<sys::ncclConfig_t>(),
        magic: 0xcafe_beef,
        version: version as u32,
        blocking: i32::MIN,
        cgaClusterSize: i32::MIN,
        minCTAs: i32::MIN,
        maxCTAs: i32::MIN,
        netName: std::ptr::null(),
        splitShare: i32::MIN,
    };
    let child_nonblocking = match a.split_config.as_str() {
        "null" => a.nonblocking,
        "blocking" | "unset" | "no-magic" => {
            config.blocking = if a.split_config == "blocking" { 1 } else { i32::MIN };
            config.magic = if a.split_config == "no-magic" { 0 } else { config.magic };
            false
        }
        "nonblocking" => {
            config.blocking = 0;
            true
        }
        other => return Err(Fail(format!("unknown --split-config {other}"))),
    };
    let config_ptr: *mut sys::ncclConfig_t = if a.split_config == "null" {
        std::ptr::null_mut()
    } else {
        &mut config
    };
    let key = a.key.unwrap_or(a.rank as i32);
    let mut newcomm: sys::ncclComm_t = std::ptr::null_mut();
    // SAFETY: a live communicator, a valid out pointer (alive until the split is done:
    // polled below) and a config or NULL.
    let said = status(unsafe { sys::ncclCommSplit(comm.comm(), a.color, key, &mut newcomm, config_ptr) }.result());
    if a.nonblocking && (said == "ncclSuccess" || said == "ncclInProgress") {
        comm.wait_ready("ncclCommSplit")?;
    }
    let mut line = format!(
        "rank={} op=split color={} key={key} first={first} split={said} newcomm={}",
        a.rank,
        a.color,
        if newcomm.is_null() { "null" } else { "set" }
    );
    if !newcomm.is_null() {
        let child = Raw::adopt(&stream, newcomm, child_nonblocking);
        let (mut count, mut user_rank) = (-1, -1);
        // SAFETY: a live communicator and valid pointers.
        let counted = status(unsafe { sys::ncclCommCount(newcomm, &mut count) }.result());
        // SAFETY: as above.
        let ranked = status(unsafe { sys::ncclCommUserRank(newcomm, &mut user_rank) }.result());
        let mut buf = stream.clone_htod(&[(a.rank + 1) as f32])?;
        let (ptr, written) = buf.device_ptr_mut(&stream);
        // SAFETY: an in-place all-reduce of a live one-element device buffer.
        let call = status(unsafe {
            result::all_reduce(
                ptr as _,
                ptr as _,
                1,
                sys::ncclDataType_t::ncclFloat32,
                sys::ncclRedOp_t::ncclSum,
                newcomm,
                stream.cu_stream() as _,
            )
        });
        drop(written);
        if call == "ncclInProgress" {
            child.wait_ready("ncclAllReduce")?;
        }
        child.settle("ncclAllReduce")?;
        let sum = stream.clone_dtoh(&buf)?;
        line.push_str(&format!(
            " count={count} count_call={counted} user_rank={user_rank} user_rank_call={ranked} child_call={call} sum={}",
            show(&sum)
        ));
    }
    lines.push(line);
    Ok(lines)
}
