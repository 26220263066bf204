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

/// Opens the log in `dir` (creating it when allowed and missing), checks every segment the
/// options ask for, repairs what the recovery mode allows, and leaves the newest segment synced,
/// preallocated and marked.
pub(crate) fn recover(
    dir: &Path,
    options: &WalOptions,
    expect: &Expect,
    keep_removed_bytes: bool,
) -> Result<Recovered> {
    let storage = options.storage.as_ref();
    let lock = open_and_lock(storage, dir, options)?;
    let listing = segment::list(storage, dir)?;
    let mut report = RecoveryReport::default();
    remove_temp_files(storage, dir, &listing.temp_files, &mut report)?;
    let mut segments = listing.segments;
    if segments.is_empty() {
        return create_first_segment(storage, dir, options, expect, report, lock);
    }

    // How far the newest segment was synced when its last recorded sync returned: below it,
    // nothing is a torn write.
    let on_disk = synced::read(storage, dir)?;
    let newest_start = segments.last().map(|s| s.start);
    let synced_mark = on_disk
        .filter(|m| Some(m.segment_start) == newest_start)
        .map_or(HEADER_END, |m| m.synced_offset);
    let mut walk = Walk {
        storage,
        dir,
        options,
        expect,
        keep_removed_bytes,
        synced_mark,
        max_payload: options.effective_max_record() as u32,
        report,
        scratch: Vec::new(),
    };
    let mut expected_start = None;
    let mut index = 0;
    let tail = loop {
        match walk.segment(&mut segments, index, expected_start)? {
            Step::Next(next) => {
                expected_start = next;
                index += 1;
            }
            Step::Tail(tail) => break tail,
        }
    };
    debug_assert_eq!(index + 1, segments.len(), "the tail is the newest segment");
    finish(storage, dir, segments, tail, walk.report, on_disk, lock)
}

/// Where a segment's records begin: the end of its header.
const HEADER_END: u64 = stela_format::header::HEADER_BYTES as u64;

/// Checks the segment size, creates the directory if allowed (or reports it missing), and
/// takes the directory lock, held as long as the log is open.
fn open_and_lock(
    storage: &dyn Storage,
    dir: &Path,
    options: &WalOptions,
) -> Result<Box<dyn Send + Sync>> {
    if options.segment_bytes > MAX_CAPACITY_V2 {
        return Err(Error::SegmentTooLarge {
            bytes: options.segment_bytes,
            max: MAX_CAPACITY_V2,
        });
    }
    if options.create_if_missing {
        crate::storage::create_dir_durably(storage, dir)
            .map_err(|e| Error::io("create directory", dir, e))?;
    } else if storage.list(dir).is_err() {
        return Err(Error::NotFound {
            dir: dir.to_path_buf(),
        });
    }
    storage.lock_dir(dir).map_err(|e| {
        if e.kind() == std::io::ErrorKind::WouldBlock {
            Error::Locked {
                dir: dir.to_path_buf(),
            }
        } else {
            Error::io("lock", dir, e)
        }
    })
}

/// Deletes incomplete segment preparations (a crash before their rename), then syncs the
/// directory if any was deleted.
fn remove_temp_files(
    storage: &dyn Storage,
    dir: &Path,
    temp_files: &[PathBuf],
    report: &mut RecoveryReport,
) -> Result<()> {
    for temp in temp_files {
        storage
            .remove(temp)
            .map_err(|e| Error::io("remove", temp, e))?;
        report.removed_temp_files.push(temp.clone());
    }
    if !temp_files.is_empty() {
        storage
            .sync_dir(dir)
            .map_err(|e| Error::io("fsync directory", dir, e))?;
    }
    Ok(())
}

