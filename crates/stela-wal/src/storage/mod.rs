//! The I/O boundary of the log: every byte the log reads or writes goes through [`Storage`].
//!
//! The product uses [`StdStorage`], the real file system. With the `testing` feature (tests of
//! this crate, and the crates whose tests and benchmarks need them, enable it) come the test
//! storages:
//! - `FaultStorage`, an in-memory file system that remembers which bytes and which directory
//!   entries were made durable, so tests can "pull the plug": lose every unsynced write, tear the
//!   last one, keep any subset of the sectors of unsynced writes (a drive persists them in any
//!   order), fail an fsync, or run out of space. Because the log never touches `std::fs`
//!   directly, any I/O that bypassed this trait would show up as a file the fault layer does not
//!   know about.
//! - `Hooked`, the one forwarding wrapper: it passes every call to a wrapped storage and lets a
//!   test's `Hooks` stall, fail, count or record calls on the way.
//! - `GatedStorage`, a `Hooked` storage whose writes and syncs can be stalled or slowed on
//!   demand, for tests and benchmarks of what sits above the log when the disk hangs.
//!
//! The contract the log relies on, and which `FaultStorage` models:
//! - `write_all_at` data is volatile until `sync_data` on that file returns `Ok`; until then a
//!   power cut may keep any part of it, sector by sector.
//! - A created, renamed or removed name is volatile until `sync_dir` on its directory returns.
//! - After a failed `sync_data` nothing is known about which of the file's writes are durable,
//!   and a later `sync_data` proves nothing about them (Linux may drop the dirty pages and clear
//!   the error). The log therefore never retries a failed sync: it stops.

#[cfg(any(test, feature = "testing"))]
mod fault;
#[cfg(any(test, feature = "testing"))]
mod gated;
#[cfg(any(test, feature = "testing"))]
mod hooked;
mod std_fs;

#[cfg(any(test, feature = "testing"))]
pub use fault::{CrashPlan, FaultStorage, SECTOR_BYTES};
#[cfg(any(test, feature = "testing"))]
pub use gated::{Gate, GatedStorage};
#[cfg(any(test, feature = "testing"))]
pub use hooked::{Call, Hooked, Hooks};
pub use std_fs::{StdStorage, DIR_MODE, FILE_MODE};

use std::fmt;
use std::io;
use std::path::Path;

/// How to open a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenMode {
    /// Read only; the file must exist.
    Read,
    /// Read and write; the file must exist.
    ReadWrite,
    /// Read and write a new, empty file; fails if the name exists.
    CreateNew,
}

/// A directory of files, as the log needs it.
pub trait Storage: Send + Sync + fmt::Debug + 'static {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// Names (not paths) of the entries of `dir`.
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn StorageFile>>;
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// Makes creations, renames and removals in `dir` durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// Takes an exclusive lock on `dir` for this process, held until the guard is dropped.
    /// Fails with `WouldBlock` if another holder has it.
    fn lock_dir(&self, dir: &Path) -> io::Result<Box<dyn Send + Sync>>;
}

