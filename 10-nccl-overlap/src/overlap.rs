//! The lesson's flags and bookkeeping: the four ways, what each rank's gradients and parameters
//! hold before a step, what a step measured, and the lines that say it. The steps
//! themselves are in main.rs.

use anyhow::Result;
use clap::Parser;
use common::compute::{Compute, Model};
use common::session::Span;
use common::{Buffer, Session, Stream, try_collect, try_vec};
use std::time::Duration;

/// One training step four ways: DDP's backward, then one all-reduce or in buckets; FSDP's
/// forward, gathering each layer's parameters when needed or one layer ahead.
#[derive(Parser)]
#[command(version, about)]
pub struct Args {
    #[command(flatten)]
    pub run: common::RunArgs,
    /// Layers of the model (chapter 7's transformer layers).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub layers: u32,
    /// The layers' width h: each has 12·h² + 13·h parameters.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=16384))]
    pub hidden: u32,
    /// What one layer computes, in microseconds on a core of its own (forward or backward).
    #[arg(long, value_name = "US", default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub compute_us: u64,
    /// DDP's bucket size in MiB (PyTorch's bucket_cap_mb, 25 by default there; 4 here, where
    /// the default model's gradients are 24 MiB).
    #[arg(long, value_name = "MIB", default_value_t = 4.0, value_parser = common::compute::bucket_mib)]
    pub bucket_mb: f64,
    /// Steps run each way: the times are their medians, the timeline the last one's.
    #[arg(long, value_name = "N", default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub iters: u32,
}

/// One way of running a step.
#[derive(Clone, Copy)]
pub struct Way {
    /// Its line in the output.
    pub name: &'static str,
    /// DDP's backward (all-reduces of gradients), or FSDP's forward (all-gathers of
    /// parameters).
    ddp: bool,
    /// DDP: one bucket of every gradient, all-reduced after the last layer.
    one_bucket: bool,
    /// FSDP: the next layer's gather issued before this layer computes.
    pub prefetch: bool,
}

/// The four ways, in the order the lesson runs them.
pub const WAYS: [Way; 4] = [
    Way {
        name: "DDP: backward, then one all-reduce",
        ddp: true,
        one_bucket: true,
        prefetch: false,
    },
    Way {
        name: "DDP: buckets all-reduced as they fill",
        ddp: true,
        one_bucket: false,
        prefetch: false,
    },
    Way {
        name: "FSDP: forward, gather when needed",
        ddp: false,
        one_bucket: false,
        prefetch: false,
    },
    Way {
        name: "FSDP: forward, next layer prefetched",
        ddp: false,
        one_bucket: false,
        prefetch: true,
    },
];

/// A DDP bucket: the gradients of consecutive tensors, the last layer's first, and when
/// they are all ready: once `ready_after` layers of the backward are computed.
pub struct Bucket {
    /// Layers computed when its last tensor's gradient is ready.
    pub ready_after: usize,
    /// This rank's gradients of its tensors: (rank + 1)(layer + 1) everywhere.
    pub gradients: Buffer<f32>,
}

/// A way's buffers, made before its step.
pub enum Prepared {
    /// DDP: the buckets, in the order the backward fills them.
    Buckets(Vec<Bucket>),
    /// FSDP: one buffer per layer, first to last, for the whole layer's parameters, with
    /// this rank's shard of ⌈P / n⌉ in place: (rank + 1)(layer + 1) everywhere.
    Shards(Vec<Buffer<f32>>),
}

impl Way {
    /// This rank's buffers for the way's step; `bucket` is DDP's bucket size in bytes.
    pub fn prepare(&self, s: &mut Session, model: &Model, bucket: usize) -> Result<Prepared> {
        let (rank, n) = (s.rank(), s.world_size());
        let value = |rank: usize, layer: usize| ((rank + 1) * (layer + 1)) as f32;
        let bucket = if self.one_bucket { usize::MAX } else { bucket };
        if self.ddp {
            // PyTorch's rule: tensors join the open bucket in the order the backward
            // produces them, and a bucket closes once it holds `bucket` bytes or more.
            let (mut buckets, mut open) = (Vec::new(), Vec::new());
            let layers = model.layers.len();
            for (done, layer) in (0..layers).rev().enumerate() {
                for (t, &len) in model.tensors.iter().enumerate().rev() {
                    open.extend(std::iter::repeat_n(value(rank, layer), len));
                    let last = layer == 0 && t == 0;
                    if open.len() * 4 >= bucket || last {
                        let gradients = s.from_host(std::mem::take(&mut open))?;
                        buckets.push(Bucket {
                            ready_after: done + 1,
                            gradients,
                        });
                    }
                }
            }
            return Ok(Prepared::Buckets(buckets));
        }
        let mut shards = Vec::new();
        for (layer, params) in model.layers.iter().enumerate() {
            let shard = params.div_ceil(n);
            let mut whole = try_collect(shard * n, "a layer's parameters", |_| 0.0)?;
            whole[rank * shard..(rank + 1) * shard].fill(value(rank, layer));
            shards.push(s.from_host(whole)?);
        }
        Ok(Prepared::Shards(shards))
    }

