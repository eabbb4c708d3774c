//! Where ranks meet: one folder per unique id, `/dev/shm/nccl-double-<id>/` (or under
//! `NCCL_DOUBLE_DIR`), shared by every process and thread of the job.
//!
//! Every file is written under a temporary name and then renamed (or hard-linked, when
//! only the first writer may win), so a reader sees all of a file or nothing. Files:
//!
//! | name | written by | holds |
//! |---|---|---|
//! | `rank-<r>` | rank r at init (first claimer wins) | its card: world size, device, pid, hosts |
//! | `op-<seq>-<r>` | rank r | its call #seq (a description line, then its data) |
//! | `done-<r>` | rank r | the last call it completed, so old `op-` files can go |
//! | `msg-<from>-<to>-<n>` | sender | message #n of a send/recv pair (removed by the receiver) |
//! | `ack-<from>-<to>-<n>` | receiver | "ok" or why the pair did not match (removed by the sender) |
//! | `failed-<pid>-<k>` | a rank that failed | why: the others stop waiting at once |
//! | `left-<r>` | rank r when its communicator goes | the last rank to leave removes the folder |
//!
//! Every wait has a deadline (`NCCL_DOUBLE_TIMEOUT_S`, default 60 s), ends early when a
//! rank published a failure or left, and checks that the processes it waits for (those
//! of this machine) are still alive.

use crate::nccl::{NcclResult, REMOTE_ERROR, SYSTEM_ERROR};
use std::cell::RefCell;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Why an operation failed: the NCCL result and a sentence.
#[derive(Debug)]
pub struct Failure {
    pub code: NcclResult,
    pub why: String,
}

impl Failure {
    pub fn new(code: NcclResult, why: impl Into<String>) -> Self {
        Self { code, why: why.into() }
    }
}

/// How long any wait may last (`NCCL_DOUBLE_TIMEOUT_S`, default 60 s).
pub fn timeout() -> Duration {
    static T: OnceLock<Duration> = OnceLock::new();
    *T.get_or_init(|| Duration::from_secs(crate::env_number("NCCL_DOUBLE_TIMEOUT_S", 60)))
}

/// This machine's name, as the kernel knows it (used to tell whether a rank's process
/// can be checked for life from here).
pub fn real_host() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

/// The host name for the duplicate-GPU rule: `NCCL_DOUBLE_HOST` (tests simulate several
/// nodes with it), else the node Slurm gave the task (emulated nodes share one real
/// host), else the real one.
pub fn host() -> String {
    std::env::var("NCCL_DOUBLE_HOST")
        .or_else(|_| std::env::var("SLURMD_NODENAME"))
        .unwrap_or_else(|_| real_host())
}

/// How a wait that failed because of another rank ends its message.
const WAITING: &str = " (this rank was waiting for ";

/// What a failure marker should say, so that whoever reads it learns the first failure:
/// a rank that failed because another one did passes that cause on, not wrapped again.
pub fn cause(rank: usize, remote: bool, why: &str) -> String {
    match why.split_once(WAITING) {
        Some((first, _)) if remote => first.to_string(),
        _ if remote => format!("rank {rank} gave up: {why}"),
        _ => format!("rank {rank} failed: {why}"),
    }
}

/// A rank's card, published when it joins.
#[derive(Clone, Debug, PartialEq)]
pub struct Card {
    pub nranks: usize,
    pub device: usize,
    pub pid: u32,
    pub real_host: String,
    pub host: String,
}

impl Card {
    pub fn mine(nranks: usize, device: usize) -> Self {
        Self {
            nranks,
            device,
            pid: std::process::id(),
            real_host: real_host(),
            host: host(),
        }
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        format!(
            "{} {} {} {}\n{}",
            self.nranks, self.device, self.pid, self.real_host, self.host
        )
        .into_bytes()
    }

