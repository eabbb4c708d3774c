//! Devices as the real driver shows them: every GPU has a PCI bus id (the same on every
//! host) and a UUID (unique to its host); `CUDA_VISIBLE_DEVICES` picks and orders them
//! as the CUDA C Programming Guide says; and NCCL's Duplicate GPU rule compares what
//! NCCL compares (host and bus id; from 2.30.5 host and UUID), so ranks that each see
//! their own GPU as device 0 are fine, and two that see one GPU are refused, unless NCCL
//! 2.30's `NCCL_MULTI_RANK_GPU_ENABLE` lets them share it.

mod support;

use support::{Job, all, all_ok, failed_with, fields, finish, probe, spawn};

/// One device line of the `devices` op.
#[derive(Debug, Clone, PartialEq)]
struct Device {
    bus: String,
    uuid: String,
    name: String,
}

/// The `devices` op under `CUDA_VISIBLE_DEVICES=visible` (`None`: unset) and `env`: its
/// first line (what cuInit and then cuDeviceGetCount said) and the devices.
fn devices(visible: Option<&str>, env: &[(&str, &str)]) -> (String, Vec<Device>) {
    let mut cmd = probe(&["--op", "devices"]);
    if let Some(v) = visible {
        cmd.env("CUDA_VISIBLE_DEVICES", v);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let o = finish(0, spawn(cmd));
    assert_eq!(o.code, Some(0), "{o}");
    let mut lines = o.stdout.lines();
    let first = lines.next().unwrap_or_default().to_string();
    let devices = lines
        .map(|l| {
            let (head, name) = l.split_once(" name=").unwrap();
            let f = fields(head);
            assert_eq!(f["uuid_v2_same"], "true", "{o}");
            assert_eq!(f["short_bus_buffer"], "CUDA_ERROR_INVALID_VALUE", "{o}");
            Device {
                bus: f["bus"].to_string(),
                uuid: f["uuid"].to_string(),
                name: name.to_string(),
            }
        })
        .collect();
    (first, devices)
}

#[test]
fn every_gpu_has_a_bus_id_and_a_uuid_of_its_own_host() {
    let (first, all4) = devices(None, &[]);
    assert_eq!(first, "init=CUDA_SUCCESS count=4");
    for (p, d) in all4.iter().enumerate() {
        assert_eq!(d.name, format!("simulated GPU {p} (host memory)"));
        assert_eq!(d.bus, format!("0000:{:02X}:00.0", 0x1B + 0x10 * p));
        // GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, as nvidia-smi -L writes it.
        let parts: Vec<usize> = d.uuid.strip_prefix("GPU-").unwrap().split('-').map(str::len).collect();
        assert_eq!(parts, [8, 4, 4, 4, 12], "{}", d.uuid);
    }
    let mut uuids: Vec<&str> = all4.iter().map(|d| d.uuid.as_str()).collect();
    uuids.sort();
    uuids.dedup();
    assert_eq!(uuids.len(), 4, "{all4:?}");
    // Another emulated host: the same bus ids (identical nodes), other GPUs.
    let (_, there) = devices(None, &[("NCCL_DOUBLE_HOST", "node-b")]);
    let (_, again) = devices(None, &[("NCCL_DOUBLE_HOST", "node-b")]);
    assert_eq!(there, again, "UUIDs are stable on one host");
    for (here, there) in all4.iter().zip(&there) {
        assert_eq!(here.bus, there.bus);
        assert_ne!(here.uuid, there.uuid);
    }
}

#[test]
fn cuda_visible_devices_picks_and_orders_the_gpus_and_stops_at_an_invalid_entry() {
    let (_, gpus) = devices(None, &[]);
    let seen = |visible: &str| -> Vec<Device> {
        let (first, d) = devices(Some(visible), &[]);
        assert_eq!(first, format!("init=CUDA_SUCCESS count={}", d.len()), "{visible}");
        d
    };
    let pick = |ps: &[usize]| -> Vec<Device> { ps.iter().map(|&p| gpus[p].clone()).collect() };
    // Order and physical identity: visible device 0 is GPU 2.
    assert_eq!(seen("2,0"), pick(&[2, 0]));
    // The programming guide's example: -1 is invalid, and so is all that follows.
    assert_eq!(seen("0,2,-1,1"), pick(&[0, 2]));
    // Out of range, and a device listed twice, end the list too.
    assert_eq!(seen("1,4,0"), pick(&[1]));
    assert_eq!(seen("3,3,0"), pick(&[3]));
    // UUIDs, whole or any prefix that names one GPU, mixed with indices.
    assert_eq!(seen(&gpus[3].uuid), pick(&[3]));
    let prefix = &gpus[2].uuid[..12];
    assert!(
        gpus.iter().filter(|g| g.uuid.starts_with(prefix)).count() == 1,
        "{prefix} names one GPU"
    );
    assert_eq!(seen(&format!("{prefix},0")), pick(&[2, 0]));
    assert_eq!(seen(&format!("1,{prefix}")), pick(&[1, 2]));
    // A UUID that names no GPU, or one already listed, ends the list.
    assert_eq!(seen("1,GPU-00000000-dead-beef,0"), pick(&[1]));
    assert_eq!(seen(&format!("1,{}", gpus[1].uuid)), pick(&[1]));
}

#[test]
fn no_visible_gpu_is_cuinit_saying_no_device() {
    for visible in ["", "-1", "4", "GPU-00000000-dead-beef", "x,0"] {
        let (first, d) = devices(Some(visible), &[]);
        // As on a real driver: cuInit fails, and every later call says "not initialized".
        assert_eq!(
            first, "init=CUDA_ERROR_NO_DEVICE count=CUDA_ERROR_NOT_INITIALIZED",
            "CUDA_VISIBLE_DEVICES={visible:?}"
        );
        assert!(d.is_empty());
    }
    // Through cudarc: CudaContext::device_count() is cuInit's error.
    let mut cmd = probe(&["--op", "info"]);
    cmd.env("CUDA_VISIBLE_DEVICES", "");
    let o = finish(0, spawn(cmd));
    assert_eq!(o.code, Some(1), "{o}");
    assert!(
        o.stderr
            .contains("CudaContext::device_count failed: DriverError(CUDA_ERROR_NO_DEVICE"),
        "{o}"
    );
}

#[test]
fn each_rank_given_its_own_gpu_as_device_0_joins() {
    let mut job = Job::new("allreduce", 4).args(&["--count", "2"]);
    for r in 0..4 {
        job = job.rank_env(r, "CUDA_VISIBLE_DEVICES", &r.to_string());
    }
    let outs = job.run();
    all_ok(&outs);
    for o in &outs {
        assert!(
            o.stdout.contains(&format!("rank={} device=0 ", o.rank)),
            "{}",
            all(&outs)
        );
        assert_eq!(o.results(), [vec![10.0, 14.0]], "{}", all(&outs));
    }
}

#[test]
fn two_ranks_whose_device_0_is_one_gpu_are_a_duplicate_gpu_named_by_bus_id() {
    for mode in [&[][..], &["--nonblocking"][..]] {
        let outs = Job::new("allreduce", 2)
            .args(mode)
            .env("CUDA_VISIBLE_DEVICES", "1")
            .run();
        for (r, other) in [(0, 1), (1, 0)] {
            failed_with(
                &outs,
                r,
                "ncclInvalidUsage",
                &format!("Duplicate GPU detected : rank {r} and rank {other} both on CUDA device 0000:2B:00.0"),
            );
        }
    }
    // A rank on a GPU of its own fails alike, naming the pair.
    let outs = Job::new("allreduce", 3)
        .rank_env(0, "CUDA_VISIBLE_DEVICES", "3")
        .rank_env(1, "CUDA_VISIBLE_DEVICES", "0")
        .rank_env(2, "CUDA_VISIBLE_DEVICES", "3")
        .run();
    let pair = "Duplicate GPU detected : rank 0 and rank 2 both on CUDA device 0000:4B:00.0";
    failed_with(&outs, 0, "ncclInvalidUsage", pair);
    failed_with(&outs, 1, "ncclInvalidUsage", pair);
    failed_with(
        &outs,
        2,
        "ncclInvalidUsage",
        "Duplicate GPU detected : rank 2 and rank 0 both on CUDA device 0000:4B:00.0",
    );
}

#[test]
fn the_same_gpu_on_two_emulated_hosts_is_two_gpus() {
    let outs = Job::new("allreduce", 2)
        .env("CUDA_VISIBLE_DEVICES", "1")
        .rank_env(0, "NCCL_DOUBLE_HOST", "node-a")
        .rank_env(1, "NCCL_DOUBLE_HOST", "node-b")
        .run();
    all_ok(&outs);
}

/// The messages of NCCL's `init.cc` for two ranks on one GPU, by version.
const DUPLICATE: &str = "Duplicate GPU detected : rank 0 and rank 1 both on CUDA device 0000:2B:00.0";
const MULTIPLE_2_30_3: &str = "Multiple ranks detected using the same GPU on this node. Set NCCL_MULTI_RANK_GPU_ENABLE=1 to enable this configuration.";
const MULTIPLE_2_30_7: &str =
    "Multiple Ranks are using the same GPU/Partition. Set NCCL_MULTI_RANK_GPU_ENABLE=1 to enable this configuration.";

/// Two ranks on GPU 1, on the double playing `version`, with `env` on both.
fn two_on_gpu_1(version: &str, env: &[(&str, &str)]) -> Vec<support::Out> {
    let mut job = Job::new("allreduce", 2)
        .args(&["--count", "2"])
        .env("CUDA_VISIBLE_DEVICES", "1")
        .env("NCCL_DOUBLE_VERSION", version);
    for (k, v) in env {
        job = job.env(k, v);
    }
    job.run()
}

#[test]
fn nccl_2_30_lets_ranks_share_a_gpu_with_nccl_multi_rank_gpu_enable_and_older_versions_never() {
    let enabled = [("NCCL_MULTI_RANK_GPU_ENABLE", "1")];
    // 2.18 to 2.29 have no such variable: the duplicate is refused all the same.
    for version in ["21803", "22907"] {
        let outs = two_on_gpu_1(version, &enabled);
        failed_with(&outs, 0, "ncclInvalidUsage", DUPLICATE);
    }
    for (version, says) in [("23003", MULTIPLE_2_30_3), ("23007", MULTIPLE_2_30_7)] {
        // Unset, empty or 0 (as strtoll reads it): refused with this version's words.
        for env in [
            &[][..],
            &[("NCCL_MULTI_RANK_GPU_ENABLE", "")],
            &[("NCCL_MULTI_RANK_GPU_ENABLE", "0")],
        ] {
            let outs = two_on_gpu_1(version, env);
            for r in 0..2 {
                failed_with(&outs, r, "ncclInvalidUsage", says);
                failed_with(&outs, r, "ncclInvalidUsage", "(ranks 0 and 1 on ");
            }
        }
        let outs = two_on_gpu_1(version, &enabled);
        all_ok(&outs);
        for o in &outs {
            assert_eq!(o.results(), [vec![3.0, 5.0]], "{version}: {}", all(&outs));
        }
    }
}

#[test]
fn nccl_2_30_7_compares_gpu_uuids_where_older_versions_compare_bus_ids() {
    // One NCCL_HOSTID on two emulated machines: one host to NCCL, and each rank on its
    // machine's GPU 1, two GPUs of one bus id.
    let run = |version: &str| {
        Job::new("allreduce", 2)
            .env("CUDA_VISIBLE_DEVICES", "1")
            .env("NCCL_HOSTID", "one-host")
            .env("NCCL_DOUBLE_VERSION", version)
            .rank_env(0, "NCCL_DOUBLE_HOST", "node-a")
            .rank_env(1, "NCCL_DOUBLE_HOST", "node-b")
            .run()
    };
    failed_with(&run("22907"), 0, "ncclInvalidUsage", DUPLICATE);
    failed_with(&run("23004"), 1, "ncclInvalidUsage", MULTIPLE_2_30_3);
    all_ok(&run("23007"));
}
