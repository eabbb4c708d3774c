//! `--link LATENCY,BANDWIDTH`: the CPU backend's TCP links take the time of a simulated
//! network's, said wherever a time is shown, and refused in one line where it cannot
//! apply. Real multi-process jobs.

use testkit::{LIMIT, Run, command, finish, spawn};

const BIN: &str = env!("CARGO_BIN_EXE_harness-probe");

fn probe(args: &[&str]) -> Run {
    finish(spawn(command(BIN, args)), LIMIT)
}

/// One line on stderr, exit 2, containing `says`.
fn refused(r: &Run, says: &str) {
    assert_eq!(r.code, Some(2), "{r}");
    let lines: Vec<&str> = r.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{r}");
    assert!(lines[0].contains(says), "{r}");
    assert!(!r.stderr.contains("panicked"), "{r}");
}

#[test]
fn a_link_that_cannot_be_or_cannot_apply_is_refused_in_one_line() {
    let base = ["--backend", "cpu", "--nproc-per-node", "2", "--count", "4"];
    for (link, says) in [
        ("5us", "is not LATENCY,BANDWIDTH"),
        ("2s,1Gbps", "out of range"),
        ("5us,10GB", "unknown unit"),
    ] {
        refused(&probe(&[&base[..], &["--link", link]].concat()), says);
    }
    // One host, shared memory between every pair: nothing to simulate.
    refused(
        &probe(&[&base[..], &["--link", "5us,10Gbps"]].concat()),
        "no pair of ranks talks over TCP here",
    );
    // One rank: no pair at all (before: "they share memory", though --transport tcp was
    // given), and said at once (before: 2 s, rank 0's store waiting for its own goodbye).
    let started = std::time::Instant::now();
    refused(
        &probe(&["--nproc-per-node", "1", "--transport", "tcp", "--link", "5us,10Gbps"]),
        "a job of one rank has no link to simulate",
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    // NCCL has a network of its own; on simulated GPUs, the CPU backend is had by leaving
    // them out (--backend cpu is refused beside --simulate-gpus).
    refused(
        &probe(&["--simulate-gpus", "2", "--count", "4", "--link", "5us,10Gbps"]),
        "simulates the CPU backend's TCP links; NCCL uses this machine's own network: leave --link out, or leave out --simulate-gpus",
    );
}

/// A buffer the link cannot carry within --timeout is refused before it is sent, in one
/// line naming the time it would take, not waited on until every rank gives up on live
/// peers ("nothing moved", after 72 s for 16 MiB at 1 Mbit/s with --timeout 5).
#[test]
fn a_buffer_the_link_cannot_carry_within_the_timeout_is_refused_at_once() {
    let slow = [
        "--nproc-per-node",
        "2",
        "--transport",
        "tcp",
        "--link",
        "0,1Mbps",
        "--timeout",
        "5",
    ];
    let started = std::time::Instant::now();
    let r = probe(&[&slow[..], &["--size", "16M"]].concat());
    refused(
        &r,
        "a buffer of 16.0 MiB takes 134.2 s to cross it, longer than --timeout (5 s)",
    );
    // Said before anything was sent: well within the timeout (not a bound on speed).
    assert!(started.elapsed() < std::time::Duration::from_secs(5), "{r}");
    // What fits runs: 64 KiB take half a second.
    let r = probe(&[&slow[..], &["--size", "64K"]].concat());
    assert_eq!(r.code, Some(0), "{r}");
}

#[test]
fn every_message_takes_the_links_latency_and_every_output_says_so() {
    // 20 ms: every call waits at least that long for the other rank's message, however
    // fast or loaded this machine (a lower bound the simulation guarantees, not a speed).
    let args = [
        "--backend",
        "cpu",
        "--nproc-per-node",
        "2",
        "--count",
        "4",
        "--iters",
        "3",
    ];
    let link = ["--transport", "tcp", "--link", "20ms,1Gbps"];
    let r = probe(&[&args[..], &link, &["--format", "json"]].concat()).ok();
    let j = r.json();
    assert_eq!(j["simulated_link"], "20 ms, 1 Gbit/s", "{r}");
    assert_eq!(j["check"]["ok"], true, "{r}");
    let us = j["time_us"].as_f64().unwrap();
    assert!(us >= 20_000.0, "{us} µs per call with a 20 ms link:\n{r}");
    let text = probe(&[&args[..], &link].concat()).ok();
    assert!(
        text.stdout
            .contains("network: simulated (--link): each TCP link sends at 1 Gbit/s and delivers a message 20 ms"),
        "{text}"
    );
    assert!(
        text.stdout.contains("(TCP links simulated at 20 ms, 1 Gbit/s (--link)"),
        "{text}"
    );
    // Without it, the report says nothing of a simulated link.
    let plain = probe(&[&args[..], &["--transport", "tcp", "--format", "json"]].concat()).ok();
    assert!(plain.json().get("simulated_link").is_none(), "{plain}");
}

#[test]
fn over_emulated_nodes_with_a_simulated_link_the_ring_and_the_tree_are_right() {
    for algo in ["Ring", "Tree"] {
        let runs = testkit::nodes(3, |node, args| {
            let mut cmd = command(
                BIN,
                &[
                    &[
                        "--backend",
                        "cpu",
                        "--nproc-per-node",
                        "2",
                        "--count",
                        "100000",
                        "--init",
                        "rank",
                    ][..],
                    &["--link", "50us,10Gbps"],
                    args,
                ]
                .concat(),
            );
            cmd.env("SLURMD_NODENAME", format!("node-{node}"))
                .env("NCCL_ALGO", algo);
            cmd
        });
        for r in &runs {
            assert_eq!(r.code, Some(0), "{algo}: {r}");
        }
        let j = runs[0].json();
        assert_eq!(j["check"]["ok"], true, "{algo}: {}", runs[0]);
        assert_eq!(j["simulated_link"], "50 µs, 10 Gbit/s");
    }
}
