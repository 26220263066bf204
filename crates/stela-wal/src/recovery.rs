//! Opening a log directory: finding the segments, checking them, repairing a torn tail.
//!
//! The outcome is either an error that names the file and offset (and changed nothing on disk),
//! or a [`Recovered`] log positioned after its last valid record, plus a [`RecoveryReport`] of
//! what was found and done. See [`crate::scan`] for how a bad spot is classified.

use crate::error::{Corruption, Error, Result};
use crate::options::{RecoveryMode, WalOptions};
use crate::scan::{scan_segment_marked, Damage, TornTail};
use crate::segment::{self, SegmentFile};
use crate::storage::{OpenMode, Storage, StorageFile};
use crate::synced::{self, SyncedMark};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;
use stela_format::frame::{self, Decoded, Layout};
use stela_format::header::MAX_CAPACITY_V2;
use stela_format::segment_name::segment_file_name;
use stela_format::{Codec, Lsn, SegmentHeader, TypeTag};

/// What opening the log found and did.
#[derive(Debug, Clone, Default)]
pub struct RecoveryReport {
    /// Segment files in the log after recovery.
    pub segments: usize,
    /// Records checked at open (all of them, unless `verify_on_open` was off).
    pub records_verified: u64,
    /// First and last LSN present (both `Lsn::ZERO` for an empty log).
    pub first_lsn: Lsn,
    pub last_lsn: Lsn,
    /// A torn write removed from the end of the last segment.
    pub torn_tail: Option<(PathBuf, TornTail)>,
    /// Damage skipped (`SkipCorrupt`) or cut away (`KeepValidPrefix`).
    pub damage: Vec<(PathBuf, Damage)>,
    /// Where removed bytes and segments were put, if anything was removed.
    pub salvage_dir: Option<PathBuf>,
    /// Records with good checksums that a repair cut from inside a segment (after a torn
    /// write or damage), each run of consecutive LSNs kept as an ordinary log in the salvage
    /// folder: `(first LSN, last LSN, its directory)`. `stela wal dump` reads each.
    pub salvaged_records: Vec<(Lsn, Lsn, PathBuf)>,
    /// Incomplete segment preparations deleted.
    pub removed_temp_files: Vec<PathBuf>,
}

/// The log after recovery, ready for appends.
pub(crate) struct Recovered {
    pub segments: Vec<SegmentFile>,
    pub tail: Box<dyn StorageFile>,
    pub tail_header: SegmentHeader,
    pub write_offset: u64,
    /// Where the data recovery kept in the newest segment ends (below `write_offset` when
    /// that is the capacity of a segment that must not be written): synced, and marked.
    pub data_end: u64,
    pub next_lsn: Lsn,
    pub report: RecoveryReport,
    pub lock: Box<dyn Send + Sync>,
    pub mark: Arc<SyncedMark>,
}

/// What the caller expects the log to hold.
pub(crate) struct Expect {
    pub codec: Codec,
    pub type_tag: TypeTag,
}

