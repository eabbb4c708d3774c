//! Errors and exit codes: 2 for what the user asked wrongly, 1 for what went wrong at
//! run time, and one line on stderr either way.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};

/// Exit status for bad input (flags, variables, sizes), as clap uses.
pub const EXIT_USAGE: u8 = 2;
/// Exit status for a failure at run time (a peer lost, a wrong result, a timeout).
pub const EXIT_FAILURE: u8 = 1;

/// Bad input from the user: exits with status 2.
#[derive(Debug)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// An error every rank meets alike (a bad --root, a failed check that rank 0 reported):
/// when all ranks print to one place, only rank 0 says it.
#[derive(Debug)]
pub struct SharedError {
    /// What every rank would say.
    pub message: String,
    /// Whether it is the user's input that is wrong.
    pub usage: bool,
}

impl fmt::Display for SharedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for SharedError {}

/// A failure whose message already names the rank that caused it (the watchdog's
/// finding): nothing is added to it.
#[derive(Debug)]
pub struct Culprit(pub String);

impl fmt::Display for Culprit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Culprit {}

/// A link to a peer failed (the CPU backend's): the peer's end closed, or nothing moved
/// for the whole `--timeout` (`timed_out`). The rank then asks the store whom to blame
/// (`Session::explain`): the peer may only be waiting for a third rank.
#[derive(Debug)]
pub struct LinkFailed {
    /// The peer, as the world numbers it.
    pub peer: usize,
    /// Nothing moved for the whole `--timeout` (else the peer's end closed).
    pub timed_out: bool,
    /// What to say.
    pub message: String,
}

impl fmt::Display for LinkFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for LinkFailed {}

/// The link failure `err` comes from, if any.
pub fn link_failed(err: &anyhow::Error) -> Option<&LinkFailed> {
    err.chain().find_map(|e| e.downcast_ref::<LinkFailed>())
}

/// Whether `err` already names the rank that caused it.
pub fn names_culprit(err: &anyhow::Error) -> bool {
    err.chain().any(|e| e.downcast_ref::<Culprit>().is_some())
}

/// A usage error with this message.
pub fn usage(msg: impl Into<String>) -> anyhow::Error {
    UsageError(msg.into()).into()
}

/// Whether `err` (or anything it wraps) is the user's input being wrong.
pub fn is_usage(err: &anyhow::Error) -> bool {
    err.chain()
        .any(|e| e.downcast_ref::<UsageError>().is_some() || e.downcast_ref::<SharedError>().is_some_and(|s| s.usage))
}

/// Whether `err` is one that every rank meets alike.
pub fn is_shared(err: &anyhow::Error) -> bool {
    err.chain().any(|e| e.downcast_ref::<SharedError>().is_some())
}

/// The exit status for `err`.
pub fn exit_code(err: &anyhow::Error) -> u8 {
    if is_usage(err) { EXIT_USAGE } else { EXIT_FAILURE }
}

/// Writes one line to stderr in a single write, so that lines from several ranks
/// sharing a terminal or a Slurm `.out` file never interleave mid-line.
///
/// Once another thread is ending the process ([`exit_now`]), this thread says nothing and
/// waits there for the end: the process's last line is the one that ends it, alone.
pub fn say_line(line: &str) {
    if ENDING.load(Ordering::Acquire) {
        wait_for_the_end();
    }
    write_line(line);
}

fn write_line(line: &str) {
    use std::io::Write;
    let line = cut_long_words(&one_line(line), 200);
    let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
}

/// Set by the first thread that ends the process at once ([`exit_now`], [`exit_cleaned`]).
/// A deadline's line and the failure it ends can race: the deadline fires while the
/// call it watched is returning (a clean-up of the ending thread can even free it: the
/// double's abort returns once its meeting folder is removed), and the main thread would
/// then say its own line before the `_exit`.
static ENDING: AtomicBool = AtomicBool::new(false);

/// The process is ending now, by a signal taken by its own thread ([`crate::signals`]):
/// from here on, no other thread says a line.
pub(crate) fn hush() {
    ENDING.store(true, Ordering::Release);
}

