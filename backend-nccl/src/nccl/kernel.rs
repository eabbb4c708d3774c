//! A layer's computation on the GPU (lesson 10): the workbook's one kernel, carried as
//! PTX text and compiled by the driver when first used (`cuModuleLoadData`: no nvcc on
//! the node), launched on the rank's stream (`cuLaunchKernel`).
//!
//! `workbook_spin(ns)` is one thread that spins on the GPU's nanosecond clock
//! (`%globaltimer`) until `ns` have passed: it holds its stream for a known time, as a
//! layer's kernels do, and leaves the GPU's other multiprocessors to NCCL's kernels (a
//! real layer fills them all, and NCCL's kernels compete with it for them: the reason
//! NCCL's channels are few). The test double plays it by keeping the stream busy.

use super::Nccl;
use crate::calls::Call;
use anyhow::{Context, Result, anyhow};
use cudarc::driver::result;
use cudarc::driver::sys::{CUfunction, CUmodule};
use std::ffi::{CString, c_void};
use std::time::Duration;

/// The kernel, as `nvcc -ptx` would write `asm volatile("mov.u64 %0, %%globaltimer;")`
/// in a loop.
const SPIN_PTX: &str = r#"
// workbook_spin(u64 ns): one thread spins on the GPU's clock until ns have passed.
.version 7.0
.target sm_70
.address_size 64

.visible .entry workbook_spin(
	.param .u64 workbook_spin_param_0
)
{
	.reg .pred 	%p<2>;
	.reg .b64 	%rd<5>;

	ld.param.u64 	%rd1, [workbook_spin_param_0];
	mov.u64 	%rd2, %globaltimer;
	add.s64 	%rd3, %rd2, %rd1;
$L__spin:
	mov.u64 	%rd4, %globaltimer;
	setp.lt.u64 	%p1, %rd4, %rd3;
	@%p1 bra 	$L__spin;
	ret;
}
"#;

/// The kernel's name in [`SPIN_PTX`].
const SPIN: &str = "workbook_spin";

/// The loaded module and its kernel.
pub(super) struct Spin {
    module: CUmodule,
    function: CUfunction,
}

impl Nccl {
    /// Computes a layer on the GPU: queues a kernel that holds the rank's stream for
    /// `time` after the work issued before it, and returns at once (as a kernel launch does).
    pub fn compute(&self, time: Duration) -> Result<()> {
        let function = self.spin_function()?;
        let mut ns = u64::try_from(time.as_nanos()).unwrap_or(u64::MAX);
        let mut params = [(&raw mut ns).cast::<c_void>()];
        // SAFETY: `function` is workbook_spin, whose one parameter is a u64: `params` points
        // to one, which the driver copies at the launch; one block of one thread, no
        // shared memory, on this rank's stream (its context is current).
        unsafe { result::launch_kernel(function, (1, 1, 1), (1, 1, 1), 0, self.stream.cu_stream(), &mut params) }
            .map_err(|e| anyhow!("rank {}: launching the layer's kernel ({SPIN}): {e:?}", self.rank))?;
        self.shown.show(
            &Call::new("", "cuLaunchKernel")
                .ptr("f", function)
                .arg("grid", "(1,1,1)")
                .arg("block", "(1,1,1)")
                .ptr("hStream", self.stream.cu_stream())
                .arg("kernelParams", format!("{{ns={ns}}}")),
            Some(&super::CUDA_SUCCESS),
            &format!("a layer's computation: {SPIN} holds the stream {time:?}"),
        );
        Ok(())
    }

    /// The kernel, loaded the first time it is asked for.
    fn spin_function(&self) -> Result<CUfunction> {
        if let Some(spin) = self.spin.borrow().as_ref() {
            return Ok(spin.function);
        }
        let image = CString::new(SPIN_PTX).expect("the PTX has no NUL");
        // SAFETY: a NUL-terminated PTX text, which the driver compiles; this rank's
        // context is current.
        let module = unsafe { result::module::load_data(image.as_ptr().cast()) }
            .map_err(|e| anyhow!("{e:?}"))
            .with_context(|| format!("rank {}: loading the layer's kernel (cuModuleLoadData)", self.rank))?;
        // SAFETY: the module just loaded, which declares the entry SPIN.
        let function = match unsafe { result::module::get_function(module, CString::new(SPIN).expect("no NUL")) } {
            Ok(f) => f,
            Err(e) => {
                // SAFETY: the module just loaded, unloaded once.
                let _ = unsafe { result::module::unload(module) };
                return Err(anyhow!("rank {}: finding {SPIN} in its module: {e:?}", self.rank));
            }
        };
        self.shown.show(
            &Call::new("", "cuModuleLoadData")
                .ptr("module", module)
                .arg("image", "\"<the workbook's PTX>\""),
            Some(&super::CUDA_SUCCESS),
            "the driver compiles the PTX for this GPU",
        );
        self.shown.show(
            &Call::new("", "cuModuleGetFunction")
                .ptr("hfunc", function)
                .ptr("hmod", module)
                .arg("name", format!("\"{SPIN}\"")),
            Some(&super::CUDA_SUCCESS),
            "",
        );
        self.spin.replace(Some(Spin { module, function }));
        Ok(function)
    }
}

impl Drop for Spin {
    fn drop(&mut self) {
        // SAFETY: the module loaded once, unloaded once; its context is the rank's, which
        // the Nccl holding this outlives (a failure leaves nothing worse than a module
        // that dies with its context).
        let _ = unsafe { result::module::unload(self.module) };
    }
}
