//! The command line every example shares: how to launch, which backend, how to print
//! ([`RunArgs`]), and what data to move ([`DataArgs`]).

pub use crate::transport::TransportChoice;
use clap::{Args, ValueEnum};
use std::time::Duration;

/// How the ranks are started, which backend moves the data, and how results are printed.
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// Which library moves the data: `nccl` (GPUs), `cpu` (TCP between processes, no GPU
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
    #[arg(long, value_name = "ID")]
    pub job_id: Option<String>,

    /// How long any wait may last before failing with who was missing (e.g. 60, 10s, 500ms, 2m).
    #[arg(long, value_name = "TIME", default_value = "60s", value_parser = parse_duration)]
    pub timeout: Duration,

    /// CPU backend: how each pair of ranks exchanges data. `auto`: shared memory within a
    /// host, TCP between hosts (as NCCL does); `tcp` or `shm` for every pair.
    /// `NCCL_DEBUG=INFO` prints the choice for every pair.
    #[arg(long, value_enum, env = "NCCL_WORKBOOK_TRANSPORT", default_value_t = TransportChoice::Auto)]
    pub transport: TransportChoice,

    /// `text` tables for people, or one `json` document on stdout for programs.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,

    /// Colour: `auto` (only on a terminal, and not with NO_COLOR set), `always` or `never`.
    #[arg(long, value_enum, default_value_t = ColorChoice::Auto)]
    pub color: ColorChoice,
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
    /// Elements per buffer, from --count or --size.
    pub fn count(&self) -> usize {
        match self.size {
            Some(bytes) => (bytes / 4).max(1) as usize,
            None => self.count as usize,
        }
    }
}

/// Which backend to use.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendChoice {
    /// NCCL when it can run here, else the CPU backend (and say why).
    Auto,
    /// Ring algorithms between processes (shared memory, TCP): runs anywhere.
    Cpu,
    /// NVIDIA's NCCL on GPUs, through cudarc.
    Nccl,
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

/// Parses a byte size with an optional binary suffix, as nccl-tests does: `4`, `64K`,
/// `100M`, `1G` (also `100MiB`, `100MB`: 1024-based all the same).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("'{text}' is not a size (try 4, 64K, 100M or 1G)"))?;
    let shift = match unit.to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        _ => return Err(format!("'{text}' has an unknown unit '{unit}' (use K, M or G)")),
    };
    let bytes = n
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("'{text}' is too large"))?;
    if bytes == 0 {
        return Err("a size of 0 bytes moves nothing: give at least 4".into());
    }
    if bytes > 16 << 30 {
        return Err(format!("'{text}' is over the 16G this workbook allows per buffer"));
    }
    Ok(bytes)
}

/// Parses a duration: seconds by default, or with `ms`, `s`, `m`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("'{text}' is not a duration (try 60, 10s, 500ms or 2m)"))?;
    let secs = match unit {
        "" | "s" => n,
        "ms" => n / 1000.0,
        "m" | "min" => n * 60.0,
        _ => return Err(format!("'{text}' has an unknown unit '{unit}' (use ms, s or m)")),
    };
    if !(secs > 0.0 && secs <= 86_400.0) {
        return Err(format!("'{text}' is out of range (more than 0, at most a day)"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_binary_like_nccl_tests() {
        assert_eq!(parse_size("4"), Ok(4));
        assert_eq!(parse_size("64K"), Ok(65536));
        assert_eq!(parse_size("100M"), Ok(100 << 20));
        assert_eq!(parse_size("100MiB"), Ok(100 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        for bad in [
            "",
            "M",
            "12X",
            "-4",
            "1.5M",
            "0",
            "99999999999999999999",
            "17G",
            "4 K K",
        ] {
            assert!(parse_size(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn sizes_round_trip_and_garbage_never_panics() {
        let mut rng = testkit::Xorshift(0x853c_49e6_748f_ea9b);
        let mut next = |n| rng.below(n);
        for _ in 0..5000 {
            let (n, unit) = (1 + next(1 << 20), ["", "K", "M", "G", "KiB", "mb"][next(6) as usize]);
            let shift = match unit.to_ascii_uppercase().chars().next() {
                Some('K') => 10,
                Some('M') => 20,
                Some('G') => 30,
                _ => 0,
            };
            let want = n.checked_mul(1 << shift).filter(|b| *b <= 16 << 30);
            assert_eq!(parse_size(&format!("{n}{unit}")).ok(), want, "{n}{unit}");
            let junk: String = (0..next(10))
                .map(|_| "0123456789KMGiBb -+.xé".chars().nth(next(22) as usize).unwrap())
                .collect();
            let _ = (parse_size(&junk), parse_duration(&junk));
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("60"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        for bad in ["", "0", "-1", "5h", "x"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} parsed");
        }
    }
}
