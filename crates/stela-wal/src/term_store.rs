//! The durable term state of one replicated log: the highest term this node has seen (it refuses
//! anything older) and the log's term history (`stela_format::term`), in the file `TERMS` of the
//! log's directory.
//!
//! Invariants:
//! - **Replaced whole, atomically.** Every change writes `TERMS.tmp`, fdatasyncs it, renames it
//!   over `TERMS` and fsyncs the directory before it returns: after a crash the file is the old
//!   state or the new one, never a mix.
//! - **Never forgotten.** A missing file is term 0 with an empty history (a log never
//!   replicated); a damaged one is an error naming the file, never read as term 0, which would
//!   let a fenced node accept an old primary again.
//! - **The current term never goes down**, and is at least the history's last term.
//! - **Fail stop.** After a failed write, sync or rename the store refuses every later change: a
//!   failed fsync is not retried on the same file.
//!
//! File layout, little-endian: current term (u64), then the encoded history (which carries its
//! own CRC), then a CRC32C of everything before it (u32).

use crate::error::{Error, Result};
use crate::storage::{OpenMode, Storage};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use stela_format::term::{Term, TermHistory};

const FILE: &str = "TERMS";
const TEMP: &str = "TERMS.tmp";

/// A log's durable term state. See the module documentation.
#[derive(Debug)]
pub struct TermStore {
    storage: Arc<dyn Storage>,
    dir: PathBuf,
    current: Term,
    history: TermHistory,
    failed: bool,
}

impl TermStore {
    /// Reads the term state of the log in `dir` (term 0 and an empty history if it has none).
    ///
    /// # Errors
    /// The file cannot be read, or is damaged ([`Error::NotALog`] naming it).
    pub fn open(storage: Arc<dyn Storage>, dir: &Path) -> Result<TermStore> {
        let path = dir.join(FILE);
        let (current, history) = match storage.open(&path, OpenMode::Read) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (Term(0), TermHistory::new()),
            Err(e) => return Err(Error::io("open", &path, e)),
            Ok(file) => {
                let bytes = file
                    .read_to_vec()
                    .map_err(|e| Error::io("read", &path, e))?;
                decode(&bytes).ok_or(Error::NotALog {
                    path: path.clone(),
                    reason: "damaged term state (TERMS): refusing to forget the terms this node has seen",
                })?
            }
        };
        Ok(TermStore {
            storage,
            dir: dir.to_path_buf(),
            current,
            history,
            failed: false,
        })
    }

    /// The highest term this node has seen.
    pub fn current(&self) -> Term {
        self.current
    }

    /// The log's term history.
    pub fn history(&self) -> &TermHistory {
        &self.history
    }

    /// Raises the current term to `term` (no change if it is not higher), durably.
    ///
    /// # Errors
    /// The write failed; the store then refuses every later change.
    pub fn observe(&mut self, term: Term) -> Result<()> {
        if term <= self.current {
            return Ok(());
        }
        let history = self.history.clone();
        self.save(term, history)
    }

    /// Starts `term` at LSN `first` of the log (a primary opening its tenure, or a standby
    /// receiving its first record of a new term), durably; raises the current term to it.
    ///
    /// # Errors
    /// A term not above the history's last or below the current term, an LSN below the last
    /// entry's, or a failed write.
    pub fn begin(&mut self, term: Term, first: u64) -> Result<()> {
        if term < self.current {
            return Err(Error::NotALog {
                path: self.dir.join(FILE),
                reason: "a term below the current one cannot begin",
            });
        }
        let mut history = self.history.clone();
        history.push(term, first).map_err(|_| Error::NotALog {
            path: self.dir.join(FILE),
            reason: "a term must be newer than the history's last and start at or after it",
        })?;
        self.save(term, history)
    }

    /// Forgets the history after `lsn` (the log was cut back to it), durably.
    ///
    /// # Errors
    /// The write failed.
    pub fn truncate_after(&mut self, lsn: u64) -> Result<()> {
        let mut history = self.history.clone();
        history.truncate_after(lsn);
        self.save(self.current, history)
    }

    fn save(&mut self, current: Term, history: TermHistory) -> Result<()> {
        if self.failed {
            return Err(Error::NotALog {
                path: self.dir.join(FILE),
                reason: "an earlier write of the term state failed; restart to retry",
            });
        }
        let (temp, path) = (self.dir.join(TEMP), self.dir.join(FILE));
        let bytes = encode(current, &history);
        let result = (|| {
            let _ = self.storage.remove(&temp);
            let file = self
                .storage
                .open(&temp, OpenMode::CreateNew)
                .map_err(|e| Error::io("create", &temp, e))?;
            file.write_all_at(&bytes, 0)
                .map_err(|e| Error::io("write", &temp, e))?;
            file.sync_data()
                .map_err(|e| Error::io("fdatasync", &temp, e))?;
            self.storage
                .rename(&temp, &path)
                .map_err(|e| Error::io("rename", &temp, e))?;
            self.storage
                .sync_dir(&self.dir)
                .map_err(|e| Error::io("fsync directory", &self.dir, e))
        })();
        match result {
            Ok(()) => {
                self.current = current;
                self.history = history;
                Ok(())
            }
            Err(error) => {
                self.failed = true;
                Err(error)
            }
        }
    }
}

