//! Test helpers: the folder that makes the double the CUDA driver and NCCL of a child
//! process, and jobs of probe processes (one per rank) with a hard time limit.

#![allow(dead_code)]

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The probe (a fixture of this package).
pub const PROBE: &str = env!("CARGO_BIN_EXE_nccl-double-probe");

/// The longest a process may run before it is killed (and the test fails).
pub const LIMIT: Duration = Duration::from_secs(30);

/// The double that cargo built for these tests. `cargo test` builds the package's
/// library (as rlib and cdylib at once) into `<target>/<profile>/deps/`, next to the
/// probe's folder; `cargo build` also copies it up beside the probe. The newer wins.
pub fn library() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let dir = Path::new(PROBE).parent().unwrap();
        let newest = [dir.join("deps/libnccl_double.so"), dir.join("libnccl_double.so")]
            .into_iter()
            .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
            .max();
        newest
            .unwrap_or_else(|| panic!("no libnccl_double.so in {} or its deps/", dir.display()))
            .1
    })
}

/// A folder holding the double under the names cudarc loads: four symlinks to the one
/// library. Symlinks, not copies: glibc must map one library, so the NCCL half shares
/// the CUDA half's state.
pub fn lib_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| link_dir("lib", &["libcuda.so", "libcuda.so.1", "libnccl.so", "libnccl.so.2"]))
}

/// A folder under target/tmp with the double linked under exactly `names`.
pub fn link_dir(name: &str, names: &[&str]) -> PathBuf {
    let lib = library();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("nccl-double-{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    for n in names {
        // Made under a temporary name, then renamed over: safe when test binaries race.
        let tmp = dir.join(format!(".{n}.{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(lib, &tmp).unwrap();
        std::fs::rename(&tmp, dir.join(n)).unwrap();
    }
    dir
}

/// Where single probes (not [`Job`]s) meet: under target/tmp, so that no test ever
/// writes to /dev/shm (rooms there are removed by the last rank to leave).
pub fn meet_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("nccl-double-meet");
        std::fs::create_dir_all(&dir).unwrap();
        dir
    })
}

/// A command for the probe with the double loaded and allowed (`NCCL_DOUBLE=1`), no
/// inherited NCCL_DOUBLE_* or CUDA_VISIBLE_DEVICES settings, meeting under target/tmp.
/// No wait deadline (`NCCL_DOUBLE_TIMEOUT_S` unset), as with real NCCL: every run has
/// the hard limit [`LIMIT`] instead.
pub fn probe(args: &[&str]) -> Command {
    let mut cmd = Command::new(PROBE);
    cmd.args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("NCCL_DOUBLE") || k == "CUDA_VISIBLE_DEVICES" || k.starts_with("SLURM") {
            cmd.env_remove(k);
        }
    }
    cmd.env("LD_LIBRARY_PATH", lib_dir())
        .env("NCCL_DOUBLE", "1")
        .env("NCCL_DOUBLE_DIR", meet_dir());
    cmd
}

/// How one process ended, and what it printed.
#[derive(Clone)]
pub struct Out {
    pub rank: usize,
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl fmt::Display for Out {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "--- rank {}: exit {:?} after {:?}\n{}{}",
            self.rank, self.code, self.elapsed, self.stdout, self.stderr
        )
    }
}

impl Out {
    /// Each result line's `result=` values, in order.
    pub fn results(&self) -> Vec<Vec<f64>> {
        self.stdout
            .lines()
            .filter_map(|l| fields(l).get("result").map(|v| parse_values(v)))
            .collect()
    }
}

/// `key=value` fields of a line.
pub fn fields(line: &str) -> HashMap<&str, &str> {
    line.split(' ').filter_map(|f| f.split_once('=')).collect()
}

fn parse_values(v: &str) -> Vec<f64> {
    v.split(',')
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect()
}

/// Starts `cmd` with its output captured (testkit's runner, shared with the examples' tests).
pub use testkit::spawn;

/// Waits for `child` at most [`LIMIT`]; a run past it fails the test, with its output.
pub fn finish(rank: usize, child: Child) -> Out {
    let (out, in_time) = finish_or_kill(rank, child);
    assert!(in_time, "rank {rank} ran past {LIMIT:?} and was killed:\n{out}");
    out
}

