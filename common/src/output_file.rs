//! A file the run will write at its end (`--trace`, `--draw`, the benchmark's `--plot` and
//! `-J`), checked before any rank starts: a result that cannot be saved stops the run before
//! minutes of work, not after them. It is written whole or not at all ([`write_with`]): into
//! a file of its own beside the target, renamed over it once complete.

use std::fs::File;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

/// Whether `what` ("a trace", "a plot", "a result") can be written at `path`: its folder
/// exists; an existing file is a regular file (or a character device, such as
/// `/dev/null`; a FIFO would hold the writer until someone reads it) that this process may
/// write, not truncated here (the run may still fail, and the file was someone's); a new
/// one is a file it may create in that folder (tried with a file of its own, removed at
/// once). The reason, in one clause, if not.
pub fn check(path: &Path, what: &str) -> Result<(), String> {
    if path.as_os_str().is_empty() {
        return Err(format!("an empty path: {what} needs a file name"));
    }
    if let Ok(link) = std::fs::read_link(path)
        && std::fs::metadata(path).is_err()
    {
        return Err(format!(
            "{} is a symbolic link to {}, which is not there",
            path.display(),
            link.display()
        ));
    }
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if path.is_dir() {
        return Err(format!("{} is a folder: {what} is a file", path.display()));
    }
    if !dir.is_dir() {
        return Err(format!("there is no folder {} to write it in", dir.display()));
    }
    let cannot = |e: &std::io::Error| format!("cannot write {} ({})", path.display(), reason(e));
    match std::fs::metadata(path) {
        Ok(m) if !m.is_file() && !m.file_type().is_char_device() => Err(format!(
            "{} is {}, not a regular file: {what} is a file",
            path.display(),
            kind(&m)
        )),
        Ok(_) => std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .map(drop)
            .map_err(|e| cannot(&e)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let name = path.file_name().map_or("output".into(), |n| n.to_string_lossy());
            let probe = dir.join(format!(".{name}.{}.probe", std::process::id()));
            match std::fs::OpenOptions::new().write(true).create_new(true).open(&probe) {
                Ok(_) => {
                    let _ = std::fs::remove_file(&probe);
                    Ok(())
                }
                Err(e) => Err(format!("cannot write in the folder {} ({})", dir.display(), reason(&e))),
            }
        }
        Err(e) => Err(cannot(&e)),
    }
}

/// Writes `bytes` to `path` whole or not at all ([`write_with`]); the reason in one
/// clause if it could not.
pub fn replace(path: &Path, bytes: &[u8]) -> Result<(), String> {
    use std::io::Write;
    write_with(path, |file| file.write_all(bytes))
        .map_err(|e| format!("cannot write {} ({})", path.display(), reason(&e)))
}

/// Writes `path` by `fill`, whole or not at all: `fill` writes a file of this process's
/// beside it (named as `path` with its extension kept: [`part_of`]), which is synced and
/// renamed over `path` once complete. A failure (a full disk) removes it and leaves the old
/// file as it was; what is at `path` meanwhile (a FIFO put there during the run) is never
/// opened, only replaced. A character device (`/dev/null`) is written directly.
pub fn write_with<R>(path: &Path, fill: impl FnOnce(&mut File) -> std::io::Result<R>) -> std::io::Result<R> {
    if is_device(path) {
        let mut file = std::fs::OpenOptions::new().write(true).open(path)?;
        return fill(&mut file);
    }
    let part = part_of(path);
    let done = write_part(&part, fill).and_then(|r| std::fs::rename(&part, path).map(|()| r));
    if done.is_err() {
        let _ = std::fs::remove_file(&part);
    }
    done
}

fn write_part<R>(part: &Path, fill: impl FnOnce(&mut File) -> std::io::Result<R>) -> std::io::Result<R> {
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).open(part)?;
    let r = fill(&mut file)?;
    file.sync_all()?;
    Ok(r)
}

/// Whether `path` is a character device (`/dev/null`): written directly, never renamed over.
pub fn is_device(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_char_device())
}

/// The file `path` is written into before it is renamed: beside it, hidden, this
/// process's, ending as `path` does (a plot's encoder goes by the extension):
/// `out/.perf.png.4242.part.png`.
pub fn part_of(path: &Path) -> PathBuf {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path.file_name().map_or("output".into(), |n| n.to_string_lossy());
    let ext = path
        .extension()
        .map(|e| format!(".{}", e.to_string_lossy()))
        .unwrap_or_default();
    dir.join(format!(".{name}.{}.part{ext}", std::process::id()))
}

/// What a file that is not a regular file is, in words.
pub fn kind(m: &std::fs::Metadata) -> &'static str {
    let t = m.file_type();
    if t.is_dir() {
        "a folder"
    } else if t.is_fifo() {
        "a FIFO (named pipe)"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() || t.is_block_device() {
        "a device"
    } else {
        "not a regular file"
    }
}

/// An I/O error as a person reads it: `permission denied`, not `Permission denied (os
/// error 13)`.
pub fn reason(e: &std::io::Error) -> String {
    let text = e.to_string();
    text.split(" (os error").next().unwrap_or(&text).to_lowercase()
}

#[cfg(test)]
mod written {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("nccl-workbook-output-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_failure_leaves_the_old_file_and_nothing_beside_it() {
        let d = dir("failure");
        let path = d.join("trace.json");
        std::fs::write(&path, "old").unwrap();
        let r = write_with(&path, |f| {
            use std::io::Write;
            f.write_all(b"half of the new")?;
            Err::<(), _>(std::io::Error::other("the disk is full"))
        });
        assert!(r.is_err());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "old");
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 1, "the part is removed");
        replace(&path, b"new").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_fifo_put_at_the_path_is_replaced_not_opened() {
        let d = dir("fifo");
        let path = d.join("result.json");
        let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path; mkfifo only creates the node.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // Opening the FIFO for writing would block until a reader came: it never does.
        replace(&path, b"{}").unwrap();
        assert!(std::fs::metadata(&path).unwrap().is_file());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn an_empty_path_or_a_dangling_link_is_refused_before_the_run() {
        assert!(check(Path::new(""), "a trace").unwrap_err().contains("an empty path"));
        let d = dir("link");
        let link = d.join("trace.json");
        std::os::unix::fs::symlink(d.join("gone").join("x.json"), &link).unwrap();
        let why = check(&link, "a trace").unwrap_err();
        assert!(
            why.contains("is a symbolic link to") && why.contains("not there"),
            "{why}"
        );
        assert_eq!(part_of(Path::new("out/perf.png")).extension().unwrap(), "png");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
