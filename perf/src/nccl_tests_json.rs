//! `-J FILE` (`--output_file`): the benchmark's result in nccl-tests' own JSON, so that
//! a script written for nccl-tests' files (`all_reduce_perf -J out.json`) reads ours
//! unchanged, and the two can be set side by side.
//!
//! The layout and names are nccl-tests' format version 3 (`src/util.cu`, nccl-tests
//! 2.17 and later): `version`, `start_time`, `args`, `env`, `nccl_version`, `config`
//! (with `devices`), `results` (one object per size: `size`, `count`, `type`, `redop`,
//! `root`, `out_of_place` and `in_place` each `{time, alg_bw, bus_bw, nwrong}`,
//! `actual_iterations`, `experiment_name`), `out_of_bounds`, `average_bus_bandwidth`,
//! `errors`, `end_time`. Its booleans are the strings `"true"` and `"false"`, as nccl-tests'
//! `jsonBool` writes them, and `errors` holds NCCL's last error, `""` when there is none
//! (compared with a file of nccl-tests 2.19.6 on an H200, 2026-11-26: the same names at
//! every depth). Where ours differs, on purpose:
//! - `env` lists only the variables that steer NCCL, CUDA, Slurm, torchrun and the
//!   workbook (nccl-tests writes the whole environment, tokens and all);
//! - one file holds every sweep of the run (`--op all`, `-d all`, `-A ring,tree`): each
//!   result names its own in `experiment_name` (`all_reduce float sum`, with
//!   `NCCL_ALGO=tree` where `-A` set it and `NCCL_PROTO=ll` where `-P` did), and says
//!   `collective`, `nccl_algo` and `nccl_proto` too;
//! - `nccl_version` is null on the CPU backend, which runs no NCCL, and `backend` says
//!   which ran; `device_hex` (the GPU's PCI address) is empty;
//! - an existing file is replaced (nccl-tests writes `FILE.0`, `FILE.1`, ... beside it);
//! - under `NCCL_TESTS_SPLIT` (or `_MASK`), each device's `group` is its rank's color, as
//!   nccl-tests writes it, and `split` (ours) says the variable, the formula, and each
//!   communicator's color and world ranks; `results` are rank 0's communicator's.

use crate::PerfArgs;
use crate::split::Spec;
use common::report::{Perf, Placement, Report};
use serde_json::{Value, json};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// nccl-tests' `JSON_FILE_VERSION`.
const FORMAT_VERSION: u64 = 3;

/// The variables `env` lists: those that change what NCCL, CUDA, the launcher or the
/// workbook do.
const ENV_PREFIXES: [&str; 6] = ["NCCL_", "CUDA_", "SLURM_", "NVIDIA_", "OMPI_", "PMIX_"];
const ENV_NAMES: [&str; 6] = [
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "NO_COLOR",
];

/// `-J FILE`, checked when the flags are read: a file this process may write, in a
/// folder that exists, so that a result that cannot be saved stops the run before it
/// starts. The path is taken as the OS gives it (any bytes).
pub fn parse_output(s: OsString) -> Result<PathBuf, String> {
    let path = PathBuf::from(s);
    common::output_file::check(&path, "a result")?;
    Ok(path)
}

/// When the run started, as nccl-tests writes it (`%Y-%m-%d %H:%M:%S`, local time).
pub fn now() -> String {
    // SAFETY: `time(NULL)` only returns the time; `localtime_r` writes into `tm`, ours;
    // `strftime` writes at most `buf.len()` bytes into `buf` and returns how many.
    unsafe {
        let t = libc::time(std::ptr::null_mut());
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&t, &mut tm).is_null() {
            return String::new();
        }
        let mut buf = [0u8; 64];
        let n = libc::strftime(buf.as_mut_ptr().cast(), buf.len(), c"%Y-%m-%d %H:%M:%S".as_ptr(), &tm);
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }
}

/// NCCL's version code (`2.28.3` is 22803), as `ncclGetVersion` gives it.
fn version_code(version: &str) -> Option<u64> {
    workbook_runtime::nccl::Version::parse(version).map(|v| u64::from(v.code()))
}

/// A boolean as nccl-tests writes it: a string.
fn boolean(b: bool) -> &'static str {
    if b { "true" } else { "false" }
}

/// One placement's figures, as nccl-tests' `out_of_place` / `in_place`.
fn placement(p: &Placement) -> Value {
    json!({
        "time": p.time_us,
        "alg_bw": p.algbw,
        "bus_bw": p.busbw,
        "nwrong": p.wrong,
    })
}

/// The name of a sweep, for `experiment_name`.
fn experiment(perf: &Perf) -> String {
    let algo = perf
        .nccl_algo
        .as_ref()
        .map(|a| format!(", NCCL_ALGO={a}"))
        .unwrap_or_default();
    let proto = perf
        .nccl_proto
        .as_ref()
        .map(|p| format!(", NCCL_PROTO={p}"))
        .unwrap_or_default();
    format!("{} {} {}{algo}{proto}", perf.op, perf.datatype, perf.redop)
}

