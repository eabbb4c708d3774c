//! `--simulate-gpus N`: a GPU node on a laptop.
//!
//! The workbook's tests run the NCCL backend on `nccl-double`, a library that answers the
//! CUDA driver's and NCCL's calls in host memory. This flag offers it to students: the
//! program finds the library (or builds it, once, with the cargo that built the lesson),
//! links it under the names cudarc loads (`libcuda.so`, `libnccl.so`) in a private folder,
//! and starts itself again with that folder first on `LD_LIBRARY_PATH`. From then on the
//! lesson runs the very same code as on a GPU node: cudarc, the NCCL calls, the stream,
//! the waits. Only the data lives in host memory, so no time or bandwidth it prints says
//! anything about a GPU, and every line that could be read that way says so.

use crate::error::usage;
use anyhow::Result;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// Set on the restarted process: how many GPUs it simulates.
const ENV_GPUS: &str = "NCCL_WORKBOOK_SIMULATED_GPUS";
/// Set on the restarted process: the private folder of links, removed at the end by the
/// process that made it.
const ENV_DIR: &str = "NCCL_WORKBOOK_SIMULATOR_DIR";
/// The simulator's file, as cargo builds it.
const LIBRARY: &str = "libnccl_double.so";

/// How many GPUs this process simulates (`None`: real hardware, or the CPU backend).
pub fn gpus() -> Option<usize> {
    std::env::var(ENV_GPUS).ok()?.parse().ok()
}

/// What every line that shows a time, a bandwidth or a device adds when simulated.
pub const NOTE: &str = "simulated GPUs: host memory, not a GPU's speed";

/// Sets up `n` simulated GPUs and restarts this process on them, once. Returns normally
/// in the restarted process (and in the ranks it starts, which inherit the setup).
pub fn start(n: u32) -> Result<()> {
    // Also in the restarted process, which owns the folder: a deadline's exit removes it.
    crate::error::clean_up_at_exit(clean_up);
    if std::env::var_os(ENV_GPUS).is_some() {
        return Ok(());
    }
    let library = match find() {
        Some(found) => found,
        None => build()?,
    };
    let dir = std::env::temp_dir().join(format!("nccl-workbook-sim-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| usage(format!("--simulate-gpus: cannot make {}: {e}", dir.display())))?;
    // Links, never copies: the process must map one library, so that its NCCL half sees
    // the contexts and allocations of its CUDA half.
    for name in ["libcuda.so", "libcuda.so.1", "libnccl.so", "libnccl.so.2"] {
        let link = dir.join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&library, &link)
            .map_err(|e| usage(format!("--simulate-gpus: cannot link {}: {e}", link.display())))?;
    }
    let mut path = OsString::from(&dir);
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|p| !p.is_empty()) {
        path.push(":");
        path.push(old);
    }
    let exe = std::env::current_exe().map_err(|e| usage(format!("--simulate-gpus: where is this program? {e}")))?;
    use std::os::unix::process::CommandExt;
    let err = std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        // The loader reads LD_LIBRARY_PATH when a process starts: hence the restart.
        .env("LD_LIBRARY_PATH", path)
        // The simulator refuses to act without it (it can never stand in for a GPU by accident).
        .env("NCCL_DOUBLE", "1")
        .env("NCCL_DOUBLE_DEVICES", n.to_string())
        .env(ENV_GPUS, n.to_string())
        .env(ENV_DIR, &dir)
        .exec();
    let _ = std::fs::remove_dir_all(&dir);
    Err(usage(format!(
        "--simulate-gpus: could not restart this program on the simulator: {err}"
    )))
}

