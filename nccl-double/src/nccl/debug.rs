//! NCCL's `INFO` lines, as `src/debug.cc` writes them (2.18 to 2.30): with `NCCL_DEBUG` at
//! `INFO` (or `ABORT`, or `TRACE`: every level from INFO up) and the line's subsystem let
//! through by `NCCL_DEBUG_SUBSYS` (default `INIT,BOOTSTRAP,ENV`; a leading `^` excludes the
//! listed ones; `ALL`), each line is `host:pid:tid [dev] NCCL INFO <text>`, written in one
//! write to NCCL's debug file: stdout, or the file `NCCL_DEBUG_FILE` names (below).
//!
//! The subsystems the double prints:
//! - `COLL`: one line per collective, send and receive, as NCCL prints it when the call
//!   has passed its checks (`ncclEnqueueCheck` in `src/enqueue.cc`, the same from 2.18 to
//!   2.28):
//!
//!   ```text
//!   host:4242:4242 [0] NCCL INFO AllReduce: opCount 0 sendbuff 0x5581… recvbuff 0x5581… count 4 datatype 7 op 0 root 0 comm 0x5581… [nranks=2] stream (nil)
//!   ```
//!
//!   `datatype` and `op` are NCCL's numbers (7 is ncclFloat32, 0 ncclSum); `root` is the
//!   peer of a send or receive (whose `sendbuff` NCCL prints as NULL: the buffer is
//!   `recvbuff`); `opCount` is the communicator's count of launches so far, one per
//!   ungrouped call and one per group;
//! - `ENV`: `NCCL_ALGO set by environment to …` (`super::tuning`);
//! - `TUNING`: the table of the tuning model at init, and the algorithm chosen per
//!   collective (`super::tuning`).
//!
//! `NCCL_DEBUG_FILE`, as `ncclDebugInit` reads it: when `NCCL_DEBUG` is `WARN` or above,
//! the name with `%h` replaced by the host's name (up to its first dot; from 2.29 with
//! `%` and `/` in it turned into `-`), `%p` by the pid, `%%` by `%` (any other `%x` kept
//! as it is) is opened once per process with `fopen(name, "w")` (created, or truncated),
//! and every line goes there; a name that expands to nothing, or a file that cannot be
//! opened, leaves the lines on stdout. So `/proc/self/fd/N` of a memfd works. NCCL makes the
//! file unbuffered up to 2.26 (`setbuf(file, nullptr)`) and line-buffered from 2.27
//! (`setlinebuf`; checked at every tag, 2.18.1 to 2.30.7), and every line ends in `\n`: in
//! both, a line is in the file when its call returns, as with the double's one write per
//! line. The double's own `nccl-double WARN` lines are not NCCL's: they stay on stderr.

use std::ffi::{c_int, c_uint};
use std::io::Write;
use std::sync::{Mutex, OnceLock};

/// Whether NCCL_DEBUG asks for INFO (or more) and NCCL_DEBUG_SUBSYS lets COLL through,
/// read once, as NCCL reads them.
pub fn coll() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| subsys("COLL"))
}

/// Whether NCCL_DEBUG asks for INFO and NCCL_DEBUG_SUBSYS lets ENV through (it does by
/// default), as for [`coll`].
pub fn env() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| subsys("ENV"))
}

/// Whether NCCL_DEBUG asks for INFO and NCCL_DEBUG_SUBSYS lets TUNING through (it does
/// not by default), as for [`coll`].
pub fn tuning() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| subsys("TUNING"))
}

/// [`subsys_from`] for this process's variables.
pub(super) fn subsys(name: &str) -> bool {
    subsys_from(
        std::env::var("NCCL_DEBUG").ok().as_deref(),
        std::env::var("NCCL_DEBUG_SUBSYS").ok().as_deref(),
        name,
    )
}

/// An `INFO(NCCL_ENV, …)` line, as NCCL prints it on the device `device`.
pub fn env_line(device: usize, text: &str) {
    if env() {
        info(device, text);
    }
}

/// An `INFO` line of `text` on the device `device`, whose subsystem the caller has let
/// through: the prefix, then the text, in one write to the debug file.
pub fn info(device: usize, text: &str) {
    write_line(prefixed(device, "INFO", text).as_bytes());
}

/// A `WARN` line of `text` on the device `device`, where `NCCL_DEBUG` asks for warnings
/// ([`warns`]; NCCL's level is NONE when it is unset): written as NCCL's
/// are, to its debug file (stdout, or `NCCL_DEBUG_FILE`), not to stderr.
pub fn warn(device: usize, text: &str) {
    if warns(std::env::var("NCCL_DEBUG").ok().as_deref()) {
        write_line(prefixed(device, "WARN", text).as_bytes());
    }
}

