//! Checkpoints: the records that bound how much log restart must analyse, and the master
//! record that names the latest complete one.
//!
//! A checkpoint is a `CheckpointBegin` record, then a `CheckpointEnd` record carrying the
//! dirty-page, transaction and lock tables for the begin record, then (once the end is durable)
//! a master record naming both ([`MasterSlots`]). Restart trusts only what a master record
//! names, so a checkpoint cut short by a crash is simply not used. Two ways to get the tables,
//! chosen at open:
//! - classical: the store copies them from the buffer pool, the transaction table and the lock
//!   table under the engine latch (`Store::checkpoint`), after syncing the page file so that
//!   every page the pool holds clean is clean on disk too;
//! - decoupled ([`Decoupled`]): log analysis from where the previous checkpoint's analysis
//!   stopped to the new begin record, over tables kept in memory between checkpoints (the
//!   previous checkpoint's, so the log before it is never read again). It takes no latch.
//!
//! This module owns the master record's two files and the decoupled checkpoint's cached tables.
//! Invariants:
//! - Every intact master record names a begin and an end record that were durable when it was
//!   written, and the end record's tables are correct for analysis starting at that begin.
//! - The slot the log's truncation relies on ([`MasterSlots::pin`]) is durable and is not
//!   overwritten until the other slot, naming a newer checkpoint, has been made durable in its
//!   place; restart takes the intact slot naming the newest checkpoint, so whatever a crash
//!   does to the other slot, restart never starts before what the truncated log still holds.

use crate::analysis::Analysis;
use crate::error::{Error, Result};
use crate::format::{CheckpointKind, CheckpointTables, LogBody, LogRecord, SYSTEM_TXN};
use crate::log::LogDevice;
use crate::tail::{Consumer, LogTail};
use std::path::Path;
use stela_format::Lsn;
use stela_wal::storage::{OpenMode, Storage, StorageFile};

// A master record, 20 bytes, little-endian:
//   0   8   LSN of the checkpoint's begin record
//   8   8   LSN of its end record
//   16  4   CRC32C of bytes 0..16
// It is kept in two files ("slots"), each overwritten in place; the first keeps the name a
// single master file had, so a directory written before there were two still opens.
const SLOT_FILES: [&str; 2] = ["checkpoint", "checkpoint.1"];
const MASTER_LEN: usize = 20;
/// The temporary file of the single master file's replace-by-rename, removed if left behind.
const OLD_TEMPORARY: &str = "checkpoint.new";

/// The latest complete checkpoint: where restart's analysis starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Master {
    pub begin: Lsn,
    pub end: Lsn,
}

/// A small file holding a payload followed by its CRC32C, little-endian (the master record,
/// the standby follower's progress), as read.
pub(crate) enum Sealed {
    Absent,
    /// Of another length, or failing its checksum.
    Damaged,
    /// The payload.
    Intact(Vec<u8>),
}

/// Reads the sealed file at `path`, whose payload is `payload_len` bytes.
///
/// # Errors
/// I/O errors other than the file's absence.
pub(crate) fn read_sealed(
    storage: &dyn Storage,
    path: &Path,
    payload_len: usize,
) -> Result<Sealed> {
    let mut bytes = match storage
        .open(path, OpenMode::Read)
        .and_then(|file| file.read_to_vec())
    {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Sealed::Absent),
        Err(e) => return Err(e.into()),
    };
    let intact = bytes.len() == payload_len + 4
        && u32::from_le_bytes(bytes[payload_len..].try_into().expect("4 bytes"))
            == crc32c::crc32c(&bytes[..payload_len]);
    if !intact {
        return Ok(Sealed::Damaged);
    }
    bytes.truncate(payload_len);
    Ok(Sealed::Intact(bytes))
}

impl Master {
    /// The master record in `dir` that names the newest checkpoint, if a checkpoint was ever
    /// completed there and a record of it survived. Records are written without a sync (see
    /// [`MasterSlots`]), so after a machine crash the newest may be missing or damaged: then
    /// the other slot's, older, is used, and with neither there is no checkpoint to start from
    /// and restart analyses the whole log (which it refuses if the log no longer starts at its
    /// first record).
    ///
    /// # Errors
    /// I/O errors reading the slots.
    pub fn read(storage: &dyn Storage, dir: &Path) -> Result<Option<Master>> {
        Ok(read_slots(storage, dir)?.map(|(_, master)| master))
    }

