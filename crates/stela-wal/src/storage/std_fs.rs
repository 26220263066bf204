//! [`Storage`] on the real file system: positioned reads and writes, fdatasync, fallocate.
//!
//! Files are private: the directories it creates are [`DIR_MODE`] (0700) and the files
//! [`FILE_MODE`] (0600), whatever the umask (a umask only takes permissions away), because a
//! log holds the database's records and nobody but its owner may read them. A name is never
//! followed through a symbolic link when it is opened (`O_NOFOLLOW`): a link planted in a log's
//! directory cannot send a segment's bytes elsewhere.

use super::{OpenMode, Storage, StorageFile};
use std::fs::{self, File, OpenOptions};
use std::io::{self, IoSlice};
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::Path;

/// Mode of every directory this storage creates: its owner's alone.
pub const DIR_MODE: u32 = 0o700;
/// Mode of every file this storage creates (segments, the lock, the small state files).
pub const FILE_MODE: u32 = 0o600;

/// Buffers passed to one `pwritev` call: Linux's `IOV_MAX`.
const MAX_IOVECS: usize = 1024;

/// The operating system's file system.
#[derive(Debug, Default, Clone, Copy)]
pub struct StdStorage;

#[derive(Debug)]
struct StdFile(File);

impl Storage for StdStorage {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        // Only the directories made here get the mode; existing ones keep the operator's.
        fs::DirBuilder::new()
            .recursive(true)
            .mode(DIR_MODE)
            .create(dir)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in fs::read_dir(dir)? {
            let name = entry?.file_name();
            // Names that are not UTF-8 cannot be ours; skip them rather than fail.
            if let Some(name) = name.to_str() {
                names.push(name.to_string());
            }
        }
        Ok(names)
    }

    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn StorageFile>> {
        let mut options = OpenOptions::new();
        match mode {
            OpenMode::Read => options.read(true),
            OpenMode::ReadWrite => options.read(true).write(true),
            OpenMode::CreateNew => options
                .read(true)
                .write(true)
                .create_new(true)
                .mode(FILE_MODE),
        };
        options.custom_flags(libc::O_NOFOLLOW);
        Ok(Box::new(StdFile(options.open(path)?)))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }

    fn lock_dir(&self, dir: &Path) -> io::Result<Box<dyn Send + Sync>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(FILE_MODE)
            .custom_flags(libc::O_NOFOLLOW)
            .open(dir.join("LOCK"))?;
        match file.try_lock() {
            Ok(()) => Ok(Box::new(file)),
            Err(fs::TryLockError::WouldBlock) => Err(io::ErrorKind::WouldBlock.into()),
            Err(fs::TryLockError::Error(error)) => Err(error),
        }
    }
}