pub(crate) fn recover(
    dir: &Path,
    options: &WalOptions,
    expect: &Expect,
    keep_removed_bytes: bool,
) -> Result<Recovered> {
    if options.segment_bytes > MAX_CAPACITY_V2 {
        return Err(Error::SegmentTooLarge {
            bytes: options.segment_bytes,
            max: MAX_CAPACITY_V2,
        });
    }
    let storage = options.storage.as_ref();
    if options.create_if_missing {
        storage
            .create_dir_all(dir)
            .map_err(|e| Error::io("create directory", dir, e))?;
    } else if storage.list(dir).is_err() {
        return Err(Error::NotFound {
            dir: dir.to_path_buf(),
        });
    }
    let lock = storage.lock_dir(dir).map_err(|e| {
        if e.kind() == std::io::ErrorKind::WouldBlock {
            Error::Locked {
                dir: dir.to_path_buf(),
            }
        } else {
            Error::io("lock", dir, e)
        }
    })?;
    let listing = segment::list(storage, dir)?;
    let mut report = RecoveryReport::default();
    for temp in &listing.temp_files {
        storage
            .remove(temp)
            .map_err(|e| Error::io("remove", temp, e))?;
        report.removed_temp_files.push(temp.clone());
    }
    if !listing.temp_files.is_empty() {
        storage
            .sync_dir(dir)
            .map_err(|e| Error::io("fsync directory", dir, e))?;
    }

    let mut segments = listing.segments;
    if segments.is_empty() {
        let header = new_header(options, expect, 0, Lsn::FIRST);
        let tail = crate::writer::create(storage, dir, &header)?;
        let data_end = stela_format::header::HEADER_BYTES as u64;
        let on_disk = synced::read(storage, dir)?;
        let mark = SyncedMark::open(storage, dir, on_disk, Lsn::FIRST, data_end)?;
        report.segments = 1;
        return Ok(Recovered {
            segments: vec![SegmentFile {
                start: Lsn::FIRST,
                path: dir.join(segment_file_name(Lsn::FIRST)),
            }],
            tail,
            tail_header: header,
            write_offset: data_end,
            data_end,
            next_lsn: Lsn::FIRST,
            report,
            lock,
            mark,
        });
    }

    // How far the newest segment was synced when its last recorded sync returned: below it,
    // nothing is a torn write.
    let on_disk = synced::read(storage, dir)?;
    let newest_start = segments.last().map(|s| s.start);
    let synced_mark = on_disk
        .filter(|m| Some(m.segment_start) == newest_start)
        .map_or(stela_format::header::HEADER_BYTES as u64, |m| {
            m.synced_offset
        });
    let max_payload = options.effective_max_record() as u32;
    let skip = options.recovery == RecoveryMode::SkipCorrupt;
    let mut expected_start: Option<Lsn> = None;
    let mut index = 0;
    let mut scratch = Vec::new();
    let (tail, tail_header, write_offset, data_end, next_lsn) = loop {
        let seg = segments[index].clone();
        let is_last = index + 1 == segments.len();
        let mode = if is_last {
            OpenMode::ReadWrite
        } else {
            OpenMode::Read
        };
        let file = storage
            .open(&seg.path, mode)
            .map_err(|e| Error::io("open", &seg.path, e))?;
        let header = segment::read_header(file.as_ref(), &seg.path)?;
        check_header(&seg, &header, expect)?;
        if let Some(expected) = expected_start.filter(|&e| e != seg.start) {
            let damage = Damage {
                offset: 0,
                expected_lsn: expected,
                reason: format!(
                    "records {expected}..{} are missing: a segment file was lost or removed",
                    seg.start
                ),
                resumes_at: Some(stela_format::header::HEADER_BYTES as u64),
            };
            match options.recovery {
                RecoveryMode::Strict | RecoveryMode::KeepValidPrefix => {
                    // Cutting at a missing segment would cut everything after it: refuse even in
                    // salvage mode, an operator must look at this.
                    return Err(corruption(&seg.path, &damage));
                }
                RecoveryMode::SkipCorrupt => report.damage.push((seg.path.clone(), damage)),
            }
        }

        if !(options.verify_on_open || is_last) {
            expected_start = None;
            index += 1;
            continue;
        }
        // Segments are normally clean: check them streaming; only a finding sends us to the
        // whole-file scan below, which classifies it.
        let layout = header.layout;
        let mark = if is_last {
            synced_mark
        } else {
            stela_format::header::HEADER_BYTES as u64
        };
        if let Some(clean) = check_clean(
            file.as_ref(),
            &seg,
            layout,
            max_payload,
            &mut scratch,
            CHECK_CHUNK,
        )?
        .filter(|clean| clean.end_offset >= mark)
        {
            report.records_verified += clean.records;
            if report.first_lsn == Lsn::ZERO {
                report.first_lsn = clean.first_lsn.unwrap_or(Lsn::ZERO);
            }
            if is_last {
                break (
                    file,
                    header,
                    clean.end_offset,
                    clean.end_offset,
                    clean.next_lsn,
                );
            }
            expected_start = Some(clean.next_lsn);
            index += 1;
            continue;
        }
        let bytes = file
            .read_to_vec()
            .map_err(|e| Error::io("read", &seg.path, e))?;
        let scan = scan_segment_marked(&bytes, seg.start, layout, is_last, max_payload, skip, mark);
        report.records_verified += scan.records;
        if report.first_lsn == Lsn::ZERO {
            report.first_lsn = scan.first_lsn.unwrap_or(Lsn::ZERO);
        }

        if let Some(damage) = scan.damage.first() {
            match options.recovery {
                RecoveryMode::Strict => return Err(corruption(&seg.path, damage)),
                RecoveryMode::SkipCorrupt => {
                    report
                        .damage
                        .extend(scan.damage.iter().map(|d| (seg.path.clone(), d.clone())));
                }
                RecoveryMode::KeepValidPrefix => {
                    let salvage = salvage_dir(dir, &mut report, damage.expected_lsn);
                    storage
                        .create_dir_all(&salvage)
                        .map_err(|e| Error::io("create directory", &salvage, e))?;
                    let file = storage
                        .open(&seg.path, OpenMode::ReadWrite)
                        .map_err(|e| Error::io("open", &seg.path, e))?;
                    let kept = keep_valid_records(
                        storage,
                        &salvage,
                        &header,
                        &bytes,
                        damage.offset as usize,
                        damage.expected_lsn,
                        max_payload,
                    )?;
                    report.salvaged_records.extend(kept);
                    cut(
                        storage,
                        &salvage,
                        &seg.path,
                        file.as_ref(),
                        &bytes,
                        damage.offset,
                    )?;
                    for later in segments.drain(index + 1..) {
                        let to = salvage.join(later.path.file_name().expect("segment name"));
                        storage
                            .rename(&later.path, &to)
                            .map_err(|e| Error::io("move aside", &later.path, e))?;
                    }
                    for synced in [&salvage, dir] {
                        storage
                            .sync_dir(synced)
                            .map_err(|e| Error::io("fsync directory", synced, e))?;
                    }
                    report.damage.push((seg.path.clone(), damage.clone()));
                    let next = scan.last_lsn.map_or(seg.start, Lsn::next);
                    break (file, header, scan.end_offset, scan.end_offset, next);
                }
            }
        }
        if let Some(torn) = &scan.torn_tail {
            if keep_removed_bytes {
                let salvage =
                    salvage_dir(dir, &mut report, scan.last_lsn.map_or(seg.start, Lsn::next));
                storage
                    .create_dir_all(&salvage)
                    .map_err(|e| Error::io("create directory", &salvage, e))?;
                let kept = keep_valid_records(
                    storage,
                    &salvage,
                    &header,
                    &bytes,
                    torn.offset as usize,
                    scan.last_lsn.map_or(seg.start, Lsn::next),
                    max_payload,
                )?;
                report.salvaged_records.extend(kept);
                cut(
                    storage,
                    &salvage,
                    &seg.path,
                    file.as_ref(),
                    &bytes,
                    torn.offset,
                )?;
                storage
                    .sync_dir(&salvage)
                    .map_err(|e| Error::io("fsync directory", &salvage, e))?;
            } else {
                zero(file.as_ref(), &seg.path, torn.offset, torn.bytes)?;
            }
            tracing::warn!(
                segment = %seg.path.display(),
                offset = torn.offset,
                bytes = torn.bytes,
                "removed a torn write from the end of the log: {}",
                torn.reason
            );
            report.torn_tail = Some((seg.path.clone(), torn.clone()));
        }
        let next = scan.last_lsn.map_or(seg.start, Lsn::next);
        if is_last && !scan.damage.is_empty() {
            // Skip mode left damage in the newest segment. New records must not go after it:
            // bytes appended there could complete a damaged frame into one that checks out, and
            // the next scan would read a different log. So report the segment as full: the
            // first append seals it as it is and starts a new segment (whose first LSN is above
            // the valid record that ended the damage, so the names cannot clash). Opening
            // still changes nothing on disk.
            let full = header.capacity;
            break (file, header, full, scan.end_offset, next);
        }
        if is_last {
            break (file, header, scan.end_offset, scan.end_offset, next);
        }
        expected_start = Some(next);
        index += 1;
    };

    // Writers write version 2 frames only, so a version 1 newest segment (from an older build)
    // is reported full, like a damaged one in skip mode: the first append starts a new segment.
    let write_offset = if tail_header.layout == Layout::CURRENT {
        write_offset
    } else {
        write_offset.max(tail_header.capacity)
    };
    // A segment cut short by a crash during preallocation would make later writes grow the file.
    tail.allocate(tail_header.capacity)
        .map_err(|e| Error::io("preallocate", &segments[segments.len() - 1].path, e))?;
    // The log reports every record found here as durable (`durable_lsn`, and `commit` of them
    // returns at once), but after a process crash the newest segment's last records may still
    // be only in the OS cache: sync them so that a power cut now cannot take back what this
    // open hands out as durable. (Older segments were synced before their successor existed.)
    tail.sync_data()
        .map_err(|e| Error::io("fdatasync", &segments[segments.len() - 1].path, e))?;
    // Now that the data is synced, record how far: a later open then calls any change below
    // it damage. Rewritten whenever it differs (a repair may have cut below an older mark).
    let mark = SyncedMark::open(storage, dir, on_disk, tail_header.start_lsn, data_end)?;
    report.segments = segments.len();
    report.last_lsn = Lsn::new(next_lsn.get() - 1);
    if report.first_lsn == Lsn::ZERO && report.last_lsn != Lsn::ZERO {
        report.first_lsn = segments[0].start;
    }
    Ok(Recovered {
        segments,
        tail,
        tail_header,
        write_offset,
        data_end,
        next_lsn,
        report,
        lock,
        mark,
    })
}