/// A log with no segment yet: its first one, empty.
fn create_first_segment(
    storage: &dyn Storage,
    dir: &Path,
    options: &WalOptions,
    expect: &Expect,
    mut report: RecoveryReport,
    lock: Box<dyn Send + Sync>,
) -> Result<Recovered> {
    let header = new_header(options, expect, 0, Lsn::FIRST);
    let tail = crate::writer::create(storage, dir, &header)?;
    let on_disk = synced::read(storage, dir)?;
    let mark = SyncedMark::open(storage, dir, on_disk, Lsn::FIRST, HEADER_END)?;
    report.segments = 1;
    Ok(Recovered {
        segments: vec![SegmentFile {
            start: Lsn::FIRST,
            path: dir.join(segment_file_name(Lsn::FIRST)),
        }],
        tail,
        tail_header: header,
        write_offset: HEADER_END,
        data_end: HEADER_END,
        next_lsn: Lsn::FIRST,
        report,
        lock,
        mark,
    })
}

/// The newest segment as the walk leaves it.
struct Tail {
    file: Box<dyn StorageFile>,
    header: SegmentHeader,
    /// Where the next frame goes (the capacity, if the segment must not be written again).
    write_offset: u64,
    /// Where the kept data ends.
    data_end: u64,
    next_lsn: Lsn,
}

/// Where one segment's check leads.
enum Step {
    /// On to the next segment, which must begin at this LSN (`None`: not checked).
    Next(Option<Lsn>),
    /// This was the newest segment (or a cut made it the newest).
    Tail(Tail),
}

/// The segment-by-segment walk of [`recover`]: what every segment's check shares.
struct Walk<'a> {
    storage: &'a dyn Storage,
    dir: &'a Path,
    options: &'a WalOptions,
    expect: &'a Expect,
    keep_removed_bytes: bool,
    /// The newest segment's synced end: damage below it is corruption, never a torn write.
    synced_mark: u64,
    max_payload: u32,
    report: RecoveryReport,
    scratch: Vec<u8>,
}

