//! The single-copy broadcast, for large buffers on one host: every rank copies
//! straight from the root's buffer.

use crate::cpu::{Cpu, Signal, keep};
use crate::record::{self, Dir, How};
use anyhow::{Context, Result};
use workbook_runtime::Func;

/// A large broadcast on one host, single copy: every rank copies the root's buffer
/// straight into its own, reading it where it lies ([`crate::host_memory`]). One
/// copy per byte per rank where the chain takes two (into a shared slot and out of it),
/// and no rank waits for another's pieces: on a host with fewer cores than ranks, whoever
/// runs makes progress. The root tells every rank where its buffer is, and leaves once
/// each has said it has its copy. (A root buffer outside the arena is sent instead.)
pub fn broadcast(cpu: &Cpu, root_src: Option<&[u8]>, buf: &mut [u8], root: usize) -> Result<()> {
    let (n, r, tag) = (cpu.world(), cpu.rank(), Func::Broadcast.tag());
    let streaming = cpu.streams(buf.len());
    let others = || (1..n).map(move |k| (root + k) % n);
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
