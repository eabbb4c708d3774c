//! 08 — The all-reduce of lesson 02, without the workbook: cudarc's NCCL API, call by call.
//!
//! The harness only starts the ranks and lets them meet (`common::meet`); everything
//! else is what any Rust program on a GPU node writes: a context on this rank's GPU, the
//! unique id that rank 0 makes and every rank reads, the communicator, buffers on the GPU,
//! the collective, and the copy back. It needs NCCL: run it on a GPU node, or on a
//! laptop with `--simulate-gpus 2`.
//!
//! Run it: `cargo run --release --bin 08-cudarc-allreduce -- --simulate-gpus 4`

use clap::Parser;
use common::meeting::NcclResult;
use cudarc::driver::CudaContext;
use cudarc::nccl::{Comm, Id, ReduceOp};

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
        let id = Id::uninit(std::array::from_fn(|i| bytes[i] as _));

        // 3. Join the communicator: every rank calls it, and it returns once all have (ncclCommInitRank).
        let comm = Comm::from_rank(stream.clone(), rank, world, id).nccl("ncclCommInitRank")?;

        // 4. Buffers on the GPU: rank r sends r + 1 everywhere (cuMemAlloc, cuMemcpyHtoD).
        let send = stream.clone_htod(&vec![(rank + 1) as f32; args.count])?;
        let mut recv = stream.alloc_zeros::<f32>(args.count)?;

        // 5. The collective: queued on the stream, run by the GPU (ncclAllReduce).
        comm.all_reduce(&send, &mut recv, &ReduceOp::Sum)
            .nccl("ncclAllReduce")?;

        // 6. Back to the host: the copy waits for the all-reduce (cuMemcpyDtoH).
        let result = stream.clone_dtoh(&recv)?;
        me.say(&format!("sent {}, got {result:?}", rank + 1));

        let expected = (world * (world + 1) / 2) as f32;
        anyhow::ensure!(result.iter().all(|x| *x == expected), "expected {expected} everywhere");
        Ok(())
    })
}
