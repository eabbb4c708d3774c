//! Whom the ranks blame, told to their launcher: so that every launcher names the rank at
//! fault, not the first of its own ranks to exit.
//!
//! A launcher sees only its own ranks: which exited, how, and which it finds stopped. A
//! rank stopped or killed on another node shows here only as a local rank that gave up
//! waiting for it. The ranks know better: they asked the store, which gives every rank
//! the same answer ([`crate::rendezvous::Store::blame`]). So the launcher opens a pipe
//! before it starts its ranks and passes its writing end down (`NCCL_WORKBOOK_BLAME_FD`);
//! a rank that fails because of another writes one line into it, `RANK<tab>CAUSE`, before
//! it exits, and the launcher reads the first one once its ranks have ended. Nothing is
//! left behind: a pipe is gone with the last process that holds it.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::process::Command;

/// The variable that gives a rank the descriptor of its launcher's pipe.
const ENV_FD: &str = "NCCL_WORKBOOK_BLAME_FD";

/// The longest line a rank writes: well under `PIPE_BUF` (4096), so that each write is
/// whole and never mixed with another rank's.
const MAX_LINE: usize = 512;

/// The launcher's pipe, which its ranks write their verdicts into.
pub struct Verdicts {
    read: OwnedFd,
    /// The writing end, which the ranks inherit; the launcher closes its own copy once
    /// they are started.
    write: Option<OwnedFd>,
}

impl Verdicts {
    /// A new pipe (both ends closed on `exec`, and neither blocks: a rank never waits to
    /// write, the launcher never waits to read). `None` if the system refuses one: the
    /// launcher then names what it sees itself.
    pub fn new() -> Option<Verdicts> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: pipe2 writes two descriptors into the array it is given.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            return None;
        }
        // SAFETY: both descriptors were just made, and are owned here alone.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        Some(Verdicts {
            read,
            write: Some(write),
        })
    }

    /// Makes `cmd` (a rank) inherit the writing end, and tells it which descriptor it is.
    pub fn pass_to(&self, cmd: &mut Command) {
        use std::os::unix::process::CommandExt;
        let Some(fd) = self.write.as_ref().map(|w| w.as_raw_fd()) else {
            return;
        };
        cmd.env(ENV_FD, fd.to_string());
        // SAFETY: fcntl is async-signal-safe, as code between fork and exec must be; it
        // changes the child's copy of the descriptor only.
        unsafe {
            cmd.pre_exec(move || {
                libc::fcntl(fd, libc::F_SETFD, 0);
                Ok(())
            });
        }
    }

    /// The ranks are started: the launcher's own writing end is closed.
    pub fn started(&mut self) {
        self.write = None;
    }

    /// The first verdict a rank wrote (rank at fault, and why), once the ranks have ended.
    pub fn first(&self) -> Option<(usize, String)> {
        let mut all = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            // SAFETY: read(2) into a buffer of the length given; the descriptor is ours.
            let n = unsafe { libc::read(self.read.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 || all.len() > 1 << 20 {
                break;
            }
            all.extend_from_slice(&buf[..n as usize]);
        }
        String::from_utf8_lossy(&all).lines().find_map(|line| {
            let (rank, cause) = line.split_once('\t')?;
            Some((rank.parse().ok()?, cause.to_string()))
        })
    }
}

/// Tells this rank's launcher (if it was started by one) that rank `culprit` is to blame
/// for the job's failure, and why (`cause`: what follows "rank N " in a message). Once per
/// process: the first verdict is the one that counts.
pub fn tell_launcher(culprit: usize, cause: &str) {
    static TOLD: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let Some(fd) = std::env::var(ENV_FD).ok().and_then(|v| v.parse::<RawFd>().ok()) else {
        return;
    };
    if !is_pipe(fd) || TOLD.swap(true, std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    let cause: String = cause.replace(['\t', '\n'], " ");
    let mut line = format!("{culprit}\t{}", crate::error::cut(&cause, 300));
    let mut end = line.len().min(MAX_LINE - 1);
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    line.truncate(end);
    line.push('\n');
    // SAFETY: write(2) of a buffer of the length given, to a descriptor checked to be a
    // pipe (the launcher's); a full pipe refuses the write, which is then dropped.
    unsafe {
        libc::write(fd, line.as_ptr().cast(), line.len());
    }
}

/// Whether descriptor `fd` is open and a pipe: a variable set by hand, or left over,
/// must never make a rank write into its terminal or a file.
fn is_pipe(fd: RawFd) -> bool {
    // SAFETY: fstat writes one stat, which `st` is; any descriptor number may be asked.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    unsafe { libc::fstat(fd, &mut st) == 0 && (st.st_mode & libc::S_IFMT) == libc::S_IFIFO }
}

/// The rank a message blames and why, when it begins with it ("rank 3 stopped responding
/// (...): ..."): its first words, up to the first colon outside parentheses.
pub fn named_in(message: &str) -> Option<(usize, String)> {
    let rest = message.strip_prefix("rank ")?;
    let digits = rest.find(|c: char| !c.is_ascii_digit())?;
    let rank = rest[..digits].parse().ok()?;
    let rest = rest[digits..].trim_start_matches([' ', ',']);
    let mut depth = 0i32;
    let mut end = rest.len();
    for (i, c) in rest.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ':' | ';' if depth <= 0 => {
                end = i;
                break;
            }
            _ => {}
        }
    }
    let cause = rest[..end].split(" while this rank").next().unwrap_or_default().trim();
    Some((rank, cause.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rank_and_cause_a_message_begins_with() {
        assert_eq!(
            named_in("rank 3 stopped responding (no heartbeat for 4 s: its process is stopped or frozen): all-reduce"),
            Some((
                3,
                "stopped responding (no heartbeat for 4 s: its process is stopped or frozen)".into()
            ))
        );
        assert_eq!(
            named_in("rank 2 failed (its connection closed) while this rank was waiting for the GPU"),
            Some((2, "failed (its connection closed)".into()))
        );
        assert_eq!(
            named_in("rank 0, which hosts the store, stopped answering or is gone (lost)"),
            Some((0, "which hosts the store, stopped answering or is gone (lost)".into()))
        );
        assert_eq!(named_in("nothing finished in 4 s"), None);
    }

    #[test]
    fn a_verdict_goes_through_the_pipe_and_the_first_is_kept() {
        let mut v = Verdicts::new().unwrap();
        let fd = v.write.as_ref().unwrap().as_raw_fd();
        for line in ["5\tfailed first (its connection closed)\n", "7\tstopped responding\n"] {
            // SAFETY: a write to the pipe just made.
            unsafe { libc::write(fd, line.as_ptr().cast(), line.len()) };
        }
        v.started();
        assert_eq!(v.first(), Some((5, "failed first (its connection closed)".into())));
        assert!(is_pipe(v.read.as_raw_fd()));
        assert!(!is_pipe(-1));
    }
}
