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
//! 3. `NCCL_HOME/lib` and `NCCL_HOME/lib64`;
//! 4. the `nvidia/nccl/lib` folder of a Python wheel (`pip install nvidia-nccl-cu12`) in
//!    the active virtual or conda environment;
//! 5. `$CONDA_PREFIX/lib`, where conda's own `nccl` package puts `libnccl.so.2`;
//! 6. what cudarc finds by its own names (a system `libnccl-dev`'s `libnccl.so`, which
//!    must not hide the NCCL the user chose above, a newer one as often as not);
//! 7. the folders of `LD_LIBRARY_PATH`;
//! 8. the wheels of the user's and the system's site-packages;
//! 9. the system's library folders.
//!
//! A candidate is NCCL when the library itself defines `ncclGetVersion`, whatever its
//! name: a network plugin (`libnccl-net*.so`, preloaded or in a folder) is not, and
//! cudarc would panic on its first call into it.
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
/// in 2.17, `ncclGetLastError` (2.13), and `ncclCommSplit` (2.18).
pub const OLDEST: workbook_runtime::nccl::Version = workbook_runtime::nccl::Version::new(2, 18, 0);

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
    let version = workbook_runtime::nccl::Version::from_code(code);
    let path = cudarc_file();
    Ok(Loaded {
        version: version.to_string(),
        supported: version >= OLDEST,
        path: path.map(|p| p.canonicalize().unwrap_or(p)),
    })
}

/// The file of the loaded object that contains `addr` (`dladdr`).
fn file_of(addr: *const c_void) -> Option<PathBuf> {
    // SAFETY: Dl_info is plain C data (pointers and integers): all zeros is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads the loader's tables and fills `info`.
    if unsafe { libc::dladdr(addr, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated string owned by the loader.
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    Some(PathBuf::from(std::ffi::OsStr::from_bytes(name.to_bytes())))
}

/// The NCCL already in this process (put there by `LD_PRELOAD`), if any: a loaded
/// library that defines `ncclGetVersion` itself (a preloaded network plugin,
/// `libnccl-net*.so`, has NCCL's name but is not NCCL).
pub fn preloaded() -> Option<PathBuf> {
    loaded_objects().into_iter().find(|p| defines_nccl(p, true) == Ok(true))
}

/// The files of the libraries loaded in this process, in the loader's order.
fn loaded_objects() -> Vec<PathBuf> {
    unsafe extern "C" fn each(info: *mut libc::dl_phdr_info, _size: usize, found: *mut c_void) -> c_int {
        // SAFETY: the loader passes a valid entry; `found` is the Vec below.
        let (info, found) = unsafe { (&*info, &mut *(found as *mut Vec<PathBuf>)) };
        if !info.dlpi_name.is_null() {
            // SAFETY: dlpi_name is a NUL-terminated string owned by the loader.
            let name = unsafe { CStr::from_ptr(info.dlpi_name) }.to_bytes();
            if !name.is_empty() {
                found.push(PathBuf::from(std::ffi::OsStr::from_bytes(name)));
            }
        }
        0
    }
    let mut found: Vec<PathBuf> = Vec::new();
    // SAFETY: the callback only reads each entry and pushes to `found`, which outlives the
    // call (nothing is loaded inside it: the loader's lock is held).
    unsafe { libc::dl_iterate_phdr(Some(each), &mut found as *mut Vec<PathBuf> as *mut c_void) };
    found
}

/// Whether the library `file` itself defines `ncclGetVersion`: the mark of NCCL. With
/// `loaded_only`, only a library already in this process is asked (`RTLD_NOLOAD`: nothing
/// new is loaded); else the file is loaded privately and let go. `Err`: the loader's
/// reason it cannot load the file.
fn defines_nccl(file: &Path, loaded_only: bool) -> std::result::Result<bool, String> {
    let c = CString::new(file.as_os_str().as_bytes()).map_err(|_| "its path has a NUL byte".to_string())?;
    let flags = if loaded_only {
        libc::RTLD_NOLOAD | libc::RTLD_LAZY
    } else {
        libc::RTLD_LAZY | libc::RTLD_LOCAL
    };
    // SAFETY: opens the library (or, with RTLD_NOLOAD, only finds it), looks up one
    // symbol and asks the loader which file holds it, then lets it go; the symbol's
    // address is not used after the dlclose.
    unsafe {
        let handle = libc::dlopen(c.as_ptr(), flags);
        if handle.is_null() {
            let why = libc::dlerror();
            return Err(if why.is_null() {
                "the loader refused it".to_string()
            } else {
                CStr::from_ptr(why).to_string_lossy().into_owned()
            });
        }
        let symbol = libc::dlsym(handle, c"ncclGetVersion".as_ptr());
        // dlsym also searches the library's dependencies: the symbol must be its own.
        let own = !symbol.is_null() && file_of(symbol).is_some_and(|f| same_file(&f, file));
        libc::dlclose(handle);
        Ok(own)
    }
}

/// Whether two paths name one file (links resolved), as the loader tells libraries apart.
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    }
}

