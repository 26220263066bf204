//! The one error type of the crate. Every variant names the file, offset or LSN it concerns, so a
//! message on its own tells an operator where to look.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use stela_format::{Codec, CodecError, HeaderError, Lsn, TypeTag};

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A failure of the log. New kinds may be added in a later version (`#[non_exhaustive]`): a
/// `match` outside this crate needs a wildcard arm. Naming every kind there is not enough:
///
/// ```compile_fail
/// use stela_wal::Error;
/// fn kind(error: &Error) -> u8 {
///     match error {
///         Error::Io { .. } | Error::DiskFull { .. } | Error::CutRefused { .. } => 0,
///         Error::Poisoned { .. } | Error::Corruption(_) | Error::WrongCodec { .. } => 1,
///         Error::WrongRecordType { .. } | Error::BadHeader { .. } | Error::Codec { .. } => 2,
///         Error::RecordTooLarge { .. } | Error::SegmentTooLarge { .. } => 3,
///         Error::Locked { .. } | Error::NotFound { .. } | Error::NotALog { .. } => 4,
///         Error::TermsDamaged { .. } | Error::TermRefused { .. } => 5,
///         Error::NotAppended { .. } | Error::LsnExhausted { .. } | Error::Truncated { .. } => 6,
///     }
/// }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An I/O call failed. `op` says which (open, read, write, fdatasync, ...).
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    /// The device or quota is full. Nothing acknowledged is lost; records that were not yet
    /// acknowledged may or may not be in the log when it is reopened (those before the segment
    /// that could not be created were written and sealed), like any unacknowledged record.
    #[error("no space left on device: {op} {} failed; acknowledged records are intact, free space and reopen the log", path.display())]
    DiskFull {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    /// A cut (`salvage::cut_after`) was refused before anything was changed.
    #[error("cannot cut the log in {dir}: {reason}")]
    CutRefused { dir: PathBuf, reason: String },

    /// A previous write or fsync failed, so the log stopped. Reopen it to recover what is durable.
    #[error("the log stopped after an earlier failure and accepts no more calls (reopen it to recover): {cause}")]
    Poisoned { cause: Arc<Error> },

    /// Bytes in the middle of the log are damaged. Nothing was changed on disk.
    #[error("{0}")]
    Corruption(Box<Corruption>),

    /// The log was written with another codec than the one asked for.
    #[error("{}: log is written with the {found} codec, but it was opened with the {expected} codec", segment.display())]
    WrongCodec {
        segment: PathBuf,
        found: Codec,
        expected: Codec,
    },

    /// The log holds another record type than the one asked for.
    #[error("{}: log holds records of type `{found}`, but it was opened for type `{expected}` (set WalOptions::type_tag if the type was renamed)", segment.display())]
    WrongRecordType {
        segment: PathBuf,
        found: TypeTag,
        expected: TypeTag,
    },

    /// A segment file's header is unreadable.
    #[error("{}: bad segment header: {reason}", segment.display())]
    BadHeader {
        segment: PathBuf,
        reason: HeaderError,
    },

    /// A record could not be encoded, or a stored payload did not decode as the record type.
    #[error("record {}: {source}", lsn.map_or("(new)".to_string(), |l| l.to_string()))]
    Codec {
        lsn: Option<Lsn>,
        #[source]
        source: CodecError,
    },

    #[error("record of {bytes} bytes exceeds the limit of {max} bytes")]
    RecordTooLarge { bytes: usize, max: usize },

    /// `WalOptions::segment_bytes` is larger than a segment can be: frames record offsets in
    /// the segment as 32-bit numbers. Nothing was opened or created.
    #[error("segment_bytes {bytes} is above the largest segment size, {max} bytes (frames store offsets in 32 bits)")]
    SegmentTooLarge { bytes: u64, max: u64 },

    #[error("{}: the log is open in another process or handle", dir.display())]
    Locked { dir: PathBuf },

    #[error("{}: no log here (and create_if_missing is off)", dir.display())]
    NotFound { dir: PathBuf },

    /// A tool (verify, dump, repair) was pointed at something that holds no log: a missing
    /// path, a file, or a directory without a single segment file. Nothing was changed.
    #[error("{}: not a log: {reason}", path.display())]
    NotALog { path: PathBuf, reason: &'static str },

    /// A log's term state (`TERMS`, [`crate::term_store`]) does not decode or breaks its
    /// invariants. Nothing was changed: reading it as "no term yet" would let a fenced node
    /// accept an old primary again.
    #[error("{}: damaged term state, refused: {reason}", path.display())]
    TermsDamaged { path: PathBuf, reason: String },

    /// A change to a log's term state that would break its invariants (a term that is not new,
    /// a history that would go back). Nothing was changed.
    #[error("{}: {source}", path.display())]
    TermRefused {
        path: PathBuf,
        #[source]
        source: stela_format::term::TermError,
    },

    /// `commit` of an LSN that has not been appended.
    #[error("LSN {lsn} has not been appended (next LSN is {next})")]
    NotAppended { lsn: Lsn, next: Lsn },

    /// Appending would use an LSN above [`Lsn::MAX`]. Nothing was appended.
    #[error("no LSNs left: the next record would be LSN {next} and {records} were appended, past the largest LSN {}", Lsn::MAX)]
    LsnExhausted { next: Lsn, records: u64 },

    /// A read from an LSN that has been truncated away.
    #[error("LSN {lsn} was truncated; the log starts at {first}")]
    Truncated { lsn: Lsn, first: Lsn },
}

/// Where and how the log is damaged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Corruption {
    pub segment: PathBuf,
    /// Byte offset of the first bad byte within the segment file.
    pub offset: u64,
    /// The LSN the reader expected at that offset.
    pub expected_lsn: Lsn,
    pub reason: String,
    /// Offset of the next valid record after the damage, if one was found (its presence is what
    /// makes this corruption rather than a torn write).
    pub valid_record_at: Option<u64>,
}

impl std::fmt::Display for Corruption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "corruption in {} at byte offset {} (expected record LSN {}): {}",
            self.segment.display(),
            self.offset,
            self.expected_lsn,
            self.reason
        )?;
        if let Some(at) = self.valid_record_at {
            write!(f, "; valid records follow at offset {at}")?;
        }
        Ok(())
    }
}

impl Error {
    /// Wraps an I/O error, recognising a full device.
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Error {
        let path = path.into();
        if crate::storage::is_out_of_space(&source) {
            Error::DiskFull { op, path, source }
        } else {
            Error::Io { op, path, source }
        }
    }

    /// A copy of an I/O failure, so the caller that hit it can get the error itself while the
    /// log keeps the original to poison later calls. `io::Error` is not `Clone`: the copy keeps
    /// the OS error code (or the kind and message). Other errors have no copy.
    pub(crate) fn duplicate_io(&self) -> Option<Error> {
        let copy = |source: &io::Error| match source.raw_os_error() {
            Some(code) => io::Error::from_raw_os_error(code),
            None => io::Error::new(source.kind(), source.to_string()),
        };
        match self {
            Error::Io { op, path, source } => Some(Error::Io {
                op,
                path: path.clone(),
                source: copy(source),
            }),
            Error::DiskFull { op, path, source } => Some(Error::DiskFull {
                op,
                path: path.clone(),
                source: copy(source),
            }),
            _ => None,
        }
    }

    pub(crate) fn corruption(c: Corruption) -> Error {
        Error::Corruption(Box::new(c))
    }

    /// The corruption details, if this is a corruption error.
    pub fn as_corruption(&self) -> Option<&Corruption> {
        match self {
            Error::Corruption(c) => Some(c),
            _ => None,
        }
    }
}
