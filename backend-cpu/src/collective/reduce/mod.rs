//! Reduce (`ncclReduce`): the element-wise reduction of every rank's buffer, on the root
//! only. The other ranks' receive buffers are not written.
//!
//! Its algorithms on the CPU backend, one file each, and [`run`], which asks the tuner
//! which one runs.

pub mod chain;
pub mod single_copy;

use super::HostCall;
use crate::cpu::Cpu;
use crate::tuner::Algorithm;
use anyhow::Result;
use workbook_runtime::Func;

/// Reduce on the CPU backend: as the tuner says ([`crate::tuner::choose`]), the
/// [`chain`] round the ring, or, on one host and between two sizes, the root reading
/// every rank's buffer where it lies ([`single_copy`]).
pub fn run(cpu: &Cpu, call: HostCall) -> Result<()> {
    let HostCall {
        send,
        buf,
        root,
        reduction: red,
        ..
    } = call;
    let n = cpu.world();
    let algo = cpu.choose(Func::Reduce, buf.len());
    if algo == Algorithm::SingleCopy {
        return single_copy::reduce(cpu, send, buf, root, red);
    }
    cpu.ran(Func::Reduce, buf.len(), algo);
    if n == 1 {
        if let Some(src) = send {
            buf.copy_from_slice(src);
        }
        red.finish(buf, n);
        return Ok(());
    }
    chain::reduce(cpu, send, buf, root, red)
}