/// Whether this NCCL_DEBUG level prints warnings, as `ncclDebugInit` reads it
/// (`tempNcclDebugLevel > NCCL_LOG_VERSION`): WARN, INFO, ABORT or TRACE, in any case.
fn warns(level: Option<&str>) -> bool {
    level.is_some_and(|level| {
        ["WARN", "INFO", "ABORT", "TRACE"]
            .iter()
            .any(|l| l.eq_ignore_ascii_case(level))
    })
}

/// `host:pid:tid [device] NCCL LEVEL text`, as `src/debug.cc` writes a line.
fn prefixed(device: usize, level: &str, text: &str) -> String {
    format!(
        "{}:{}:{} [{device}] NCCL {level} {text}\n",
        host(),
        std::process::id(),
        thread_id()
    )
}

/// NCCL's debug file: stdout, or the file `NCCL_DEBUG_FILE` names (see the module's
/// doc), opened at the first use.
enum Sink {
    Stdout,
    File(Mutex<std::fs::File>),
}

/// The debug file, opened once per process: at the first line, or when a communicator
/// is made (NCCL's first log call of a process opens it, at any level, so that
/// `NCCL_DEBUG=WARN` makes an empty file too).
fn sink() -> &'static Sink {
    static SINK: OnceLock<Sink> = OnceLock::new();
    SINK.get_or_init(|| {
        let level = std::env::var("NCCL_DEBUG").ok();
        let name = std::env::var("NCCL_DEBUG_FILE").ok();
        match file_name(level.as_deref(), name.as_deref(), host(), std::process::id()) {
            Some(name) => match std::fs::File::create(&name) {
                Ok(f) => Sink::File(Mutex::new(f)),
                Err(_) => Sink::Stdout,
            },
            None => Sink::Stdout,
        }
    })
}

/// Opens the debug file if `NCCL_DEBUG_FILE` asks for one: called when a communicator
/// is made.
pub fn open() {
    sink();
}

/// Writes one whole line to the debug file (lines of several threads never mix).
fn write_line(line: &[u8]) {
    match sink() {
        Sink::Stdout => {
            let _ = std::io::stdout().lock().write_all(line);
        }
        Sink::File(f) => {
            let mut f = f.lock().unwrap_or_else(|e| e.into_inner());
            let _ = f.write_all(line);
        }
    }
}

/// The file `NCCL_DEBUG_FILE` names for these values of NCCL_DEBUG and NCCL_DEBUG_FILE, on
/// host `host` in process `pid`, as `ncclDebugInit` expands it; `None`: stdout.
fn file_name(level: Option<&str>, name: Option<&str>, host: &str, pid: u32) -> Option<String> {
    if !warns(level) {
        return None;
    }
    let mut out = String::new();
    let mut chars = name?.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('%') => out.push('%'),
            Some('h') => out.push_str(host),
            Some('p') => out.push_str(&pid.to_string()),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            // A '%' at the end: NCCL reads the terminating NUL as the "other" character,
            // writes the '%' and stops.
            None => out.push('%'),
        }
    }
    (!out.is_empty()).then_some(out)
}

/// [`coll`] for these values of NCCL_DEBUG and NCCL_DEBUG_SUBSYS.
#[cfg(test)]
fn coll_from(level: Option<&str>, subsys: Option<&str>) -> bool {
    subsys_from(level, subsys, "COLL")
}

/// Whether these NCCL_DEBUG and NCCL_DEBUG_SUBSYS print INFO lines of subsystem `name`:
/// INFO lines are printed at the levels INFO, ABORT and TRACE (`ncclDebugLog`: a line of
/// level INFO is dropped when the level set is below it).
fn subsys_from(level: Option<&str>, subsys: Option<&str>, name: &str) -> bool {
    let info = level.is_some_and(|l| ["INFO", "ABORT", "TRACE"].iter().any(|i| l.eq_ignore_ascii_case(i)));
    let subsys = subsys.unwrap_or("INIT,BOOTSTRAP,ENV");
    let (invert, list) = match subsys.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, subsys),
    };
    let named = list
        .split(',')
        .any(|s| s.eq_ignore_ascii_case(name) || s.eq_ignore_ascii_case("ALL"));
    info && named != invert
}

/// One call's line, as NCCL's `INFO(NCCL_COLL, …)` writes it.
pub struct CollLine<'a> {
    /// NCCL's `opName`: `AllReduce`, `Broadcast`, `Reduce`, `AllGather`, `ReduceScatter`,
    /// `Send`, `Recv`.
    pub op_name: &'a str,
    pub op_count: u64,
    pub sendbuff: usize,
    pub recvbuff: usize,
    pub count: usize,
    pub datatype: c_uint,
    pub op: c_uint,
    pub root: c_int,
    pub comm: usize,
    pub nranks: usize,
    pub stream: usize,
    /// The device current on the calling thread (NCCL's `cudaGetDevice`).
    pub device: usize,
}

