//! The materialiser: the persistence paper's decoupled page cleaner, applied to files. It reads
//! the mount's log from a [`Source`], applies each record to the backing directory, and
//! records its progress in the backing snapshot and tells the source (which, for the mount's
//! own log, logs a checkpoint and truncates the log below it). Two sources: [`DaemonLog`], the
//! mount's log in the primary's daemon, and [`crate::follow::MirroredLog`], a standby daemon's
//! copy of that log, read from its files (a standby node keeping its own copy of the files
//! current, so that it can mount at once after a promotion).
//!
//! Owns: its own [`Tree`] (loaded from the backing snapshot and advanced by replay, never
//! copied from the mount), the backing files' write descriptors. Invariants:
//! - Only records the log holds durably (`durable_lsn`: on the daemon's disk; with a mount at
//!   `replicated` or `all`, also held by the standby) are applied, so
//!   the backing files never hold a change the log could lose: after any crash the backing
//!   state is a prefix of the log's history, and replaying the log's rest completes it.
//! - A checkpoint at LSN `a` is written only after every data file touched up to `a` is
//!   fsync'ed (see [`crate::backing`]); the log is truncated only below a checkpoint, and,
//!   while the daemon has a standby, only below what the standby holds on its disk: a
//!   standby that was away (a returning old primary, or one whose link broke) is caught up
//!   from the primary's log, which must still hold every record the standby lacks.
//! - A failed fsync or write stops the materialiser for good (the error is reported to the
//!   mount, whose writes then fail once its unapplied data reaches the cap); it never retries
//!   a file whose writeback failed.

use crate::backing::{sync_dir, Backing};
use crate::record::{falloc, FsRecord, Kind};
use crate::tree::{Inconsistent, Tree};
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use stela_client::{Address, Connection, Durability, Lsn, Wal};
use stela_proto::{RequestBody, ResponseBody};

/// How long the materialiser waits between reads of the log, unless its last read was full.
/// Each read has the daemon find its starting point in the log's files (reading and checking
/// the segment up to it, measured at most of the daemon's CPU when read every few
/// milliseconds under pgbench), so fewer, larger reads cost the daemon far less.
const PACE: Duration = Duration::from_millis(50);
/// Records per read.
const BATCH: usize = 4096;
/// How often applied records are made durable in the backing directory and checkpointed (each
/// checkpoint fsyncs the touched files and rewrites the snapshot): sooner when the records
/// applied since the last one carry more than [`CHECKPOINT_BYTES`].
const CHECKPOINT_EVERY: Duration = Duration::from_millis(500);
const CHECKPOINT_BYTES: u64 = 32 << 20;

/// Why the materialiser stopped (it stops for good: see the module's invariants).
#[derive(Debug, thiserror::Error)]
pub enum MaterialiseError {
    /// The daemon's log ([`DaemonLog`]) could not be asked, read, checkpointed or truncated.
    #[error("{op}: {source}")]
    Log {
        op: LogOp,
        #[source]
        source: Box<stela_client::Error>,
    },
    /// The records up to `lsn` are durable on the primary, but waiting for its standby to
    /// hold them failed.
    #[error("waiting for the standby to hold LSN {lsn}: {source}")]
    Standby {
        lsn: u64,
        #[source]
        source: Box<stela_client::Error>,
    },
    /// A standby's copy ([`crate::follow::MirroredLog`]) could not be held.
    #[error("recording the hold on {} for {}: {source}", dir.display(), holder.display())]
    Hold {
        dir: PathBuf,
        holder: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A standby's copy could not be read.
    #[error("reading {}: {source}", dir.display())]
    ReadCopy {
        dir: PathBuf,
        #[source]
        source: Box<stela_wal::Error>,
    },
    /// A segment of a standby's copy could not be made durable before it was applied.
    #[error("fdatasync of {}: {source}", segment.display())]
    SyncCopy {
        segment: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A record of a standby's copy does not decode.
    #[error("record {lsn} of {}: {source}", dir.display())]
    DecodeCopy {
        lsn: u64,
        dir: PathBuf,
        #[source]
        source: stela_format::CodecError,
    },
    /// A backing data file could not be opened, written, cut, fallocated, removed or synced.
    #[error("{op} data file {ino}: {source}")]
    DataFile {
        op: FileOp,
        ino: u64,
        #[source]
        source: std::io::Error,
    },
    #[error("fsync of the data directory: {0}")]
    DataDir(#[source] std::io::Error),
    #[error("writing the snapshot: {0}")]
    Snapshot(#[source] std::io::Error),
    /// A record that does not fit the materialiser's tree.
    #[error("log record {lsn}: {source}")]
    Record {
        lsn: u64,
        #[source]
        source: Inconsistent,
    },
}

/// What the materialiser asked of the daemon's log when it failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogOp {
    Positions,
    Read,
    LogCheckpoint,
    Truncate,
}

impl std::fmt::Display for LogOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LogOp::Positions => "log positions",
            LogOp::Read => "reading the log",
            LogOp::LogCheckpoint => "logging the checkpoint",
            LogOp::Truncate => "truncating the log",
        })
    }
}

