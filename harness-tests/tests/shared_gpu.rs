//! Ranks sharing a GPU, and which libnccl is taken, by the rules of the NCCL loaded, on
//! the NCCL test double (nccl-double/), whose `NCCL_DOUBLE_VERSION` picks the version it
//! plays.
//!
//! Up to 2.29 NCCL refuses two ranks of one host on one PCI bus id ("Duplicate GPU
//! detected"); 2.30 lets them share it with `NCCL_MULTI_RANK_GPU_ENABLE=1`, and 2.30.7
//! compares UUIDs. The workbook refuses first, in one line with NCCL's words, what the
//! loaded NCCL refuses, no more.
//!
//! The library search takes the active environment's NCCL (`pip install
//! nvidia-nccl-cu12` in a venv) before the `libnccl.so` that cudarc's own names find (a
//! system `libnccl-dev`).

use std::path::PathBuf;
use std::process::{Child, Command};
use testkit::{LIMIT, Run, finish, free_port, nccl_command, spawn};

const BIN: &str = env!("CARGO_BIN_EXE_harness-probe");

/// NCCL 2.30.3's and 2.30.7's words.
const MULTIPLE_2_30_3: &str = "Multiple ranks detected using the same GPU on this node. Set NCCL_MULTI_RANK_GPU_ENABLE=1 to enable this configuration.";
const MULTIPLE_2_30_7: &str =
    "Multiple Ranks are using the same GPU/Partition. Set NCCL_MULTI_RANK_GPU_ENABLE=1 to enable this configuration.";

/// Two ranks by hand on the double playing NCCL `version` with 4 GPUs, both given GPU 1
/// (`CUDA_VISIBLE_DEVICES=1`) of their machine, each with `env` and its own `per_rank`
/// (a variable and each rank's value, if any); run to the end.
fn two_on_gpu_1(version: &str, env: &[(&str, &str)], per_rank: Option<(&str, [&str; 2])>) -> Vec<Run> {
    let port = free_port().to_string();
    let children: Vec<Child> = (0..2)
        .map(|r| {
            let rank = r.to_string();
            let args = [
                "--backend",
                "nccl",
                "--world-size",
                "2",
                "--rank",
                &rank,
                "--master-port",
                &port,
            ];
            let mut cmd = nccl_command(BIN, &args, 4);
            cmd.env("CUDA_VISIBLE_DEVICES", "1")
                .env("NCCL_DOUBLE_VERSION", version)
                .env_remove("NCCL_MULTI_RANK_GPU_ENABLE")
                .env_remove("NCCL_HOSTID")
                .envs(env.iter().copied());
            if let Some((name, values)) = per_rank {
                cmd.env(name, values[r]);
            }
            spawn(cmd)
        })
        .collect();
    children.into_iter().map(|c| finish(c, LIMIT)).collect()
}

/// Rank 0 was refused by the workbook (exit 2, one line, before NCCL said anything)
/// quoting `says`.
fn refused_quoting(runs: &[Run], says: &str) {
    let run = &runs[0];
    assert_eq!(run.code, Some(2), "{run}\n{}", runs[1]);
    assert!(
        run.stderr.contains("ranks 0 and 1 are both on GPU GPU-")
            && run
                .stderr
                .contains(&format!("NCCL refuses two ranks on one GPU (\"{says}\")")),
        "{run}"
    );
    assert_eq!(run.stderr.lines().count(), 1, "one line:\n{run}");
    assert!(!run.stderr.contains("nccl-double WARN"), "{run}");
}

fn all_ran(runs: &[Run]) {
    for run in runs {
        assert_eq!(run.code, Some(0), "{run}");
    }
    assert!(runs[0].stdout.contains("Check: OK, all 2 ranks hold"), "{}", runs[0]);
}

