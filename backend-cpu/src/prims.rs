//! The primitives the CPU algorithms are written in, as NCCL's device code is written in
//! its `Primitives` (`src/device/prims_simple.h`, `prims_ll.h`, `prims_ll128.h`): an
//! algorithm says what moves (`send`, `recvReduceSend`, `recvCopySend`, …) and where in
//! the buffers (byte ranges, as NCCL's primitives take offsets), and the primitive moves
//! it, over this rank's links, in the protocol the tuner set on them.
//!
//! What every algorithm needs besides lives here, once: each primitive notes what it did
//! for `--steps` and `--trace` ([`crate::record`], one branch when neither is on), and an
//! error says which collective, which primitive, which bytes and which peer.
//!
//! As NCCL's, a [`Prims`] holds the two buffers of one call: the input (the send buffer;
//! in place, the receive buffer itself) and the output (the receive buffer), and the
//! ring's neighbours (`prev`, `next`). The ring's primitives send before they receive:
//! they need links that hold a piece while the receiver is busy (shared memory). The
//! exchanges ([`Prims::send_recv`], [`Prims::send_recv_reduce`]) send and receive at once,
//! for links that hold little (TCP) and for the step-by-step ring the lessons draw.

use crate::comm::{keep, split_two};
use crate::cpu::Cpu;
use crate::element::Reduction;
use crate::record::{self, Dir, How};
use anyhow::{Context, Result};
use std::ops::Range;
use workbook_runtime::Func;
use workbook_runtime::failure::{Fact, WithFact};

/// Which buffer a primitive reads what it sends from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Src {
    /// The input: the send buffer (in place, the receive buffer).
    Input,
    /// The output: what this rank received or finished before.
    Output,
}

/// One call's primitives on this rank: its buffers, its ring and its reduction.
pub struct Prims<'a> {
    cpu: &'a Cpu,
    func: Func,
    /// The ring's neighbours: receives come from `prev`, sends go to `next`.
    prev: usize,
    next: usize,
    /// Out of place, the send buffer; in place `None` (the input is `output`).
    input: Option<&'a [u8]>,
    output: &'a mut [u8],
    red: Reduction,
    /// Finished results are written around the cache (the buffer is larger than it).
    streaming: bool,
}

impl<'a> Prims<'a> {
    /// The primitives of `func` on this rank, from `input` (`None`: in place) into
    /// `output`, round the ring of this communicator (rank - 1 to rank + 1).
    pub fn new(cpu: &'a Cpu, func: Func, input: Option<&'a [u8]>, output: &'a mut [u8], red: Reduction) -> Self {
        let (prev, next) = cpu.neighbours();
        let streaming = cpu.streams(output.len());
        Prims {
            cpu,
            func,
            prev,
            next,
            input,
            output,
            red,
            streaming,
        }
    }

    /// The same, round another ring: receiving from `prev`, sending to `next` (a chain
    /// from a root, a tree's edge).
    pub fn with_peers(mut self, prev: usize, next: usize) -> Self {
        (self.prev, self.next) = (prev, next);
        self
    }

    /// The same, writing finished results around the cache or not, whatever the
    /// output's size (a chain's last rank only stores).
    pub fn streaming(mut self, streaming: bool) -> Self {
        self.streaming = streaming;
        self
    }

    /// The output (what the algorithm reads back between primitives).
    pub fn output(&mut self) -> &mut [u8] {
        self.output
    }

    /// Names the phase the next primitives belong to, for `--steps` (`reduce-scatter`).
    pub fn phase(&self, name: &'static str) {
        record::phase(name);
    }

    /// `send`: `input[at]` to `next`.
    pub fn send(&mut self, at: Range<usize>) -> Result<()> {
        let t = record::clock();
        let out = &self.input()[at.clone()];
        self.cpu
            .send_tagged(self.func.tag(), out, self.next)
            .with_context(|| self.failed("send", &at))
            .fact(|| Fact::Collective(self.func.name()))?;
        record::op(t, "send", &[(Dir::Send, self.next, out, How::Copy)]);
        Ok(())
    }

    /// `copySend`: `input[at]` to `next`, and into `output[at]` while it travels (a
    /// broadcast's root, out of place).
    pub fn copy_send(&mut self, at: Range<usize>) -> Result<()> {
        let Some(input) = self.input else {
            return self.send(at);
        };
        let t = record::clock();
        let out = &input[at.clone()];
        self.cpu
            .send_tagged(self.func.tag(), out, self.next)
            .with_context(|| self.failed("copySend", &at))
            .fact(|| Fact::Collective(self.func.name()))?;
        keep(&mut self.output[at.clone()], out, self.streaming);
        record::op(t, "copySend", &[(Dir::Send, self.next, out, How::Copy)]);
        record::wrote(&self.output[at]);
        Ok(())
    }

