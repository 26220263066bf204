//! The bytes the store writes, pure (bytes in, values out, no I/O), each decoder fuzzed
//! (`fuzz/fuzz_targets/store_*.rs`):
//! - [`page`]: one 8 KiB B+tree node on disk;
//! - the log records (`record.rs`: [`LogRecord`], [`LogBody`], the checkpoint tables);
//! - a log-archive run (`run/`: [`encode_run`], [`decode_run`], the block index).
//!
//! Nothing here imports the rest of the crate: every other room stands on these bytes.

pub mod page;
pub(crate) mod record;
pub(crate) mod run;

pub use record::*;
pub use run::*;