impl Walk<'_> {
    /// Checks `segments[index]`: its header, that it begins where the previous one ended, and
    /// (if verified) its records; repairs what the mode allows.
    fn segment(
        &mut self,
        segments: &mut Vec<SegmentFile>,
        index: usize,
        expected_start: Option<Lsn>,
    ) -> Result<Step> {
        let seg = segments[index].clone();
        let is_last = index + 1 == segments.len();
        let mode = if is_last {
            OpenMode::ReadWrite
        } else {
            OpenMode::Read
        };
        let file = self
            .storage
            .open(&seg.path, mode)
            .map_err(|e| Error::io("open", &seg.path, e))?;
        let header = segment::read_header(file.as_ref(), &seg.path)?;
        check_header(&seg, &header, self.expect)?;
        self.check_continuity(&seg, expected_start)?;
        if !(self.options.verify_on_open || is_last) {
            return Ok(Step::Next(None));
        }
        // Segments are normally clean: check them streaming; only a finding sends us to the
        // whole-file scan, which classifies it.
        let mark = if is_last {
            self.synced_mark
        } else {
            HEADER_END
        };
        let clean = check_clean(
            file.as_ref(),
            &seg,
            header.layout,
            self.max_payload,
            &mut self.scratch,
            CHECK_CHUNK,
        )?;
        if let Some(clean) = clean.filter(|clean| clean.end_offset >= mark) {
            self.count(clean.records, clean.first_lsn);
            if !is_last {
                return Ok(Step::Next(Some(clean.next_lsn)));
            }
            return Ok(Step::Tail(Tail {
                file,
                header,
                write_offset: clean.end_offset,
                data_end: clean.end_offset,
                next_lsn: clean.next_lsn,
            }));
        }
        self.scan(segments, index, file, header, mark)
    }

    /// The whole-file scan of a segment the streaming check found something in: damage is
    /// refused, skipped or cut as the mode says; a torn write at the end is removed.
    fn scan(
        &mut self,
        segments: &mut Vec<SegmentFile>,
        index: usize,
        file: Box<dyn StorageFile>,
        header: SegmentHeader,
        mark: u64,
    ) -> Result<Step> {
        let seg = segments[index].clone();
        let is_last = index + 1 == segments.len();
        let bytes = file
            .read_to_vec()
            .map_err(|e| Error::io("read", &seg.path, e))?;
        let skip = self.options.recovery == RecoveryMode::SkipCorrupt;
        let scan = scan_segment_marked(
            &bytes,
            seg.start,
            header.layout,
            is_last,
            self.max_payload,
            skip,
            mark,
        );
        self.count(scan.records, scan.first_lsn);
        let next = scan.last_lsn.map_or(seg.start, Lsn::next);
        if let Some(damage) = scan.damage.first() {
            match self.options.recovery {
                RecoveryMode::Strict => return Err(corruption(&seg.path, damage)),
                RecoveryMode::SkipCorrupt => self
                    .report
                    .damage
                    .extend(scan.damage.iter().map(|d| (seg.path.clone(), d.clone()))),
                RecoveryMode::KeepValidPrefix => {
                    let file = self.cut_at_damage(segments, index, &header, &bytes, damage)?;
                    return Ok(Step::Tail(Tail {
                        file,
                        header,
                        write_offset: scan.end_offset,
                        data_end: scan.end_offset,
                        next_lsn: next,
                    }));
                }
            }
        }
        if let Some(torn) = &scan.torn_tail {
            self.remove_torn_tail(&seg, file.as_ref(), &header, &bytes, torn, next)?;
        }
        if !is_last {
            return Ok(Step::Next(Some(next)));
        }
        // Skip mode may have left damage in the newest segment. New records must not go after
        // it: bytes appended there could complete a damaged frame into one that checks out, and
        // the next scan would read a different log. So report the segment as full: the first
        // append seals it as it is and starts a new segment (whose first LSN is above the
        // valid record that ended the damage, so the names cannot clash). Opening still
        // changes nothing on disk.
        let write_offset = if scan.damage.is_empty() {
            scan.end_offset
        } else {
            header.capacity
        };
        Ok(Step::Tail(Tail {
            file,
            header,
            write_offset,
            data_end: scan.end_offset,
            next_lsn: next,
        }))
    }

    /// Counts verified records, and the first LSN seen.
    fn count(&mut self, records: u64, first_lsn: Option<Lsn>) {
        self.report.records_verified += records;
        if self.report.first_lsn == Lsn::ZERO {
            self.report.first_lsn = first_lsn.unwrap_or(Lsn::ZERO);
        }
    }

    /// A segment must begin where the one before it ended: a gap means a lost segment file.
    /// Cutting there would cut everything after it, so only skip mode goes on past it.
    fn check_continuity(&mut self, seg: &SegmentFile, expected_start: Option<Lsn>) -> Result<()> {
        let Some(expected) = expected_start.filter(|&e| e != seg.start) else {
            return Ok(());
        };
        let damage = Damage {
            offset: 0,
            expected_lsn: expected,
            reason: format!(
                "records {expected}..{} are missing: a segment file was lost or removed",
                seg.start
            ),
            resumes_at: Some(HEADER_END),
        };
        match self.options.recovery {
            // Refused even in salvage mode: an operator must look at this.
            RecoveryMode::Strict | RecoveryMode::KeepValidPrefix => {
                Err(corruption(&seg.path, &damage))
            }
            RecoveryMode::SkipCorrupt => {
                self.report.damage.push((seg.path.clone(), damage));
                Ok(())
            }
        }
    }

    /// `KeepValidPrefix`: keeps the records after `damage` in a salvage folder, cuts the
    /// segment at the damage and moves every later segment aside. Returns the segment, opened
    /// for writing: the new tail.
    fn cut_at_damage(
        &mut self,
        segments: &mut Vec<SegmentFile>,
        index: usize,
        header: &SegmentHeader,
        bytes: &[u8],
        damage: &Damage,
    ) -> Result<Box<dyn StorageFile>> {
        let storage = self.storage;
        let seg = segments[index].clone();
        let salvage = salvage_dir(self.dir, &mut self.report, damage.expected_lsn);
        storage
            .create_dir_all(&salvage)
            .map_err(|e| Error::io("create directory", &salvage, e))?;
        let file = storage
            .open(&seg.path, OpenMode::ReadWrite)
            .map_err(|e| Error::io("open", &seg.path, e))?;
        let kept = keep_valid_records(
            storage,
            &salvage,
            header,
            bytes,
            damage.offset as usize,
            damage.expected_lsn,
            self.max_payload,
        )?;
        self.report.salvaged_records.extend(kept);
        cut(
            storage,
            &salvage,
            &seg.path,
            file.as_ref(),
            bytes,
            damage.offset,
        )?;
        for later in segments.drain(index + 1..) {
            let to = salvage.join(later.path.file_name().expect("segment name"));
            storage
                .rename(&later.path, &to)
                .map_err(|e| Error::io("move aside", &later.path, e))?;
        }
        for synced in [&salvage, self.dir] {
            storage
                .sync_dir(synced)
                .map_err(|e| Error::io("fsync directory", synced, e))?;
        }
        self.report.damage.push((seg.path.clone(), damage.clone()));
        Ok(file)
    }

    /// Removes a torn write from a segment's end: zeroed in place, or (when removed bytes are
    /// kept) cut with the valid records after it kept in a salvage folder.
    fn remove_torn_tail(
        &mut self,
        seg: &SegmentFile,
        file: &dyn StorageFile,
        header: &SegmentHeader,
        bytes: &[u8],
        torn: &TornTail,
        next: Lsn,
    ) -> Result<()> {
        if self.keep_removed_bytes {
            let storage = self.storage;
            let salvage = salvage_dir(self.dir, &mut self.report, next);
            storage
                .create_dir_all(&salvage)
                .map_err(|e| Error::io("create directory", &salvage, e))?;
            let kept = keep_valid_records(
                storage,
                &salvage,
                header,
                bytes,
                torn.offset as usize,
                next,
                self.max_payload,
            )?;
            self.report.salvaged_records.extend(kept);
            cut(storage, &salvage, &seg.path, file, bytes, torn.offset)?;
            storage
                .sync_dir(&salvage)
                .map_err(|e| Error::io("fsync directory", &salvage, e))?;
        } else {
            zero(file, &seg.path, torn.offset, torn.bytes)?;
        }
        tracing::warn!(
            segment = %seg.path.display(),
            offset = torn.offset,
            bytes = torn.bytes,
            "removed a torn write from the end of the log: {}",
            torn.reason
        );
        self.report.torn_tail = Some((seg.path.clone(), torn.clone()));
        Ok(())
    }
}

