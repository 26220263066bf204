//! Segment files on storage: listing them and reading their headers. (Creating one, durably,
//! is the segment writer's: [`crate::writer::create`].)

use crate::error::{Error, Result};
use crate::storage::{Storage, StorageFile};
use std::path::{Path, PathBuf};
use stela_format::header::{SegmentHeader, HEADER_BYTES};
use stela_format::segment_name::{parse_segment_file_name, TEMP_SUFFIX};
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
