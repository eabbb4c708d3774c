//! Hello world with --backend nccl on the NCCL test double (nccl-double/), and the
//! rules of NCCL that the project must respect, each broken on purpose.

use testkit::{LIMIT, Run, command, finish, nccl_command, spawn};

const BIN: &str = env!("CARGO_BIN_EXE_00-nccl-hello-world");

#[test]
fn hello_on_1_2_and_4_gpus_shows_nccls_version_and_each_gpu() {
    for world in [1usize, 2, 4] {
        let w = world.to_string();
        let r = finish(
            spawn(nccl_command(
                BIN,
                &["--backend", "nccl", "--nproc-per-node", &w, "--format", "json"],
                4,
            )),
            LIMIT,
        )
        .ok();
        let j = r.json();
        assert_eq!(j["nccl_version"], "2.18.3", "{r}");
        for (rank, info) in j["ranks"].as_array().unwrap().iter().enumerate() {
            assert_eq!(info["device"], format!("cuda:{rank}"), "{r}");
            assert_eq!(
                info["device_name"],
                format!("simulated GPU {rank} (host memory)"),
                "{r}"
            );
        }
    }
    let r = finish(spawn(nccl_command(BIN, &["--nproc-per-node", "2"], 2)), LIMIT).ok();
    assert!(
        r.stdout.starts_with("backend: nccl, found 2 GPUs and NCCL 2.18.3 (")
            && r.stdout.contains("cuda:1 (simulated GPU 1"),
        "{r}"
    );
}

#[test]
fn by_default_one_rank_per_gpu_like_torchrun() {
    let r = finish(spawn(nccl_command(BIN, &["--format", "json"], 3)), LIMIT).ok();
    assert_eq!(r.json()["world_size"], 3, "{r}");
}

#[test]
fn more_ranks_than_gpus_is_refused_before_nccl_is_called() {
    let r = finish(
        spawn(nccl_command(BIN, &["--backend", "nccl", "--nproc-per-node", "3"], 2)),
        LIMIT,
    );
    assert_eq!(r.code, Some(2), "{r}");
    // Ranks 0 and 2 both take device 0 (rank % 2): the same GPU, by its UUID.
    assert!(
        r.stderr.contains("ranks 0 and 2 are both on GPU GPU-")
            && r.stderr.contains("NCCL refuses two ranks on one GPU"),
        "{r}"
    );
    assert!(
        !r.stderr.contains("nccl-double WARN"),
        "NCCL must not have been called:\n{r}"
    );
}

/// Two launchers on this machine as two nodes of 2 ranks on 2 GPUs each: ranks 0 and 2
/// both take device 0 (rank % device_count). `host` gives each launcher a host name.
fn two_nodes(host: [&str; 2]) -> [Run; 2] {
    testkit::two_nodes(|n, args| {
        let mut cmd = nccl_command(BIN, &[&["--backend", "nccl"], args].concat(), 2);
        cmd.env("NCCL_DOUBLE_HOST", host[n]);
        cmd
    })
}

#[test]
fn two_nodes_of_two_gpus_map_ranks_cyclically() {
    let [a, _] = two_nodes(["node-a", "node-b"]);
    let j = a.ok().json();
    let devices: Vec<&str> = j["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["device"].as_str().unwrap())
        .collect();
    assert_eq!(devices, ["cuda:0", "cuda:1", "cuda:0", "cuda:1"]);
}

#[test]
fn rule_two_ranks_of_one_host_on_one_gpu_is_nccls_duplicate_gpu() {
    // Both "nodes" on one host: ranks 0 and 2 share GPU 0, which NCCL refuses; the
    // workbook compares the GPUs first and names the pair (before NCCL would).
    let [a, b] = two_nodes(["same-host", "same-host"]);
    let all = format!("{a}\n{b}");
    assert_eq!(a.code, Some(2), "{all}");
    assert!(
        a.stderr.contains("ranks 0 and 2 are both on GPU GPU-")
            && a.stderr.contains("(simulated GPU 0 (host memory), PCI bus "),
        "{all}"
    );
}

#[test]
fn the_double_refuses_to_act_unless_asked() {
    let mut cmd = command(BIN, &["--backend", "auto"]);
    cmd.env("LD_LIBRARY_PATH", testkit::nccl_double_dir());
    let r = finish(spawn(cmd), LIMIT).ok();
    assert!(
        r.stderr
            .contains("nccl-double: refusing to act as CUDA/NCCL: NCCL_DOUBLE=1 is not set"),
        "{r}"
    );
    assert!(
        r.stdout
            .starts_with("backend: cpu, because the CUDA driver sees no GPU"),
        "{r}"
    );
}

/// A folder under target/ holding the double under exactly the names given.
fn folder(name: &str, names: &[&str]) -> std::path::PathBuf {
    let lib = testkit::nccl_double_file();
    let dir = testkit::nccl_double_dir().with_file_name(format!("nccl-double-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for n in names {
        std::os::unix::fs::symlink(&lib, dir.join(n)).unwrap();
    }
    dir
}

fn backend_line(ld_path: &std::path::Path, nccl_library: Option<std::path::PathBuf>) -> Run {
    let mut cmd = nccl_command(BIN, &[], 2);
    cmd.env("LD_LIBRARY_PATH", ld_path);
    if let Some(file) = nccl_library {
        cmd.env("NCCL_LIBRARY", file);
    }
    finish(spawn(cmd), LIMIT).ok()
}

#[test]
fn libnccl_is_found_where_real_installs_put_it() {
    // Only the runtime's name, libnccl.so.2, which cudarc never looks for.
    let r = backend_line(&folder("so2", &["libcuda.so", "libnccl.so.2"]), None);
    assert!(
        r.stdout.starts_with("backend: nccl, found 2 GPUs and NCCL 2.18.3"),
        "{r}"
    );
    // A specific file named by NCCL_LIBRARY, nowhere on the path.
    let named = folder("named", &["libnccl.so.2.18.3"]).join("libnccl.so.2.18.3");
    let cuda_only = folder("cuda-only", &["libcuda.so"]);
    let r = backend_line(&cuda_only, Some(named));
    assert!(
        r.stdout.starts_with("backend: nccl, found 2 GPUs and NCCL 2.18.3"),
        "{r}"
    );
    // None at all: the CPU backend runs, and the line says what is missing.
    let r = backend_line(&cuda_only, None);
    assert!(
        r.stdout
            .starts_with("backend: cpu, because found 2 GPUs but no libnccl"),
        "{r}"
    );
}
