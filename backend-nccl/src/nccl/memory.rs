//! The rank's GPU memory: its buffers ([`DeviceBuffer`]), uploaded and downloaded on the
//! stream, a collective's device pointers, inputs set aside on the GPU, and the CUDA
//! calls cudarc makes for them, shown with `--show-calls`.

use super::errors::cuda_error;
use super::{CUDA_SUCCESS, Nccl};
use crate::calls::{Call, Label};
use crate::element::{Element, as_bytes, as_bytes_mut};
use anyhow::{Context, Result, anyhow};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use std::ffi::c_void;
use std::marker::PhantomData;

/// A buffer of `T`s in this rank's GPU memory: what `common`'s `Buffer` holds on the NCCL
/// backend. Opaque, so that the layers above name no CUDA type: the memory is cudarc's
/// bytes (a `CudaSlice<u8>`, freed in stream order when dropped), and the element type is
/// only this type's parameter. The elements go in and out as bytes
/// ([`Element`]'s contract: plain numbers, any bytes a value, `T::TYPE.size()` bytes
/// each), and NCCL reads them as `T::TYPE`. Alignment: cudarc allocates with
/// `cuMemAllocAsync` or `cuMemAlloc`, whose memory is aligned to at least 256 bytes,
/// more than any element type needs (8 bytes at most); offsets into it are whole
/// elements.
pub struct DeviceBuffer<T> {
    /// The memory: `len() * size_of::<T>()` bytes.
    pub(super) bytes: CudaSlice<u8>,
    _elements: PhantomData<T>,
}

impl<T: Element> DeviceBuffer<T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.bytes.len() / size_of::<T>()
    }

    /// Whether the buffer has no elements.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

impl Nccl {
    /// A copy of `host` in this GPU's memory, queued on the stream.
    pub fn upload<T: Element>(&self, host: Vec<T>) -> Result<DeviceBuffer<T>> {
        self.synchronize()?;
        let slice = self
            .stream
            .clone_htod(as_bytes(&host))
            .map_err(cuda_error)
            .with_context(|| format!("rank {}: copying to the GPU", self.rank))?;
        let bytes = std::mem::size_of_val(host.as_slice());
        self.last.replace(Label::of("copying to the GPU (cuMemcpyHtoDAsync)"));
        let (dst, _written) = slice.device_ptr(self.stream.as_ref());
        self.show_alloc(dst, bytes, "cudarc's clone_htod: GPU memory for the buffer...");
        self.show_cuda(
            Call::new("", "cuMemcpyHtoDAsync_v2")
                .arg("dstDevice", format!("{dst:#x}"))
                .ptr("srcHost", host.as_ptr())
                .arg("ByteCount", bytes),
            "...and the host's values copied into it, queued on the stream",
        );
        drop(_written);
        Ok(DeviceBuffer {
            bytes: slice,
            _elements: PhantomData,
        })
    }

    /// Elements `range` of `buf`, read back after every queued operation is done.
    pub fn download<T: Element>(&self, buf: &DeviceBuffer<T>, range: std::ops::Range<usize>) -> Result<Vec<T>> {
        // The copy would wait for the queued collectives without a deadline: wait here first.
        self.synchronize()?;
        let n = range.len();
        if n == 0 {
            return Ok(vec![]);
        }
        let elem = size_of::<T>();
        let view = buf.bytes.slice(range.start * elem..range.end * elem);
        // cudarc's clone_dtoh is this: a host vector, then memcpy_dtoh into it; here the
        // vector is of elements, filled as bytes. The CUDA calls, and so the note
        // --show-calls prints, are clone_dtoh's.
        let mut host = vec![T::default(); n];
        self.stream
            .memcpy_dtoh(&view, as_bytes_mut(&mut host))
            .map_err(cuda_error)
            .with_context(|| format!("rank {}: copying {n} elements back from the GPU", self.rank))?;
        let (src, _read) = view.device_ptr(self.stream.as_ref());
        self.show_cuda(
            Call::new("", "cuMemcpyDtoHAsync_v2")
                .ptr("dstHost", host.as_ptr())
                .arg("srcDevice", format!("{src:#x}"))
                .arg("ByteCount", std::mem::size_of_val(host.as_slice())),
            "cudarc's clone_dtoh: the GPU's values back to the host",
        );
        drop(_read);
        // The last thing queued is now this copy: a later wait names it, not the collective.
        self.last
            .replace(Label::of("copying back from the GPU (cuMemcpyDtoHAsync)"));
        Ok(host)
    }

