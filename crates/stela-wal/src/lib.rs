//! stela-wal: a typed, checksummed, group-committing write-ahead log.
//!
//! A tour of the crate, from the top down:
//! - [`wal`]: [`Wal<T>`], the typed API (append, commit, iterate, truncate).
//! - [`log`]: [`Log`], the untyped log of byte payloads, and its group commit.
//! - [`files`]: the segment files without the group commit: [`LogFiles`] after recovery, the
//!   [`SegmentWriter`] of the newest segment and the [`SegmentSet`] of all of them (what the log
//!   daemon writes through, and the embedded log too).
//! - [`mirror`]: a log filled byte for byte from another's segment bytes (a standby's copy of
//!   its primary), and the reader that cuts those bytes out of the primary's files.
//! - [`recovery`]: what happens at open: segment checks, torn-tail repair, salvage modes.
//! - [`schema`]: the record type's field names, kept once per log for `stela wal dump`.
//! - [`scan`]: the pure classification of a segment's bytes: records, torn tail, damage.
//! - [`reader`]: the lazy, ordered reader that checks every frame.
//! - [`par_iter`]: the same order, with decoding spread over worker threads (fast replay).
//! - [`segment`]: segment files: listing, safe creation, headers.
//! - [`segment_set`]: every segment of an open log, oldest first (readers, truncation).
//! - [`storage`]: the I/O trait and the real file system; with the `testing` feature, the
//!   fault-injecting one (power cuts down to single sectors) and a forwarding wrapper for test
//!   storages.
//! - [`synced`]: the `SYNCED` file, how far the newest segment was synced when its last
//!   recorded sync returned, written off the commit path by one keeper thread.
//! - [`term_store`]: a replicated log's durable term state (current term, term history).
//! - [`tools`]: verify, dump and repair, for the `stela wal` commands.
//! - [`options`], [`error`]: how a log is opened and what can go wrong.
//!
//! The bytes on disk are specified in `docs/FORMAT.md` and encoded by the `stela-format` crate.
//! What each acknowledgement guarantees is in `docs/DURABILITY.md`.
//!
//! ```
//! use stela_wal::{Codec, Wal, WalOptions};
//!
//! let dir = tempfile::tempdir()?;
//! let wal: Wal<(u32, String)> = Wal::open(dir.path(), WalOptions::default().codec(Codec::Json))?;
//! let last = wal.append_batch(&[(1, "debit".into()), (2, "credit".into())])?;
//! wal.commit(last)?;
//! assert_eq!(wal.durable_lsn(), last);
//! assert_eq!(wal.iter()?.count(), 2);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod error;
pub mod files;
pub mod holds;
pub mod log;
pub mod mirror;
pub mod options;
pub mod par_iter;
pub mod reader;
pub mod recovery;
pub mod salvage;
pub mod scan;
pub mod schema;
pub mod segment;
pub mod segment_set;
pub mod storage;
pub mod synced;
pub mod term_store;
pub mod tools;
pub mod wal;
pub mod writer;

pub use error::{Corruption, Error, Result};
pub use files::{LogFiles, SegmentSet, SegmentWriter};
pub use log::{CommitFuture, Log, LogStats};
pub use options::{RecoveryMode, SyncMode, WalOptions};
pub use par_iter::ParIter;
pub use reader::{RawReader, ReadPoint};
pub use recovery::RecoveryReport;
pub use stela_format::{Codec, Lsn};
pub use term_store::TermStore;
pub use wal::{Iter, Wal};
