//! The direct broadcast, for small buffers: the root sends to every rank.

use crate::collective::direct::send_to_each;
use crate::cpu::Cpu;
use crate::record::{self, Dir, How};
use crate::tuner::Algorithm;
use anyhow::{Context, Result};
use workbook_runtime::Func;

/// A small broadcast, direct: the root sends its buffer to every other rank itself, one
/// message time where the chain takes n - 1 (NCCL's tree makes a similar trade).
pub fn broadcast(cpu: &Cpu, root_src: Option<&[u8]>, buf: &mut [u8], root: usize) -> Result<()> {
    let (r, tag) = (cpu.rank(), Func::Broadcast.tag());
    cpu.ran(Func::Broadcast, buf.len(), Algorithm::Direct);
    if r != root {
        let t = record::clock();
        cpu.link(root)
            .recv_into(tag, buf)
            .map_err(|e| cpu.lost(e, root))
            .with_context(|| format!("broadcast from rank {root}: receiving {}", cpu.peer_name(root)))?;
        record::op(t, "recv", &[(Dir::Recv, root, buf, How::Copy)]);
        return Ok(());
    }
    let out = root_src.unwrap_or(buf);
    send_to_each(cpu, tag, "broadcast", |_| out)?;
    if let Some(mine) = root_src {
        buf.copy_from_slice(mine);
        record::wrote(buf);
    }
    Ok(())
}
