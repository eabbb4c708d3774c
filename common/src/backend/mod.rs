//! Backends: what moves the data. Both offer the same operations on the same buffers:
//!
//! - [`cpu`]: ring algorithms between processes (shared memory within a host, TCP
//!   between hosts), the Gloo of this workbook;
//! - [`nccl`]: NVIDIA's NCCL on GPUs, through cudarc.
//!
//! The interface is shaped by the GPU case: buffers live on the device, operations may
//! only be queued when the call returns, and a result is read back (which waits for the
//! queue) before anything is printed.

pub mod cpu;
pub mod nccl;
pub mod watchdog;

use crate::transport::Op;
use anyhow::Result;

/// A number type the collectives can carry and add.
///
/// # Safety
/// Only for plain numbers whose every bit pattern is a valid value (the CPU backend
/// moves them as bytes).
pub unsafe trait Element:
    Copy
    + Default
    + PartialEq
    + PartialOrd
    + Send
    + Sync
    + std::fmt::Display
    + std::fmt::Debug
    + std::ops::Add<Output = Self>
    + cudarc::driver::DeviceRepr
    + cudarc::driver::ValidAsZeroBits
    + cudarc::nccl::NcclType
    + serde::Serialize
    + 'static
{
    /// The type's name as nccl-tests prints it (`float`, `double`, `int32`).
    const NAME: &'static str;
    /// Whether `self` is `expected`, allowing for rounding in floating point.
    fn matches(self, expected: Self) -> bool;
    /// `self + other` as a reduction computes it: integers wrap around, as in NCCL.
    fn sum(self, other: Self) -> Self;
    /// A small whole number in this type (test data whose sums are exact in any type).
    fn from_small(v: i32) -> Self;
}

unsafe impl Element for f32 {
    const NAME: &'static str = "float";
    fn matches(self, expected: f32) -> bool {
        self == expected || (self - expected).abs() <= 1e-5 * expected.abs().max(1.0)
    }
    fn sum(self, other: f32) -> f32 {
        self + other
    }
    fn from_small(v: i32) -> f32 {
        v as f32
    }
}

unsafe impl Element for f64 {
    const NAME: &'static str = "double";
    fn matches(self, expected: f64) -> bool {
        self == expected || (self - expected).abs() <= 1e-12 * expected.abs().max(1.0)
    }
    fn sum(self, other: f64) -> f64 {
        self + other
    }
    fn from_small(v: i32) -> f64 {
        v as f64
    }
}

unsafe impl Element for i32 {
    const NAME: &'static str = "int32";
    fn matches(self, expected: i32) -> bool {
        self == expected
    }
    fn sum(self, other: i32) -> i32 {
        self.wrapping_add(other)
    }
    fn from_small(v: i32) -> i32 {
        v
    }
}

/// The bytes of a slice of elements.
pub fn as_bytes<T: Element>(data: &[T]) -> &[u8] {
    // SAFETY: Element types are plain numbers with no padding.
    unsafe { std::slice::from_raw_parts(data.as_ptr().cast(), std::mem::size_of_val(data)) }
}

/// The bytes of a slice of elements, writable: any bytes make valid elements.
pub fn as_bytes_mut<T: Element>(data: &mut [T]) -> &mut [u8] {
    // SAFETY: Element types are plain numbers, valid for every bit pattern.
    unsafe { std::slice::from_raw_parts_mut(data.as_mut_ptr().cast(), std::mem::size_of_val(data)) }
}

/// A rank's buffer: host memory on the CPU backend, device memory on NCCL.
pub struct Buffer<T: Element> {
    pub(crate) storage: Storage<T>,
}

