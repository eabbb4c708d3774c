//! The workbook's runtime: what every rank needs before and beneath any backend.
//!
//! Starting the ranks ([`launch`] decides a process's role, [`launcher`] starts and
//! watches a node's ranks), meeting them ([`rendezvous`]: the store, over [`wire`], joined
//! with the job's [`secret`]), the types they exchange ([`element`]), how they fail
//! ([`error`], [`deadline`], [`fault`]) and who is to blame ([`heartbeat`], [`blame`]),
//! and what each rank did, for `--steps` and `--trace` ([`record`], stamped by [`clock`]).
//!
//! The layer below both backends (`workbook-cpu`, `workbook-nccl`) and the lessons' API
//! (`common`): it knows nothing of them, and takes no command line of theirs.

pub mod blame;
pub mod clock;
pub mod deadline;
pub mod element;
pub mod error;
pub mod failure;
pub mod fault;
pub mod func;
pub mod heartbeat;
pub mod launch;
pub mod launcher;
pub mod limits;
pub mod nccl;
pub mod rank;
pub mod record;
pub mod rendezvous;
pub mod secret;
pub mod signals;
pub mod units;
pub mod wire;

pub use func::Func;

/// Set (to `1`) in a rank's process where the workbook, not the user, set `NCCL_DEBUG`
/// (to read NCCL's own account of its choices: `workbook-nccl`'s `nccl_log`): then
/// `NCCL_DEBUG` says nothing of what the user asked for, and nothing else may read it so.
pub const NCCL_DEBUG_IS_OURS: &str = "NCCL_WORKBOOK_NCCL_LOG";

/// Whether the user's `NCCL_DEBUG` (not the workbook's: [`NCCL_DEBUG_IS_OURS`]) is set.
pub fn users_nccl_debug() -> Option<String> {
    if std::env::var_os(NCCL_DEBUG_IS_OURS).is_some() {
        return None;
    }
    std::env::var("NCCL_DEBUG").ok()
}
