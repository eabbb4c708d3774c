//! A rank's communicator: the unit collectives run on (as NCCL's `ncclComm_t`), over
//! either backend ([`crate::backend`]). The session holds the world's and checks every
//! call at its edge; this runs the call, on the buffers' own memory.

use crate::backend::{Buffer, Storage, device, device_mut, host, host_mut};
use crate::collective::Collective;
use anyhow::Result;
use workbook_cpu::Cpu;
use workbook_cpu::collective::HostCall;
use workbook_cpu::host_memory;
use workbook_nccl::collectives::DeviceCall;
use workbook_nccl::nccl::Nccl;
use workbook_runtime::element::{Element, ReduceOp, Reduction, as_bytes, as_bytes_mut};

/// A rank's communicator: the ranks it runs collectives with and the backend that moves
/// their data. One type per layer: the CPU backend's [`Comm`](workbook_cpu::Comm) (links
/// to every other rank, with the tuner's state: [`Cpu`]), NCCL's [`Nccl`] (an
/// `ncclComm_t` and its stream), and this, what the session holds and runs every
/// collective, send and receive through. The session's is the world's; a split
/// communicator (`ncclCommSplit`, [`crate::Session::split`]) is another value of this type.
pub enum Communicator {
    /// Ring and tree algorithms over shared memory and TCP (boxed, as the NCCL one is: one per rank).
    Cpu(Box<Cpu>),
    /// NCCL on a GPU (boxed: it carries its watchdog, and one backend lives per rank).
    Nccl(Box<Nccl>),
}

impl Communicator {
    /// This rank, from 0 to [`Communicator::world`] - 1.
    pub fn rank(&self) -> usize {
        match self {
            Communicator::Cpu(c) => c.rank(),
            Communicator::Nccl(n) => n.rank(),
        }
    }

    /// The number of ranks.
    pub fn world(&self) -> usize {
        match self {
            Communicator::Cpu(c) => c.world(),
            Communicator::Nccl(n) => n.world(),
        }
    }

    /// Runs `coll` on this rank's part, as every rank of the communicator must: out of
    /// place from `send` into `recv`, or in place in `recv` alone (`send` is `None`, and
    /// the send region lies in `recv` where NCCL's in-place layout puts it), on `count`
    /// elements (NCCL's `count`). On the CPU backend, the algorithm
    /// [`workbook_cpu::tuner::choose`] picks ([`workbook_cpu::collective::run`]); on NCCL,
    /// the collective's one call ([`workbook_nccl::collectives::run`]),
    /// queued on the stream. The caller has checked the sizes and the root
    /// ([`crate::Session`]'s calls do, at the API's edge).
    /// `--steps` and `--trace` show it as `title` (the collective's own, or a group's
    /// calls packed into one: "3 broadcasts packed into one").
    #[allow(clippy::too_many_arguments)]
    pub fn collective<T: Element>(
        &mut self,
        title: &str,
        coll: &'static Collective,
        send: Option<&Buffer<T>>,
        recv: &mut Buffer<T>,
        count: usize,
        root: usize,
        op: ReduceOp,
    ) -> Result<()> {
        let (rank, world) = (self.rank(), self.world());
        match self {
            Communicator::Cpu(cpu) => cpu_collective(cpu, title, coll, send.map(host), host_mut(recv), count, root, op),
            Communicator::Nccl(nccl) => {
                let layout = (coll.in_place)(count, world, rank);
                nccl.with_pointers(send.map(device), device_mut(recv), layout, |send, recv| {
                    let call = DeviceCall {
                        send,
                        recv,
                        count,
                        elem: size_of::<T>(),
                        datatype: T::TYPE,
                        op,
                        root: root as std::ffi::c_int,
                    };
                    // SAFETY: with_pointers gives the device pointers of `send` and `recv`,
                    // this rank's buffers on its GPU, whose lengths the caller checked
                    // against `count` (Collective::count_of, at the session's edge); it
                    // records them as used by the stream, and cudarc frees device memory in
                    // stream order, so they outlive the queued call.
                    unsafe { workbook_nccl::collectives::run(nccl, coll.func, &call) }
                })
            }
        }
    }

    /// This rank's part of the communicator split from this one as [`crate::Session::split`]
    /// decided: `color` and `key` as the user gave them (NCCL's own call takes them),
    /// `members` the ranks of this one in the new one, in order (empty for
    /// [`crate::SPLIT_NOCOLOR`]); `watchdog` makes an NCCL rank's watchdog for it.
    /// `None` for a rank that joins none.
    pub(crate) fn split(
        &self,
        (color, key): (i32, i32),
        members: &[usize],
        watchdog: impl FnOnce() -> Result<workbook_nccl::watchdog::Watchdog>,
    ) -> Result<Option<Communicator>> {
        match self {
            Communicator::Cpu(_) if members.is_empty() => Ok(None),
            Communicator::Cpu(c) => Ok(Some(Communicator::Cpu(Box::new(c.split(members))))),
            Communicator::Nccl(n) => {
                let rank = members.iter().position(|&m| m == n.rank()).unwrap_or(0);
                let child = n.split(color, key, (rank, members.len()), watchdog()?)?;
                Ok(child.map(|c| Communicator::Nccl(Box::new(c))))
            }
        }
    }

    /// The rank failed with `failure`: on NCCL, aborts the communicator now, saying why
    /// if the abort hangs (the CPU backend has nothing to abort: its links end with it).
    pub fn abandon(&self, failure: &anyhow::Error) {
        if let Communicator::Nccl(n) = self {
            n.abandon(failure);
        }
    }

