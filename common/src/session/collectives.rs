//! The collectives as a lesson calls them, one pair each (in place, and out of place
//! with `_into`), named and shaped like NCCL's functions. Each is [`Session::run`] with
//! its [`Collective`](crate::collective::Collective).

use super::Session;
use crate::backend::Buffer;
use crate::collective::{ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, BROADCAST, REDUCE, REDUCE_SCATTER};
use anyhow::Result;
use workbook_runtime::element::{Element, ReduceOp};

impl Session {
    /// Broadcast (`ncclBroadcast`): `root`'s buffer is copied into every rank's buffer.
    ///
    /// Its description: [`crate::collective::broadcast`]; on NCCL, its one call ([`workbook_nccl::collectives`]); on the CPU backend, the algorithm the
    /// tuner chooses ([`workbook_cpu::tuner::choose`]):
    /// - [the chain](workbook_cpu::collective::broadcast::chain)
    /// - [direct](workbook_cpu::collective::broadcast::direct)
    /// - [single copy](workbook_cpu::collective::broadcast::single_copy)
    pub fn broadcast<T: Element>(&mut self, buf: &mut Buffer<T>, root: usize) -> Result<()> {
        self.run(&BROADCAST, None, buf, root, ReduceOp::Sum)
    }

    /// Broadcast out of place: `root`'s `send` is copied into every rank's `recv` (the
    /// root's too); `send` is unchanged.
    pub fn broadcast_into<T: Element>(&mut self, send: &Buffer<T>, recv: &mut Buffer<T>, root: usize) -> Result<()> {
        self.run(&BROADCAST, Some(send), recv, root, ReduceOp::Sum)
    }

    /// Reduce (`ncclReduce`): the root's buffer becomes the element-wise `op` of every
    /// rank's buffer; the others' buffers are unchanged.
    ///
    /// Its description: [`crate::collective::reduce`]; on NCCL, its one call ([`workbook_nccl::collectives`]); on the CPU backend, [the chain](workbook_cpu::collective::reduce::chain),
    /// or on one host [the single copy](workbook_cpu::collective::reduce::single_copy).
    pub fn reduce<T: Element>(&mut self, buf: &mut Buffer<T>, root: usize, op: ReduceOp) -> Result<()> {
        self.run(&REDUCE, None, buf, root, op)
    }

    /// Reduce out of place: the root's `recv` gets the `op` of every rank's `send`; the
    /// other ranks' `recv` is not written.
    pub fn reduce_into<T: Element>(
        &mut self,
        send: &Buffer<T>,
        recv: &mut Buffer<T>,
        root: usize,
        op: ReduceOp,
    ) -> Result<()> {
        self.run(&REDUCE, Some(send), recv, root, op)
    }

    /// All-reduce (`ncclAllReduce`): every rank's buffer becomes the element-wise `op` of
    /// all of them.
    ///
    /// Its description: [`crate::collective::all_reduce`]; on NCCL, its one call ([`workbook_nccl::collectives`]); on the CPU backend, the algorithm the
    /// tuner chooses ([`workbook_cpu::tuner::choose`]):
    /// - [the ring](workbook_cpu::collective::all_reduce::ring)
    /// - [the ring piece by piece](workbook_cpu::collective::all_reduce::pipelined)
    /// - [direct](workbook_cpu::collective::all_reduce::direct)
    /// - [single copy](workbook_cpu::collective::all_reduce::single_copy)
    pub fn all_reduce<T: Element>(&mut self, buf: &mut Buffer<T>, op: ReduceOp) -> Result<()> {
        self.run(&ALL_REDUCE, None, buf, 0, op)
    }

    /// All-reduce out of place: every rank's `recv` becomes the `op` of every `send`.
    pub fn all_reduce_into<T: Element>(&mut self, send: &Buffer<T>, recv: &mut Buffer<T>, op: ReduceOp) -> Result<()> {
        self.run(&ALL_REDUCE, Some(send), recv, 0, op)
    }

    /// All-gather in place (`ncclAllGather` with `sendbuff == recvbuff + rank × count`):
    /// `buf` holds `n` blocks, this rank's own at block `rank`; afterwards block i holds
    /// rank i's.
    ///
    /// Its description: [`crate::collective::all_gather`]; on NCCL, its one call ([`workbook_nccl::collectives`]); on the CPU backend, the algorithm the
    /// tuner chooses ([`workbook_cpu::tuner::choose`]):
    /// - [the ring](workbook_cpu::collective::all_gather::ring)
    /// - [single copy](workbook_cpu::collective::all_gather::single_copy)
    pub fn all_gather<T: Element>(&mut self, buf: &mut Buffer<T>) -> Result<()> {
        self.run(&ALL_GATHER, None, buf, 0, ReduceOp::Sum)
    }

    /// All-gather: every rank's `recv` (n × `send.len()` elements) gets rank i's `send`
    /// at block i.
    pub fn all_gather_into<T: Element>(&mut self, send: &Buffer<T>, recv: &mut Buffer<T>) -> Result<()> {
        self.run(&ALL_GATHER, Some(send), recv, 0, ReduceOp::Sum)
    }

    /// Reduce-scatter in place (`ncclReduceScatter` with `recvbuff == sendbuff + rank ×
    /// count`): `buf` holds `n` blocks; afterwards block `rank` holds the `op` of every
    /// rank's block `rank`, and the other blocks are unchanged.
    ///
    /// Its description: [`crate::collective::reduce_scatter`]; on NCCL, its one call ([`workbook_nccl::collectives`]); on the CPU backend, the algorithm the
    /// tuner chooses ([`workbook_cpu::tuner::choose`]):
    /// - [the ring](workbook_cpu::collective::reduce_scatter::ring)
    /// - [single copy](workbook_cpu::collective::reduce_scatter::single_copy)
    pub fn reduce_scatter<T: Element>(&mut self, buf: &mut Buffer<T>, op: ReduceOp) -> Result<()> {
        self.run(&REDUCE_SCATTER, None, buf, 0, op)
    }

    /// Reduce-scatter: rank i's `recv` gets block i (of `recv.len()` elements) of the
    /// element-wise `op` of every rank's `send` (n × `recv.len()` elements).
    pub fn reduce_scatter_into<T: Element>(
        &mut self,
        send: &Buffer<T>,
        recv: &mut Buffer<T>,
        op: ReduceOp,
    ) -> Result<()> {
        self.run(&REDUCE_SCATTER, Some(send), recv, 0, op)
    }

    /// All-to-all in place: block j of this rank's buffer goes to rank j, and block i is
    /// replaced by what rank i had for this rank.
    ///
    /// Its description: [`crate::collective::all_to_all`]; on NCCL, its one call ([`workbook_nccl::collectives`]); on the CPU backend, the algorithm the
    /// tuner chooses ([`workbook_cpu::tuner::choose`]):
    /// - [pairwise](workbook_cpu::collective::all_to_all::pairwise)
    /// - [single copy](workbook_cpu::collective::all_to_all::single_copy)
    pub fn all_to_all<T: Element>(&mut self, buf: &mut Buffer<T>) -> Result<()> {
        self.run(&ALL_TO_ALL, None, buf, 0, ReduceOp::Sum)
    }

    /// All-to-all: block j of `send` goes to rank j; block i of `recv` comes from rank i.
    pub fn all_to_all_into<T: Element>(&mut self, send: &Buffer<T>, recv: &mut Buffer<T>) -> Result<()> {
        self.run(&ALL_TO_ALL, Some(send), recv, 0, ReduceOp::Sum)
    }
}
