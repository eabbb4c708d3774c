//! `NCCL_ALGO` and `NCCL_PROTO` on the NCCL backend: checked against the NCCL that loads
//! before it starts (one line, exit 2), then passed to NCCL, which (here the test double,
//! playing NCCL 2.18.3 or 2.28.3) runs the all-reduce by what they leave. Real jobs on
//! simulated GPUs.

use testkit::{LIMIT, Run, command, finish, spawn};

const BIN: &str = env!("CARGO_BIN_EXE_harness-probe");

fn probe(env: &[(&str, &str)]) -> Run {
    let mut cmd = command(BIN, &["--simulate-gpus", "2", "--count", "8", "--iters", "2"]);
    cmd.envs(env.iter().copied());
    finish(spawn(cmd), LIMIT)
}

fn refused(r: &Run, says: &str) {
    assert_eq!(r.code, Some(2), "{r}");
    let lines: Vec<&str> = r.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line: {r}");
    assert!(lines[0].contains(says), "{r}");
}

#[test]
fn names_the_nccl_that_loads_does_not_know_are_refused_in_one_line() {
    refused(
        &probe(&[("NCCL_ALGO", "Bogus")]),
        "NCCL_ALGO=Bogus: NCCL 2.18.3 has no algorithm 'Bogus' (it knows Tree, Ring,",
    );
    refused(
        &probe(&[("NCCL_PROTO", "LL256")]),
        "NCCL_PROTO=LL256: NCCL 2.18.3 has no protocol 'LL256'",
    );
    // The CPU backend's own names are not NCCL's.
    refused(&probe(&[("NCCL_ALGO", "single-copy")]), "no algorithm 'single-copy'");
    // Lists per collective came with NCCL 2.24.
    refused(
        &probe(&[("NCCL_ALGO", "allreduce:tree")]),
        "lists per collective ('allreduce:…') need NCCL 2.24 or later",
    );
}

#[test]
fn what_nccl_knows_runs_on_the_version_that_knows_it() {
    for (version, algo, proto) in [
        ("21803", "Tree", "Simple"),
        ("21803", "ring", "LL,LL128"),
        ("22803", "allreduce:tree;broadcast:ring", "^LL128"),
    ] {
        let r = probe(&[
            ("NCCL_DOUBLE_VERSION", version),
            ("NCCL_ALGO", algo),
            ("NCCL_PROTO", proto),
        ]);
        assert_eq!(r.code, Some(0), "{version} {algo} {proto}: {r}");
        assert!(r.stdout.contains("Check: OK"), "{r}");
    }
}
