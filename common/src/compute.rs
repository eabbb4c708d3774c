//! A computation to hide communication behind (lesson 10): a model's layers, each with
//! its gradients' sizes, and a layer's forward or backward work that really computes:
//! floating-point multiply-adds on this core, of a known operation count.

use crate::Session;
use anyhow::Result;
use std::hint::black_box;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// When each layer computed, in this process: a stream's report says which of its
/// collectives ran while the rank computed ([`crate::Session::overlap`]).
static COMPUTED: Mutex<Vec<(Instant, Instant)>> = Mutex::new(Vec::new());

/// A layer's kernel was just queued on the GPU (NCCL): its start and end in the log are
/// the launch, the moment the host knows of (PyTorch's autograd hooks fire then too).
pub(crate) fn launched() {
    let now = Instant::now();
    COMPUTED.lock().unwrap_or_else(|e| e.into_inner()).push((now, now));
}

/// The layers computed since `since` (their start and end), left in the log.
pub(crate) fn computed_after(since: Instant) -> Vec<(Instant, Instant)> {
    let log = COMPUTED.lock().unwrap_or_else(|e| e.into_inner());
    log.iter().filter(|(start, _)| *start >= since).copied().collect()
}

/// The layers computed since `since` (their start and end), taken out of the process's
/// log; the log keeps nothing older (a stream asks when it closes, so it stays short).
pub(crate) fn computed_since(since: Instant) -> Vec<(Instant, Instant)> {
    let mut log = COMPUTED.lock().unwrap_or_else(|e| e.into_inner());
    let taken = log.iter().filter(|(start, _)| *start >= since).copied().collect();
    log.clear();
    taken
}

/// A model of `layers` transformer layers of width `hidden`, as chapter 7 shapes it: each
/// layer's 12 tensors (attention, MLP, norms), 12·h² + 13·h parameters.
pub struct Model {
    /// Parameters (and so gradients) of each layer, first to last.
    pub layers: Vec<usize>,
    /// Each layer's tensors, in order: the sizes of its parameters (DDP buckets these).
    pub tensors: Vec<usize>,
}

impl Model {
    /// The model of `layers` layers of width `hidden`.
    pub fn new(layers: usize, hidden: usize) -> Model {
        let h = hidden;
        let tensors = vec![h, h, h * 3 * h, 3 * h, h * h, h, h, h, h * 4 * h, 4 * h, 4 * h * h, h];
        Model {
            layers: vec![tensors.iter().sum(); layers],
            tensors,
        }
    }

    /// Every layer's parameters together.
    pub fn parameters(&self) -> usize {
        self.layers.iter().sum()
    }

    /// Refuses, in one line said once, a model whose gradients this machine cannot hold
    /// `copies` times over on every rank of a host (a step's buffers at their peak):
    /// without it, a `--layers` and `--hidden` too large end in an aborted allocation or
    /// the out-of-memory killer.
    pub fn ensure_fits(&self, s: &mut Session, copies: u64) -> Result<()> {
        let bytes = (self.parameters() as u64).saturating_mul(4 * copies);
        s.ensure_memory(bytes, "the model (--layers, --hidden)")
    }
}

/// A layer's computation: `flops` floating-point operations (multiply-adds count two) on
/// data that stays in this core's cache, so that its time is the core's, not memory's.
#[derive(Clone, Copy)]
pub struct Compute {
    /// Operations per layer.
    pub flops: u64,
    /// How long one layer took on this core when nothing else ran, measured at the start.
    pub alone: Duration,
    /// The time asked for (`--compute-us`): what a layer's kernel lasts on a GPU.
    pub time: Duration,
}

/// Lanes computed side by side: enough independent chains to keep a core's multiply-add
/// units busy.
const LANES: usize = 16;

impl Compute {
    /// The computation that takes about `time` on this core, alone: its rate is measured
    /// first (a few milliseconds), and the operation count fixed from it.
    pub fn lasting(time: Duration) -> Compute {
        // Warm up, then time a known count.
        run(1 << 20);
        let probe: u64 = 1 << 24;
        let start = Instant::now();
        run(probe);
        let per_flop = start.elapsed().as_secs_f64() / probe as f64;
        let flops = ((time.as_secs_f64() / per_flop) as u64).max(2 * LANES as u64);
        let start = Instant::now();
        run(flops);
        Compute {
            flops,
            alone: start.elapsed(),
            time,
        }
    }

    /// Computes one layer; returns how long it took (longer than [`Compute::alone`] when
    /// another thread, a stream's, shares the core).
    pub fn layer(&self) -> Duration {
        let _span = workbook_runtime::record::compute("a layer");
        let start = Instant::now();
        run(self.flops);
        let end = Instant::now();
        COMPUTED.lock().unwrap_or_else(|e| e.into_inner()).push((start, end));
        end - start
    }
}

/// `flops` operations: multiply-adds on [`LANES`] independent accumulators, whose result
/// the compiler must keep (`black_box`).
fn run(flops: u64) -> f32 {
    let mut acc = [1.0f32; LANES];
    let (a, b) = (black_box(0.999_999f32), black_box(1e-7f32));
    for _ in 0..flops / (2 * LANES as u64) {
        for x in acc.iter_mut() {
            *x = *x * a + b;
        }
    }
    black_box(acc.iter().sum())
}

/// `--bucket-mb`: DDP's bucket size, in MiB (PyTorch's `bucket_cap_mb`): more than 0.
pub fn bucket_mib(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(m) if m > 0.0 && m <= 1024.0 * 1024.0 => Ok(m),
        Ok(_) => Err("a bucket holds more than 0 MiB (and at most 1 TiB)".into()),
        Err(_) => Err("a size in MiB: 25, or 0.5".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_has_chapter_7s_layers() {
        let m = Model::new(2, 4);
        assert_eq!(m.layers, vec![12 * 16 + 13 * 4; 2]);
        assert_eq!(m.parameters(), 2 * (12 * 16 + 13 * 4));
    }

    #[test]
    fn a_layer_computes_its_count() {
        let c = Compute::lasting(Duration::from_micros(200));
        assert!(c.flops >= 2 * LANES as u64);
        assert!(c.layer() > Duration::ZERO);
    }
}
