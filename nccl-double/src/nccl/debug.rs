//! `NCCL_DEBUG=INFO` with `COLL` in `NCCL_DEBUG_SUBSYS`: one line per collective, send and
//! receive, as NCCL prints it when the call has passed its checks (`ncclEnqueueCheck` in
//! `src/enqueue.cc`, the same from 2.18 to 2.28), on stdout (NCCL's default debug file):
//!
//! ```text
//! host:4242:4242 [0] NCCL INFO AllReduce: opCount 0 sendbuff 0x5581… recvbuff 0x5581… count 4 datatype 7 op 0 root 0 comm 0x5581… [nranks=2] stream (nil)
//! ```
//!
//! `datatype` and `op` are NCCL's numbers (7 is ncclFloat32, 0 ncclSum); `root` is the
//! peer of a send or receive (whose `sendbuff` NCCL prints as NULL: the buffer is
//! `recvbuff`); `opCount` is the communicator's count of launches so far, one per
//! ungrouped call and one per group. Other subsystems and levels print nothing here.

use std::ffi::{c_int, c_uint};
use std::io::Write;
use std::sync::OnceLock;

/// Whether NCCL_DEBUG asks for INFO (or TRACE) and NCCL_DEBUG_SUBSYS lets COLL through,
/// read once, as NCCL reads them (`src/debug.cc`: default subsystems INIT,BOOTSTRAP,ENV;
/// a leading `^` excludes the listed ones).
pub fn coll() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        coll_from(
            std::env::var("NCCL_DEBUG").ok().as_deref(),
            std::env::var("NCCL_DEBUG_SUBSYS").ok().as_deref(),
        )
    })
}

/// Whether NCCL_DEBUG asks for INFO and NCCL_DEBUG_SUBSYS lets ENV through (it does by
/// default), as for [`coll`].
pub fn env() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        subsys_from(
            std::env::var("NCCL_DEBUG").ok().as_deref(),
            std::env::var("NCCL_DEBUG_SUBSYS").ok().as_deref(),
            "ENV",
        )
    })
}

/// An `INFO(NCCL_ENV, …)` line, as NCCL prints it on the device `device`.
pub fn env_line(device: usize, text: &str) {
    if env() {
        let line = format!(
            "{}:{}:{} [{device}] NCCL INFO {text}\n",
            host(),
            std::process::id(),
            thread_id()
        );
        let _ = std::io::stdout().lock().write_all(line.as_bytes());
    }
}

/// [`coll`] for these values of NCCL_DEBUG and NCCL_DEBUG_SUBSYS.
fn coll_from(level: Option<&str>, subsys: Option<&str>) -> bool {
    subsys_from(level, subsys, "COLL")
}

/// Whether these NCCL_DEBUG and NCCL_DEBUG_SUBSYS print INFO lines of subsystem `name`.
fn subsys_from(level: Option<&str>, subsys: Option<&str>, name: &str) -> bool {
    let info = level.is_some_and(|l| l.eq_ignore_ascii_case("INFO") || l.eq_ignore_ascii_case("TRACE"));
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

    /// Prints the line on stdout in one write (lines of several threads never mix), if
    /// [`coll`] asks for it.
    pub fn print(&self) {
        if !coll() {
            return;
        }
        let line = format!(
            "{}:{}:{} [{}] NCCL INFO {}\n",
            host(),
            std::process::id(),
            thread_id(),
            self.device,
            self.text()
        );
        let _ = std::io::stdout().lock().write_all(line.as_bytes());
    }
}

/// The host's name up to its first dot, as NCCL's `getHostName(…, '.')` keeps it.
fn host() -> &'static str {
    static HOST: OnceLock<String> = OnceLock::new();
    HOST.get_or_init(|| {
        let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        let name = name.trim();
        name.split('.')
            .next()
            .filter(|n| !n.is_empty())
            .unwrap_or("localhost")
            .to_string()
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
