//! The ring all-reduce, step by step, as lesson 02 draws it.

use crate::collective::ring::all_gather_steps;
use crate::cpu::{Cpu, chunk_range};
use crate::element::Reduction;
use crate::prims::{Prims, Src};
use anyhow::Result;
use workbook_runtime::Func;

/// The ring all-reduce step by step: reduce-scatter, then all-gather, `n - 1` steps each
/// (the choice between the all-reduce's algorithms: [`super`]).
pub fn all_reduce(cpu: &Cpu, send: Option<&[u8]>, data: &mut [u8], red: Reduction) -> Result<()> {
    let (n, r, e) = (cpu.world(), cpu.rank(), red.elem);
    let count = data.len() / e;
    let chunk = |i: usize| {
        let c = chunk_range(count, n, i % n);
        c.start * e..c.end * e
    };
    let mut prims = Prims::new(cpu, Func::AllReduce, send, data, red);
    prims.phase("reduce-scatter");
    // Step s sends chunk r - s right and reduces chunk r - s - 1 arriving from the left
    // into ours; the first chunk sent comes from the input, the later ones are the
    // partial results this rank made.
    for s in 0..n - 1 {
        let from = if s == 0 { Src::Input } else { Src::Output };
        prims.send_recv_reduce(from, chunk(r + n - s), chunk(r + 2 * n - s - 1))?;
    }
    // Rank r now holds chunk r + 1 finished: average it before it travels.
    prims.finish(chunk(r + 1));
    all_gather_steps(&mut prims, (n, r), &chunk, 1)
}
