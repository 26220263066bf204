//! The daemon's one error type. Every variant is something a caller can act on, names the log,
//! file or peer it concerns, and maps to one wire [`ErrorCode`] (`docs/PROTOCOL.md`).

use crate::pool::PoolError;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use stela_proto::ErrorCode;
use stela_wal::Codec;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No buffer space now: the caller parks the request and retries after a write completes.
    #[error("no buffer space now")]
    NoSpace,
    #[error(
        "record of {bytes} bytes is larger than the daemon accepts for this log ({max} bytes)"
    )]
    RecordTooLarge { bytes: usize, max: usize },
    #[error("batch of {bytes} bytes is larger than the dirty cap of {cap} bytes; send it in smaller appends")]
    BatchTooLarge { bytes: usize, cap: usize },
    #[error("a power failure was announced: writes are refused until power-restore or a restart")]
    PowerFailing,
    #[error("the daemon is shutting down")]
    ShuttingDown,
    #[error("log {log:?} is being closed")]
    Closing { log: String },
    /// This node does not serve writes: it is a standby, or a primary that stepped down.
    #[error("not the primary: {0}")]
    NotPrimary(String),
    /// A planned switchover could not be made (nothing changed: the primary keeps its epoch).
    #[error("switchover refused: {0}")]
    Switchover(String),
    /// The primary stepped down while the commit waited for the standby.
    #[error(
        "log {log:?}: commit in doubt: {why}; resolve it by its term and LSN on the new primary"
    )]
    InDoubt { log: String, why: String },
    /// A `replicated` or `all` commit answered without a standby (a promoted primary not yet
    /// protected again, or `--degrade-after`): appended, on this primary alone.
    #[error("log {log:?}: commit not replicated: {why}")]
    Unprotected { log: String, why: String },
    /// A write or sync of the log failed; it takes nothing more until the daemon restarts.
    #[error("log {log:?} stopped after a failed write or sync: {cause}")]
    LogStopped {
        log: String,
        cause: Arc<stela_wal::Error>,
    },
    /// A new segment could not be created for lack of space; nothing acknowledged is lost.
    #[error("log {log:?}: {cause}; appends are refused until space is freed")]
    DiskFull {
        log: String,
        cause: Arc<stela_wal::Error>,
    },
    #[error("LSN {lsn} of log {log:?} has not been appended (next is {next})")]
    NotAppended { log: String, lsn: u64, next: u64 },
    #[error("log {log:?} has no LSNs left (next {next}, {records} records asked)")]
    LsnExhausted {
        log: String,
        next: u64,
        records: usize,
    },
    #[error("log name {0:?} is not allowed: use 1-100 of [A-Za-z0-9._-], not starting with '.'")]
    BadLogName(String),
    #[error("log {0:?} does not exist (open it with create to make it)")]
    NoSuchLog(String),
    #[error("log {log:?} is open by {handles} client handle(s): close them before deleting it")]
    LogInUse { log: String, handles: u32 },
    #[error("unknown codec {0:?} (expected json, msgpack or postcard)")]
    UnknownCodec(String),
    #[error("log {name:?} is open with codec {open} and record type {open_type:?}, not {asked} / {asked_type:?}")]
    Mismatch {
        name: String,
        open: Codec,
        open_type: String,
        asked: Codec,
        asked_type: String,
    },
    /// Opening (recovering) a log's files failed: corruption, a lock held elsewhere, I/O.
    #[error("opening log {log:?}: {source}")]
    Open {
        log: String,
        #[source]
        source: stela_wal::Error,
    },
    /// The log's directory is a symbolic link: the daemon follows none inside its directory.
    #[error("log {log:?}: {} is a symbolic link, which the daemon does not follow (its logs stay inside its directory): replace it with the log's directory", path.display())]
    SymlinkedLog { log: String, path: PathBuf },
    /// Reading or truncating a log's files failed.
    #[error("log {log:?}: {source}")]
    Files {
        log: String,
        #[source]
        source: stela_wal::Error,
    },
    #[error("no log is open as handle {0} on this connection")]
    UnknownHandle(u32),
    #[error("{0}")]
    BadRequest(String),
    /// An administrative request from a TCP client not authenticated as an administrator.
    #[error("{request} is an administrative request: refused for {peer}, which is not authenticated as an administrator")]
    Forbidden { request: &'static str, peer: String },
    /// A creation or an append past the credential's quota (`--quota-logs`, `--quota-bytes`):
    /// nothing was made or placed.
    #[error("quota exceeded for {credential}: {what}")]
    QuotaExceeded { credential: String, what: String },
    #[error("durability {0} needs a standby, which this daemon does not have")]
    Unsupported(stela_proto::Durability),
    /// Daemon-side I/O that is not a log's: the socket, a ring's memory, a measurement.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error("{0}")]
    Start(#[from] StartError),
}

impl Error {
    /// The wire code a client acts on.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::RecordTooLarge { .. } | Error::BatchTooLarge { .. } => ErrorCode::RecordTooLarge,
            Error::PowerFailing => ErrorCode::PowerFailing,
            Error::ShuttingDown | Error::NoSpace | Error::Closing { .. } => ErrorCode::ShuttingDown,
            Error::LogStopped { .. } => ErrorCode::LogStopped,
            Error::DiskFull { .. } => ErrorCode::DiskFull,
            Error::NotAppended { .. } => ErrorCode::NotAppended,
            Error::LsnExhausted { .. } => ErrorCode::LsnExhausted,
            Error::BadLogName(_) | Error::NoSuchLog(_) => ErrorCode::BadLogName,
            Error::LogInUse { .. } => ErrorCode::LogInUse,
            Error::NotPrimary(_) => ErrorCode::NotPrimary,
            Error::Switchover(_) => ErrorCode::BadRequest,
            Error::InDoubt { .. } => ErrorCode::InDoubt,
            Error::Unprotected { .. } => ErrorCode::Unprotected,
            Error::UnknownCodec(_)
            | Error::Mismatch { .. }
            | Error::Open { .. }
            | Error::SymlinkedLog { .. } => ErrorCode::OpenFailed,
            Error::Files { .. } | Error::Io { .. } | Error::Start(_) => ErrorCode::Io,
            Error::UnknownHandle(_) => ErrorCode::UnknownHandle,
            Error::BadRequest(_) => ErrorCode::BadRequest,
            Error::Forbidden { .. } => ErrorCode::Forbidden,
            Error::QuotaExceeded { .. } => ErrorCode::QuotaExceeded,
            Error::Unsupported(_) => ErrorCode::Unsupported,
        }
    }

    /// A pool refusal, told in terms of the log it concerns.
    pub(crate) fn from_pool(log: &str, error: PoolError) -> Error {
        let log = log.to_owned();
        match error {
            PoolError::NoSpace => Error::NoSpace,
            PoolError::RecordTooLarge { bytes, max } => Error::RecordTooLarge { bytes, max },
            PoolError::BatchTooLarge { bytes, cap } => Error::BatchTooLarge { bytes, cap },
            PoolError::PowerFailing => Error::PowerFailing,
            PoolError::ShuttingDown => Error::ShuttingDown,
            PoolError::HandingOver => Error::NotPrimary(PoolError::HandingOver.to_string()),
            PoolError::Closed => Error::Closing { log },
            PoolError::InDoubt(why) => Error::InDoubt { log, why },
            PoolError::Unprotected(why) => Error::Unprotected { log, why },
            PoolError::Failed(cause) => Error::LogStopped { log, cause },
            PoolError::DiskFull(cause) => Error::DiskFull { log, cause },
            PoolError::NotAppended { lsn, next } => Error::NotAppended { log, lsn, next },
            PoolError::LsnExhausted { next, records } => Error::LsnExhausted { log, next, records },
        }
    }
}

