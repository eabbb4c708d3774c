//! One rank per GPU: every rank's GPU is compared through the store before NCCL is asked
//! for anything, as NCCL compares them, and two ranks on one GPU are refused in one line
//! that names both ranks and the GPU, quotes the loaded NCCL's message, and names the
//! placement when it is the cause. "One GPU" is NCCL's rule: the same GPU on the same host
//! as NCCL tells hosts apart (`NCCL_HOSTID`, else the machine), so ranks that each set their
//! own `NCCL_HOSTID` may share a GPU as NCCL's nodes of one GPU each (`bench/gpu-nodes.sh`
//! rehearses a cluster so on one GPU). Refused only where the loaded NCCL refuses
//! (`src/init.cc`, see [`Rule`]): 2.30 lets ranks share a GPU with
//! `NCCL_MULTI_RANK_GPU_ENABLE=1`. Shared by the workbook's NCCL backend and by lesson 08,
//! which calls NCCL itself, so that both refuse the same jobs alike.

use super::LOCAL_RANK_RULE;
use crate::error::SharedError;
use crate::rendezvous::Store;
use anyhow::{Result, anyhow};
use cudarc::driver::CudaContext;
use serde::{Deserialize, Serialize};
use std::ffi::{CStr, c_char, c_int};
use std::sync::Arc;

/// A physical GPU, as NCCL tells GPUs apart: the same device number on two ranks may be
/// two GPUs (each Slurm task sees its own GPU as device 0), two ranks on one GPU is an error.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Gpu {
    /// The host the rank runs on.
    pub host: String,
    /// The host as NCCL tells hosts apart (its `getHostHash`): `NCCL_HOSTID` if set, else
    /// the machine's name and boot id; emulated nodes (`SLURMD_NODENAME`) do not change it.
    pub nccl_host: String,
    /// The GPU's UUID, as `nvidia-smi -L` prints it (`GPU-8f2c...`): unique in the world.
    pub uuid: String,
    /// The GPU's PCI bus id (`0000:1B:00.0`): what NCCL compares on one host.
    pub bus_id: String,
    /// The GPU's name (`NVIDIA A100-SXM4-64GB`).
    pub name: String,
    /// The device number the rank opened it as (`cuda:N`).
    pub device: usize,
    /// How many GPUs the rank's process sees (its `device_count`).
    pub devices: usize,
    /// The NCCL version the rank loaded, as its code (21803 is 2.18.3; 0 if unknown).
    pub nccl_version: u32,
    /// Whether the rank's NCCL 2.30 lets ranks share a GPU (`NCCL_MULTI_RANK_GPU_ENABLE`).
    pub multi_rank_gpu: bool,
}

impl Gpu {
    /// Whether the rank's NCCL host is `NCCL_HOSTID` rather than the machine.
    fn hostid_set(&self) -> bool {
        self.nccl_host.starts_with("NCCL_HOSTID=")
    }
}

/// How a version of NCCL finds two ranks on one GPU (`src/init.cc`), and what it says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// 2.18 to 2.29: the same PCI bus id on one host is refused, each rank comparing its
    /// own with every rank's: "Duplicate GPU detected : rank R and rank I both on CUDA
    /// device B".
    Duplicate,
    /// 2.30.3 and 2.30.4 (`ncclCheckMultiRank`, `src/graph/topo.cc`): the same bus id on
    /// one host, refused by the host's first rank unless its `NCCL_MULTI_RANK_GPU_ENABLE`
    /// is not 0.
    BusId,
    /// 2.30.7 (taken from 2.30.5): the same UUID (`cuDeviceGetUuid`: a GPU's partitions are
    /// GPUs of their own) on one host, refused by every rank whose
    /// `NCCL_MULTI_RANK_GPU_ENABLE` is 0, all pairs compared.
    Uuid,
}

impl Rule {
    /// The rule of NCCL `version` (a code: 23007 is 2.30.7).
    pub fn of(version: u32) -> Rule {
        match version {
            ..23000 => Rule::Duplicate,
            23000..23005 => Rule::BusId,
            _ => Rule::Uuid,
        }
    }

