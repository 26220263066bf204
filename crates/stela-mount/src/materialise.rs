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
use crate::tree::Tree;
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
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

/// Where the materialiser's records come from and where its progress goes.
pub trait Source: Send {
    /// The next records after `after` (at most `max`, in log order) that may be applied: ones
    /// the log can no longer lose.
    fn next_batch(&mut self, after: u64, max: usize) -> Result<Vec<(u64, FsRecord)>, String>;
    /// Every record up to `applied` is durable in the backing directory (and its snapshot).
    fn checkpointed(&mut self, applied: u64) -> Result<(), String>;
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
    fn next_batch(&mut self, after: u64, max: usize) -> Result<Vec<(u64, FsRecord)>, String> {
        let durable = self
            .log
            .positions()
            .map_err(|e| format!("log positions: {e}"))?
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
                Err(e) => {
                    return Err(format!(
                        "waiting for the standby to hold LSN {durable}: {e}"
                    ))
                }
            }
        }
        let mut batch = Vec::new();
        for item in self
            .log
            .iter_from(Lsn::new(after + 1))
            .map_err(|e| format!("reading the log: {e}"))?
        {
            let (lsn, record) = item.map_err(|e| format!("reading the log: {e}"))?;
            if lsn.get() > durable || batch.len() >= max {
                break;
            }
            batch.push((lsn.get(), record));
        }
        Ok(batch)
    }

    fn checkpointed(&mut self, applied: u64) -> Result<(), String> {
        self.log
            .append(&FsRecord::Checkpoint { applied })
            .map_err(|e| format!("logging the checkpoint: {e}"))?;
        let keep_from = match self.standby_holds() {
            Some(held) => applied.min(held) + 1,
            None => applied + 1,
        };
        self.log
            .truncate_before(Lsn::new(keep_from))
            .map_err(|e| format!("truncating the log: {e}"))?;
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
    pub fn run(mut self, stop: &AtomicBool, progress: &dyn Fn(u64)) -> Result<(), String> {
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
    fn step(&mut self) -> Result<usize, String> {
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

    fn file(&mut self, ino: u64) -> Result<&File, String> {
        if !self.files.contains_key(&ino) {
            let file = self
                .backing
                .open_for_write(ino)
                .map_err(|e| format!("opening data file {ino}: {e}"))?;
            self.files.insert(ino, file);
        }
        Ok(&self.files[&ino])
    }

    fn apply(&mut self, lsn: u64, record: &FsRecord) -> Result<(), String> {
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
                    .map_err(|e| format!("writing data file {ino}: {e}"))?;
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
                    .map_err(|e| format!("truncating data file {ino}: {e}"))?;
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
                    .map_err(|e| format!("fallocate on data file {ino}: {e}"))?;
                self.touched.insert(*ino);
            }
            FsRecord::Drop { ino } => {
                self.files.remove(ino);
                self.touched.remove(ino);
                self.backing.forget(*ino);
                match std::fs::remove_file(self.backing.data_path(*ino)) {
                    Ok(()) => self.names_changed = true,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(format!("removing data file {ino}: {e}")),
                }
            }
            _ => {}
        }
        self.tree
            .apply(lsn, record)
            .map_err(|e| format!("log record {lsn}: {e}"))
    }

    /// Makes everything applied durable in the backing directory and its snapshot, then tells
    /// the source.
    fn checkpoint(&mut self) -> Result<(), String> {
        for ino in self.touched.drain() {
            if let Some(file) = self.files.get(&ino) {
                file.sync_data()
                    .map_err(|e| format!("fsync of data file {ino}: {e}"))?;
            }
        }
        if self.names_changed {
            sync_dir(&self.backing.data_dir())
                .map_err(|e| format!("fsync of the data directory: {e}"))?;
            self.names_changed = false;
        }
        // Descriptors of files not written lately are closed, so a long-lived mount does not
        // hold one per file it ever wrote.
        if self.files.len() > 256 {
            self.files.clear();
        }
        self.backing
            .save_snapshot(&self.tree)
            .map_err(|e| format!("writing the snapshot: {e}"))?;
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
