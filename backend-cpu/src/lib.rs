//! The CPU backend: a rank's communicator ([`Comm`]: a link to every other rank, over
//! shared memory within a host and TCP between hosts, [`transport`]), its buffers where
//! the other ranks of its host can read them ([`host_memory`]), the collectives' algorithms
//! ([`collective`], one file each) and the one function that chooses between them
//! ([`tuner::choose`]), with the tuner's state beside the communicator ([`Cpu`]).

pub mod collective;
pub mod comm;
pub mod cpu;
pub mod host_memory;
mod machine;
pub mod prims;
pub mod transport;
pub mod tuner;

pub use comm::{Comm, SEND_RECV_TAG, SMALL};
pub use cpu::Cpu;

use workbook_runtime::{element, error, fault, heartbeat, launch, limits, record, rendezvous, units, wire};
