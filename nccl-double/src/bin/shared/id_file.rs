//! The unique id of a fixture's job, passed through a file: rank 0 makes it and writes it
//! (under a temporary name, then renamed, so a reader sees all of it or nothing); the
//! others wait for the file, at most `timeout`. Shared by `nccl-double-probe` and
//! `nccl-double-bare`.

use std::path::Path;
use std::time::{Duration, Instant};

/// The id's 128 bytes: made by `make` on rank 0 and written to `path`, read from `path`
/// on the other ranks.
pub fn share(
    path: &Path,
    rank: usize,
    timeout: Duration,
    make: impl FnOnce() -> Result<[u8; 128], String>,
) -> Result<[u8; 128], String> {
    if rank == 0 {
        let bytes = make()?;
        let tmp = path.with_file_name(format!(".{}.tmp", std::process::id()));
        std::fs::write(&tmp, bytes)
            .and_then(|()| std::fs::rename(&tmp, path))
            .map_err(|e| format!("writing the id to {}: {e}", path.display()))?;
        return Ok(bytes);
    }
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(b) = std::fs::read(path)
            && let Ok(bytes) = <[u8; 128]>::try_from(b.as_slice())
        {
            return Ok(bytes);
        }
        if Instant::now() > deadline {
            return Err(format!("no id in {} after {} s", path.display(), timeout.as_secs()));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
