//! NCCL's own account of what it chose, read back: which algorithm and protocol ran each
//! collective, and its cost model (the TUNING table), so that the lessons' `Time:` lines
//! and the benchmark's `algo proto` column name what NCCL ran, not "NCCL's choice".
//!
//! NCCL says both only in its debug output (`NCCL_DEBUG=INFO`, subsystem `TUNING`), and
//! only on a communicator's rank 0, which is where the workbook prints:
//! - at each communicator's init (2 ranks or more), `src/graph/tuning.cc` prints the
//!   table: per collective, algorithm and protocol, `latency/bandwidth` (µs, GB/s), from
//!   which `ncclTopoGetAlgoTime` predicts `time = latency + bytes / (1000 · bandwidth)`;
//! - per collective (2.24 and later, `src/enqueue.cc`):
//!   `AllReduce: 16777216 Bytes -> Algo RING proto SIMPLE channel{Lo..Hi}={0..1}`; 2.21 to
//!   2.23 print `16777216 Bytes -> Algo 1 proto 2 time 92.4` (numbers, no collective);
//!   2.18 to 2.20 print none (the column then stays "NCCL's choice").
//!
//! When the user has not set `NCCL_DEBUG` (then the output is theirs), a rank asks NCCL
//! for these lines into a memory file of its own ([`capture`]: `memfd_create`, named to
//! NCCL as `/proc/self/fd/N`): nothing on the terminal, nothing on disk, gone with the
//! process. Rank 0 pays for one formatted line per call (about a microsecond).
//!
//! A line is in the file when the NCCL call that printed it has returned, so reading needs
//! no flush: `src/debug.cc` opens the file unbuffered up to 2.26 (`setbuf(file, nullptr)`)
//! and line-buffered from 2.27 (`setlinebuf`), and writes each line whole (`fwrite`, from
//! 2.29 `vfprintf`, of a format ending in `\n`).

use std::collections::VecDeque;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::FileExt;
use std::sync::Mutex;

/// The workbook's names for NCCL's algorithms, in NCCL's order ([`crate::tuning::ALGOS`],
/// its numbers: `ncclAlgoStr`, 2.18 to 2.30).
const ALGO_NAMES: [&str; 7] = [
    "tree",
    "ring",
    "collnet-direct",
    "collnet-chain",
    "nvls",
    "nvls-tree",
    "pat",
];
/// The workbook's names for NCCL's protocols, in NCCL's order ([`crate::tuning::PROTOS`]).
const PROTO_NAMES: [&str; 3] = ["ll", "ll128", "simple"];
/// How many of rank 0's last per-call lines are kept to look a call up in.
const KEPT: usize = 256;

/// One cell of NCCL's TUNING table.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Cost {
    /// The collective, as NCCL names it (`AllReduce`).
    pub function: String,
    /// The algorithm (`ring`, `tree`, ... as [`ALGO_NAMES`] names them).
    pub algo: &'static str,
    /// The protocol (`ll`, `ll128`, `simple`).
    pub proto: &'static str,
    /// NCCL's latency for one call, µs.
    pub latency_us: f64,
    /// NCCL's bandwidth, GB/s: a call of `b` bytes takes `latency + b / (1000 · bw)` µs.
    pub bandwidth_gbs: f64,
}

/// What NCCL chose for one call, from its per-call line.
#[derive(Clone, Debug, PartialEq)]
pub struct Choice {
    /// The collective (`AllReduce`), or `None` where NCCL's line does not say (2.21–2.23).
    pub function: Option<String>,
    /// Bytes, as NCCL counts them: `count` × the type's size (an all-gather's per-rank count).
    pub bytes: u64,
    /// The algorithm NCCL chose (`Ring`, `Tree`, …), as its line names it.
    pub algo: &'static str,
    /// The protocol NCCL chose (`LL`, `LL128`, `Simple`).
    pub proto: &'static str,
}

