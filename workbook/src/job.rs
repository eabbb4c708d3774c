//! One case's job, run with bounds whatever the program does: its output kept up to
//! [`OUTPUT_MAX`] a stream (the rest read and dropped, so that no rank blocks on a full
//! pipe), the job's own process waited for, not the end of its output (which a process it
//! left behind may hold open), and every process of the job killed at the end of the case,
//! as a process group of its own.
//!
//! The job is the program's launcher, which starts its ranks as its own children: they, and
//! whatever they start, are in the launcher's process group unless they leave it. The
//! launcher waits for its ranks, so once it has exited, what is left in the group is left
//! behind, and is killed. testkit's runner, which the workbook's other tests use, is left
//! as it is: a test there reads its program's output to the end.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

/// What the checker keeps of each of a job's stdout and stderr: a report is a few KiB, and
/// the first lines of a flood say what it is.
pub const OUTPUT_MAX: usize = 8 << 20;

/// How long the checker reads what is left in the pipes once the job's group is killed:
/// its processes' output ends then, unless one outside the group still holds a pipe.
const DRAIN: Duration = Duration::from_secs(10);

/// How often the checker looks whether the job has ended.
const POLL: Duration = Duration::from_millis(5);

/// What the checker kept of one of a job's output streams.
#[derive(Debug, Default)]
pub struct Output {
    /// Its first [`OUTPUT_MAX`] bytes, as text (invalid UTF-8 replaced).
    pub text: String,
    /// How many bytes the job wrote there in all, the dropped ones included.
    pub written: u64,
    /// How many bytes of it were kept.
    kept: usize,
}

impl Output {
    /// Whether the job wrote more than the checker kept.
    pub fn cut(&self) -> bool {
        self.written > self.kept as u64
    }
}

/// How a case's job ended, and what it printed.
#[derive(Debug)]
pub struct Job {
    /// Its exit code (`None`: killed by a signal, or stopped at the time limit).
    pub code: Option<i32>,
    /// Its standard output, cut at [`OUTPUT_MAX`].
    pub stdout: Output,
    /// Its standard error, cut at [`OUTPUT_MAX`].
    pub stderr: Output,
    /// Whether it ended before the time limit (else it was killed).
    pub in_time: bool,
    /// Whether its output ended once its group was killed; false when, [`DRAIN`] later, a
    /// process outside the group (one that left it, `setsid`) still held stdout or stderr.
    pub closed: bool,
}

/// Runs `cmd` (a launcher) as a process group of its own, with stdin empty and its output
/// read on two threads, kept up to [`OUTPUT_MAX`] each; waits for it at most `limit`; then
/// kills its whole group (a process it left behind, or every process at the limit) and
/// reads what is left of its output for at most [`DRAIN`]. The job is no longer in the
/// terminal's foreground group, which a Ctrl-C reaches: the launcher dies with the checker
/// instead (`PR_SET_PDEATHSIG`), and its ranks with it (theirs). Call it from the thread
/// that lives as long as the checker: the kernel ties that signal to the thread that
/// started the process.
pub fn run(mut cmd: Command, limit: Duration) -> Result<Job, String> {
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.process_group(0);
    // SAFETY: the closure runs in the child between fork and exec, where only
    // async-signal-safe calls are sound: it makes one, prctl, and touches no memory.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
            Ok(())
        });
    }
    let program = cmd.get_program().to_string_lossy().into_owned();
    let mut child = cmd.spawn().map_err(|e| format!("could not start {program}: {e}"))?;
    // Its process group's id is its pid (process_group(0)).
    let group = child.id() as libc::pid_t;
    let (Some(out), Some(err)) = (child.stdout.take(), child.stderr.take()) else {
        kill_group(group);
        let _ = child.wait();
        return Err(format!(
            "started {program}, but its output was not piped to the checker"
        ));
    };
    let readers = read_capped(out, "stdout").and_then(|out| Ok((out, read_capped(err, "stderr")?)));
    let (out, err) = match readers {
        Ok(both) => both,
        Err(e) => {
            kill_group(group);
            let _ = child.wait();
            return Err(e);
        }
    };
    let start = Instant::now();
    let in_time = loop {
        if exited(group) {
            break true;
        }
        if start.elapsed() > limit {
            break false;
        }
        thread::sleep(POLL);
    };
    // Past the limit, told to stop first: its ranks remove what they made before they go
    // (one killed outright cannot), within a short grace.
    if !in_time {
        signal_group(group, libc::SIGTERM);
        let grace = Instant::now();
        while !exited(group) && grace.elapsed() < Duration::from_secs(2) {
            thread::sleep(POLL);
        }
    }
    // The launcher is not reaped yet (a zombie, or still running at the limit): its pid, the
    // group's id, cannot have been given to another process, so the signal reaches only this
    // job's processes.
    kill_group(group);
    let status = child.wait().ok();
    let deadline = Instant::now() + DRAIN;
    let (stdout, out_closed) = out.take(deadline);
    let (stderr, err_closed) = err.take(deadline);
    Ok(Job {
        code: status.and_then(|s| s.code()),
        stdout,
        stderr,
        in_time,
        closed: out_closed && err_closed,
    })
}

/// Whether process `pid`, a child of the checker, has exited; it is left to be reaped
/// (`WNOWAIT`), so that its pid stays its own. A child that cannot be waited for counts as
/// exited: there is nothing to wait for.
fn exited(pid: libc::pid_t) -> bool {
    // SAFETY: siginfo_t is plain data, for which all zeroes is a valid value.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: waitid writes only into `info`, which is ours and alive for the call.
    let said = unsafe {
        libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        )
    };
    if said != 0 {
        return std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted;
    }
    // SAFETY: waitid filled `info` in (or left it zeroed: no child has exited); si_pid is
    // set for the SIGCHLD-like information waitid returns.
    unsafe { info.si_pid() != 0 }
}