/// What [`check_clean`] found in a clean segment.
struct CleanSegment {
    records: u64,
    first_lsn: Option<Lsn>,
    next_lsn: Lsn,
    /// Where the records end (and the next one would be written).
    end_offset: u64,
}

/// Bytes read at a time by [`check_clean`].
const CHECK_CHUNK: usize = 4 << 20;

/// Checks that a segment is clean: every frame in sequence with a good checksum, then only
/// zeros to the end of the file. Returns `None` at the first thing that is not so, without
/// judging it: the caller then runs the whole-file [`scan_segment`], which tells a torn tail
/// from damage and says where. This fast path reads through one reused buffer and skips the
/// file's holes (the never-written, preallocated rest of a segment), where the whole-file scan
/// would take a fresh buffer the size of the segment.
fn check_clean(
    file: &dyn StorageFile,
    seg: &SegmentFile,
    layout: Layout,
    max_payload: u32,
    buf: &mut Vec<u8>,
    chunk: usize,
) -> Result<Option<CleanSegment>> {
    let read_err = |e| Error::io("read", &seg.path, e);
    let len = file.len().map_err(read_err)?;
    let mut clean = CleanSegment {
        records: 0,
        first_lsn: None,
        next_lsn: seg.start,
        end_offset: stela_format::header::HEADER_BYTES as u64,
    };
    // The records, chunk by chunk; `offset` is the file offset of `buf[0]`.
    let mut offset = clean.end_offset;
    buf.clear();
    loop {
        let remaining = len - offset - buf.len() as u64;
        if remaining > 0 {
            let want = (chunk as u64).min(remaining) as usize;
            let old = buf.len();
            buf.resize(old + want, 0);
            file.read_exact_at(&mut buf[old..], offset + old as u64)
                .map_err(read_err)?;
        }
        let at_end = offset + buf.len() as u64 == len;
        let mut pos = 0;
        let data_ended = loop {
            match frame::decode_with_limit(layout, &buf[pos..], max_payload) {
                Decoded::Record(rec) if rec.lsn == clean.next_lsn => {
                    clean.records += 1;
                    clean.first_lsn.get_or_insert(rec.lsn);
                    clean.next_lsn = rec.lsn.next();
                    pos += rec.frame_len();
                }
                Decoded::Incomplete { .. } if !at_end => break false, // read more
                // A zero prefix of a header cut by the chunk: the next chunk decides.
                Decoded::Unwritten if buf.len() - pos < layout.header_bytes() && !at_end => {
                    break false
                }
                Decoded::Incomplete { .. } if pos == buf.len() => break true, // exact end
                Decoded::Unwritten => break true,
                _ => return Ok(None),
            }
        };
        if data_ended {
            clean.end_offset = offset + pos as u64;
            break;
        }
        buf.drain(..pos);
        offset += pos as u64;
    }
    // Then zeros: holes are zeros by definition, data regions are read and looked at.
    for region in file.data_regions(clean.end_offset).map_err(read_err)? {
        let mut at = region.start.max(clean.end_offset);
        while at < region.end {
            let n = (chunk as u64).min(region.end - at) as usize;
            buf.resize(n, 0);
            file.read_exact_at(&mut buf[..n], at).map_err(read_err)?;
            if buf[..n].iter().fold(0u8, |acc, &b| acc | b) != 0 {
                return Ok(None);
            }
            at += n as u64;
        }
    }
    Ok(Some(clean))
}

