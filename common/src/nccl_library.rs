//! Finding libnccl where real installs put it, and saying which one runs.
//!
//! cudarc loads NCCL by name (`libnccl.so` and a few others), never as `libnccl.so.2`,
//! the only name NCCL's runtime packages and Python wheels ship; and the dynamic loader
//! reads `LD_LIBRARY_PATH` only when a process starts. So, when NCCL may be used, the
//! program looks for the library itself, in this order:
//!
//! 1. `NCCL_LIBRARY`, naming the file (a specific NCCL, as clusters often need); a
//!    folder, a missing file or a file that is not NCCL is refused;
//! 2. an NCCL already in the process: `LD_PRELOAD=/path/libnccl.so.2`, as clusters
//!    pin one NCCL for a training command (a second NCCL loaded beside it would be a
//!    different library with its own state);
//! 3. what cudarc finds by its own names;
//! 4. `NCCL_HOME/lib` and `NCCL_HOME/lib64`;
//! 5. the folders of `LD_LIBRARY_PATH`;
//! 6. the `nvidia/nccl/lib` folder of a Python wheel (`pip install nvidia-nccl-cu12`) in
//!    the active virtual or conda environment, or the user's and system's site-packages;
//! 7. the system's library folders.
//!
//! It then links the file as `libnccl.so` in a private folder and starts itself again,
//! once, with that folder first on `LD_LIBRARY_PATH`. (glibc knows a file it has already
//! loaded by its device and inode, whatever the name: a preloaded NCCL stays the one.)
//!
//! Once loaded, [`loaded`] says which file and which version, so that the program can
//! name them before it asks NCCL for anything: seed 003's cluster had two installs of one
//! NCCL version, one twice as slow as the other.

use crate::error::usage;
use anyhow::{Result, anyhow};
use std::ffi::{CStr, CString, OsString, c_int, c_void};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The oldest NCCL this workbook runs with: cudarc 0.19's oldest NCCL (its feature
/// `nccl-02018`). Everything called here is in it: the non-blocking communicator and
/// `ncclCommGetAsyncError` (2.14), `ncclCommFinalize` (2.14), `ncclConfig_t` as laid out
/// in 2.17, and `ncclGetLastError` (2.13).
pub const OLDEST: (u32, u32, u32) = (2, 18, 0);

/// The NCCL a process has loaded: its version and its file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loaded {
    /// `major.minor.patch`.
    pub version: String,
    /// Whether it is at least [`OLDEST`].
    pub supported: bool,
    /// The file the code came from, links resolved (`None` if the loader does not say).
    pub path: Option<PathBuf>,
}

impl Loaded {
    /// "NCCL 2.18.3 (/usr/lib/x86_64-linux-gnu/libnccl.so.2.18.3)".
    pub fn describe(&self) -> String {
        match &self.path {
            Some(p) => format!("NCCL {} ({})", self.version, p.display()),
            None => format!("NCCL {}", self.version),
        }
    }
}

/// Which NCCL this process uses: loads it through cudarc (which must have found it:
/// check `cudarc::nccl::sys::is_culib_present` first), asks its version and finds the
/// file that holds `ncclGetVersion`.
pub fn loaded() -> Result<Loaded> {
    let code = cudarc::nccl::result::get_nccl_version().map_err(|e| anyhow!("ncclGetVersion failed: {:?}", e.0))?;
    let (major, minor, patch) = split_version(code);
    // SAFETY: the library is loaded (the call above went through it); we only read the
    // address of one of its symbols and ask the loader which file holds it.
    let path = unsafe {
        let lib = cudarc::nccl::sys::culib();
        lib.get::<unsafe extern "C" fn(*mut c_int) -> c_int>(b"ncclGetVersion\0")
            .ok()
            .and_then(|f| file_of((*f) as *const c_void))
    };
    Ok(Loaded {
        version: format!("{major}.{minor}.{patch}"),
        supported: (major, minor, patch) >= OLDEST,
        path: path.map(|p| p.canonicalize().unwrap_or(p)),
    })
}

/// NCCL's version code as (major, minor, patch): 2.18.3 is 21803 (and versions before
/// 2.9 were written 2903-style, in thousands).
pub fn split_version(code: c_int) -> (u32, u32, u32) {
    let code = code.max(0) as u32;
    if code >= 10000 {
        (code / 10000, (code / 100) % 100, code % 100)
    } else {
        (code / 1000, (code / 100) % 10, code % 100)
    }
}

