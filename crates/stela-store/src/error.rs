//! The one error type of the crate. Each variant is something a caller can act on: retry the
//! transaction (`Deadlock`, `LockTimeout`), restore or repair (`Corrupt`, `BadLogRecord`, `Archive`), reopen (`Poisoned`),
//! fix the call (`KeyTooLarge`, `ValueTooLarge`).

use crate::format::page::{PageError, PageId};
use crate::format::{RecordError, TxnId};
use stela_format::Lsn;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A failure of the store. New kinds may be added in a later version (`#[non_exhaustive]`): a
/// `match` outside this crate needs a wildcard arm. Naming every kind there is not enough:
///
/// ```compile_fail
/// use stela_store::Error;
/// fn kind(error: &Error) -> u8 {
///     match error {
///         Error::Deadlock { .. } | Error::LockTimeout { .. } => 0,
///         Error::Corrupt { .. } | Error::BadLogRecord { .. } | Error::Archive { .. } => 1,
///         Error::Io(_) | Error::Log(_) | Error::Daemon(_) => 2,
///         Error::Unsupported(_) | Error::Follow(_) | Error::Poisoned => 3,
///         Error::KeyTooLarge { .. } | Error::ValueTooLarge { .. } => 4,
///     }
/// }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The transaction was chosen as the victim of a deadlock. Nothing it did is undone yet:
    /// abort it (or drop it) and run it again.
    #[error("transaction {txn} was chosen as a deadlock victim; abort it and retry")]
    Deadlock { txn: TxnId },

    /// The transaction waited for a key's lock longer than the store's lock timeout
    /// (`StoreOptions::lock_timeout`): another transaction has held it that long. Nothing it
    /// did is undone yet: abort it (or drop it) and run it again.
    #[error(
        "transaction {txn} waited {waited:?} for a lock, past the lock timeout; abort it and retry"
    )]
    LockTimeout {
        txn: TxnId,
        waited: std::time::Duration,
    },

    /// A page read from the page file failed its checks.
    #[error("page {page} is corrupt: {source}")]
    Corrupt {
        page: PageId,
        #[source]
        source: PageError,
    },

    /// A record in the log decodes but could not have been written by the store, or a chain
    /// of records is broken.
    #[error("log record {lsn}: {source}")]
    BadLogRecord {
        lsn: Lsn,
        #[source]
        source: RecordError,
    },

    /// A run file of the log archive failed its checks (or the runs do not fit together).
    #[error("log archive {}: {source}", path.display())]
    Archive {
        path: std::path::PathBuf,
        #[source]
        source: crate::format::RunError,
    },

    /// The page file could not be read or written.
    #[error("page file: {0}")]
    Io(#[from] std::io::Error),

    /// The log failed (I/O, damage, a lost daemon). See the wrapped error.
    #[error("log: {0}")]
    Log(#[from] stela_wal::Error),

    /// The daemon keeping the log failed or could not be reached (a lost connection, a stopped
    /// log, an acknowledgement in doubt across a failover). See the wrapped error.
    #[error("log daemon: {0}")]
    Daemon(#[from] stela_client::Error),

    /// The store cannot run as asked (a log level it cannot chain pages by).
    #[error("unsupported: {0}")]
    Unsupported(&'static str),

    /// A standby follower's directory and the log do not fit together: the log no longer
    /// reaches back to what the directory needs, ends before what its pages hold, or the
    /// directory is not a follower's. Nothing was applied across the gap.
    #[error("standby follower: {0}")]
    Follow(String),

    /// An earlier log or page-file failure left the in-memory state ahead of what is durable;
    /// the store accepts no more work. Reopen it: restart recovers the durable state.
    #[error("the store stopped after an earlier failure; reopen it to recover")]
    Poisoned,

    #[error("key of {len} bytes exceeds the limit of {max}")]
    KeyTooLarge { len: usize, max: usize },

    #[error("value of {len} bytes exceeds the limit of {max}")]
    ValueTooLarge { len: usize, max: usize },
}