pub(crate) fn new_header(
    options: &WalOptions,
    expect: &Expect,
    segment_seq: u64,
    start: Lsn,
) -> SegmentHeader {
    SegmentHeader {
        layout: Layout::CURRENT,
        codec: expect.codec,
        segment_seq,
        start_lsn: start,
        capacity: options.segment_bytes,
        type_tag: expect.type_tag.clone(),
    }
}

fn check_header(seg: &SegmentFile, header: &SegmentHeader, expect: &Expect) -> Result<()> {
    if header.codec != expect.codec {
        return Err(Error::WrongCodec {
            segment: seg.path.clone(),
            found: header.codec,
            expected: expect.codec,
        });
    }
    if !header.type_tag.names_same_type(&expect.type_tag) {
        return Err(Error::WrongRecordType {
            segment: seg.path.clone(),
            found: header.type_tag.clone(),
            expected: expect.type_tag.clone(),
        });
    }
    if header.start_lsn != seg.start {
        return Err(Error::corruption(Corruption {
            segment: seg.path.clone(),
            offset: 24,
            expected_lsn: seg.start,
            reason: format!(
                "segment header says its first LSN is {}, its file name says {}",
                header.start_lsn, seg.start
            ),
            valid_record_at: None,
        }));
    }
    Ok(())
}