    /// NCCL's words when it refuses (its `WARN`; 2.18 to 2.29's begins with these).
    pub fn says(self) -> &'static str {
        match self {
            Rule::Duplicate => "Duplicate GPU detected",
            Rule::BusId => {
                "Multiple ranks detected using the same GPU on this node. Set NCCL_MULTI_RANK_GPU_ENABLE=1 to enable \
                 this configuration."
            }
            Rule::Uuid => {
                "Multiple Ranks are using the same GPU/Partition. Set NCCL_MULTI_RANK_GPU_ENABLE=1 to enable this \
                 configuration."
            }
        }
    }

    /// Whether NCCL sees `a` and `b` on one GPU. NCCL hashes the host (`NCCL_HOSTID`, else
    /// the machine) and compares bus ids, or from 2.30.5 UUIDs. Without `NCCL_HOSTID` the
    /// host is one machine, whose bus ids name its GPUs: the UUIDs must match too, which
    /// changes nothing there (but MIG instances, left to NCCL) and keeps apart the
    /// simulator's emulated nodes, whose GPUs have the bus ids of identical nodes.
    fn same_gpu(self, a: &Gpu, b: &Gpu) -> bool {
        a.nccl_host == b.nccl_host
            && match self {
                Rule::Uuid => a.uuid == b.uuid,
                _ => a.bus_id == b.bus_id && (a.hostid_set() || a.uuid == b.uuid),
            }
    }
}

/// A GPU's primary context, held open: for a lesson that calls NCCL itself (`common::meet`
/// opens it and checks that no other rank has the GPU, and the lesson's own
/// `CudaContext::new` then takes the same primary context). Opaque, so that the layers
/// above the NCCL backend never name cudarc.
pub struct OpenGpu(Arc<CudaContext>);

impl OpenGpu {
    /// Opens device `device` (cudarc's `CudaContext::new`: its primary context, current on
    /// this thread).
    pub fn open(device: usize) -> Result<OpenGpu> {
        Ok(OpenGpu(CudaContext::new(device)?))
    }

    /// Its identity, as [`identify`] reads it.
    pub fn identify(&self, host: &str) -> Result<Gpu> {
        identify(&self.0, host)
    }
}

/// The identity of the context's GPU: UUID, PCI bus id, name, and its number here.
pub fn identify(ctx: &CudaContext, host: &str) -> Result<Gpu> {
    let uuid = ctx.uuid().map_err(|e| anyhow!("cuDeviceGetUuid: {e:?}"))?;
    let b: Vec<u8> = uuid.bytes.iter().map(|c| *c as u8).collect();
    let hex = |r: std::ops::Range<usize>| b[r].iter().map(|x| format!("{x:02x}")).collect::<String>();
    let uuid = format!(
        "GPU-{}-{}-{}-{}-{}",
        hex(0..4),
        hex(4..6),
        hex(6..8),
        hex(8..10),
        hex(10..16)
    );
    let mut bus = [0 as c_char; 32];
    // SAFETY: a buffer of 32 bytes for a NUL-terminated id of 13.
    let r = unsafe { cudarc::driver::sys::cuDeviceGetPCIBusId(bus.as_mut_ptr(), bus.len() as c_int, ctx.cu_device()) };
    if r != cudarc::driver::sys::cudaError_enum::CUDA_SUCCESS {
        return Err(anyhow!("cuDeviceGetPCIBusId: {r:?}"));
    }
    // SAFETY: the driver wrote a NUL-terminated string.
    let bus_id = unsafe { CStr::from_ptr(bus.as_ptr()) }.to_string_lossy().into_owned();
    let name = ctx.name().unwrap_or_else(|e| format!("(unknown: {e:?})"));
    let devices = CudaContext::device_count().map_err(|e| anyhow!("cuDeviceGetCount: {e:?}"))?;
    let env = |name: &str| std::env::var_os(name);
    let read = |file: &std::path::Path| std::fs::read(file).ok();
    Ok(Gpu {
        host: host.to_string(),
        nccl_host: nccl_host(),
        uuid,
        bus_id,
        name,
        device: ctx.ordinal(),
        devices: devices.max(0) as usize,
        nccl_version: nccl_version(),
        multi_rank_gpu: crate::nccl_env::setting("NCCL_MULTI_RANK_GPU_ENABLE", &env, &read)
            .and_then(|v| crate::nccl_env::strtoll(&v))
            .is_some_and(|v| v != 0),
    })
}

