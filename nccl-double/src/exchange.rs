//! Where ranks meet: one folder per unique id, `/dev/shm/nccl-double-<pid>-<hex>/` (or
//! under `NCCL_DOUBLE_DIR`; `<pid>` made the id, `<hex>` is its random part), shared by
//! every process and thread of the job.
//!
//! Every file is written under a temporary name and then renamed (or hard-linked, when
//! only the first writer may win), so a reader sees all of a file or nothing. Files:
//!
//! | name | written by | holds |
//! |---|---|---|
//! | `rank-<r>` | rank r at init (first claimer wins) | its card: world size, NCCL version, pid, bus id, hosts |
//! | `op-<seq>-<r>` | rank r | its call #seq (a description line, then its data) |
//! | `done-<r>` | rank r | the last call it completed, so old `op-` files can go |
//! | `msg-<from>-<to>-<n>` | sender | message #n of a send/recv pair (removed by the receiver) |
//! | `ack-<from>-<to>-<n>` | receiver | "ok" or why the pair did not match (removed by the sender) |
//! | `failed-<pid>-<k>` | a rank that broke a rule, or saw that another did | why: the others stop waiting |
//! | `left-<r>` | rank r when its communicator goes | the last rank to leave removes the folder |
//! | `pid-<pid>` | every process that opens the folder, first | nothing: its name says who uses the folder |
//!
//! A wait lasts until what it waits for arrives, another rank publishes a failure, or
//! the communicator is aborted (the abort flag is read every 1-2 ms; the folder is read
//! as often for the first 100 ms, then every few ms). Like real NCCL, there is no
//! deadline and no liveness check: a rank that never comes, has left, was killed or is
//! stopped is simply waited for (`NCCL_DOUBLE_TIMEOUT_S`, unset by default, adds a
//! deadline as a safety net for debugging). A rank killed before leaving never writes
//! its `left-` file, so its folder stays behind, with the data of its last calls
//! (hundreds of MiB for large buffers). Cleaning up after SIGKILL is not the double's
//! job, but it says whose the folder is: the pid in its name (the id's maker) and a
//! `pid-<pid>` file for each process that opened it, written before anything else. A
//! folder whose processes are all gone is dead, and the workbook's launcher and every
//! start remove it (`workbook-nccl`'s `leftovers`).

pub use crate::result::Failure;
use crate::result::{REMOTE_ERROR, SYSTEM_ERROR};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Why a wait (or the work around it) stopped before its end.
#[derive(Debug)]
pub enum Halt {
    /// Something went wrong: the communicator fails with this.
    Failed(Failure),
    /// The communicator is being aborted: stop at once, report nothing.
    Aborted,
}

impl From<Failure> for Halt {
    fn from(f: Failure) -> Self {
        Halt::Failed(f)
    }
}

