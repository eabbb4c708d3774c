//! How a process learns its role (`launch::resolve`) from the command line and the
//! environment: flags, torchrun's variables, Slurm's, or none (the launcher).

use anyhow::Result;
use clap::Parser;
use common::RunArgs;
use workbook_runtime::launch::{Identity, Role, Source, resolve, slurm_port};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    run: RunArgs,
}

fn role(flags: &[&str], vars: &[(&str, &str)]) -> Result<Role> {
    let cli = Cli::try_parse_from(std::iter::once("x").chain(flags.iter().copied())).unwrap();
    let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    resolve(&cli.run.launch(), &|name| {
        vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    })
}

fn rank(flags: &[&str], vars: &[(&str, &str)]) -> Identity {
    match role(flags, vars).unwrap() {
        Role::Rank(id) => id,
        other => panic!("expected a rank, got {other:?}"),
    }
}

const SLURM: &[(&str, &str)] = &[
    ("SLURM_PROCID", "5"),
    ("SLURM_NTASKS", "8"),
    ("SLURM_LOCALID", "1"),
    ("SLURM_NODEID", "1"),
    ("SLURM_TASKS_PER_NODE", "4(x2)"),
    ("SLURM_JOB_NODELIST", "lrdn[0007-0008]"),
    ("SLURM_JOB_ID", "123456"),
    ("SLURM_STEP_ID", "0"),
];

#[test]
fn flags_beat_torchrun_which_beats_slurm() {
    let torch = [
        ("RANK", "1"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "n1"),
        ("MASTER_PORT", "1234"),
    ];
    let both: Vec<_> = torch.iter().chain(SLURM).copied().collect();
    let id = rank(&["--world-size", "4", "--rank", "3", "--master-port", "999"], &both);
    assert_eq!(
        (id.rank, id.world_size, id.store_port, id.source),
        (3, 4, 999, Source::Flags)
    );
    assert_eq!(id.master_addr, "n1", "MASTER_ADDR still names the master");
    let id = rank(&[], &both);
    assert_eq!((id.rank, id.world_size, id.source), (1, 2, Source::Torchrun));
    let id = rank(&[], SLURM);
    assert_eq!(
        (id.rank, id.world_size, id.local_rank, id.local_world_size),
        (5, 8, Some(1), Some(4))
    );
    assert_eq!((id.master_addr.as_str(), id.source), ("lrdn0007", Source::Slurm));
    assert_eq!(id.store_port, slurm_port("123456", "0"));
    assert_eq!(id.job_id, "slurm-123456.0");
}

#[test]
fn a_step_on_part_of_the_allocation_has_its_master_on_the_steps_first_node() {
    // `srun -N1 -w lrdn0008` inside a two-node job: the step's node hosts rank 0.
    let vars: Vec<_> = SLURM
        .iter()
        .copied()
        .filter(|(k, _)| !["SLURM_PROCID", "SLURM_NTASKS", "SLURM_NODEID", "SLURM_LOCALID"].contains(k))
        .chain([
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_NODEID", "0"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_STEP_NODELIST", "lrdn0008"),
            ("SLURM_STEP_TASKS_PER_NODE", "2"),
        ])
        .collect();
    let id = rank(&[], &vars);
    assert_eq!(id.master_addr, "lrdn0008");
    assert_eq!((id.rank, id.world_size, id.local_world_size), (1, 2, Some(2)));
}

#[test]
fn slurm_master_can_be_overridden_and_ports_differ_by_job() {
    let vars: Vec<_> = SLURM
        .iter()
        .copied()
        .chain([("MASTER_ADDR", "10.0.0.9"), ("MASTER_PORT", "4000")])
        .collect();
    let id = rank(&[], &vars);
    assert_eq!((id.master_addr.as_str(), id.store_port), ("10.0.0.9", 4000));
    let Role::Rank(id) = role(&["--world-size", "1", "--rank", "0", "--master-addr", "[::1]"], &[]).unwrap() else {
        panic!("a rank")
    };
    assert_eq!(id.master_addr, "::1", "brackets are not part of the address");
    assert_ne!(slurm_port("123456", "0"), slurm_port("123457", "0"));
    assert_ne!(slurm_port("123456", "0"), slurm_port("123456", "1"));
    assert!((15000..32000).contains(&slurm_port("4294967295", "99")));
}