/// Parks this thread for good: another one is ending the process.
fn wait_for_the_end() -> ! {
    loop {
        std::thread::park();
    }
}

/// `line` as one line whatever it quotes: a newline or another control character (a value
/// pasted into a variable with its newline) written as its escape, `\n`.
pub fn one_line(line: &str) -> String {
    let line = line.trim_end_matches(['\n', '\r']);
    match line.chars().any(char::is_control) {
        false => line.to_string(),
        true => line
            .chars()
            .map(|c| match c.is_control() {
                true => c.escape_default().to_string(),
                false => c.to_string(),
            })
            .collect(),
    }
}

/// What [`print_line`] does once stdout's reader has gone away (`| head -5` closed the
/// pipe): Rust ignores SIGPIPE, so a write fails with EPIPE, and `println!` would panic.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum OnClosed {
    /// Drop this line and every later one, and go on: a rank, which must finish the job
    /// with the others (its exit status is the job's).
    Drop,
    /// End the process at once, quietly, with status 0: a tool whose output is all it
    /// does (`cargo workbook`), which has nobody left to tell.
    Exit,
}

/// Whether stdout's reader went away: later lines are dropped unwritten.
static STDOUT_CLOSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Writes one line to stdout, in one write: every binary's output goes through here, so
/// that output to a closed pipe ends quietly (as `closed` says), never with a panic.
pub fn print_line(line: &str, closed: OnClosed) {
    use std::io::Write;
    if STDOUT_CLOSED.load(Ordering::Relaxed) {
        return;
    }
    let mut out = std::io::stdout().lock();
    let written = out.write_all(format!("{line}\n").as_bytes()).and_then(|()| out.flush());
    if let Err(e) = written
        && e.kind() == std::io::ErrorKind::BrokenPipe
    {
        STDOUT_CLOSED.store(true, Ordering::Relaxed);
        if closed == OnClosed::Exit {
            std::process::exit(0);
        }
    }
}

/// The line that says `e` for `rank` (`None`: the launcher): `error: rank 2: ...`. Contexts
/// already naming the rank are not repeated; a message that lists ranks ("check FAILED
/// ...: rank 0: 4 wrong; rank 1: ...") is left whole.
pub fn line(rank: Option<usize>, e: &anyhow::Error) -> String {
    let who = rank.map(|r| format!("rank {r}: ")).unwrap_or_default();
    let bare = who.trim_end_matches(": ");
    let parts: Vec<String> = e
        .chain()
        .map(|c| c.to_string())
        .filter(|c| c != bare)
        .map(|c| c.strip_prefix(&who).map(str::to_string).unwrap_or(c))
        .collect();
    format!("error: {who}{}", parts.join(": "))
}

/// Removes, when this process ends at once ([`exit_now`]), the files it made itself: the
/// NCCL backend registers the private folders of its library links and simulated GPUs.
/// A function registered twice runs once.
pub fn clean_up_at_exit(clean_up: fn()) {
    let mut all = AT_EXIT.lock().unwrap_or_else(|p| p.into_inner());
    if !all.contains(&clean_up) {
        all.push(clean_up);
    }
}

/// Runs what [`clean_up_at_exit`] registered, now: at once before `_exit`, or at the end
/// of a rank whose launcher is gone ([`crate::signals::orphaned`]), which nobody else
/// will clean up after.
pub fn run_clean_ups() {
    // Not a plain lock: the thread that holds it may be the one stuck; after a short
    // wait, nothing is removed.
    let start = std::time::Instant::now();
    loop {
        match AT_EXIT.try_lock() {
            Ok(all) => return all.iter().for_each(|f| f()),
            Err(_) if start.elapsed() < std::time::Duration::from_millis(100) => {
                std::thread::sleep(std::time::Duration::from_millis(1))
            }
            Err(_) => return,
        }
    }
}

/// What [`clean_up_at_exit`] registered.
static AT_EXIT: std::sync::Mutex<Vec<fn()>> = std::sync::Mutex::new(Vec::new());

