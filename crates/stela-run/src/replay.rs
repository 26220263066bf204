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
//! Replay therefore performs no change of names and applies every data record, in log order,
//! to the name its file has at the end of the tail: the record's path, followed through the
//! later renames of it; a later removal of the name, or a rename onto it (which replaced the
//! file the record wrote), means the file is gone and the record is skipped; so is a record
//! whose final name does not exist (its change of names was performed but its record lost
//! with a crash). Data records are idempotent and applied in their order, so applying them
//! all onto any subset of them that reached the disk gives the files the program saw.
//! Everything replay touched is synced before [`crate::recover`] returns, so the caller may
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

    /// Files in memory: name to contents.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    struct Memory(BTreeMap<Vec<u8>, Vec<u8>>);

    impl Files for Memory {
        fn exists(&self, path: &[u8]) -> bool {
            self.0.contains_key(path)
        }
        fn write_at(&mut self, path: &[u8], offset: u64, data: &[u8]) -> io::Result<()> {
            let file = self
                .0
                .get_mut(path)
                .expect("replay writes only existing files");
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
            self.0
                .get_mut(path)
                .expect("replay cuts only existing files")
                .resize(size as usize, 0);
            Ok(())
        }
    }

    /// What the program did, as the live files saw it.
    fn apply_live(files: &mut Memory, record: &RunRecord) {
        match record {
            RunRecord::Create { path, .. } => {
                files.0.entry(path.to_vec()).or_default();
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

    proptest! {
        /// A program's history over three names (writes, truncations, creates, renames that
        /// may replace a file, removes; each legal when made). A crash leaves the files at the
        /// tail's start with every change of names of the tail (durable before logged) and any
        /// subset of its data changes (some reached the disk, some were lost with the page
        /// cache). Replaying the tail gives the files the program saw at the end.
        #[test]
        fn replaying_the_tail_onto_what_a_crash_left_gives_the_final_files(
            ops in proptest::collection::vec((0u8..7, 0u8..3, 0u8..3, 0u64..64, 1usize..16), 1..50),
            tail_from in 0usize..50,
            reached_disk in proptest::collection::vec(any::<bool>(), 50),
        ) {
            let names = ["/d/a", "/d/b", "/d/c"];
            let mut live = Memory::default();
            let mut log = Vec::new();
            for (op, x, y, offset, len) in ops {
                let (p, q) = (names[x as usize], names[y as usize]);
                let record = match op {
                    0 | 1 => RunRecord::Write { path: b(p), offset, data: ByteBuf::from(vec![op + x + 1; len]) },
                    2 => RunRecord::Zeros { path: b(p), offset, len: len as u64 },
                    3 => RunRecord::SetLen { path: b(p), size: offset },
                    4 => RunRecord::Create { path: b(p), mode: 0o600 },
                    5 if p != q => RunRecord::Rename { from: b(p), to: b(q) },
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
                apply_live(&mut live, &record);
                log.push(record);
            }
            let tail_from = tail_from.min(log.len());
            let mut crashed = Memory::default();
            for record in &log[..tail_from] {
                apply_live(&mut crashed, record);
            }
            for (i, record) in log[tail_from..].iter().enumerate() {
                let lands = record.data_path().is_none() || reached_disk[i];
                // A data change that was lost is simply not there; one to a file that no
                // longer exists on disk is lost with it.
                let here = match record.data_path() { Some(p) => crashed.exists(p), None => true };
                let renamed_ok = match record { RunRecord::Rename { from, .. } => crashed.exists(from), _ => true };
                if lands && here && renamed_ok {
                    apply_live(&mut crashed, record);
                }
            }
            replay(&log[tail_from..], &mut crashed).unwrap();
            prop_assert_eq!(crashed, live);
        }
    }
}
