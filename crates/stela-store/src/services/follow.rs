//! The warm standby store: a [`Follower`] keeps a directory of its own (page file and master
//! record, the layout `Store` opens) current by replaying a standby daemon's copy of
//! the store's log (`DIR/logs/NAME`, mirrored byte for byte from the primary) onto its page
//! images, with the decoupled cleaner's replay (`cleaner::Replay`, the same `redo`). After a
//! promotion, `Store::open_on_daemon` on that directory and the promoted daemon
//! analyses from the last checkpoint the follower passed and redoes only what it had not
//! applied: the pages are current and the (instant) restart short.
//!
//! Owns: the directory's page file and master record while it runs, and its progress file,
//! `dir/follower` (the LSN `L` it has applied up to, with a CRC). It reads the mirrored log's
//! files read only, without a lock (the standby daemon writes them), and never writes a log.
//!
//! Invariants:
//! - **Progress says `L` ⇒ the synced images hold every change up to `L`** (the decoupled
//!   cleaner's clean-LSN invariant). A round replays every record after `L` up to its end `L'`
//!   onto the images, writes them, fdatasyncs the page file, and only then replaces the progress
//!   file (written to a new file, synced, renamed over, directory synced). A kill anywhere leaves
//!   the old `L` with images at least that new; the page file never lets an image go back in
//!   time, and redo skips what an image already has, so the next round just replays again.
//! - **The master record names a checkpoint that ends at or below `L`.** It is rewritten only
//!   after the progress file that covers the checkpoint's end is durable, so restart's analysis
//!   never starts past what the images hold (pages the checkpoint's tables call clean were
//!   clean on the primary's disk, not necessarily here). With `L` and that checkpoint, restart
//!   (`recovery`) ignores the primary's `PagesWritten` records above `L` and redoes from `L`.
//! - **Only what the current primary agrees with, and the standby's disk holds, is applied**
//!   (as `stela_mount::follow` does for the file system): records up to the LSN the standby
//!   daemon reports durable for the log while the primary's stream is connected, or every
//!   record once the daemon is the primary. A returning old primary may hold records at the end
//!   of its copy that its new primary never had; they are cut when the stream connects, and an
//!   image carrying one would be ahead of the history. The segment files read are fdatasynced
//!   before anything read from them is applied.
//! - **Never a gap.** Records are applied in log order from `L + 1`; a log that no longer holds
//!   `L + 1` (truncated past it) is [`Error::Follow`], and so is a read that skips an LSN. The
//!   standby daemon follows the primary's truncation of its copy, but never past a follower's
//!   hold (`stela_wal::holds`): the follower holds the copy from the master record's begin
//!   record (or the end record of its chain's full checkpoint, for a delta: restart reads from
//!   there), or `L + 1` if that is lower, when it opens and after each round, which is all a
//!   store opened on the directory after a promotion reads (analysis from that begin record,
//!   redo from `L + 1`, and the undo of transactions that were running, which the primary's
//!   own truncation kept). So this happens only to a directory pointed at another log, or a
//!   log truncated by hand.
//! - **One writer of the directory.** The follower must stop before a store opens the directory
//!   (after a promotion). It refuses a directory that has a master record or pages but no
//!   progress file: that is a store's directory, whose images it cannot vouch for.

use crate::access::pagefile::PageFile;
use crate::error::{Error, Result};
use crate::format::{LogBody, LogRecord, RecordError};
use crate::recovery::master::{Master, MasterSlots, Sealed};
use crate::services::cleaner::Replay;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use stela_client::{Address, Connection};
use stela_format::Lsn;
use stela_proto::{RequestBody, ResponseBody};
use stela_wal::storage::{OpenMode, StdStorage, Storage};
use stela_wal::ReadPoint;

// The progress file, `dir/follower`, 12 bytes, little-endian:
//   0   8   L: every change up to this LSN is in the synced page images
//   8   4   CRC32C of bytes 0..8
const PROGRESS_FILE: &str = "follower";
const PROGRESS_LEN: usize = 12;

/// Most records one round reads and replays.
const ROUND_RECORDS: usize = 50_000;

