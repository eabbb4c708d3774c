//! The benchmark's command line: nccl-tests' flags (`-b -e -f -i -n -w -c -r -d -o -a -C`,
//! with their long names), and this workbook's own (`--coll`, `-A`, `-P`, `--fit`, the
//! plot's, `-J`), read into [`PerfArgs`]. Apart from the sweep that runs them, so that
//! what a flag accepts, and how a bad value is refused, is read in one place.

use crate::{nccl_tests_json, plot};
use clap::Args;
use clap::builder::TypedValueParser;
use common::collective::{self, Collective};
use workbook_runtime::element::{DataType, ReduceOp};
use workbook_runtime::units::parse_size;

/// The sweep, with nccl-tests' flags (`-b 4 -e 100M -f 2`) and their long names.
#[derive(Args, Debug, Clone)]
pub struct PerfArgs {
    /// The collective(s) to measure, by nccl-tests' names: all_reduce, broadcast, reduce,
    /// all_gather, reduce_scatter, alltoall (or with '-'), or `all` for every one in turn
    /// (nccl-tests has one program per collective: `all_reduce_perf`...).
    #[arg(long = "coll", value_name = "NAME", default_value = "all_reduce", value_parser = parse_collectives)]
    pub coll: Collectives,
    /// The reduction operator(s) (reduce, all_reduce, reduce_scatter): sum, prod, max,
    /// min, avg, or `all` for every one in turn (nccl-tests' `-o, --op`).
    #[arg(short = 'o', long = "op", alias = "redop", value_name = "OP", default_value = "sum", value_parser = parse_ops)]
    pub redop: Choice<ReduceOp>,
    /// Smallest size in bytes (K, M, G are 1024-based, as in nccl-tests).
    #[arg(short = 'b', long = "minbytes", value_name = "BYTES", default_value = "32M", value_parser = parse_size)]
    pub min_bytes: u64,
    /// Largest size in bytes.
    #[arg(short = 'e', long = "maxbytes", value_name = "BYTES", default_value = "32M", value_parser = parse_size)]
    pub max_bytes: u64,
    /// Multiply the size by this factor at each step.
    #[arg(short = 'f', long = "stepfactor", value_name = "F", conflicts_with = "step_bytes",
          value_parser = clap::value_parser!(u64).range(2..))]
    pub step_factor: Option<u64>,
    /// Add this many bytes at each step (the default: 1M, as in nccl-tests).
    #[arg(short = 'i', long = "stepbytes", value_name = "BYTES", value_parser = parse_size)]
    pub step_bytes: Option<u64>,
    /// Timed iterations per size.
    #[arg(short = 'n', long = "iters", value_name = "N", default_value_t = 20,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub iters: u32,
    /// Untimed iterations first, per size.
    #[arg(short = 'w', long = "warmup_iters", value_name = "N", default_value_t = 5,
          value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    pub warmup: u32,
    /// Checked iterations per size (0: no check, #wrong shows N/A).
    #[arg(short = 'c', long = "check", value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(0..=1000))]
    pub check: u32,
    /// The root of broadcast and reduce.
    #[arg(short = 'r', long = "root", value_name = "R")]
    pub root: Option<usize>,
    /// Element type(s): float, double, int32, half, bfloat16, or `all` (nccl-tests' `-d`).
    #[arg(short = 'd', long = "datatype", value_name = "TYPE", default_value = "float", value_parser = parse_types)]
    pub datatype: Choice<DataType>,
    /// How each rank's time is combined: 0 = rank 0's, 1 = mean, 2 = min, 3 = max.
    #[arg(short = 'a', long = "average", value_name = "0-3", default_value_t = 1,
          value_parser = clap::value_parser!(u8).range(0..=3))]
    pub average: u8,
    /// 1: the time column is the host's time to issue the calls, not the time until they
    /// finished (nccl-tests' `-C`, cputime): what each call costs the CPU (NCCL's launch,
    /// and this harness's share).
    #[arg(short = 'C', long = "report_cputime", value_name = "0|1", default_value_t = 0,
          value_parser = clap::value_parser!(u8).range(0..=1))]
    pub cputime: u8,
    /// Run every sweep once per algorithm, as `NCCL_ALGO` set to each would (`-A
    /// ring,tree`: the ring, then the tree), to set them side by side. On NCCL, which
    /// reads `NCCL_ALGO` when a communicator starts, each value gets a communicator
    /// started under it.
    #[arg(short = 'A', long = "algos", value_name = "ALGO,...", value_delimiter = ',')]
    pub algos: Vec<String>,
    /// Run every sweep once per protocol, as `NCCL_PROTO` set to each would (`-P
    /// ll,ll128,simple`: NCCL's LL, then LL128, then Simple), to set them side by side
    /// (with `-A`, every protocol for each algorithm). On the CPU backend shared memory
    /// only (TCP has Simple alone); on NCCL, a communicator started under each value.
    #[arg(short = 'P', long = "protos", value_name = "PROTO,...", value_delimiter = ',')]
    pub protos: Vec<String>,
    /// Fit time ≈ α + size/β to each sweep's out-of-place times and print it under the
    /// sweep (with `-A`, where the algorithms' fits cross): a line per algorithm the tuner
    /// chose and, on the CPU backend, per side of a rank's share of its core's own cache
    /// and of the last-level cache, each fitted to the sizes' median calls.
    #[arg(long)]
    pub fit: bool,
    /// The picture: `--plot`, `--plot-with`, `--no-run`.
    #[command(flatten)]
    pub plot: plot::PlotArgs,
    /// Write the result to FILE in nccl-tests' own JSON (its `-J`: same names and layout,
    /// so nccl-tests' scripts read it), written by rank 0 after the table.
    #[arg(short = 'J', long = "output_file", value_name = "FILE",
          value_parser = clap::builder::OsStringValueParser::new().try_map(nccl_tests_json::parse_output))]
    pub output_file: Option<std::path::PathBuf>,
}