/// What the materialiser did to a backing data file when it failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileOp {
    Open,
    Write,
    Truncate,
    Fallocate,
    Remove,
    Sync,
}

impl std::fmt::Display for FileOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FileOp::Open => "opening",
            FileOp::Write => "writing",
            FileOp::Truncate => "truncating",
            FileOp::Fallocate => "fallocate on",
            FileOp::Remove => "removing",
            FileOp::Sync => "fsync of",
        })
    }
}

impl MaterialiseError {
    fn log(op: LogOp) -> impl FnOnce(stela_client::Error) -> MaterialiseError {
        move |source| MaterialiseError::Log {
            op,
            source: Box::new(source),
        }
    }

    fn data_file(op: FileOp, ino: u64) -> impl FnOnce(std::io::Error) -> MaterialiseError {
        move |source| MaterialiseError::DataFile { op, ino, source }
    }
}

/// Where the materialiser's records come from and where its progress goes.
pub trait Source: Send {
    /// The next records after `after` (at most `max`, in log order) that may be applied: ones
    /// the log can no longer lose.
    fn next_batch(
        &mut self,
        after: u64,
        max: usize,
    ) -> Result<Vec<(u64, FsRecord)>, MaterialiseError>;
    /// Every record up to `applied` is durable in the backing directory (and its snapshot).
    fn checkpointed(&mut self, applied: u64) -> Result<(), MaterialiseError>;
}

/// The mount's own log in the daemon (the primary's): applies what is durable at the mount's
/// level, logs each checkpoint and truncates the log below it.
pub struct DaemonLog {
    log: Wal<FsRecord>,
    /// The mount's level: at `replicated` or `all`, records are applied only once the standby
    /// holds them.
    level: Durability,
    /// The log's name in the daemon (its entry in the daemon's replication status).
    name: String,
    /// The daemon, asked what its standby holds before the log is truncated.
    address: Address,
}

impl DaemonLog {
    pub fn new(log: Wal<FsRecord>, level: Durability, name: &str, address: Address) -> DaemonLog {
        DaemonLog {
            log,
            level,
            name: name.to_owned(),
            address,
        }
    }

    /// The last LSN of this log the daemon's standby holds on its disk, when the daemon ships
    /// to a standby (`Some(0)` while the standby has none of it or is away since this daemon
    /// was promoted); `None` without a standby. An error (the status cannot be asked) counts
    /// as "holds nothing": truncation waits for the next checkpoint.
    fn standby_holds(&self) -> Option<u64> {
        let report = Connection::connect_admin(&self.address)
            .and_then(|mut connection| connection.request(RequestBody::Status));
        let report = match report {
            Ok(ResponseBody::Status(report)) => report,
            Ok(other) => {
                tracing::warn!("stela mount: unexpected answer to a status request: {other:?}");
                return Some(0);
            }
            Err(e) => {
                tracing::warn!("stela mount: asking the daemon what its standby holds: {e}");
                return Some(0);
            }
        };
        let replication = report.replication?;
        let name = &self.name;
        Some(
            replication
                .logs
                .iter()
                .find(|log| &log.log == name)
                .map_or(0, |log| log.durable_lsn),
        )
    }
}

impl Source for DaemonLog {
    fn next_batch(
        &mut self,
        after: u64,
        max: usize,
    ) -> Result<Vec<(u64, FsRecord)>, MaterialiseError> {
        let durable = self
            .log
            .positions()
            .map_err(MaterialiseError::log(LogOp::Positions))?
            .durable_lsn;
        if durable <= after {
            return Ok(Vec::new());
        }
        // Under a standby, only what the standby holds is applied, so a node that fails over
        // never has files ahead of its log. (Waits while the standby is away, by the
        // daemon's policy; the mount's writes then wait at the overlay cap.)
        // A primary without a standby answers `Unprotected`: nothing is applied until one
        // holds the records (the next round asks again).
        if matches!(self.level, Durability::Replicated | Durability::All) {
            match self.log.commit_at(Lsn::new(durable), self.level) {
                Ok(()) => {}
                Err(stela_client::Error::Unprotected { .. }) => return Ok(Vec::new()),
                Err(source) => {
                    return Err(MaterialiseError::Standby {
                        lsn: durable,
                        source: Box::new(source),
                    })
                }
            }
        }
        let mut batch = Vec::new();
        for item in self
            .log
            .iter_from(Lsn::new(after + 1))
            .map_err(MaterialiseError::log(LogOp::Read))?
        {
            let (lsn, record) = item.map_err(MaterialiseError::log(LogOp::Read))?;
            if lsn.get() > durable || batch.len() >= max {
                break;
            }
            batch.push((lsn.get(), record));
        }
        Ok(batch)
    }