/// Ends this process at once: says `line` on stderr (one line, as [`say_line`]), removes
/// the files this process made itself (what [`clean_up_at_exit`] registered), then
/// `_exit(code)`. No destructor and no `atexit` handler runs:
/// for a deadline that fires while another thread of the process may be inside CUDA or
/// NCCL, where `exit` would run the CUDA runtime's static destructors (linked into
/// libnccl) concurrently with that thread, and they can wait for it for ever.
pub fn exit_now(line: &str, code: u8) -> ! {
    use std::io::Write;
    if ENDING.swap(true, Ordering::AcqRel) {
        wait_for_the_end();
    }
    write_line(line);
    let _ = std::io::stderr().flush();
    exit_cleaned(code)
}

/// Ends this process at once, saying nothing: the files it made removed (what
/// [`clean_up_at_exit`] registered), then `_exit(code)`, as [`exit_now`] does.
pub fn exit_cleaned(code: u8) -> ! {
    hush();
    run_clean_ups();
    // SAFETY: _exit ends the process without running any code of its own; nothing after
    // this line is needed (the output is written, our files are removed).
    unsafe { libc::_exit(i32::from(code)) }
}

/// `line` with every word (a run without spaces) longer than `max` characters cut, as
/// [`cut`] does: a message that quotes a 100 kB value (a variable, a flag, an address)
/// stays one readable line, wherever the value came from.
pub fn cut_long_words(line: &str, max: usize) -> String {
    if line.len() <= max {
        return line.to_string();
    }
    line.split(' ').map(|w| cut(w, max)).collect::<Vec<_>>().join(" ")
}

/// `text` as an error message may echo it: whole when short, else its first `max`
/// characters and a count of the rest (a 100 kB variable must not flood the terminal).
pub fn cut(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => text.to_string(),
        Some((at, _)) => format!("{}... ({} more bytes)", &text[..at], text.len() - at),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_with_a_newline_in_it_stays_one_line() {
        assert_eq!(
            one_line("error: NCCL_ALGO=ring\nx: unknown\n"),
            "error: NCCL_ALGO=ring\\nx: unknown"
        );
        assert_eq!(one_line("a\tb\u{7}"), "a\\tb\\u{7}");
        assert_eq!(one_line("plain, µs"), "plain, µs");
    }

    #[test]
    fn long_values_are_cut_in_messages() {
        let long = "7".repeat(100_000);
        let line = cut_long_words(&format!("error: RANK=\"{long}\" is not a number"), 200);
        assert!(line.len() < 300, "{}", line.len());
        assert!(line.starts_with("error: RANK=\"777"), "{line}");
        assert!(line.ends_with("more bytes) is not a number"), "{line}");
        assert_eq!(cut_long_words("short words stay", 200), "short words stay");
    }

    /// Set in the copy of this test that ends itself (see below).
    const ENDING_CHILD: &str = "WORKBOOK_TEST_ENDING_CHILD";

    #[test]
    fn the_line_that_ends_the_process_is_its_last_whatever_a_clean_up_frees() {
        use std::sync::atomic::AtomicBool;
        static CLEANING: AtomicBool = AtomicBool::new(false);
        const NAME: &str = "error::tests::the_line_that_ends_the_process_is_its_last_whatever_a_clean_up_frees";
        if std::env::var_os(ENDING_CHILD).is_some() {
            // As a deadline does when NCCL's abort hangs: the watcher ends the process
            // while the main thread waits; its clean-up frees the wait (the double's abort
            // returns once its meeting folder is gone), and the main thread, free, would
            // say its own failure before the `_exit`.
            fn freeing_clean_up() {
                CLEANING.store(true, Ordering::Release);
                std::thread::sleep(std::time::Duration::from_millis(300));
            }
            clean_up_at_exit(freeing_clean_up);
            std::thread::spawn(|| {
                while !CLEANING.load(Ordering::Acquire) {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                say_line("error: rank 0: the failure, said again by the freed thread");
            });
            exit_now(
                "error: rank 0: the failure; then the abort did not return",
                EXIT_FAILURE,
            );
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", NAME, "--nocapture", "--test-threads", "1"])
            .env(ENDING_CHILD, "1")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(i32::from(EXIT_FAILURE)), "{stderr}");
        assert_eq!(stderr, "error: rank 0: the failure; then the abort did not return\n");
    }
}