    fn encode(&self) -> [u8; MASTER_LEN] {
        let mut bytes = [0u8; MASTER_LEN];
        bytes[..8].copy_from_slice(&self.begin.get().to_le_bytes());
        bytes[8..16].copy_from_slice(&self.end.get().to_le_bytes());
        let crc = crc32c::crc32c(&bytes[..16]);
        bytes[16..].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    fn decode(payload: &[u8]) -> Master {
        let at = |i: usize| Lsn::new(u64::from_le_bytes(payload[i..i + 8].try_into().expect("8")));
        Master {
            begin: at(0),
            end: at(8),
        }
    }
}

/// The intact slot naming the newest checkpoint, with its index.
fn read_slots(storage: &dyn Storage, dir: &Path) -> Result<Option<(usize, Master)>> {
    let mut newest: Option<(usize, Master)> = None;
    let mut damaged = Vec::new();
    for (slot, name) in SLOT_FILES.iter().enumerate() {
        let path = dir.join(name);
        match read_sealed(storage, &path, MASTER_LEN - 4)? {
            Sealed::Absent => {}
            Sealed::Damaged => damaged.push(path),
            Sealed::Intact(bytes) => {
                let master = Master::decode(&bytes);
                if newest
                    .is_none_or(|(_, other)| (master.begin, master.end) > (other.begin, other.end))
                {
                    newest = Some((slot, master));
                }
            }
        }
    }
    if newest.is_none() {
        for path in damaged {
            tracing::warn!(path = %path.display(), "damaged master record: analysing the whole log");
        }
    }
    Ok(newest)
}

/// The master record's two files ("slots") in one directory, and which of them the log's
/// truncation may rely on. A checkpoint's record is written in place into the other slot,
/// without a sync: a crash may lose or damage it, and restart then uses the relied-on one,
/// which names an older but complete checkpoint. Before the log is truncated, [`Self::pin`]
/// makes the newest record durable and relies on its slot from then on. Writing in place
/// spares each checkpoint a file creation, a rename and the old file's removal, which at
/// millisecond intervals cost more than the rest of a decoupled checkpoint.
///
/// Callers serialise every call (the store holds its checkpoint mutex).
pub(crate) struct MasterSlots {
    dir: std::path::PathBuf,
    /// The slot whose record the log's truncation may rely on. Never written to: records go
    /// to the other one.
    pinned: usize,
    /// Whether the pinned slot's record is known durable. At open it may not be (written
    /// without a sync before a clean stop or a process crash): it is synced before the first
    /// write to the other slot, rather than at open, where the sync would wait for the
    /// device's queue and delay restart.
    pinned_synced: bool,
    /// The newest record, and the slot holding it.
    newest: Option<(usize, Master)>,
    /// Each slot's file, once opened.
    files: [Option<Box<dyn StorageFile>>; 2],
    /// Whether the directory was synced since open and since a slot file was last created, so
    /// both slots' names are durable: a pin syncs the directory only when they may not be.
    names_synced: bool,
}

impl MasterSlots {
    /// Reads the slots in `dir` and pins the one naming the newest checkpoint (made durable
    /// before the other is first written); returns the slots and that checkpoint. Without an
    /// intact slot, records go to the first.
    ///
    /// # Errors
    /// I/O errors.
    pub fn open(storage: &dyn Storage, dir: &Path) -> Result<(MasterSlots, Option<Master>)> {
        match storage.remove(&dir.join(OLD_TEMPORARY)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
            _ => {}
        }
        let newest = read_slots(storage, dir)?;
        let slots = MasterSlots {
            dir: dir.to_path_buf(),
            pinned: newest.map_or(1, |(slot, _)| slot),
            pinned_synced: newest.is_none(),
            newest,
            files: [None, None],
            names_synced: false,
        };
        Ok((slots, newest.map(|(_, master)| master)))
    }

    /// The newest master record written or found at open.
    pub fn newest(&self) -> Option<Master> {
        self.newest.map(|(_, master)| master)
    }

    /// Writes `master`, whose end record is durable, over the slot not pinned. No sync: see
    /// the type's documentation.
    ///
    /// # Errors
    /// I/O errors.
    pub fn write(&mut self, storage: &dyn Storage, master: Master) -> Result<()> {
        if !self.pinned_synced {
            self.sync(storage, self.pinned)?;
            self.pinned_synced = true;
        }
        let slot = 1 - self.pinned;
        self.file(storage, slot)?
            .write_all_at(&master.encode(), 0)?;
        self.newest = Some((slot, master));
        Ok(())
    }

    /// Makes the newest record durable and pins its slot, so the log may be truncated behind
    /// the checkpoint it names (returned; `None` if there is none).
    ///
    /// # Errors
    /// I/O errors; the pinned slot is then unchanged.
    pub fn pin(&mut self, storage: &dyn Storage) -> Result<Option<Master>> {
        let Some((slot, master)) = self.newest else {
            return Ok(None);
        };
        if slot != self.pinned || !self.pinned_synced {
            self.sync(storage, slot)?;
            self.pinned = slot;
            self.pinned_synced = true;
        }
        Ok(Some(master))
    }