/// How far a follower may apply.
#[derive(Clone, Debug)]
pub enum Agreement {
    /// Up to what the standby daemon at this address holds durably of the log while the
    /// primary's stream is connected; everything once it is the primary. Nothing while it
    /// cannot be asked.
    StandbyDaemon(Address),
    /// Every complete record in the log's files: the log is the history (no writer will cut
    /// its end: a primary's own log, or a copy no longer written).
    WholeLog,
}

/// What one round applied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FollowReport {
    /// Records replayed onto the images this round.
    pub replayed: u64,
    /// Page images written this round.
    pub written: u64,
    /// Every change up to this LSN is in the synced images (after the round).
    pub applied: Lsn,
    /// The begin record of the checkpoint the master record names (after the round).
    pub checkpoint: Option<Lsn>,
}

/// A standby node's store directory kept current from the standby daemon's mirrored log. See
/// the module documentation.
pub struct Follower {
    dir: PathBuf,
    log_dir: PathBuf,
    /// The log's name in the daemon: the mirrored directory's name.
    log_name: String,
    agreement: Agreement,
    storage: Arc<dyn Storage>,
    file: PageFile,
    /// Images with every change up to `applied` (or newer), kept between rounds.
    cache: crate::services::image_cache::ImageCache,
    applied: Lsn,
    /// The master record's slots; the newest names the last checkpoint passed.
    master: MasterSlots,
    /// Where the last read stopped, so the next one does not re-read its segment.
    point: Option<ReadPoint>,
    round_records: usize,
    /// The hold last recorded on the standby's copy (see [`Follower::hold`]).
    held: Option<Lsn>,
}

impl Follower {
    /// Opens (or creates) the follower's directory `dir`, to follow the log whose files are in
    /// `log_dir` (a standby daemon's `DIR/logs/NAME`), applying as far as `agreement` allows.
    ///
    /// # Errors
    /// [`Error::Follow`] when `dir` is a store's directory rather than a follower's; I/O errors.
    pub fn open(
        dir: impl AsRef<Path>,
        log_dir: impl AsRef<Path>,
        agreement: Agreement,
    ) -> Result<Follower> {
        Follower::open_on(dir, log_dir, agreement, Arc::new(StdStorage))
    }

    /// As [`Follower::open`], with the directory and the log on `storage` (the fault-injecting
    /// storage of `stela_wal`'s `testing` feature cuts the power under both alike).
    ///
    /// # Errors
    /// As [`Follower::open`].
    pub fn open_on(
        dir: impl AsRef<Path>,
        log_dir: impl AsRef<Path>,
        agreement: Agreement,
        storage: Arc<dyn Storage>,
    ) -> Result<Follower> {
        let (dir, log_dir) = (dir.as_ref(), log_dir.as_ref());
        storage.create_dir_all(dir)?;
        let applied = read_progress(storage.as_ref(), dir)?;
        let (master_slots, master) = MasterSlots::open(storage.as_ref(), dir)?;
        let file = crate::access::pagefile::open_in(storage.as_ref(), dir)?;
        let applied = match applied {
            Some(applied) => applied,
            None if master.is_none() && file.len()? == 0 => {
                // From now on the directory is a follower's: a store opened on it before
                // anything is applied redoes the whole log, ignoring the `PagesWritten` records
                // about the primary's page file (which would otherwise pass for this one's).
                write_progress(storage.as_ref(), dir, Lsn::ZERO)?;
                Lsn::ZERO
            }
            None => {
                return Err(Error::Follow(format!(
                    "{} holds a store but no follower progress: a follower starts from an empty \
                     directory or its own",
                    dir.display()
                )))
            }
        };
        if let Some(master) = master {
            if master.end > applied {
                return Err(Error::Follow(format!(
                    "{}: the master record names a checkpoint ending at {} past the follower's \
                     progress {applied}: not a follower's directory",
                    dir.display(),
                    master.end
                )));
            }
        }
        let mut follower = Follower {
            dir: dir.to_path_buf(),
            log_dir: log_dir.to_path_buf(),
            log_name: log_dir
                .file_name()
                .map(|name| name.to_string_lossy().into_owned())
                .unwrap_or_default(),
            agreement,
            storage,
            file: PageFile::new(file, true),
            cache: crate::services::image_cache::ImageCache::default(),
            applied,
            master: master_slots,
            point: None,
            round_records: ROUND_RECORDS,
            held: None,
        };
        follower.hold()?;
        Ok(follower)
    }

