//! Exercise 14's check beyond the values: that the buckets are the ones DDP's rule makes,
//! issued while the backward still computed and waited only once it was done. Read from
//! rank 0's stream in the JSON report (`streams`: each all-reduce's issue and wait times,
//! each layer's computing), which the session writes whatever the student's code does.

use crate::exercises::Case;
use serde_json::Value;

/// Layers of the model in every case, and their width: 12·8² + 13·8 = 872 parameters,
/// 3488 bytes of gradients each.
const LAYERS: usize = 7;
const HIDDEN: usize = 8;
const PARAMS: usize = 12 * HIDDEN * HIDDEN + 13 * HIDDEN;

/// The buckets DDP's rule makes of `layers` layers of `bytes` each, the last layer first:
/// a bucket is issued once it holds `bucket` bytes or more, or after the last layer.
/// Each bucket's number of layers.
pub fn buckets(layers: usize, bytes: usize, bucket: usize) -> Vec<usize> {
    let (mut out, mut open) = (Vec::new(), 0);
    for k in 0..layers {
        open += 1;
        if open * bytes >= bucket || k + 1 == layers {
            out.push(open);
            open = 0;
        }
    }
    out
}

/// The cases: buckets smaller than a layer (one per layer), of three layers (the last
/// one shorter) and DDP's default 25 MiB (one for the whole model); every world the
/// checker runs, and one rank alone, whose average is its own gradient.
pub fn cases(max: usize) -> Vec<Case> {
    let mut cases = Vec::new();
    let worlds: Vec<usize> = std::iter::once(1).chain(2..=max.clamp(2, 5)).collect();
    for (i, &n) in worlds.iter().enumerate() {
        let mib = ["0.003", "0.008", "25"][i % 3];
        cases.push(case(n, mib));
    }
    cases
}

/// World `n`, buckets of `mib` MiB: the values, then the buckets' sizes and times.
fn case(n: usize, mib: &str) -> Case {
    let (layers, hidden) = (LAYERS.to_string(), HIDDEN.to_string());
    let args = [
        "--layers",
        &layers,
        "--hidden",
        &hidden,
        "--compute-us",
        "300",
        "--bucket-mb",
        mib,
    ];
    // Element i of the gradients, the last layer first, averaged: (n + 1)(l + 1) / 2.
    let average = move |_rank: usize, i: usize| ((n + 1) * (LAYERS - i / PARAMS)) as f64 / 2.0;
    let bucket = (mib.parse::<f64>().unwrap_or(0.0) * (1 << 20) as f64) as usize;
    // The table's default: the first 8 elements.
    Case::new(n, &args, "after", 8, average).also(move |report| launched(report, bucket))
}

/// What is wrong with the all-reduces of rank 0's stream, for buckets of `bucket` bytes:
/// none at all, other sizes than the rule's, one issued after the next layer started
/// computing, one waited before the last layer was computed.
fn launched(report: &Value, bucket: usize) -> Vec<String> {
    let Some(stream) = report["streams"].get(0) else {
        return vec!["rank 0 opened no stream (s.overlap): the check reads its all-reduces there".into()];
    };
    let want = buckets(LAYERS, PARAMS * 4, bucket);
    let mut spans: Vec<&Value> = stream["collectives"]
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    spans.sort_by_key(|s| s["seq"].as_u64());
    let computing: Vec<(f64, f64)> = serde_json::from_value(stream["computing"].clone()).unwrap_or_default();
    let ms = |v: f64| format!("{:.2} ms", v * 1e3);
    let sizes: Vec<usize> = spans
        .iter()
        .map(|s| s["bytes"].as_u64().unwrap_or(0) as usize / (PARAMS * 4))
        .collect();
    if spans.iter().any(|s| s["what"] != "all-reduce") || sizes != want {
        let said = match spans.len() {
            0 => "no all-reduce".to_string(),
            k => format!("{k} collectives of {sizes:?} layers"),
        };
        return vec![format!(
            "rank 0 issued {said} on the stream; buckets of {bucket} bytes make {} all-reduces of {want:?} layers \
             ({} bytes a layer: a bucket is issued once it holds {bucket} bytes or more, or after the last layer)",
            want.len(),
            PARAMS * 4
        )];
    }
    let Some(&(_, backward_end)) = computing.last() else {
        return vec!["rank 0 computed no layer (stream.compute(compute))".into()];
    };
    let mut lines = Vec::new();
    let mut last_layer = 0;
    for (k, (span, layers)) in spans.iter().zip(&want).enumerate() {
        last_layer += layers;
        let issued = span["issued"].as_f64().unwrap_or(f64::NAN);
        if let Some(&(next, _)) = computing.get(last_layer)
            && issued > next
        {
            lines.push(format!(
                "rank 0: bucket {} was issued at {}, after the next layer's backward had started ({}): issue each \
                 bucket as soon as its last layer is computed",
                k + 1,
                ms(issued),
                ms(next)
            ));
            break;
        }
        let waited = span["waited"].as_f64().unwrap_or(f64::NAN);
        if waited < backward_end && k + 1 < want.len() {
            lines.push(format!(
                "rank 0: bucket {} was waited at {}, before the backward ended ({}): wait only once every layer is \
                 computed, so that the all-reduces run while it computes",
                k + 1,
                ms(waited),
                ms(backward_end)
            ));
            break;
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule_closes_a_bucket_once_full_and_after_the_last_layer() {
        assert_eq!(buckets(7, 3488, 3145), vec![1; 7]);
        assert_eq!(buckets(7, 3488, 8388), vec![3, 3, 1]);
        assert_eq!(buckets(7, 3488, 25 << 20), vec![7]);
    }
}
