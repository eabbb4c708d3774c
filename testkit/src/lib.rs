//! Test helpers: run the workbook's real binaries as multi-process jobs and read what
//! they print. Every run has a hard time limit: a test may fail, never hang.

use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

/// The longest any test run may take: well past the `--timeout` the tests give the
/// programs, so a stuck run ends with the program's own message, not this limit.
pub const LIMIT: Duration = Duration::from_secs(90);

/// The `--timeout` tests give the programs: short enough to fail fast, long enough for a
/// loaded 2-core machine.
pub const TIMEOUT: &str = "20";

/// What a finished run printed, and how it ended.
#[derive(Debug)]
pub struct Run {
    /// Exit code (`None`: killed by a signal).
    pub code: Option<i32>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
    /// Wall time.
    pub elapsed: Duration,
}

impl Run {
    /// The JSON document on stdout (`--format json`), or a panic showing what was printed.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}):\n{self}"))
    }

    /// Panics with the output unless the run exited 0.
    pub fn ok(self) -> Self {
        assert_eq!(self.code, Some(0), "the run failed:\n{self}");
        self
    }
}

impl std::fmt::Display for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {:?} after {:?}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.elapsed, self.stdout, self.stderr
        )
    }
}

/// A command for `bin` with `args`, its environment cleared of anything that would make
/// it a rank of some other job (torchrun's, Slurm's or our launcher's variables).
pub fn command(bin: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(bin);
    cmd.args(args);
    if !args.contains(&"--timeout") {
        cmd.args(["--timeout", TIMEOUT]);
    }
    clear_job_env(&mut cmd);
    cmd
}

/// Starts `cmd` with its output captured.
pub fn spawn(mut cmd: Command) -> Child {
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.spawn().expect("starting the binary")
}

/// Waits for `child` at most `limit`, killing it (and failing the test) past that.
pub fn finish(child: Child, limit: Duration) -> Run {
    let (run, in_time) = finish_or_kill(child, limit);
    if !in_time {
        panic!("the run took longer than {limit:?} and was killed:\n{run}");
    }
    run
}

/// Waits for `child` at most `limit`, killing it past that; says whether it ended in time.
pub fn finish_or_kill(mut child: Child, limit: Duration) -> (Run, bool) {
    let start = Instant::now();
    let mut out = child.stdout.take().expect("piped stdout");
    let mut err = child.stderr.take().expect("piped stderr");
    let out = thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err = thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let (status, in_time) = loop {
        if let Some(status) = child.try_wait().expect("waiting for the binary") {
            break (Some(status), true);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break (None, false);
        }
        thread::sleep(Duration::from_millis(5));
    };
    let run = Run {
        code: status.and_then(|s| s.code()),
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
        elapsed: start.elapsed(),
    };
    (run, in_time)
}

/// Runs `bin args` to the end (at most [`LIMIT`]).
pub fn run(bin: &str, args: &[&str]) -> Run {
    finish(spawn(command(bin, args)), LIMIT)
}

/// Two launchers on this machine as the two nodes of one job (`--nnodes 2`, node ranks
/// 0 and 1, a master on 127.0.0.1 at a free port, JSON output), run to the end together.
/// `make(node, args)` builds node `node`'s command from those arguments.
pub fn two_nodes(make: impl Fn(usize, &[&str]) -> Command) -> [Run; 2] {
    let mut runs = nodes(2, make).into_iter();
    [runs.next().unwrap(), runs.next().unwrap()]
}

/// `count` launchers on this machine as the nodes of one job (`--nnodes count`, node
/// ranks 0 to count - 1, a master on 127.0.0.1 at a free port, JSON output), run to the
/// end together. `make(node, args)` builds node `node`'s command from those arguments
/// (setting `SLURMD_NODENAME` makes each a machine of its own to the ranks).
pub fn nodes(count: usize, make: impl Fn(usize, &[&str]) -> Command) -> Vec<Run> {
    let port = free_port().to_string();
    let total = count.to_string();
    let children: Vec<Child> = (0..count)
        .map(|n| {
            let rank = n.to_string();
            let args = [
                "--nnodes",
                &total,
                "--node-rank",
                &rank,
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                &port,
                "--format",
                "json",
            ];
            spawn(make(n, &args))
        })
        .collect();
    children.into_iter().map(|c| finish(c, LIMIT)).collect()
}

