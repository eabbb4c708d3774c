//! Broadcast (`ncclBroadcast`): the root's buffer is copied into every rank's buffer.

use super::tuner::Algorithm;
use super::{Collective, DeviceCall, HostCall, Shape, Source, once, same, whole};
use crate::backend::cpu::{Cpu, Signal, keep};
use crate::backend::nccl::Nccl;
use crate::record::{self, Dir, How};
use anyhow::{Context, Result};
use cudarc::nccl::sys;

/// Broadcast.
pub const BROADCAST: Collective = Collective {
    name: "broadcast",
    title: "broadcast",
    nccl_name: "ncclBroadcast",
    tag: 1,
    rooted: true,
    reduces: false,
    counts: same,
    in_place: whole,
    bus_factor: once,
    source,
    cpu,
    nccl,
};

/// A broadcast moves in pieces of at most this size, so that each rank forwards one piece
/// while the next one is still arriving (a pipeline).
const PIECE: usize = 512 << 10;
/// ...and of at least this size, below which a piece costs more in waits than it saves.
const MIN_PIECE: usize = 32 << 10;

fn source(shape: &Shape, _rank: usize, i: usize) -> Source {
    Source::From {
        rank: shape.root,
        index: i,
    }
}

fn nccl(n: &Nccl, c: &DeviceCall) -> Result<()> {
    n.call(c.call(&BROADCAST, "count"), |comm, stream| unsafe {
        sys::ncclBroadcast(c.send, c.recv, c.count, c.datatype, c.root, comm, stream)
    })
}

/// A small broadcast, direct: the root sends its buffer to every other rank itself, one
/// message time where the chain takes n - 1 (NCCL's tree makes a similar trade).
fn direct(cpu: &Cpu, root_src: Option<&[u8]>, buf: &mut [u8], root: usize) -> Result<()> {
    let (n, r, tag) = (cpu.world(), cpu.rank(), BROADCAST.tag);
    cpu.ran(&BROADCAST, buf.len(), Algorithm::Direct);
    if r != root {
        let t = record::clock();
        cpu.link(root)
            .recv_into(tag, buf)
            .map_err(|e| cpu.lost(e, root))
            .with_context(|| format!("broadcast from rank {root}: receiving {}", cpu.peer_name(root)))?;
        record::op(t, "recv", &[(Dir::Recv, root, buf, How::Copy)]);
        return Ok(());
    }
    let out = root_src.unwrap_or(buf);
    for k in 1..n {
        let peer = (r + k) % n;
        let t = record::clock();
        cpu.send_tagged(tag, out, peer)
            .with_context(|| format!("broadcast from rank {root}: sending {}", cpu.peer_name(peer)))?;
        record::op(t, "send", &[(Dir::Send, peer, out, How::Copy)]);
    }
    if let Some(mine) = root_src {
        buf.copy_from_slice(mine);
        record::wrote(buf);
    }
    Ok(())
}

/// A large broadcast on one host, single copy: every rank copies the root's buffer
/// straight into its own, reading it where it lies ([`crate::backend::host_memory`]). One
/// copy per byte per rank where the chain takes two (into a shared slot and out of it),
/// and no rank waits for another's pieces: on a host with fewer cores than ranks, whoever
/// runs makes progress. The root tells every rank where its buffer is, and leaves once
/// each has said it has its copy. (A root buffer outside the arena is sent instead.)
fn single_copy(cpu: &Cpu, root_src: Option<&[u8]>, buf: &mut [u8], root: usize) -> Result<()> {
    let (n, r, tag) = (cpu.world(), cpu.rank(), BROADCAST.tag);
    let streaming = cpu.streams(buf.len());
    let others = || (1..n).map(move |k| (root + k) % n);
    cpu.ran(&BROADCAST, buf.len(), Algorithm::SingleCopy);
    let context = || format!("broadcast from rank {root}");
    if r != root {
        let t = record::clock();
        match cpu.regions_of(tag, root, &[buf.len()]).with_context(context)? {
            Some(theirs) => keep(buf, theirs[0], streaming),
            None => cpu
                .link(root)
                .recv_into(tag, buf)
                .map_err(|e| cpu.lost(e, root))
                .with_context(context)?,
        }
        record::op(t, "read", &[(Dir::Recv, root, buf, How::Copy)]);
        return cpu.signal(tag, root, Signal::Done).with_context(context);
    }
    let out = root_src.unwrap_or(buf);
    if !cpu.announce(tag, &[out], others()).with_context(context)? {
        for peer in others() {
            cpu.send_tagged(tag, out, peer).with_context(context)?;
        }
    }
    if let Some(mine) = root_src {
        keep(buf, mine, streaming);
        record::wrote(buf);
    }
    others().try_for_each(|peer| cpu.wait_signal(tag, peer, Signal::Done).with_context(context))
}

