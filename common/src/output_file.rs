//! A file the run will write at its end (`--trace`, the benchmark's `--plot` and `-J`),
//! checked before any rank starts: a result that cannot be saved stops the run before
//! minutes of work, not after them.

use std::os::unix::fs::FileTypeExt;
use std::path::Path;

/// Whether `what` ("a trace", "a plot", "a result") can be written at `path`: its folder
/// exists; an existing file is a regular file (or a character device, such as
/// `/dev/null`; a FIFO would hold the writer until someone reads it) that this process may
/// write, not truncated here (the run may still fail, and the file was someone's); a new
/// one is a file it may create in that folder (tried with a file of its own, removed at
/// once). The reason, in one clause, if not.
pub fn check(path: &Path, what: &str) -> Result<(), String> {
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

/// Writes `bytes` to `path` whole or not at all: into a file of this process's beside it,
/// renamed over it once complete, so that a failure (a full disk) leaves the old file as
/// it was.
pub fn replace(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path.file_name().map_or("output".into(), |n| n.to_string_lossy());
    let part = dir.join(format!(".{name}.{}.part", std::process::id()));
    let written = std::fs::write(&part, bytes).and_then(|()| std::fs::rename(&part, path));
    written.map_err(|e| {
        let _ = std::fs::remove_file(&part);
        format!("cannot write {} ({})", path.display(), reason(&e))
    })
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