fn corruption(path: &Path, damage: &Damage) -> Error {
    Error::corruption(Corruption {
        segment: path.to_path_buf(),
        offset: damage.offset,
        expected_lsn: damage.expected_lsn,
        reason: damage.reason.clone(),
        valid_record_at: damage.resumes_at,
    })
}

fn salvage_dir(dir: &Path, report: &mut RecoveryReport, from: Lsn) -> PathBuf {
    report
        .salvage_dir
        .get_or_insert_with(|| dir.join(salvage_name(from, SystemTime::now())))
        .clone()
}

/// The name of the folder that keeps what a repair or a `KeepValidPrefix` open removes: the
/// LSN the cut begins at and the time, in ISO 8601's basic form (no colons, so the name is a
/// plain word in a shell): `salvage-lsn-5-20261207T135504.123Z`. The runs of good records
/// inside are named by their own LSN ranges (`lsn-<first>-<last>/`).
pub(crate) fn salvage_name(from: Lsn, at: SystemTime) -> String {
    let iso = humantime::format_rfc3339_millis(at).to_string();
    let basic: String = iso.chars().filter(|c| *c != '-' && *c != ':').collect();
    format!("salvage-lsn-{}-{basic}", from.get())
}

/// Keeps the records with good checksums found after `from` in a segment's bytes (as a reader
/// that lost its place finds them: each with an LSN above the one before, starting at
/// `expected`), as ordinary logs under `salvage`, one per run of consecutive LSNs
/// (`lsn-<first>-<last>/`, frames re-framed with no sync claimed), each durable before the
/// caller cuts anything. Returns the runs kept.
fn keep_valid_records(
    storage: &dyn Storage,
    salvage: &Path,
    header: &SegmentHeader,
    bytes: &[u8],
    from: usize,
    expected: Lsn,
    max_payload: u32,
) -> Result<Vec<(Lsn, Lsn, PathBuf)>> {
    let layout = header.layout;
    let mut runs: Vec<Vec<u8>> = Vec::new();
    let mut bounds: Vec<(Lsn, Lsn)> = Vec::new();
    let mut at = from + 1;
    let mut next = expected;
    while let Some(found) =
        stela_format::resync::find_next_valid(layout, bytes, at, next, max_payload)
    {
        let Decoded::Record(rec) = frame::decode_with_limit(layout, &bytes[found..], max_payload)
        else {
            unreachable!("find_next_valid returns only valid frames");
        };
        match bounds.last_mut() {
            Some((_, last)) if last.next() == rec.lsn => *last = rec.lsn,
            _ => {
                bounds.push((rec.lsn, rec.lsn));
                runs.push(Vec::new());
            }
        }
        let run = runs.last_mut().expect("pushed above");
        frame::encode(run, rec.lsn, rec.payload, frame::MIN_SYNC_BASE);
        next = rec.lsn.next();
        at = found + rec.frame_len();
    }
    let mut kept = Vec::new();
    for ((first, last), frames) in bounds.into_iter().zip(runs) {
        let dir = salvage.join(format!("lsn-{first}-{last}"));
        storage
            .create_dir_all(&dir)
            .map_err(|e| Error::io("create directory", &dir, e))?;
        let start = stela_format::header::HEADER_BYTES as u64;
        let segment = SegmentHeader {
            layout: Layout::CURRENT,
            segment_seq: 0,
            start_lsn: first,
            capacity: header
                .capacity
                .min(MAX_CAPACITY_V2)
                .max(start + frames.len() as u64),
            ..header.clone()
        };
        let file = crate::writer::create(storage, &dir, &segment)?;
        let path = dir.join(segment_file_name(first));
        file.write_all_at(&frames, start)
            .and_then(|()| file.sync_data())
            .map_err(|e| Error::io("write", &path, e))?;
        kept.push((first, last, dir));
    }
    Ok(kept)
}