#[test]
fn nccl_2_30_runs_two_ranks_on_one_gpu_with_nccl_multi_rank_gpu_enable_and_not_without() {
    let enabled = [("NCCL_MULTI_RANK_GPU_ENABLE", "1")];
    for (version, says) in [("23003", MULTIPLE_2_30_3), ("23007", MULTIPLE_2_30_7)] {
        refused_quoting(&two_on_gpu_1(version, &[], None), says);
        refused_quoting(
            &two_on_gpu_1(version, &[("NCCL_MULTI_RANK_GPU_ENABLE", "0")], None),
            says,
        );
        all_ran(&two_on_gpu_1(version, &enabled, None));
    }
    // 2.29 has no such variable: refused all the same.
    refused_quoting(&two_on_gpu_1("22907", &enabled, None), "Duplicate GPU detected");
}

#[test]
fn nccl_2_30_7_compares_uuids_where_older_versions_compare_bus_ids() {
    // One NCCL_HOSTID on two machines (emulated: NCCL_DOUBLE_HOST), each rank on its
    // machine's GPU 1: one host to NCCL, one bus id, two GPUs.
    let one_host = [("NCCL_HOSTID", "one-host")];
    let machines = Some(("NCCL_DOUBLE_HOST", ["machine-a", "machine-b"]));
    refused_quoting(&two_on_gpu_1("22907", &one_host, machines), "Duplicate GPU detected");
    refused_quoting(&two_on_gpu_1("23004", &one_host, machines), MULTIPLE_2_30_3);
    all_ran(&two_on_gpu_1("23007", &one_host, machines));
}

// ---------------------------------------------------------------------------------
// Which libnccl.

/// A fresh folder under target/ named `name`.
fn folder(name: &str) -> PathBuf {
    let dir = testkit::nccl_double_dir().with_file_name(format!("shared-gpu-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn the_active_environments_nccl_is_taken_before_the_libnccl_so_cudarc_finds() {
    // The loader's path: the CUDA driver, and a libnccl.so (a copy of the double: another
    // library, as an old system libnccl-dev is) that cudarc finds by its own names.
    let system = folder("system");
    for name in ["libcuda.so", "libcuda.so.1"] {
        std::os::unix::fs::symlink(testkit::nccl_double_file(), system.join(name)).unwrap();
    }
    std::fs::copy(testkit::nccl_double_file(), system.join("libnccl.so")).unwrap();
    // `pip install nvidia-nccl-cu12` in the active virtual environment.
    let venv = folder("venv");
    let wheel = venv.join("lib/python3.12/site-packages/nvidia/nccl/lib");
    std::fs::create_dir_all(&wheel).unwrap();
    std::os::unix::fs::symlink(testkit::nccl_double_file(), wheel.join("libnccl.so.2")).unwrap();
    let run = |venv: Option<&PathBuf>| {
        let mut cmd: Command = nccl_command(BIN, &["--backend", "nccl"], 2);
        cmd.env("LD_LIBRARY_PATH", &system)
            .env_remove("NCCL_LIBRARY")
            .env_remove("NCCL_HOME")
            .env_remove("CONDA_PREFIX")
            .env_remove("LD_PRELOAD");
        match venv {
            Some(v) => cmd.env("VIRTUAL_ENV", v),
            None => cmd.env_remove("VIRTUAL_ENV"),
        };
        finish(spawn(cmd), LIMIT)
    };
    let first = |run: &Run| run.stdout.lines().next().unwrap_or_default().to_string();
    let taken = run(Some(&venv)).ok();
    assert_eq!(
        first(&taken),
        format!(
            "backend: nccl, found 2 GPUs and NCCL 2.18.3 ({})",
            testkit::nccl_double_file().display()
        ),
        "{taken}"
    );
    assert!(taken.stdout.contains("Check: OK, all 2 ranks hold 2"), "{taken}");
    // Without the environment, what cudarc finds is the one.
    let system_one = run(None);
    assert!(
        first(&system_one).contains(&system.join("libnccl.so").display().to_string()),
        "{system_one}"
    );
}
