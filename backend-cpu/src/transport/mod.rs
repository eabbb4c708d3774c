//! Transports: how the CPU backend moves bytes between two ranks.
//!
//! A [`Link`] joins this rank to one peer and carries whole messages both ways. The ring
//! algorithms over [`crate::Comm`] are written once over links, and the transports
//! slot in under them, as in NCCL: [`shm`] between ranks on one host, [`tcp`] between
//! hosts, chosen for each pair of ranks ([`choose`]). Each message is tagged with the
//! collective that sent it (a byte, `workbook_runtime::Func::tag`), so two ranks
//! that run different collectives, or the same one with different sizes, get an error
//! saying so instead of mixing their data.

pub mod protocol;
pub mod sent;
pub mod shm;
pub mod simulated;
pub mod tcp;

use std::io;

/// A connection to one peer that carries whole messages both ways. Sending and receiving
/// may happen at the same time from two threads (a ring step does both).
pub trait Link: Send + Sync {
    /// Sends one message.
    fn send(&self, tag: u8, data: &[u8]) -> io::Result<()>;
    /// Receives one message of exactly `dst.len()` bytes into `dst`.
    fn recv_into(&self, tag: u8, dst: &mut [u8]) -> io::Result<()>;
    /// Like [`Link::recv_into`], for data that will not be read again soon (part of a
    /// buffer larger than the caches): a transport may write it around the cache, which
    /// saves reading each destination line from memory before overwriting it.
    fn recv_into_streaming(&self, tag: u8, dst: &mut [u8]) -> io::Result<()> {
        self.recv_into(tag, dst)
    }
    /// Receives one message of `len` bytes piece by piece, calling `each(offset, piece)`
    /// as each piece arrives: the receiver can reduce one piece while the next is still
    /// on the wire. Where a piece lies is the transport's business (a shared-memory slot,
    /// a TCP link's own landing buffer).
    fn recv_pieces(&self, tag: u8, len: usize, each: &mut dyn FnMut(usize, &[u8])) -> io::Result<()>;
    /// Sends one message of `len` bytes that `fill` writes straight into the transport's
    /// own buffer (a shared-memory slot), so that a reduction's result needs no copy
    /// before it leaves. `fill` may fail (it may be receiving what it writes); the message
    /// is then not sent and its error returned. The default fills a buffer and sends it.
    fn send_with(&self, tag: u8, len: usize, fill: &mut dyn FnMut(&mut [u8]) -> io::Result<()>) -> io::Result<()> {
        let mut buf = vec![0u8; len];
        fill(&mut buf)?;
        self.send(tag, &buf)
    }
    /// Where the peer is, for messages.
    fn describe(&self) -> String;
    /// Sends (and expects) the collectives' messages by `proto` from now on: the tuner's
    /// choice, made alike on both ends. Only shared memory has NCCL's three protocols
    /// ([`protocol`]); the TCP transport has Simple alone and ignores this.
    fn set_protocol(&self, _proto: protocol::Protocol) {}
    /// The protocol the collectives' messages go by ([`Link::set_protocol`]).
    fn protocol(&self) -> protocol::Protocol {
        protocol::Protocol::Simple
    }
    /// The largest message `send` hands over without waiting for the peer to receive
    /// it (the "eager" size: what the socket's buffer or the shared ring holds). A ring
    /// step may send such a message and then receive, in one thread, without deadlock;
    /// a larger one needs a second thread, since every rank sends at the same time.
    fn eager_limit(&self) -> usize;
}

/// A message from another collective than the one this rank is in: a bug in the
/// program (ranks calling different collectives). Carried inside the `io::Error`, so that
/// the session, which knows the collectives' names, can name both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mismatch {
    /// The rank the message came from.
    pub peer: usize,
    /// The tag it carried.
    pub theirs: u8,
    /// The tag this rank expected.
    pub ours: u8,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "rank {} is in another collective (tag {}) than this rank (tag {}): every rank must call the same \
             collectives in the same order",
            self.peer, self.theirs, self.ours
        )
    }
}

impl std::error::Error for Mismatch {}

