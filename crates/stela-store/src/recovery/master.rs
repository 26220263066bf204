//! The master record: the durable pointer to the latest complete checkpoint, where restart's
//! analysis starts, kept in two slot files.
//!
//! This module owns the master record's two files. Invariants:
//! - Every intact master record names a begin and an end record that were durable when it was
//!   written (the checkpoint service writes it only after syncing the log to the end record).
//! - The slot the log's truncation relies on ([`MasterSlots::pin`]) is durable and is not
//!   overwritten until the other slot, naming a newer checkpoint, has been made durable in its
//!   place; restart takes the intact slot naming the newest checkpoint, so whatever a crash
//!   does to the other slot, restart never starts before what the truncated log still holds.
//! - A slot's record never names a checkpoint older than the one it replaces (asserted where a
//!   slot is written).

use crate::error::Result;
use std::path::Path;
use stela_format::Lsn;
use stela_wal::storage::{OpenMode, Storage, StorageFile};

// A master record, 28 bytes, little-endian:
//   0   8   LSN of the checkpoint's begin record
//   8   8   LSN of its end record
//   16  8   LSN of the end record of the full checkpoint its chain of deltas starts from (the
//           end record itself for a full checkpoint)
//   24  4   CRC32C of bytes 0..24
// A record of 20 bytes (no root, the CRC at 16) was written before there were deltas: its
// checkpoint is full. It is kept in two files ("slots"), each overwritten in place; the first
// keeps the name a single master file had, so a directory written before there were two still
// opens.
const SLOT_FILES: [&str; 2] = ["checkpoint", "checkpoint.1"];
const MASTER_LEN: usize = 28;
const OLD_MASTER_LEN: usize = 20;
/// The temporary file of the single master file's replace-by-rename, removed if left behind.
const OLD_TEMPORARY: &str = "checkpoint.new";

/// The latest complete checkpoint: where restart's analysis starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Master {
    pub begin: Lsn,
    pub end: Lsn,
    /// The end record of the full checkpoint (`CheckpointEnd`) whose tables, with the deltas
    /// logged after it up to `end`, give this checkpoint's; `end` itself if that is full.
    /// Restart reads the log from here.
    pub root: Lsn,
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
    #[cfg(test)]
    pub fn read(storage: &dyn Storage, dir: &Path) -> Result<Option<Master>> {
        Ok(read_slots(storage, dir)?.map(|(_, master)| master))
    }

    /// A full checkpoint's record.
    pub fn full(begin: Lsn, end: Lsn) -> Master {
        Master {
            begin,
            end,
            root: end,
        }
    }

    fn encode(&self) -> [u8; MASTER_LEN] {
        let mut bytes = [0u8; MASTER_LEN];
        bytes[..8].copy_from_slice(&self.begin.get().to_le_bytes());
        bytes[8..16].copy_from_slice(&self.end.get().to_le_bytes());
        bytes[16..24].copy_from_slice(&self.root.get().to_le_bytes());
        let crc = crc32c::crc32c(&bytes[..24]);
        bytes[24..].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    /// A payload of 24 bytes, or of 16 (written before deltas: a full checkpoint).
    fn decode(payload: &[u8]) -> Master {
        let at = |i: usize| Lsn::new(u64::from_le_bytes(payload[i..i + 8].try_into().expect("8")));
        let (begin, end) = (at(0), at(8));
        let root = if payload.len() >= 24 { at(16) } else { end };
        Master { begin, end, root }
    }

    /// Whether the LSNs can name a checkpoint: the root's end at or before the end, which
    /// follows the begin.
    fn is_ordered(&self) -> bool {
        self.root <= self.end && self.begin < self.end
    }
}

/// The intact slot naming the newest checkpoint, with its index.
fn read_slots(storage: &dyn Storage, dir: &Path) -> Result<Option<(usize, Master)>> {
    let mut newest: Option<(usize, Master)> = None;
    let mut damaged = Vec::new();
    for (slot, name) in SLOT_FILES.iter().enumerate() {
        let path = dir.join(name);
        let sealed = match read_sealed(storage, &path, MASTER_LEN - 4)? {
            Sealed::Damaged => read_sealed(storage, &path, OLD_MASTER_LEN - 4)?,
            sealed => sealed,
        };
        match sealed {
            Sealed::Absent => {}
            Sealed::Damaged => damaged.push(path),
            Sealed::Intact(bytes) if !Master::decode(&bytes).is_ordered() => damaged.push(path),
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
        debug_assert!(
            self.newest
                .is_none_or(|(_, newest)| newest.begin <= master.begin),
            "a master record older than the newest: {master:?} after {:?}",
            self.newest
        );
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

#[cfg(test)]
mod tests {
    use super::*;
    use stela_wal::storage::{CrashPlan, FaultStorage};

    fn master(n: u64) -> Master {
        Master::full(Lsn::new(10 * n), Lsn::new(10 * n + 5))
    }

    /// A delta's record names its chain's root; a record of the 20 bytes written before there
    /// were deltas reads as a full checkpoint; one whose LSNs cannot name a checkpoint is
    /// damaged, and restart falls back to the other slot.
    #[test]
    fn a_master_record_names_its_root_and_an_older_shorter_one_still_reads() {
        let dir = tempfile::tempdir().unwrap();
        let storage = stela_wal::storage::StdStorage;
        let (mut slots, _) = MasterSlots::open(&storage, dir.path()).unwrap();
        let delta = Master {
            begin: Lsn::new(40),
            end: Lsn::new(45),
            root: Lsn::new(12),
        };
        slots.write(&storage, master(1)).unwrap();
        slots.pin(&storage).unwrap();
        slots.write(&storage, delta).unwrap();
        assert_eq!(Master::read(&storage, dir.path()).unwrap(), Some(delta));

        let mut old = Vec::new();
        old.extend_from_slice(&70u64.to_le_bytes());
        old.extend_from_slice(&75u64.to_le_bytes());
        old.extend_from_slice(&crc32c::crc32c(&old).to_le_bytes());
        std::fs::write(dir.path().join(SLOT_FILES[1]), &old).unwrap();
        assert_eq!(
            Master::read(&storage, dir.path()).unwrap(),
            Some(Master::full(Lsn::new(70), Lsn::new(75)))
        );

        let backwards = Master {
            begin: Lsn::new(90),
            end: Lsn::new(95),
            root: Lsn::new(99),
        };
        std::fs::write(dir.path().join(SLOT_FILES[1]), backwards.encode()).unwrap();
        assert_eq!(Master::read(&storage, dir.path()).unwrap(), Some(master(1)));
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