fn encode(current: Term, history: &TermHistory) -> Vec<u8> {
    let mut out = current.0.to_le_bytes().to_vec();
    out.extend_from_slice(&history.encode());
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

fn decode(bytes: &[u8]) -> Option<(Term, TermHistory)> {
    if bytes.len() < 12 {
        return None;
    }
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    if crc32c::crc32c(body) != u32::from_le_bytes(crc.try_into().ok()?) {
        return None;
    }
    let current = Term(u64::from_le_bytes(body[..8].try_into().ok()?));
    let history = TermHistory::decode(&body[8..]).ok()?;
    (current >= history.last_term()).then_some((current, history))
}

#[cfg(all(test, feature = "testing"))]
mod tests {
    use super::*;
    use crate::storage::{CrashPlan, FaultStorage};

    fn store(fs: &FaultStorage) -> Result<TermStore> {
        TermStore::open(Arc::new(fs.clone()), Path::new("/log"))
    }

    #[test]
    fn terms_survive_a_power_cut_once_changed() {
        let fs = FaultStorage::new();
        fs.create_dir_all(Path::new("/log")).unwrap();
        let mut s = store(&fs).unwrap();
        assert_eq!(s.current(), Term(0));
        s.begin(Term(1), 1).unwrap();
        s.observe(Term(3)).unwrap();
        s.observe(Term(2)).unwrap(); // never goes down
        s.begin(Term(4), 50).unwrap();
        assert!(s.begin(Term(2), 60).is_err());
        fs.crash(CrashPlan::LoseUnsynced);
        let mut s = store(&fs).unwrap();
        assert_eq!(s.current(), Term(4));
        assert_eq!(s.history().entries(), &[(Term(1), 1), (Term(4), 50)]);
        s.truncate_after(49).unwrap();
        fs.crash(CrashPlan::ScrambleSectors { seed: 7 });
        let s = store(&fs).unwrap();
        assert_eq!(s.current(), Term(4), "cutting the history keeps the term");
        assert_eq!(s.history().entries(), &[(Term(1), 1)]);
    }

    #[test]
    fn a_damaged_file_is_refused_not_read_as_term_zero() {
        let fs = FaultStorage::new();
        fs.create_dir_all(Path::new("/log")).unwrap();
        store(&fs).unwrap().begin(Term(5), 1).unwrap();
        let file = fs
            .open(Path::new("/log/TERMS"), OpenMode::ReadWrite)
            .unwrap();
        file.write_all_at(&[0xff], 3).unwrap();
        let error = store(&fs).unwrap_err().to_string();
        assert!(error.contains("TERMS"), "{error}");
    }

    #[test]
    fn a_leftover_temporary_file_changes_nothing() {
        let fs = FaultStorage::new();
        fs.create_dir_all(Path::new("/log")).unwrap();
        store(&fs).unwrap().begin(Term(2), 1).unwrap();
        let temp = fs
            .open(Path::new("/log/TERMS.tmp"), OpenMode::CreateNew)
            .unwrap();
        temp.write_all_at(b"half", 0).unwrap();
        let mut s = store(&fs).unwrap();
        assert_eq!(s.current(), Term(2));
        s.observe(Term(3)).unwrap();
        assert_eq!(store(&fs).unwrap().current(), Term(3));
    }

    #[test]
    fn a_failed_sync_stops_the_store() {
        let fs = FaultStorage::new();
        fs.create_dir_all(Path::new("/log")).unwrap();
        let mut s = store(&fs).unwrap();
        s.begin(Term(1), 1).unwrap();
        fs.fail_sync_after(0);
        assert!(s.observe(Term(2)).is_err());
        assert!(s.observe(Term(3)).is_err(), "no retry after a failed sync");
        assert_eq!(s.current(), Term(1));
    }
}
