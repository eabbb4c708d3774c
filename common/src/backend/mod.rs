//! Backends: what moves the data, and the buffers it moves. Both hold the same buffers
//! and run the same collectives ([`crate::collective`] describes them; each backend has its
//! own way of running them: `workbook_cpu::collective`, `workbook_nccl::collectives`); a
//! rank runs them through its [`crate::Communicator`]:
//!
//! - the CPU backend (the crate `workbook-cpu`): ring and tree algorithms between
//!   processes (shared memory within a host, TCP between hosts), the Gloo of this
//!   workbook; its large buffers live where the other ranks of the host can read them
//!   ([`workbook_cpu::host_memory`]);
//! - [`workbook_nccl::nccl`]: NVIDIA's NCCL on GPUs, through cudarc; the crate `workbook-nccl`.
//!
//! The interface is shaped by the GPU case: buffers live on the device, operations may
//! only be queued when the call returns, and a result is read back (which waits for the
//! queue) before anything is printed.

use workbook_cpu::host_memory;

use workbook_nccl::nccl::DeviceBuffer;
use workbook_runtime::element::Element;

/// A rank's buffer: host memory on the CPU backend (in its shared arena when large),
/// device memory on NCCL (the NCCL backend's [`DeviceBuffer`]: this crate names no CUDA type).
pub struct Buffer<T: Element> {
    pub(crate) storage: Storage<T>,
}

pub(crate) enum Storage<T: Element> {
    Host(host_memory::HostMem<T>),
    Device(DeviceBuffer<T>),
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
pub(crate) fn device<T: Element>(buf: &Buffer<T>) -> &DeviceBuffer<T> {
    match &buf.storage {
        Storage::Device(s) => s,
        Storage::Host(_) => unreachable!("NCCL buffers live on the device"),
    }
}

/// A device buffer's memory, writable.
pub(crate) fn device_mut<T: Element>(buf: &mut Buffer<T>) -> &mut DeviceBuffer<T> {
    match &mut buf.storage {
        Storage::Device(s) => s,
        Storage::Host(_) => unreachable!("NCCL buffers live on the device"),
    }
}