/// Sends SIGKILL to every process of process group `group`; one that has already ended, or
/// a group with no process left, is no error.
fn kill_group(group: libc::pid_t) {
    signal_group(group, libc::SIGKILL);
}

/// Sends `signal` to every process of process group `group`.
fn signal_group(group: libc::pid_t, signal: libc::c_int) {
    // A group id above 1: -1 would name every process the checker may signal, 0 its own group.
    if group > 1 {
        // SAFETY: kill(2) touches no memory of ours; a negative pid names a process group.
        unsafe {
            libc::kill(-group, signal);
        }
    }
}

/// What a reader thread has read of a pipe, shared with the checker.
#[derive(Default)]
struct Pipe {
    /// The first [`OUTPUT_MAX`] bytes.
    kept: Vec<u8>,
    /// Every byte read.
    written: u64,
    /// The checker has taken what was kept: the reader reads no more, and closes the pipe.
    taken: bool,
}

/// A pipe being read on a thread of its own.
struct Reader {
    pipe: Arc<Mutex<Pipe>>,
    /// Disconnected once the thread has ended (its sender dropped): the pipe is closed.
    ended: Receiver<()>,
}

/// Starts a thread that reads `from` to its end, keeping its first [`OUTPUT_MAX`] bytes and
/// counting the rest, so that the writer never waits on a full pipe.
fn read_capped(mut from: impl Read + Send + 'static, name: &str) -> Result<Reader, String> {
    let pipe = Arc::new(Mutex::new(Pipe::default()));
    let (done, ended) = mpsc::channel::<()>();
    let shared = Arc::clone(&pipe);
    thread::Builder::new()
        .name(format!("job {name}"))
        .spawn(move || {
            let _done = done;
            let mut chunk = vec![0u8; 64 << 10];
            loop {
                let n = match from.read(&mut chunk) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(_) => break,
                };
                let mut pipe = shared.lock().unwrap_or_else(PoisonError::into_inner);
                if pipe.taken {
                    break;
                }
                pipe.written += n as u64;
                let room = OUTPUT_MAX.saturating_sub(pipe.kept.len());
                pipe.kept.extend_from_slice(&chunk[..n.min(room)]);
            }
        })
        .map_err(|e| format!("could not start a thread to read the job's {name}: {e}"))?;
    Ok(Reader { pipe, ended })
}

impl Reader {
    /// What was read by `deadline` (all of it, if the pipe closed by then), and whether the
    /// pipe closed. A reader still waiting then reads no more once more arrives.
    fn take(self, deadline: Instant) -> (Output, bool) {
        let left = deadline.saturating_duration_since(Instant::now());
        let closed = !matches!(self.ended.recv_timeout(left), Err(RecvTimeoutError::Timeout));
        let mut pipe = self.pipe.lock().unwrap_or_else(PoisonError::into_inner);
        pipe.taken = true;
        let kept = std::mem::take(&mut pipe.kept);
        let output = Output {
            text: String::from_utf8_lossy(&kept).into_owned(),
            written: pipe.written,
            kept: kept.len(),
        };
        (output, closed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `sh -c SCRIPT`, run as a case's job is.
    fn sh(script: &str, limit: Duration) -> Job {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", script]);
        run(cmd, limit).expect("sh starts")
    }

    #[test]
    fn output_is_kept_up_to_the_bound_and_counted_past_it() {
        // 8 MiB + 1 MiB of zeros on stdout, a line on stderr.
        let job = sh(
            "head -c 9437184 /dev/zero; echo said >&2; exit 3",
            Duration::from_secs(60),
        );
        assert!(job.in_time && job.closed, "{job:?}");
        assert_eq!(job.code, Some(3));
        assert_eq!(job.stdout.written, 9 << 20);
        assert_eq!(job.stdout.text.len(), OUTPUT_MAX);
        assert!(job.stdout.cut());
        assert_eq!(job.stderr.text, "said\n");
        assert!(!job.stderr.cut());
    }

    #[test]
    fn what_the_job_leaves_behind_is_killed_not_waited_for() {
        // A process left behind holding stdout, which prints its pid first.
        let job = sh("sleep 40 & echo $!", Duration::from_secs(60));
        assert!(job.in_time && job.closed, "{job:?}");
        assert_eq!(job.code, Some(0));
        let pid: u32 = job.stdout.text.trim().parse().expect("a pid");
        let start = Instant::now();
        while !testkit::ended(pid) && start.elapsed() < Duration::from_secs(10) {
            thread::sleep(Duration::from_millis(20));
        }
        assert!(testkit::ended(pid), "sleep {pid} still runs");
    }

    #[test]
    fn past_the_limit_every_process_of_the_job_is_killed() {
        let job = sh("sleep 40 & echo $!; sleep 40", Duration::from_millis(500));
        assert!(!job.in_time && job.closed, "{job:?}");
        assert_eq!(job.code, None);
        let pid: u32 = job.stdout.text.trim().parse().expect("a pid");
        let start = Instant::now();
        while !testkit::ended(pid) && start.elapsed() < Duration::from_secs(10) {
            thread::sleep(Duration::from_millis(20));
        }
        assert!(testkit::ended(pid), "sleep {pid} still runs");
    }
}
