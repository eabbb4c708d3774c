//! The command line every example shares: how to launch, which backend, how to print
//! ([`RunArgs`]), and what data to move ([`DataArgs`]).

use clap::{Args, ValueEnum};
use std::time::Duration;
pub use workbook_cpu::transport::TransportChoice;
use workbook_cpu::transport::simulated::Network;
pub use workbook_nccl::device::{BackendChoice, DeviceRule};
use workbook_runtime::launch;
use workbook_runtime::units::{parse_duration, parse_size};

/// How the ranks are started, which backend moves the data, and how results are printed.
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// Which library moves the data: `nccl` (GPUs), `cpu` (shared memory or TCP between processes, no GPU
    /// needed), or `auto` (NCCL when a driver, a GPU and libnccl are there).
    #[arg(long, value_enum, default_value_t = BackendChoice::Auto)]
    pub backend: BackendChoice,

    /// Start this many ranks on this machine (like `torchrun --nproc-per-node`).
    /// Default: 2 on the CPU backend, one per GPU on NCCL.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub nproc_per_node: Option<u32>,

    /// Number of machines, each running this same command with its own --node-rank.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub nnodes: u32,

    /// This machine's index among --nnodes (0 hosts the rendezvous).
    #[arg(long, value_name = "I", default_value_t = 0)]
    pub node_rank: u32,

    /// Run as one rank of a world of this many (with --rank), instead of launching.
    #[arg(long, value_name = "W", requires = "rank", value_parser = clap::value_parser!(u32).range(1..))]
    pub world_size: Option<u32>,

    /// This process's rank, from 0 to W-1 (with --world-size).
    #[arg(long, value_name = "R", requires = "world_size")]
    pub rank: Option<u32>,

    /// Address of the host that runs rank 0 and its rendezvous store.
    #[arg(long, value_name = "HOST")]
    pub master_addr: Option<String>,

    /// Port of the rendezvous store on the master host.
    #[arg(long, value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    pub master_port: Option<u16>,

    /// The job's identity: ranks of another job reaching this one are refused.
    #[arg(long, value_name = "ID", value_parser = parse_job_id)]
    pub job_id: Option<String>,

    /// How long any wait may last before failing with who was missing (e.g. 60, 10s, 500ms, 2m).
    #[arg(long, value_name = "TIME", default_value = "60s", value_parser = parse_duration)]
    pub timeout: Duration,

    /// Which number picks each rank's device among its node's: `rank` (the course's rule,
    /// device = rank % device_count) or `local-rank` (device = local_rank % device_count).
    #[arg(long, value_enum, value_name = "RULE", env = "NCCL_WORKBOOK_DEVICE_RULE",
          default_value_t = DeviceRule::Rank)]
    pub device_rule: DeviceRule,

    /// CPU backend: how each pair of ranks exchanges data. `auto`: shared memory within a
    /// host, TCP between hosts (as NCCL does); `tcp` or `shm` for every pair.
    /// `NCCL_DEBUG=INFO` prints the choice for every pair.
    #[arg(long, value_enum, env = "NCCL_WORKBOOK_TRANSPORT", default_value_t = TransportChoice::Auto)]
    pub transport: TransportChoice,

    /// CPU backend: make every TCP link (between nodes, or all with --transport tcp) take
    /// the time of a simulated network's, LATENCY,BANDWIDTH in bits per second (e.g.
    /// `5us,10Gbps`), so that emulated nodes on one machine show what a cluster's network
    /// does to the algorithms. Shared memory inside a node stays this machine's.
    #[arg(long, value_name = "LATENCY,BANDWIDTH", value_parser = Network::parse)]
    pub link: Option<Network>,

    /// `text` tables for people, or one `json` document on stdout for programs.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,

    /// Colour: `auto` (only on a terminal, and not with NO_COLOR set), `always` or `never`.
    #[arg(long, value_enum, default_value_t = ColorChoice::Auto)]
    pub color: ColorChoice,

    /// Print, in order, the NCCL and CUDA calls the backend makes, with their arguments
    /// (count, type, operator, root, peer, stream), each line starting `rank R │`:
    /// `--show-calls` (or `--show-calls=all`) for every rank, `--show-calls=R` for rank R only.
    #[arg(long, value_name = "RANK", num_args = 0..=1, require_equals = true,
          default_missing_value = "all", value_parser = parse_show_calls)]
    pub show_calls: Option<ShowCalls>,

    /// Run the NCCL backend on N simulated GPUs in host memory (the workbook's NCCL test
    /// double): the same NCCL calls through cudarc, on a machine with no GPU. No figure it
    /// prints says anything about a GPU.
    #[arg(long, value_name = "N", conflicts_with = "backend",
          value_parser = clap::value_parser!(u32).range(1..=64))]
    pub simulate_gpus: Option<u32>,

    /// Print every step of the collective for a small buffer (CPU backend, up to 64
    /// elements): per rank, which chunk went to whom and which came in (and was added).
    /// Only the first, checked run is shown.
    #[arg(long)]
    pub steps: bool,

    /// Draw the collective that ran to FILE.svg (CPU backend, buffers --steps accepts): a
    /// column per step, a lane per rank, each element coloured by whose contributions it
    /// holds, an arrow per message; FILE.html: a page that steps through it. Only the
    /// first, checked run is drawn. Lesson 10 draws its steps' timelines instead.
    #[arg(long, value_name = "FILE.svg|FILE.html")]
    pub draw: Option<std::path::PathBuf>,

    /// Write a timeline of the run to FILE (Chrome trace JSON: open it in
    /// https://ui.perfetto.dev or chrome://tracing): one track per rank.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<std::path::PathBuf>,

    /// NCCL's variables the program changes between its sweeps (the benchmark's `-A`
    /// and `-P`), each with its first sweep's value: on NCCL a rank makes them ready
    /// before NCCL loads ([`workbook_nccl::per_sweep`]). Not a flag.
    #[arg(skip)]
    pub nccl_env_per_sweep: Vec<(&'static str, String)>,
}

