//! The job ops `--op` names, one function per family (an op and its in-place form), run
//! once for one element type, count and reduction: each queues its calls, waits for them
//! and reads the result back.

use crate::args::Args;
use crate::collectives::{Collectives, reduce_op};
use crate::ffi::Fail;
use crate::values::{UNTOUCHED, Value, show, values};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use std::sync::Arc;

/// One run of an op: its arguments (one op, type, reduction and count), the rank, its
/// device, context and stream, and the communicator.
pub struct Run<'a, C> {
    /// The arguments of this one run.
    pub a: &'a Args,
    /// The rank.
    pub rank: usize,
    /// The rank's device.
    pub device: usize,
    /// The device's context.
    pub ctx: &'a Arc<CudaContext>,
    /// The communicator.
    pub comm: &'a C,
    /// The stream the calls are queued on.
    pub stream: &'a Arc<CudaStream>,
}

impl<C> Run<'_, C> {
    /// The rule this rank breaks (`--break`), or "".
    fn brk(&self) -> &str {
        self.a.brk.as_deref().unwrap_or("")
    }

    /// What every result line starts with.
    fn head(&self) -> String {
        let Run { a, rank, device, .. } = self;
        format!("rank={rank} device={device} op={} dtype={}", a.op, a.dtype)
    }
}

/// Runs the op once for element type `T`.
pub fn op<T: Value, C: Collectives>(run: &Run<C>, lines: &mut Vec<String>) -> Result<(), Fail> {
    match run.a.op.as_str() {
        "allreduce" | "allreduce-inplace" => all_reduce::<T, C>(run, lines),
        "broadcast" | "broadcast-inplace" => broadcast::<T, C>(run, lines),
        "reduce" | "reduce-inplace" => reduce::<T, C>(run, lines),
        "allgather" | "allgather-inplace" => all_gather::<T, C>(run, lines),
        "reducescatter" | "reducescatter-inplace" => reduce_scatter::<T, C>(run, lines),
        "alltoall" => all_to_all::<T, C>(run, lines),
        "ring" | "pairs" => send_recv::<T, C>(run, lines),
        other => Err(Fail(format!("unknown op {other}"))),
    }
}

