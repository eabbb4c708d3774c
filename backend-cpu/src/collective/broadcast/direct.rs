//! The direct broadcast, for small buffers: the root sends to every rank.

use crate::collective::direct::send_to_each;
use crate::cpu::Cpu;
use crate::element::Reduction;
use crate::prims::{Prims, Src};
use crate::record;
use anyhow::Result;
use workbook_runtime::Func;

/// A small broadcast, direct: the root sends its buffer to every other rank itself, one
/// message time where the chain takes n - 1 (NCCL's tree makes a similar trade).
pub fn broadcast(cpu: &Cpu, root_src: Option<&[u8]>, buf: &mut [u8], root: usize, red: Reduction) -> Result<()> {
    let (n, r, all) = (cpu.world(), cpu.rank(), 0..buf.len());
    let mut prims = Prims::new(cpu, Func::Broadcast, root_src, buf, red);
    if r != root {
        return prims.recv_from(root, all);
    }
    send_to_each(&mut prims, (n, r), Src::Input, |_| all.clone())?;
    if let Some(mine) = root_src {
        prims.output().copy_from_slice(mine);
        record::wrote(prims.output());
    }
    Ok(())
}
