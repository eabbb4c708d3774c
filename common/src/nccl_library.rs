//! Finding libnccl where real installs put it.
//!
//! cudarc loads NCCL by name (`libnccl.so` and a few others), never as `libnccl.so.2`,
//! the only name NCCL's runtime packages and Python wheels ship; and the dynamic loader
//! reads `LD_LIBRARY_PATH` only when a process starts. So, when NCCL may be used, the
//! program looks for the library itself, in this order:
//!
//! 1. `NCCL_LIBRARY`, naming the file (a specific NCCL, as clusters often need);
//! 2. `NCCL_HOME/lib` and `NCCL_HOME/lib64`;
//! 3. the folders of `LD_LIBRARY_PATH`;
//! 4. the `nvidia/nccl/lib` folder of a Python wheel (`pip install nvidia-nccl-cu12`) in
//!    the active virtual or conda environment, or the user's and system's site-packages;
//! 5. the system's library folders.
//!
//! It then links the file as `libnccl.so` in a private folder and starts itself again,
//! once, with that folder first on `LD_LIBRARY_PATH`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// Set on the restarted process, so that it does not look again.
const ENV_DONE: &str = "NCCL_WORKBOOK_NCCL_DIR";
const NAMES: [&str; 2] = ["libnccl.so.2", "libnccl.so"];

/// Where libnccl is, by the order above (`None`: nowhere this program knows to look).
pub fn locate(env: &dyn Fn(&str) -> Option<OsString>) -> Option<PathBuf> {
    if let Some(file) = env("NCCL_LIBRARY").map(PathBuf::from) {
        return file.is_file().then_some(file);
    }
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(home) = env("NCCL_HOME").map(PathBuf::from) {
        dirs.extend([home.join("lib"), home.join("lib64")]);
    }
    if let Some(path) = env("LD_LIBRARY_PATH") {
        dirs.extend(std::env::split_paths(&path));
    }
    for root in ["VIRTUAL_ENV", "CONDA_PREFIX"]
        .iter()
        .filter_map(|v| env(v))
        .map(PathBuf::from)
    {
        dirs.extend(wheel_dirs(&root.join("lib")));
    }
    if let Some(home) = env("HOME").map(PathBuf::from) {
        dirs.extend(wheel_dirs(&home.join(".local/lib")));
    }
    for sys in ["/usr/local/lib", "/usr/lib"] {
        dirs.extend(wheel_dirs(Path::new(sys)));
    }
    dirs.extend(
        [
            "/usr/lib/x86_64-linux-gnu",
            "/usr/lib/aarch64-linux-gnu",
            "/usr/lib64",
            "/usr/local/cuda/lib64",
            "/usr/lib",
            "/usr/local/lib",
        ]
        .map(PathBuf::from),
    );
    dirs.iter()
        .flat_map(|d| NAMES.iter().map(move |n| d.join(n)))
        .find(|f| f.is_file())
}

/// `<lib>/python3.*/{site,dist}-packages/nvidia/nccl/lib` folders.
fn wheel_dirs(lib: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(lib) else {
        return Vec::new();
    };
    let mut dirs: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
        .flat_map(|e| ["site-packages", "dist-packages"].map(|p| e.path().join(p).join("nvidia/nccl/lib")))
        .collect();
    dirs.sort();
    dirs
}

/// Makes libnccl loadable under cudarc's names, restarting this process once if needed.
/// Returns normally when there is nothing to do (or nothing found: the probe then says
/// what is missing).
pub fn make_loadable() {
    if std::env::var_os(ENV_DONE).is_some() {
        return;
    }
    let env = |name: &str| std::env::var_os(name);
    // cudarc already finds one, and none was asked for by name: nothing to do.
    // SAFETY: only tries to load the library by name.
    if env("NCCL_LIBRARY").is_none() && unsafe { cudarc::nccl::sys::is_culib_present() } {
        return;
    }
    let Some(file) = locate(&env) else { return };
    let Ok(file) = file.canonicalize() else { return };
    let dir = std::env::temp_dir().join(format!("nccl-workbook-{}", std::process::id()));
    let link = dir.join("libnccl.so");
    if std::fs::create_dir_all(&dir).is_err() || std::os::unix::fs::symlink(&file, &link).is_err() {
        return;
    }
    let mut path = OsString::from(&dir);
    if let Some(old) = env("LD_LIBRARY_PATH").filter(|p| !p.is_empty()) {
        path.push(":");
        path.push(old);
    }
    let Ok(exe) = std::env::current_exe() else { return };
    use std::os::unix::process::CommandExt;
    let err = std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env("LD_LIBRARY_PATH", path)
        .env(ENV_DONE, &dir)
        .exec();
    crate::error::say_line(&format!(
        "warning: could not restart with {} on LD_LIBRARY_PATH: {err}",
        file.display()
    ));
}

/// Removes the private folder, in the process that made it (`exec` keeps the pid).
pub fn clean_up() {
    if let Some(dir) = std::env::var_os(ENV_DONE).map(PathBuf::from)
        && dir
            .file_name()
            .is_some_and(|n| n.to_string_lossy() == format!("nccl-workbook-{}", std::process::id()))
    {
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn looks_where_installs_put_it_in_order() {
        let root = std::env::temp_dir().join(format!("nccl-locate-{}", std::process::id()));
        let (named, home, ld, venv) = (
            root.join("named"),
            root.join("home"),
            root.join("ld"),
            root.join("venv"),
        );
        let wheel = venv.join("lib/python3.11/site-packages/nvidia/nccl/lib");
        for d in [&named, &home.join("lib"), &ld, &wheel] {
            std::fs::create_dir_all(d).unwrap();
        }
        for f in [
            named.join("libnccl.so.2.18.3"),
            home.join("lib/libnccl.so.2"),
            ld.join("libnccl.so.2"),
            wheel.join("libnccl.so.2"),
        ] {
            std::fs::write(f, b"").unwrap();
        }
        let vars = |pairs: Vec<(&'static str, PathBuf)>| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v.clone().into_os_string())
            }
        };
        let all = [
            ("NCCL_LIBRARY", named.join("libnccl.so.2.18.3")),
            ("NCCL_HOME", home.clone()),
            ("LD_LIBRARY_PATH", ld.clone()),
            ("VIRTUAL_ENV", venv.clone()),
        ];
        for (skip, expect) in [
            (0, named.join("libnccl.so.2.18.3")),
            (1, home.join("lib/libnccl.so.2")),
            (2, ld.join("libnccl.so.2")),
            (3, wheel.join("libnccl.so.2")),
        ] {
            assert_eq!(locate(&vars(all[skip..].to_vec())), Some(expect));
        }
        // A named file that does not exist is not replaced by a guess.
        assert_eq!(locate(&vars(vec![("NCCL_LIBRARY", root.join("missing.so"))])), None);
        std::fs::remove_dir_all(root).unwrap();
    }
}