/// The file of the loaded object that contains `addr` (`dladdr`).
fn file_of(addr: *const c_void) -> Option<PathBuf> {
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads the loader's tables and fills `info`.
    if unsafe { libc::dladdr(addr, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated string owned by the loader.
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    Some(PathBuf::from(std::ffi::OsStr::from_bytes(name.to_bytes())))
}

/// The libnccl already in this process (put there by `LD_PRELOAD`), if any.
pub fn preloaded() -> Option<PathBuf> {
    unsafe extern "C" fn each(info: *mut libc::dl_phdr_info, _size: usize, found: *mut c_void) -> c_int {
        // SAFETY: the loader passes a valid entry; `found` is the Vec below.
        let (info, found) = unsafe { (&*info, &mut *(found as *mut Vec<PathBuf>)) };
        if !info.dlpi_name.is_null() {
            // SAFETY: dlpi_name is a NUL-terminated string owned by the loader.
            let path = PathBuf::from(std::ffi::OsStr::from_bytes(
                unsafe { CStr::from_ptr(info.dlpi_name) }.to_bytes(),
            ));
            if path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("libnccl"))
            {
                found.push(path);
            }
        }
        0
    }
    let mut found: Vec<PathBuf> = Vec::new();
    // SAFETY: the callback only reads each entry and pushes to `found`, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(each), &mut found as *mut Vec<PathBuf> as *mut c_void) };
    found.into_iter().next()
}

/// Checks that `NCCL_LIBRARY`'s value names a loadable NCCL; the error says what it is instead.
fn check_named(file: &Path) -> Result<()> {
    let shown = file.display();
    if file.is_dir() {
        return Err(usage(format!(
            "NCCL_LIBRARY={shown} is a folder: name the library file in it (e.g. {})",
            file.join("libnccl.so.2").display()
        )));
    }
    if !file.is_file() {
        return Err(usage(format!("NCCL_LIBRARY={shown}: there is no such file")));
    }
    let c = CString::new(file.as_os_str().as_bytes()).map_err(|_| usage("NCCL_LIBRARY has a NUL byte"))?;
    // SAFETY: loads the file privately to look for one symbol, then lets it go.
    unsafe {
        let handle = libc::dlopen(c.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL);
        if handle.is_null() {
            let why = libc::dlerror();
            let why = if why.is_null() {
                "the loader refused it".to_string()
            } else {
                CStr::from_ptr(why).to_string_lossy().into_owned()
            };
            return Err(usage(format!(
                "NCCL_LIBRARY={shown} is not a library this program can load: {why}"
            )));
        }
        let has = !libc::dlsym(handle, c"ncclGetVersion".as_ptr()).is_null();
        libc::dlclose(handle);
        if !has {
            return Err(usage(format!(
                "NCCL_LIBRARY={shown} is not NCCL: it has no ncclGetVersion (name libnccl.so.2 or the file it links to)"
            )));
        }
    }
    Ok(())
}

/// Set on the restarted process, so that it does not look again.
const ENV_DONE: &str = "NCCL_WORKBOOK_NCCL_DIR";
const NAMES: [&str; 2] = ["libnccl.so.2", "libnccl.so"];

/// Where libnccl is, by the order above (`None`: nowhere this program knows to look).
pub fn locate(env: &dyn Fn(&str) -> Option<OsString>) -> Option<PathBuf> {
    if let Some(file) = env("NCCL_LIBRARY").filter(|v| !v.is_empty()).map(PathBuf::from) {
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
/// Returns normally when there is nothing to do, or nothing found (the probe then says
/// what is missing); fails, as bad input, when `NCCL_LIBRARY` names no NCCL or disagrees
/// with the NCCL already loaded.
pub fn make_loadable() -> Result<()> {
    if std::env::var_os(ENV_DONE).is_some() {
        return Ok(());
    }
    let env = |name: &str| std::env::var_os(name);
    let named = env("NCCL_LIBRARY").filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(file) = &named {
        check_named(file)?;
    }
    let preloaded = preloaded();
    let file = match (named, preloaded) {
        (Some(n), Some(p)) if n.canonicalize().ok() != p.canonicalize().ok() => {
            return Err(usage(format!(
                "NCCL_LIBRARY={} but another NCCL is already loaded ({}, by LD_PRELOAD): one process can use \
                 one NCCL; make them the same file",
                n.display(),
                p.display()
            )));
        }
        (Some(n), _) => n,
        (None, Some(p)) => p,
        // cudarc already finds one, and none was asked for: nothing to do.
        // SAFETY: only tries to load the library by name.
        (None, None) if unsafe { cudarc::nccl::sys::is_culib_present() } => return Ok(()),
        (None, None) => match locate(&env) {
            Some(f) => f,
            None => return Ok(()),
        },
    };
    let Ok(file) = file.canonicalize() else { return Ok(()) };
    let dir = std::env::temp_dir().join(format!("nccl-workbook-{}", std::process::id()));
    let link = dir.join("libnccl.so");
    let _ = std::fs::remove_file(&link);
    if std::fs::create_dir_all(&dir).is_err() || std::os::unix::fs::symlink(&file, &link).is_err() {
        return Ok(());
    }
    let mut path = OsString::from(&dir);
    if let Some(old) = env("LD_LIBRARY_PATH").filter(|p| !p.is_empty()) {
        path.push(":");
        path.push(old);
    }
    let Ok(exe) = std::env::current_exe() else {
        return Ok(());
    };
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
    Ok(())
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
