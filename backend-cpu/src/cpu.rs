//! The CPU backend as the collectives run on it: a rank's communicator ([`Comm`]: the
//! links and the steps the algorithms are made of) with the tuner's state beside it (what
//! `NCCL_ALGO` allows, what ran last, what `NCCL_DEBUG=INFO` has printed). The algorithms
//! live in [`crate::collective`], and [`crate::tuner::choose`] picks among them.

use crate::collective::Row;
use crate::error::SharedError;
use crate::launch::Identity;
use crate::rendezvous::Store;
use crate::transport::{TransportChoice, Via};
use crate::tuner::{self, Algorithm, Allowed, Facts, Protocol, Protocols};
use anyhow::Result;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering::Relaxed};
use std::time::Duration;
use workbook_runtime::Func;

pub use crate::comm::{Signal, cache_room, chunk_range, debug_info, info_level, keep, split_two};
pub use crate::{Comm, SMALL};

/// How a rank of the CPU backend connects and chooses: what its command line and the
/// environment say ([`Cpu::connect`]).
pub struct Setup {
    /// `--transport`.
    pub transport: TransportChoice,
    /// `--timeout`: the longest any wait lasts.
    pub timeout: Duration,
    /// `--link`: the simulated network every TCP link takes the time of.
    pub link: Option<crate::transport::simulated::Network>,
    /// Print each choice once, as `NCCL_DEBUG=INFO` asks (rank 0, text output).
    pub debug: bool,
    /// What `NCCL_ALGO` allows.
    pub allowed: Allowed,
    /// What `NCCL_PROTO` allows, and its text (for the refusal below).
    pub protos: (Protocols, String),
}

/// A rank of the CPU backend: its communicator ([`Comm`], which this derefs to, so that
/// an algorithm reads `cpu.world()` or `cpu.send(..)` as it would on the communicator
/// itself) and the choice of algorithm ([`Cpu::choose`], [`Cpu::ran`]).
pub struct Cpu {
    comm: Comm,
    /// What `NCCL_ALGO` allows ([`Allowed`]).
    allowed: Allowed,
    /// What `NCCL_PROTO` allows ([`Protocols`]).
    protos: Protocols,
    /// `NCCL_DEBUG=INFO` on rank 0, text output: each distinct choice is printed once.
    debug: bool,
    /// The algorithm of the last collective this rank ran ([`Cpu::ran`]; [`Algorithm`]
    /// as a number, 255: none yet).
    last: AtomicU8,
    /// The protocol the last collective ran with ([`Protocol`] as a number, 255: none yet).
    last_proto: AtomicU8,
    /// The choices `NCCL_DEBUG=INFO` has printed (a collective's tag, its bytes, the
    /// algorithm's and the protocol's names), each printed once.
    said: Mutex<BTreeSet<(u8, usize, &'static str, &'static str)>>,
    /// The protocol set on the links by the last choice ([`Protocol`] as a number; 255:
    /// none yet).
    set: AtomicU8,
    /// The last choice and what it was made for ([`Memo`]): a call like the one before
    /// (a benchmark's loop, a training step) skips the tuner.
    memo: AtomicU64,
}

/// The tuner's last choice, in one word so that it is read and written whole: the
/// collective's tag, its bytes, whether `--steps` was recording, the algorithm and the
/// protocol chosen. Every input of [`tuner::choose_with`] but these is fixed for the
/// communicator's life, or resets it ([`Cpu::allow`], [`Cpu::allow_protocols`]).
/// What a 4-byte call saves: the tuner's work, about a tenth of its time on two ranks.
struct Memo;

impl Memo {
    /// Bytes up to this fit the word; a larger call is not remembered.
    const MAX_BYTES: usize = (1 << 40) - 1;
    const EMPTY: u64 = 0;

    /// The word without the choice (`None` past [`Memo::MAX_BYTES`]): bit 63 set (not
    /// empty), bit 62 `--steps`, bits 40-47 the tag, bits 0-39 the bytes.
    fn key(tag: u8, bytes: usize, steps: bool) -> Option<u64> {
        (bytes <= Memo::MAX_BYTES).then_some(1 << 63 | (steps as u64) << 62 | (tag as u64) << 40 | bytes as u64)
    }