    /// What every rank's results hold after the step, element by element: DDP, the
    /// averaged gradients, (n + 1)(layer + 1) / 2, the last layer first; FSDP, each layer's
    /// parameters whole, rank i's shard (i + 1)(layer + 1).
    fn expected(&self, model: &Model, n: usize, len: usize) -> Result<Vec<f32>> {
        let mut all = try_vec(len, "the expected results")?;
        if self.ddp {
            for (layer, &params) in model.layers.iter().enumerate().rev() {
                let average = ((n + 1) * (layer + 1)) as f32 / 2.0;
                all.extend(std::iter::repeat_n(average, params));
            }
        } else {
            for (layer, &params) in model.layers.iter().enumerate() {
                for rank in 0..n {
                    all.extend(std::iter::repeat_n(
                        ((rank + 1) * (layer + 1)) as f32,
                        params.div_ceil(n),
                    ));
                }
            }
        }
        Ok(all)
    }
}

/// What one step did on this rank: how long it computed and took, what its collectives
/// gave, and when each ran.
pub struct Step {
    /// Time spent computing layers.
    pub computing: Duration,
    /// The buffers its collectives gave back, in the order waited.
    pub results: Vec<Buffer<f32>>,
    time: Duration,
    log: Vec<Span>,
    /// Each layer computed: its start and end, in seconds since the step began.
    layers: Vec<(f64, f64)>,
}

impl Step {
    /// A step starting now.
    pub fn new() -> Step {
        Step {
            computing: Duration::ZERO,
            results: Vec::new(),
            time: Duration::ZERO,
            log: Vec::new(),
            layers: Vec::new(),
        }
    }

    /// The step is over once what the rank computed has finished (on a GPU, its last
    /// kernel): its time (since the stream opened), and its collectives' log.
    pub fn done(mut self, stream: &mut Stream) -> Result<Step> {
        stream.finish()?;
        self.time = stream.elapsed();
        self.log = stream.log().to_vec();
        self.layers = stream.computed();
        Ok(self)
    }
}

/// Says what the model is, what a layer costs, and how the buckets cut it; refuses a
/// model this machine has no memory for.
pub fn introduce(s: &mut Session, model: &Model, compute: &Compute, args: &Args) -> Result<()> {
    let bucket_mib = args.bucket_mb;
    // A way's buffers, its results' copy and what they must hold (3.1 times the model
    // measured at the peak, on one rank).
    model.ensure_fits(s, 4)?;
    let mib = |elems: usize| (elems * 4) as f64 / (1 << 20) as f64;
    // Where a layer computes: on this core (a count of operations), or on the GPU (a kernel).
    let layer = match s.backend_name() {
        "nccl" => format!(
            "a layer is a kernel that holds rank 0's GPU stream {:.2} ms",
            compute.time.as_secs_f64() * 1e3
        ),
        _ => format!(
            "a layer computes {:.1} Mflop, {:.2} ms on rank 0 alone",
            compute.flops as f64 / 1e6,
            compute.alone.as_secs_f64() * 1e3
        ),
    };
    s.say(&format!(
        "Model: {} layers of {} tensors, {} parameters each ({:.1} MiB of gradients in all); {layer}; DDP's \
         buckets hold {bucket_mib} MiB of gradients or a little more.",
        model.layers.len(),
        model.tensors.len(),
        model.layers[0],
        mib(model.parameters()),
    ));
    s.say(&format!(
        "Rank 0's times in ms, the median of {} step{} each way: the step; computing; communicating (the \
         stream busy); exposed (the step less computing). The timeline is the last step's.",
        args.iters,
        if args.iters == 1 { "" } else { "s" }
    ));
    Ok(())
}

