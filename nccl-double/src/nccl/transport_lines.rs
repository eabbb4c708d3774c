//! NCCL's transport lines: how a rank is connected to its ring neighbours, as
//! `ncclTransportP2pSetup` logs it when it connects the rings (`src/transport.cc`,
//! `src/transport/{p2p,shm,net}.cc`, 2.18 to 2.30), with `NCCL_DEBUG=INFO`:
//!
//! ```text
//! host:4242:4242 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM
//! host:4242:4242 [0] NCCL INFO Channel 00 : 0[0] -> 1[1] via SHM/direct/direct
//! host:4242:4242 [0] NCCL INFO Channel 00/0 : 3[0] -> 0[0] [receive] via NET/Socket/0
//! host:4242:4242 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0
//! ```
//!
//! NCCL tries its transports in order, P2P, SHM, NET, and takes the first that can connect
//! the two ranks: P2P (CUDA IPC, over NVLink or PCIe) between two GPUs of one host (one
//! `NCCL_HOSTID`, else one machine) unless `NCCL_P2P_DISABLE=1` (`ncclGetLevel`,
//! `src/graph/paths.cc`: `strtol(value, NULL, 0) == 1`), or the peer's GPU cannot be
//! reached, as when each process's cgroup opens its own GPU only (Slurm's `--gpus-per-task`
//! with `ConstrainDevices=yes`, NVIDIA/nccl#1066); then SHM (host memory) between ranks of
//! one host unless `NCCL_SHM_DISABLE=1`; else the network. The double has no cgroup, so
//! `NCCL_P2P_DISABLE=1` is how a test plays that fall-back.
//!
//! The text by version: up to 2.18 a GPU is its bus id in hex (`0[1b000]`) and P2P is
//! `P2P/IPC` (cuMem off by default); from 2.19 a GPU is its NVML index (`0[0]`) and P2P
//! `P2P/CUMEM` (`NCCL_CUMEM_ENABLE` auto). Two ranks of one process: `P2P/direct pointer`.
//! Up to 2.21 `Connected all rings` follows. The double has one channel and one ring
//! (rank r sends to r + 1); it prints at init, after the checks of every rank's card and
//! before the tuning table, as NCCL up to 2.21 does (from 2.22 NCCL connects at the first
//! collective that needs it: the same lines, later). Subsystems: `INIT`, or `P2P`, `SHM`,
//! `NET` by transport (`INFO(NCCL_INIT|NCCL_P2P, ...)`).

use crate::exchange::Card;

/// What the lines need of a rank's card.
struct Peer<'a> {
    /// The host as NCCL tells hosts apart (`NCCL_HOSTID`, else the node).
    host: &'a str,
    real_host: &'a str,
    pid: u32,
    bus_id: &'a str,
}

impl<'a> From<&'a Card> for Peer<'a> {
    fn from(c: &'a Card) -> Self {
        Self {
            host: &c.host,
            real_host: &c.real_host,
            pid: c.pid,
            bus_id: &c.bus_id,
        }
    }
}

/// How NCCL connects two ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Transport {
    /// Two ranks of one process: `P2P/direct pointer`.
    Direct,
    /// CUDA IPC between two processes of one host.
    P2p,
    /// Host memory between two processes of one host.
    Shm,
    /// The network (sockets: the double has no InfiniBand).
    Net,
}

/// What the variables switch off, as NCCL reads them.
#[derive(Clone, Copy, Default)]
struct Disabled {
    p2p: bool,
    shm: bool,
}

impl Disabled {
    fn from_env() -> Self {
        let one = |name: &str| std::env::var(name).ok().is_some_and(|v| strtol(&v) == 1);
        Self {
            p2p: one("NCCL_P2P_DISABLE"),
            shm: one("NCCL_SHM_DISABLE"),
        }
    }
}

/// C's `strtol(s, NULL, 0)`: leading blanks, a sign, then the longest number in base 16
/// (`0x`), 8 (a leading `0`) or 10; 0 if none.
fn strtol(s: &str) -> i64 {
    let s = s.trim_start_matches([' ', '\t', '\n', '\r', '\x0b', '\x0c']);
    let (negative, s) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let (radix, digits) = if let Some(hex) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        (16, hex)
    } else if s.starts_with('0') {
        (8, s)
    } else {
        (10, s)
    };
    let n = digits.chars().map_while(|c| c.to_digit(radix)).fold(0i64, |n, d| {
        n.saturating_mul(i64::from(radix)).saturating_add(i64::from(d))
    });
    if negative { -n } else { n }
}

/// The transport NCCL picks from rank `a` to rank `b`.
fn transport(a: &Peer, b: &Peer, off: Disabled) -> Transport {
    if a.host != b.host {
        Transport::Net
    } else if a.pid == b.pid && a.real_host == b.real_host && !off.p2p {
        Transport::Direct
    } else if !off.p2p {
        Transport::P2p
    } else if !off.shm {
        Transport::Shm
    } else {
        Transport::Net
    }
}

/// A GPU as the lines name it: its bus id as NCCL's `busIdToInt64` reads it, in hex, up
/// to 2.18 (`0000:1B:00.0` is `1b000`); from 2.19 its NVML index, the physical one (NVML
/// ignores `CUDA_VISIBLE_DEVICES`).
fn gpu(card: &Peer, version: u32) -> String {
    let hex: String = card
        .bus_id
        .chars()
        .filter(|c| *c != ':' && *c != '.')
        .take_while(char::is_ascii_hexdigit)
        .collect();
    let bus = i64::from_str_radix(&hex, 16).unwrap_or(0);
    if version < 21900 {
        format!("{bus:x}")
    } else {
        // The double's GPU p has the bus 0x1B + 0x10 p (domain and bus, `devices::bus_id`).
        let n = ((bus >> 20) << 8) | ((bus >> 12) & 0xFF);
        ((n - 0x1B) / 0x10).max(0).to_string()
    }
}