#[test]
fn under_torchruns_agent_the_store_takes_the_next_port() {
    let vars = [
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("MASTER_PORT", "12345"),
        ("TORCHELASTIC_USE_AGENT_STORE", "True"),
    ];
    assert_eq!(rank(&[], &vars).store_port, 12346);
}

#[test]
fn nothing_set_means_launching() {
    let Role::Launcher(plan) = role(&["--nproc-per-node", "3"], &[]).unwrap() else {
        panic!()
    };
    assert_eq!((plan.nproc_per_node, plan.nnodes, plan.master_port), (Some(3), 1, None));
    // Under Slurm, an explicit --nproc-per-node launches per node instead.
    assert!(matches!(
        role(&["--nproc-per-node", "2"], SLURM).unwrap(),
        Role::Launcher(_)
    ));
}

#[test]
fn bad_input_is_a_usage_error() {
    let msg = |r: Result<Role>| {
        let e = r.unwrap_err();
        assert!(workbook_runtime::error::is_usage(&e), "{e:#} is not a usage error");
        e.to_string()
    };
    assert!(
        msg(role(&["--world-size", "2", "--rank", "2"], &[]))
            .contains("--rank 2 is not a rank: the world has ranks 0 to 1")
    );
    assert!(msg(role(&[], &[("RANK", "x"), ("WORLD_SIZE", "2")])).contains("RANK=\"x\""));
    assert!(msg(role(&[], &[("RANK", "0")])).contains("RANK is set but WORLD_SIZE is not"));
    let torchrun = &[("RANK", "0"), ("WORLD_SIZE", "2")];
    assert!(msg(role(&["--nproc-per-node", "4"], torchrun)).contains("drop the flag, or run without torchrun"));
    assert!(msg(role(&[], &[("WORLD_SIZE", "2")])).contains("WORLD_SIZE is set but RANK is not"));
    let local = &[
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("LOCAL_RANK", "2"),
        ("LOCAL_WORLD_SIZE", "2"),
    ];
    assert!(msg(role(&[], local)).contains("LOCAL_RANK 2 is not a local rank"));
    assert!(msg(role(&["--nnodes", "2"], &[])).contains("--master-addr"));
    assert!(msg(role(&["--nnodes", "2", "--node-rank", "2"], &[])).contains("outside --nnodes 2"));
    assert!(msg(role(&[], &[("MASTER_PORT", "99999")])).contains("not a port"));
}

#[test]
fn every_start_takes_the_secret_the_environment_gives_and_none_without() {
    // Issue 53, item 4: ranks started by hand, by torchrun or by Slurm have no launcher
    // of this program's to make them a secret: they take the user's, from the environment.
    use workbook_runtime::secret::Secret;
    let secret = ("NCCL_WORKBOOK_SECRET", "s3cret-of-the-job");
    let want = Some(Secret::given("s3cret-of-the-job").unwrap());
    let by_hand = ["--world-size", "2", "--rank", "1"];
    assert_eq!(rank(&by_hand, &[secret]).secret, want);
    assert_eq!(rank(&by_hand, &[]).secret, None);
    let torch = [("RANK", "1"), ("WORLD_SIZE", "2"), secret];
    assert_eq!(rank(&[], &torch).secret, want);
    let slurm: Vec<_> = SLURM.iter().copied().chain([secret]).collect();
    assert_eq!(rank(&[], &slurm).secret, want);
    assert_eq!(rank(&[], SLURM).secret, None);
    // Never shown, not even in a debug print of the rank's identity.
    assert!(!format!("{:?}", rank(&by_hand, &[secret])).contains("s3cret"));
    // One that cannot be a secret is the user's mistake: said, exit 2.
    let e = role(&by_hand, &[("NCCL_WORKBOOK_SECRET", "")]).unwrap_err();
    assert!(workbook_runtime::error::is_usage(&e), "{e:#}");
    assert!(
        e.to_string()
            .starts_with("NCCL_WORKBOOK_SECRET is set but is not a secret"),
        "{e:#}"
    );
}