/// All-reduce, out of place or in place, and the rules it can break.
fn all_reduce<T: Value, C: Collectives>(run: &Run<C>, lines: &mut Vec<String>) -> Result<(), Fail> {
    let (a, rank, device, ctx, comm, stream) = (run.a, run.rank, run.device, run.ctx, run.comm, run.stream);
    let (brk, head) = (run.brk(), run.head());
    let mut count = a.count;
    let mut red = a.reduce.as_str();
    match brk {
        "mismatch-count" => count += 1,
        "mismatch-op" => red = if red == "max" { "min" } else { "max" },
        "mismatch-kind" => {
            let mut buf = stream.clone_htod(&values::<T>(count, |i| i as f64))?;
            comm.broadcast_in_place(&mut buf, 0)?;
            return comm.settle("broadcast_in_place");
        }
        "mismatch-dtype" => {
            let send = stream.clone_htod(&vec![1f64; count])?;
            let mut recv = stream.alloc_zeros::<f64>(count)?;
            comm.all_reduce(&send, &mut recv, &reduce_op(red)?)?;
            return comm.settle("all_reduce");
        }
        "overlap" => {
            // sendbuff one element past recvbuff, in one buffer.
            let mut buf = stream.clone_htod(&values::<T>(count + 1, |i| (rank + i) as f64))?;
            let send = alias(stream, &mut buf, 1, count);
            let r = comm.all_reduce(&send, &mut buf, &reduce_op(red)?);
            send.leak();
            r?;
            return comm.settle("all_reduce");
        }
        _ => {}
    }
    let input = values::<T>(count, |i| (rank + 1 + i) as f64);
    let op = reduce_op(red)?;
    let out = if a.op == "allreduce-inplace" {
        let mut buf = stream.clone_htod(&input)?;
        let _other = misuse_context(brk, device)?;
        comm.all_reduce_in_place(&mut buf, &op)?;
        comm.settle("all_reduce_in_place")?;
        stream.clone_dtoh(&buf)?
    } else {
        let send = match brk {
            "host-buffer" => {
                // SAFETY: on purpose: host memory posing as device memory.
                unsafe { stream.upgrade_device_ptr::<T>(input.as_ptr() as u64, count) }
            }
            "freed-buffer" => {
                let gone = stream.clone_htod(&input)?;
                let (ptr, rec) = gone.device_ptr(stream);
                drop(rec);
                drop(gone);
                // SAFETY: on purpose: memory that was just freed.
                unsafe { stream.upgrade_device_ptr::<T>(ptr, count) }
            }
            "count-too-large" => {
                let short = stream.clone_htod(&input[..count - 1])?;
                // SAFETY: on purpose: one element more than was allocated.
                unsafe { stream.upgrade_device_ptr::<T>(short.leak(), count) }
            }
            "other-device-buffer" => {
                let other = CudaContext::new((device + 1) % CudaContext::device_count()? as usize)?;
                let there = other.default_stream().clone_htod(&input)?;
                ctx.bind_to_thread()?;
                let mut recv = stream.alloc_zeros::<T>(count)?;
                comm.all_reduce(&there, &mut recv, &op)?;
                return comm.settle("all_reduce");
            }
            _ => stream.clone_htod(&input)?,
        };
        let mut recv = stream.alloc_zeros::<T>(count)?;
        let _other = misuse_context(brk, device)?;
        let r = comm.all_reduce(&send, &mut recv, &op);
        if matches!(brk, "host-buffer" | "freed-buffer" | "count-too-large") {
            send.leak();
        }
        r?;
        comm.settle("all_reduce")?;
        stream.clone_dtoh(&recv)?
    };
    lines.push(format!("{head} reduce={red} result={}", show(&out)));
    Ok(())
}

/// Broadcast from every root in turn (or `--root`), out of place or in place.
fn broadcast<T: Value, C: Collectives>(run: &Run<C>, lines: &mut Vec<String>) -> Result<(), Fail> {
    let (a, rank, device, comm, stream) = (run.a, run.rank, run.device, run.comm, run.stream);
    let (brk, world, head) = (run.brk(), a.world, run.head());
    let roots: Vec<usize> = a.root.map_or_else(|| (0..world).collect(), |r| vec![r]);
    for root in roots {
        let mut count = a.count;
        let mut root_arg = root as i32;
        match brk {
            "mismatch-root" => root_arg = ((root + 1) % world) as i32,
            "mismatch-count" => count += 1,
            "root-out-of-range" => root_arg = world as i32,
            _ => {}
        }
        let data = values::<T>(count, |i| (100 * root + i) as f64);
        let out = if brk == "overlap" && rank == root {
            // sendbuff one element past recvbuff, in one buffer.
            let mut buf = stream.clone_htod(&values::<T>(count + 1, |i| (100 * root + i) as f64))?;
            let send = alias(stream, &mut buf, 1, count);
            let mut recv = alias(stream, &mut buf, 0, count);
            let r = comm.broadcast(Some(&send), &mut recv, root_arg);
            send.leak();
            recv.leak();
            r?;
            comm.settle("broadcast")?;
            stream.clone_dtoh(&buf)?
        } else if a.op == "broadcast-inplace" {
            let mut buf = if rank == root {
                stream.clone_htod(&data)?
            } else {
                stream.alloc_zeros::<T>(count)?
            };
            let _other = misuse_context(brk, device)?;
            comm.broadcast_in_place(&mut buf, root_arg)?;
            comm.settle("broadcast_in_place")?;
            stream.clone_dtoh(&buf)?
        } else {
            let send = if rank == root {
                Some(stream.clone_htod(&data)?)
            } else {
                None
            };
            let mut recv = stream.alloc_zeros::<T>(count)?;
            let _other = misuse_context(brk, device)?;
            comm.broadcast(send.as_ref(), &mut recv, root_arg)?;
            comm.settle("broadcast")?;
            stream.clone_dtoh(&recv)?
        };
        lines.push(format!("{head} root={root} result={}", show(&out)));
    }
    Ok(())
}

