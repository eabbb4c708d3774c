//! The command line: every flag, with its default.

use std::path::PathBuf;

/// What the command line asked for.
#[derive(Clone, Debug)]
pub struct Args {
    /// `--op`: the operation(s), comma-separated.
    pub op: String,
    /// `--rank`: this process's rank.
    pub rank: usize,
    /// `--world`: the number of ranks.
    pub world: usize,
    /// `--id-file`: where rank 0 leaves the unique id for the others.
    pub id_file: Option<PathBuf>,
    /// `--id-timeout`: how long (s) the other ranks wait for the id file.
    pub id_timeout: u64,
    /// `--device`: the device to use (default: the rank's, modulo the count).
    pub device: Option<usize>,
    /// The element count being run (one of `counts`).
    pub count: usize,
    /// Every count of `--count` (`count` is the one being run).
    pub counts: Vec<usize>,
    /// `--dtype`: the element type(s), comma-separated.
    pub dtype: String,
    /// `--reduce`: the reduction(s), comma-separated.
    pub reduce: String,
    /// `--root`: the one root of the rooted ops (default: every rank in turn).
    pub root: Option<usize>,
    /// `--repeat`: how many times the whole list of runs is done.
    pub repeat: usize,
    /// `--threads`: all ranks in this process, one thread each.
    pub threads: bool,
    /// `raw` (cudarc's raw API, polling) or `safe` (cudarc's `Comm`).
    pub api: String,
    /// `--nonblocking`: a non-blocking communicator (`blocking = 0`), polled.
    pub nonblocking: bool,
    /// Sleep before joining (holds a rank back).
    pub delay_ms: u64,
    /// Sleep before the first collective.
    pub op_delay_ms: u64,
    /// How long `watch` watches the stream.
    pub watch_ms: u64,
    /// How long `init-abort` waits before aborting.
    pub abort_after_ms: u64,
    /// Written once the communicator is made (for `--break hang`).
    pub ready_file: Option<PathBuf>,
    /// `--break`: the rule this rank breaks on purpose.
    pub brk: Option<String>,
    /// `--color`: this rank's color in `split` (-1 is `NCCL_SPLIT_NOCOLOR`).
    pub color: i32,
    /// `--key`: this rank's key in `split` (default: its rank).
    pub key: Option<i32>,
    /// `--split-config`: the config `split` passes: `null`, `blocking`, `nonblocking`,
    /// `unset` (`blocking` left to NCCL), `no-magic` (not made by the initializer).
    pub split_config: String,
    /// `--first`: what `split` does on the parent before splitting (`allreduce`).
    pub first: Option<String>,
}

/// The command line, or what is wrong with it (one line: a usage error).
pub fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        op: "allreduce".into(),
        rank: 0,
        world: 1,
        id_file: None,
        id_timeout: 20,
        device: None,
        count: 4,
        counts: vec![4],
        dtype: "f32".into(),
        reduce: "sum".into(),
        root: None,
        repeat: 1,
        threads: false,
        api: "raw".into(),
        nonblocking: false,
        delay_ms: 0,
        op_delay_ms: 0,
        watch_ms: 1500,
        abort_after_ms: 500,
        ready_file: None,
        brk: None,
        color: 0,
        key: None,
        split_config: "null".into(),
        first: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--threads" => {
                a.threads = true;
                continue;
            }
            "--nonblocking" => {
                a.nonblocking = true;
                continue;
            }
            _ => {}
        }
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let num = |v: &str| v.parse::<usize>().map_err(|_| format!("{flag} {v}: not a number"));
        let int = |v: &str| v.parse::<i32>().map_err(|_| format!("{flag} {v}: not a number"));
        match flag.as_str() {
            "--op" => a.op = value,
            "--rank" => a.rank = num(&value)?,
            "--world" => a.world = num(&value)?,
            "--id-file" => a.id_file = Some(value.into()),
            "--id-timeout" => a.id_timeout = num(&value)? as u64,
            "--device" => a.device = Some(num(&value)?),
            "--count" => {
                a.counts = value.split(',').map(num).collect::<Result<_, _>>()?;
                a.count = a.counts[0];
            }
            "--dtype" => a.dtype = value,
            "--reduce" => a.reduce = value,
            "--root" => a.root = Some(num(&value)?),
            "--repeat" => a.repeat = num(&value)?,
            "--api" if value == "raw" || value == "safe" => a.api = value,
            "--delay-ms" => a.delay_ms = num(&value)? as u64,
            "--op-delay-ms" => a.op_delay_ms = num(&value)? as u64,
            "--watch-ms" => a.watch_ms = num(&value)? as u64,
            "--abort-after-ms" => a.abort_after_ms = num(&value)? as u64,
            "--ready-file" => a.ready_file = Some(value.into()),
            "--break" => a.brk = Some(value),
            "--color" => a.color = int(&value)?,
            "--key" => a.key = Some(int(&value)?),
            "--split-config" => a.split_config = value,
            "--first" => a.first = Some(value),
            _ => return Err(format!("unknown flag {flag} (or value {value})")),
        }
    }
    Ok(a)
}
