//! Replay: applies the tail of a `stela run` log onto the files before the program starts, so
//! that after any crash they hold every change the log acknowledged.
//!
//! Owns the rules for applying the tail to files that hold some of its changes already. They
//! rest on how the preload library logs (crates/stela-preload):
//! - A change of names (create, rename, remove) is made durable before it is logged: the
//!   library performs it, fsyncs the directories involved (and, for a rename, the file's
//!   data first), and only then appends its record. So every name record of the tail is
//!   already on disk, with the data of every file written before it was renamed.
//! - A change of data (write, zeros, length) is performed on the file, then logged; whether
//!   it reached the disk is unknown (the page cache may have been lost).
//!
//! - A change of names returns to the program only once its record is at the log's level
//!   ([`RunRecord::waits_for_level`]). So the disk's names run ahead of the log's only by
//!   the changes still in flight when the crash came: a file the program made under a name
//!   it had ended (removed, renamed away, replaced) exists on disk only if the record that
//!   ended the old file is in the log.
//!
//! - A change of names that replaces a file (a rename onto a taken name) is preceded in the
//!   log by the replaced file's removal ([`RunRecord::replaced_end`]), logged at the level
//!   after that file was synced: a crash that lands the change but loses its own record
//!   still leaves the old file's end in the log.
//!
//! Replay therefore performs no change of names and applies every data record, in log order,
//! to the name its file has at the end of the tail: the record's path, followed through the
//! later renames of it; a later removal of the name, or a rename onto it (which replaced the
//! file the record wrote), means the file is gone and the record is skipped; so is a record
//! whose final name does not exist (its change of names was performed but its record lost
//! with a crash). Data records are idempotent and applied in their order, so
//! applying them all onto any subset of them that reached the disk gives the files the
//! program saw; and no record is ever applied to a file other than the one it was written
//! to, whatever the program did after the log's end.
//! Everything replay touched is synced before [`crate::log::recover`] returns, so the caller may
//! truncate the log behind the tail.

use crate::record::RunRecord;
use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

fn path_of(bytes: &[u8]) -> &Path {
    Path::new(OsStr::from_bytes(bytes))
}

/// The name the file a data record at `index` wrote as `path` has at the end of `records`,
/// or `None` if it was removed or replaced.
pub fn final_name(records: &[RunRecord], index: usize, path: &[u8]) -> Option<Vec<u8>> {
    let mut name = path.to_vec();
    for record in &records[index + 1..] {
        match record {
            RunRecord::Rename { from, .. } if from.as_slice() == name.as_slice() => {
                if let RunRecord::Rename { to, .. } = record {
                    name = to.to_vec();
                }
            }
            RunRecord::Rename { to, .. } if to.as_slice() == name.as_slice() => return None,
            RunRecord::Remove { path } if path.as_slice() == name.as_slice() => return None,
            _ => {}
        }
    }
    Some(name)
}

/// What replay did, for the caller's log line.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Replayed {
    pub records: usize,
    pub bytes: u64,
    pub skipped: usize,
}

/// The files `replay` touches, so that its rules can be tested on memory as well.
pub trait Files {
    fn exists(&self, path: &[u8]) -> bool;
    fn write_at(&mut self, path: &[u8], offset: u64, data: &[u8]) -> io::Result<()>;
    fn zeros_at(&mut self, path: &[u8], offset: u64, len: u64) -> io::Result<()>;
    fn set_len(&mut self, path: &[u8], size: u64) -> io::Result<()>;
}

/// Applies `records` (a log's tail, in order) to `files` by the module's rules.
pub fn replay(records: &[RunRecord], files: &mut dyn Files) -> io::Result<Replayed> {
    let mut done = Replayed::default();
    for (index, record) in records.iter().enumerate() {
        done.records += 1;
        let Some(path) = record.data_path() else {
            continue; // a change of names: on disk before it was logged
        };
        let target = final_name(records, index, path).filter(|name| files.exists(name));
        let Some(target) = target else {
            done.skipped += 1;
            continue;
        };
        match record {
            RunRecord::Write { offset, data, .. } => {
                files.write_at(&target, *offset, data)?;
                done.bytes += data.len() as u64;
            }
            RunRecord::Zeros { offset, len, .. } => files.zeros_at(&target, *offset, *len)?,
            RunRecord::SetLen { size, .. } => files.set_len(&target, *size)?,
            _ => unreachable!("data_path is Some only for data records"),
        }
    }
    Ok(done)
}

/// The real file system, remembering what it touched so it can be synced.
#[derive(Default)]
pub struct Disk {
    touched: BTreeSet<PathBuf>,
}

impl Disk {
    /// An existing file, for writing (replay never creates one).
    fn open(&mut self, path: &[u8]) -> io::Result<File> {
        let path = path_of(path);
        self.touched.insert(path.to_owned());
        OpenOptions::new().write(true).open(path)
    }

    /// fdatasync of every file touched.
    pub fn sync(&self) -> io::Result<()> {
        for path in &self.touched {
            File::open(path)?.sync_data()?;
        }
        Ok(())
    }
}