/// Reduce to every root in turn (or `--root`), out of place or in place.
fn reduce<T: Value, C: Collectives>(run: &Run<C>, lines: &mut Vec<String>) -> Result<(), Fail> {
    let (a, rank, comm, stream) = (run.a, run.rank, run.comm, run.stream);
    let (brk, world, head) = (run.brk(), a.world, run.head());
    let roots: Vec<usize> = a.root.map_or_else(|| (0..world).collect(), |r| vec![r]);
    let (count, red) = (a.count, a.reduce.as_str());
    let op = reduce_op(red)?;
    for root in roots {
        let root_arg = if brk == "root-out-of-range" {
            world as i32
        } else {
            root as i32
        };
        let input = values::<T>(count, |i| (rank + 1 + i) as f64);
        let out = if a.op == "reduce-inplace" {
            let mut buf = upload(stream, &input)?;
            comm.reduce_in_place(&mut buf.slice_mut(..count), &op, root_arg)?;
            comm.settle("reduce_in_place")?;
            Some(download(stream, &buf, count)?)
        } else if brk == "overlap" {
            // sendbuff one element past recvbuff, in one buffer.
            let mut buf = upload(stream, &values::<T>(count + 1, |i| (rank + i) as f64))?;
            let send = alias(stream, &mut buf, 1, count);
            let r = comm.reduce(&send, Some(&mut buf.slice_mut(..count)), &op, root_arg);
            send.leak();
            r?;
            comm.settle("reduce")?;
            Some(download(stream, &buf, count)?)
        } else if rank != root && rank % 2 == 1 {
            // A non-root's recvbuff is not used: NULL, as cudarc's reduce(.., None, ..).
            let send = upload(stream, &input)?;
            comm.reduce(&send.slice(..count), None::<&mut CudaSlice<T>>, &op, root_arg)?;
            comm.settle("reduce")?;
            None
        } else {
            let send = upload(stream, &input)?;
            let mut recv = upload(stream, &values::<T>(count, |_| UNTOUCHED))?;
            comm.reduce(&send.slice(..count), Some(&mut recv.slice_mut(..count)), &op, root_arg)?;
            comm.settle("reduce")?;
            Some(download(stream, &recv, count)?)
        };
        let out = out.map(|v| show(&v)).unwrap_or_default();
        lines.push(format!("{head} reduce={red} count={count} root={root} result={out}"));
    }
    Ok(())
}

/// All-gather, out of place or in place.
fn all_gather<T: Value, C: Collectives>(run: &Run<C>, lines: &mut Vec<String>) -> Result<(), Fail> {
    let (a, rank, comm, stream) = (run.a, run.rank, run.comm, run.stream);
    let (brk, world, head) = (run.brk(), a.world, run.head());
    let count = a.count;
    let total = world * count;
    let input = values::<T>(count, |i| (rank * count + i + 1) as f64);
    let out = if a.op == "allgather-inplace" || brk == "overlap" {
        // This rank's block of recvbuff holds its input; sendbuff points at it (or,
        // for --break overlap, at the start of recvbuff: not in place on rank > 0).
        let at = if brk == "overlap" { 0 } else { rank * count };
        let mut all = values::<T>(total, |_| UNTOUCHED);
        all[rank * count..(rank + 1) * count].copy_from_slice(&input);
        let mut buf = upload(stream, &all)?;
        comm.all_gather_in_place(&mut buf.slice_mut(..total), at, count)?;
        comm.settle("all_gather_in_place")?;
        download(stream, &buf, total)?
    } else {
        let send = upload(stream, &input)?;
        let untouched = values::<T>(total, |_| UNTOUCHED);
        let mut recv = if brk == "recv-too-small" {
            one_short(stream, &untouched)?
        } else {
            upload(stream, &untouched)?
        };
        let r = comm.all_gather(&send.slice(..count), &mut recv.slice_mut(..total));
        if brk == "recv-too-small" {
            recv.leak();
            return r.and(Err(Fail(
                "all_gather into a recvbuff one element short was accepted".into(),
            )));
        }
        r?;
        comm.settle("all_gather")?;
        download(stream, &recv, total)?
    };
    lines.push(format!("{head} count={count} result={}", show(&out)));
    Ok(())
}