/// The version code of the NCCL this process loads (0 if none is loadable).
fn nccl_version() -> u32 {
    if !crate::nccl_library::cudarc_finds_nccl() {
        return 0;
    }
    cudarc::nccl::result::get_nccl_version().map_or(0, |v| v.max(0) as u32)
}

/// This process's host as NCCL's `getHostHash` reads it (`src/misc/utils.cc`, 2.18 to
/// 2.30): `NCCL_HOSTID`, else the hostname followed by the kernel's boot id.
fn nccl_host() -> String {
    if let Some(id) = std::env::var_os("NCCL_HOSTID") {
        return format!("NCCL_HOSTID={}", id.to_string_lossy());
    }
    let read = |f: &str| {
        std::fs::read_to_string(f)
            .map(|t| t.trim().to_string())
            .unwrap_or_default()
    };
    read("/proc/sys/kernel/hostname") + &read("/proc/sys/kernel/random/boot_id")
}

/// The first two ranks that the loaded NCCL (rank 0's) sees on one GPU of one host and
/// refuses, if any ([`Rule`]).
pub fn duplicate(gpus: &[Gpu]) -> Option<(usize, usize)> {
    let rule = Rule::of(gpus.first()?.nccl_version);
    let first_of_host = |a: usize| gpus.iter().find(|g| g.nccl_host == gpus[a].nccl_host);
    let refused = |a: usize| match rule {
        Rule::Duplicate => true,
        Rule::BusId => first_of_host(a).is_some_and(|g| !g.multi_rank_gpu),
        Rule::Uuid => gpus.iter().any(|g| !g.multi_rank_gpu),
    };
    (0..gpus.len()).find_map(|a| {
        (a + 1..gpus.len())
            .find(|&b| rule.same_gpu(&gpus[a], &gpus[b]) && refused(a))
            .map(|b| (a, b))
    })
}

/// Shares this rank's GPU with every rank through the store, and refuses two ranks on
/// one GPU before NCCL does: bad input that every rank meets alike (exit 2).
pub fn one_rank_per_gpu(store: &mut Store, (rank, world): (usize, usize), gpu: &Gpu) -> Result<()> {
    let gpus: Vec<Gpu> = store.share_json("nccl/gpu", rank, world, gpu, "every rank's GPU")?;
    match duplicate(&gpus) {
        None => Ok(()),
        Some((a, b)) => Err(SharedError {
            message: refusal(&gpus, a, b),
            usage: true,
        }
        .into()),
    }
}

/// Why ranks `a` and `b` may not share their GPU, and what to do instead.
fn refusal(gpus: &[Gpu], a: usize, b: usize) -> String {
    let g = &gpus[a];
    let rule = Rule::of(gpus[0].nccl_version);
    let both = format!(
        "ranks {a} and {b} are both on GPU {} ({}, PCI bus {}) of host {}: NCCL refuses two ranks on one GPU \
         (\"{}\")",
        g.uuid,
        g.name,
        g.bus_id,
        g.host,
        rule.says()
    );
    let share = match rule {
        Rule::Duplicate => ", or NCCL 2.30 or later with NCCL_MULTI_RANK_GPU_ENABLE=1",
        _ => ", let them share it (NCCL_MULTI_RANK_GPU_ENABLE=1 on every rank)",
    };
    match cyclic(gpus, a, b) {
        Some((la, lb)) => format!(
            "{both}; the placement is cyclic-like (ranks {a} and {b} are local ranks {la} and {lb} of host {}, so \
             rank % device_count is not the local rank here, as with srun --distribution=cyclic): {LOCAL_RANK_RULE} \
             picks device = local_rank % device_count instead, one GPU per rank of a host",
            g.host
        ),
        None => format!(
            "{both}; start at most one rank per GPU (--nproc-per-node, or --ntasks-per-node, no more than the \
             node's GPUs; srun --gpus-per-task=1 gives each its own but hides NVLink from it: \
             docs/nccl-backend.md, \"One GPU per task\"){share}, or use --backend cpu (to play \
             nodes of one GPU each on one GPU, give each node its own NCCL_HOSTID: bench/gpu-nodes.sh)"
        ),
    }
}