    /// Holds the standby's copy from the first record a store opened on this directory would
    /// read (see the module's invariants); written only when that moves, which is seldom: it
    /// is the master record's begin record while a checkpoint has been passed.
    fn hold(&mut self) -> Result<()> {
        let first_needed = self.master.newest().map_or(self.applied.next(), |m| {
            m.begin.min(m.root).min(self.applied.next())
        });
        if self.held == Some(first_needed) {
            return Ok(());
        }
        stela_wal::holds::record(
            self.storage.as_ref(),
            &self.log_dir,
            &self.dir,
            first_needed,
        )
        .map_err(|e| {
            Error::Follow(format!(
                "recording the hold on {} for {}: {e}",
                self.log_dir.display(),
                self.dir.display()
            ))
        })?;
        self.held = Some(first_needed);
        Ok(())
    }

    /// Reads and replays at most `records` records per round (at least one).
    pub fn round_records(mut self, records: usize) -> Follower {
        self.round_records = records.max(1);
        self
    }

    /// Every change up to this LSN is in the synced page images.
    pub fn applied(&self) -> Lsn {
        self.applied
    }

    /// One round: reads what may be applied after the progress (at most a batch), replays it
    /// onto the images, syncs them, records the progress and the newest checkpoint passed.
    ///
    /// # Errors
    /// [`Error::Follow`] when the log no longer reaches back to the progress or skips an LSN;
    /// [`Error::BadLogRecord`] for a record that is not the store's; I/O and log errors.
    pub fn step(&mut self) -> Result<FollowReport> {
        let mut report = FollowReport {
            applied: self.applied,
            checkpoint: self.master.newest().map(|m| m.begin),
            ..FollowReport::default()
        };
        let agreed = self.agreed_lsn();
        if agreed <= self.applied {
            return Ok(report);
        }
        let from = self.applied.next();
        let max = (agreed.get() - self.applied.get()).min(self.round_records as u64) as usize;
        let available = match stela_wal::tools::read_available(
            &self.log_dir,
            Arc::clone(&self.storage),
            from,
            max,
            self.point.take(),
        ) {
            Ok(available) => available,
            // Nothing shipped yet (the directory appears with the log's first segment).
            Err(stela_wal::Error::NotALog { .. }) if self.applied == Lsn::ZERO => {
                return Ok(report)
            }
            Err(stela_wal::Error::Truncated { lsn, first }) => {
                return Err(Error::Follow(format!(
                    "{} starts at {first}, but {} needs every record from {lsn} on: the log \
                     was truncated past the follower's progress (follow into an empty directory)",
                    self.log_dir.display(),
                    self.dir.display()
                )))
            }
            Err(e) => return Err(e.into()),
        };
        if available.records.is_empty() {
            self.point = available.next;
            return Ok(report);
        }
        // The standby daemon writes behind its acknowledgements: make the records durable here
        // before an image that carries one is written.
        for segment in &available.segments {
            self.storage
                .open(segment, OpenMode::Read)
                .and_then(|file| file.sync_data())?;
        }
        let mut replay = Replay::new(&self.file, self.applied, &mut self.cache, None);
        let mut expected = from;
        let mut checkpoint = self.master.newest();
        for (lsn, payload) in &available.records {
            if *lsn != expected {
                return Err(Error::Follow(format!(
                    "{}: expected record {expected}, read {lsn}: the log has a gap",
                    self.log_dir.display()
                )));
            }
            let record = decode_record(available.codec, *lsn, payload)?;
            replay.apply(*lsn, &record)?;
            checkpoint = checkpoint_ended_by(*lsn, &record).or(checkpoint);
            expected = expected.next();
        }
        let to = Lsn::new(expected.get() - 1);
        let round = replay.write()?;
        self.file.sync_unlogged()?;
        write_progress(self.storage.as_ref(), &self.dir, to)?;
        self.applied = to;
        self.point = available.next;
        if checkpoint != self.master.newest() {
            if let Some(master) = checkpoint {
                // After the progress that covers its end is durable (see the invariants).
                self.master.write(self.storage.as_ref(), master)?;
            }
        }
        self.hold()?;
        report.replayed = round.replayed;
        report.written = round.written;
        report.applied = to;
        report.checkpoint = self.master.newest().map(|m| m.begin);
        Ok(report)
    }

