//! The durable term state of one replicated log: the highest term this node has seen (it refuses
//! anything older) and the log's term history (`stela_format::term`), in the file `TERMS` of the
//! log's directory.
//!
//! Invariants:
//! - **Replaced whole, atomically.** Every change writes `TERMS.tmp`, fdatasyncs it, renames it
//!   over `TERMS` and fsyncs the directory before it returns: after a crash the file is the old
//!   state or the new one, never a mix.
//! - **Never forgotten.** A missing file is term 0 with an empty history (a log never
//!   replicated); a damaged one is [`Error::TermsDamaged`] naming the file, never read as term 0,
//!   which would let a fenced node accept an old primary again. A leftover `TERMS.tmp` (a crash
//!   before the rename) is ignored and replaced by the next change.
//! - **The current term never goes down**, and is at least the history's last term; a change
//!   that would break this or the history's own invariants is [`Error::TermRefused`], with
//!   nothing written.
//! - **Fail stop.** After a failed write, sync or rename the store refuses every later change
//!   ([`Error::Poisoned`], wrapping the first failure): a failed fsync is not retried on the same
//!   file. Reopening the store reads whatever reached the disk.
//!
//! File layout, little-endian: current term (u64), then the encoded history (which carries its
//! own CRC), then a CRC32C of everything before it (u32).

use crate::error::{Error, Result};
use crate::storage::{OpenMode, Storage};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use stela_format::term::{Term, TermError, TermHistory};

const FILE: &str = "TERMS";
const TEMP: &str = "TERMS.tmp";

/// A log's durable term state. See the module documentation.
#[derive(Debug)]
pub struct TermStore {
    storage: Arc<dyn Storage>,
    dir: PathBuf,
    current: Term,
    history: TermHistory,
    /// The first failed change (a copy of it): every later change is refused with it.
    failed: Option<Arc<Error>>,
}