/// Copies the bytes of a segment from `offset` to its last non-zero byte into the salvage
/// folder, then zeroes them in the segment, durably.
fn cut(
    storage: &dyn Storage,
    salvage: &Path,
    path: &Path,
    file: &dyn StorageFile,
    bytes: &[u8],
    offset: u64,
) -> Result<()> {
    let from = offset as usize;
    let end = bytes[from..]
        .iter()
        .rposition(|&b| b != 0)
        .map_or(from, |i| from + i + 1);
    let name = format!(
        "{}.from-{offset}",
        path.file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("segment")
    );
    let copy_path = salvage.join(name);
    let copy = storage
        .open(&copy_path, OpenMode::CreateNew)
        .map_err(|e| Error::io("create", &copy_path, e))?;
    copy.write_all_at(&bytes[from..end], 0)
        .map_err(|e| Error::io("write", &copy_path, e))?;
    copy.sync_data()
        .map_err(|e| Error::io("fdatasync", &copy_path, e))?;
    zero(file, path, offset, (end - from) as u64)
}

/// Overwrites `len` bytes at `offset` with zeros and syncs, so the bytes can never be read as
/// records again (not even after a later write happens to end where one of them started).
fn zero(file: &dyn StorageFile, path: &Path, offset: u64, len: u64) -> Result<()> {
    let zeros = vec![0u8; len.min(1 << 20) as usize];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(zeros.len() as u64) as usize;
        file.write_all_at(&zeros[..n], offset + done)
            .map_err(|e| Error::io("write", path, e))?;
        done += n as u64;
    }
    file.sync_data()
        .map_err(|e| Error::io("fdatasync", path, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scan::scan_segment;
    use crate::storage::FaultStorage;
    use proptest::prelude::*;

    proptest! {
        /// The streaming check of a segment accepts exactly what the whole-file scan
        /// finds clean, and counts the same records, whatever the chunk size.
        #[test]
        fn check_clean_agrees_with_the_whole_file_scan(
            v1 in any::<bool>(),
            payloads in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..30),
            damage in proptest::option::of((any::<prop::sample::Index>(), any::<u8>())),
            chunk in 1usize..300,
            is_last in any::<bool>(),
        ) {
            let start = Lsn::new(5);
            let layout = if v1 { Layout::V1 } else { Layout::V2 };
            let mut bytes = vec![0u8; stela_format::header::HEADER_BYTES];
            for (i, p) in payloads.iter().enumerate() {
                let lsn = Lsn::new(5 + i as u64);
                match layout {
                    Layout::V1 => frame::encode_v1(&mut bytes, lsn, p),
                    Layout::V2 => frame::encode(&mut bytes, lsn, p, frame::MIN_SYNC_BASE),
                }
            }
            bytes.resize(bytes.len() + 100, 0);
            if let Some((at, value)) = damage {
                let at = stela_format::header::HEADER_BYTES
                    + at.index(bytes.len() - stela_format::header::HEADER_BYTES);
                bytes[at] = value;
            }
            let fs = FaultStorage::new();
            fs.create_dir_all(Path::new("/log")).unwrap();
            let path = Path::new("/log/seg");
            let file = fs.open(path, OpenMode::CreateNew).unwrap();
            file.write_all_at(&bytes, 0).unwrap();
            let seg = SegmentFile { start, path: path.to_path_buf() };
            let mut buf = Vec::new();
            let fast = check_clean(file.as_ref(), &seg, layout, 1 << 20, &mut buf, chunk).unwrap();
            let scan = scan_segment(&bytes, start, layout, is_last, 1 << 20, false);
            match fast {
                Some(clean) => {
                    prop_assert!(scan.damage.is_empty() && scan.torn_tail.is_none());
                    prop_assert_eq!(clean.records, scan.records);
                    prop_assert_eq!(clean.first_lsn, scan.first_lsn);
                    prop_assert_eq!(clean.next_lsn, scan.last_lsn.map_or(start, Lsn::next));
                    prop_assert_eq!(clean.end_offset, scan.end_offset);
                }
                None => prop_assert!(!scan.damage.is_empty() || scan.torn_tail.is_some()),
            }
        }
    }
}

#[cfg(test)]
mod salvage_name_tests {
    use super::*;

    #[test]
    fn a_salvage_folder_is_named_by_its_first_lsn_and_iso_time() {
        let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(1_796_651_718_872);
        assert_eq!(
            salvage_name(Lsn::new(5), at),
            "salvage-lsn-5-20261207T135518.872Z"
        );
    }
}