/// Removes the private folder, in the process that made it (`exec` keeps the pid).
pub fn clean_up() {
    if let Some(dir) = std::env::var_os(ENV_DIR).map(PathBuf::from)
        && dir
            .file_name()
            .is_some_and(|n| n.to_string_lossy() == format!("nccl-workbook-sim-{}", std::process::id()))
    {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// The folder this program is in (for a test or an example, the profile's folder above
/// `deps/` or `examples/`): where the simulator is looked for.
fn program_folder() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    match dir.file_name()? == "deps" || dir.file_name()? == "examples" {
        true => dir.parent().map(Path::to_path_buf),
        false => Some(dir.to_path_buf()),
    }
}

/// The folder cargo put this program in (`target/release`), and the profile's name: only
/// when it is one, in a folder that cargo made its target folder (it leaves a
/// `CACHEDIR.TAG` there), for a profile that is defined (`debug`, `release`, or a
/// `[profile.NAME]` of the workspace's `manifest`). A program copied elsewhere
/// (`/tmp/x/`) is not in one: its folder's name is no profile.
fn build_folder(manifest: &Path) -> Option<(PathBuf, String)> {
    let dir = program_folder()?;
    let target = dir.parent()?;
    if !target.join("CACHEDIR.TAG").is_file() {
        return None;
    }
    let profile = dir.file_name()?.to_str()?.to_string();
    let defined = matches!(profile.as_str(), "debug" | "release")
        || std::fs::read_to_string(manifest).is_ok_and(|m| m.contains(&format!("[profile.{profile}]")));
    defined.then_some((dir, profile))
}

/// The simulator beside this program, if it is there (cargo built it there, or it was put there).
fn find() -> Option<PathBuf> {
    let dir = program_folder()?;
    // The newer of the two: `cargo test` refreshes only the one in deps/, so the other
    // may be a stale build that lacks what the lesson now calls.
    let modified = |f: &PathBuf| std::fs::metadata(f).and_then(|m| m.modified()).ok();
    [dir.join(LIBRARY), dir.join("deps").join(LIBRARY)]
        .into_iter()
        .filter(|f| f.is_file())
        .max_by_key(modified)
}

/// Builds the simulator with cargo, into the target folder this program came from. Only
/// there: anywhere else (a program copied alone) it is one line that says what to do.
fn build() -> Result<PathBuf> {
    let manual = "build it in the workbook with `cargo build --release -p nccl-double --lib --no-default-features` \
                  and put target/release/libnccl_double.so beside this program";
    let here = program_folder().map_or_else(|| "?".into(), |d| d.display().to_string());
    let Some(manifest) = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(|w| w.join("Cargo.toml"))
        .filter(|m| m.is_file())
    else {
        return Err(usage(format!(
            "--simulate-gpus needs the simulator ({LIBRARY}) beside this program (in {here}), and the workbook's \
             sources are not where this program was built: {manual}"
        )));
    };
    let Some((dir, profile)) = build_folder(&manifest) else {
        return Err(usage(format!(
            "--simulate-gpus needs the simulator ({LIBRARY}) beside this program (in {here}), which is not in \
             cargo's target folder, where it could be built: {manual}"
        )));
    };
    let target = dir.parent().unwrap_or(&dir).to_path_buf();
    crate::error::say_line(&format!(
        "simulated GPUs: building the simulator ({LIBRARY}, nccl-double/), once: a few seconds"
    ));
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = std::process::Command::new(&cargo);
    cmd.args([
        "build",
        "--quiet",
        "-p",
        "nccl-double",
        "--lib",
        "--no-default-features",
        "--manifest-path",
    ])
    .arg(&manifest)
    .arg("--target-dir")
    .arg(&target);
    match profile.as_str() {
        "debug" => {}
        "release" => {
            cmd.arg("--release");
        }
        other => {
            cmd.args(["--profile", other]);
        }
    }
    // Cargo's own words are kept, and the first of its errors said in our one line.
    let out = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .output();
    let why = match &out {
        Ok(o) if o.status.success() => None,
        Ok(o) => {
            let said = String::from_utf8_lossy(&o.stderr);
            let first = said
                .lines()
                .map(str::trim)
                .find(|l| l.starts_with("error"))
                .or(said.lines().next());
            Some(first.map_or_else(|| format!("it ended with {}", o.status), |l| crate::error::cut(l, 200)))
        }
        Err(e) => Some(e.to_string()),
    };
    match (find(), why) {
        (Some(lib), None) => Ok(lib),
        (_, why) => Err(usage(format!(
            "--simulate-gpus: building the simulator with {} failed ({}): {manual}",
            Path::new(&cargo).display(),
            why.unwrap_or_else(|| "it built no library".into())
        ))),
    }
}