    /// `recv`: from `prev` into `output[at]`.
    pub fn recv(&mut self, at: Range<usize>) -> Result<()> {
        let (tag, prev, t) = (self.func.tag(), self.prev, record::clock());
        let dst = &mut self.output[at.clone()];
        let link = self.cpu.link(prev);
        match self.streaming {
            true => link.recv_into_streaming(tag, dst),
            false => link.recv_into(tag, dst),
        }
        .map_err(|e| self.cpu.lost(e, prev))
        .with_context(|| self.failed("recv", &at))
        .fact(|| Fact::Collective(self.func.name()))?;
        record::op(t, "recv", &[(Dir::Recv, prev, &self.output[at], How::Copy)]);
        Ok(())
    }

    /// `recvReduceSend`: a partial result from `prev`, `input[at]` reduced into it, on to
    /// `next`: the partial result never touches the buffers.
    pub fn recv_reduce_send(&mut self, at: Range<usize>) -> Result<()> {
        let t = record::clock();
        let (mine, red) = (&self.input()[at.clone()], self.red);
        self.cpu
            .recv_then_send(self.func.tag(), (self.prev, self.next), mine.len(), |out, off, inp| {
                (red.combine)(out, &mine[off..], inp)
            })
            .with_context(|| self.failed("recvReduceSend", &at))
            .fact(|| Fact::Collective(self.func.name()))?;
        let parts = [
            (Dir::Recv, self.prev, mine, How::Partial),
            (Dir::Send, self.next, mine, How::Partial),
        ];
        record::op(t, "recvReduceSend", &parts);
        Ok(())
    }

    /// `recvReduceCopySend`: the last partial result from `prev`, `input[at]` reduced
    /// into it, finished (`ncclAvg` divides), kept in `output[at]` and sent on to `next`.
    pub fn recv_reduce_copy_send(&mut self, at: Range<usize>) -> Result<()> {
        let (t, red, n, streaming) = (record::clock(), self.red, self.cpu.world(), self.streaming);
        let (input, output) = (self.input, &mut *self.output);
        let len = at.len();
        self.cpu
            .recv_then_send(self.func.tag(), (self.prev, self.next), len, |out, off, inp| {
                let here = at.start + off..at.end;
                let mine = input.map_or(&output[here.clone()], |src| &src[here.clone()]);
                (red.combine)(out, mine, inp);
                red.finish(out, n);
                keep(&mut output[here], out, streaming);
            })
            .with_context(|| self.failed("recvReduceCopySend", &at))
            .fact(|| Fact::Collective(self.func.name()))?;
        let done = &self.output[at];
        let parts = [
            (Dir::Recv, self.prev, done, How::Reduce),
            (Dir::Send, self.next, done, How::Copy),
        ];
        record::op(t, "recvReduceCopySend", &parts);
        Ok(())
    }

    /// `recvReduceCopy`: the last partial result from `prev`, `input[at]` reduced into
    /// it, finished and kept in `output[at]` (a reduce's root).
    pub fn recv_reduce_copy(&mut self, at: Range<usize>) -> Result<()> {
        let (t, red, prev) = (record::clock(), self.red, self.prev);
        let (input, dst) = (self.input.map(|s| &s[at.clone()]), &mut self.output[at.clone()]);
        self.cpu
            .link(prev)
            .recv_pieces(self.func.tag(), dst.len(), &mut |off, piece| {
                let out = &mut dst[off..off + piece.len()];
                match input {
                    Some(mine) => (red.combine)(out, &mine[off..], piece),
                    None => (red.accumulate)(out, piece),
                }
            })
            .map_err(|e| self.cpu.lost(e, prev))
            .with_context(|| self.failed("recvReduceCopy", &at))
            .fact(|| Fact::Collective(self.func.name()))?;
        red.finish(&mut self.output[at.clone()], self.cpu.world());
        record::op(t, "recvReduceCopy", &[(Dir::Recv, prev, &self.output[at], How::Reduce)]);
        Ok(())
    }

    /// `recvCopySend`: a finished result from `prev`, kept in `output[at]` and sent on
    /// to `next`.
    pub fn recv_copy_send(&mut self, at: Range<usize>) -> Result<()> {
        let (t, streaming) = (record::clock(), self.streaming);
        let dst = &mut self.output[at.clone()];
        self.cpu
            .recv_then_send(self.func.tag(), (self.prev, self.next), dst.len(), |out, off, inp| {
                out.copy_from_slice(inp);
                keep(&mut dst[off..], inp, streaming);
            })
            .with_context(|| self.failed("recvCopySend", &at))
            .fact(|| Fact::Collective(self.func.name()))?;
        let dst = &self.output[at];
        record::op(
            t,
            "recvCopySend",
            &[
                (Dir::Recv, self.prev, dst, How::Copy),
                (Dir::Send, self.next, dst, How::Copy),
            ],
        );
        Ok(())
    }

