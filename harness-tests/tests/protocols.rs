//! NCCL's protocols on the shared-memory transport (LL, LL128, Simple), chosen by
//! `NCCL_PROTO` as NCCL reads it: every element checked on 1 to 17 ranks by each, the
//! choice said where a student looks (`NCCL_DEBUG=INFO`'s tuning line, the `Time:` line,
//! the JSON report), and what cannot run refused in one line. Real multi-process jobs.
//! (`07-nccl-perf/tests/protocols.rs` checks every collective, element by element, and
//! that each protocol's steps really crossed the links.)

use testkit::{LIMIT, Run, command, finish, spawn};

const BIN: &str = env!("CARGO_BIN_EXE_harness-probe");

/// The probe (an all-reduce, rank r starting from r + 1, every element checked) on
/// `ranks` ranks with `count` floats, with `env` set.
fn all_reduce(ranks: usize, count: usize, extra: &[&str], env: &[(&str, &str)]) -> Run {
    let (n, c) = (ranks.to_string(), count.to_string());
    let mut args = vec!["--nproc-per-node", &n, "--count", &c, "--init", "rank", "--iters", "2"];
    args.extend(extra);
    let mut cmd = command(BIN, &args);
    cmd.env("NCCL_WORKBOOK_CORES", "8").envs(env.iter().copied());
    finish(spawn(cmd), LIMIT)
}

/// The odd sizes, in floats: one element, a few, around an LL128 line (120 bytes is 30
/// floats: 119 and 121 floats end mid-line), not a multiple of any step, and one over
/// 1 MiB (several LL steps, several pieces of the pipelined ring).
const COUNTS: [usize; 6] = [1, 7, 119, 121, 4093, (1 << 18) + 3];

#[test]
fn every_protocol_all_reduces_every_element_on_1_to_17_ranks() {
    for (i, ranks) in [1usize, 2, 3, 5, 8, 17].into_iter().enumerate() {
        for (j, proto) in ["LL", "LL128", "Simple"].into_iter().enumerate() {
            // Each world size meets each protocol at another of the sizes; the largest
            // runs on a few only (17 ranks share two cores).
            let count = match ranks {
                17 => COUNTS[j * 2 % 5],
                _ => COUNTS[(i + 2 * j) % COUNTS.len()],
            };
            let r = all_reduce(ranks, count, &["--format", "json"], &[("NCCL_PROTO", proto)]);
            assert_eq!(r.code, Some(0), "{ranks} ranks, {count} floats, {proto}: {r}");
            let j = r.json();
            assert_eq!(j["check"]["ok"], true, "{ranks} ranks, {count} floats, {proto}: {r}");
            // One rank sends nothing: every message of a one-rank job is none.
            let ran = match ranks {
                1 => "simple",
                _ => &proto.to_lowercase(),
            };
            assert_eq!(j["proto"], ran, "{ranks} ranks, {count} floats, {proto}: {r}");
        }
    }
}

#[test]
fn the_tuning_line_and_the_time_line_say_which_protocol_ran() {
    for (proto, word) in [("LL", "ll"), ("ll128", "ll128"), ("^LL,LL128", "simple")] {
        let r = all_reduce(2, 256, &[], &[("NCCL_DEBUG", "INFO"), ("NCCL_PROTO", proto)]).ok();
        let line = format!("cpu INFO AllReduce: 1024 Bytes -> Algo direct proto {word}");
        assert_eq!(r.stdout.lines().filter(|l| *l == line).count(), 1, "{proto}: {r}");
        let time = r.stdout.lines().find(|l| l.starts_with("Time: ")).expect("a Time line");
        match word {
            "simple" => assert!(time.contains(" via direct ("), "{time}"),
            _ => assert!(time.contains(&format!(" via direct proto {word} (")), "{time}"),
        }
    }
    // Past a direct message, the pipelined ring by LL128; LL leaves no single copy.
    let r = all_reduce(3, 1 << 16, &[], &[("NCCL_DEBUG", "INFO"), ("NCCL_PROTO", "LL128")]).ok();
    assert!(
        r.stdout
            .contains("cpu INFO AllReduce: 262144 Bytes -> Algo ring-pipelined proto ll128"),
        "{r}"
    );
}

#[test]
fn a_protocol_nccl_lacks_or_tcp_cannot_run_is_refused_in_one_line() {
    for (value, says) in [
        (
            "Bogus",
            "NCCL_PROTO=Bogus: unknown protocol 'Bogus': LL, LL128 or Simple",
        ),
        ("LL,LL256", "unknown protocol 'LL256'"),
        ("LL;ring", "every list but the first must name its collective"),
        ("gather:LL", "unknown collective 'gather'"),
    ] {
        let r = all_reduce(2, 4, &[], &[("NCCL_PROTO", value)]);
        assert_eq!(r.code, Some(2), "{value}: {r}");
        assert_eq!(r.stderr.trim().lines().count(), 1, "{value}: {r}");
        assert!(r.stderr.contains(says), "{value}: {r}");
    }
    // Over TCP, Simple alone: asking for LL is refused, Simple (or nothing) runs.
    let r = all_reduce(2, 4, &["--transport", "tcp"], &[("NCCL_PROTO", "LL")]);
    assert_eq!(r.code, Some(2), "{r}");
    assert_eq!(r.stderr.trim().lines().count(), 1, "{r}");
    assert!(r.stderr.contains("TCP, which has the Simple protocol only"), "{r}");
    let r = all_reduce(
        2,
        4,
        &["--transport", "tcp", "--format", "json"],
        &[("NCCL_PROTO", "simple")],
    )
    .ok();
    assert_eq!(r.json()["proto"], "simple", "{r}");
}
