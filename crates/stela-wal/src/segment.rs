//! Segment files on storage: listing them, creating them safely, reading their headers.
//!
//! Invariants this module keeps:
//! - A file named `<lsn>.wal` always has a complete, synced header: a segment is prepared under
//!   a temporary name (allocated to full size, header written, fdatasync'ed) and only then
//!   renamed into place, and the directory is fsync'ed before any record is written into it.
//! - Segments are preallocated to their full capacity, so writing records never grows the file
//!   (fdatasync then flushes data only, and a full disk shows up when a segment is created, not
//!   in the middle of a commit), and unwritten space reads as zeros.

use crate::error::{Error, Result};
use crate::storage::{OpenMode, Storage, StorageFile};
use std::path::{Path, PathBuf};
use stela_format::header::{SegmentHeader, HEADER_BYTES};
use stela_format::segment_name::{
    parse_segment_file_name, segment_file_name, temp_file_name, TEMP_SUFFIX,
};
use stela_format::Lsn;

/// A segment file present in the log directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentFile {
    /// First LSN, from the file name.
    pub start: Lsn,
    pub path: PathBuf,
}

/// The segment files and leftover temporary files of a directory, in log order.
pub(crate) struct Listing {
    pub segments: Vec<SegmentFile>,
    pub temp_files: Vec<PathBuf>,
}

pub(crate) fn list(storage: &dyn Storage, dir: &Path) -> Result<Listing> {
    let names = storage.list(dir).map_err(|e| Error::io("list", dir, e))?;
    let mut segments = Vec::new();
    let mut temp_files = Vec::new();
    for name in names {
        if let Some(start) = parse_segment_file_name(&name) {
            segments.push(SegmentFile {
                start,
                path: dir.join(&name),
            });
        } else if name.ends_with(TEMP_SUFFIX) {
            temp_files.push(dir.join(&name));
        }
    }
    segments.sort_by_key(|s| s.start);
    Ok(Listing {
        segments,
        temp_files,
    })
}

/// Reads and decodes a segment's header.
pub(crate) fn read_header(file: &dyn StorageFile, path: &Path) -> Result<SegmentHeader> {
    let mut bytes = [0u8; HEADER_BYTES];
    let len = file.len().map_err(|e| Error::io("stat", path, e))?;
    let available = len.min(HEADER_BYTES as u64) as usize;
    file.read_exact_at(&mut bytes[..available], 0)
        .map_err(|e| Error::io("read header of", path, e))?;
    SegmentHeader::decode(&bytes[..available]).map_err(|reason| Error::BadHeader {
        segment: path.to_path_buf(),
        reason,
    })
}

/// Creates the segment described by `header` in `dir`, durably, and returns it open for writing.
pub(crate) fn create(
    storage: &dyn Storage,
    dir: &Path,
    header: &SegmentHeader,
) -> Result<Box<dyn StorageFile>> {
    let temp = dir.join(temp_file_name(header.start_lsn));
    let path = dir.join(segment_file_name(header.start_lsn));
    // A leftover from a crash during an earlier attempt is incomplete by definition.
    let _ = storage.remove(&temp);
    let file = storage
        .open(&temp, OpenMode::CreateNew)
        .map_err(|e| Error::io("create", &temp, e))?;
    let result = (|| {
        file.allocate(header.capacity)
            .map_err(|e| Error::io("preallocate", &temp, e))?;
        file.write_all_at(&header.encode(), 0)
            .map_err(|e| Error::io("write header of", &temp, e))?;
        file.sync_data()
            .map_err(|e| Error::io("fdatasync", &temp, e))?;
        storage
            .rename(&temp, &path)
            .map_err(|e| Error::io("rename", &temp, e))?;
        storage
            .sync_dir(dir)
            .map_err(|e| Error::io("fsync directory", dir, e))
    })();
    if let Err(error) = result {
        // Leave no half-made segment behind (best effort: the error we report is the first one).
        let _ = storage.remove(&temp);
        return Err(error);
    }
    Ok(file)
}