    fn checkpointed(&mut self, applied: u64) -> Result<(), MaterialiseError> {
        self.log
            .append(&FsRecord::Checkpoint { applied })
            .map_err(MaterialiseError::log(LogOp::LogCheckpoint))?;
        let keep_from = match self.standby_holds() {
            Some(held) => applied.min(held) + 1,
            None => applied + 1,
        };
        self.log
            .truncate_before(Lsn::new(keep_from))
            .map_err(MaterialiseError::log(LogOp::Truncate))?;
        Ok(())
    }
}

pub struct Materialiser<S: Source> {
    source: S,
    backing: Arc<Backing>,
    tree: Tree,
    files: HashMap<u64, File>,
    /// Files written since the last checkpoint (to fsync before it).
    touched: HashSet<u64>,
    /// A data file was created or removed since the last checkpoint (the data directory
    /// needs an fsync too).
    names_changed: bool,
    /// The last LSN whose checkpoint is in the backing snapshot.
    checkpointed: u64,
    /// The last LSN applied whose effects a checkpoint must cover (the materialiser's own
    /// checkpoint records need none).
    unsaved: u64,
    last_checkpoint: Instant,
    /// File data applied since the last checkpoint.
    applied_bytes: u64,
}

impl<S: Source> Materialiser<S> {
    pub fn new(source: S, backing: Arc<Backing>, tree: Tree) -> Materialiser<S> {
        let checkpointed = tree.applied;
        Materialiser {
            source,
            backing,
            tree,
            files: HashMap::new(),
            touched: HashSet::new(),
            names_changed: false,
            checkpointed,
            unsaved: checkpointed,
            last_checkpoint: Instant::now(),
            applied_bytes: 0,
        }
    }

    /// Runs until `stop` is set (then applies and checkpoints what is durable, and returns),
    /// or until a step fails (returns the error). `progress` is told each checkpoint's LSN.
    pub fn run(
        mut self,
        stop: &AtomicBool,
        progress: &dyn Fn(u64),
    ) -> Result<(), MaterialiseError> {
        loop {
            let stopping = stop.load(Ordering::Acquire);
            let applied = self.step()?;
            // Stopping: everything durable is applied first (as many reads as it takes).
            let stopping = stopping && applied < BATCH;
            let due = stopping
                || self.last_checkpoint.elapsed() >= CHECKPOINT_EVERY
                || self.applied_bytes >= CHECKPOINT_BYTES;
            if self.unsaved > self.checkpointed && due {
                self.checkpoint()?;
                progress(self.checkpointed);
            }
            if stopping {
                return Ok(());
            }
            if applied < BATCH {
                std::thread::sleep(PACE);
            }
        }
    }

    /// Applies the source's next records after the tree's point (one batch); returns how many.
    fn step(&mut self) -> Result<usize, MaterialiseError> {
        let batch = self.source.next_batch(self.tree.applied, BATCH)?;
        let applied = batch.len();
        for (lsn, record) in batch {
            self.apply(lsn, &record)?;
            if !matches!(record, FsRecord::Checkpoint { .. }) {
                self.unsaved = lsn;
            }
        }
        Ok(applied)
    }

    fn file(&mut self, ino: u64) -> Result<&File, MaterialiseError> {
        if !self.files.contains_key(&ino) {
            let file = self
                .backing
                .open_for_write(ino)
                .map_err(MaterialiseError::data_file(FileOp::Open, ino))?;
            self.files.insert(ino, file);
        }
        Ok(&self.files[&ino])
    }