/// Reduce-scatter, out of place or in place.
fn reduce_scatter<T: Value, C: Collectives>(run: &Run<C>, lines: &mut Vec<String>) -> Result<(), Fail> {
    let (a, rank, comm, stream) = (run.a, run.rank, run.comm, run.stream);
    let (brk, world, head) = (run.brk(), a.world, run.head());
    let (count, red) = (a.count, a.reduce.as_str());
    let op = reduce_op(red)?;
    let total = world * count;
    let input = values::<T>(total, |i| (rank + 1 + i) as f64);
    let out = if a.op == "reducescatter-inplace" || brk == "overlap" {
        // recvbuff is this rank's block of sendbuff (or, for --break overlap, its
        // start: not in place on rank > 0).
        let at = if brk == "overlap" { 0 } else { rank * count };
        let mut buf = upload(stream, &input)?;
        comm.reduce_scatter_in_place(&mut buf.slice_mut(..total), at, count, &op)?;
        comm.settle("reduce_scatter_in_place")?;
        download(stream, &buf, total)?[at..at + count].to_vec()
    } else {
        let send = if brk == "send-too-small" {
            one_short(stream, &input)?
        } else {
            upload(stream, &input)?
        };
        let mut recv = upload(stream, &values::<T>(count, |_| UNTOUCHED))?;
        let r = comm.reduce_scatter(&send.slice(..total), &mut recv.slice_mut(..count), &op);
        if brk == "send-too-small" {
            send.leak();
        }
        r?;
        comm.settle("reduce_scatter")?;
        download(stream, &recv, count)?
    };
    lines.push(format!("{head} reduce={red} count={count} result={}", show(&out)));
    Ok(())
}

/// All-to-all as nccl-tests does it: sends and receives in one group.
fn all_to_all<T: Value, C: Collectives>(run: &Run<C>, lines: &mut Vec<String>) -> Result<(), Fail> {
    let (a, rank, comm, stream) = (run.a, run.rank, run.comm, run.stream);
    let (brk, world, head) = (run.brk(), a.world, run.head());
    // nccl-tests' all-to-all: block p of sendbuff goes to rank p, block p of
    // recvbuff comes from rank p, every rank (itself included) in one group.
    let count = a.count;
    let total = world * count;
    let input = values::<T>(total, |j| ((rank * world + j / count) * count + j % count + 1) as f64);
    let mut send = upload(stream, &input)?;
    let mut recv = upload(stream, &values::<T>(total, |_| UNTOUCHED))?;
    comm.group_start()?;
    for p in 0..world {
        let block = p * count..(p + 1) * count;
        comm.send(&send.slice(block.clone()), p as i32)?;
        if brk == "overlap" {
            // In place: receiving into the block just sent.
            comm.recv(&mut send.slice_mut(block), p as i32)?;
        } else {
            comm.recv(&mut recv.slice_mut(block), p as i32)?;
        }
    }
    comm.group_end()?;
    comm.settle("ncclGroupEnd")?;
    let out = download(stream, &recv, total)?;
    lines.push(format!("{head} count={count} result={}", show(&out)));
    Ok(())
}

