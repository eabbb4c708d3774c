//! What the environment says, refused in one line (exit 2) before the run when it cannot
//! be honoured: `NCCL_ALGO` or `NCCL_PROTO` that leave nothing to run (NCCL refuses every
//! call then), `NCCL_WORKBOOK_BIND` that is neither `core` nor `none`, and a value with a
//! newline in it, still said on one line.

use testkit::{LIMIT, command, finish, spawn};

const BIN: &str = env!("CARGO_BIN_EXE_harness-probe");

#[test]
fn what_the_environment_cannot_mean_is_refused_in_one_line() {
    for (var, value, says) in [
        ("NCCL_ALGO", "^ring,tree,direct,single-copy", "excludes every algorithm"),
        ("NCCL_PROTO", "^LL,LL128,Simple", "excludes every protocol"),
        ("NCCL_WORKBOOK_BIND", "garbage", "NCCL_WORKBOOK_BIND=garbage: 'core'"),
        ("NCCL_ALGO", "ring\nbogus", "NCCL_ALGO=ring\\nbogus: unknown algorithm"),
        (
            "NCCL_PROTO",
            "Simple\r\nLL",
            "NCCL_PROTO=Simple\\r\\nLL: unknown protocol",
        ),
    ] {
        let mut cmd = command(BIN, &["--backend", "cpu", "--nproc-per-node", "2", "--count", "4"]);
        cmd.env(var, value);
        let r = finish(spawn(cmd), LIMIT);
        assert_eq!(r.code, Some(2), "{var}={value:?}: {r}");
        let lines: Vec<&str> = r.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "{var}={value:?}: {r}");
        assert!(lines[0].contains(says), "{var}={value:?}: {r}");
        assert!(!r.stdout.contains("Check:"), "refused before the run: {r}");
    }
    // What leaves something runs.
    for (var, value) in [
        ("NCCL_ALGO", "^tree,direct,single-copy"),
        ("NCCL_WORKBOOK_BIND", "none"),
    ] {
        let mut cmd = command(BIN, &["--backend", "cpu", "--nproc-per-node", "2", "--count", "4"]);
        cmd.env(var, value);
        finish(spawn(cmd), LIMIT).ok();
    }
}