    fn apply(&mut self, lsn: u64, record: &FsRecord) -> Result<(), MaterialiseError> {
        if lsn <= self.tree.applied {
            return Ok(());
        }
        match record {
            FsRecord::Make {
                ino,
                kind: Kind::File,
                ..
            } => {
                self.file(*ino)?;
                self.names_changed = true;
            }
            FsRecord::Write {
                ino, offset, data, ..
            } => {
                self.file(*ino)?
                    .write_all_at(data, *offset)
                    .map_err(MaterialiseError::data_file(FileOp::Write, *ino))?;
                self.touched.insert(*ino);
                self.applied_bytes += data.len() as u64;
            }
            FsRecord::SetAttr {
                ino,
                size: Some(size),
                ..
            } => {
                self.file(*ino)?
                    .set_len(*size)
                    .map_err(MaterialiseError::data_file(FileOp::Truncate, *ino))?;
                self.touched.insert(*ino);
            }
            FsRecord::Fallocate {
                ino,
                offset,
                length,
                mode,
                ..
            } => {
                let file = self.file(*ino)?;
                fallocate(file, *mode, *offset, *length)
                    .map_err(MaterialiseError::data_file(FileOp::Fallocate, *ino))?;
                self.touched.insert(*ino);
            }
            FsRecord::Drop { ino } => {
                self.files.remove(ino);
                self.touched.remove(ino);
                self.backing.forget(*ino);
                match std::fs::remove_file(self.backing.data_path(*ino)) {
                    Ok(()) => self.names_changed = true,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(MaterialiseError::data_file(FileOp::Remove, *ino)(e)),
                }
            }
            _ => {}
        }
        self.tree
            .apply(lsn, record)
            .map_err(|source| MaterialiseError::Record { lsn, source })
    }

    /// Makes everything applied durable in the backing directory and its snapshot, then tells
    /// the source.
    fn checkpoint(&mut self) -> Result<(), MaterialiseError> {
        for ino in self.touched.drain() {
            if let Some(file) = self.files.get(&ino) {
                file.sync_data()
                    .map_err(MaterialiseError::data_file(FileOp::Sync, ino))?;
            }
        }
        if self.names_changed {
            sync_dir(&self.backing.data_dir()).map_err(MaterialiseError::DataDir)?;
            self.names_changed = false;
        }
        // Descriptors of files not written lately are closed, so a long-lived mount does not
        // hold one per file it ever wrote.
        if self.files.len() > 256 {
            self.files.clear();
        }
        self.backing
            .save_snapshot(&self.tree)
            .map_err(MaterialiseError::Snapshot)?;
        let applied = self.tree.applied;
        self.checkpointed = applied;
        self.last_checkpoint = Instant::now();
        self.applied_bytes = 0;
        self.source.checkpointed(applied)
    }
}

/// fallocate(2) on a backing file with the logged mode; a file system that cannot punch holes
/// gets zeros written instead (the contents are what the mount promised either way).
fn fallocate(file: &File, mode: i32, offset: u64, length: u64) -> std::io::Result<()> {
    // SAFETY: fallocate reads no memory of ours; the descriptor is open for the call's length.
    let rc = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            mode,
            offset as libc::off_t,
            length as libc::off_t,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let error = std::io::Error::last_os_error();
    if error.raw_os_error() != Some(libc::EOPNOTSUPP) || !falloc::zeroes(mode) {
        return Err(error);
    }
    let size = file.metadata()?.len();
    let end = if mode & falloc::KEEP_SIZE != 0 {
        (offset + length).min(size)
    } else {
        offset + length
    };
    let zeros = vec![0u8; 1 << 16];
    let mut at = offset;
    while at < end {
        let n = (end - at).min(zeros.len() as u64) as usize;
        file.write_all_at(&zeros[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The typed errors read as the messages the materialiser logged before they were typed
    /// (the mount reports them, and an operator searches for them).
    #[test]
    fn a_stop_names_what_failed_and_on_which_file() {
        let io = || std::io::Error::from_raw_os_error(libc::EIO);
        let cases = [
            (
                MaterialiseError::data_file(FileOp::Sync, 7)(io()),
                "fsync of data file 7: ",
            ),
            (
                MaterialiseError::data_file(FileOp::Fallocate, 9)(io()),
                "fallocate on data file 9: ",
            ),
            (
                MaterialiseError::DataDir(io()),
                "fsync of the data directory: ",
            ),
            (
                MaterialiseError::log(LogOp::LogCheckpoint)(stela_client::Error::Io(io())),
                "logging the checkpoint: talking to the daemon: ",
            ),
            (
                MaterialiseError::SyncCopy {
                    segment: PathBuf::from("/d/logs/m/00000001.seg"),
                    source: io(),
                },
                "fdatasync of /d/logs/m/00000001.seg: ",
            ),
        ];
        for (error, starts) in cases {
            let text = error.to_string();
            assert!(
                text.starts_with(starts),
                "{text:?} does not start {starts:?}"
            );
        }
    }
}
