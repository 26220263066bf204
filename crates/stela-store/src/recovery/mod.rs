//! Recovery: what restart after a crash reads, and restart itself.
//! - `master`: the master record, the durable pointer to the latest complete checkpoint;
//! - `analysis`: the state machine that turns a checkpoint's tables and the log after it into
//!   the tables at the log's end (restart and the decoupled checkpoint share it);
//! - `restart`: classical ARIES (analysis, redo, undo with compensation records, all before
//!   open returns) or instant (analysis only, the rest on demand), and the rollback a normal
//!   abort shares with it.
//!
//! Recovery stands on access (restart redoes and undoes through the B+tree engine); the
//! persistence services stand on it (a checkpoint writes the master record restart reads).

pub(crate) mod analysis;
pub(crate) mod master;
pub(crate) mod restart;