    /// "cpu" or "nccl".
    pub fn name(&self) -> &'static str {
        match self {
            Communicator::Cpu(_) => "cpu",
            Communicator::Nccl(_) => "nccl",
        }
    }

    /// Puts `host` data where this backend computes on it.
    pub fn upload<T: Element>(&self, host: Vec<T>) -> Result<Buffer<T>> {
        match self {
            Communicator::Cpu(_) => Ok(Buffer {
                storage: Storage::Host(host_memory::HostMem::new(host)),
            }),
            Communicator::Nccl(n) => n.upload(host).map(|memory| Buffer {
                storage: Storage::Device(memory),
            }),
        }
    }

    /// Reads back the first `n` elements, after all queued work on the buffer is done.
    pub fn download<T: Element>(&self, buf: &Buffer<T>, n: usize) -> Result<Vec<T>> {
        self.download_range(buf, 0..n)
    }

    /// Reads back elements `range` (cut to the buffer), after all queued work is done.
    pub fn download_range<T: Element>(&self, buf: &Buffer<T>, range: std::ops::Range<usize>) -> Result<Vec<T>> {
        let range = range.start.min(buf.len())..range.end.min(buf.len());
        match (&buf.storage, self) {
            (Storage::Host(v), _) => workbook_runtime::limits::try_copy(&v[range], "a copy of a buffer to read"),
            (Storage::Device(s), Communicator::Nccl(nc)) => nc.download(s, range),
            (Storage::Device(_), Communicator::Cpu(_)) => unreachable!("device buffers only come from NCCL"),
        }
    }

    /// Sends the whole buffer to `peer`, which must `recv` the same number of elements.
    pub fn send<T: Element>(&mut self, buf: &Buffer<T>, peer: usize) -> Result<()> {
        match (self, &buf.storage) {
            (Communicator::Cpu(c), Storage::Host(v)) => {
                use workbook_runtime::record::{self, Dir, How};
                record::watch(record::P2P, v, None, false);
                let t = record::clock();
                c.send(v, peer)
                    .map(|()| record::op(t, "send", &[(Dir::Send, peer, as_bytes(v), How::Copy)]))
            }
            (Communicator::Nccl(n), _) => n.send(device(buf), peer),
            (Communicator::Cpu(_), Storage::Device(_)) => unreachable!("device buffers only come from NCCL"),
        }
    }

    /// Receives the whole buffer from `peer`.
    pub fn recv<T: Element>(&mut self, buf: &mut Buffer<T>, peer: usize) -> Result<()> {
        match self {
            Communicator::Cpu(c) => {
                use workbook_runtime::record::{self, Dir, How};
                let v = host_mut(buf);
                record::watch(record::P2P, v, None, false);
                let t = record::clock();
                c.recv(v, peer)
                    .map(|()| record::op(t, "recv", &[(Dir::Recv, peer, as_bytes(v), How::Copy)]))
            }
            Communicator::Nccl(n) => n.recv(device_mut(buf), peer),
        }
    }

    /// Opens a group: on NCCL, sends and receives until [`Communicator::group_end`] progress
    /// together (a no-op on the CPU backend, where [`crate::session::Group`] runs a group's
    /// calls together itself).
    pub fn group_start(&self) -> Result<()> {
        match self {
            Communicator::Cpu(_) => Ok(()),
            Communicator::Nccl(n) => n.group_start(),
        }
    }

    /// Closes the group [`Communicator::group_start`] opened.
    pub fn group_end(&self) -> Result<()> {
        match self {
            Communicator::Cpu(_) => Ok(()),
            Communicator::Nccl(n) => n.group_end(),
        }
    }

    /// Ends the backend after the last operation: NCCL leaves its communicator. Nothing
    /// may be called after it.
    pub fn close(&mut self) -> Result<()> {
        match self {
            Communicator::Cpu(_) => Ok(()),
            Communicator::Nccl(n) => n.close(),
        }
    }

    /// Inside a timed loop or not (`on`): NCCL then runs as nccl-tests' timed loop does (a
    /// blocking communicator; a no-op on the CPU backend).
    pub fn timing(&self, on: bool) -> Result<()> {
        match self {
            Communicator::Cpu(_) => Ok(()),
            Communicator::Nccl(n) => n.timing(on),
        }
    }

    /// The time this rank has spent waiting for queued operations so far (always zero on
    /// the CPU backend, whose operations finish before they return).
    pub fn waited(&self) -> std::time::Duration {
        match self {
            Communicator::Cpu(_) => std::time::Duration::ZERO,
            Communicator::Nccl(n) => n.waited(),
        }
    }

    /// Waits until every queued operation has finished (a no-op on the CPU backend,
    /// whose operations finish before they return).
    pub fn synchronize(&self) -> Result<()> {
        match self {
            Communicator::Cpu(_) => Ok(()),
            Communicator::Nccl(n) => n.synchronize(),
        }
    }
}

/// [`Communicator::collective`] on the CPU backend, on host memory: the algorithm the tuner
/// picks runs on the calling thread (a stream's thread, in [`crate::Session::overlap`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn cpu_collective<T: Element>(
    cpu: &mut Cpu,
    title: &str,
    coll: &'static Collective,
    send: Option<&[T]>,
    recv: &mut [T],
    count: usize,
    root: usize,
    op: ReduceOp,
) -> Result<()> {
    workbook_runtime::record::watch(title, recv, send, true);
    if coll.reduces() {
        workbook_runtime::record::combining(op.name());
    }
    workbook_cpu::collective::run(
        cpu,
        coll.func,
        HostCall {
            send: send.map(as_bytes),
            buf: as_bytes_mut(recv),
            count,
            root,
            reduction: Reduction::of::<T>(op),
        },
    )
}
