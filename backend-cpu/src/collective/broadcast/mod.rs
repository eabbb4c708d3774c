//! Broadcast (`ncclBroadcast`): the root's buffer is copied into every rank's buffer.
//!
//! Its algorithms on the CPU backend, one file each, and [`run`], which asks the tuner
//! which one runs.

pub mod chain;
pub mod direct;
pub mod single_copy;

use super::HostCall;
use crate::cpu::Cpu;
use crate::tuner::Algorithm;
use anyhow::Result;
use workbook_runtime::Func;

/// Broadcast on the CPU backend: what the tuner chooses ([`crate::tuner::choose`]). A
/// small buffer goes [`direct`] from the root; on one host, a large one is copied by
/// every rank straight from the root's memory ([`single_copy`]); else the [`chain`].
pub fn run(cpu: &Cpu, call: HostCall) -> Result<()> {
    let HostCall { send, buf, root, .. } = call;
    let (n, r) = (cpu.world(), cpu.rank());
    let pos = (r + n - root) % n; // this rank's distance from the root along the ring
    let root_src = send.filter(|_| pos == 0);
    match cpu.choose(Func::Broadcast, buf.len()) {
        Algorithm::Direct => direct::broadcast(cpu, root_src, buf, root),
        Algorithm::SingleCopy => single_copy::broadcast(cpu, root_src, buf, root),
        _ => chain::broadcast(cpu, root_src, buf, root),
    }
}