/// The lines rank `me` of `cards` prints, each with the subsystem that lets it through
/// besides `INIT`.
fn lines(me: usize, cards: &[Peer], version: u32, off: Disabled) -> Vec<(&'static str, String)> {
    let n = cards.len();
    if n < 2 || me >= n {
        return Vec::new();
    }
    let (prev, next) = ((me + n - 1) % n, (me + 1) % n);
    let name = |r: usize| format!("{r}[{}]", gpu(&cards[r], version));
    let mut out = Vec::new();
    // NCCL sets up the receiving side first; of its transports only the network logs it.
    if transport(&cards[prev], &cards[me], off) == Transport::Net {
        out.push((
            "NET",
            format!(
                "Channel 00/0 : {} -> {} [receive] via NET/Socket/0",
                name(prev),
                name(me)
            ),
        ));
    }
    let (from, to) = (name(me), name(next));
    out.push(match transport(&cards[me], &cards[next], off) {
        Transport::Direct => ("P2P", format!("Channel 00/0 : {from} -> {to} via P2P/direct pointer")),
        Transport::P2p => {
            let how = if version < 21900 { "IPC" } else { "CUMEM" };
            ("P2P", format!("Channel 00/0 : {from} -> {to} via P2P/{how}"))
        }
        Transport::Shm => ("SHM", format!("Channel 00 : {from} -> {to} via SHM/direct/direct")),
        Transport::Net => ("NET", format!("Channel 00/0 : {from} -> {to} [send] via NET/Socket/0")),
    });
    if version < 22200 {
        out.push(("INIT", "Connected all rings".to_string()));
    }
    out
}

/// Prints this rank's transport lines (rank `me` of `cards`, every rank's card, on the
/// device `device`), if `NCCL_DEBUG` and `NCCL_DEBUG_SUBSYS` let them through.
pub fn print(device: usize, me: usize, cards: &[Card]) {
    if !super::debug::subsys("INIT") && !["P2P", "SHM", "NET"].iter().any(|s| super::debug::subsys(s)) {
        return;
    }
    let peers: Vec<Peer> = cards.iter().map(Peer::from).collect();
    for (subsys, text) in lines(me, &peers, crate::version::version(), Disabled::from_env()) {
        if super::debug::subsys("INIT") || super::debug::subsys(subsys) {
            super::debug::info(device, &text);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rank cards: (GPU, host, pid) each.
    fn texts(me: usize, cards: &[(usize, &str, u32)], version: u32, off: Disabled) -> Vec<String> {
        let buses: Vec<String> = cards.iter().map(|c| crate::devices::bus_id(c.0)).collect();
        let peers: Vec<Peer> = cards
            .iter()
            .zip(&buses)
            .map(|(&(_, host, pid), bus_id)| Peer {
                host,
                real_host: "machine",
                pid,
                bus_id,
            })
            .collect();
        lines(me, &peers, version, off).into_iter().map(|(_, t)| t).collect()
    }

    #[test]
    fn gpus_of_one_host_connect_by_p2p_unless_it_is_disabled() {
        let cards = [(0, "a", 1), (1, "a", 2), (2, "a", 3)];
        assert_eq!(
            texts(0, &cards, 22907, Disabled::default()),
            ["Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM"]
        );
        assert_eq!(
            texts(2, &cards, 21803, Disabled::default()),
            ["Channel 00/0 : 2[3b000] -> 0[1b000] via P2P/IPC", "Connected all rings"]
        );
        let off = Disabled { p2p: true, shm: false };
        assert_eq!(
            texts(1, &cards, 22907, off),
            ["Channel 00 : 1[1] -> 2[2] via SHM/direct/direct"]
        );
        let off = Disabled { p2p: true, shm: true };
        assert_eq!(
            texts(1, &cards, 22907, off),
            [
                "Channel 00/0 : 0[0] -> 1[1] [receive] via NET/Socket/0",
                "Channel 00/0 : 1[1] -> 2[2] [send] via NET/Socket/0"
            ]
        );
    }

    #[test]
    fn ranks_of_other_hosts_connect_by_the_network_and_of_one_process_directly() {
        let nodes = [(0, "node-0", 1), (0, "node-1", 2)];
        assert_eq!(
            texts(0, &nodes, 22907, Disabled::default()),
            [
                "Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Socket/0",
                "Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0"
            ]
        );
        let threads = [(0, "a", 7), (1, "a", 7)];
        assert_eq!(
            texts(1, &threads, 22907, Disabled::default()),
            ["Channel 00/0 : 1[1] -> 0[0] via P2P/direct pointer"]
        );
        assert!(
            texts(0, &threads[..1], 22907, Disabled::default()).is_empty(),
            "one rank connects nothing"
        );
    }

    #[test]
    fn the_variables_are_read_as_strtol_reads_them() {
        for (v, n) in [
            ("1", 1),
            (" 1", 1),
            ("0x1", 1),
            ("01", 1),
            ("1abc", 1),
            ("0", 0),
            ("yes", 0),
            ("-1", -1),
            ("", 0),
        ] {
            assert_eq!(strtol(v), n, "{v:?}");
        }
    }
}