/// One open file.
pub trait StorageFile: Send + Sync + fmt::Debug {
    /// Reads up to `buf.len()` bytes at `offset`; returns how many were read (0 at the end).
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Writes `bufs` back to back from `offset` on, as one positioned write where the storage
    /// can (the real file system uses `pwritev`). The default writes them one after the other.
    fn write_all_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        let mut at = offset;
        for buf in bufs {
            self.write_all_at(buf, at)?;
            at += buf.len() as u64;
        }
        Ok(())
    }
    /// Makes this file's written data durable (fdatasync).
    fn sync_data(&self) -> io::Result<()>;
    /// Starts writing this file's written data to the device and returns without waiting; it
    /// makes nothing durable (only [`StorageFile::sync_data`] does, and must still be called).
    /// A writer that syncs a large batch at the end calls it as it goes, so that the batch
    /// does not reach the device all at once when it syncs, queued ahead of every other
    /// file's small syncs (the log's). The default does nothing: a storage without a page
    /// cache has nothing to start.
    fn start_writeback(&self) -> io::Result<()> {
        Ok(())
    }
    fn len(&self) -> io::Result<u64>;
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }
    /// Grows the file to at least `len` bytes of zeros, reserving the space now so later writes
    /// within it cannot fail for lack of space.
    fn allocate(&self, len: u64) -> io::Result<()>;
    fn set_len(&self, len: u64) -> io::Result<()>;

    /// The stretches of the file from `from` on that may hold data, in order; everything
    /// outside them reads as zeros. The default says "all of it"; the real file system asks
    /// for the holes (`SEEK_DATA`/`SEEK_HOLE`), which include the preallocated, never written
    /// rest of a segment, so checking that rest costs nothing.
    fn data_regions(&self, from: u64) -> io::Result<Vec<std::ops::Range<u64>>> {
        let len = self.len()?;
        // One region, the whole rest of the file.
        Ok(std::iter::once(from..len)
            .filter(|r| !r.is_empty())
            .collect())
    }

    /// Reads exactly `buf.len()` bytes at `offset`, or fails with `UnexpectedEof`.
    fn read_exact_at(&self, mut buf: &mut [u8], mut offset: u64) -> io::Result<()> {
        while !buf.is_empty() {
            match self.read_at(buf, offset)? {
                0 => return Err(io::ErrorKind::UnexpectedEof.into()),
                n => {
                    buf = &mut buf[n..];
                    offset += n as u64;
                }
            }
        }
        Ok(())
    }

    /// Reads the whole file (only its [`StorageFile::data_regions`]; the rest is zeros).
    fn read_to_vec(&self) -> io::Result<Vec<u8>> {
        let len = usize::try_from(self.len()?).map_err(|_| io::ErrorKind::OutOfMemory)?;
        // A large zeroed allocation maps the kernel's zero pages: holes cost no memory traffic.
        let mut out = vec![0u8; len];
        for region in self.data_regions(0)? {
            let (start, end) = (region.start as usize, (region.end as usize).min(len));
            self.read_exact_at(&mut out[start..end], region.start)?;
        }
        Ok(out)
    }
}

/// Creates `dir` and its missing ancestors, and makes their names durable: the parent of each
/// directory made here is synced once the directory exists, from the top down, and so is
/// `dir`'s own parent in any case (an earlier run may have made `dir` and lost power before
/// syncing it). A log's directory must outlive a power cut as surely as its synced segments:
/// on a file system that keeps a name only once its directory is synced, a log whose
/// directory's name was lost loses every record acknowledged at `disk` (found by the power-cut
/// layer, `crates/stela-cli/tests/power_cut.rs`).
pub fn create_dir_durably(storage: &dyn Storage, dir: &Path) -> io::Result<()> {
    let made: Vec<&Path> = dir
        .ancestors()
        .filter(|d| !d.as_os_str().is_empty())
        .take_while(|d| storage.list(d).is_err())
        .collect();
    storage.create_dir_all(dir)?;
    let parents = made
        .iter()
        .rev()
        .filter_map(|d| d.parent())
        .chain(dir.parent())
        .filter(|p| !p.as_os_str().is_empty());
    let mut synced: Vec<&Path> = Vec::new();
    for parent in parents {
        if !synced.contains(&parent) {
            storage.sync_dir(parent)?;
            synced.push(parent);
        }
    }
    Ok(())
}

/// Whether an I/O error means the device or quota is full.
pub fn is_out_of_space(error: &io::Error) -> bool {
    error.kind() == io::ErrorKind::StorageFull
        || error.raw_os_error() == Some(rustix::io::Errno::NOSPC.raw_os_error())
        || error.raw_os_error() == Some(rustix::io::Errno::DQUOT.raw_os_error())
}