/// Waits for `child` at most [`LIMIT`], killing it past that; says whether it ended in
/// time. Either way the process is gone (and reaped) when this returns.
pub fn finish_or_kill(rank: usize, child: Child) -> (Out, bool) {
    let (run, in_time) = testkit::finish_or_kill(child, LIMIT);
    let out = Out {
        rank,
        code: run.code,
        stdout: run.stdout,
        stderr: run.stderr,
        elapsed: run.elapsed,
    };
    (out, in_time)
}

/// A running rank that is killed (SIGKILL) and reaped if the test lets go of it
/// unfinished, e.g. when an assertion fails: no test leaves a process behind.
pub struct Running {
    pub rank: usize,
    child: Option<Child>,
}

impl Running {
    /// Rank `rank`'s process, killed and reaped if it is let go unfinished.
    pub fn new(rank: usize, child: Child) -> Running {
        Running {
            rank,
            child: Some(child),
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Sends `signal` (`STOP`, `KILL`...) with kill(1).
    pub fn signal(&self, signal: &str) {
        let ok = Command::new("kill")
            .args([format!("-{signal}"), self.pid().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill -{signal} {} failed", self.pid());
    }

    /// Whether it is still running (not exited, not killed).
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().is_ok_and(|s| s.is_none()))
    }

    /// Waits for the end (at most [`LIMIT`], then killed).
    pub fn finish(mut self) -> (Out, bool) {
        finish_or_kill(self.rank, self.child.take().unwrap())
    }

    /// Kills it (SIGKILL, also ends a stopped process) and reaps it; its output.
    pub fn kill(mut self) -> Out {
        let mut child = self.child.take().unwrap();
        let _ = child.kill();
        finish_or_kill(self.rank, child).0
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Whether process `pid` is gone (no /proc entry: neither running nor a zombie).
pub fn gone(pid: u32) -> bool {
    !Path::new(&format!("/proc/{pid}")).exists()
}

/// Waits (at most [`LIMIT`]) until `path` exists.
pub fn wait_for_file(path: &Path) {
    let start = Instant::now();
    while !path.exists() {
        assert!(start.elapsed() < LIMIT, "{} never appeared", path.display());
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A job: `world` probe processes, one per rank, sharing an id through a file. Its
/// folder (under target/tmp) goes when the job is dropped: a rank killed in a test never
/// leaves its meeting folder, and cleaning up after SIGKILL is the test's job.
pub struct Job {
    world: usize,
    args: Vec<String>,
    env: Vec<(String, String)>,
    rank_args: HashMap<usize, Vec<String>>,
    rank_env: HashMap<usize, Vec<(String, String)>>,
    absent: Vec<usize>,
    /// Where the ranks meet (NCCL_DOUBLE_DIR), private to the job.
    pub meet: PathBuf,
    id_file: PathBuf,
    root: PathBuf,
}

impl Job {
    pub fn new(op: &str, world: usize) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("jobs/{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("meet")).unwrap();
        Self {
            world,
            args: vec!["--op".into(), op.into(), "--world".into(), world.to_string()],
            env: Vec::new(),
            rank_args: HashMap::new(),
            rank_env: HashMap::new(),
            absent: Vec::new(),
            meet: root.join("meet"),
            id_file: root.join("id"),
            root,
        }
    }

    /// A path in the job's folder (for `--ready-file`).
    pub fn file(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    /// Arguments for every rank.
    pub fn args(mut self, args: &[&str]) -> Self {
        self.args.extend(args.iter().map(|s| s.to_string()));
        self
    }

    /// Arguments for one rank only (e.g. `--break ...`).
    pub fn rank_args(mut self, rank: usize, args: &[&str]) -> Self {
        self.rank_args
            .entry(rank)
            .or_default()
            .extend(args.iter().map(|s| s.to_string()));
        self
    }

    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.env.push((k.into(), v.into()));
        self
    }

    pub fn rank_env(mut self, rank: usize, k: &str, v: &str) -> Self {
        self.rank_env.entry(rank).or_default().push((k.into(), v.into()));
        self
    }

    /// A rank that never starts.
    pub fn without(mut self, rank: usize) -> Self {
        self.absent.push(rank);
        self
    }

    /// Starts every rank.
    pub fn start(&self) -> Vec<Running> {
        (0..self.world)
            .filter(|r| !self.absent.contains(r))
            .map(|r| {
                let mut cmd = probe(&[]);
                cmd.args(&self.args)
                    .args(["--rank", &r.to_string(), "--id-file"])
                    .arg(&self.id_file)
                    .args(self.rank_args.get(&r).into_iter().flatten())
                    .env("NCCL_DOUBLE_DIR", &self.meet);
                for (k, v) in self.env.iter().chain(self.rank_env.get(&r).into_iter().flatten()) {
                    cmd.env(k, v);
                }
                Running {
                    rank: r,
                    child: Some(spawn(cmd)),
                }
            })
            .collect()
    }

    /// Runs every rank to its end (at most [`LIMIT`] each; every process is reaped
    /// before a rank that ran past it fails the test).
    pub fn run(&self) -> Vec<Out> {
        let ends: Vec<(Out, bool)> = self.start().into_iter().map(Running::finish).collect();
        if let Some((late, _)) = ends.iter().find(|(_, in_time)| !in_time) {
            let outs: Vec<Out> = ends.iter().map(|(o, _)| o.clone()).collect();
            panic!("rank {} ran past {LIMIT:?} and was killed:\n{}", late.rank, all(&outs));
        }
        ends.into_iter().map(|(o, _)| o).collect()
    }

    /// Whether the meeting folder was cleaned up (the last rank to leave removes it).
    pub fn left_nothing_behind(&self) -> bool {
        std::fs::read_dir(&self.meet).map(|d| d.count() == 0).unwrap_or(true)
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// Every run, for assertion messages.
pub fn all(outs: &[Out]) -> String {
    outs.iter().map(|o| o.to_string()).collect()
}

/// Asserts that every rank exited 0.
pub fn all_ok(outs: &[Out]) {
    for o in outs {
        assert_eq!(o.code, Some(0), "rank {} failed:\n{}", o.rank, all(outs));
    }
}

/// Asserts that `rank` failed with `code` (NCCL's or the driver's name) and `text`, with
/// a WARN line saying the same.
pub fn failed_with(outs: &[Out], rank: usize, code: &str, text: &str) {
    let o = outs.iter().find(|o| o.rank == rank).unwrap();
    assert_eq!(o.code, Some(1), "rank {rank} should have failed:\n{}", all(outs));
    let err = o.stderr.lines().find(|l| l.starts_with("error: ")).unwrap_or_default();
    assert!(
        err.contains(code) && err.contains(text),
        "rank {rank} should fail with {code} and {text:?}:\n{}",
        all(outs)
    );
    assert!(
        o.stderr
            .lines()
            .any(|l| l.starts_with("nccl-double WARN") && l.contains(text)),
        "rank {rank} should print a WARN line with {text:?}:\n{}",
        all(outs)
    );
}

/// `cmd` (the bare probe, or a shell that execs it) made rank `r` of `world`, meeting
/// through the file `id`, on the double playing NCCL `version` with `devices` GPUs (its
/// own GPU `r`), running `iters` timed calls after one warm-up; its output piped.
pub fn bare_rank(
    mut cmd: Command,
    (r, world): (usize, usize),
    devices: usize,
    id: &Path,
    version: &str,
    iters: u32,
) -> Command {
    cmd.args([
        "--rank",
        &r.to_string(),
        "--world",
        &world.to_string(),
        "--id-file",
        id.to_str().unwrap(),
    ])
    .args(["--iters", &iters.to_string(), "--warmup", "1"])
    .env("LD_LIBRARY_PATH", lib_dir())
    .env("NCCL_DOUBLE", "1")
    .env("NCCL_DOUBLE_DEVICES", devices.to_string())
    .env("NCCL_DOUBLE_DIR", meet_dir())
    .env("NCCL_DOUBLE_VERSION", version)
    .env("CUDA_VISIBLE_DEVICES", r.to_string())
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped());
    cmd
}

/// A name for one job's files, from the test process, the world, the version played and
/// the variables set: letters, digits and `_` only.
pub fn job_tag(world: usize, version: &str, env: &[(&str, &str)]) -> String {
    let tag = format!(
        "{}-{world}-{version}-{}",
        std::process::id(),
        env.iter().map(|(k, v)| format!("{k}{v}")).collect::<String>()
    );
    tag.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}