    /// A direct send: `from[at]` to `peer` (every send of a direct exchange goes before
    /// any receive: it must fit the link's buffer).
    pub fn send_to(&mut self, peer: usize, from: Src, at: Range<usize>) -> Result<()> {
        let t = record::clock();
        let out = match from {
            Src::Input => &self.input()[at.clone()],
            Src::Output => &self.output[at.clone()],
        };
        self.cpu
            .send_tagged(self.func.tag(), out, peer)
            .with_context(|| self.failed_between("send", &at, peer, self.cpu.rank()))
            .fact(|| Fact::Collective(self.func.name()))?;
        record::op(t, "send", &[(Dir::Send, peer, out, How::Copy)]);
        Ok(())
    }

    /// A direct receive: from `peer` into `output[at]`.
    pub fn recv_from(&mut self, peer: usize, at: Range<usize>) -> Result<()> {
        let (tag, t) = (self.func.tag(), record::clock());
        self.cpu
            .link(peer)
            .recv_into(tag, &mut self.output[at.clone()])
            .map_err(|e| self.cpu.lost(e, peer))
            .with_context(|| self.failed_between("recv", &at, self.cpu.rank(), peer))
            .fact(|| Fact::Collective(self.func.name()))?;
        record::op(t, "recv", &[(Dir::Recv, peer, &self.output[at], How::Copy)]);
        Ok(())
    }

    /// A direct reducing receive: from `peer`, reduced into `output[at]` where it arrives
    /// (a shared-memory slot), piece by piece.
    pub fn recv_reduce_from(&mut self, peer: usize, at: Range<usize>) -> Result<()> {
        let (tag, t, red) = (self.func.tag(), record::clock(), self.red);
        let dst = &mut self.output[at.clone()];
        self.cpu
            .link(peer)
            .recv_pieces(tag, dst.len(), &mut |off, piece| {
                (red.accumulate)(&mut dst[off..off + piece.len()], piece)
            })
            .map_err(|e| self.cpu.lost(e, peer))
            .with_context(|| self.failed_between("recvReduce", &at, self.cpu.rank(), peer))
            .fact(|| Fact::Collective(self.func.name()))?;
        record::op(t, "recv", &[(Dir::Recv, peer, &self.output[at], How::Reduce)]);
        Ok(())
    }

    /// A direct reducing receive into a fresh result: from `peer`, reduced with
    /// `input[at]` into `output[at]` (in place, into what `output[at]` holds), where it
    /// arrives, piece by piece.
    pub fn recv_reduce_copy_from(&mut self, peer: usize, at: Range<usize>) -> Result<()> {
        let (tag, t, red) = (self.func.tag(), record::clock(), self.red);
        let (mine, dst) = (self.input.map(|s| &s[at.clone()]), &mut self.output[at.clone()]);
        self.cpu
            .link(peer)
            .recv_pieces(tag, dst.len(), &mut |off, piece| {
                let out = &mut dst[off..off + piece.len()];
                match mine {
                    Some(mine) => (red.combine)(out, &mine[off..off + piece.len()], piece),
                    None => (red.accumulate)(out, piece),
                }
            })
            .map_err(|e| self.cpu.lost(e, peer))
            .with_context(|| self.failed_between("recvReduceCopy", &at, self.cpu.rank(), peer))
            .fact(|| Fact::Collective(self.func.name()))?;
        record::op(t, "recv", &[(Dir::Recv, peer, &self.output[at], How::Reduce)]);
        Ok(())
    }

    /// One step of the step-by-step ring: `from[out]` to `next` while `prev`'s message
    /// arrives in `output[into]`, at once (neither waits for the other to finish).
    pub fn send_recv(&mut self, from: Src, out: Range<usize>, into: Range<usize>) -> Result<()> {
        let (to, prev) = (self.next, self.prev);
        self.send_recv_with(to, (from, out), prev, into)
    }

    /// The same between any two peers: `from[out]` to `to`, while `peer`'s message
    /// arrives in `output[into]` (the pairwise all-to-all).
    pub fn send_recv_with(
        &mut self,
        to: usize,
        (from, out): (Src, Range<usize>),
        peer: usize,
        into: Range<usize>,
    ) -> Result<()> {
        let (tag, streaming, t, cpu) = (self.func.tag(), self.streaming, record::clock(), self.cpu);
        let (sent, dst) = apart(self.input, self.output, from, &out, &into);
        cpu.exchange(tag, (sent, to), (dst.len(), peer), |link, slice| match streaming {
            true => link.recv_into_streaming(tag, &mut dst[slice]),
            false => link.recv_into(tag, &mut dst[slice]),
        })
        .with_context(|| self.failed_between("send/recv", &into, to, peer))
        .fact(|| Fact::Collective(self.func.name()))?;
        let (sent, dst) = apart(self.input, self.output, from, &out, &into);
        record::op(
            t,
            "send/recv",
            &[(Dir::Send, to, sent, How::Copy), (Dir::Recv, peer, dst, How::Copy)],
        );
        Ok(())
    }