/// The memory file NCCL writes into, and what has been read of it.
struct Log {
    file: File,
    read: u64,
    partial: Vec<u8>,
    /// The last table NCCL printed (a new communicator's replaces the old).
    table: Vec<Cost>,
    building: Option<Building>,
    choices: VecDeque<Choice>,
}

/// A table being read: the algorithms and protocols of the block's columns.
#[derive(Default)]
struct Building {
    table: Vec<Cost>,
    columns: Vec<(&'static str, &'static str)>,
    algos: Vec<Option<&'static str>>,
}

static LOG: Mutex<Option<Log>> = Mutex::new(None);

/// Asks this process's NCCL for its TUNING lines into a memory file, where `NCCL_DEBUG`
/// is not set (then NCCL's output is the user's, untouched). Call it before NCCL loads,
/// in a rank's process; it does nothing unless the process has one thread, since
/// changing the environment is sound only then.
pub fn capture() {
    if std::env::var_os("NCCL_DEBUG").is_some() || threads() != Some(1) {
        return;
    }
    // SAFETY: a plain system call with a NUL-terminated name; the descriptor it returns is
    // this process's alone (close-on-exec: a child asks for its own).
    let fd = unsafe { libc::memfd_create(c"nccl-workbook-nccl-log".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return;
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    let file = unsafe { File::from_raw_fd(fd) };
    for (name, value) in [
        (workbook_runtime::NCCL_DEBUG_IS_OURS, "1".to_string()),
        ("NCCL_DEBUG", "INFO".to_string()),
        ("NCCL_DEBUG_SUBSYS", "TUNING".to_string()),
        ("NCCL_DEBUG_FILE", format!("/proc/self/fd/{}", file.as_raw_fd())),
    ] {
        // SAFETY: the process has one thread (counted above, and nothing here starts
        // one), so nothing reads or writes the environment at the same time.
        unsafe { std::env::set_var(name, value) };
    }
    *lock() = Some(Log {
        file,
        read: 0,
        partial: Vec::new(),
        table: Vec::new(),
        building: None,
        choices: VecDeque::new(),
    });
}

/// Whether the variable `name` is one [`capture`] set in this process (so not the
/// user's: a report of the user's environment leaves it out).
pub fn set_here(name: &str) -> bool {
    let set = [
        workbook_runtime::NCCL_DEBUG_IS_OURS,
        "NCCL_DEBUG",
        "NCCL_DEBUG_SUBSYS",
        "NCCL_DEBUG_FILE",
    ];
    set.contains(&name) && captured()
}

/// Whether [`capture`] took NCCL's lines in this process.
pub fn captured() -> bool {
    lock().is_some()
}

/// Reads what NCCL wrote since last time, and frees it (the file keeps only what is
/// unread): call it now and then, so that a long run's lines never pile up.
pub fn update() {
    if let Some(log) = lock().as_mut() {
        log.update();
    }
}

/// What NCCL chose for the last call of `function` (`AllReduce`) on `bytes` it printed,
/// if this rank has NCCL's lines. Up to 2.23 NCCL counted an all-gather's or a
/// reduce-scatter's bytes over the whole buffer (`bytes` × `ranks`), from 2.24 per rank.
pub fn choice(function: &str, bytes: u64, ranks: usize) -> Option<Choice> {
    let mut guard = lock();
    let log = guard.as_mut()?;
    log.update();
    let whole = matches!(function, "AllGather" | "ReduceScatter").then_some(bytes * ranks as u64);
    log.choices
        .iter()
        .rev()
        .find(|c| {
            let named = c.function.as_deref().is_none_or(|f| f == function);
            named && (c.bytes == bytes || Some(c.bytes) == whole)
        })
        .cloned()
}

/// NCCL's cost model for `function` (`AllReduce`): the cells of its last TUNING table
/// that can run (bandwidth above 0); empty where this rank has no table.
pub fn costs(function: &str) -> Vec<Cost> {
    let mut guard = lock();
    let Some(log) = guard.as_mut() else {
        return Vec::new();
    };
    log.update();
    log.table
        .iter()
        .filter(|c| c.function == function && c.bandwidth_gbs > 0.0)
        .cloned()
        .collect()
}

fn lock() -> std::sync::MutexGuard<'static, Option<Log>> {
    LOG.lock().unwrap_or_else(|p| p.into_inner())
}

/// This process's threads, from `/proc/self/task`.
pub(crate) fn threads() -> Option<usize> {
    std::fs::read_dir("/proc/self/task").ok().map(|d| d.count())
}

impl Log {
    fn update(&mut self) {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match self.file.read_at(&mut buf, self.read) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            self.read += n as u64;
            self.partial.extend_from_slice(&buf[..n]);
            while let Some(end) = self.partial.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.partial.drain(..=end).collect();
                self.line(&String::from_utf8_lossy(&line[..end]));
            }
        }
        // Free what was read: whole pages before the read mark (a hole reads as zeros).
        let done = self.read & !4095;
        if done > 0 {
            // SAFETY: a system call on a descriptor this process owns; punching a hole in
            // a memory file only frees its pages.
            unsafe {
                libc::fallocate(
                    self.file.as_raw_fd(),
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    0,
                    done as libc::off_t,
                );
            }
        }
    }

    /// One of NCCL's lines, its `host:pid:tid [dev] NCCL INFO ` prefix included.
    fn line(&mut self, line: &str) {
        let Some((_, text)) = line.split_once(" NCCL INFO ") else {
            return;
        };
        if let Some(choice) = parse_choice(text) {
            if self.choices.len() == KEPT {
                self.choices.pop_front();
            }
            self.choices.push_back(choice);
            return;
        }
        match table_line(text) {
            TableLine::Algorithms(algos) => {
                // A table starts with its first block (Tree first): the last table wins.
                let first = algos.first().copied().flatten() == Some("tree");
                let mut b = match self.building.take() {
                    Some(b) if !first => b,
                    _ => Building::default(),
                };
                b.algos = algos;
                b.columns.clear();
                self.building = Some(b);
            }
            TableLine::Protocols(protos) => {
                if let Some(b) = self.building.as_mut() {
                    b.columns = protos
                        .iter()
                        .enumerate()
                        .filter_map(|(i, p)| Some((b.algos.get(i / 3).copied().flatten()?, (*p)?)))
                        .collect();
                }
            }
            TableLine::Costs(function, cells) => {
                if let Some(b) = self.building.as_mut() {
                    for (&(algo, proto), &(latency_us, bandwidth_gbs)) in b.columns.iter().zip(&cells) {
                        b.table.push(Cost {
                            function: function.clone(),
                            algo,
                            proto,
                            latency_us,
                            bandwidth_gbs,
                        });
                    }
                    // A block's last row: the table so far is the newest.
                    if function == "AllReduce" {
                        self.table = b.table.clone();
                    }
                }
            }
            TableLine::Other => {}
        }
    }
}