    /// Rounds until `stop` is set, pausing `idle` whenever there was nothing to apply; applies
    /// what it can once more before returning. `progress` is told each round's report.
    ///
    /// # Errors
    /// As [`Follower::step`]; the first error ends the run.
    pub fn run(
        &mut self,
        stop: &AtomicBool,
        idle: Duration,
        progress: &mut dyn FnMut(&FollowReport),
    ) -> Result<()> {
        loop {
            let stopping = stop.load(Ordering::Acquire);
            let report = self.step()?;
            progress(&report);
            if report.replayed == 0 {
                if stopping {
                    return Ok(());
                }
                std::thread::sleep(idle);
            }
        }
    }

    /// The last LSN that may be applied (see [`Agreement`]); zero when the daemon cannot be
    /// asked or its stream is down.
    fn agreed_lsn(&self) -> Lsn {
        let daemon = match &self.agreement {
            Agreement::WholeLog => return Lsn::new(u64::MAX),
            Agreement::StandbyDaemon(daemon) => daemon,
        };
        let status = Connection::connect_admin(daemon)
            .and_then(|mut connection| connection.request(RequestBody::Status));
        let Ok(ResponseBody::Status(status)) = status else {
            return Lsn::ZERO;
        };
        let Some(replication) = status.replication else {
            return Lsn::ZERO;
        };
        if replication.role == "primary" {
            return Lsn::new(u64::MAX);
        }
        replication
            .logs
            .iter()
            .find(|log| log.log == self.log_name && log.connected && log.stopped.is_none())
            .map_or(Lsn::ZERO, |log| Lsn::new(log.durable_lsn))
    }
}

/// The follower's progress in `dir`, if it has any.
///
/// # Errors
/// [`Error::Follow`] for a damaged progress file (it is written atomically, so damage is not a
/// crash's doing); I/O errors.
pub(crate) fn read_progress(storage: &dyn Storage, dir: &Path) -> Result<Option<Lsn>> {
    let path = dir.join(PROGRESS_FILE);
    let bytes = match crate::recovery::master::read_sealed(storage, &path, PROGRESS_LEN - 4)? {
        Sealed::Absent => return Ok(None),
        Sealed::Damaged => {
            return Err(Error::Follow(format!(
                "{} is damaged: the follower's progress is unknown",
                path.display()
            )))
        }
        Sealed::Intact(bytes) => bytes,
    };
    Ok(Some(Lsn::new(u64::from_le_bytes(
        bytes[..8].try_into().expect("8 bytes"),
    ))))
}

/// Replaces the progress file durably: a new file, synced, renamed over, the directory synced.
fn write_progress(storage: &dyn Storage, dir: &Path, applied: Lsn) -> Result<()> {
    let mut bytes = [0u8; PROGRESS_LEN];
    bytes[..8].copy_from_slice(&applied.get().to_le_bytes());
    let crc = crc32c::crc32c(&bytes[..8]);
    bytes[8..].copy_from_slice(&crc.to_le_bytes());
    let temporary = dir.join("follower.new");
    match storage.remove(&temporary) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
        _ => {}
    }
    let file = storage.open(&temporary, OpenMode::CreateNew)?;
    file.write_all_at(&bytes, 0)?;
    file.sync_data()?;
    storage.rename(&temporary, &dir.join(PROGRESS_FILE))?;
    storage.sync_dir(dir)?;
    Ok(())
}

/// A record of the followed log, decoded and checked as the store's.
fn decode_record(codec: stela_wal::Codec, lsn: Lsn, payload: &[u8]) -> Result<LogRecord> {
    let record: LogRecord = codec.decode(payload).map_err(|e| Error::BadLogRecord {
        lsn,
        source: RecordError::Decode(e.to_string()),
    })?;
    record
        .validate()
        .map_err(|source| Error::BadLogRecord { lsn, source })?;
    Ok(record)
}

/// The checkpoint the end record at `lsn` completes, if it is one.
fn checkpoint_ended_by(lsn: Lsn, record: &LogRecord) -> Option<Master> {
    match record.body {
        LogBody::CheckpointEnd { begin, .. } => Some(Master::full(begin, lsn)),
        LogBody::CheckpointDelta { begin, root, .. } => Some(Master {
            begin,
            end: lsn,
            root,
        }),
        _ => None,
    }
}