/// One value of a flag, or every one (`all`): what a sweep goes through, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice<T>(pub Vec<T>);

impl<T> std::ops::Deref for Choice<T> {
    type Target = Vec<T>;
    fn deref(&self) -> &Vec<T> {
        &self.0
    }
}

/// The collectives a sweep measures, in order.
pub type Collectives = Choice<&'static Collective>;

/// `all_gather`, `all-gather` or `all`.
fn parse_collectives(name: &str) -> Result<Collectives, String> {
    let wanted = name.replace('-', "_").to_lowercase();
    if wanted == "all" {
        return Ok(Choice(collective::ALL.to_vec()));
    }
    collective::ALL
        .iter()
        .find(|c| c.name() == wanted || c.title().replace('-', "_") == wanted)
        .map(|c| Choice(vec![*c]))
        .ok_or_else(|| {
            let names: Vec<&str> = collective::ALL.iter().map(|c| c.name()).collect();
            format!("unknown collective '{name}': one of {}, or all", names.join(", "))
        })
}

/// One of clap's value names, or `all` for every value.
fn parse_all<V: clap::ValueEnum + Clone>(s: &str, what: &str) -> Result<Choice<V>, String> {
    if s.eq_ignore_ascii_case("all") {
        return Ok(Choice(V::value_variants().to_vec()));
    }
    V::from_str(s, true).map(|v| Choice(vec![v])).map_err(|_| {
        let names: Vec<String> = V::value_variants()
            .iter()
            .filter_map(|v| v.to_possible_value().map(|p| p.get_name().to_string()))
            .collect();
        format!("unknown {what} '{s}': one of {}, or all", names.join(", "))
    })
}

/// An operator; a collective's name gets a hint, since `--op` named the collective before
/// it named the operator as nccl-tests' `-o, --op` does.
fn parse_ops(s: &str) -> Result<Choice<ReduceOp>, String> {
    parse_all(s, "operator").map_err(|e| match parse_collectives(s) {
        Ok(_) => format!("'{s}' is a collective: --op is the reduction operator, as in nccl-tests; name the collective with --coll {s}"),
        Err(_) => e,
    })
}

fn parse_types(s: &str) -> Result<Choice<DataType>, String> {
    parse_all(s, "type")
}

/// Where `--plot`'s own sweep starts, and its step: from 8 B to `-e` (32 MiB by default),
/// times 4 (12 sizes): a curve from the latency-bound to the bandwidth-bound end, in
/// seconds on a laptop.
pub(crate) const PLOT_MIN_BYTES: u64 = 8;
pub(crate) const PLOT_FACTOR: u64 = 4;

impl PerfArgs {
    /// The sizes this sweep goes through, in bytes.
    pub(crate) fn sizes(&self) -> Vec<u64> {
        crate::sweep::sizes(self.min_bytes, self.max_bytes, self.step_factor, self.step_bytes)
    }
}

/// `--plot` where the sweep is one size (`-b` and `-e` the same, as by default, with no
/// step): the sweep the picture needs, [`PLOT_MIN_BYTES`] to `-e` times [`PLOT_FACTOR`];
/// `None` where the user asked for a sweep.
pub(crate) fn plot_sweep(args: &PerfArgs) -> Option<PerfArgs> {
    let one_size = args.min_bytes == args.max_bytes && args.step_factor.is_none() && args.step_bytes.is_none();
    if args.plot.plot.is_none() || !one_size || args.max_bytes <= PLOT_MIN_BYTES {
        return None;
    }
    Some(PerfArgs {
        min_bytes: PLOT_MIN_BYTES,
        step_factor: Some(PLOT_FACTOR),
        ..args.clone()
    })
}
impl PerfArgs {
    /// The variables `-A` and `-P` change between sweeps, each with its first sweep's
    /// value: on NCCL a rank makes them ready before NCCL loads
    /// ([`common::RunArgs::nccl_env_per_sweep`]).
    pub fn nccl_env_per_sweep(&self) -> Vec<(&'static str, String)> {
        let first = |values: &[String]| values.first().cloned();
        [("NCCL_ALGO", first(&self.algos)), ("NCCL_PROTO", first(&self.protos))]
            .into_iter()
            .filter_map(|(name, value)| Some((name, value?)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collectives_operators_and_types_parse_by_nccl_tests_names_or_all() {
        assert_eq!(parse_collectives("all_gather").unwrap()[0].name(), "all_gather");
        assert_eq!(parse_collectives("all-reduce").unwrap()[0].name(), "all_reduce");
        assert_eq!(parse_collectives("alltoall").unwrap()[0].name(), "alltoall");
        assert_eq!(parse_collectives("all").unwrap().len(), collective::ALL.len());
        assert!(
            parse_collectives("gather")
                .unwrap_err()
                .contains("one of broadcast, reduce")
        );
        assert_eq!(parse_ops("all").unwrap().len(), 5);
        assert_eq!(parse_types("bfloat16").unwrap().0, vec![DataType::Bfloat16]);
        assert!(parse_types("fp8").unwrap_err().contains("unknown type 'fp8'"));
    }
}