impl TermStore {
    /// Reads the term state of the log in `dir` (term 0 and an empty history if it has none).
    ///
    /// # Errors
    /// The file cannot be read, or is damaged ([`Error::TermsDamaged`] naming it).
    pub fn open(storage: Arc<dyn Storage>, dir: &Path) -> Result<TermStore> {
        let path = dir.join(FILE);
        let (current, history) = match storage.open(&path, OpenMode::Read) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (Term(0), TermHistory::new()),
            Err(e) => return Err(Error::io("open", &path, e)),
            Ok(file) => {
                let bytes = file
                    .read_to_vec()
                    .map_err(|e| Error::io("read", &path, e))?;
                decode(&bytes).map_err(|damage| Error::TermsDamaged {
                    path: path.clone(),
                    reason: damage.to_string(),
                })?
            }
        };
        Ok(TermStore {
            storage,
            dir: dir.to_path_buf(),
            current,
            history,
            failed: None,
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
    /// [`Error::TermRefused`] for a term below the current one, one not above the history's last,
    /// term 0, LSN 0 or an LSN below the last entry's; a failed write.
    pub fn begin(&mut self, term: Term, first: u64) -> Result<()> {
        let refused = |source| Error::TermRefused {
            path: self.dir.join(FILE),
            source,
        };
        if term < self.current {
            return Err(refused(TermError::TermNotIncreasing {
                term,
                last: self.current,
            }));
        }
        let mut history = self.history.clone();
        history.push(term, first).map_err(refused)?;
        self.save(term, history)
    }

    /// Enters `term` from LSN `first` in the history as the primary's own history has it (a
    /// standby taking up the terms its primary began while it was away), durably. Unlike
    /// [`TermStore::begin`] the term may be below the current one: a standby has already seen
    /// the primary's newest term in its `Open`, and the terms it missed before that are older.
    /// The current term becomes the higher of the two.
    ///
    /// # Errors
    /// [`Error::TermRefused`] for a term not above the history's last, term 0, LSN 0 or an LSN
    /// below the last entry's; a failed write.
    pub fn adopt(&mut self, term: Term, first: u64) -> Result<()> {
        let mut history = self.history.clone();
        history
            .push(term, first)
            .map_err(|source| Error::TermRefused {
                path: self.dir.join(FILE),
                source,
            })?;
        self.save(self.current.max(term), history)
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
        if let Some(cause) = &self.failed {
            return Err(Error::Poisoned {
                cause: Arc::clone(cause),
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
            Err(error) => match error.duplicate_io() {
                Some(copy) => {
                    self.failed = Some(Arc::new(copy));
                    Err(error)
                }
                None => {
                    let error = Arc::new(error);
                    self.failed = Some(Arc::clone(&error));
                    Err(Error::Poisoned { cause: error })
                }
            },
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

/// The file's contents, or why they are not a term state.
fn decode(bytes: &[u8]) -> std::result::Result<(Term, TermHistory), TermStateDamage> {
    let short = || TermStateDamage::TooShort(bytes.len());
    let (body, crc) = bytes.split_last_chunk::<4>().ok_or_else(short)?;
    let (current, history) = body.split_first_chunk::<8>().ok_or_else(short)?;
    let (stored, computed) = (u32::from_le_bytes(*crc), crc32c::crc32c(body));
    if stored != computed {
        return Err(TermStateDamage::Checksum { stored, computed });
    }
    let current = Term(u64::from_le_bytes(*current));
    let history = TermHistory::decode(history)?;
    if current < history.last_term() {
        return Err(TermStateDamage::BelowHistory {
            current,
            last: history.last_term(),
        });
    }
    Ok((current, history))
}

/// Why a term state file's bytes are not a term state.
#[derive(Debug, thiserror::Error)]
enum TermStateDamage {
    #[error("{0} bytes, too short")]
    TooShort(usize),
    #[error("checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    Checksum { stored: u32, computed: u32 },
    #[error("{0}")]
    History(#[from] stela_format::term::TermError),
    #[error("current {current} is below the history's last, {last}")]
    BelowHistory { current: Term, last: Term },
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{Call, CrashPlan, FaultStorage, Hooked, Hooks, StdStorage};
    use std::sync::atomic::{AtomicU64, Ordering};

    fn store(fs: &FaultStorage) -> Result<TermStore> {
        TermStore::open(Arc::new(fs.clone()), Path::new("/log"))
    }

    fn state(s: &TermStore) -> (Term, Vec<(Term, u64)>) {
        (s.current(), s.history().entries().to_vec())
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
    fn refused_changes_write_nothing() {
        let fs = FaultStorage::new();
        fs.create_dir_all(Path::new("/log")).unwrap();
        let mut s = store(&fs).unwrap();
        s.begin(Term(2), 10).unwrap();
        s.observe(Term(5)).unwrap();
        for (term, first) in [(Term(4), 20), (Term(2), 20), (Term(6), 9), (Term(6), 0)] {
            let error = s.begin(term, first).unwrap_err();
            assert!(
                matches!(&error, Error::TermRefused { path, .. } if path.ends_with("TERMS")),
                "{error:?}"
            );
        }
        let error = TermStore::open(Arc::new(fs.clone()), Path::new("/log"))
            .unwrap()
            .begin(Term(3), 20)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("/log/TERMS") && error.contains("term 3"),
            "{error}"
        );
        assert_eq!(state(&store(&fs).unwrap()), (Term(5), vec![(Term(2), 10)]));
        // The current term itself may begin (a standby adopts it, then its first record comes).
        s.begin(Term(5), 30).unwrap();
    }

    #[test]
    fn a_standby_adopts_terms_below_the_one_it_has_seen() {
        let fs = FaultStorage::new();
        fs.create_dir_all(Path::new("/log")).unwrap();
        let mut s = store(&fs).unwrap();
        s.begin(Term(1), 1).unwrap();
        // The primary's Open names its newest term; the two before it are entered after.
        s.observe(Term(7)).unwrap();
        assert!(
            s.begin(Term(5), 21).is_err(),
            "a primary never begins below"
        );
        s.adopt(Term(5), 21).unwrap();
        s.adopt(Term(7), 31).unwrap();
        // Below the history's last, or going back in LSNs: refused, nothing written.
        assert!(s.adopt(Term(6), 40).is_err());
        assert!(s.adopt(Term(9), 30).is_err());
        s.adopt(Term(9), 40).unwrap();
        fs.crash(CrashPlan::LoseUnsynced);
        assert_eq!(
            state(&store(&fs).unwrap()),
            (
                Term(9),
                vec![(Term(1), 1), (Term(5), 21), (Term(7), 31), (Term(9), 40)]
            )
        );
    }

    #[test]
    fn a_damaged_file_is_refused_not_read_as_term_zero() {
        let fs = FaultStorage::new();
        fs.create_dir_all(Path::new("/log")).unwrap();
        store(&fs).unwrap().begin(Term(5), 1).unwrap();
        let good = fs.read_file(Path::new("/log/TERMS")).unwrap();
        let damaged = |bytes: &[u8]| {
            fs.corrupt(Path::new("/log/TERMS"), 0, bytes);
            let file = fs
                .open(Path::new("/log/TERMS"), OpenMode::ReadWrite)
                .unwrap();
            file.set_len(bytes.len() as u64).unwrap();
            let error = store(&fs).unwrap_err();
            assert!(
                matches!(&error, Error::TermsDamaged { path, .. } if path == Path::new("/log/TERMS")),
                "{error:?}"
            );
            error.to_string()
        };
        let mut flipped = good.clone();
        flipped[3] ^= 0xff;
        assert!(damaged(&flipped).contains("checksum"));
        assert!(damaged(&good[..good.len() - 1]).contains("/log/TERMS"));
        assert!(damaged(&[]).contains("too short"));
        // A well-formed file whose current term is below its history's last breaks an invariant.
        let history = TermHistory::from_entries([(Term(7), 1)]).unwrap();
        assert!(damaged(&encode(Term(6), &history)).contains("below"));
        fs.corrupt(Path::new("/log/TERMS"), 0, &good);
        assert_eq!(state(&store(&fs).unwrap()), (Term(5), vec![(Term(5), 1)]));
    }

    #[test]
    fn a_leftover_temporary_file_changes_nothing() {
        let fs = FaultStorage::new();
        fs.create_dir_all(Path::new("/log")).unwrap();
        store(&fs).unwrap().begin(Term(2), 1).unwrap();
        // A crash before the rename: the new state, whole or cut short, is only in TERMS.tmp.
        let newer = encode(Term(9), &TermHistory::from_entries([(Term(9), 1)]).unwrap());
        for leftover in [&b"half"[..], &newer] {
            let _ = fs.remove(Path::new("/log/TERMS.tmp"));
            let temp = fs
                .open(Path::new("/log/TERMS.tmp"), OpenMode::CreateNew)
                .unwrap();
            temp.write_all_at(leftover, 0).unwrap();
            temp.sync_data().unwrap();
            assert_eq!(state(&store(&fs).unwrap()), (Term(2), vec![(Term(2), 1)]));
        }
        let mut s = store(&fs).unwrap();
        s.observe(Term(3)).unwrap();
        assert_eq!(store(&fs).unwrap().current(), Term(3));
    }

    /// Fails the `n`-th call that changes the disk, and every one after it: the process died there.
    #[derive(Debug)]
    struct DieAt {
        n: u64,
        seen: AtomicU64,
    }

    impl Hooks for DieAt {
        fn before(&self, call: &Call<'_>) -> std::io::Result<()> {
            if call.mutates() && self.seen.fetch_add(1, Ordering::SeqCst) >= self.n {
                return Err(std::io::Error::other("died"));
            }
            Ok(())
        }
    }

    #[test]
    fn a_crash_at_any_step_of_a_change_keeps_the_old_state_or_the_new() {
        let plans = [
            CrashPlan::LoseUnsynced,
            CrashPlan::TearUnsynced { seed: 1 },
            CrashPlan::ScrambleSectors { seed: 2 },
            CrashPlan::ScrambleSectors { seed: 3 },
        ];
        let old = (Term(3), vec![(Term(1), 1), (Term(3), 40)]);
        for change in 0..3 {
            let mut completed = false;
            for n in 0.. {
                for plan in plans {
                    let fs = FaultStorage::new();
                    fs.create_dir_all(Path::new("/log")).unwrap();
                    let mut s = store(&fs).unwrap();
                    s.begin(Term(1), 1).unwrap();
                    s.begin(Term(3), 40).unwrap();
                    let hooked = Hooked::wrap(
                        Arc::new(fs.clone()),
                        DieAt {
                            n,
                            seen: AtomicU64::new(0),
                        },
                    );
                    let mut s = TermStore::open(Arc::new(hooked), Path::new("/log")).unwrap();
                    let (result, new) = match change {
                        0 => (
                            s.begin(Term(4), 60),
                            (Term(4), vec![(Term(1), 1), (Term(3), 40), (Term(4), 60)]),
                        ),
                        1 => (s.observe(Term(8)), (Term(8), old.1.clone())),
                        _ => (s.truncate_after(39), (Term(3), vec![(Term(1), 1)])),
                    };
                    completed = result.is_ok();
                    if !completed {
                        assert!(s.observe(Term(100)).is_err(), "fail-stop");
                    }
                    assert_eq!(state(&s), if completed { new.clone() } else { old.clone() });
                    drop(s);
                    fs.crash(plan);
                    let after = state(&store(&fs).unwrap());
                    if completed {
                        assert_eq!(after, new, "{plan:?}");
                    } else {
                        assert!(
                            after == old || after == new,
                            "change {change}, died at call {n}, {plan:?}: {after:?}"
                        );
                    }
                }
                if completed {
                    assert!(n >= 4, "remove, create, write, sync, rename, sync_dir: {n}");
                    break;
                }
            }
        }
    }

    #[test]
    fn a_failed_sync_stops_the_store() {
        let fs = FaultStorage::new();
        fs.create_dir_all(Path::new("/log")).unwrap();
        let mut s = store(&fs).unwrap();
        s.begin(Term(1), 1).unwrap();
        fs.fail_sync_after(0);
        let first = s.observe(Term(2)).unwrap_err();
        assert!(
            matches!(&first, Error::Io { op: "fdatasync", path, .. } if path.ends_with("TERMS.tmp")),
            "{first:?}"
        );
        let later = s.observe(Term(3)).unwrap_err();
        assert!(
            matches!(&later, Error::Poisoned { cause } if matches!(**cause, Error::Io { op: "fdatasync", .. })),
            "no retry after a failed sync: {later:?}"
        );
        assert!(s.begin(Term(3), 5).is_err() && s.truncate_after(0).is_err());
        assert_eq!(s.current(), Term(1));
        assert_eq!(store(&fs).unwrap().current(), Term(1));
    }

    #[test]
    fn the_real_file_system_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let open = || TermStore::open(Arc::new(StdStorage), dir.path());
        let mut s = open().unwrap();
        assert_eq!(state(&s), (Term(0), vec![]));
        s.begin(Term(1), 1).unwrap();
        s.observe(Term(2)).unwrap();
        s.begin(Term(3), 17).unwrap();
        assert_eq!(
            state(&open().unwrap()),
            (Term(3), vec![(Term(1), 1), (Term(3), 17)])
        );
        assert!(!dir.path().join("TERMS.tmp").exists());
        std::fs::write(dir.path().join("TERMS.tmp"), b"leftover").unwrap();
        open().unwrap().truncate_after(16).unwrap();
        assert_eq!(state(&open().unwrap()), (Term(3), vec![(Term(1), 1)]));
        let mut bytes = std::fs::read(dir.path().join("TERMS")).unwrap();
        bytes[0] ^= 1;
        std::fs::write(dir.path().join("TERMS"), &bytes).unwrap();
        let error = open().unwrap_err().to_string();
        assert!(
            error.contains(&dir.path().join("TERMS").display().to_string()),
            "{error}"
        );
    }
}
