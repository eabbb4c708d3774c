//! The workbook's runtime: what every rank needs before and beneath any backend.
//!
//! Starting the ranks ([`launch`] decides a process's role, [`launcher`] starts and
//! watches a node's ranks), meeting them ([`rendezvous`]: the store, over [`wire`]), the
//! types they exchange ([`element`]), how they fail ([`error`], [`deadline`], [`fault`])
//! and who is to blame ([`heartbeat`], [`blame`]),
//! and what each rank did, for `--steps` and `--trace` ([`record`], stamped by [`clock`]).
//!
//! The layer below both backends (`workbook-cpu`, `workbook-nccl`) and the lessons' API
//! (`common`): it knows nothing of them, and takes no command line of theirs.

pub mod blame;
pub mod clock;
pub mod deadline;
pub mod element;
pub mod error;
pub mod fault;
pub mod heartbeat;
pub mod launch;
pub mod launcher;
pub mod limits;
pub mod rank;
pub mod record;
pub mod rendezvous;
pub mod units;
pub mod wire;