/// Whether the library cudarc loads by its own names (`libnccl.so`...) is NCCL: cudarc
/// panics ("Missing symbol ncclGetVersion") on its first call into one that is not.
pub fn cudarc_finds_nccl() -> bool {
    // SAFETY: loads the library cudarc would use, by its names, and only looks up a symbol.
    unsafe {
        cudarc::nccl::sys::is_culib_present()
            && cudarc::nccl::sys::culib()
                .get::<unsafe extern "C" fn(*mut c_int) -> c_int>(b"ncclGetVersion\0")
                .is_ok()
    }
}

/// The file of the NCCL that cudarc loads by its own names, if it finds one.
fn cudarc_file() -> Option<PathBuf> {
    if !cudarc_finds_nccl() {
        return None;
    }
    // SAFETY: the library is loaded (`cudarc_finds_nccl` found the symbol in it); we only
    // read the address of one of its symbols and ask the loader which file holds it.
    unsafe {
        cudarc::nccl::sys::culib()
            .get::<unsafe extern "C" fn(*mut c_int) -> c_int>(b"ncclGetVersion\0")
            .ok()
            .and_then(|f| file_of((*f) as *const c_void))
    }
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
    match defines_nccl(file, false) {
        Err(why) => Err(usage(format!(
            "NCCL_LIBRARY={shown} is not a library this program can load: {why}"
        ))),
        Ok(false) => Err(usage(format!(
            "NCCL_LIBRARY={shown} is not NCCL: it has no ncclGetVersion (name libnccl.so.2 or the file it links to)"
        ))),
        Ok(true) => Ok(()),
    }
}

/// Set on the restarted process, so that it does not look again.
const ENV_DONE: &str = "NCCL_WORKBOOK_NCCL_DIR";
const NAMES: [&str; 2] = ["libnccl.so.2", "libnccl.so"];

/// Where libnccl is in the folders of the search (cudarc's own names aside): the first
/// candidate that is NCCL (`None`: nowhere this program knows to look).
pub fn locate(env: &dyn Fn(&str) -> Option<OsString>) -> Option<PathBuf> {
    first_nccl(candidates(env))
}

/// The first of `files` that is NCCL.
fn first_nccl(files: Vec<PathBuf>) -> Option<PathBuf> {
    files.into_iter().find(|f| defines_nccl(f, false) == Ok(true))
}

/// The files named like NCCL that the search finds, in its order: `NCCL_LIBRARY`'s
/// alone when it is set, else `libnccl.so.2` then `libnccl.so` in each of [`folders`].
pub fn candidates(env: &dyn Fn(&str) -> Option<OsString>) -> Vec<PathBuf> {
    if let Some(file) = env("NCCL_LIBRARY").filter(|v| !v.is_empty()).map(PathBuf::from) {
        return if file.is_file() { vec![file] } else { Vec::new() };
    }
    in_folders(&folders(env))
}

/// `libnccl.so.2` then `libnccl.so` in each folder of `steps`, those that exist.
fn in_folders(steps: &[Step]) -> Vec<PathBuf> {
    steps
        .iter()
        .flat_map(|step| step.dirs.iter())
        .flat_map(|d| NAMES.iter().map(move |n| d.join(n)))
        .filter(|f| f.is_file())
        .collect()
}

/// One step of the search through folders: how messages name it, and its folders.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// What puts the folders there, and which: `LD_LIBRARY_PATH (/opt/a, /opt/b)`.
    pub named: String,
    /// The folders, in order.
    pub dirs: Vec<PathBuf>,
    /// Searched before what cudarc finds by its own names (steps 3 to 5 of the list above).
    pub before_cudarc: bool,
}

