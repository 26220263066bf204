//! The backing directory: file contents materialised from the log, and the snapshot of the
//! tree they correspond to.
//!
//! Layout: `DIR/data/<inode>` holds the contents of each regular file by inode number (names
//! live only in the tree, so a rename or a hard link moves no data); `DIR/snapshot` is the
//! [`Tree`] as of the last checkpoint, replaced atomically (written aside, fsync'ed, renamed,
//! the directory fsync'ed).
//!
//! Private by default, as the daemon's files are (issue 54): directories it creates are
//! `0700` and files `0600` whatever the umask (a file system's contents are its owner's; the
//! mount itself, not its backing files, is where others are let in). Directories that exist
//! already keep the mode the operator gave them.
//!
//! Invariants: the snapshot's `applied` LSN never runs ahead of the data files: the
//! materialiser fsyncs every data file it touched before it replaces the snapshot. Data files
//! may run ahead of the snapshot (a crash between the two), which replay repairs: applying a
//! file's records again in order leaves it as applying them once did.

use crate::tree::Tree;
use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

pub struct Backing {
    dir: PathBuf,
    /// Read-only descriptors of data files, opened on first read. A file dropped by the
    /// materialiser stays readable through its old descriptor, which is harmless: a dropped
    /// inode is never read again.
    readers: Mutex<HashMap<u64, Arc<File>>>,
}

impl Backing {
    /// Opens (creating if needed) the backing directory and reads its snapshot; a directory
    /// without one starts an empty file system owned by `uid`/`gid`.
    pub fn open(dir: &Path, uid: u32, gid: u32) -> io::Result<(Backing, Tree)> {
        std::os::unix::fs::DirBuilderExt::mode(fs::DirBuilder::new().recursive(true), 0o700)
            .create(dir.join("data"))?;
        let backing = Backing {
            dir: dir.to_owned(),
            readers: Mutex::new(HashMap::new()),
        };
        let tree = match fs::read(backing.snapshot_path()) {
            Ok(bytes) => Tree::decode(&bytes).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}: {e}", backing.snapshot_path().display()),
                )
            })?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let tree = Tree::new(uid, gid);
                backing.save_snapshot(&tree)?;
                tree
            }
            Err(e) => return Err(e),
        };
        Ok((backing, tree))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn snapshot_path(&self) -> PathBuf {
        self.dir.join("snapshot")
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    pub fn data_path(&self, ino: u64) -> PathBuf {
        self.dir.join("data").join(ino.to_string())
    }

    /// Reads what the backing file holds at `offset` into `buf`; bytes past its end (or of a
    /// file not materialised yet) are left as they are (the caller zero-fills).
    pub fn read_at(&self, ino: u64, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let file = {
            let mut readers = self.readers.lock().expect("readers lock");
            match readers.get(&ino) {
                Some(file) => Arc::clone(file),
                None => match File::open(self.data_path(ino)) {
                    Ok(file) => {
                        let file = Arc::new(file);
                        readers.insert(ino, Arc::clone(&file));
                        file
                    }
                    Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
                    Err(e) => return Err(e),
                },
            }
        };
        let mut done = 0;
        while done < buf.len() {
            match file.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Forgets the read descriptor of a dropped inode.
    pub fn forget(&self, ino: u64) {
        self.readers.lock().expect("readers lock").remove(&ino);
    }

    /// Opens a data file for the materialiser, creating it (never truncating: replay may
    /// reopen a file that already holds later records).
    pub fn open_for_write(&self, ino: u64) -> io::Result<File> {
        private(OpenOptions::new().read(true).write(true).create(true))
            .truncate(false)
            .open(self.data_path(ino))
    }

    /// Replaces the snapshot atomically and durably.
    pub fn save_snapshot(&self, tree: &Tree) -> io::Result<()> {
        let aside = self.dir.join("snapshot.new");
        let mut file =
            private(OpenOptions::new().write(true).create(true).truncate(true)).open(&aside)?;
        file.write_all(&tree.encode())?;
        file.sync_all()?;
        fs::rename(&aside, self.snapshot_path())?;
        sync_dir(&self.dir)
    }
}

/// Files this module creates are readable by their owner alone (0600).
fn private(options: &mut OpenOptions) -> &mut OpenOptions {
    std::os::unix::fs::OpenOptionsExt::mode(options, 0o600)
}

pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    /// Under the common umask 022 the backing directory, its data directory, the snapshot and
    /// a data file are its owner's alone (they were 0755 and 0644 before).
    #[test]
    fn backing_files_are_private_under_umask_022() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("backing");
        // SAFETY: umask only sets this process's file-creation mask; it cannot fail.
        let old = unsafe { libc::umask(0o022) };
        let (backing, _tree) = Backing::open(&dir, 0, 0).unwrap();
        drop(backing.open_for_write(7).unwrap());
        // SAFETY: as above.
        unsafe { libc::umask(old) };
        assert_eq!(mode(&dir), 0o700, "the backing directory");
        assert_eq!(mode(&dir.join("data")), 0o700, "its data directory");
        assert_eq!(mode(&dir.join("snapshot")), 0o600, "the snapshot");
        assert_eq!(mode(&backing.data_path(7)), 0o600, "a data file");
    }
}
