//! The single-copy reduce, for large buffers on one host: the root reduces every rank's
//! buffer where it lies.

use crate::collective::single_copy::reduce_into;
use crate::cpu::{Cpu, Signal};
use crate::element::Reduction;
use crate::record::{self, Dir, How};
use anyhow::{Context, Result};
use std::iter::once;
use workbook_runtime::Func;

/// A large reduce on one host, single copy: every other rank tells the root where its
/// buffer is, and the root reduces them all into its own, reading each where it lies
/// ([`crate::host_memory`]), in pieces that stay in the cache. Each byte is read
/// once, by the root, where the chain copies it into a shared slot and out again at every
/// hop. And no line crosses between cores twice a call: a slot's lines are written by one
/// core and read by the other, lap after lap, and each store to a line the other core holds
/// is a trip between them, where the root here only reads the others' inputs and writes
/// its own buffer, which nobody else reads. The others only wait for the root's "done
/// reading". A buffer outside the arena is sent to the root instead, which adds it as
/// it arrives.
pub fn reduce(cpu: &Cpu, send: Option<&[u8]>, buf: &mut [u8], root: usize, red: Reduction) -> Result<()> {
    let (n, r, tag) = (cpu.world(), cpu.rank(), Func::Reduce.tag());
    let len = buf.len();
    let context = || format!("reduce to rank {root}");
    if r != root {
        let mine = send.unwrap_or(buf);
        if cpu.announce(tag, &[mine], once(root)).with_context(context)? {
            return cpu.wait_signal(tag, root, Signal::Done).with_context(context);
        }
        let t = record::clock();
        cpu.send_tagged(tag, mine, root).with_context(context)?;
        record::op(t, "send", &[(Dir::Send, root, mine, How::Copy)]);
        return Ok(());
    }
    let others = || (1..n).map(move |k| (root + k) % n);
    // Each other rank's input where it lies; `None` for one outside the arena, which
    // sends it instead.
    let mut theirs: Vec<Option<&[u8]>> = vec![None; n];
    for p in others() {
        theirs[p] = cpu.regions_of(tag, p, &[len]).with_context(context)?.map(|r| r[0]);
    }
    let t = record::clock();
    reduce_into(cpu, buf, send, |p| theirs[p], red);
    // What the others sent, added as it arrives (their sends waited in the link).
    for p in others().filter(|&p| theirs[p].is_none()) {
        cpu.link(p)
            .recv_pieces(tag, len, &mut |off, piece| {
                (red.accumulate)(&mut buf[off..off + piece.len()], piece)
            })
            .map_err(|e| cpu.lost(e, p))
            .with_context(context)?;
    }
    red.finish(buf, n);
    let parts: Vec<_> = others().map(|p| (Dir::Recv, p, &*buf, How::Reduce)).collect();
    record::op(t, "read", &parts);
    others()
        .filter(|&p| theirs[p].is_some())
        .try_for_each(|p| cpu.signal(tag, p, Signal::Done))
        .with_context(context)
}
