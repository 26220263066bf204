//! A standby node's copy of the files: the materialiser run over the standby daemon's copy of
//! the mount's log (`DIR/logs/NAME`, which the daemon mirrors byte for byte from the primary),
//! into the standby node's own backing directory, with its progress in its own snapshot.
//!
//! After a promotion the node mounts that backing directory against its (now primary) daemon:
//! the mount replays only the records after the snapshot, so it starts in about the time of
//! a checkpoint interval's worth of records, not the whole history.
//!
//! Owns: reading the mirrored log's files (read only, no lock: the standby daemon writes
//! them). Invariants:
//! - **Only what the current primary agrees with, and the standby's disk holds, is applied.**
//!   A node that comes back as the standby (an old primary) may hold records at the end of its
//!   log that its new primary never had; reprotection cuts them when the primary's stream
//!   connects. So the follower applies a record only once the standby daemon reports the log's
//!   stream connected with the record durable (`durable_lsn` in its status: the stream is up
//!   only after the cut), or once the daemon is itself the primary (its log is then the
//!   history). It also fdatasyncs the segment files it read before applying from them.
//! - **Never ahead of the log, never behind its start.** The follower applies records in log
//!   order from its snapshot's LSN. The standby daemon follows the primary's truncation of its
//!   copy, but never past a follower's hold (`stela_wal::holds`): the follower holds the record
//!   after its snapshot before it reads anything, and moves the hold up after each checkpoint,
//!   so every record after the snapshot is there. A log that no longer reaches back to the
//!   snapshot, or ends below it, is an error, never a gap.
//! - **One writer of the backing directory.** The follower must stop (SIGTERM: it applies what
//!   is readable, checkpoints and exits) before the node mounts the same backing directory.

use crate::materialise::{MaterialiseError, Source};
use crate::record::FsRecord;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use stela_client::{Address, Connection};
use stela_proto::{RequestBody, ResponseBody};
use stela_wal::storage::{StdStorage, Storage};
use stela_wal::{Lsn, ReadPoint};

/// A standby daemon's copy of a mount's log, read from its segment files.
pub struct MirroredLog {
    dir: PathBuf,
    /// The log's name in the daemon (the directory's name).
    name: String,
    /// The standby daemon, asked how far its copy agrees with the primary.
    daemon: Address,
    /// The follower's backing directory, which names its hold on the copy.
    holder: PathBuf,
    storage: Arc<dyn Storage>,
    /// Where the last read stopped, so the next one does not re-read its segment.
    point: Option<ReadPoint>,
    /// Whether the log directory exists yet (the primary may not have shipped it).
    seen: bool,
}

impl MirroredLog {
    /// The log in `dir` (a standby's `DIR/logs/NAME`), of the daemon at `daemon`, read for the
    /// backing directory `holder`.
    pub fn new(dir: &Path, daemon: Address, holder: &Path) -> MirroredLog {
        MirroredLog {
            dir: dir.to_owned(),
            name: dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            daemon,
            holder: holder.to_owned(),
            storage: Arc::new(StdStorage),
            point: None,
            seen: false,
        }
    }

    /// Holds the copy from the record after `applied` on (see the module's invariants).
    pub fn hold(&self, applied: u64) -> Result<(), MaterialiseError> {
        stela_wal::holds::record(
            self.storage.as_ref(),
            &self.dir,
            &self.holder,
            Lsn::new(applied + 1),
        )
        .map(|_| ())
        .map_err(|source| MaterialiseError::Hold {
            dir: self.dir.clone(),
            holder: self.holder.clone(),
            source,
        })
    }
}

impl MirroredLog {
    /// The last LSN that may be applied: everything once the daemon is the primary; while it
    /// is the standby, what it holds durably of the log's stream while that is connected; 0
    /// (nothing) otherwise, or when the daemon cannot be asked.
    fn agreed_lsn(&self) -> u64 {
        let report = Connection::connect_admin(&self.daemon)
            .and_then(|mut connection| connection.request(RequestBody::Status));
        let Ok(ResponseBody::Status(report)) = report else {
            return 0;
        };
        let Some(replication) = report.replication else {
            return 0;
        };
        if replication.role == "primary" {
            return u64::MAX;
        }
        replication
            .logs
            .iter()
            .find(|log| log.log == self.name && log.connected && log.stopped.is_none())
            .map_or(0, |log| log.durable_lsn)
    }
}

impl Source for MirroredLog {
    fn next_batch(
        &mut self,
        after: u64,
        max: usize,
    ) -> Result<Vec<(u64, FsRecord)>, MaterialiseError> {
        let agreed = self.agreed_lsn();
        if agreed <= after {
            return Ok(Vec::new());
        }
        let max = (agreed - after).min(max as u64) as usize;
        let read = stela_wal::tools::read_available(
            &self.dir,
            Arc::clone(&self.storage),
            Lsn::new(after + 1),
            max,
            self.point.take(),
        );
        let available = match read {
            Ok(available) => available,
            // Nothing shipped yet: nothing to apply.
            Err(stela_wal::Error::NotALog { .. }) if !self.seen => return Ok(Vec::new()),
            Err(source) => {
                return Err(MaterialiseError::ReadCopy {
                    dir: self.dir.clone(),
                    source: Box::new(source),
                })
            }
        };
        self.seen = true;
        // The standby daemon writes behind its acknowledgements: the records are made durable
        // here before anything is applied from them.
        for segment in &available.segments {
            std::fs::File::open(segment)
                .and_then(|file| file.sync_data())
                .map_err(|source| MaterialiseError::SyncCopy {
                    segment: segment.clone(),
                    source,
                })?;
        }
        self.point = available.next;
        let codec = available.codec;
        available
            .records
            .into_iter()
            .map(|(lsn, payload)| {
                codec
                    .decode::<FsRecord>(&payload)
                    .map(|record| (lsn.get(), record))
                    .map_err(|source| MaterialiseError::DecodeCopy {
                        lsn: lsn.get(),
                        dir: self.dir.clone(),
                        source,
                    })
            })
            .collect()
    }

    fn checkpointed(&mut self, applied: u64) -> Result<(), MaterialiseError> {
        // The standby's copy is the primary's byte for byte: nothing is logged or truncated
        // here, only the hold moved up. (After a promotion the node's mount checkpoints and
        // truncates its own log.)
        self.hold(applied)
    }
}