pub(crate) enum Storage<T: Element> {
    Host(Vec<T>),
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
                storage: Storage::Host(host),
            }),
            Backend::Nccl(n) => n.upload(host),
        }
    }

    /// Reads back the first `n` elements, after all queued work on the buffer is done.
    pub fn download<T: Element>(&self, buf: &Buffer<T>, n: usize) -> Result<Vec<T>> {
        let n = n.min(buf.len());
        match (&buf.storage, self) {
            (Storage::Host(v), _) => Ok(v[..n].to_vec()),
            (Storage::Device(_), Backend::Nccl(nc)) => nc.download(buf, n),
            (Storage::Device(_), Backend::Cpu(_)) => unreachable!("device buffers only come from NCCL"),
        }
    }

    /// Copies `root`'s buffer into every rank's buffer.
    pub fn broadcast<T: Element>(&mut self, buf: &mut Buffer<T>, root: usize) -> Result<()> {
        match self {
            Backend::Cpu(c) => c.broadcast(None, host_mut(buf), root),
            Backend::Nccl(n) => n.broadcast(None, buf, root),
        }
    }

    /// Out of place: `root`'s `send` buffer is copied into every rank's `recv` buffer.
    pub fn broadcast_into<T: Element>(&mut self, send: &Buffer<T>, recv: &mut Buffer<T>, root: usize) -> Result<()> {
        match self {
            Backend::Cpu(c) => c.broadcast(Some(host(send)), host_mut(recv), root),
            Backend::Nccl(n) => n.broadcast(Some(send), recv, root),
        }
    }

    /// Replaces every rank's buffer by the element-wise sum of all of them.
    pub fn all_reduce_sum<T: Element>(&mut self, buf: &mut Buffer<T>) -> Result<()> {
        match self {
            Backend::Cpu(c) => c.all_reduce_sum(None, host_mut(buf)),
            Backend::Nccl(n) => n.all_reduce_sum(None, buf),
        }
    }

    /// Out of place: every rank's `recv` becomes the element-wise sum of every `send`.
    pub fn all_reduce_sum_into<T: Element>(&mut self, send: &Buffer<T>, recv: &mut Buffer<T>) -> Result<()> {
        match self {
            Backend::Cpu(c) => c.all_reduce_sum(Some(host(send)), host_mut(recv)),
            Backend::Nccl(n) => n.all_reduce_sum(Some(send), recv),
        }
    }

    /// Sends the whole buffer to `peer`, which must `recv` the same number of elements.
    pub fn send<T: Element>(&mut self, buf: &Buffer<T>, peer: usize) -> Result<()> {
        match (self, &buf.storage) {
            (Backend::Cpu(c), Storage::Host(v)) => c.send(v, peer),
            (Backend::Nccl(n), _) => n.send(buf, peer),
            (Backend::Cpu(_), Storage::Device(_)) => unreachable!("device buffers only come from NCCL"),
        }
    }

    /// Receives the whole buffer from `peer`.
    pub fn recv<T: Element>(&mut self, buf: &mut Buffer<T>, peer: usize) -> Result<()> {
        match self {
            Backend::Cpu(c) => c.recv(host_mut(buf), peer),
            Backend::Nccl(n) => n.recv(buf, peer),
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

    /// Waits until every queued operation has finished (a no-op on the CPU backend,
    /// whose operations finish before they return).
    pub fn synchronize(&self) -> Result<()> {
        match self {
            Backend::Cpu(_) => Ok(()),
            Backend::Nccl(n) => n.synchronize(),
        }
    }
}

fn host<T: Element>(buf: &Buffer<T>) -> &[T] {
    match &buf.storage {
        Storage::Host(v) => v,
        Storage::Device(_) => unreachable!("device buffers only come from NCCL"),
    }
}

fn host_mut<T: Element>(buf: &mut Buffer<T>) -> &mut [T] {
    match &mut buf.storage {
        Storage::Host(v) => v,
        Storage::Device(_) => unreachable!("device buffers only come from NCCL"),
    }
}

/// nccl-tests' bus-bandwidth factor for an operation on `n` ranks: how much of the data
/// each link must carry compared with the buffer size (see nccl-tests' PERFORMANCE.md).
pub fn bus_factor(op: Op, n: usize) -> f64 {
    match op {
        Op::AllReduce if n > 0 => 2.0 * (n as f64 - 1.0) / n as f64,
        Op::AllReduce => 0.0,
        Op::Broadcast | Op::PointToPoint => 1.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_factors_follow_nccl_tests() {
        assert_eq!(bus_factor(Op::AllReduce, 1), 0.0);
        assert_eq!(bus_factor(Op::AllReduce, 2), 1.0);
        assert_eq!(bus_factor(Op::AllReduce, 4), 1.5);
        assert_eq!(bus_factor(Op::Broadcast, 8), 1.0);
    }

    #[test]
    fn float_matching_allows_rounding_only() {
        assert!(3.0f32.matches(3.0));
        assert!(0.3f32.matches(0.1 + 0.2));
        assert!(!2.0f32.matches(3.0));
        assert!(!f32::NAN.matches(1.0));
        assert!(!7i32.matches(8));
    }
}