    /// One reducing step of the step-by-step ring: `from[out]` to `next` while `prev`'s
    /// partial result arrives and is reduced with `input[into]` into `output[into]`.
    pub fn send_recv_reduce(&mut self, from: Src, out: Range<usize>, into: Range<usize>) -> Result<()> {
        let mine = self.input.map(|src| &src[into.clone()]);
        let (sent, acc) = apart(self.input, self.output, from, &out, &into);
        let ring = (self.cpu, self.func, self.red, (self.prev, self.next));
        send_recv_reduce(ring, sent, acc, mine, &|| {
            describe(self.cpu, self.func, "send/recv", &into, self.next, self.prev)
        })
    }

    /// Finishes `output[at]` (`ncclAvg` divides by the ranks), as NCCL's `postOp` does on
    /// a result's last step.
    pub fn finish(&mut self, at: Range<usize>) {
        self.red.finish(&mut self.output[at.clone()], self.cpu.world());
        record::wrote(&self.output[at]);
    }

    /// The input: the send buffer, or in place the output.
    fn input(&self) -> &[u8] {
        self.input.unwrap_or(self.output)
    }

    /// What failed, for the error: `all-reduce: recvReduceSend of bytes 0..4096 (from
    /// rank 1, to rank 3)`.
    #[cold]
    fn failed(&self, prim: &str, at: &Range<usize>) -> String {
        self.failed_between(prim, at, self.next, self.prev)
    }

    /// The same, between `from` and `to` (one of them this rank, for a direct send or
    /// receive: then only the other is named).
    #[cold]
    fn failed_between(&self, prim: &str, at: &Range<usize>, to: usize, from: usize) -> String {
        describe(self.cpu, self.func, prim, at, to, from)
    }
}

/// What a rank sends from (`from[out]`) and the output it receives into (`output[into]`),
/// apart (both may lie in the output).
fn apart<'b>(
    input: Option<&'b [u8]>,
    output: &'b mut [u8],
    from: Src,
    out: &Range<usize>,
    into: &Range<usize>,
) -> (&'b [u8], &'b mut [u8]) {
    match (from, input) {
        (Src::Input, Some(input)) => (&input[out.clone()], &mut output[into.clone()]),
        _ => split_two(output, out.clone(), into.clone()),
    }
}

/// One reducing step of a step-by-step ring on buffers of the algorithm's own (a
/// reduce-scatter's partial results in scratch blocks): `out` to `next` while `prev`'s
/// partial result arrives and is reduced with `mine` into `dst` (with `None`, into what
/// `dst` holds), at once. `what` says the step in an error. Noted for `--steps` and
/// `--trace` as [`Prims::send_recv_reduce`] notes it.
pub fn send_recv_reduce(
    (cpu, func, red, (prev, next)): (&Cpu, Func, Reduction, (usize, usize)),
    out: &[u8],
    dst: &mut [u8],
    mine: Option<&[u8]>,
    what: &dyn Fn() -> String,
) -> Result<()> {
    let (tag, t) = (func.tag(), record::clock());
    cpu.exchange(tag, (out, next), (dst.len(), prev), |link, slice| {
        link.recv_pieces(tag, slice.len(), &mut |off, piece| {
            let at = slice.start + off;
            let acc = &mut dst[at..at + piece.len()];
            match mine {
                Some(mine) => (red.combine)(acc, &mine[at..], piece),
                None => (red.accumulate)(acc, piece),
            }
        })
    })
    .with_context(what)
    .fact(|| Fact::Collective(func.name()))?;
    record::op(
        t,
        "send/recv",
        &[(Dir::Send, next, out, How::Copy), (Dir::Recv, prev, dst, How::Reduce)],
    );
    Ok(())
}

/// What failed, for the error: `all-reduce: recvReduceSend of bytes 0..4096 (from rank 1,
/// to rank 3)`; where one of `from` and `to` is this rank, only the other is named.
#[cold]
fn describe(cpu: &Cpu, func: Func, prim: &str, at: &Range<usize>, to: usize, from: usize) -> String {
    let (me, world) = (cpu.rank(), |r: usize| cpu.world_rank(r));
    let peers = match (from == me, to == me) {
        (true, false) => format!("to rank {}", world(to)),
        (false, true) => format!("from rank {}", world(from)),
        _ => format!("from rank {}, to rank {}", world(from), world(to)),
    };
    format!("{}: {prim} of bytes {}..{} ({peers})", func.title(), at.start, at.end)
}
