//! The all-reduce example with --backend nccl, through cudarc's real loading path, on
//! the NCCL test double (nccl-double/): real processes, one rank each.

use testkit::{LIMIT, finish, nccl_command, spawn, stage};

const BIN: &str = env!("CARGO_BIN_EXE_02-nccl-allreduce");

#[test]
fn all_reduce_on_1_2_and_4_gpus() {
    for world in [1usize, 2, 4] {
        let w = world.to_string();
        let cmd = nccl_command(
            BIN,
            &[
                "--backend",
                "nccl",
                "--nproc-per-node",
                &w,
                "--count",
                "1000003",
                "--init",
                "rank",
                "--format",
                "json",
            ],
            4,
        );
        let r = finish(spawn(cmd), LIMIT).ok();
        let j = r.json();
        assert_eq!(j["backend"], "nccl", "{r}");
        assert_eq!(j["check"]["wrong"], 0, "{r}");
        let sum = (world * (world + 1) / 2) as f64;
        assert_eq!(stage(&j, "after"), vec![vec![sum; 8]; world], "{r}");
        let devices: Vec<String> = j["ranks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["device"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(devices, (0..world).map(|d| format!("cuda:{d}")).collect::<Vec<_>>());
    }
}

#[test]
fn the_same_table_as_on_the_cpu_with_gpu_rows() {
    // --backend auto finds the "driver", its GPUs and NCCL, and says so.
    let r = finish(spawn(nccl_command(BIN, &[], 2)), LIMIT).ok();
    let double = testkit::nccl_double_file();
    assert_eq!(
        r.stdout.lines().next(),
        Some(format!("backend: nccl, found 2 GPUs and NCCL 2.18.3 ({})", double.display()).as_str()),
        "{r}"
    );
    for line in [
        "After all-reduce:",
        "  GPU 0 | 2 | 2 | 2 | 2 |",
        "  GPU 1 | 2 | 2 | 2 | 2 |",
        "Check: OK, all 2 ranks hold 2 in all 4 elements",
    ] {
        assert!(r.stdout.lines().any(|l| l == line), "missing {line:?}:\n{r}");
    }
}