/// The CPU time, user and system, of this process's children that have ended and been
/// waited for (a launcher counts its ranks), from `/proc/self/stat`. Run one such test
/// per test binary: tests in threads of one process share their children's count.
pub fn children_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    // Fields after the command's ')': state is field 3; cutime and cstime are 16 and 17.
    let fields: Vec<&str> = stat[stat.rfind(')').expect("a stat line") + 2..].split(' ').collect();
    let ticks: u64 = fields[13].parse::<u64>().unwrap() + fields[14].parse::<u64>().unwrap();
    // Linux reports these in USER_HZ, 100 per second on every architecture it runs on.
    Duration::from_millis(ticks * 10)
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// NCCL's reduction operators, by the names the programs take (`--op`, `-o`).
pub const OPS: [&str; 5] = ["sum", "prod", "max", "min", "avg"];

/// What NCCL computes for one element from every rank's value, worked out here apart
/// from the workbook's own code (`avg`: the sum over the ranks, divided by their number).
pub fn over(op: &str, values: &[f64]) -> f64 {
    match op {
        "sum" => values.iter().sum(),
        "prod" => values.iter().product(),
        "max" => values.iter().copied().fold(f64::MIN, f64::max),
        "min" => values.iter().copied().fold(f64::MAX, f64::min),
        "avg" => values.iter().sum::<f64>() / values.len() as f64,
        _ => panic!("no operator {op}"),
    }
}

/// The shown elements of every rank at `stage` ("before" or "after") in a JSON report.
pub fn stage(report: &serde_json::Value, stage: &str) -> Vec<Vec<f64>> {
    report["ranks"]
        .as_array()
        .expect("ranks")
        .iter()
        .map(|r| {
            r[stage]
                .as_array()
                .unwrap_or_else(|| panic!("no '{stage}' in {r}"))
                .iter()
                .map(|v| v.as_f64().unwrap())
                .collect()
        })
        .collect()
}

/// The folder that makes the NCCL test double (nccl-double/) the CUDA driver and NCCL
/// of a process: one library linked under the names cudarc loads. Built once, in release
/// mode, by the cargo running these tests.
pub fn nccl_double_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace");
        // This test runs as <target>/<profile>/deps/<name>: find <target> from it.
        let exe = std::env::current_exe().expect("the test's own path");
        let target = exe.ancestors().nth(3).expect("the target folder").to_path_buf();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "--quiet", "--release", "-p", "nccl-double", "--manifest-path"])
            .arg(workspace.join("Cargo.toml"))
            .env("CARGO_TARGET_DIR", &target)
            .status()
            .expect("running cargo to build the NCCL test double");
        assert!(status.success(), "building the NCCL test double failed");
        let lib = target.join("release/libnccl_double.so");
        let dir = target.join("nccl-double-lib");
        std::fs::create_dir_all(&dir).unwrap();
        // Symlinks, not copies: glibc must see one library, so the NCCL half shares the
        // CUDA half's state (the current context, the allocations).
        for name in ["libcuda.so", "libcuda.so.1", "libnccl.so", "libnccl.so.2"] {
            let link = dir.join(name);
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(&lib, &link).unwrap();
        }
        dir
    })
}

/// The NCCL test double's one library file, as the loader sees it (links resolved): the
/// file a program on the double names as the NCCL it loaded.
pub fn nccl_double_file() -> PathBuf {
    nccl_double_dir()
        .join("libnccl.so")
        .canonicalize()
        .expect("the NCCL test double's library")
}

/// A command for `bin` that runs on the NCCL test double with `gpus` devices: the double
/// first on `LD_LIBRARY_PATH` (read when the process starts, so it is set here, for the
/// child), and `NCCL_DOUBLE=1`, without which the double refuses to act.
pub fn nccl_command(bin: &str, args: &[&str], gpus: usize) -> Command {
    let mut cmd = command(bin, args);
    cmd.env("LD_LIBRARY_PATH", nccl_double_dir())
        .env("NCCL_DOUBLE", "1")
        .env("NCCL_DOUBLE_DEVICES", gpus.to_string())
        .env_remove("NCCL_DOUBLE_HOST");
    // What the library search takes before the loader's path (an NCCL chosen by hand, the
    // active environment's wheel): a test run inside a venv with a real NCCL must still
    // load the double.
    for chosen in ["NCCL_LIBRARY", "NCCL_HOME", "VIRTUAL_ENV", "CONDA_PREFIX"] {
        cmd.env_remove(chosen);
    }
    cmd
}

/// A small deterministic random generator (xorshift64) for property tests and soaks: the
/// same seed gives the same sequence everywhere, so a failure can be replayed.
pub struct Xorshift(pub u64);

