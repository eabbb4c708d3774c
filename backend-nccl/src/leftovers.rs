//! What killed processes left of the NCCL backend's files, removed.
//!
//! Two kinds of files outlive a process killed with SIGKILL (or ended by a deadline's
//! `_exit`):
//! - the simulator's meeting folders, `/dev/shm/nccl-double-<pid>-<hex>/` (or under
//!   `NCCL_DOUBLE_DIR`), with the data of the job's last calls: hundreds of MiB. The
//!   last rank to leave removes one; a killed rank never leaves. The pid in the name made
//!   the job's unique id, and each process that opened the folder wrote `pid-<pid>` in
//!   it before anything else (`nccl-double/src/exchange.rs`);
//! - the private folders of library links, `nccl-workbook-<pid>` ([`crate::nccl_library`])
//!   and `nccl-workbook-sim-<pid>` ([`crate::simulate`]) in the temporary folder, which
//!   the process of that pid removes when it ends normally.
//!
//! A file is removed only when it is this user's and every process named in it is gone,
//! as the CPU backend decides for its channel files: never a live job's.

use std::path::{Path, PathBuf};
use workbook_runtime::launcher::alive;

/// What a meeting folder's name starts with.
const ROOM: &str = "nccl-double-";

/// Removes what the processes `pids` left (the launcher's, once its ranks ended), and
/// what any other process that is gone left.
pub fn remove_files_of(pids: &[u32]) {
    remove(&|pid| pids.contains(&pid) || !alive(pid));
}

/// Removes what processes that are gone left (every start: a job killed with its
/// launcher left its files to the next one).
pub fn remove_dead_files() {
    remove(&|pid| !alive(pid));
}

/// What a rank that ends at once (a signal, a deadline) removes: its own mark in each
/// meeting folder it joined, then each folder whose other members are all gone (the last
/// to leave removes it, whoever went first; a member killed outright never leaves), and
/// the link folders of processes that are gone (its launcher's, killed with it).
pub fn leave() {
    let me = std::process::id();
    for room in mine(&rooms_folder()) {
        let mark = room.join(format!("pid-{me}"));
        if !mark.exists() {
            continue;
        }
        let _ = std::fs::remove_file(&mark);
        // The members still marked (the maker's name is the first member's mark too).
        let marked: Vec<u32> = std::fs::read_dir(&room)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                e.file_name()
                    .to_str()
                    .and_then(|n| n.strip_prefix("pid-"))
                    .and_then(pid)
            })
            .collect();
        if marked.into_iter().all(|p| !alive(p)) {
            let _ = std::fs::remove_dir_all(&room);
        }
    }
    remove_dead_files();
}

fn remove(gone: &dyn Fn(u32) -> bool) {
    for entry in mine(&rooms_folder()) {
        if let Some(owners) = room_owners(&entry)
            && owners.into_iter().all(gone)
        {
            let _ = std::fs::remove_dir_all(&entry);
        }
    }
    for entry in mine(&std::env::temp_dir()) {
        if let Some(owner) = link_folder_owner(&entry)
            && gone(owner)
        {
            let _ = std::fs::remove_dir_all(&entry);
        }
    }
}

/// Where the simulator's meeting folders are, as it chooses it.
fn rooms_folder() -> PathBuf {
    match std::env::var_os("NCCL_DOUBLE_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ if Path::new("/dev/shm").is_dir() => PathBuf::from("/dev/shm"),
        _ => std::env::temp_dir(),
    }
}

/// The folders (not links to them) in `dir` that belong to this user.
fn mine(dir: &Path) -> Vec<PathBuf> {
    // SAFETY: no arguments.
    let me = unsafe { libc::getuid() };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| {
            // symlink_metadata: a link is never followed, and never removed.
            std::fs::symlink_metadata(e.path())
                .is_ok_and(|m| m.is_dir() && std::os::unix::fs::MetadataExt::uid(&m) == me)
        })
        .map(|e| e.path())
        .collect()
}

/// The processes a meeting folder names (its maker's pid, then a `pid-<pid>` for each
/// process that opened it); `None` if `path` is not one (an older simulator's folder,
/// named without a pid, is never touched).
fn room_owners(path: &Path) -> Option<Vec<u32>> {
    let name = path.file_name()?.to_str()?;
    let (maker, random) = name.strip_prefix(ROOM)?.split_once('-')?;
    let maker = pid(maker)?;
    // 32 hex digits, then nothing or a split's `-s<seq>c<color>`.
    let hex = random.get(..32)?;
    if !hex.bytes().all(|b| b.is_ascii_hexdigit()) || !(random.len() == 32 || random[32..].starts_with("-s")) {
        return None;
    }
    let mut owners = vec![maker];
    owners.extend(std::fs::read_dir(path).ok()?.flatten().filter_map(|e| {
        e.file_name()
            .to_str()
            .and_then(|n| n.strip_prefix("pid-"))
            .and_then(pid)
    }));
    Some(owners)
}

/// The process whose library links the folder at `path` holds, if it is one of ours:
/// `nccl-workbook-<pid>` or `nccl-workbook-sim-<pid>`, exactly.
fn link_folder_owner(path: &Path) -> Option<u32> {
    let rest = path.file_name()?.to_str()?.strip_prefix("nccl-workbook-")?;
    pid(rest.strip_prefix("sim-").unwrap_or(rest))
}

/// A pid written in decimal, and nothing else.
fn pid(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok().filter(|p| *p > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_workbooks_own_names_are_read_as_owned() {
        let hex = "0123456789abcdef0123456789abcdef";
        assert_eq!(link_folder_owner(Path::new("/tmp/nccl-workbook-42")), Some(42));
        assert_eq!(link_folder_owner(Path::new("/tmp/nccl-workbook-sim-42")), Some(42));
        for other in [
            "/tmp/nccl-workbook-sim-plot-42",
            "/tmp/nccl-workbook-trace-test-42-x",
            "/tmp/nccl-workbook-42-0-to-1",
            "/tmp/nccl-workbook-",
            "/tmp/nccl-workbook-+42",
        ] {
            assert_eq!(link_folder_owner(Path::new(other)), None, "{other}");
        }
        // A room's name is enough to be one; its members are read from the folder.
        let dir = std::env::temp_dir().join(format!("nccl-leftovers-unit-{}", std::process::id()));
        let room = dir.join(format!("{ROOM}7-{hex}"));
        std::fs::create_dir_all(&room).unwrap();
        std::fs::write(room.join("pid-8"), b"").unwrap();
        std::fs::write(room.join("op-1-0"), b"data").unwrap();
        let mut owners = room_owners(&room).unwrap();
        owners.sort();
        assert_eq!(owners, vec![7, 8]);
        let split = dir.join(format!("{ROOM}9-{hex}-s1c0"));
        std::fs::create_dir_all(&split).unwrap();
        assert_eq!(room_owners(&split), Some(vec![9]));
        for other in [
            format!("{ROOM}{hex}"),
            format!("{ROOM}lib"),
            format!("{ROOM}7-xyz"),
            format!("{ROOM}7-{hex}x"),
        ] {
            std::fs::create_dir_all(dir.join(&other)).unwrap();
            assert_eq!(room_owners(&dir.join(&other)), None, "{other}");
        }
        std::fs::remove_dir_all(dir).unwrap();
    }
}