/// Broadcast on the CPU backend: what the tuner chooses ([`super::tuner::choose`]). A
/// small buffer goes [`direct`] from the root; on one host, a large one is copied by
/// every rank straight from the root's memory ([`single_copy`]); else the [`chain`].
fn cpu(cpu: &Cpu, call: HostCall) -> Result<()> {
    let HostCall { send, buf, root, .. } = call;
    let (n, r) = (cpu.world(), cpu.rank());
    let pos = (r + n - root) % n; // this rank's distance from the root along the ring
    let root_src = send.filter(|_| pos == 0);
    match cpu.choose(&BROADCAST, buf.len()) {
        Algorithm::Direct => direct(cpu, root_src, buf, root),
        Algorithm::SingleCopy => single_copy(cpu, root_src, buf, root),
        _ => chain(cpu, root_src, buf, root),
    }
}

/// Pipelined chain broadcast (NCCL's ring broadcast): the root sends its buffer piece by
/// piece to its right neighbour; every rank forwards each piece to the next as soon as it
/// has it, so the pieces flow round the ring like water down a pipe. Out of place, the
/// root sends from `root_src` and copies each piece into its own buffer after sending
/// it, while the piece travels.
fn chain(cpu: &Cpu, root_src: Option<&[u8]>, buf: &mut [u8], root: usize) -> Result<()> {
    let (n, r) = (cpu.world(), cpu.rank());
    let pos = (r + n - root) % n;
    let (left, right) = cpu.neighbours();
    let streaming = cpu.streams(buf.len());
    let tag = BROADCAST.tag;
    cpu.ran(&BROADCAST, buf.len(), Algorithm::Chain);
    // On a chain of three ranks or more, at least 8 pieces, so that a buffer of a few
    // hundred KiB flows down the chain too (one piece would cross one link after the
    // other); at most PIECE each. Two ranks have no chain: smaller pieces only add waits.
    let size = match n {
        ..=2 => PIECE,
        _ => (buf.len() / 8).clamp(MIN_PIECE, PIECE),
    };
    for (i, piece) in buf.chunks_mut(size).enumerate() {
        let at =
            |what: &str, peer: usize| format!("broadcast from rank {root}: {what} piece {i} {}", cpu.peer_name(peer));
        if pos > 0 {
            let t = record::clock();
            let link = cpu.link(left);
            match streaming && pos == n - 1 {
                // The last rank of the chain only stores what it receives.
                true => link.recv_into_streaming(tag, piece),
                false => link.recv_into(tag, piece),
            }
            .map_err(|e| cpu.lost(e, left))
            .with_context(|| at("receiving", left))?;
            record::op(t, "recv", &[(Dir::Recv, left, piece, How::Copy)]);
        }
        let mine = root_src.map(|s| &s[i * size..][..piece.len()]);
        if pos < n - 1 {
            let t = record::clock();
            let out = mine.unwrap_or(piece);
            cpu.send_tagged(tag, out, right).with_context(|| at("sending", right))?;
            record::op(t, "send", &[(Dir::Send, right, out, How::Copy)]);
        }
        if let Some(mine) = mine {
            keep(piece, mine, streaming);
            record::wrote(piece);
        }
    }
    Ok(())
}
