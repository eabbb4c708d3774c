//! `--show-calls`: the NCCL and CUDA calls of a rank's NCCL backend, printed as it makes
//! them, with their arguments, as C would write them:
//!
//! ```text
//! rank 0 │ ncclAllReduce(sendbuff=0x7f2c00000000, recvbuff=0x7f2c00000000, count=4, datatype=ncclFloat32, op=ncclSum, comm=0x55e1…, stream=0x0) = ncclSuccess
//! ```
//!
//! The same lines come from a real GPU node and from `--simulate-gpus`: they are printed
//! where the backend calls the library, whichever library answers.

use std::fmt::{Display, Write};

/// One call: what it does (for error messages), the C function and its arguments.
pub struct Call {
    doing: String,
    function: &'static str,
    args: Vec<(&'static str, String)>,
    bytes: u64,
}

impl Call {
    /// A call of `function`, which does `doing` ("all-reduce").
    pub fn new(doing: impl Into<String>, function: &'static str) -> Call {
        Call {
            doing: doing.into(),
            function,
            args: Vec::new(),
            bytes: 0,
        }
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

    /// Adds the argument `name`, shown as `value`.
    pub fn arg(mut self, name: &'static str, value: impl Display) -> Call {
        self.args.push((name, value.to_string()));
        self
    }

    /// Adds a pointer argument, shown in hexadecimal as C prints it.
    pub fn ptr<T>(self, name: &'static str, value: *const T) -> Call {
        self.arg(name, format!("{value:p}"))
    }

    /// "all-reduce (ncclAllReduce)": the call in messages.
    pub fn what(&self) -> String {
        format!("{} ({})", self.doing, self.function)
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

impl Shown {
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
        // One write per line, so that the ranks' lines never mix within a line.
        use std::io::Write as _;
        let _ = match self.json {
            true => writeln!(std::io::stderr(), "{line}"),
            false => writeln!(std::io::stdout(), "{line}"),
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