/// The whole document: the run's `report` (ranks, backend, NCCL's version), the flags,
/// the split (`NCCL_TESTS_SPLIT`) if any, and its sweeps.
pub fn document(report: &Report, args: &PerfArgs, sweeps: &[Perf], started: &str, split: Option<&Spec>) -> Value {
    let mut config = json!({
        "nthreads": 1,
        "ngpus": 1,
        "minimum_bytes": args.min_bytes,
        "maximum_bytes": args.max_bytes,
        "warmup_iters": args.warmup,
        "iterations": args.iters,
        "aggregated_iterations": 1,
        "validation": args.check,
        "graph": 0,
        "blocking_collectives": boolean(false),
        "per_iter_timing": boolean(false),
        "per_iter_skip": 0,
        "parallel_init": boolean(false),
    });
    match (args.step_factor, args.step_bytes) {
        (Some(f), _) => config["step_factor"] = json!(f),
        (None, b) => config["step_bytes"] = json!(b.unwrap_or(1 << 20)),
    }
    config["devices"] = report
        .ranks
        .iter()
        .map(|r| {
            json!({
                "rank": r.rank,
                "group": split.map_or(0, |s| s.color(r.rank)),
                "pid": r.pid,
                "hostname": r.host,
                "device": r.device.rsplit(':').next().and_then(|d| d.parse::<u64>().ok()).unwrap_or(0),
                "device_hex": "",
                "device_info": r.device_name.clone().unwrap_or_else(|| r.device.clone()),
            })
        })
        .collect();
    let results: Vec<Value> = sweeps
        .iter()
        .flat_map(|perf| {
            perf.rows.iter().map(move |row| {
                json!({
                    "size": row.size,
                    "count": row.count,
                    "type": row.datatype,
                    "redop": row.redop,
                    "root": format!("{:6}", row.root),
                    "out_of_place": placement(&row.out_of_place),
                    "in_place": placement(&row.in_place),
                    "actual_iterations": args.iters,
                    "experiment_name": experiment(perf),
                    "collective": perf.op,
                    "nccl_algo": perf.nccl_algo,
                    "nccl_proto": perf.nccl_proto,
                })
            })
        })
        .collect();
    let wrong: u64 = sweeps.iter().map(|p| p.wrong).sum();
    let busbw = sweeps.iter().map(|p| p.avg_busbw).sum::<f64>() / sweeps.len().max(1) as f64;
    let env: Vec<String> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.to_string_lossy().into_owned())))
        .filter(|(k, _)| ENV_PREFIXES.iter().any(|p| k.starts_with(p)) || ENV_NAMES.contains(&k.as_str()))
        .filter(|(k, _)| !workbook_nccl::nccl_log::set_here(k))
        // -A and -P on NCCL: the user's value (each sweep's is its `nccl_algo`, `nccl_proto`).
        .filter_map(|(k, v)| match workbook_nccl::per_sweep::prepared(&k) {
            true => workbook_nccl::per_sweep::user_var(&k).map(|user| (k, user)),
            false => Some((k, v)),
        })
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let mut doc = json!({
        "version": FORMAT_VERSION,
        "start_time": started,
        "args": std::env::args_os().map(|a| a.to_string_lossy().into_owned()).collect::<Vec<_>>(),
        "env": env,
        "nccl_version": report.nccl_version.as_deref().and_then(version_code),
        "backend": report.backend,
        "config": config,
        "results": results,
        "out_of_bounds": { "count": wrong, "okay": boolean(wrong == 0) },
        "average_bus_bandwidth": { "bandwidth": busbw, "okay": "unchecked" },
        // A result is written only after a run without error: NCCL's last error is empty.
        "errors": [""],
        "end_time": now(),
    });
    if let Some(spec) = split {
        doc["split"] = split_object(spec, report.world_size);
    }
    doc
}

/// `split`: which variable split the world of `world` ranks, how, and into what.
pub fn split_object(spec: &Spec, world: usize) -> Value {
    let groups = spec.groups(world);
    json!({
        "variable": spec.var,
        "value": spec.text,
        "color": spec.formula(),
        "communicators": groups.iter().map(|(c, ranks)| json!({
            "color": c,
            "nranks": ranks.len(),
            "ranks": ranks,
        })).collect::<Vec<_>>(),
        // The communicator whose figures `results` holds.
        "results_color": spec.color(0),
    })
}

/// Writes `doc` to `path`, or says in one line why it could not.
pub fn write(path: &Path, doc: &Value) -> Result<(), String> {
    let text = serde_json::to_string_pretty(doc).map_err(|e| format!("-J: {e}"))?;
    common::output_file::replace(path, (text + "\n").as_bytes()).map_err(|why| format!("-J: {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_version_codes_are_ncclgetversions() {
        assert_eq!(version_code("2.28.3"), Some(22803));
        assert_eq!(version_code("2.18.3+cuda12.2"), Some(21803));
        assert_eq!(version_code("cpu"), None);
    }
}
