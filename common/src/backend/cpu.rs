//! The CPU backend as the collectives run on it: a rank's communicator from
//! `workbook-cpu` ([`Comm`]: the links and the steps the algorithms are made of) with the
//! tuner's state beside it (what `NCCL_ALGO` allows, what ran last, what `NCCL_DEBUG=INFO`
//! has printed). The algorithms live with their collective ([`crate::collective`]) and
//! [`crate::collective::tuner::choose`] picks among them.

use crate::args::{Format, RunArgs};
use crate::collective::Collective;
use crate::collective::tuner::{self, Algorithm, Allowed, Facts, Protocol, Protocols};
use crate::error::SharedError;
use crate::launch::Identity;
use crate::rendezvous::Store;
use crate::transport::Via;
use anyhow::Result;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};

pub use workbook_cpu::comm::{Signal, chunk_range, debug_info, info_level, keep, split_two};
pub use workbook_cpu::{Comm, SMALL};

/// A rank of the CPU backend: its communicator ([`Comm`], which this derefs to, so that
/// an algorithm reads `cpu.world()` or `cpu.send(..)` as it would on the communicator
/// itself) and the choice of algorithm ([`Cpu::choose`], [`Cpu::ran`]).
pub struct Cpu {
    comm: Comm,
    /// What `NCCL_ALGO` allows ([`tuner::Allowed`]).
    allowed: Allowed,
    /// What `NCCL_PROTO` allows ([`tuner::Protocols`]).
    protos: Protocols,
    /// `NCCL_DEBUG=INFO` on rank 0, text output: each distinct choice is printed once.
    debug: bool,
    /// What ran last, and the choices printed so far ([`Cpu::ran`]).
    ran: Mutex<Ran>,
    /// The protocol set on the links by the last choice ([`Protocol`] as a number; 255:
    /// none yet): a collective's choice sets it only when it changes.
    set: AtomicU8,
}

/// What a rank ran: its last algorithm, and the choices `NCCL_DEBUG=INFO` has printed (a
/// collective's tag, its bytes, the algorithm's name), each printed once.
#[derive(Default)]
struct Ran {
    last: Option<Algorithm>,
    /// The protocol the last collective ran with.
    last_proto: Option<Protocol>,
    said: BTreeSet<(u8, usize, &'static str, &'static str)>,
}

impl std::ops::Deref for Cpu {
    type Target = Comm;

    fn deref(&self) -> &Comm {
        &self.comm
    }
}

impl Cpu {
    /// Connects this rank to its peers ([`Comm::connect`], as `--transport` and
    /// `--timeout` say) and reads what `NCCL_ALGO` allows first: a name the CPU backend
    /// lacks is the user's error, said in one line before anything connects. Returns the
    /// rank and how each pair of ranks is linked ("0-1": shm).
    pub fn connect(
        store: &mut Store,
        id: &Identity,
        host: &str,
        run: &RunArgs,
        names: fn(u8) -> &'static str,
    ) -> Result<(Cpu, BTreeMap<String, Via>)> {
        let allowed = Allowed::from_env().map_err(|message| SharedError { message, usage: true })?;
        let protos = Protocols::from_env().map_err(|message| SharedError { message, usage: true })?;
        let (comm, pairs) = Comm::connect(store, id, host, run.transport, run.timeout, run.link, names)?;
        if comm.world() > 1 && !comm.has_protocols() && protos.without_simple() {
            let text = std::env::var("NCCL_PROTO").unwrap_or_default();
            return Err(SharedError {
                message: tcp_is_simple(&format!("NCCL_PROTO={text}")),
                usage: true,
            }
            .into());
        }
        let debug = id.rank == 0 && run.format == Format::Text && debug_info();
        let cpu = Cpu {
            comm,
            allowed,
            protos,
            debug,
            ran: Mutex::default(),
            set: AtomicU8::new(u8::MAX),
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
            ran: Mutex::default(),
            set: AtomicU8::new(u8::MAX),
        }
    }

    /// Which algorithm runs `coll` on `bytes` (its larger buffer): [`tuner::choose`],
    /// from what this rank knows alike with every other.
    pub fn choose(&self, coll: &Collective, bytes: usize) -> Algorithm {
        let facts = Facts {
            ranks: self.world(),
            ring_in_memory: self.ring_in_memory(),
            reads_peers: self.reads_peers(),
            oversubscribed: self.oversubscribed(),
            steps: crate::record::steps_on(),
            nodes: self.nodes().iter().max().map_or(1, |m| m + 1),
            protocols: self.has_protocols(),
        };
        let (algo, proto) = tuner::choose_with(coll, bytes, &facts, &self.allowed, &self.protos);
        // Set before any message moves, alike on every rank (every input is the same); on
        // every link whose protocol differs (a split communicator shares links).
        self.set.store(proto as u8, Relaxed);
        self.comm.set_protocol(proto);
        algo
    }

    /// Notes that `algo` runs `coll` on `bytes` (what [`Cpu::choose`] said, or what a
    /// single copy fell back to): the trace's and `--steps`' label, the `Time:` line's
    /// and the benchmark's name ([`Cpu::last_algorithm`]), and with `NCCL_DEBUG=INFO`
    /// a line the first time this choice is made.
    pub fn ran(&self, coll: &Collective, bytes: usize, algo: Algorithm) {
        crate::record::algorithm(algo.label(coll));
        let mut ran = self.ran.lock().unwrap_or_else(|p| p.into_inner());
        ran.last = Some(algo);
        // The single copy reads buffers where they lie (counted as Simple); the rest go
        // by what the links were set to.
        let proto = match algo {
            Algorithm::SingleCopy => Protocol::Simple,
            _ => match self.set.load(Relaxed) {
                u8::MAX => Protocol::Simple,
                p => Protocol::from_index(p),
            },
        };
        ran.last_proto = Some(proto);
        if self.debug && ran.said.insert((coll.tag, bytes, algo.name(), proto.name())) {
            use std::io::Write;
            let _ = writeln!(std::io::stdout(), "{}", tuner::debug_line(coll, bytes, algo, proto));
        }
    }

    /// From now on, chooses among what `allowed` allows (the benchmark's `-A`: one
    /// `NCCL_ALGO` value per sweep; every rank is told the same).
    pub fn allow(&mut self, allowed: Allowed) {
        self.allowed = allowed;
    }

    /// The algorithm of the last collective this rank ran.
    pub fn last_algorithm(&self) -> Option<Algorithm> {
        self.ran.lock().unwrap_or_else(|p| p.into_inner()).last
    }

    /// From now on, chooses among the protocols `protos` allows (the benchmark's `-P`:
    /// one `NCCL_PROTO` value per sweep; every rank is told the same). Where some pair
    /// of ranks talks over TCP, only Simple can run: anything else is refused.
    pub fn allow_protocols(&mut self, protos: Protocols, said: &str) -> Result<(), String> {
        if self.world() > 1 && !self.has_protocols() && protos.without_simple() {
            return Err(tcp_is_simple(said));
        }
        self.protos = protos;
        Ok(())
    }

    /// The protocol of the last collective this rank ran (LL, LL128 or Simple).
    pub fn last_protocol(&self) -> Option<Protocol> {
        self.ran.lock().unwrap_or_else(|p| p.into_inner()).last_proto
    }
}

/// Why `said` (`NCCL_PROTO=LL`, `-P ll`) cannot run on a job with TCP links, in one line.
fn tcp_is_simple(said: &str) -> String {
    format!(
        "{said}: some ranks talk over TCP, which has the Simple protocol only (LL and LL128 run on shared memory: \
         every rank on one host, --transport auto or shm)"
    )
}
