//! Backends: what moves the data. Both hold the same buffers and run the same
//! collectives (each collective says how, in [`crate::collective`]):
//!
//! - [`cpu`]: ring algorithms between processes (shared memory within a host, TCP
//!   between hosts), the Gloo of this workbook; its large buffers live where the other
//!   ranks of the host can read them ([`host_memory`]); the crate `workbook-cpu`;
//! - [`nccl`]: NVIDIA's NCCL on GPUs, through cudarc; the crate `workbook-nccl`.
//!
//! The interface is shaped by the GPU case: buffers live on the device, operations may
//! only be queued when the call returns, and a result is read back (which waits for the
//! queue) before anything is printed.

pub mod cpu;
pub use workbook_cpu::host_memory;
pub use workbook_nccl::{calls, nccl, progress, watchdog};

use crate::element::{Element, as_bytes};
use anyhow::Result;

/// A rank's buffer: host memory on the CPU backend (in its shared arena when large),
/// device memory on NCCL.
pub struct Buffer<T: Element> {
    pub(crate) storage: Storage<T>,
}

pub(crate) enum Storage<T: Element> {
    Host(host_memory::HostMem<T>),
    Device(cudarc::driver::CudaSlice<T>),
}

impl<T: Element> Buffer<T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match &self.storage {
            Storage::Host(v) => v.len(),
            Storage::Device(s) => s.len(),
        }
    }

    /// Whether the buffer has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The backend this rank runs.
pub enum Backend {
    /// Ring algorithms over shared memory and TCP.
    Cpu(cpu::Cpu),
    /// NCCL on a GPU (boxed: it carries its watchdog, and one backend lives per rank).
    Nccl(Box<nccl::Nccl>),
}

impl Backend {
    /// "cpu" or "nccl".
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Cpu(_) => "cpu",
            Backend::Nccl(_) => "nccl",
        }
    }

    /// Puts `host` data where this backend computes on it.
    pub fn upload<T: Element>(&self, host: Vec<T>) -> Result<Buffer<T>> {
        match self {
            Backend::Cpu(_) => Ok(Buffer {
                storage: Storage::Host(host_memory::HostMem::new(host)),
            }),
            Backend::Nccl(n) => n.upload(host).map(|slice| Buffer {
                storage: Storage::Device(slice),
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
            (Storage::Host(v), _) => Ok(v[range].to_vec()),
            (Storage::Device(s), Backend::Nccl(nc)) => nc.download(s, range),
            (Storage::Device(_), Backend::Cpu(_)) => unreachable!("device buffers only come from NCCL"),
        }
    }

    /// Sends the whole buffer to `peer`, which must `recv` the same number of elements.
    pub fn send<T: Element>(&mut self, buf: &Buffer<T>, peer: usize) -> Result<()> {
        match (self, &buf.storage) {
            (Backend::Cpu(c), Storage::Host(v)) => {
                use crate::record::{self, Dir, How};
                record::watch(record::P2P, v, None, false);
                let t = record::clock();
                c.send(v, peer)
                    .map(|()| record::op(t, "send", &[(Dir::Send, peer, as_bytes(v), How::Copy)]))
            }
            (Backend::Nccl(n), _) => n.send(device(buf), peer),
            (Backend::Cpu(_), Storage::Device(_)) => unreachable!("device buffers only come from NCCL"),
        }
    }

    /// Receives the whole buffer from `peer`.
    pub fn recv<T: Element>(&mut self, buf: &mut Buffer<T>, peer: usize) -> Result<()> {
        match self {
            Backend::Cpu(c) => {
                use crate::record::{self, Dir, How};
                let v = host_mut(buf);
                record::watch(record::P2P, v, None, false);
                let t = record::clock();
                c.recv(v, peer)
                    .map(|()| record::op(t, "recv", &[(Dir::Recv, peer, as_bytes(v), How::Copy)]))
            }
            Backend::Nccl(n) => n.recv(device_mut(buf), peer),
        }
    }

    /// Opens a group: on NCCL, sends and receives until [`Backend::group_end`] progress
    /// together (a no-op on the CPU backend).
    pub fn group_start(&self) -> Result<()> {
        match self {
            Backend::Cpu(_) => Ok(()),
            Backend::Nccl(n) => n.group_start(),
        }
    }

    /// Closes the group [`Backend::group_start`] opened.
    pub fn group_end(&self) -> Result<()> {
        match self {
            Backend::Cpu(_) => Ok(()),
            Backend::Nccl(n) => n.group_end(),
        }
    }

    /// Ends the backend after the last operation: NCCL leaves its communicator. Nothing
    /// may be called after it.
    pub fn close(&mut self) -> Result<()> {
        match self {
            Backend::Cpu(_) => Ok(()),
            Backend::Nccl(n) => n.close(),
        }
    }

    /// Inside a timed loop or not (`on`): NCCL then runs as nccl-tests' timed loop does (a
    /// blocking communicator; a no-op on the CPU backend).
    pub fn timing(&self, on: bool) -> Result<()> {
        match self {
            Backend::Cpu(_) => Ok(()),
            Backend::Nccl(n) => n.timing(on),
        }
    }

    /// The time this rank has spent waiting for queued operations so far (always zero on
    /// the CPU backend, whose operations finish before they return).
    pub fn waited(&self) -> std::time::Duration {
        match self {
            Backend::Cpu(_) => std::time::Duration::ZERO,
            Backend::Nccl(n) => n.waited(),
        }
    }

    /// Waits until every queued operation has finished (a no-op on the CPU backend,
    /// whose operations finish before they return).
    pub fn synchronize(&self) -> Result<()> {
        match self {
            Backend::Cpu(_) => Ok(()),
            Backend::Nccl(n) => n.synchronize(),
        }
    }
}

/// A host buffer's elements (the CPU backend's buffers).
pub(crate) fn host<T: Element>(buf: &Buffer<T>) -> &[T] {
    match &buf.storage {
        Storage::Host(v) => v,
        Storage::Device(_) => unreachable!("device buffers only come from NCCL"),
    }
}

/// A host buffer's elements, writable.
pub(crate) fn host_mut<T: Element>(buf: &mut Buffer<T>) -> &mut [T] {
    match &mut buf.storage {
        Storage::Host(v) => v,
        Storage::Device(_) => unreachable!("device buffers only come from NCCL"),
    }
}

/// A device buffer's memory (NCCL's buffers).
pub(crate) fn device<T: Element>(buf: &Buffer<T>) -> &cudarc::driver::CudaSlice<T> {
    match &buf.storage {
        Storage::Device(s) => s,
        Storage::Host(_) => unreachable!("NCCL buffers live on the device"),
    }
}

/// A device buffer's memory, writable.
pub(crate) fn device_mut<T: Element>(buf: &mut Buffer<T>) -> &mut cudarc::driver::CudaSlice<T> {
    match &mut buf.storage {
        Storage::Device(s) => s,
        Storage::Host(_) => unreachable!("NCCL buffers live on the device"),
    }
}
