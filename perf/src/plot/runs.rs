//! The runs a picture draws: this run's sweeps (from its report) and results saved
//! before (`--plot-with`, read from `--format json` or another library's file in that
//! form), each value checked to lie in a range, and what tells one run from another.

use serde_json::Value;
use std::collections::BTreeSet;
use std::ffi::OsString;
use std::io::Read;
use std::path::Path;

/// One run to draw: who ran it, and its sweeps.
#[derive(Debug, Clone, Default)]
pub struct Run {
    /// Where it comes from: `this run`, or the stem of the file it was saved in.
    pub name: String,
    /// Number of ranks.
    pub ranks: usize,
    /// How ranks exchanged data: `shm`, `tcp`, `shm+tcp`, or empty (NCCL, one rank).
    pub transport: String,
    /// `cpu`, `nccl`, or another library's name (`gloo`, `mpi`).
    pub backend: String,
    /// The host(s) it ran on: `vm`, `a+b`, or `8 hosts`.
    pub host: String,
    /// One line each.
    pub sweeps: Vec<Sweep>,
}

/// One line of the picture: a collective, type and operator over sizes.
#[derive(Debug, Clone, Default)]
pub struct Sweep {
    /// nccl-tests' name: `all_reduce`.
    pub op: String,
    /// The element type: `float`.
    pub datatype: String,
    /// The operator, or empty when the collective reduces nothing.
    pub redop: String,
    /// The run's single-thread memcpy bandwidth, GB/s, when it measured it.
    pub memcpy_gbps: Option<f64>,
    /// (bytes, µs, busbw GB/s) per size, out of place: separate send and receive buffers.
    pub out_of_place: Vec<(f64, f64, f64)>,
    /// The same, in place: one buffer (empty where a saved result has no such column).
    pub in_place: Vec<(f64, f64, f64)>,
}

impl Sweep {
    /// What the label says of the placements: nothing when both are drawn (the legend's
    /// key tells solid from dashed), else the one there is.
    pub(super) fn placement(&self) -> &'static str {
        match (self.out_of_place.is_empty(), self.in_place.is_empty()) {
            (false, false) | (true, true) => "",
            (false, true) => "out of place",
            (true, false) => "in place",
        }
    }
}

impl From<&common::report::Perf> for Sweep {
    /// This run's sweep, as its `--format json` would be read back.
    fn from(p: &common::report::Perf) -> Sweep {
        Sweep {
            // With -A, each algorithm a line of its own.
            op: match &p.nccl_algo {
                Some(a) => format!("{} ({a})", p.op),
                None => p.op.clone(),
            },
            datatype: p.datatype.clone(),
            redop: if p.redop == "none" {
                String::new()
            } else {
                p.redop.clone()
            },
            memcpy_gbps: Some(p.memcpy_gbps),
            out_of_place: p
                .rows
                .iter()
                .map(|r| (r.size as f64, r.out_of_place.time_us, r.out_of_place.busbw))
                .collect(),
            in_place: p
                .rows
                .iter()
                .map(|r| (r.size as f64, r.in_place.time_us, r.in_place.busbw))
                .collect(),
        }
    }
}

/// A backend as a line's label names it: NCCL on simulated GPUs says so (`--simulate-gpus`:
/// host memory, so no figure of the picture is a GPU's).
pub fn backend_label(backend: &str, simulated_gpus: Option<usize>) -> String {
    match simulated_gpus {
        Some(_) if backend == "nccl" => "nccl backend on simulated GPUs (host memory)".into(),
        _ => backend.into(),
    }
}

/// The largest result `--plot-with` reads: a sweep of every collective, operator and type
/// over 64 sizes is about 5 MiB of JSON.
pub const RESULT_MAX_BYTES: u64 = 64 << 20;