    /// Calls `f` with the device pointers of a collective's buffers: `send`'s and
    /// `recv`'s, or in place (`send` is `None`) both into `recv`, at the element offsets
    /// `in_place` gives (NCCL's in-place layouts). The buffers are recorded as used by the
    /// stream.
    pub fn with_pointers<T: Element, R>(
        &self,
        send: Option<&DeviceBuffer<T>>,
        recv: &mut DeviceBuffer<T>,
        in_place: (usize, usize),
        f: impl FnOnce(*const c_void, *mut c_void) -> R,
    ) -> R {
        let stream = self.stream.as_ref();
        let elem = size_of::<T>();
        // The guards record, when dropped after the call, that the stream used the buffers.
        let (dst, _written) = recv.bytes.device_ptr_mut(stream);
        let (src, _read) = match send {
            Some(s) => {
                let (p, guard) = s.bytes.device_ptr(stream);
                (p, Some(guard))
            }
            None => (dst + (in_place.0 * elem) as u64, None),
        };
        let dst = match send {
            Some(_) => dst,
            None => dst + (in_place.1 * elem) as u64,
        };
        f(src as *const c_void, dst as *mut c_void)
    }

    /// A copy of `bytes` at `src`, queued on the stream into working memory this rank
    /// keeps: for a collective whose input its own output would overwrite.
    /// Inside an open group, each copy has working memory of its own, kept until the group
    /// is queued: the group's calls all run at its end, after every copy.
    pub fn copy_aside(&self, src: *const c_void, bytes: usize) -> Result<*const c_void> {
        let make = || -> Result<CudaSlice<u8>> {
            let made = self
                .stream
                .alloc_zeros::<u8>(bytes.max(1))
                .map_err(cuda_error)
                .with_context(|| format!("rank {}: allocating {bytes} bytes of GPU memory", self.rank))?;
            let (p, _written) = made.device_ptr(self.stream.as_ref());
            self.show_alloc(
                p,
                bytes.max(1),
                "working memory for an input the output would overwrite",
            );
            drop(_written);
            Ok(made)
        };
        let mut held = self.held.borrow_mut();
        let mut aside = self.aside.borrow_mut();
        let target = match self.groups.get() {
            0 => {
                if aside.as_ref().is_none_or(|a| a.len() < bytes) {
                    *aside = Some(make()?);
                }
                aside.as_mut().expect("just made")
            }
            _ => {
                held.push(make()?);
                held.last_mut().expect("just made")
            }
        };
        let stream = self.stream.as_ref();
        let (dst, _written) = target.device_ptr_mut(stream);
        // SAFETY: both ranges are device memory of this context, `bytes` long, on this stream.
        let r = unsafe { cudarc::driver::sys::cuMemcpyDtoDAsync_v2(dst, src as u64, bytes, stream.cu_stream()) };
        self.shown.show(
            &Call::new("", "cuMemcpyDtoDAsync_v2")
                .arg("dstDevice", format!("{dst:#x}"))
                .ptr("srcDevice", src)
                .arg("ByteCount", bytes)
                .ptr("hStream", stream.cu_stream()),
            Some(&r),
            "the input set aside, on the GPU",
        );
        if r != cudarc::driver::sys::cudaError_enum::CUDA_SUCCESS {
            return Err(anyhow!(
                "rank {}: copying {bytes} bytes on the GPU failed: {r:?}",
                self.rank
            ));
        }
        Ok(dst as *const c_void)
    }

    /// Shows a CUDA call cudarc made and succeeded in (it returns an error otherwise).
    pub(super) fn show_cuda(&self, call: Call, note: &str) {
        let call = call.ptr("hStream", self.stream.cu_stream());
        self.shown.show(&call, Some(&CUDA_SUCCESS), note);
    }

    /// Shows the allocation cudarc made of `bytes` at `at`: from the stream's memory pool
    /// when the GPU has one (`cuMemAllocAsync`), else `cuMemAlloc`.
    fn show_alloc(&self, at: u64, bytes: usize, note: &str) {
        let dptr = format!("→{at:#x}");
        match self.stream.context().has_async_alloc() {
            true => self.show_cuda(
                Call::new("", "cuMemAllocAsync")
                    .arg("dptr", dptr)
                    .arg("bytesize", bytes),
                note,
            ),
            false => self.shown.show(
                &Call::new("", "cuMemAlloc_v2").arg("dptr", dptr).arg("bytesize", bytes),
                Some(&CUDA_SUCCESS),
                note,
            ),
        }
    }
}
