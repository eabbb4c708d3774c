//! The broadcast example with --backend nccl on the NCCL test double (nccl-double/).

use testkit::{LIMIT, finish, nccl_command, spawn, stage};

const BIN: &str = env!("CARGO_BIN_EXE_01-nccl-broadcast");

#[test]
fn broadcast_on_1_2_and_4_gpus_from_the_last_rank() {
    for world in [1usize, 2, 4] {
        let (w, root) = (world.to_string(), (world - 1).to_string());
        let args = [
            "--backend",
            "nccl",
            "--nproc-per-node",
            &w,
            "--root",
            &root,
            "--count",
            "7",
            "--format",
            "json",
        ];
        let r = finish(spawn(nccl_command(BIN, &args, 4)), LIMIT).ok();
        let j = r.json();
        assert_eq!(
            (j["backend"].as_str(), j["check"]["ok"].as_bool()),
            (Some("nccl"), Some(true)),
            "{r}"
        );
        assert_eq!(stage(&j, "after"), vec![vec![42.0; 7]; world], "{r}");
    }
}