/// A connection to a peer that could not be made on first use (the TCP transport's: the
/// peer refused it, never answered, or never connected to this rank within `--timeout`).
/// Carried inside the `io::Error`, so that the communicator reports it in the link's own
/// words, which name the peer and the address.
#[derive(Debug)]
pub struct Unconnected {
    /// The rank that could not be reached.
    pub peer: usize,
    /// The wait lasted the whole `--timeout` (else the peer is gone or refused).
    pub timed_out: bool,
    /// What to say: names the peer, its address or this rank's, and what happened.
    pub message: String,
}

impl Unconnected {
    /// The `io::Error` carrying this failure (kind `TimedOut` or `NotConnected`).
    pub fn error(peer: usize, timed_out: bool, message: String) -> io::Error {
        let kind = match timed_out {
            true => io::ErrorKind::TimedOut,
            false => io::ErrorKind::NotConnected,
        };
        io::Error::new(
            kind,
            Unconnected {
                peer,
                timed_out,
                message,
            },
        )
    }
}

impl std::fmt::Display for Unconnected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Unconnected {}

/// The error for a message tagged `theirs` where this rank expects `ours`.
pub fn op_mismatch(peer: usize, theirs: u8, ours: u8) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, Mismatch { peer, theirs, ours })
}

/// The error for a message of another size than this rank expects.
pub fn len_mismatch(peer: usize, got: u64, len: usize) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("rank {peer} sent {got} bytes where {len} were expected: do all ranks use the same count?"),
    )
}

/// How a pair of ranks exchanges data on the CPU backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Via {
    /// Shared memory: both ranks on one host.
    Shm,
    /// A TCP connection: works between any two hosts.
    Tcp,
}

/// What the user asked for (`--transport`, or `NCCL_WORKBOOK_TRANSPORT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TransportChoice {
    /// Shared memory between ranks on one host, TCP between hosts (as NCCL does).
    Auto,
    /// Shared memory for every pair: fails if two ranks are on different hosts.
    Shm,
    /// TCP for every pair, even on one host (to test or compare the network path).
    Tcp,
}

/// The transport for every pair of ranks, from where each rank runs (`host_keys`, one
/// per rank: equal keys mean one machine) and what was asked. Every rank computes the
/// same table from the same gathered facts, so both ends of a pair agree.
pub fn choose(host_keys: &[String], choice: TransportChoice) -> Result<Vec<Vec<Option<Via>>>, String> {
    let n = host_keys.len();
    let mut table = vec![vec![None; n]; n];
    for a in 0..n {
        for b in 0..n {
            if a == b {
                continue;
            }
            let same_host = host_keys[a] == host_keys[b];
            table[a][b] = Some(match choice {
                TransportChoice::Tcp => Via::Tcp,
                TransportChoice::Auto if same_host => Via::Shm,
                TransportChoice::Auto => Via::Tcp,
                TransportChoice::Shm if same_host => Via::Shm,
                TransportChoice::Shm => {
                    return Err(format!(
                        "--transport shm: ranks {a} and {b} are on different hosts, which share no memory \
                         (use --transport auto or tcp)"
                    ));
                }
            });
        }
    }
    Ok(table)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_memory_within_a_host_tcp_between_hosts() {
        let hosts: Vec<String> = ["a", "a", "b", "a"].iter().map(|s| s.to_string()).collect();
        let t = choose(&hosts, TransportChoice::Auto).unwrap();
        assert_eq!(t[0][1], Some(Via::Shm));
        assert_eq!(t[3][0], Some(Via::Shm));
        assert_eq!(t[0][2], Some(Via::Tcp));
        assert_eq!(t[2][3], Some(Via::Tcp));
        assert_eq!(t[1][1], None);
        for (a, row) in t.iter().enumerate() {
            for (b, via) in row.iter().enumerate() {
                assert_eq!(*via, t[b][a], "both ends of {a}-{b} agree");
            }
        }
        assert!(choose(&hosts, TransportChoice::Tcp).unwrap()[0][1] == Some(Via::Tcp));
        let err = choose(&hosts, TransportChoice::Shm).unwrap_err();
        assert!(err.contains("ranks 0 and 2 are on different hosts"), "{err}");
        assert!(choose(&hosts[..2], TransportChoice::Shm).is_ok());
    }
}