impl Xorshift {
    /// A number from 0 to `n - 1`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// The calls rank `rank` showed with `--show-calls`, in order: what follows `rank R │ ` on
/// each of its lines of `out`.
pub fn calls(out: &str, rank: usize) -> Vec<String> {
    let prefix = format!("rank {rank} │ ");
    out.lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .map(str::to_string)
        .collect()
}

unsafe extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

/// Sends signal `sig` (9: SIGKILL, 19: SIGSTOP) to process `pid`, as a dead or frozen node
/// would be played; whether it was sent.
pub fn signal(pid: u32, sig: i32) -> bool {
    // SAFETY: kill(2) takes any pid and signal number and touches no memory of ours.
    unsafe { libc_kill(pid as i32, sig) == 0 }
}

/// The child processes of `pid` now (a launcher's: its ranks, in the order it started
/// them), from `/proc`.
pub fn children(pid: u32) -> Vec<u32> {
    let kids = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    kids.split_whitespace().filter_map(|k| k.parse().ok()).collect()
}

/// Process `pid`'s state letter from `/proc/PID/stat` (`R`, `S`, `T`, `Z`...), or `None`
/// when there is no such process.
pub fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')').next()?.split_whitespace().next()?.chars().next()
}

/// Whether process `pid` is over: gone, or a zombie waiting to be reaped (never still running).
pub fn ended(pid: u32) -> bool {
    matches!(process_state(pid), None | Some('Z'))
}

/// Removes from `cmd`'s environment anything that would make it a rank of some other job
/// (torchrun's, Slurm's or our launcher's variables), as [`command`] does.
pub fn clear_job_env(cmd: &mut Command) {
    for k in std::env::vars_os().filter_map(|(k, _)| k.into_string().ok()) {
        let launcher_var = [
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "LOCAL_WORLD_SIZE",
            "MASTER_ADDR",
            "MASTER_PORT",
            "NO_COLOR",
        ]
        .contains(&k.as_str());
        if launcher_var || k.starts_with("SLURM_") || k.starts_with("TORCHELASTIC_") || k.starts_with("NCCL_WORKBOOK_")
        {
            cmd.env_remove(k);
        }
    }
}

/// What a test needs of the machine that some machines lack: [`skip`] names it, and
/// `NCCL_WORKBOOK_TESTS_REQUIRE` (a comma-separated list of these names, or `all`) makes
/// its absence a failure where the run's machine is known to have it (`.ci/run` probes
/// its own and sets the list).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Capability {
    /// `mkfifo`, to put a FIFO where a file is expected.
    Fifo,
    /// `/dev/full`, a device whose every write fails with ENOSPC.
    DevFull,
    /// A user the permissions bind (not root), so that a read-only folder refuses a write.
    ReadOnlyFolders,
    /// `unshare -p -f --mount-proc`: a new pid namespace, as a container has.
    PidNamespaces,
    /// A hard limit of open files of 1024 or more, to raise a low soft limit to.
    OpenFiles,
}

impl Capability {
    /// The name `NCCL_WORKBOOK_TESTS_REQUIRE` lists.
    pub fn name(self) -> &'static str {
        match self {
            Capability::Fifo => "fifo",
            Capability::DevFull => "dev-full",
            Capability::ReadOnlyFolders => "read-only-folders",
            Capability::PidNamespaces => "pid-namespaces",
            Capability::OpenFiles => "open-files",
        }
    }
}

/// A case this machine cannot run: said where a person sees it, past libtest's capture of
/// `print!` (a skipped case must not pass in silence), or a failure when
/// `NCCL_WORKBOOK_TESTS_REQUIRE` says the machine has `what`.
pub fn skip(what: Capability, why: &str) {
    use std::io::Write;
    let required = std::env::var("NCCL_WORKBOOK_TESTS_REQUIRE").unwrap_or_default();
    if required
        .split(',')
        .map(str::trim)
        .any(|r| r == "all" || r == what.name())
    {
        panic!(
            "{why}; but NCCL_WORKBOOK_TESTS_REQUIRE says this machine has {}: the test's own \
             probe is wrong, or the machine changed",
            what.name()
        );
    }
    let test = thread::current().name().unwrap_or("a test").to_string();
    // Straight to the process's stderr: libtest captures the print! macros, not this.
    let _ = writeln!(std::io::stderr(), "SKIPPED part of {test} ({}): {why}", what.name());
}