/// A pointer as glibc's `%p` writes it: `0x…`, or `(nil)`.
fn pointer(p: usize) -> String {
    match p {
        0 => "(nil)".to_string(),
        p => format!("{p:#x}"),
    }
}

impl CollLine<'_> {
    /// The line, without its `host:pid:tid [dev] NCCL INFO ` prefix.
    fn text(&self) -> String {
        format!(
            "{}: opCount {:x} sendbuff {} recvbuff {} count {} datatype {} op {} root {} comm {} [nranks={}] stream {}",
            self.op_name,
            self.op_count,
            pointer(self.sendbuff),
            pointer(self.recvbuff),
            self.count,
            self.datatype,
            self.op,
            self.root,
            pointer(self.comm),
            self.nranks,
            pointer(self.stream)
        )
    }

    /// Prints the line to the debug file in one write (lines of several threads never
    /// mix), if [`coll`] asks for it.
    pub fn print(&self) {
        if coll() {
            info(self.device, &self.text());
        }
    }
}

/// The host's name up to its first dot, as NCCL's `getHostName(…, '.')` keeps it; from
/// 2.29 (`getHostNameForLog`) with `%` and `/` turned into `-`.
fn host() -> &'static str {
    static HOST: OnceLock<String> = OnceLock::new();
    HOST.get_or_init(|| {
        let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        let name = name
            .trim()
            .split('.')
            .next()
            .filter(|n| !n.is_empty())
            .unwrap_or("localhost")
            .to_string();
        if crate::version::version() >= 22900 {
            name.replace(['%', '/'], "-")
        } else {
            name
        }
    })
}

/// The calling thread's kernel id, as NCCL prints it (`syscall(SYS_gettid)`): the last
/// part of the link `/proc/thread-self` (`<pid>/task/<tid>`), 0 if it cannot be read.
fn thread_id() -> u64 {
    std::fs::read_link("/proc/thread-self")
        .ok()
        .and_then(|p| p.file_name()?.to_str()?.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coll_lines_follow_nccl_debug_and_its_subsystems() {
        assert!(!coll_from(None, Some("COLL")));
        assert!(!coll_from(Some("WARN"), Some("COLL")));
        assert!(
            !coll_from(Some("INFO"), None),
            "the default subsystems are INIT,BOOTSTRAP,ENV"
        );
        assert!(coll_from(Some("INFO"), Some("INIT,COLL")));
        assert!(coll_from(Some("info"), Some("ALL")));
        assert!(coll_from(Some("TRACE"), Some("^INIT")));
        assert!(!coll_from(Some("INFO"), Some("^INIT,COLL")));
    }

    #[test]
    fn info_lines_are_printed_from_info_up_and_tuning_only_when_named() {
        assert!(subsys_from(Some("ABORT"), Some("COLL"), "COLL"));
        assert!(!subsys_from(Some("VERSION"), Some("ALL"), "COLL"));
        assert!(!subsys_from(Some("INFO"), None, "TUNING"));
        assert!(subsys_from(Some("INFO"), None, "ENV"));
        assert!(subsys_from(Some("INFO"), Some("TUNING"), "TUNING"));
        assert!(!subsys_from(Some("INFO"), Some("^TUNING"), "TUNING"));
        assert!(!subsys_from(Some("INFO"), Some(""), "ENV"));
    }

    #[test]
    fn the_debug_file_is_named_as_nccl_expands_it() {
        let name = |level, file| file_name(level, file, "node7", 4242);
        assert_eq!(
            name(Some("INFO"), Some("/tmp/log.%h.%p")).as_deref(),
            Some("/tmp/log.node7.4242")
        );
        assert_eq!(
            name(Some("warn"), Some("a%%b%xc%")).as_deref(),
            Some("a%b%xc%"),
            "%% is one %, anything else is echoed"
        );
        assert_eq!(
            name(Some("TRACE"), Some("/proc/self/fd/3")).as_deref(),
            Some("/proc/self/fd/3")
        );
        assert_eq!(name(Some("VERSION"), Some("log")), None, "VERSION opens no file");
        assert_eq!(name(None, Some("log")), None);
        assert_eq!(name(Some("INFO"), Some("")), None, "an empty name leaves stdout");
        assert_eq!(name(Some("INFO"), None), None);
    }

    #[test]
    fn a_line_is_written_as_nccl_writes_it() {
        let line = CollLine {
            op_name: "AllReduce",
            op_count: 10,
            sendbuff: 0x7f00,
            recvbuff: 0x7f00,
            count: 1024,
            datatype: 7,
            op: 0,
            root: 0,
            comm: 0x55aa,
            nranks: 2,
            stream: 0,
            device: 1,
        };
        assert_eq!(
            line.text(),
            "AllReduce: opCount a sendbuff 0x7f00 recvbuff 0x7f00 count 1024 datatype 7 op 0 root 0 comm 0x55aa \
             [nranks=2] stream (nil)"
        );
    }
}