/// The folders looked in, in order, step by step (3 to 5 and 7 to 9 of the list above):
/// what [`locate`] searches and what the "no libnccl" message lists.
pub fn folders(env: &dyn Fn(&str) -> Option<OsString>) -> Vec<Step> {
    let set = |name: &str| env(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    let list = |dirs: &[PathBuf]| {
        dirs.iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let step = |named: String, dirs: Vec<PathBuf>, before_cudarc: bool| Step {
        named,
        dirs,
        before_cudarc,
    };
    let mut steps = Vec::new();
    steps.push(match set("NCCL_HOME") {
        Some(home) => {
            let dirs = vec![home.join("lib"), home.join("lib64")];
            step(format!("NCCL_HOME ({})", list(&dirs)), dirs, true)
        }
        None => step("NCCL_HOME (unset)".into(), Vec::new(), true),
    });
    // Wheels: `<root>/python3.*/{site,dist}-packages/nvidia/nccl/lib`, named by their roots.
    let wheels = |roots: Vec<PathBuf>, none: &str| {
        let shown = if roots.is_empty() {
            none.to_string()
        } else {
            format!(
                "nvidia/nccl/lib in python3.*/{{site,dist}}-packages of {}",
                list(&roots)
            )
        };
        (roots.iter().flat_map(|r| wheel_dirs(r)).collect::<Vec<_>>(), shown)
    };
    let env_roots: Vec<PathBuf> = ["VIRTUAL_ENV", "CONDA_PREFIX"]
        .iter()
        .filter_map(|v| set(v))
        .map(|root| root.join("lib"))
        .collect();
    let (dirs, shown) = wheels(env_roots, "no VIRTUAL_ENV or CONDA_PREFIX");
    steps.push(step(format!("the active environment's wheels ({shown})"), dirs, true));
    steps.push(match set("CONDA_PREFIX") {
        Some(prefix) => step(
            format!("conda's own lib folder ({})", prefix.join("lib").display()),
            vec![prefix.join("lib")],
            true,
        ),
        None => step("conda's own lib folder (CONDA_PREFIX unset)".into(), Vec::new(), true),
    });
    let ld: Vec<PathBuf> = env("LD_LIBRARY_PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .filter(|d| !d.as_os_str().is_empty())
                .collect()
        })
        .unwrap_or_default();
    steps.push(step(
        format!(
            "LD_LIBRARY_PATH ({})",
            if ld.is_empty() { "empty".into() } else { list(&ld) }
        ),
        ld,
        false,
    ));
    let mut other_roots: Vec<PathBuf> = set("HOME").map(|h| h.join(".local/lib")).into_iter().collect();
    other_roots.extend(["/usr/local/lib", "/usr/lib"].map(PathBuf::from));
    let (dirs, shown) = wheels(other_roots, "");
    steps.push(step(format!("the user's and system's wheels ({shown})"), dirs, false));
    let system: Vec<PathBuf> = [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib64",
        "/usr/local/cuda/lib64",
        "/usr/lib",
        "/usr/local/lib",
    ]
    .map(PathBuf::from)
    .into();
    steps.push(step(format!("the system's folders ({})", list(&system)), system, false));
    steps
}

/// Every place the search looked, in order, for the message that says no NCCL was found.
pub fn looked_in(env: &dyn Fn(&str) -> Option<OsString>) -> String {
    let named = env("NCCL_LIBRARY")
        .filter(|v| !v.is_empty())
        .map(|v| format!("NCCL_LIBRARY ({})", Path::new(&v).display()))
        .unwrap_or_else(|| "NCCL_LIBRARY (unset)".into());
    let (ahead, behind): (Vec<Step>, Vec<Step>) = folders(env).into_iter().partition(|s| s.before_cudarc);
    let names = |steps: Vec<Step>| steps.into_iter().map(|s| s.named).collect::<Vec<_>>().join(", ");
    format!(
        "looked for libnccl.so.2 and libnccl.so in: {named}, the libraries already loaded (LD_PRELOAD), {}, cudarc's \
         own names on the loader's path, {}",
        names(ahead),
        names(behind)
    )
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
    // Also in the restarted process, which owns the folder: a deadline's exit removes it.
    crate::error::clean_up_at_exit(clean_up);
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
        (None, None) => {
            let (ahead, behind): (Vec<Step>, Vec<Step>) = folders(&env).into_iter().partition(|s| s.before_cudarc);
            match first_nccl(in_folders(&ahead)) {
                // The NCCL chosen by NCCL_HOME or the active environment, unless cudarc
                // loads that very file by its own names.
                Some(f) if cudarc_file().is_some_and(|c| same_file(&c, &f)) => return Ok(()),
                Some(f) => f,
                // cudarc finds one, and none was chosen: nothing to do.
                None if cudarc_finds_nccl() => return Ok(()),
                None => match first_nccl(in_folders(&behind)) {
                    Some(f) => f,
                    None => return Ok(()),
                },
            }
        }
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
        let (named, home, ld, venv, conda) = (
            root.join("named"),
            root.join("home"),
            root.join("ld"),
            root.join("venv"),
            root.join("conda"),
        );
        let wheel = venv.join("lib/python3.11/site-packages/nvidia/nccl/lib");
        let conda_wheel = conda.join("lib/python3.12/site-packages/nvidia/nccl/lib");
        for d in [&named, &home.join("lib"), &ld, &wheel, &conda_wheel] {
            std::fs::create_dir_all(d).unwrap();
        }
        for f in [
            named.join("libnccl.so.2.18.3"),
            home.join("lib/libnccl.so.2"),
            ld.join("libnccl.so.2"),
            wheel.join("libnccl.so.2"),
            conda_wheel.join("libnccl.so.2"),
            conda.join("lib/libnccl.so.2"),
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
            ("VIRTUAL_ENV", venv.clone()),
            ("CONDA_PREFIX", conda.clone()),
            ("LD_LIBRARY_PATH", ld.clone()),
        ];
        // (Empty files: named like NCCL, which is all `candidates` looks at; `locate`
        // then keeps the first that defines ncclGetVersion.)
        for (skip, expect) in [
            (0, named.join("libnccl.so.2.18.3")),
            (1, home.join("lib/libnccl.so.2")),
            (2, wheel.join("libnccl.so.2")),
            (3, conda_wheel.join("libnccl.so.2")),
            (4, ld.join("libnccl.so.2")),
        ] {
            assert_eq!(candidates(&vars(all[skip..].to_vec())).first(), Some(&expect));
        }
        // The active environment's wheels, then conda's own lib folder, before what
        // cudarc finds (the loader's path among it), then LD_LIBRARY_PATH.
        let env_first = candidates(&vars(all[2..].to_vec()));
        assert_eq!(
            env_first[..4],
            [
                wheel.join("libnccl.so.2"),
                conda_wheel.join("libnccl.so.2"),
                conda.join("lib/libnccl.so.2"),
                ld.join("libnccl.so.2")
            ],
            "{env_first:?}"
        );
        let (ahead, _): (Vec<Step>, Vec<Step>) = folders(&vars(all[1..].to_vec()))
            .into_iter()
            .partition(|s| s.before_cudarc);
        assert_eq!(
            in_folders(&ahead),
            [
                home.join("lib/libnccl.so.2"),
                wheel.join("libnccl.so.2"),
                conda_wheel.join("libnccl.so.2"),
                conda.join("lib/libnccl.so.2")
            ]
        );
        // None of them is NCCL.
        assert_eq!(locate(&vars(all[1..].to_vec())), None);
        // A named file that does not exist is not replaced by a guess.
        assert_eq!(
            candidates(&vars(vec![("NCCL_LIBRARY", root.join("missing.so"))])),
            Vec::<PathBuf>::new()
        );
        // The message names every step, set or not.
        let said = looked_in(&vars(vec![("LD_LIBRARY_PATH", ld.clone())]));
        for step in [
            "NCCL_LIBRARY (unset)".to_string(),
            "NCCL_HOME (unset)".to_string(),
            format!("LD_LIBRARY_PATH ({})", ld.display()),
            "the active environment's wheels (no VIRTUAL_ENV or CONDA_PREFIX)".to_string(),
            "conda's own lib folder (CONDA_PREFIX unset)".to_string(),
            "/usr/lib/x86_64-linux-gnu".to_string(),
        ] {
            assert!(said.contains(&step), "{step:?} in {said}");
        }
        std::fs::remove_dir_all(root).unwrap();
    }
}