    /// `key` with the choice in bits 52-55 (the algorithm) and 49-51 (the protocol).
    fn pack(key: u64, algo: Algorithm, proto: Protocol) -> u64 {
        key | (algo as u64) << 52 | (proto as u64) << 49
    }

    /// The choice remembered for `key`, if `word` holds one for it.
    fn lookup(word: u64, key: u64) -> Option<(Algorithm, Protocol)> {
        const CHOICE: u64 = 0xff << 49;
        let algo = Algorithm::ALL.get((word >> 52 & 0xf) as usize)?;
        (word & !CHOICE == key).then(|| (*algo, Protocol::from_index((word >> 49 & 0x7) as u8)))
    }
}

impl std::ops::Deref for Cpu {
    type Target = Comm;

    fn deref(&self) -> &Comm {
        &self.comm
    }
}

impl Cpu {
    /// Connects this rank to its peers ([`Comm::connect`], as `--transport` and
    /// `--timeout` say), to choose as `setup` says (`NCCL_PROTO` without Simple where some
    /// link is TCP is the user's error, in one line). Returns the rank and how each pair of
    /// ranks is linked ("0-1": shm).
    pub fn connect(store: &mut Store, id: &Identity, host: &str, setup: Setup) -> Result<(Cpu, BTreeMap<String, Via>)> {
        let Setup {
            transport,
            timeout,
            link,
            debug,
            allowed,
            protos: (protos, text),
        } = setup;
        let (comm, pairs) = Comm::connect(store, id, host, transport, timeout, link, crate::collective::named)?;
        if comm.world() > 1 && !comm.has_protocols() && protos.without_simple() {
            return Err(SharedError {
                message: tcp_is_simple(&format!("NCCL_PROTO={text}")),
                usage: true,
            }
            .into());
        }
        let cpu = Cpu {
            comm,
            allowed,
            protos,
            debug,
            last: AtomicU8::new(u8::MAX),
            last_proto: AtomicU8::new(u8::MAX),
            said: Mutex::default(),
            set: AtomicU8::new(u8::MAX),
            memo: AtomicU64::new(Memo::EMPTY),
        };
        Ok((cpu, pairs))
    }

    /// This rank's part of a communicator split from this one: the ranks `members` of
    /// this one, in their new order ([`Comm::split`]), with the same choices allowed.
    pub fn split(&self, members: &[usize]) -> Cpu {
        Cpu {
            comm: self.comm.split(members),
            allowed: self.allowed.clone(),
            protos: self.protos.clone(),
            debug: self.debug,
            last: AtomicU8::new(u8::MAX),
            last_proto: AtomicU8::new(u8::MAX),
            said: Mutex::default(),
            set: AtomicU8::new(u8::MAX),
            memo: AtomicU64::new(Memo::EMPTY),
        }
    }