/// The local ranks of `a` and `b` when the placement is what put them on one GPU: both
/// took `rank % device_count`, and `local_rank % device_count` would have given them
/// two. The local rank is each rank's position among the ranks of its host.
fn cyclic(gpus: &[Gpu], a: usize, b: usize) -> Option<(usize, usize)> {
    let local = |r: usize| (0..r).filter(|o| gpus[*o].host == gpus[r].host).count();
    let (ga, gb) = (&gpus[a], &gpus[b]);
    let (la, lb) = (local(a), local(b));
    let by_rank = ga.device == a % ga.devices.max(1) && gb.device == b % gb.devices.max(1);
    let apart = la % ga.devices.max(1) != lb % gb.devices.max(1);
    (ga.host == gb.host && by_rank && apart).then_some((la, lb))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(host: &str, uuid: &str, device: usize) -> Gpu {
        Gpu {
            host: host.into(),
            nccl_host: "box".into(),
            uuid: uuid.into(),
            bus_id: "0000:1B:00.0".into(),
            name: "A100".into(),
            device,
            devices: 2,
            nccl_version: 21803,
            multi_rank_gpu: false,
        }
    }

    #[test]
    fn two_ranks_on_one_gpu_are_found_by_uuid_not_device_number() {
        // Slurm's per-task binding: four tasks, each sees its own GPU as device 0.
        let per_task = ["GPU-a", "GPU-b", "GPU-c", "GPU-d"].map(|u| gpu("n1", u, 0));
        assert_eq!(duplicate(&per_task), None);
        let shared = [gpu("n1", "GPU-a", 0), gpu("n1", "GPU-b", 1), gpu("n1", "GPU-a", 0)];
        assert_eq!(duplicate(&shared), Some((0, 2)));
        // Three ranks on one node of two GPUs: no placement helps, so none is blamed.
        let e = refusal(&shared, 0, 2);
        assert!(e.contains("start at most one rank per GPU"), "{e}");
        assert!(!e.contains("cyclic"), "{e}");
    }

    #[test]
    fn a_cyclic_placement_is_named_with_the_option_that_fixes_it() {
        // Ranks 0, 2 on node a, 1, 3 on node b, each by rank % 2.
        let cyclic = [
            gpu("a", "GPU-a0", 0),
            gpu("b", "GPU-b1", 1),
            gpu("a", "GPU-a0", 0),
            gpu("b", "GPU-b1", 1),
        ];
        assert_eq!(duplicate(&cyclic), Some((0, 2)));
        let e = refusal(&cyclic, 0, 2);
        assert!(
            e.contains("the placement is cyclic-like (ranks 0 and 2 are local ranks 0 and 1 of host a"),
            "{e}"
        );
        assert!(e.contains("--device-rule local-rank"), "{e}");
    }

    #[test]
    fn ranks_that_nccl_sees_on_two_hosts_may_share_a_gpu() {
        // NCCL_HOSTID set per node: NCCL's hash differs, so its rule passes, and ours.
        let mut a = gpu("node-0", "GPU-a", 0);
        let mut b = gpu("node-1", "GPU-a", 0);
        assert_eq!(
            duplicate(&[a.clone(), b.clone()]),
            Some((0, 1)),
            "emulated nodes alone are one host to NCCL"
        );
        a.nccl_host = "NCCL_HOSTID=node-0".into();
        b.nccl_host = "NCCL_HOSTID=node-1".into();
        assert_eq!(duplicate(&[a, b]), None);
    }

    /// Two ranks on GPU 0 of a machine each (bus id 0000:1B:00.0, UUIDs `GPU-a`, `GPU-b`)
    /// with one `NCCL_HOSTID`, and NCCL `version`.
    fn one_hostid(version: u32) -> [Gpu; 2] {
        [("n1", "GPU-a"), ("n2", "GPU-b")].map(|(host, uuid)| Gpu {
            nccl_host: "NCCL_HOSTID=x".into(),
            nccl_version: version,
            ..gpu(host, uuid, 0)
        })
    }

    #[test]
    fn each_version_compares_what_its_init_cc_compares() {
        assert_eq!(
            [21803, 22907, 23000, 23004, 23005, 23007].map(Rule::of),
            [
                Rule::Duplicate,
                Rule::Duplicate,
                Rule::BusId,
                Rule::BusId,
                Rule::Uuid,
                Rule::Uuid
            ]
        );
        // One NCCL host, one bus id, two GPUs: up to 2.30.4 one GPU, from 2.30.5 two.
        assert_eq!(duplicate(&one_hostid(22907)), Some((0, 1)));
        assert_eq!(duplicate(&one_hostid(23004)), Some((0, 1)));
        assert_eq!(duplicate(&one_hostid(23007)), None);
        // Without NCCL_HOSTID, one machine: its bus ids are its GPUs (the simulator's
        // emulated nodes have the bus ids of identical nodes, and UUIDs of their own).
        let nodes = [gpu("a", "GPU-a", 0), gpu("b", "GPU-b", 0)];
        for v in [21803, 23004, 23007] {
            assert_eq!(
                duplicate(&nodes.clone().map(|g| Gpu { nccl_version: v, ..g })),
                None,
                "{v}"
            );
        }
        let e = refusal(&one_hostid(22907), 0, 1);
        assert!(
            e.contains("NCCL refuses two ranks on one GPU (\"Duplicate GPU detected\")"),
            "{e}"
        );
        assert!(
            e.contains("or NCCL 2.30 or later with NCCL_MULTI_RANK_GPU_ENABLE=1"),
            "{e}"
        );
        let e = refusal(&one_hostid(23004), 0, 1);
        assert!(
            e.contains(
                "(\"Multiple ranks detected using the same GPU on this node. Set NCCL_MULTI_RANK_GPU_ENABLE=1 to \
                 enable this configuration.\")"
            ),
            "{e}"
        );
    }

    #[test]
    fn nccl_2_30_lets_ranks_share_a_gpu_where_its_variable_says_so() {
        let shared = |version: u32, enabled: [bool; 3]| {
            let mut gpus = [gpu("n1", "GPU-a", 0), gpu("n1", "GPU-b", 1), gpu("n1", "GPU-a", 0)];
            for (g, on) in gpus.iter_mut().zip(enabled) {
                (g.nccl_version, g.multi_rank_gpu) = (version, on);
            }
            duplicate(&gpus)
        };
        // 2.18 to 2.29 have no such variable.
        assert_eq!(shared(22907, [true; 3]), Some((0, 2)));
        for v in [23003, 23007] {
            assert_eq!(shared(v, [true; 3]), None, "{v}");
            assert_eq!(shared(v, [false; 3]), Some((0, 2)), "{v}");
        }
        // 2.30.3: the host's first rank decides; 2.30.7: every rank refuses for itself.
        assert_eq!(shared(23003, [true, false, false]), None);
        assert_eq!(shared(23003, [false, true, true]), Some((0, 2)));
        assert_eq!(shared(23007, [true, false, true]), Some((0, 2)));
        let mut gpus = [gpu("n1", "GPU-a", 0), gpu("n1", "GPU-a", 0)];
        gpus.iter_mut().for_each(|g| g.nccl_version = 23007);
        let e = refusal(&gpus, 0, 1);
        assert!(
            e.contains(
                "(\"Multiple Ranks are using the same GPU/Partition. Set NCCL_MULTI_RANK_GPU_ENABLE=1 to enable this \
                 configuration.\")"
            ) && e.contains("let them share it (NCCL_MULTI_RANK_GPU_ENABLE=1 on every rank)"),
            "{e}"
        );
    }
}
