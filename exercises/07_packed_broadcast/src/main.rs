//! Exercise 7 — Many small messages or one large one (EXERCISES.md, chapter 7).
//!
//! Before data-parallel training starts, every rank must hold the same weights: the root
//! (which loaded them) broadcasts its model to the others. A model is a few hundred
//! tensors, most of them small. Broadcast them one by one, and every call pays the
//! collective's fixed cost; pack them into one buffer, and it is paid once.
//!
//! Run it:   `cargo run --release --bin ex07-packed-broadcast -- --nproc-per-node 4 --method each`
//! Check it: `cargo workbook check 7`

use anyhow::Result;
use clap::{Parser, ValueEnum};
use common::collective;
use common::{Buffer, Session};

/// Weight sync: the root's model, broadcast tensor by tensor or packed in one buffer.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    #[command(flatten)]
    run: common::RunArgs,
    /// The rank whose model is sent to everyone.
    #[arg(long, value_name = "R", default_value_t = 0)]
    root: usize,
    /// `each`: one broadcast per tensor; `group`: one broadcast per tensor, all in one group
    /// (NCCL's ncclGroupStart/ncclGroupEnd); `packed`: one broadcast of all tensors packed together.
    #[arg(long, value_enum, default_value_t = Method::Each)]
    method: Method,
    /// The model's layers (each has 12 tensors).
    #[arg(long, value_name = "L", default_value_t = 24, value_parser = clap::value_parser!(u32).range(0..=1000))]
    layers: u32,
    /// The model's width (a layer's largest tensor has 4 × H × H elements).
    #[arg(long, value_name = "H", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=4096))]
    hidden: u32,
    /// How many times the whole model is broadcast to time it.
    #[arg(long, value_name = "N", default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    iters: u32,
}

#[derive(ValueEnum, Clone, Copy)]
enum Method {
    Each,
    Group,
    Packed,
}

/// The tensor sizes of a small GPT-like model: token and position embeddings, then per
/// layer two layer norms (weight and bias), attention (qkv and output projection) and an
/// MLP (two linear layers), each a weight and a bias, then a final layer norm. With 24
/// layers: 2 + 24 × 12 + 2 = 292 tensors.
fn tensor_sizes(layers: usize, h: usize) -> Vec<usize> {
    let mut sizes = vec![1000 * h, 256 * h];
    for _ in 0..layers {
        sizes.extend([h, h, h * 3 * h, 3 * h, h * h, h, h, h, h * 4 * h, 4 * h, 4 * h * h, h]);
    }
    sizes.extend([h, h]);
    sizes
}

/// 7a. One broadcast per tensor, as the weight-sync seed did.
#[allow(unused_variables)] // remove this line when you are done
fn broadcast_each(s: &mut Session, model: &mut [Buffer<f32>], root: usize) -> Result<()> {
    // TODO: broadcast every tensor of `model` from `root`, one call per tensor.
    //       You need: `s.broadcast(buf: &mut Buffer<f32>, root: usize) -> Result<()>`.
    Ok(())
}

/// 7c. One broadcast per tensor, all issued together in one group: written for you, to
/// read (EXERCISES.md 7c). On NCCL, `s.group()` is ncclGroupStart and `g.end()`
/// ncclGroupEnd, and NCCL launches the 292 broadcasts together; on the CPU backend the
/// group packs them into one broadcast itself, and says so.
fn broadcast_group(s: &mut Session, model: &mut [Buffer<f32>], root: usize) -> Result<()> {
    let mut g = s.group()?;
    for tensor in model.iter_mut() {
        g.broadcast(tensor, root)?;
    }
    g.end()
}

/// 7b. Pack every tensor into one buffer, broadcast it once, unpack.
#[allow(unused_variables)] // remove this line when you are done
fn broadcast_packed(s: &mut Session, model: &mut [Buffer<f32>], root: usize) -> Result<()> {
    // TODO: 1. pack: copy the tensors one after the other into one Vec<f32>
    //          (`s.to_host(tensor)?` gives a tensor's elements);
    //       2. make one buffer of it (`s.from_host(flat)?`) and broadcast that, once;
    //       3. unpack: read it back (`s.to_host`) and replace each tensor by its part
    //          (`*tensor = s.from_host(part.to_vec())?`).
    Ok(())
}

fn sync(s: &mut Session, model: &mut [Buffer<f32>], root: usize, method: Method) -> Result<()> {
    match method {
        Method::Each => broadcast_each(s, model, root),
        Method::Group => broadcast_group(s, model, root),
        Method::Packed => broadcast_packed(s, model, root),
    }
}

/// Element 0 of each of the first 8 tensors, for the tables.
fn firsts(s: &mut Session, model: &[Buffer<f32>]) -> Result<Buffer<f32>> {
    let mut v = Vec::new();
    for tensor in model.iter().take(8) {
        v.push(s.to_host(tensor)?[0]);
    }
    s.from_host(v)
}

fn main() -> std::process::ExitCode {
    let args: Args = common::parse_args();
    common::main(&args.run, |s| {
        let root = s.ensure_rank(args.root, "--root")?;
        let sizes = tensor_sizes(args.layers as usize, args.hidden as usize);
        let total: usize = sizes.iter().sum();
        // On the root, every element of tensor k is k + 1; the others start from zeros.
        let is_root = s.rank() == root;
        let value = |k: usize| if is_root { (k + 1) as f32 } else { 0.0 };
        let mut model = Vec::new();
        for (k, len) in sizes.iter().enumerate() {
            model.push(s.from_host(vec![value(k); *len])?);
        }
        s.say(&format!(
            "Model: {} tensors, {total} parameters ({:.1} MiB), from {} to {} elements each",
            sizes.len(),
            (total * 4) as f64 / (1 << 20) as f64,
            sizes.iter().min().unwrap_or(&0),
            sizes.iter().max().unwrap_or(&0)
        ));
        let shown = firsts(s, &model)?;
        s.show("Before broadcast (element 0 of tensors 0 to 7)", &shown)?;

        sync(s, &mut model, root, args.method)?;

        let shown = firsts(s, &model)?;
        s.show("After broadcast (element 0 of tensors 0 to 7)", &shown)?;
        // Every tensor k of every rank must now hold k + 1 everywhere: check them all.
        let mut all = Vec::with_capacity(total);
        for tensor in &model {
            all.extend(s.to_host(tensor)?);
        }
        let all = s.from_host(all)?;
        let expected: Vec<f32> = sizes
            .iter()
            .enumerate()
            .flat_map(|(k, len)| vec![(k + 1) as f32; *len])
            .collect();
        s.check_each(&all, &expected)?;
        s.time_as(&collective::BROADCAST, total * size_of::<f32>(), args.iters, |s| {
            sync(s, &mut model, root, args.method)
        })?;
        Ok(())
    })
}
