//! 08 — The all-reduce of lesson 02, without the workbook: NCCL's API through cudarc, call by call.
//!
//! The harness only starts the ranks and lets them meet (`common::meet`); everything
//! else is what any Rust program on a GPU node writes: a context on this rank's GPU, the
//! unique id that rank 0 makes and every rank reads, the communicator, buffers on the GPU,
//! the collective, the copy back, and the communicator's end. It needs NCCL: run it on a
//! GPU node, or on a laptop with `--simulate-gpus 2`.
//!
//! Run it: `cargo run --release --bin 08-cudarc-allreduce -- --simulate-gpus 4`

use clap::Parser;
use common::meeting::NcclResult;
use cudarc::driver::{CudaContext, DevicePtr, DevicePtrMut};
use cudarc::nccl::sys::{self, ncclDataType_t::ncclFloat32, ncclRedOp_t::ncclSum};
use cudarc::nccl::{Id, result};

/// All-reduce with cudarc's NCCL API: every rank ends up with 1 + 2 + … + n.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    #[command(flatten)]
    run: common::RunArgs,
    /// Elements per rank.
    #[arg(long, default_value_t = 4)]
    count: usize,
}

fn main() -> std::process::ExitCode {
    let args: Args = common::parse_args();
    common::meet(&args.run, |me| {
        let (rank, world) = (me.rank(), me.world_size());

        // 1. This rank's GPU, and a stream to queue work on (cuInit, cuDevicePrimaryCtxRetain).
        let ctx = CudaContext::new(me.device())?;
        let stream = ctx.default_stream();

        // 2. The unique id: 128 bytes rank 0 makes (ncclGetUniqueId) and sends every rank
        //    through the store. It names the communicator, like a meeting's address.
        let bytes = me.from_rank0("nccl-id", || {
            let id = Id::new().nccl("ncclGetUniqueId")?;
            Ok(id.internal().iter().map(|c| *c as u8).collect())
        })?;
        let internal = std::array::from_fn(|i| bytes[i] as _);
        let id = sys::ncclUniqueId { internal };

        // 3. Join the communicator: every rank calls it, and it returns once all have (ncclCommInitRank).
        //    The raw handle, not cudarc's `Comm`: dropping a `Comm` aborts it (see step 7).
        let mut comm: sys::ncclComm_t = std::ptr::null_mut();
        // SAFETY: NCCL writes the new communicator's handle into `comm`, a valid place for it.
        unsafe { result::comm_init_rank(&mut comm, world as _, id, rank as _) }.nccl("ncclCommInitRank")?;

        // 4. Buffers on the GPU: rank r sends r + 1 everywhere (cuMemAlloc, cuMemcpyHtoD).
        let send = stream.clone_htod(&vec![(rank + 1) as f32; args.count])?;
        let mut recv = stream.alloc_zeros::<f32>(args.count)?;

        // 5. The collective: queued on the stream, run by the GPU (ncclAllReduce).
        let ((src, read), (dst, written)) = (send.device_ptr(&stream), recv.device_ptr_mut(&stream));
        let (n, on) = (args.count, stream.cu_stream());
        // SAFETY: `src` and `dst` hold `n` f32s on this GPU; their guards (`read`, `written`)
        // keep them alive until the call is queued on `stream`, and order their next uses after it.
        unsafe { result::all_reduce(src as _, dst as _, n, ncclFloat32, ncclSum, comm, on as _) }
            .nccl("ncclAllReduce")?;
        drop((read, written));

        // 6. Back to the host: the copy waits for the all-reduce (cuMemcpyDtoH).
        let result = stream.clone_dtoh(&recv)?;
        me.say(&format!("sent {}, got {result:?}", rank + 1));

        // 7. The end, as NCCL's examples end: ncclCommFinalize waits until NCCL has sent the
        //    peers all they need from this rank (its proxy thread may still be sending when
        //    this GPU is done), then ncclCommDestroy frees the communicator. cudarc's `Comm`
        //    drops with ncclCommAbort, NCCL's way out of a failure, which could cut those sends.
        // SAFETY: `comm` is step 3's communicator, idle (step 6 waited), never used after this.
        unsafe { result::comm_finalize(comm) }.nccl("ncclCommFinalize")?;
        // SAFETY: the same communicator, finalized: destroying it only frees it.
        unsafe { result::comm_destroy(comm) }.nccl("ncclCommDestroy")?;

        let expected = (world * (world + 1) / 2) as f32;
        anyhow::ensure!(result.iter().all(|x| *x == expected), "expected {expected} everywhere");
        Ok(())
    })
}