    /// Makes the slot's record durable, and its name if that may not be (it is new, or the
    /// directory was not synced since open).
    fn sync(&mut self, storage: &dyn Storage, slot: usize) -> Result<()> {
        self.file(storage, slot)?.sync_data()?;
        if !self.names_synced {
            storage.sync_dir(&self.dir)?;
            self.names_synced = true;
        }
        Ok(())
    }

    fn file(&mut self, storage: &dyn Storage, slot: usize) -> Result<&dyn StorageFile> {
        if self.files[slot].is_none() {
            let path = self.dir.join(SLOT_FILES[slot]);
            let file = match storage.open(&path, OpenMode::ReadWrite) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    self.names_synced = false;
                    storage.open(&path, OpenMode::CreateNew)?
                }
                opened => opened?,
            };
            // A slot of another length is damaged (an intact one is exactly a record long,
            // and the pinned slot is intact): cut it, or a record written over its start
            // would still read as damaged.
            if file.len()? > MASTER_LEN as u64 {
                file.set_len(MASTER_LEN as u64)?;
            }
            self.files[slot] = Some(file);
        }
        Ok(self.files[slot].as_deref().expect("opened above"))
    }
}

/// What one checkpoint recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointReport {
    pub kind: CheckpointKind,
    pub begin: Lsn,
    pub end: Lsn,
    pub tables: CheckpointTables,
    /// Log records the decoupled checkpoint analysed (0 for a classical one).
    pub records_analyzed: u64,
}

/// Appends a checkpoint's begin record.
pub(crate) fn begin(log: &dyn LogDevice) -> Result<Lsn> {
    log.append(&LogRecord {
        txn: SYSTEM_TXN,
        prev_txn_lsn: Lsn::ZERO,
        body: LogBody::CheckpointBegin,
    })
}

/// Appends the end record with `tables`, waits until it is durable, then writes a master
/// record naming the checkpoint.
pub(crate) fn end(
    log: &dyn LogDevice,
    storage: &dyn Storage,
    master: &mut MasterSlots,
    begin: Lsn,
    kind: CheckpointKind,
    tables: CheckpointTables,
    records_analyzed: u64,
) -> Result<CheckpointReport> {
    let record = LogRecord {
        txn: SYSTEM_TXN,
        prev_txn_lsn: Lsn::ZERO,
        body: LogBody::CheckpointEnd {
            begin,
            kind,
            tables,
        },
    };
    let end = log.append(&record)?;
    // The tables go on to the report: taken back from the record rather than copied (a few
    // thousand dirty pages at every checkpoint).
    let LogBody::CheckpointEnd { tables, .. } = record.body else {
        unreachable!("built as a checkpoint's end record above")
    };
    log.flush(end)?;
    master.write(storage, Master { begin, end })?;
    Ok(CheckpointReport {
        kind,
        begin,
        end,
        tables,
        records_analyzed,
    })
}

/// What a store's checkpoint mutex guards: the master record's slots, which checkpoints write
/// and the log's truncation pins, and the decoupled checkpoint's tables.
pub(crate) struct Checkpointer {
    pub master: MasterSlots,
    pub decoupled: Decoupled,
}

/// The decoupled checkpoint's state: analysis tables for every record up to
/// `analysis.applied_to`, carried from one checkpoint to the next (and, at open, from
/// restart's analysis).
pub(crate) struct Decoupled {
    pub analysis: Analysis,
}

impl Decoupled {
    /// The tables for the begin record at `begin`: analysis of the records after the last one
    /// analysed, up to and including `begin` (appended; it need not be durable yet).
    pub fn tables_at(&mut self, log: &LogTail, begin: Lsn) -> Result<(CheckpointTables, u64)> {
        let analysed = self.analyse_to(log, begin)?;
        if self.analysis.applied_to < begin {
            return Err(Error::BadLogRecord {
                lsn: begin,
                source: crate::format::RecordError::Invalid(
                    "the checkpoint's begin record could not be read back",
                ),
            });
        }
        Ok((self.analysis.tables(), analysed))
    }

    /// Analyses the records after the last one analysed, up to `to` or the last one the log
    /// holds now if that is sooner, and releases from the log tail every record analysed (also
    /// when reading fails part way); returns how many. Between checkpoints this keeps the
    /// analysis, and the tail it reads, close to the log's end, so the records of a long
    /// interval are not all held in memory until its checkpoint.
    pub fn analyse_to(&mut self, log: &LogTail, to: Lsn) -> Result<u64> {
        let analysed = self.apply_to(log, to);
        log.release(Consumer::Checkpoint, self.analysis.applied_to.next());
        analysed
    }

