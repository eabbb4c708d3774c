//! A rank of a job: the shared unique id, the rank's device, context and communicator,
//! the ways a rank misbehaves on purpose, and every run the command line asks for.

use crate::args::Args;
use crate::collectives::Collectives;
use crate::ffi::{Fail, cuda, nccl};
use crate::id_file;
use crate::ops::{Run, op};
use crate::raw::Raw;
use crate::safe::Safe;
use crate::values::{Bf16, F16};
use cudarc::driver::{CudaContext, CudaStream};
use cudarc::nccl::{Comm, Id};
use std::ffi::c_char;
use std::sync::Arc;
use std::time::Duration;

/// Rank 0 makes the id and writes it to the file; the others wait for the file.
pub fn shared_id(a: &Args) -> Result<Id, Fail> {
    let Some(path) = a.id_file.clone() else {
        if a.world == 1 {
            return Id::new().map_err(nccl("ncclGetUniqueId"));
        }
        return Err(Fail("--id-file is needed with --world > 1".into()));
    };
    let make = || {
        let id = Id::new().map_err(|e| format!("ncclGetUniqueId: {e:?}"))?;
        Ok(id.internal().map(|c| c as u8))
    };
    let bytes = id_file::share(&path, a.rank, Duration::from_secs(a.id_timeout), make).map_err(Fail)?;
    Ok(Id::uninit(bytes.map(|b| b as c_char)))
}

/// All ranks in this process, one thread each.
pub fn threads(a: &Args) -> Result<Vec<String>, Fail> {
    let id = Id::new().map_err(nccl("ncclGetUniqueId"))?;
    let handles: Vec<_> = (0..a.world)
        .map(|r| {
            let a = a.clone();
            std::thread::spawn(move || rank(&a, r, id))
        })
        .collect();
    let mut lines = Vec::new();
    for h in handles {
        lines.extend(h.join().map_err(|_| Fail("a rank's thread panicked".into()))??);
    }
    Ok(lines)
}

/// The rank's device, context and stream (after `--delay-ms`).
pub fn setup(a: &Args, rank: usize) -> Result<(usize, Arc<CudaContext>, Arc<CudaStream>), Fail> {
    std::thread::sleep(Duration::from_millis(a.delay_ms));
    let count = CudaContext::device_count().map_err(cuda("CudaContext::device_count"))? as usize;
    let device = a.device.unwrap_or(rank % count.max(1));
    let ctx = CudaContext::new(device).map_err(cuda("CudaContext::new"))?;
    let stream = ctx.default_stream();
    Ok((device, ctx, stream))
}

/// What a rank that breaks the job on purpose does once it has joined: `crash` (exit
/// without ending the communicator), `exit-early` (abort it and exit: it never calls the
/// collective), `hang` (write `--ready-file`, then never call anything: the test kills
/// or stops it). `None`: carry on.
pub fn misbehave(a: &Args, rank: usize, comm: &Raw) -> Option<Result<Vec<String>, Fail>> {
    match a.brk.as_deref() {
        Some("crash") => std::process::exit(3),
        Some("exit-early") => Some(comm.abort().map(|()| vec![format!("rank={rank} left early")])),
        Some("hang") => {
            if let Some(f) = &a.ready_file {
                let _ = std::fs::write(f, b"joined");
            }
            loop {
                std::thread::sleep(Duration::from_secs(1));
            }
        }
        _ => None,
    }
}

/// One rank: context, stream, communicator, then the operation.
pub fn rank(a: &Args, rank: usize, id: Id) -> Result<Vec<String>, Fail> {
    let (device, ctx, stream) = setup(a, rank)?;
    let brk = a.brk.as_deref().unwrap_or("");
    let (join_rank, join_world) = match brk {
        "rank-out-of-range" => (a.world, a.world),
        "world-mismatch" => (rank, a.world + 1),
        "same-rank" => (0, a.world),
        _ => (rank, a.world),
    };
    if brk == "no-context" {
        // The context was made on this thread; the communicator on another, where no
        // context is current.
        let (s, nonblocking) = (stream.clone(), a.nonblocking);
        return std::thread::spawn(move || Raw::join(&s, join_rank, join_world, id, nonblocking).map(drop))
            .join()
            .map_err(|_| Fail("thread panicked".into()))?
            .map(|()| vec!["unexpectedly joined".into()]);
    }
    if a.api == "safe" {
        let comm = Comm::from_rank(stream.clone(), join_rank, join_world, id).map_err(nccl("Comm::from_rank"))?;
        let comm = Safe { comm };
        let mut lines = Vec::new();
        let run = session(a, rank, device, &ctx, &comm, &stream, &mut lines);
        // cudarc's Drop calls ncclCommAbort and panics if it fails.
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(comm)))
            .map_err(|_| Fail("dropping the Comm panicked (ncclCommAbort failed)".into()))?;
        return run.map(|()| lines);
    }
    let (comm, mut lines) = Raw::join(&stream, join_rank, join_world, id, a.nonblocking)?;
    if let Some(done) = misbehave(a, rank, &comm) {
        return done;
    }
    session(a, rank, device, &ctx, &comm, &stream, &mut lines)?;
    comm.abort()?;
    Ok(lines)
}

/// `--repeat` times, every combination of `--op`, `--dtype`, `--reduce` (for the ops that
/// reduce) and `--count` in turn, in the order given.
fn session<C: Collectives>(
    a: &Args,
    rank: usize,
    device: usize,
    ctx: &Arc<CudaContext>,
    comm: &C,
    stream: &Arc<CudaStream>,
    lines: &mut Vec<String>,
) -> Result<(), Fail> {
    std::thread::sleep(Duration::from_millis(a.op_delay_ms));
    for _ in 0..a.repeat {
        for op_name in a.op.split(',') {
            let reduces = matches!(
                op_name,
                "allreduce"
                    | "allreduce-inplace"
                    | "reduce"
                    | "reduce-inplace"
                    | "reducescatter"
                    | "reducescatter-inplace"
            );
            let reductions: Vec<&str> = if reduces {
                a.reduce.split(',').collect()
            } else {
                vec![a.reduce.split(',').next().unwrap_or_default()]
            };
            for dtype in a.dtype.split(',') {
                for red in &reductions {
                    for count in &a.counts {
                        let one = Args {
                            op: op_name.into(),
                            dtype: dtype.into(),
                            reduce: red.to_string(),
                            count: *count,
                            ..a.clone()
                        };
                        let run = Run {
                            a: &one,
                            rank,
                            device,
                            ctx,
                            comm,
                            stream,
                        };
                        typed_op(&run, lines)?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// [`op`] for the element type `--dtype`.
fn typed_op<C: Collectives>(run: &Run<C>, lines: &mut Vec<String>) -> Result<(), Fail> {
    macro_rules! typed {
        ($t:ty) => {
            op::<$t, C>(run, lines)
        };
    }
    match run.a.dtype.as_str() {
        "f32" => typed!(f32),
        "f64" => typed!(f64),
        "i32" => typed!(i32),
        "i64" => typed!(i64),
        "u32" => typed!(u32),
        "u64" => typed!(u64),
        "u8" => typed!(u8),
        "i8" => typed!(i8),
        "f16" => typed!(F16),
        "bf16" => typed!(Bf16),
        t => Err(Fail(format!("unknown dtype {t}"))),
    }
}