/// After the walk: the newest segment preallocated, synced and marked.
fn finish(
    storage: &dyn Storage,
    dir: &Path,
    segments: Vec<SegmentFile>,
    tail: Tail,
    mut report: RecoveryReport,
    on_disk: Option<stela_format::synced::SyncedEnd>,
    lock: Box<dyn Send + Sync>,
) -> Result<Recovered> {
    let newest = &segments[segments.len() - 1].path;
    // Writers write version 2 frames only, so a version 1 newest segment (from an older build)
    // is reported full, like a damaged one in skip mode: the first append starts a new segment.
    let write_offset = if tail.header.layout == Layout::CURRENT {
        tail.write_offset
    } else {
        tail.write_offset.max(tail.header.capacity)
    };
    // A segment cut short by a crash during preallocation would make later writes grow the file.
    tail.file
        .allocate(tail.header.capacity)
        .map_err(|e| Error::io("preallocate", newest, e))?;
    // The log reports every record found here as durable (`durable_lsn`, and `commit` of them
    // returns at once), but after a process crash the newest segment's last records may still
    // be only in the OS cache: sync them so that a power cut now cannot take back what this
    // open hands out as durable. (Older segments were synced before their successor existed.)
    tail.file
        .sync_data()
        .map_err(|e| Error::io("fdatasync", newest, e))?;
    // Now that the data is synced, record how far: a later open then calls any change below
    // it damage. Rewritten whenever it differs (a repair may have cut below an older mark).
    let mark = SyncedMark::open(storage, dir, on_disk, tail.header.start_lsn, tail.data_end)?;
    report.segments = segments.len();
    report.last_lsn = Lsn::new(tail.next_lsn.get() - 1);
    if report.first_lsn == Lsn::ZERO && report.last_lsn != Lsn::ZERO {
        report.first_lsn = segments[0].start;
    }
    Ok(Recovered {
        segments,
        tail: tail.file,
        tail_header: tail.header,
        write_offset,
        data_end: tail.data_end,
        next_lsn: tail.next_lsn,
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
    use stela_format::resync;

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
                    Layout::V1 => resync::encode_v1(&mut bytes, lsn, p),
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
