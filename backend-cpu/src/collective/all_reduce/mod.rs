//! All-reduce (`ncclAllReduce`): every rank's buffer becomes the element-wise reduction
//! (sum, product, max, min or average) of every rank's buffer.
//!
//! Its algorithms on the CPU backend, one file each, and [`run`], which asks the tuner
//! which one runs.

pub mod direct;
pub mod pipelined;
pub mod ring;
pub mod single_copy;
pub mod tree;

use super::HostCall;
use crate::cpu::Cpu;
use crate::tuner::Algorithm;
use anyhow::Result;
use workbook_runtime::Func;

/// Ring all-reduce: reduce-scatter, then all-gather.
///
/// The buffer is cut into `n` chunks. In the reduce-scatter, each of `n - 1` steps sends
/// one chunk right and reduces the chunk arriving from the left into ours; after it, rank
/// r holds the full result of chunk r+1. The all-gather then passes the finished chunks
/// around the ring, `n - 1` steps again, until every rank has every chunk. Each rank
/// sends 2(n-1)/n of the buffer in all: nccl-tests' busbw factor.
///
/// This is the ring step by step, as the lesson draws it ([`ring`]). The tuner
/// ([`crate::tuner::choose`]) picks it only over TCP or under `--steps` on two ranks:
/// when every link of the ring shares memory, the same ring runs piece by piece instead
/// ([`pipelined`]), which saves the buffer's partial results; a small buffer skips the
/// ring altogether ([`direct`]), and a large one on one host is read where it lies, in
/// the other ranks' memory ([`single_copy`]). `NCCL_ALGO=Tree` runs NCCL's double binary
/// tree instead ([`tree`]).
pub fn run(cpu: &Cpu, call: HostCall) -> Result<()> {
    let HostCall {
        send,
        buf: data,
        reduction: red,
        ..
    } = call;
    let n = cpu.world();
    let algo = cpu.choose(Func::AllReduce, data.len());
    if n == 1 {
        cpu.ran(Func::AllReduce, data.len(), algo);
        if let Some(src) = send {
            data.copy_from_slice(src);
        }
        red.finish(data, n);
        return Ok(());
    }
    match algo {
        Algorithm::Direct => direct::all_reduce(cpu, send, data, red),
        Algorithm::SingleCopy => single_copy::all_reduce(cpu, send, data, red),
        Algorithm::RingPipelined => pipelined::all_reduce(cpu, send, data, red),
        Algorithm::Tree => tree::all_reduce(cpu, send, data, red),
        _ => ring::all_reduce(cpu, send, data, red),
    }
}