    fn apply_to(&mut self, log: &LogTail, to: Lsn) -> Result<u64> {
        let from = Lsn::new(self.analysis.applied_to.get() + 1);
        let mut analysed = 0;
        if from > to {
            return Ok(0);
        }
        // Applied in place: if reading fails half way, the tables are still those of every
        // record up to `applied_to`, and the next call continues from there.
        for item in log.records_from(from)? {
            let (lsn, record) = item?;
            if analysed == 0 && lsn != from {
                // The log was truncated past this analysis (it was not the store's kind).
                return Err(Error::BadLogRecord {
                    lsn: from,
                    source: crate::format::RecordError::Invalid(
                        "the log no longer holds the records after the last analysis",
                    ),
                });
            }
            if lsn > to {
                break;
            }
            self.analysis.apply(lsn, &record);
            analysed += 1;
        }
        Ok(analysed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stela_wal::storage::{CrashPlan, FaultStorage};

    fn master(n: u64) -> Master {
        Master {
            begin: Lsn::new(10 * n),
            end: Lsn::new(10 * n + 5),
        }
    }

    #[test]
    fn records_go_to_the_slot_not_pinned_and_restart_reads_the_newest_intact_one() {
        let dir = tempfile::tempdir().unwrap();
        let storage = stela_wal::storage::StdStorage;
        let (mut slots, found) = MasterSlots::open(&storage, dir.path()).unwrap();
        assert_eq!(found, None);
        slots.write(&storage, master(1)).unwrap();
        assert_eq!(slots.pin(&storage).unwrap(), Some(master(1)));
        slots.write(&storage, master(2)).unwrap();
        slots.write(&storage, master(3)).unwrap();
        assert_eq!(Master::read(&storage, dir.path()).unwrap(), Some(master(3)));
        // The pinned slot still holds the record the truncation relied on.
        let pinned = dir.path().join(SLOT_FILES[0]);
        let unpinned = dir.path().join(SLOT_FILES[1]);
        assert_eq!(
            &std::fs::read(&pinned).unwrap()[..],
            &master(1).encode()[..]
        );
        // A damaged newest record: restart falls back to the pinned one.
        std::fs::write(&unpinned, [0xa5; 100]).unwrap();
        assert_eq!(Master::read(&storage, dir.path()).unwrap(), Some(master(1)));
        // Reopening pins what it found, and writes go to the other slot.
        let (mut slots, found) = MasterSlots::open(&storage, dir.path()).unwrap();
        assert_eq!(found, Some(master(1)));
        slots.write(&storage, master(4)).unwrap();
        assert_eq!(
            &std::fs::read(&pinned).unwrap()[..],
            &master(1).encode()[..]
        );
        assert_eq!(Master::read(&storage, dir.path()).unwrap(), Some(master(4)));
        // A single master file (as written before there were two slots) is read as the first.
        std::fs::remove_file(&unpinned).unwrap();
        assert_eq!(Master::read(&storage, dir.path()).unwrap(), Some(master(1)));
    }

    /// Whatever a power cut keeps of unsynced slot writes, restart reads a record that was
    /// written, never one older than the last pinned (which the log may be truncated behind).
    #[test]
    fn after_a_power_cut_restart_reads_a_written_record_no_older_than_the_pinned_one() {
        let dir = Path::new("/store");
        for seed in 0..200u64 {
            let storage = FaultStorage::new();
            storage.create_dir_all(dir).unwrap();
            storage.sync_dir(Path::new("/")).unwrap();
            let (mut slots, _) = MasterSlots::open(&storage, dir).unwrap();
            let mut pinned = None;
            // A seeded run of writes and pins, then the cut.
            let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            let mut written = 0;
            for _ in 0..1 + seed % 16 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                match state % 5 {
                    0 => pinned = slots.pin(&storage).unwrap(),
                    // A process restart, without a crash: the newest record, perhaps unsynced,
                    // is pinned, and must be made durable before the truncation relies on it
                    // or the other slot is overwritten.
                    1 => slots = MasterSlots::open(&storage, dir).unwrap().0,
                    _ => {
                        written += 1;
                        slots.write(&storage, master(written)).unwrap();
                    }
                }
            }
            let plan = match seed % 3 {
                0 => CrashPlan::LoseUnsynced,
                1 => CrashPlan::TearUnsynced { seed },
                _ => CrashPlan::ScrambleSectors { seed },
            };
            storage.crash(plan);
            let found = Master::read(&storage, dir).unwrap();
            if let Some(pinned) = pinned {
                let found = found.unwrap_or_else(|| panic!("seed {seed}: no record survived"));
                assert!(
                    found.begin >= pinned.begin,
                    "seed {seed}: {found:?} < {pinned:?}"
                );
            }
            if let Some(found) = found {
                assert!(
                    (1..=written).any(|n| master(n) == found),
                    "seed {seed}: {found:?} was never written"
                );
            }
        }
    }
}