/// Reads a result saved with `--format json` (or a file in the same form that another
/// library's benchmark wrote: `bench/compare-mpi.sh --save-results`): a regular file of
/// at most [`RESULT_MAX_BYTES`], whose path is taken as the OS gives it (any bytes).
pub fn load(file: OsString) -> Result<Run, String> {
    let path = Path::new(&file);
    let cannot = |e: std::io::Error| format!("cannot read it ({})", common::output_file::reason(&e));
    let regular = |m: &std::fs::Metadata| -> Result<(), String> {
        match m.is_file() {
            true => Ok(()),
            false => Err(format!(
                "it is {}, not a regular file; save a result with 07-nccl-perf --format json > FILE",
                common::output_file::kind(m)
            )),
        }
    };
    // Looked at before it is opened: opening a FIFO would wait for a writer.
    regular(&std::fs::metadata(path).map_err(cannot)?)?;
    let opened = std::fs::File::open(path).map_err(cannot)?;
    let meta = opened.metadata().map_err(cannot)?;
    regular(&meta)?;
    let too_long = || {
        format!(
            "it is longer than the {} MiB a result may be; save a result with 07-nccl-perf --format json > FILE",
            RESULT_MAX_BYTES >> 20
        )
    };
    if meta.len() > RESULT_MAX_BYTES {
        return Err(too_long());
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    opened
        .take(RESULT_MAX_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(cannot)?;
    if bytes.len() as u64 > RESULT_MAX_BYTES {
        return Err(too_long()); // it grew while read
    }
    let json: Value = serde_json::from_slice(&bytes)
        .map_err(|e| format!("it is not JSON ({e}); save a result with 07-nccl-perf --format json > FILE"))?;
    let name = path
        .file_stem()
        .map_or(path.to_string_lossy(), |s| s.to_string_lossy())
        .into_owned();
    Run::from_json(&json, &name)
}
/// The largest value of each column a result may hold: far above any machine's (a
/// petabyte, eleven days, a petabyte a second), far below what would make the picture's
/// scales endless.
const MAX_SIZE: f64 = (1u64 << 50) as f64;
const MAX_TIME_US: f64 = 1e12;
const MAX_GBPS: f64 = 1e6;

/// `value` of `column` when it is a number from 0 to `max`, else why not.
fn in_range(value: f64, column: &str, max: f64) -> Result<f64, String> {
    match value.is_finite() && (0.0..=max).contains(&value) {
        true => Ok(value),
        false => {
            let shown = match value.abs() >= 1e6 {
                true => format!("{value:e}"),
                false => format!("{value}"),
            };
            Err(format!("{column} {shown} is out of range: 0 to {max:e}"))
        }
    }
}

impl Run {
    /// A run from its JSON report; `name` says where it came from.
    pub fn from_json(json: &Value, name: &str) -> Result<Run, String> {
        let not = |what: &str| {
            format!("it is not a benchmark result ({what}); save one with 07-nccl-perf --format json > FILE")
        };
        let ranks = json["world_size"].as_u64().ok_or_else(|| not("no world_size"))? as usize;
        let sweeps: Vec<&Value> = match json["sweeps"].as_array() {
            Some(all) => all.iter().collect(),
            None if json["rows"].is_array() => vec![json],
            None => return Err(not("no rows: is it another example's output?")),
        };
        let text = |v: &Value, key: &str| v[key].as_str().unwrap_or_default().to_string();
        let transports: BTreeSet<&str> = match json["transports"].as_object() {
            Some(map) => map.values().filter_map(Value::as_str).collect(),
            None => json["transport"].as_str().into_iter().collect(),
        };
        let hosts: BTreeSet<&str> = match json["ranks"].as_array() {
            Some(ranks) => ranks.iter().filter_map(|r| r["host"].as_str()).collect(),
            None => json["host"].as_str().into_iter().collect(),
        };
        let simulated = json["simulated_gpus"].as_u64().map(|n| n as usize);
        let backend = match json["backend"].as_str() {
            Some(b) => backend_label(b, simulated),
            None if text(json, "call").starts_with("MPI_") => "mpi".into(),
            None => String::new(),
        };
        let mut run = Run {
            name: name.into(),
            ranks,
            transport: transports.into_iter().collect::<Vec<_>>().join("+"),
            backend,
            host: match hosts.len() {
                0..=2 => hosts.into_iter().collect::<Vec<_>>().join("+"),
                n => format!("{n} hosts"),
            },
            sweeps: vec![],
        };
        for s in sweeps {
            let (mut out_of_place, mut in_place) = (vec![], vec![]);
            for row in s["rows"].as_array().into_iter().flatten() {
                // Open MPI's broadcast has one buffer: in place only.
                let places = [
                    (&mut out_of_place, &row["out_of_place"]),
                    (&mut in_place, &row["in_place"]),
                ];
                let (Some(size), true) = (row["size"].as_f64(), places.iter().any(|(_, p)| p.is_object())) else {
                    return Err(not("a row without a size or a time"));
                };
                let size = in_range(size, "size", MAX_SIZE).map_err(|e| not(&e))?;
                for (points, p) in places.into_iter().filter(|(_, p)| p.is_object()) {
                    match (p["time_us"].as_f64(), p["busbw"].as_f64()) {
                        (Some(t), Some(b)) => points.push((
                            size,
                            in_range(t, "time_us", MAX_TIME_US).map_err(|e| not(&e))?,
                            in_range(b, "busbw", MAX_GBPS).map_err(|e| not(&e))?,
                        )),
                        _ => return Err(not("a row without time_us or busbw")),
                    }
                }
            }
            let redop = text(s, "redop");
            let memcpy_gbps = match s["memcpy_gbps"].as_f64().or(json["memcpy_gbps"].as_f64()) {
                Some(g) => Some(in_range(g, "memcpy_gbps", MAX_GBPS).map_err(|e| not(&e))?),
                None => None,
            };
            run.sweeps.push(Sweep {
                op: text(s, "op"),
                datatype: text(s, "type"),
                redop: if redop == "none" { String::new() } else { redop },
                memcpy_gbps,
                out_of_place,
                in_place,
            });
        }
        if run
            .sweeps
            .iter()
            .all(|s| s.out_of_place.is_empty() && s.in_place.is_empty())
        {
            return Err(not("no rows"));
        }
        Ok(run)
    }

    /// What tells this run's lines apart from another run's: ranks, transport, backend, host.
    pub(super) fn parts(&self) -> [String; 4] {
        let plural = if self.ranks == 1 { "" } else { "s" };
        [
            format!("{} rank{plural}", self.ranks),
            self.transport.clone(),
            match self.backend.as_str() {
                "" => String::new(),
                b if b.contains("backend") => b.to_string(),
                b => format!("{b} backend"),
            },
            match self.host.as_str() {
                "" => String::new(),
                h => format!("on {h}"),
            },
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    #[test]
    fn saved_results_are_read_or_refused_with_a_reason() {
        let mpi = json!({"op": "broadcast", "call": "MPI_Bcast", "world_size": 2, "type": "float",
                         "redop": "sum", "rows": [{"size": 4, "out_of_place": null,
                         "in_place": {"time_us": 1.0, "busbw": 0.004}}]});
        let run = Run::from_json(&mpi, "mpi").unwrap();
        assert_eq!(
            (run.backend.as_str(), run.sweeps[0].in_place[0]),
            ("mpi", (4.0, 1.0, 0.004))
        );
        let hello = json!({"example": "00-nccl-hello-world", "world_size": 2, "ranks": []});
        assert!(
            Run::from_json(&hello, "h")
                .unwrap_err()
                .contains("not a benchmark result")
        );
        assert!(
            Run::from_json(&json!([1, 2]), "x")
                .unwrap_err()
                .contains("no world_size")
        );
    }
}
