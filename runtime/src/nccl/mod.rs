//! NCCL's own formats, read once for every layer: its version ([`version`]) and its
//! `NCCL_ALGO`/`NCCL_PROTO` lists ([`list`]). The NCCL backend checks the user's values
//! against the NCCL that loads; the CPU backend's tuner reads the same grammar for its own
//! algorithms; the benchmark writes the version as nccl-tests does. (The test double,
//! `nccl-double/`, plays NCCL and so reads them as NCCL's own code does, on its own.)

pub mod list;
pub mod version;

pub use version::Version;