impl StorageFile for StdFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.0.read_at(buf, offset)
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.0.write_all_at(buf, offset)
    }

    fn write_all_vectored_at(&self, bufs: &[&[u8]], mut offset: u64) -> io::Result<()> {
        let mut slices: Vec<IoSlice<'_>> = bufs
            .iter()
            .filter(|buf| !buf.is_empty())
            .map(|buf| IoSlice::new(buf))
            .collect();
        let mut rest = &mut slices[..];
        while !rest.is_empty() {
            let batch = rest.len().min(MAX_IOVECS);
            match rustix::io::pwritev(&self.0, &rest[..batch], offset) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(written) => {
                    offset += written as u64;
                    IoSlice::advance_slices(&mut rest, written);
                }
                Err(rustix::io::Errno::INTR) => {}
                Err(errno) => return Err(errno.into()),
            }
        }
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }

    fn start_writeback(&self) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        // SAFETY: sync_file_range only reads its integer arguments; the descriptor is this
        // file's, open for as long as `self` lives. Offset 0 and length 0 mean the whole file;
        // SYNC_FILE_RANGE_WRITE alone starts writeback of its dirty pages without waiting for
        // it (or making anything durable).
        let started =
            unsafe { libc::sync_file_range(self.0.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE) };
        if started == 0 {
            return Ok(());
        }
        let error = io::Error::last_os_error();
        match error.raw_os_error() {
            // A file the call does not apply to (not a regular file, a file system without
            // it): a hint not taken, and the sync still does its work.
            Some(libc::EINVAL | libc::ESPIPE | libc::ENOSYS | libc::EOPNOTSUPP) => Ok(()),
            // EIO, ENOSPC and the rest: as a failed write, never passed over.
            _ => Err(error),
        }
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }

    fn allocate(&self, len: u64) -> io::Result<()> {
        let current = self.len()?;
        if current >= len {
            return Ok(());
        }
        match rustix::fs::fallocate(&self.0, rustix::fs::FallocateFlags::empty(), 0, len) {
            Ok(()) => Ok(()),
            // File systems without fallocate (tmpfs on old kernels, some network file systems):
            // write the zeros ourselves, which reserves the space just as well.
            Err(errno)
                if errno == rustix::io::Errno::OPNOTSUPP || errno == rustix::io::Errno::NOSYS =>
            {
                let zeros = vec![0u8; 1 << 20];
                let mut at = current;
                while at < len {
                    let n = (len - at).min(zeros.len() as u64) as usize;
                    self.0.write_all_at(&zeros[..n], at)?;
                    at += n as u64;
                }
                Ok(())
            }
            Err(errno) => Err(errno.into()),
        }
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }

    fn data_regions(&self, from: u64) -> io::Result<Vec<std::ops::Range<u64>>> {
        use rustix::fs::{seek, SeekFrom};
        let len = self.len()?;
        let mut regions = Vec::new();
        let mut at = from;
        while at < len {
            let data = match seek(&self.0, SeekFrom::Data(at)) {
                Ok(data) => data,
                // Nothing but a hole after `at`.
                Err(rustix::io::Errno::NXIO) => break,
                // The file system cannot tell: everything may be data.
                Err(_) => {
                    regions.push(at..len);
                    break;
                }
            };
            let hole = seek(&self.0, SeekFrom::Hole(data)).map_or(len, |hole| hole.min(len));
            if data >= hole {
                break;
            }
            regions.push(data..hole);
            at = hole;
        }
        Ok(regions)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{OpenMode, Storage};

    /// Reading only data regions must give exactly the bytes a plain read gives, whether the
    /// rest is preallocated, a sparse hole or written zeros.
    #[test]
    fn hole_aware_read_equals_a_full_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let file = StdStorage.open(&path, OpenMode::CreateNew).unwrap();
        file.allocate(1 << 20).unwrap();
        file.write_all_at(b"head", 0).unwrap();
        file.write_all_at(&[7u8; 5000], 300_000).unwrap();
        file.set_len(3 << 20).unwrap(); // a sparse hole after the preallocated part
        file.write_all_at(b"tail", (3 << 20) - 4).unwrap();
        let mut full = vec![0u8; 3 << 20];
        file.read_exact_at(&mut full, 0).unwrap();
        assert_eq!(file.read_to_vec().unwrap(), full);
    }

    /// Starting writeback is accepted on a real file with dirty pages (and on a read-only
    /// one, which has none), changes no byte, and leaves the file to sync as before.
    #[test]
    fn starting_writeback_changes_nothing_but_when_bytes_reach_the_disk() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let file = StdStorage.open(&path, OpenMode::CreateNew).unwrap();
        let bytes: Vec<u8> = (0..(1 << 20)).map(|i| (i % 253) as u8).collect();
        file.write_all_at(&bytes, 4096).unwrap();
        file.start_writeback().unwrap();
        file.write_all_at(b"after", 0).unwrap();
        file.start_writeback().unwrap();
        file.sync_data().unwrap();
        let read = StdStorage.open(&path, OpenMode::Read).unwrap();
        read.start_writeback().unwrap();
        let mut back = vec![0u8; bytes.len()];
        read.read_exact_at(&mut back, 4096).unwrap();
        assert_eq!(back, bytes);
        let mut head = [0u8; 5];
        read.read_exact_at(&mut head, 0).unwrap();
        assert_eq!(&head, b"after");

        // On a file the call does not apply to (a FIFO: ESPIPE) the hint is not taken, and that
        // is no error.
        let fifo = dir.path().join("fifo");
        let name = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo reads the NUL-terminated path, which lives until the call returns.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
        // Opened for reading and writing, a FIFO does not wait for a peer on Linux.
        let fifo = StdStorage.open(&fifo, OpenMode::ReadWrite).unwrap();
        fifo.start_writeback().unwrap();
    }

    /// A vectored write puts its buffers back to back, also past the kernel's per-call limit
    /// on buffers (which makes it take several calls) and with empty buffers among them.
    #[test]
    fn vectored_writes_land_back_to_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let file = StdStorage.open(&path, OpenMode::CreateNew).unwrap();
        let pieces: Vec<Vec<u8>> = (0..(MAX_IOVECS * 2 + 7))
            .map(|i| vec![(i % 251) as u8; i % 5])
            .collect();
        let bufs: Vec<&[u8]> = pieces.iter().map(Vec::as_slice).collect();
        file.write_all_at(b"head", 0).unwrap();
        file.write_all_vectored_at(&bufs, 4).unwrap();
        let mut expected = b"head".to_vec();
        expected.extend(pieces.concat());
        assert_eq!(std::fs::read(&path).unwrap(), expected);
    }
}
