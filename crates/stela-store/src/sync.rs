//! The synchronisation primitives the decoupled cleaner, the buffer pool and the page file
//! share, swapped for loom's under `--cfg stela_store_loom` (this crate's own cfg: see
//! `Cargo.toml`), so that the model in `tests/loom_cleaner.rs` explores the interleavings of
//! the cleaner's round, page fixes and eviction against the very code the store runs.
//!
//! Only what those three synchronise on goes through here: the clean LSN, the page file's
//! write map, its unreported writes and its write/sync counters, and the log tail's copy.
//! Statistics counters and the store's other latches stay std's: they order nothing the model
//! checks, and every extra loom object multiplies its state space.

#[cfg(stela_store_loom)]
pub(crate) use loom::sync::{atomic::AtomicU64, Mutex};
#[cfg(not(stela_store_loom))]
pub(crate) use std::sync::{atomic::AtomicU64, Mutex};