/// The optional deadline of every wait (`NCCL_DOUBLE_TIMEOUT_S`; 0 or unset: none).
fn timeout() -> Option<Duration> {
    static T: OnceLock<u64> = OnceLock::new();
    let s = *T.get_or_init(|| crate::env_number("NCCL_DOUBLE_TIMEOUT_S", 0));
    (s > 0).then(|| Duration::from_secs(s))
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

/// A rank's card, published when it joins: what NCCL's first all-gather at init
/// exchanges (`ncclPeerInfo`), as far as the double checks it.
#[derive(Clone, Debug, PartialEq)]
pub struct Card {
    pub nranks: usize,
    /// The NCCL version this rank loaded (`ncclGetVersion`).
    pub version: u32,
    pub pid: u32,
    /// The PCI bus id of its GPU (NCCL compares bus ids, not device ordinals).
    pub bus_id: String,
    pub real_host: String,
    /// Its GPU's UUID (`GPU-...`): what NCCL 2.30.7 compares instead of the bus id.
    pub uuid: String,
    /// The host as NCCL's `getHostHash` tells hosts apart: `NCCL_HOSTID` if set (so
    /// that ranks may play nodes of one GPU each on one GPU, as with real NCCL), else the
    /// node it plays (see [`crate::devices::host`]).
    pub host: String,
}

impl Card {
    /// This process's card, as a rank of `nranks` on the GPU with `bus_id`.
    pub fn mine(nranks: usize, bus_id: String) -> Self {
        Self {
            nranks,
            version: crate::version::version(),
            pid: std::process::id(),
            uuid: crate::devices::uuid_of_bus(&bus_id),
            bus_id,
            real_host: crate::devices::real_host(),
            host: std::env::var("NCCL_HOSTID").unwrap_or_else(|_| crate::devices::host().to_string()),
        }
    }

    /// One line of fields, then the host (which may hold spaces).
    pub fn to_bytes(&self) -> Vec<u8> {
        format!(
            "{} {} {} {} {} {}\n{}",
            self.nranks, self.version, self.pid, self.bus_id, self.real_host, self.uuid, self.host
        )
        .into_bytes()
    }

    /// A card read back (`None` if it is not one).
    pub fn parse(b: &[u8]) -> Option<Self> {
        let text = String::from_utf8_lossy(b);
        let (first, host) = text.split_once('\n')?;
        let mut f = first.split(' ');
        Some(Self {
            nranks: f.next()?.parse().ok()?,
            version: f.next()?.parse().ok()?,
            pid: f.next()?.parse().ok()?,
            bus_id: f.next()?.to_string(),
            real_host: f.next().unwrap_or("").to_string(),
            uuid: f.next().unwrap_or("").to_string(),
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

/// One job's meeting folder, seen from one rank (shared by the rank's calling thread and
/// its communicator's worker).
pub struct Room {
    dir: PathBuf,
    rank: usize,
    nranks: usize,
    /// Failure markers this rank wrote (not to be mistaken for another rank's).
    mine: Mutex<Vec<String>>,
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
        // Before any data: who uses the folder, so that it is removed only once all are gone.
        let member = dir.join(format!("pid-{}", std::process::id()));
        fs::write(&member, b"")
            .map_err(|e| Failure::new(SYSTEM_ERROR, format!("writing {}: {e}", member.display())))?;
        Ok(Self {
            dir,
            rank,
            nranks,
            mine: Mutex::new(Vec::new()),
        })
    }

    /// The room's name (what follows `nccl-double-` in its folder's name).
    pub fn name(&self) -> String {
        let folder = self
            .dir
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        folder.strip_prefix("nccl-double-").unwrap_or(&folder).to_string()
    }

    /// Where file `name` of the room is.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Writes `data` under a fresh temporary name in the room, to be renamed or linked.
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

    /// File `name`'s contents, if it exists.
    pub fn read(&self, name: &str) -> Option<Vec<u8>> {
        fs::read(self.path(name)).ok()
    }

    /// File `name`'s contents if it exists, or the failure to read one that does: no room
    /// in host memory for a rank's share is an error ([`crate::memory::no_room`]), not a
    /// file that has not arrived yet (which would be waited for until the deadline).
    fn read_share(&self, name: &str) -> Result<Option<Vec<u8>>, Failure> {
        match fs::read(self.path(name)) {
            Ok(data) => Ok(Some(data)),
            Err(e) if e.kind() == std::io::ErrorKind::OutOfMemory => {
                let bytes = fs::metadata(self.path(name)).map_or(0, |m| m.len() as usize);
                Err(Failure::new(
                    SYSTEM_ERROR,
                    format!("reading {name}: {}", crate::memory::no_room(bytes)),
                ))
            }
            Err(_) => Ok(None),
        }
    }

    /// Removes file `name` (gone already is fine).
    pub fn remove(&self, name: &str) {
        let _ = fs::remove_file(self.path(name));
    }

    /// Publishes a failure marker: every rank waiting in this folder stops with
    /// `ncclRemoteError` and `why`.
    pub fn mark_failed(&self, why: &str) {
        let k = TMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("failed-{}-{k}", std::process::id());
        self.mine.lock().unwrap_or_else(|p| p.into_inner()).push(name.clone());
        let _ = self.publish(&name, why.as_bytes());
    }

    /// The first failure published by another rank, if any.
    fn failure_of_others(&self) -> Option<String> {
        let entries = fs::read_dir(&self.dir).ok()?;
        let mine = self.mine.lock().unwrap_or_else(|p| p.into_inner());
        entries.flatten().find_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            (name.starts_with("failed-") && !mine.contains(&name))
                .then(|| fs::read_to_string(e.path()).unwrap_or_default())
        })
    }

    /// Waits until every wanted file exists and returns their contents, in order. `check`
    /// sees each file as it arrives (so a disagreement shows before everyone is there).
    /// Ends early with `ncclRemoteError` when another rank published a failure, and with
    /// [`Halt::Aborted`] as soon as `abort` is set; never because a rank is slow, gone or
    /// stopped (unless `NCCL_DOUBLE_TIMEOUT_S` is set).
    pub fn wait(
        &self,
        wanted: &[Wanted],
        what: &str,
        check: &mut Check<'_>,
        abort: &AtomicBool,
    ) -> Result<Vec<Vec<u8>>, Halt> {
        let start = Instant::now();
        let mut got: Vec<Option<Vec<u8>>> = vec![None; wanted.len()];
        // Reads what has arrived; true when everything has.
        let mut read_all = |got: &mut Vec<Option<Vec<u8>>>| -> Result<bool, Failure> {
            for (w, slot) in wanted.iter().zip(got.iter_mut()) {
                if slot.is_none()
                    && let Some(data) = self.read_share(&w.name)?
                {
                    check(w.from, &data)?;
                    *slot = Some(data);
                }
            }
            Ok(got.iter().all(Option::is_some))
        };
        let mut pause = Duration::from_micros(20);
        let mut round = 0u64;
        loop {
            if abort.load(Ordering::Acquire) {
                return Err(Halt::Aborted);
            }
            // The folder is read at every round for the first 100 ms, then every 4th
            // (about every 8 ms): a wait for ever must not keep the machine busy.
            if round.is_multiple_of(4) || start.elapsed() < Duration::from_millis(100) {
                if read_all(&mut got)? {
                    break;
                }
                if let Some(why) = self.failure_of_others() {
                    // A file published just before the failure marker still counts.
                    if read_all(&mut got)? {
                        break;
                    }
                    return Err(Failure::new(REMOTE_ERROR, format!("{why}{WAITING}{what})")).into());
                }
                if let Some(limit) = timeout()
                    && start.elapsed() > limit
                {
                    let mut ranks: Vec<String> = wanted
                        .iter()
                        .zip(&got)
                        .filter(|(_, g)| g.is_none())
                        .map(|(w, _)| w.from.to_string())
                        .collect();
                    ranks.dedup();
                    return Err(Failure::new(
                        REMOTE_ERROR,
                        format!(
                            "timed out after {} s (NCCL_DOUBLE_TIMEOUT_S) waiting for {what}: rank(s) {} never arrived",
                            limit.as_secs(),
                            ranks.join(", ")
                        ),
                    )
                    .into());
                }
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(2));
            round += 1;
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
            version: 21803,
            pid: 77,
            bus_id: "0000:3B:00.0".into(),
            real_host: "box".into(),
            uuid: "GPU-0a1b".into(),
            host: "node a".into(),
        };
        assert_eq!(Card::parse(&c.to_bytes()), Some(c));
    }
}