impl Files for Disk {
    fn exists(&self, path: &[u8]) -> bool {
        std::fs::symlink_metadata(path_of(path)).is_ok_and(|m| m.is_file())
    }

    fn write_at(&mut self, path: &[u8], offset: u64, data: &[u8]) -> io::Result<()> {
        self.open(path)?.write_all_at(data, offset)
    }

    fn zeros_at(&mut self, path: &[u8], offset: u64, len: u64) -> io::Result<()> {
        let file = self.open(path)?;
        let zeros = vec![0u8; 1 << 16];
        let mut at = 0;
        while at < len {
            let n = (len - at).min(zeros.len() as u64) as usize;
            file.write_all_at(&zeros[..n], offset + at)?;
            at += n as u64;
        }
        Ok(())
    }

    fn set_len(&mut self, path: &[u8], size: u64) -> io::Result<()> {
        self.open(path)?.set_len(size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_bytes::ByteBuf;
    use std::collections::BTreeMap;

    /// A file in memory: the position in the log of the record that made it (two files that
    /// had one name are told apart by it), and its bytes.
    #[derive(Clone, Debug, PartialEq, Eq)]
    struct MemFile {
        made_by: usize,
        bytes: Vec<u8>,
    }

    /// Files in memory: name to file.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    struct Memory(BTreeMap<Vec<u8>, MemFile>);

    impl Memory {
        fn bytes(&mut self, path: &[u8]) -> &mut Vec<u8> {
            &mut self
                .0
                .get_mut(path)
                .expect("replay changes only existing files")
                .bytes
        }
    }

    impl Files for Memory {
        fn exists(&self, path: &[u8]) -> bool {
            self.0.contains_key(path)
        }
        fn write_at(&mut self, path: &[u8], offset: u64, data: &[u8]) -> io::Result<()> {
            let file = self.bytes(path);
            let end = offset as usize + data.len();
            if file.len() < end {
                file.resize(end, 0);
            }
            file[offset as usize..end].copy_from_slice(data);
            Ok(())
        }
        fn zeros_at(&mut self, path: &[u8], offset: u64, len: u64) -> io::Result<()> {
            self.write_at(path, offset, &vec![0; len as usize])
        }
        fn set_len(&mut self, path: &[u8], size: u64) -> io::Result<()> {
            self.bytes(path).resize(size as usize, 0);
            Ok(())
        }
    }

    /// What the program did (the record at `index` of the log), as the live files saw it. A
    /// create of a name that exists is a rename into a durable directory over it: a new file.
    fn apply_live(files: &mut Memory, index: usize, record: &RunRecord) {
        match record {
            RunRecord::Create { path, .. } => {
                let file = MemFile {
                    made_by: index,
                    bytes: Vec::new(),
                };
                files.0.insert(path.to_vec(), file);
            }
            RunRecord::Rename { from, to } => {
                let file = files.0.remove(from.as_slice()).unwrap();
                files.0.insert(to.to_vec(), file);
            }
            RunRecord::Remove { path } => {
                files.0.remove(path.as_slice());
            }
            RunRecord::Write { path, offset, data } => files.write_at(path, *offset, data).unwrap(),
            RunRecord::Zeros { path, offset, len } => files.zeros_at(path, *offset, *len).unwrap(),
            RunRecord::SetLen { path, size } => files.set_len(path, *size).unwrap(),
        }
    }

    fn b(text: &str) -> ByteBuf {
        ByteBuf::from(text.as_bytes().to_vec())
    }

    /// One step of a program: (kind, name, other name, offset or size, length).
    type Op = (u8, u8, u8, u64, usize);

    fn ops() -> impl Strategy<Value = Vec<Op>> {
        proptest::collection::vec((0u8..7, 0u8..3, 0u8..3, 0u64..64, 1usize..16), 1..50)
    }

    /// A program's history over three names (writes, truncations, creates (over an existing
    /// name too, as a rename into the directory does), renames that may replace a file,
    /// removes; each legal when made), as its log; `fill(file, op, name)` gives the bytes a
    /// write puts in `file` (the log position that made it).
    fn history(ops: Vec<Op>, fill: impl Fn(usize, u8, u8) -> u8) -> Vec<RunRecord> {
        let names = ["/d/a", "/d/b", "/d/c"];
        let mut live = Memory::default();
        let mut log = Vec::new();
        for (op, x, y, offset, len) in ops {
            let (p, q) = (names[x as usize], names[y as usize]);
            let made_by = live.0.get(p.as_bytes()).map_or(0, |f| f.made_by);
            let record = match op {
                0 | 1 => RunRecord::Write {
                    path: b(p),
                    offset,
                    data: ByteBuf::from(vec![fill(made_by, op, x); len]),
                },
                2 => RunRecord::Zeros {
                    path: b(p),
                    offset,
                    len: len as u64,
                },
                3 => RunRecord::SetLen {
                    path: b(p),
                    size: offset,
                },
                4 => RunRecord::Create {
                    path: b(p),
                    mode: 0o600,
                },
                5 if p != q => RunRecord::Rename {
                    from: b(p),
                    to: b(q),
                },
                _ => RunRecord::Remove { path: b(p) },
            };
            let needs = match &record {
                RunRecord::Create { .. } => None,
                RunRecord::Rename { from, .. } => Some(from),
                RunRecord::Remove { path }
                | RunRecord::Write { path, .. }
                | RunRecord::Zeros { path, .. }
                | RunRecord::SetLen { path, .. } => Some(path),
            };
            if needs.is_some_and(|p| !live.exists(p)) {
                continue;
            }
            if let Some(end) = record.replaced_end(|name| live.exists(name)) {
                // As the library logs it. Until the change lands the old file stays on disk,
                // its data synced (the program's state before the call); the model lets it
                // go at once, which replay cannot tell apart: it skips the old file's
                // records either way.
                apply_live(&mut live, log.len(), &end);
                log.push(end);
            }
            apply_live(&mut live, log.len(), &record);
            log.push(record);
        }
        log
    }

    /// The files a crash left: every change before `tail_from` (synced), then, up to
    /// `crash_at`, every change of names (durable before it was logged) and the data changes
    /// `reached_disk` names (the others were lost with the page cache; one to a file no longer
    /// on disk is lost with it).
    fn crashed(
        log: &[RunRecord],
        tail_from: usize,
        crash_at: usize,
        reached_disk: &[bool],
    ) -> Memory {
        let mut files = Memory::default();
        for (i, record) in log[..tail_from].iter().enumerate() {
            apply_live(&mut files, i, record);
        }
        for (i, record) in log.iter().enumerate().take(crash_at).skip(tail_from) {
            let lands = record.data_path().is_none() || reached_disk[i];
            let here = record.data_path().is_none_or(|p| files.exists(p));
            let renamed_ok = match record {
                RunRecord::Rename { from, .. } => files.exists(from),
                _ => true,
            };
            if lands && here && renamed_ok {
                apply_live(&mut files, i, record);
            }
        }
        files
    }

    proptest! {
        /// A crash leaves the files at the tail's start with every change of names of the
        /// tail and any subset of its data changes. Replaying the tail gives the files the
        /// program saw at the end.
        #[test]
        fn replaying_the_tail_onto_what_a_crash_left_gives_the_final_files(
            ops in ops(),
            tail_from in 0usize..50,
            reached_disk in proptest::collection::vec(any::<bool>(), 50),
        ) {
            let log = history(ops, |_, op, x| op + x + 1);
            let mut live = Memory::default();
            for (i, record) in log.iter().enumerate() {
                apply_live(&mut live, i, record);
            }
            let tail_from = tail_from.min(log.len());
            let mut files = crashed(&log, tail_from, log.len(), &reached_disk);
            replay(&log[tail_from..], &mut files).unwrap();
            prop_assert_eq!(files, live);
        }

        /// The log lost its last records (the daemon was killed before they were at the
        /// level) while the program went on: the disk holds changes the log lacks, up to the
        /// first change of names the log lacks (the library holds the program in that call
        /// until its record is at the level). Each write puts bytes naming its file in it.
        /// Replaying the tail that survived never puts one file's bytes into another: a
        /// journal removed and made again under its name never gets the old one's bytes.
        /// And where the program did nothing after the log's end, replay gives the files the
        /// program saw then.
        #[test]
        fn replay_never_writes_a_files_records_into_another_file_made_after_the_logs_end(
            ops in ops(),
            tail_from in 0usize..=100,
            log_end in 0usize..=100,
            crash_at in 0usize..=100,
            reached_disk in proptest::collection::vec(any::<bool>(), 50),
        ) {
            let tag = |made_by: usize| (made_by % 250 + 1) as u8;
            let log = history(ops, |made_by, _, _| tag(made_by));
            // The three points as percentages of the history, so each falls inside it.
            let at = |percent: usize| log.len() * percent / 100;
            let tail_from = at(tail_from);
            let log_end = at(log_end).max(tail_from);
            let crash_at = at(crash_at);
            let held_at = log[log_end..]
                .iter()
                .position(RunRecord::waits_for_level)
                .map_or(log.len(), |i| log_end + i + 1);
            let crash_at = crash_at.clamp(log_end, held_at);
            let mut files = crashed(&log, tail_from, crash_at, &reached_disk);
            replay(&log[tail_from..log_end], &mut files).unwrap();
            for (name, file) in &files.0 {
                let foreign = file.bytes.iter().find(|&&b| b != 0 && b != tag(file.made_by));
                prop_assert!(
                    foreign.is_none(),
                    "{} (made by record {}) holds byte {:?} of another file",
                    String::from_utf8_lossy(name), file.made_by, foreign
                );
            }
            if crash_at == log_end {
                let mut live = Memory::default();
                for (i, record) in log[..log_end].iter().enumerate() {
                    apply_live(&mut live, i, record);
                }
                prop_assert_eq!(files, live);
            }
        }
    }
}
