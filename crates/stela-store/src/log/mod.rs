//! The log, the store's foundation: the small [`LogDevice`] trait and its implementation on the
//! embedded `stela_wal::Wal` (`device`), the same trait over a stela daemon's log (`daemon`,
//! [`DaemonLog`]), the records appended since open kept in memory for the decoupled services
//! (`tail`), and the log archive, the log re-sorted by page so that one page's history is a
//! few indexed reads (`archive`, [`LogArchive`]).
//!
//! Nothing here knows pages as a cache or transactions: access, recovery and the services stand
//! on the log, and the log on the bytes (`crate::format`) alone.
//!
//! The store needs five things from a log and nothing else: append a record and learn its LSN,
//! wait until an LSN is durable (at whatever level the log was opened with: that level *is* the
//! store's commit durability), know the durable LSN (for the write-ahead rule), and read records
//! back in LSN order from a given LSN (restart; single-page recovery). A sixth is optional:
//! dropping records below an LSN nobody needs any more (`retention` decides which); a log that
//! cannot just keeps them. So is encoding a record apart from appending it, for a caller that
//! appends under a lock of its own. `stela_client::Wal` has the same calls, and
//! [`DaemonLog`] implements this trait on it.
//!
//! Invariant the store relies on: LSNs are dense and increasing, and a record returned by
//! `append` is readable by `read_from` afterwards.

pub(crate) mod archive;
pub(crate) mod daemon;
pub(crate) mod device;
pub(crate) mod tail;

pub use archive::{ArchiveReport, BackupReport, LogArchive};
pub use daemon::DaemonLog;
pub(crate) use device::read_one;
pub use device::{LogDevice, RecordIter, TYPE_TAG};
