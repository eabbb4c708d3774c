//! All-to-all: every rank's buffer is `n` blocks of `count` elements; block j of rank i
//! goes to rank j, where it lands as block i. NCCL has no call for it: programs (and
//! nccl-tests' `alltoall`) group one `ncclSend` and one `ncclRecv` per peer.

pub mod direct;
pub mod pairwise;
pub mod single_copy;

use super::tuner::Algorithm;
use super::{Collective, DeviceCall, HostCall, Shape, Source, all_but_own, whole};
use crate::backend::calls::Call;
use crate::backend::cpu::{Cpu, keep};
use crate::backend::nccl::Nccl;
use crate::record::{self};
use anyhow::{Context, Result};
use cudarc::nccl::sys;
use std::ffi::{c_int, c_void};

/// All-to-all.
pub const ALL_TO_ALL: Collective = Collective {
    name: "alltoall",
    title: "all-to-all",
    nccl_name: "ncclSend/ncclRecv",
    tag: 6,
    rooted: false,
    reduces: false,
    counts: |count, ranks| (ranks * count, ranks * count),
    in_place: whole,
    bus_factor: all_but_own,
    source,
    cpu,
    nccl,
};

fn source(shape: &Shape, rank: usize, i: usize) -> Source {
    let count = shape.count.max(1);
    Source::From {
        rank: i / count,
        index: rank * count + i % count,
    }
}

/// One group: a send of block j to every rank j and a receive of block i from every rank
/// i, this rank included. In place, the blocks to send are copied aside first, since the
/// receives overwrite them.
///
/// # Safety
///
/// As [`Collective::nccl`] says.
unsafe fn nccl(n: &Nccl, c: &DeviceCall) -> Result<()> {
    let bytes = c.count * c.elem;
    let send = match c.send == c.recv.cast_const() {
        true => n.copy_aside(c.send, bytes * n.world())?,
        false => c.send,
    };
    n.group_start()?;
    for peer in 0..n.world() {
        let block = |base: *const c_void| base.wrapping_byte_add(peer * bytes);
        let call = |doing: String, function, buff, at: *const c_void| {
            Call::new(doing, function)
                .ptr(buff, at)
                .arg("count", c.count)
                .named("datatype", c.datatype)
                .arg("peer", peer)
                .bytes(bytes)
        };
        let what = call(
            format!("all-to-all: send to rank {peer}"),
            "ncclSend",
            "sendbuff",
            block(send),
        );
        let sent = n.call(what, |comm, stream| {
            // SAFETY: block `peer` of the send buffer (or of the copy aside, which this rank
            // keeps until the stream has used it): `count` elements inside the buffer this
            // function's contract vouches for; comm and stream are Nccl::call's, live.
            unsafe { sys::ncclSend(block(send), c.count, c.datatype, peer as c_int, comm, stream) }
        });
        let what = call(
            format!("all-to-all: receive from rank {peer}"),
            "ncclRecv",
            "recvbuff",
            block(c.recv),
        );
        let got = sent.and_then(|()| {
            n.call(what, |comm, stream| {
                // SAFETY: block `peer` of the receive buffer, `count` elements inside the
                // buffer this function's contract vouches for; comm and stream as above.
                unsafe {
                    sys::ncclRecv(
                        block(c.recv).cast_mut(),
                        c.count,
                        c.datatype,
                        peer as c_int,
                        comm,
                        stream,
                    )
                }
            })
        });
        if got.is_err() {
            let _ = n.group_end();
            return got;
        }
    }
    n.group_end()
}

/// All-to-all on the CPU backend: this rank's own block is a copy; the others travel as
/// the tuner says ([`super::tuner::choose`]): a small buffer [`direct`], every block
/// straight to its rank; else by the [`pairwise`] exchange, `n - 1` steps, or out of
/// place on one host each rank copies its blocks straight from the others' send buffers
/// ([`single_copy`]).
fn cpu(cpu: &Cpu, call: HostCall) -> Result<()> {
    let block = call.count * call.elem();
    let (n, r, tag) = (cpu.world(), cpu.rank(), ALL_TO_ALL.tag);
    let HostCall { send, buf, .. } = call;
    let blk = |i: usize| i * block..(i + 1) * block;
    // A buffer larger than the caches is written around them (nothing reads it back soon).
    let streaming = cpu.streams(buf.len());
    // In place, this rank's own block is where it belongs already.
    if let Some(s) = send {
        keep(&mut buf[blk(r)], &s[blk(r)], streaming);
    }
    record::wrote(&buf[blk(r)]);
    let chosen = cpu.choose(&ALL_TO_ALL, buf.len());
    if chosen == Algorithm::Direct {
        // Every send goes before the first receive: in place, nothing need go aside.
        return direct::all_to_all(cpu, send, buf, block);
    }
    // Otherwise blocks leave while others arrive: in place, the blocks to send are put
    // aside first, since the receives overwrite them.
    let mut aside = None;
    let src: &[u8] = match send {
        Some(s) => s,
        None => {
            let mut guard = cpu.scratch(buf.len());
            for i in (0..n).filter(|&i| i != r) {
                keep(&mut guard.0[blk(i)], &buf[blk(i)], streaming);
            }
            &aside.insert(guard).0[..buf.len()]
        }
    };
    // On one host each rank copies its block of every other rank's send buffer straight
    // from it: one copy per byte, where a slot takes two. In place the blocks to send are
    // the copy aside, which lies in the arena too when it is large (`Cpu::scratch`); where
    // any rank's does not, every rank sees that and all go pairwise.
    if chosen == Algorithm::SingleCopy
        && let Some(theirs) = cpu.share_regions(tag, &[src], &[src.len()]).context("all-to-all")?
    {
        return single_copy::all_to_all(cpu, buf, block, &theirs, streaming);
    }
    pairwise::all_to_all(cpu, src, buf, block, streaming)
}
