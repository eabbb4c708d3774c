//! What NCCL 2.18 to 2.30 really do on the paths a cluster job takes, read in NCCL's
//! sources and played by the test double (`NCCL_DOUBLE_VERSION` picks the version):
//! real processes, one rank each, through cudarc's real loading path.

use std::process::Command;
use testkit::{LIMIT, Run, finish, nccl_command, spawn};

const BIN: &str = env!("CARGO_BIN_EXE_02-nccl-allreduce");

/// `world` ranks of lesson 02 on the double, playing NCCL `version` (a version code).
fn job(version: &str, world: usize, args: &[&str]) -> Command {
    let w = world.to_string();
    let mut all = vec!["--backend", "nccl", "--nproc-per-node", &w];
    all.extend_from_slice(args);
    let mut cmd = nccl_command(BIN, &all, world.max(1));
    cmd.env("NCCL_DOUBLE_VERSION", version);
    cmd
}

// ---------------------------------------------------------------------------------
// ncclConfig_t: NCCL copies `size` bytes of it. Up to 2.25 the struct has 4 bytes of
// padding at its end, which NCCL 2.26 reads as `trafficClass` with no version guard.

#[test]
fn the_config_gives_nccl_only_its_declared_fields_so_2_26_reads_no_traffic_class() {
    for version in ["21803", "22602", "22703"] {
        let run: Run = finish(spawn(job(version, 2, &["--format", "json"])), LIMIT);
        assert!(
            !run.stderr.contains("trafficClass"),
            "NCCL {version} was handed the config's padding as a field:\n{run}"
        );
        let run = run.ok();
        assert_eq!(run.json()["check"]["wrong"], 0, "{run}");
    }
}