    pub fn parse(b: &[u8]) -> Option<Self> {
        let text = String::from_utf8_lossy(b);
        let (first, host) = text.split_once('\n')?;
        let mut f = first.split(' ');
        Some(Self {
            nranks: f.next()?.parse().ok()?,
            device: f.next()?.parse().ok()?,
            pid: f.next()?.parse().ok()?,
            real_host: f.next().unwrap_or("").to_string(),
            host: host.to_string(),
        })
    }
}

/// Looks at each file as it arrives (the rank that wrote it, its contents).
pub type Check<'a> = dyn FnMut(usize, &[u8]) -> Result<(), Failure> + 'a;

/// A file to wait for, and the rank expected to write it.
pub struct Wanted {
    pub name: String,
    pub from: usize,
}

/// One job's meeting folder, seen from one rank.
pub struct Room {
    dir: PathBuf,
    rank: usize,
    nranks: usize,
    /// Failure markers this rank wrote (not to be mistaken for another rank's).
    mine: RefCell<Vec<String>>,
}

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

impl Room {
    /// Opens (creating if needed) the folder for the id whose random part is `name`.
    pub fn open(name: &str, rank: usize, nranks: usize) -> Result<Self, Failure> {
        let base = std::env::var_os("NCCL_DOUBLE_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                let shm = Path::new("/dev/shm");
                if shm.is_dir() {
                    shm.to_path_buf()
                } else {
                    std::env::temp_dir()
                }
            });
        let dir = base.join(format!("nccl-double-{name}"));
        fs::create_dir_all(&dir).map_err(|e| Failure::new(SYSTEM_ERROR, format!("creating {}: {e}", dir.display())))?;
        Ok(Self {
            dir,
            rank,
            nranks,
            mine: RefCell::new(Vec::new()),
        })
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn write_tmp(&self, name: &str, data: &[u8]) -> Result<PathBuf, Failure> {
        let k = TMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let tmp = self.dir.join(format!(".tmp-{}-{k}-{name}", std::process::id()));
        fs::write(&tmp, data).map_err(|e| Failure::new(SYSTEM_ERROR, format!("writing {}: {e}", tmp.display())))?;
        Ok(tmp)
    }

    /// Writes file `name` so that readers see all of it or nothing.
    pub fn publish(&self, name: &str, data: &[u8]) -> Result<(), Failure> {
        let tmp = self.write_tmp(name, data)?;
        fs::rename(&tmp, self.path(name))
            .map_err(|e| Failure::new(SYSTEM_ERROR, format!("publishing {}: {e}", self.path(name).display())))
    }

    /// Writes file `name` only if nobody has: `Ok(false)` if it already exists.
    pub fn claim(&self, name: &str, data: &[u8]) -> Result<bool, Failure> {
        let tmp = self.write_tmp(name, data)?;
        let linked = fs::hard_link(&tmp, self.path(name));
        let _ = fs::remove_file(&tmp);
        match linked {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(Failure::new(
                SYSTEM_ERROR,
                format!("claiming {}: {e}", self.path(name).display()),
            )),
        }
    }

    pub fn read(&self, name: &str) -> Option<Vec<u8>> {
        fs::read(self.path(name)).ok()
    }

    pub fn remove(&self, name: &str) {
        let _ = fs::remove_file(self.path(name));
    }

    /// Publishes a failure marker: every rank waiting in this folder stops with
    /// `ncclRemoteError` and `why`.
    pub fn mark_failed(&self, why: &str) {
        let k = TMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("failed-{}-{k}", std::process::id());
        self.mine.borrow_mut().push(name.clone());
        let _ = self.publish(&name, why.as_bytes());
    }