/// A step's times, in ms: the whole step, computing, the stream busy (the CPU backend's
/// thread; NCCL's kernels run on the GPU: `None`), and exposed (the step less computing).
#[derive(Clone, Copy)]
pub struct Times {
    step: f64,
    computing: f64,
    busy: Option<f64>,
    exposed: f64,
}

impl Step {
    /// Its times.
    pub fn times(&self) -> Times {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        Times {
            step: ms(self.time),
            computing: ms(self.computing),
            busy: self.log.iter().map(|span| span.ran.map(|(a, b)| (b - a) * 1e3)).sum(),
            exposed: ms(self.time.saturating_sub(self.computing)),
        }
    }
}

/// The median of `values`.
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Prints the way's line (the median of each time over its steps) and the last step's
/// timeline, and adds the medians to the JSON report.
pub fn report(s: &mut Session, way: Way, times: &[Times], last: &Step) -> Result<()> {
    let of = |f: fn(&Times) -> f64| median(times.iter().map(f).collect());
    let (step, computing, exposed) = (of(|t| t.step), of(|t| t.computing), of(|t| t.exposed));
    let busy = times.iter().map(|t| t.busy).collect::<Option<Vec<f64>>>().map(median);
    let comm = busy.map_or("—".to_string(), |b| format!("{b:.1}"));
    s.say(&format!(
        "{:<38} step {step:>6.1}   computing {computing:>6.1}   communicating {comm:>6}   exposed {exposed:>6.1}",
        way.name,
    ));
    // The first collectives and the last, which decides when the step ends.
    let line = |span: &Span| {
        let ran = span
            .ran
            .map_or(String::new(), |(a, b)| format!(", ran {:.1}–{:.1}", a * 1e3, b * 1e3));
        format!(
            "    {} {} ({}): issued at {:.1}{ran}, waited at {:.1}",
            span.what,
            span.seq,
            span.size(),
            span.issued * 1e3,
            span.waited * 1e3
        )
    };
    const SHOWN: usize = 12;
    for span in last.log.iter().take(SHOWN) {
        s.say(&line(span));
    }
    if let Some(end) = last.log.last().filter(|_| last.log.len() > SHOWN) {
        let between = last.log.len() - SHOWN - 1;
        if between > 0 {
            s.say(&format!("    … {between} more"));
        }
        s.say(&line(end));
    }
    s.report_way(serde_json::json!({
        "way": way.name,
        "steps": times.len(),
        "step_ms": step,
        "computing_ms": computing,
        "communicating_ms": busy,
        "exposed_ms": exposed,
        "collectives": last.log.len(),
    }));
    Ok(())
}

/// The step as `--draw` draws it: its layers and its collectives on one time axis.
pub fn timeline(way: Way, step: &Step) -> workbook_draw::timeline::Way {
    workbook_draw::timeline::Way {
        name: way.name.to_string(),
        step: step.time.as_secs_f64(),
        computing: step.layers.clone(),
        collectives: (step.log.iter())
            .map(|span| workbook_draw::timeline::Bar {
                seq: span.seq,
                issued: span.issued,
                // NCCL's kernels run on the GPU, out of the host's sight: issued to waited.
                ran: span.ran.unwrap_or((span.issued, span.waited)),
            })
            .collect(),
    }
}

/// `--draw FILE.svg`: rank 0's last step of each way, drawn on one time axis.
pub fn draw(s: &Session, path: &std::path::Path, ways: &[workbook_draw::timeline::Way]) -> Result<()> {
    let title = "Rank 0's step, four ways: what computed, what communicated, what was exposed (nccl-workbook --draw)";
    let drawn = match path.extension().is_some_and(|e| e == "html") {
        true => workbook_draw::timeline::html(title, ways),
        false => workbook_draw::timeline::svg(title, ways),
    };
    s.put_picture(path, drawn, &format!("the timelines of {} ways", ways.len()))
}

/// Checks what the step's collectives gave, element by element, on every rank.
pub fn check(s: &mut Session, way: Way, step: Step, model: &Model) -> Result<()> {
    let len = step.results.iter().map(|b| b.len()).sum();
    let mut all = try_vec(len, "the step's results, to check")?;
    for buf in step.results {
        all.extend(s.to_host(&buf)?);
    }
    let all = s.from_host(all)?;
    let expected = way.expected(model, s.world_size(), len)?;
    s.check_each(&all, &expected)
}