/// What a shutdown could not do: the logs whose buffered records were not all written, each
/// with why ([`Error::LogStopped`]: a write or sync failed; [`Error::DiskFull`]: no segment could
/// be made), and flusher threads that had panicked (whatever they held was not written either).
#[derive(Debug, thiserror::Error)]
#[error("shutdown incomplete: {}", shutdown_failures(.logs, *.panicked_flushers))]
pub struct ShutdownError {
    pub logs: Vec<Error>,
    pub panicked_flushers: usize,
}

fn shutdown_failures(logs: &[Error], panicked_flushers: usize) -> String {
    let mut parts: Vec<String> = logs.iter().map(Error::to_string).collect();
    if panicked_flushers > 0 {
        parts.push(format!(
            "{panicked_flushers} flusher thread(s) had panicked"
        ));
    }
    parts.join("; ")
}

/// Why the daemon did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("creating {path}: {source}")]
    Dir { path: PathBuf, source: io::Error },
    #[error("{0} is a symbolic link: the daemon follows none inside its directory")]
    Symlink(PathBuf),
    #[error("measuring the disk's write rate in {path}: {source}")]
    Measure { path: PathBuf, source: io::Error },
    #[error("another daemon is already serving on {0}")]
    SocketInUse(PathBuf),
    #[error("binding {what}: {source}")]
    Bind { what: String, source: io::Error },
    #[error("setting up the event loop: {0}")]
    EventLoop(io::Error),
    #[error("installing signal handlers: {0}")]
    Signals(io::Error),
    #[error("starting thread {name}: {source}")]
    Thread { name: String, source: io::Error },
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("invalid configuration: {0}")]
    Invalid(#[from] crate::config::ConfigError),
    #[error("setting up TLS: {0}")]
    Tls(#[from] stela_net::tls::TlsError),
    #[error("socket group {name:?}: {message}")]
    SocketGroup { name: String, message: String },
}
