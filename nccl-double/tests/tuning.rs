//! `NCCL_ALGO` and `NCCL_PROTO` as the NCCL being played reads them: NCCL 2.24 and later
//! fail the init on a name they do not know (`ncclInvalidUsage`, "Unrecognized element
//! token"), and a collective left with no algorithm fails when called, naming the
//! variables; NCCL 2.18 to 2.23 ignore the unknown name, and give Ring and Tree back to
//! a list that leaves none of Ring, Tree, NVLS and NVLSTree ("ignoring
//! NCCL_ALGO=COLLNET"), so `NCCL_ALGO=Bogus` runs; `NCCL_PROTO=Bogus` leaves no protocol,
//! and the collective finds no algorithm (`ncclInternalError`) on 2.18 and on 2.22 and
//! 2.23, while 2.19 to 2.21 give it its ring back (`ringbdw`). The all-reduce runs by the
//! tree or the ring. A communicator of one rank reads neither variable (NCCL 2.28.3 on an
//! H200 inited and ran with `NCCL_ALGO=Bogus`: `bench/nccl-env.sh`). Played with
//! `nccl-double-bare` (a blocking loop of all-reduces) on 2 ranks, and on 1.

mod support;

use std::process::Command;

const BARE: &str = env!("CARGO_BIN_EXE_nccl-double-bare");

/// Two ranks of a loop of 3 all-reduces playing NCCL `version` with `env` set: rank 0's
/// end.
fn bare(version: &str, env: &[(&str, &str)]) -> support::Out {
    bare_on(2, version, env)
}

/// `bare` on `world` ranks.
fn bare_on(world: usize, version: &str, env: &[(&str, &str)]) -> support::Out {
    let tag = support::job_tag(world, version, env);
    let id = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("tuning-id-{tag}"));
    let _ = std::fs::remove_file(&id);
    let ranks: Vec<_> = (0..world)
        .map(|r| {
            let mut cmd = support::bare_rank(Command::new(BARE), (r, world), 2, &id, version, 3);
            cmd.envs(env.iter().copied());
            support::Running::new(r, cmd.spawn().unwrap())
        })
        .collect();
    let outs: Vec<support::Out> = ranks.into_iter().map(|r| r.finish().0).collect();
    let _ = std::fs::remove_file(&id);
    outs.into_iter().next().unwrap()
}

#[test]
fn from_2_24_an_unknown_name_fails_the_init_and_a_collective_left_bare_fails_naming_the_variables() {
    for (var, value) in [
        ("NCCL_ALGO", "Bogus"),
        ("NCCL_PROTO", "LL256"),
        ("NCCL_ALGO", "ring;tree"),
    ] {
        let out = bare("22803", &[(var, value)]);
        assert_eq!(out.code, Some(1), "{var}={value}: {out}");
        assert!(out.stderr.contains("ncclCommInitRankConfig"), "{var}={value}: {out}");
        assert!(
            out.stderr.contains("ncclInvalidUsage") || out.stderr.contains("invalid usage"),
            "{out}"
        );
    }
    let out = bare("22803", &[("NCCL_ALGO", "allreduce:^tree,ring")]);
    assert_eq!(out.code, Some(1), "{out}");
    assert!(
        out.stderr.contains(
            "no algorithm/protocol available for function AllReduce with datatype ncclFloat32. NCCL_ALGO was set to \
             allreduce:^tree,ring."
        ),
        "{out}"
    );
}

#[test]
fn up_to_2_23_an_unknown_name_is_ignored_and_a_collective_left_bare_finds_no_algorithm() {
    // No algorithm named: Ring and Tree come back (tuning.cc, "ignoring NCCL_ALGO=COLLNET").
    for version in ["21803", "22105", "22304"] {
        let out = bare(version, &[("NCCL_ALGO", "Bogus")]);
        assert_eq!(out.code, Some(0), "{version}: {out}");
    }
    // No protocol: nothing on 2.18, 2.22 and 2.23; 2.19 to 2.21 give the ring back.
    for version in ["21803", "22203", "22304"] {
        let out = bare(version, &[("NCCL_PROTO", "Bogus")]);
        assert_eq!(out.code, Some(1), "{version}: {out}");
        assert!(
            !out.stderr.contains("ncclCommInitRankConfig"),
            "the init succeeds: {out}"
        );
        assert!(out.stderr.contains("no algorithm/protocol available"), "{out}");
    }
    let out = bare("22105", &[("NCCL_PROTO", "Bogus")]);
    assert_eq!(out.code, Some(0), "{out}");
}

#[test]
fn the_all_reduce_runs_by_the_tree_or_the_ring_with_any_protocol() {
    for version in ["21803", "22803"] {
        for env in [
            &[("NCCL_ALGO", "Tree")][..],
            &[("NCCL_ALGO", "ring"), ("NCCL_PROTO", "LL")],
            &[("NCCL_ALGO", "^tree"), ("NCCL_PROTO", "^LL,LL128")],
        ] {
            let out = bare(version, env);
            assert_eq!(out.code, Some(0), "{version} {env:?}: {out}");
        }
    }
}

#[test]
fn one_rank_reads_neither_variable() {
    for version in ["21803", "22803"] {
        for env in [
            &[("NCCL_ALGO", "Bogus")][..],
            &[("NCCL_PROTO", "LL256")],
            &[("NCCL_ALGO", "ring;tree")],
            &[("NCCL_ALGO", "allreduce:^tree,ring")],
            &[
                ("NCCL_ALGO", "NVLS"),
                ("NCCL_DEBUG", "INFO"),
                ("NCCL_DEBUG_SUBSYS", "ENV"),
            ],
        ] {
            let out = bare_on(1, version, env);
            assert_eq!(out.code, Some(0), "{version} {env:?}: {out}");
            assert!(!out.stderr.contains("set by environment"), "{version} {env:?}: {out}");
        }
    }
}