    /// The first failure published by another rank, if any.
    fn failure_of_others(&self) -> Option<String> {
        let entries = fs::read_dir(&self.dir).ok()?;
        let mine = self.mine.borrow();
        entries.flatten().find_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            (name.starts_with("failed-") && !mine.contains(&name))
                .then(|| fs::read_to_string(e.path()).unwrap_or_default())
        })
    }

    /// Why rank `r` can never write what we wait for: it left, or its process is gone.
    fn gone(&self, r: usize) -> Option<String> {
        if self.path(&format!("left-{r}")).exists() {
            return Some(format!(
                "rank {r} has already left the communicator (ncclCommDestroy/ncclCommAbort: its Comm was dropped)"
            ));
        }
        let card = Card::parse(&self.read(&format!("rank-{r}"))?)?;
        if card.pid == std::process::id() || card.real_host != real_host() {
            return None;
        }
        let state = fs::read_to_string(format!("/proc/{}/stat", card.pid))
            .ok()
            .and_then(|s| s.rsplit_once(')').map(|(_, rest)| rest.trim_start().chars().next()));
        match state {
            Some(Some('Z' | 'X')) | None => Some(format!("rank {r}'s process (pid {}) has exited", card.pid)),
            _ => None,
        }
    }

    /// Waits until every wanted file exists and returns their contents, in order. `check`
    /// sees each file as it arrives (so a disagreement shows before everyone is there).
    /// Fails with `ncclRemoteError` when another rank failed or left, or on timeout.
    pub fn wait(&self, wanted: &[Wanted], what: &str, check: &mut Check<'_>) -> Result<Vec<Vec<u8>>, Failure> {
        let start = Instant::now();
        let mut got: Vec<Option<Vec<u8>>> = vec![None; wanted.len()];
        // Reads what has arrived; true when everything has.
        let mut read_all = |got: &mut Vec<Option<Vec<u8>>>| -> Result<bool, Failure> {
            for (w, slot) in wanted.iter().zip(got.iter_mut()) {
                if slot.is_none()
                    && let Some(data) = self.read(&w.name)
                {
                    check(w.from, &data)?;
                    *slot = Some(data);
                }
            }
            Ok(got.iter().all(Option::is_some))
        };
        let mut pause = Duration::from_micros(20);
        let mut last_look = start;
        loop {
            if read_all(&mut got)? {
                break;
            }
            if let Some(why) = self.failure_of_others() {
                // A file published just before the failure marker still counts.
                if read_all(&mut got)? {
                    break;
                }
                return Err(Failure::new(REMOTE_ERROR, format!("{why}{WAITING}{what})")));
            }
            let pending: Vec<usize> = wanted
                .iter()
                .zip(&got)
                .filter(|(_, g)| g.is_none())
                .map(|(w, _)| w.from)
                .collect();
            if last_look.elapsed() > Duration::from_millis(200) {
                last_look = Instant::now();
                if let Some(why) = pending.iter().find_map(|&r| self.gone(r)) {
                    if read_all(&mut got)? {
                        break;
                    }
                    return Err(Failure::new(REMOTE_ERROR, format!("{why}{WAITING}{what})")));
                }
            }
            if start.elapsed() > timeout() {
                let mut ranks: Vec<String> = pending.iter().map(|r| r.to_string()).collect();
                ranks.dedup();
                return Err(Failure::new(
                    REMOTE_ERROR,
                    format!(
                        "timed out after {} s (NCCL_DOUBLE_TIMEOUT_S) waiting for {what}: rank(s) {} never arrived",
                        timeout().as_secs(),
                        ranks.join(", ")
                    ),
                ));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(2));
        }
        Ok(got.into_iter().map(Option::unwrap_or_default).collect())
    }

    /// Leaves the room as rank `self.rank`; the last rank to leave removes the folder.
    pub fn leave(&self) {
        let _ = self.publish(&format!("left-{}", self.rank), b"");
        if (0..self.nranks).all(|r| self.path(&format!("left-{r}")).exists()) {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cards_round_trip() {
        let c = Card {
            nranks: 4,
            device: 2,
            pid: 77,
            real_host: "box".into(),
            host: "node a".into(),
        };
        assert_eq!(Card::parse(&c.to_bytes()), Some(c));
    }
}
