//! Access: how a transaction reaches a key. From the bottom up:
//! - `pagefile`: the stored page images, shared by the pool and the cleaners;
//! - `redo`: applying a log record to a page image, and the redo an instant restart leaves
//!   pending per page;
//! - `repair`: single-page recovery, a damaged or stale image rebuilt from the archive and the
//!   log, and the write elision it allows;
//! - `pool`: the buffer pool (clock eviction, steal / no-force under the write-ahead rule);
//! - `btree`: the B+tree over the pool, and the engine state every tree operation needs;
//! - `lock`: key locks for strict two-phase locking, deadlocks found on a waits-for graph.
//!
//! Access stands on the log (`crate::log`) and the bytes (`crate::format`); it knows nothing of
//! checkpoints, cleaners or restart, which stand on it.

pub(crate) mod btree;
pub(crate) mod lock;
pub(crate) mod pagefile;
pub(crate) mod pool;
pub(crate) mod redo;
pub(crate) mod repair;