/// The kinds of line of NCCL's TUNING table.
#[derive(Debug, PartialEq)]
enum TableLine {
    /// `  Algorithm   |     Tree     |     Ring     | ...`: a block's algorithms.
    Algorithms(Vec<Option<&'static str>>),
    /// `  Protocol    |  LL |  LL128 |  Simple | ...`: its columns' protocols.
    Protocols(Vec<Option<&'static str>>),
    /// `    AllReduce |    26.8/   0.1 | ...`: a collective's latency/bandwidth cells.
    Costs(String, Vec<(f64, f64)>),
    Other,
}

fn table_line(text: &str) -> TableLine {
    let mut cells = text.split('|');
    let head = cells.next().unwrap_or("").trim();
    let rest: Vec<&str> = cells.map(str::trim).collect();
    match head {
        "Algorithm" => TableLine::Algorithms(rest.iter().filter(|c| !c.is_empty()).map(|c| algo_name(c)).collect()),
        "Protocol" => TableLine::Protocols(rest.iter().filter(|c| !c.is_empty()).map(|c| proto_name(c)).collect()),
        "Broadcast" | "Reduce" | "AllGather" | "ReduceScatter" | "AllReduce" => {
            let costs: Option<Vec<(f64, f64)>> = rest
                .iter()
                .filter(|c| !c.is_empty())
                .map(|c| {
                    let (l, b) = c.split_once('/')?;
                    Some((l.trim().parse().ok()?, b.trim().parse().ok()?))
                })
                .collect();
            costs.map_or(TableLine::Other, |c| TableLine::Costs(head.to_string(), c))
        }
        _ => TableLine::Other,
    }
}

/// A per-call line: `AllReduce: 16777216 Bytes -> Algo RING proto SIMPLE channel...`
/// (2.24+) or `16777216 Bytes -> Algo 1 proto 2 time 92.400000` (2.21–2.23).
fn parse_choice(text: &str) -> Option<Choice> {
    let (function, rest) = match text.split_once(": ") {
        Some((f, r)) if !f.contains(' ') => (Some(f.to_string()), r),
        _ => (None, text),
    };
    let mut w = rest.split_whitespace();
    let bytes = w.next()?.parse().ok()?;
    let ["Bytes", "->", "Algo"] = [w.next()?, w.next()?, w.next()?] else {
        return None;
    };
    let algo = w.next()?;
    if w.next()? != "proto" {
        return None;
    }
    let proto = w.next()?;
    let by_number = |s: &str, names: &[&'static str]| s.parse::<usize>().ok().and_then(|i| names.get(i).copied());
    let algo = by_number(algo, &ALGO_NAMES).or_else(|| algo_name(algo))?;
    let proto = by_number(proto, &PROTO_NAMES).or_else(|| proto_name(proto))?;
    Some(Choice {
        function,
        bytes,
        algo,
        proto,
    })
}

/// An algorithm as NCCL writes it (`Ring`, `RING`, `NVLS_TREE`, `CollNetDirect`).
fn algo_name(text: &str) -> Option<&'static str> {
    let key = text.replace('_', "");
    let i = crate::tuning::ALGOS.iter().position(|n| n.eq_ignore_ascii_case(&key))?;
    Some(ALGO_NAMES[i])
}

/// A protocol as NCCL writes it (`Simple`, `SIMPLE`, `LL128`).
fn proto_name(text: &str) -> Option<&'static str> {
    let i = crate::tuning::PROTOS
        .iter()
        .position(|n| n.eq_ignore_ascii_case(text))?;
    Some(PROTO_NAMES[i])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines of NCCL 2.28.3 on 4 nodes of one H100 each (docs/gpu-runs/gpu-nodes-2026-11-26-run8-h100.md).
    const H100: &str = "\
vm:8612:8630 [0] NCCL INFO   Algorithm   |                            Tree                  |                            Ring                  |                   CollNetDirect                  |
vm:8612:8630 [0] NCCL INFO   Protocol    |             LL |          LL128 |         Simple |             LL |          LL128 |         Simple |             LL |          LL128 |         Simple |
vm:8612:8630 [0] NCCL INFO  Max NThreads |            512 |            640 |            512 |            512 |            640 |            256 |              0 |              0 |            640 |
vm:8612:8630 [0] NCCL INFO     Broadcast |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |     9.3/   0.6 |    18.0/   0.0 |    22.4/   1.2 |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |
vm:8612:8630 [0] NCCL INFO     AllReduce |    26.8/   0.1 |    48.0/   0.0 |    64.4/   0.5 |    36.6/   0.4 |    65.0/   0.0 |    92.4/   0.8 |     5.0/   0.0 |     8.5/   0.0 |    14.0/   0.0 |
vm:8612:8630 [0] NCCL INFO   Algorithm   |                    CollNetChain                  |                            NVLS                  |                        NVLSTree                  |
vm:8612:8630 [0] NCCL INFO   Protocol    |             LL |          LL128 |         Simple |             LL |          LL128 |         Simple |             LL |          LL128 |         Simple |
vm:8612:8630 [0] NCCL INFO     AllReduce |     5.0/   0.0 |     8.5/   0.0 |    14.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |
vm:8612:8630 [0] NCCL INFO   Algorithm   |                             PAT                  |
vm:8612:8630 [0] NCCL INFO   Protocol    |             LL |          LL128 |         Simple |             LL |          LL128 |         Simple |             LL |          LL128 |         Simple |
vm:8612:8630 [0] NCCL INFO     AllGather |     0.0/   0.0 |     0.0/   0.0 |    27.2/   0.9 |
vm:8612:8630 [0] NCCL INFO     AllReduce |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |
vm:8612:8648 [0] NCCL INFO AllReduce: 16777216 Bytes -> Algo RING proto SIMPLE channel{Lo..Hi}={0..1}
";

    fn log_of(text: &str) -> Log {
        let mut log = Log {
            file: File::open("/dev/null").unwrap(),
            read: 0,
            partial: Vec::new(),
            table: Vec::new(),
            building: None,
            choices: VecDeque::new(),
        };
        for line in text.lines() {
            log.line(line);
        }
        log
    }

    #[test]
    fn reads_nccls_table_and_its_choice_per_call() {
        let log = log_of(H100);
        let runnable: Vec<(&str, &str, f64, f64)> = log
            .table
            .iter()
            .filter(|c| c.function == "AllReduce" && c.bandwidth_gbs > 0.0)
            .map(|c| (c.algo, c.proto, c.latency_us, c.bandwidth_gbs))
            .collect();
        assert_eq!(
            runnable,
            [
                ("tree", "ll", 26.8, 0.1),
                ("tree", "simple", 64.4, 0.5),
                ("ring", "ll", 36.6, 0.4),
                ("ring", "simple", 92.4, 0.8)
            ]
        );
        let pat = log
            .table
            .iter()
            .find(|c| c.function == "AllGather" && c.algo == "pat" && c.bandwidth_gbs > 0.0)
            .unwrap();
        assert_eq!((pat.proto, pat.latency_us, pat.bandwidth_gbs), ("simple", 27.2, 0.9));
        let c = log.choices.back().unwrap();
        assert_eq!(
            (c.function.as_deref(), c.bytes, c.algo, c.proto),
            (Some("AllReduce"), 16777216, "ring", "simple")
        );
    }

    #[test]
    fn reads_the_numbered_choice_of_nccl_2_21() {
        let c = parse_choice("4096 Bytes -> Algo 0 proto 0 time 26.800000").unwrap();
        assert_eq!((c.function, c.bytes, c.algo, c.proto), (None, 4096, "tree", "ll"));
        let c = parse_choice("AllGather: 64 Bytes -> Algo NVLS_TREE proto LL128 channel{Lo..Hi}={0..0}").unwrap();
        assert_eq!((c.algo, c.proto), ("nvls-tree", "ll128"));
        assert_eq!(parse_choice("Init COMPLETE"), None);
        assert_eq!(parse_choice("comm 0x1 rank 0 nRanks 4: 3 -> 0"), None);
    }

    #[test]
    fn a_new_communicators_table_replaces_the_last() {
        let second = H100.replace("92.4/   0.8", "50.0/   2.0");
        let log = log_of(&format!("{H100}{second}"));
        let ring: Vec<f64> = log
            .table
            .iter()
            .filter(|c| c.function == "AllReduce" && c.algo == "ring" && c.proto == "simple")
            .map(|c| c.latency_us)
            .collect();
        assert_eq!(ring, [50.0]);
    }
}