/// Send/recv in a group: around the ring, or between pairs of ranks.
fn send_recv<T: Value, C: Collectives>(run: &Run<C>, lines: &mut Vec<String>) -> Result<(), Fail> {
    let (a, rank, comm, stream) = (run.a, run.rank, run.comm, run.stream);
    let (brk, world, head) = (run.brk(), a.world, run.head());
    let (to, from) = if a.op == "ring" {
        ((rank + 1) % world, (rank + world - 1) % world)
    } else {
        (rank ^ 1, rank ^ 1)
    };
    let send = stream.clone_htod(&values::<T>(a.count, |i| (1000 * (rank + 1) + i) as f64))?;
    let recv_count = if brk == "recv-size" { a.count + 1 } else { a.count };
    let mut recv = stream.alloc_zeros::<T>(recv_count)?;
    comm.group_start()?;
    comm.send(&send, to as i32)?;
    comm.recv(&mut recv, from as i32)?;
    comm.group_end()?;
    comm.settle("ncclGroupEnd")?;
    let out = stream.clone_dtoh(&recv)?;
    lines.push(format!("{head} from={from} result={}", show(&out)));
    Ok(())
}

/// `data` on the device: a buffer of at least one element (the driver refuses 0-byte
/// allocations), of which the call uses `data.len()`.
fn upload<T: Value>(stream: &Arc<CudaStream>, data: &[T]) -> Result<CudaSlice<T>, Fail> {
    if data.is_empty() {
        return Ok(stream.alloc_zeros::<T>(1)?);
    }
    Ok(stream.clone_htod(data)?)
}

/// The first `n` elements of `buf`, read back.
fn download<T: Value>(stream: &Arc<CudaStream>, buf: &CudaSlice<T>, n: usize) -> Result<Vec<T>, Fail> {
    let mut v = stream.clone_dtoh(buf)?;
    v.truncate(n);
    Ok(v)
}

/// A second handle on `n` elements of `buf` from element `at` on (`--break overlap`):
/// leaked on purpose with [`CudaSlice::leak`] once used, as `buf` owns the memory.
fn alias<T: Value>(stream: &Arc<CudaStream>, buf: &mut CudaSlice<T>, at: usize, n: usize) -> CudaSlice<T> {
    let (p, rec) = buf.device_ptr_mut(stream);
    drop(rec);
    // SAFETY: on purpose: memory `buf` owns, seen twice; never freed through this handle.
    unsafe { stream.upgrade_device_ptr::<T>(p + (at * std::mem::size_of::<T>()) as u64, n) }
}

/// A buffer that claims `n` elements over an allocation of `n - 1` (`--break
/// *-too-small`): leaked on purpose with [`CudaSlice::leak`] once used.
fn one_short<T: Value>(stream: &Arc<CudaStream>, data: &[T]) -> Result<CudaSlice<T>, Fail> {
    let short = upload(stream, &data[..data.len().saturating_sub(1)])?;
    // SAFETY: on purpose: one element more than was allocated.
    Ok(unsafe { stream.upgrade_device_ptr::<T>(short.leak(), data.len()) })
}

/// Right before a collective (cudarc binds the context again for every copy): leaves no
/// context current (`no-context-use`) or another device's (`wrong-context-use`).
fn misuse_context(brk: &str, device: usize) -> Result<Option<Arc<CudaContext>>, Fail> {
    match brk {
        "no-context-use" => {
            // SAFETY: unbinding the context, on purpose.
            unsafe { cudarc::driver::result::ctx::set_current(std::ptr::null_mut()) }?;
            Ok(None)
        }
        // Making another device's context makes it current on this thread.
        "wrong-context-use" => {
            let n = CudaContext::device_count()? as usize;
            Ok(Some(CudaContext::new((device + 1) % n)?))
        }
        _ => Ok(None),
    }
}
