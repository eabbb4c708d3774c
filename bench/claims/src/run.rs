//! Running a claim's commands (the workbook's release binaries, beside this one) and
//! reading their `--format json` reports.

use crate::claims::{Claim, Cmd, Stat};
use anyhow::{Context, Result, anyhow, bail};
use serde_json::Value;
use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The longest one command may run, in seconds, before it counts as hung.
const LIMIT: Duration = Duration::from_secs(300);

/// The checkout: README.md, docs/ and EXERCISES.md are read from it.
fn checkout() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The folder of the workbook's release binaries: this one's (cargo builds them side by
/// side, wherever its target folder is).
fn bins() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("finding this program's own path")?;
    Ok(exe.parent().map(Path::to_path_buf).unwrap_or_default())
}

/// The machine in one line: its processor, cores and memory, and the date.
pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "an unknown processor".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .next()
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|k| k.parse::<u64>().ok())
        })
        .map_or(String::new(), |kib| format!(", {} GiB", (kib + (1 << 19)) >> 20));
    let date = Command::new("date")
        .arg("+%Y-%m-%d")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_default();
    format!("{cpu}, {cores} cores{mem}, {date}, load {load} at the start")
}

/// Whether `quote` is in `file` (README.md, EXERCISES.md), line breaks and runs of spaces
/// counting as one space.
pub fn quoted(file: &str, quote: &str) -> Result<bool> {
    let path = checkout().join(file);
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let flat = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    Ok(flat(&text).contains(&flat(quote)))
}

/// The median of `v` (not empty).
pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

/// Every measure's values, one per round: each round runs each of the claim's distinct
/// commands once, in turn.
pub fn measure(claim: &Claim, rounds: usize, quick: bool) -> Result<Vec<Vec<f64>>> {
    let mut values = vec![vec![]; claim.measures.len()];
    for _ in 0..rounds {
        let mut done: HashMap<String, Value> = HashMap::new();
        for (i, m) in claim.measures.iter().enumerate() {
            let key = m.command_line(quick);
            if !done.contains_key(&key) {
                let report = run(&m.cmd, quick).with_context(|| format!("running {key}"))?;
                done.insert(key.clone(), report);
            }
            let v = read(&done[&key], &m.stat).with_context(|| format!("reading {:?} from {key}", m.stat))?;
            values[i].push(v);
        }
    }
    Ok(values)
}

/// One statistic of a report.
fn read(report: &Value, stat: &Stat) -> Result<f64> {
    let at = |v: &Value, ptr: &str| {
        v.pointer(ptr)
            .and_then(Value::as_f64)
            .ok_or_else(|| anyhow!("no number at {ptr}"))
    };
    match stat {
        Stat::Report(ptr) => at(report, ptr),
        Stat::Row(size, ptr) => {
            let rows = report["rows"].as_array().ok_or_else(|| anyhow!("no rows"))?;
            let row = rows
                .iter()
                .find(|r| r["size"].as_u64() == Some(*size))
                .ok_or_else(|| anyhow!("no row of {size} B"))?;
            at(row, ptr)
        }
        Stat::Rows(ptr) => {
            let rows = report["rows"].as_array().ok_or_else(|| anyhow!("no rows"))?;
            let v: Vec<f64> = rows
                .iter()
                .filter_map(|r| r.pointer(ptr).and_then(Value::as_f64))
                .collect();
            Ok(v.iter().copied().fold(f64::NAN, f64::max))
        }
    }
}

/// Runs `cmd` (on `cmd.nodes` "nodes" of this host when more than one) and returns the
/// report of its rank 0.
fn run(cmd: &Cmd, quick: bool) -> Result<Value> {
    let bins = bins()?;
    let exe = bins.join(cmd.bin);
    if !exe.exists() {
        bail!(
            "{} is not built: bench/claims.sh builds the workspace in release first",
            exe.display()
        );
    }
    let args = cmd.args_for(quick);
    let mut children = vec![];
    let port = 20000 + (std::process::id() % 20000) as u16;
    for node in 0..cmd.nodes {
        let mut c = Command::new(&exe);
        c.args(&args).arg("--format").arg("json");
        if cmd.nodes > 1 {
            c.args(["--nnodes", &cmd.nodes.to_string(), "--node-rank", &node.to_string()])
                .args(["--master-addr", "127.0.0.1", "--master-port", &port.to_string()])
                .env("SLURMD_NODENAME", format!("node{node}"));
        }
        c.envs(cmd.env.iter().copied())
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        children.push(c.spawn().with_context(|| format!("starting {}", exe.display()))?);
    }
    let start = Instant::now();
    let mut outputs = vec![];
    for mut child in children {
        let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
        let reader = std::thread::spawn(move || {
            let (mut o, mut e) = (String::new(), String::new());
            let _ = out.read_to_string(&mut o);
            let _ = err.read_to_string(&mut e);
            (o, e)
        });
        let status = loop {
            if let Some(s) = child.try_wait()? {
                break s;
            }
            if start.elapsed() > LIMIT {
                let _ = child.kill();
                let _ = child.wait();
                bail!("still running after {} s: killed", LIMIT.as_secs());
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let (o, e) = reader.join().map_err(|_| anyhow!("reading the output"))?;
        if !status.success() {
            let last = e.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("");
            bail!("exit {}: {last}", status.code().unwrap_or(-1));
        }
        outputs.push(o);
    }
    let first = outputs.into_iter().next().unwrap_or_default();
    serde_json::from_str(&first).context("its --format json output is not a report")
}
