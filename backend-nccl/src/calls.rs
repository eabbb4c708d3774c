//! `--show-calls`: the NCCL and CUDA calls of a rank's NCCL backend, printed as it makes
//! them, with their arguments, as C would write them:
//!
//! ```text
//! rank 0 │ ncclAllReduce(sendbuff=0x7f2c00000000, recvbuff=0x7f2c00000000, count=4, datatype=ncclFloat32, op=ncclSum, comm=0x55e1…, stream=0x5e00…) = ncclSuccess
//! ```
//!
//! The same lines come from a real GPU node and from `--simulate-gpus`: they are printed
//! where the backend calls the library, whichever library answers.

use std::borrow::Cow;
use std::fmt::{Display, Write};

/// One call: what it does (for error messages), the C function and its arguments.
pub struct Call {
    doing: Cow<'static, str>,
    function: &'static str,
    args: Vec<(&'static str, String)>,
    bytes: u64,
    /// The rank a send or receive is with, as the world numbers it ([`Call::peer`]).
    peer: Option<usize>,
}

impl Call {
    /// A call of `function`, which does `doing` ("all-reduce").
    pub fn new(doing: impl Into<Cow<'static, str>>, function: &'static str) -> Call {
        Call {
            doing: doing.into(),
            function,
            args: Vec::new(),
            bytes: 0,
            peer: None,
        }
    }

    /// The rank a send or receive is with: what a rank stuck in it waits for (its
    /// failure's record, `workbook_runtime::failure`).
    pub fn peer(mut self, peer: usize) -> Call {
        self.peer = Some(peer);
        self
    }

    /// The bytes the call moves (its buffer), for its span on `--trace`.
    pub fn bytes(mut self, bytes: usize) -> Call {
        self.bytes = bytes as u64;
        self
    }

    /// The C function: `ncclAllReduce`.
    pub fn function(&self) -> &'static str {
        self.function
    }

    /// The bytes the call moves, as given to [`Call::bytes`] (0 if not).
    pub fn moved(&self) -> u64 {
        self.bytes
    }

    /// Adds the argument `name`, shown as `value`. Only `--show-calls` shows arguments:
    /// without it, nothing is written (a call's arguments would cost more than a small
    /// collective's launch).
    pub fn arg(mut self, name: &'static str, value: impl Display) -> Call {
        if SHOWING.load(std::sync::atomic::Ordering::Relaxed) {
            self.args.push((name, value.to_string()));
        }
        self
    }

    /// Adds a pointer argument, shown in hexadecimal as C prints it.
    pub fn ptr<T>(self, name: &'static str, value: *const T) -> Call {
        self.arg(name, Shown::lazily(move |f| write!(f, "{value:p}")))
    }

    /// Adds an argument shown as Rust's `{:?}` writes it (an enum's name: `ncclFloat32`).
    pub fn named(self, name: &'static str, value: impl std::fmt::Debug) -> Call {
        self.arg(name, Shown::lazily(move |f| write!(f, "{value:?}")))
    }

    /// "all-reduce (ncclAllReduce)": the call in messages.
    pub fn what(&self) -> String {
        self.label().to_string()
    }

    /// The call in messages, written only when needed ([`Label`]).
    pub fn label(&self) -> Label {
        Label {
            doing: self.doing.clone(),
            function: self.function,
            peer: self.peer,
        }
    }

    /// `ncclAllReduce(sendbuff=…, count=4, …)`.
    fn written(&self) -> String {
        let mut s = format!("{}(", self.function);
        for (i, (name, value)) in self.args.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            let _ = write!(s, "{sep}{name}={value}");
        }
        s.push(')');
        s
    }
}

/// A call as messages name it, "all-reduce (ncclAllReduce)": kept for every call queued
/// (a wait names the one it waits for), so it costs no allocation when the doing is a
/// constant.
#[derive(Clone, Debug, Default)]
pub struct Label {
    doing: Cow<'static, str>,
    function: &'static str,
    peer: Option<usize>,
}

impl Label {
    /// A label for something that is not a call ("joining the communicator").
    pub fn of(doing: impl Into<Cow<'static, str>>) -> Label {
        Label {
            doing: doing.into(),
            function: "",
            peer: None,
        }
    }

    /// The NCCL or CUDA function called (`ncclSend`), empty for what is not a call.
    pub fn function(&self) -> &'static str {
        self.function
    }

    /// The send (`ncclSend`) or receive (`ncclRecv`) this is, and its peer, for a stuck
    /// rank's failure record: `(sending, peer)`.
    pub fn send_or_recv(&self) -> Option<(bool, usize)> {
        match self.function {
            "ncclSend" => Some((true, self.peer?)),
            "ncclRecv" => Some((false, self.peer?)),
            _ => None,
        }
    }
}

impl Display for Label {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.function {
            "" => f.write_str(&self.doing),
            function => write!(f, "{} ({function})", self.doing),
        }
    }
}

/// Whether this process shows its calls (`--show-calls`): set by [`Shown::new`].
static SHOWING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(cfg!(test));

/// Where a rank shows its calls: nowhere (the default), or on its output as it makes them.
#[derive(Clone, Copy, Debug)]
pub struct Shown {
    /// The rank that makes the calls.
    pub rank: usize,
    /// Whether `--show-calls` asked for them.
    pub on: bool,
    /// Whether stdout carries one JSON document (the calls then go to stderr).
    pub json: bool,
}

/// A value written only if it is shown (see [`Shown::lazily`]).
struct Lazily<F>(F);

impl<F: Fn(&mut std::fmt::Formatter<'_>) -> std::fmt::Result> Display for Lazily<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (self.0)(f)
    }
}

impl Shown {
    /// A value that `write` writes, only when [`Call::arg`] keeps it.
    fn lazily(write: impl Fn(&mut std::fmt::Formatter<'_>) -> std::fmt::Result) -> impl Display {
        Lazily(write)
    }

    /// Where `rank` shows its calls: on its output if `on`, on stderr if stdout carries
    /// JSON (`json`). Calls only keep their arguments when some rank of this process shows them.
    pub fn new(rank: usize, on: bool, json: bool) -> Shown {
        if on {
            SHOWING.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        Shown { rank, on, json }
    }

    /// Shows `call`, which returned `result` (`None`: it returns nothing), and a note.
    pub fn show(&self, call: &Call, result: Option<&dyn std::fmt::Debug>, note: &str) {
        if !self.on {
            return;
        }
        let mut line = format!("rank {} │ {}", self.rank, call.written());
        if let Some(r) = result {
            let _ = write!(line, " = {r:?}");
        }
        if !note.is_empty() {
            let _ = write!(line, "   // {note}");
        }
        // One write per line, newline included, so that the ranks' lines never mix within
        // a line: `writeln!` on stderr, which has no buffer, writes the text and its newline
        // in two calls, between which another rank's line can come.
        use std::io::Write as _;
        line.push('\n');
        let _ = match self.json {
            true => std::io::stderr().write_all(line.as_bytes()),
            false => std::io::stdout().lock().write_all(line.as_bytes()),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_is_written_as_c_writes_it() {
        let c = Call::new("broadcast", "ncclBroadcast")
            .ptr("sendbuff", std::ptr::null::<u8>())
            .arg("count", 4)
            .arg("root", 1);
        assert_eq!(c.written(), "ncclBroadcast(sendbuff=0x0, count=4, root=1)");
        assert_eq!(c.what(), "broadcast (ncclBroadcast)");
    }
}
