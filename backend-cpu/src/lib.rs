//! The CPU backend: a rank's communicator ([`Comm`]: a link to every other rank, over
//! shared memory within a host and TCP between hosts, [`transport`]), its buffers where
//! the other ranks of its host can read them ([`host_memory`]), and the steps the CPU
//! algorithms are made of. The algorithms themselves, and the choice between them, live
//! with their collective in `common`: this layer moves bytes and knows no collective.

pub mod comm;
pub mod host_memory;
mod machine;
pub mod transport;

pub use comm::{Comm, SEND_RECV_TAG, SMALL};

use workbook_runtime::{element, error, fault, heartbeat, launch, limits, rendezvous, units, wire};