impl RunArgs {
    /// The launch flags, as the runtime's [`launch::resolve`] reads them.
    pub fn launch(&self) -> launch::Flags {
        launch::Flags {
            nproc_per_node: self.nproc_per_node,
            nnodes: self.nnodes,
            node_rank: self.node_rank,
            world_size: self.world_size,
            rank: self.rank,
            master_addr: self.master_addr.clone(),
            master_port: self.master_port,
            job_id: self.job_id.clone(),
        }
    }
}

/// Whose calls `--show-calls` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShowCalls {
    /// Every rank's (`--show-calls`, `--show-calls=all`): their lines interleave, each
    /// starting with its rank.
    All,
    /// One rank's (`--show-calls=R`): one rank's calls, in order, to follow alone.
    Rank(usize),
}

impl ShowCalls {
    /// Whether `rank` prints its calls.
    pub fn shows(self, rank: usize) -> bool {
        match self {
            ShowCalls::All => true,
            ShowCalls::Rank(r) => r == rank,
        }
    }

    /// Checks the rank it names against a world of `world` ranks (one line if it is not
    /// a rank: `--show-calls 5 is not a rank: the world has ranks 0 to 1`).
    pub fn check(self, world: usize) -> Result<(), String> {
        match self {
            ShowCalls::All => Ok(()),
            ShowCalls::Rank(r) => workbook_runtime::rank::check(r, world, "--show-calls"),
        }
    }
}

/// `--show-calls`'s value: `all`, or a rank.
fn parse_show_calls(value: &str) -> Result<ShowCalls, String> {
    match value.trim() {
        "all" => Ok(ShowCalls::All),
        v => v.parse().map(ShowCalls::Rank).map_err(|_| {
            format!("`{v}` is neither `all` nor a rank (`--show-calls` for every rank, `--show-calls=1` for rank 1)")
        }),
    }
}

/// A job id: at most 200 bytes of printable text (it travels in every greeting).
fn parse_job_id(id: &str) -> Result<String, String> {
    if id.is_empty() || id.len() > 200 || id.chars().any(char::is_control) {
        return Err(format!(
            "a job id is 1 to 200 printable characters (this one has {} bytes)",
            id.len()
        ));
    }
    Ok(id.to_string())
}

/// What data the collective moves.
#[derive(Args, Debug, Clone)]
pub struct DataArgs {
    /// Number of f32 elements in each rank's buffer.
    #[arg(long, value_name = "N", default_value_t = 4, conflicts_with = "size",
          value_parser = clap::value_parser!(u64).range(1..=(1 << 32)))]
    pub count: u64,

    /// Buffer size in bytes instead of --count: 4, 64K, 100M, 1G (binary: K = 1024).
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    pub size: Option<u64>,

    /// The value the buffers start from (the example says its default).
    #[arg(long, value_name = "V", allow_negative_numbers = true)]
    pub value: Option<f32>,

    /// `ones`: buffers start from --value; `rank`: rank r starts with r+1 (so the result
    /// shows who contributed).
    #[arg(long, value_enum, default_value_t = Init::Ones)]
    pub init: Init,

    /// How many elements of each buffer the tables show (default: up to 8).
    #[arg(long, value_name = "K")]
    pub show: Option<usize>,

    /// How many times the collective is repeated to time it.
    #[arg(long, value_name = "N", default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub iters: u32,
}

impl DataArgs {
    /// The flag that set the buffers' size, as the user gave it (for messages).
    pub fn what(&self) -> String {
        match self.size {
            Some(bytes) => format!("--size {}", workbook_runtime::units::typed_size(bytes)),
            None => format!("--count {}", self.count),
        }
    }

    /// Elements per buffer, from --count or --size.
    pub fn count(&self) -> usize {
        match self.size {
            Some(bytes) => (bytes / 4).max(1) as usize,
            None => self.count as usize,
        }
    }
}

/// How buffers start.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Init {
    /// Every rank starts from the same value (--value).
    Ones,
    /// Rank r starts with r+1.
    Rank,
}

/// Output format.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Tables for people.
    Text,
    /// One JSON document on stdout.
    Json,
}

/// When to colour the output.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ColorChoice {
    /// Only on a terminal, and not with NO_COLOR set.
    Auto,
    /// Always.
    Always,
    /// Never.
    Never,
}