    /// Which algorithm runs `func` on `bytes` (its larger buffer): its row in the
    /// collective's table, as [`tuner::choose`] answers from what this rank knows alike
    /// with every other; noted as what ran ([`Cpu::ran`]).
    pub fn choose(&self, func: Func, bytes: usize) -> &'static Row {
        let steps = crate::record::steps_on();
        let key = Memo::key(func.tag(), bytes, steps);
        let (algo, proto) = match key.and_then(|k| Memo::lookup(self.memo.load(Relaxed), k)) {
            Some(choice) => choice,
            None => {
                let choice = self.choose_now(func, bytes, steps);
                if let Some(k) = key {
                    self.memo.store(Memo::pack(k, choice.0, choice.1), Relaxed);
                }
                choice
            }
        };
        // Set before any message moves, alike on every rank (every input is the same); on
        // every link whose protocol differs (a split communicator shares links).
        self.set.store(proto as u8, Relaxed);
        self.comm.set_protocol(proto);
        self.ran(func, bytes, algo);
        crate::collective::row(func, algo)
    }

    /// What the tuner chooses for `func` on `bytes`, `steps` saying whether `--steps`
    /// is recording.
    fn choose_now(&self, func: Func, bytes: usize, steps: bool) -> (Algorithm, Protocol) {
        let facts = Facts {
            ranks: self.world(),
            ring_in_memory: self.ring_in_memory(),
            reads_peers: self.reads_peers(),
            oversubscribed: self.oversubscribed(),
            steps,
            nodes: self.nodes().iter().max().map_or(1, |m| m + 1),
            protocols: self.has_protocols(),
        };
        tuner::choose_with(func, bytes, &facts, &self.allowed, &self.protos)
    }

    /// Notes that `algo` runs `func` on `bytes` (what [`Cpu::choose`] said, or what a
    /// single copy fell back to): the trace's and `--steps`' label, the `Time:` line's
    /// and the benchmark's name ([`Cpu::last_algorithm`]), and with `NCCL_DEBUG=INFO`
    /// a line the first time this choice is made.
    pub fn ran(&self, func: Func, bytes: usize, algo: Algorithm) {
        if crate::record::on() {
            crate::record::algorithm(crate::collective::row(func, algo).label);
        }
        self.last.store(algo as u8, Relaxed);
        // The single copy reads buffers where they lie (counted as Simple); the rest go
        // by what the links were set to.
        let proto = match algo {
            Algorithm::SingleCopy => Protocol::Simple,
            _ => match self.set.load(Relaxed) {
                u8::MAX => Protocol::Simple,
                p => Protocol::from_index(p),
            },
        };
        self.last_proto.store(proto as u8, Relaxed);
        let said = || self.said.lock().unwrap_or_else(|p| p.into_inner());
        if self.debug && said().insert((func.tag(), bytes, algo.name(), proto.name())) {
            use std::io::Write;
            let _ = writeln!(std::io::stdout(), "{}", tuner::debug_line(func, bytes, algo, proto));
        }
    }

    /// From now on, chooses among what `allowed` allows (the benchmark's `-A`: one
    /// `NCCL_ALGO` value per sweep; every rank is told the same).
    pub fn allow(&mut self, allowed: Allowed) {
        self.allowed = allowed;
        self.memo.store(Memo::EMPTY, Relaxed);
    }

    /// The algorithm of the last collective this rank ran.
    pub fn last_algorithm(&self) -> Option<Algorithm> {
        Algorithm::ALL.get(self.last.load(Relaxed) as usize).copied()
    }

    /// From now on, chooses among the protocols `protos` allows (the benchmark's `-P`:
    /// one `NCCL_PROTO` value per sweep; every rank is told the same). Where some pair
    /// of ranks talks over TCP, only Simple can run: anything else is refused.
    pub fn allow_protocols(&mut self, protos: Protocols, said: &str) -> Result<(), String> {
        if self.world() > 1 && !self.has_protocols() && protos.without_simple() {
            return Err(tcp_is_simple(said));
        }
        self.protos = protos;
        self.memo.store(Memo::EMPTY, Relaxed);
        Ok(())
    }

    /// The protocol of the last collective this rank ran (LL, LL128 or Simple).
    pub fn last_protocol(&self) -> Option<Protocol> {
        Protocol::ALL.get(self.last_proto.load(Relaxed) as usize).copied()
    }
}

/// Why `said` (`NCCL_PROTO=LL`, `-P ll`) cannot run on a job with TCP links, in one line.
fn tcp_is_simple(said: &str) -> String {
    format!(
        "{said}: some ranks talk over TCP, which has the Simple protocol only (LL and LL128 run on shared memory: \
         every rank on one host, --transport auto or shm)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_remembered_choice_comes_back_only_for_its_own_call() {
        for (i, a) in Algorithm::ALL.into_iter().enumerate() {
            assert_eq!(a as usize, i, "{a:?} numbered in ALL's order");
        }
        let key = Memo::key(7, 4096, false).unwrap();
        for a in Algorithm::ALL {
            for p in Protocol::ALL {
                let word = Memo::pack(key, a, p);
                assert_eq!(Memo::lookup(word, key), Some((a, p)));
                // Another size, collective or --steps is another call.
                for other in [
                    Memo::key(7, 4097, false),
                    Memo::key(8, 4096, false),
                    Memo::key(7, 4096, true),
                ] {
                    assert_eq!(Memo::lookup(word, other.unwrap()), None);
                }
            }
        }
        assert_eq!(Memo::lookup(Memo::EMPTY, key), None);
        assert_eq!(Memo::key(7, Memo::MAX_BYTES + 1, false), None);
        assert!(Memo::key(7, Memo::MAX_BYTES, true).is_some());
    }
}
