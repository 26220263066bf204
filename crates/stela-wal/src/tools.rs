//! Offline tools over a log directory: verify (read only), dump (read only), repair.
//! These back `stela wal verify|dump|repair`; they need no knowledge of the record type.

use crate::error::{Error, Result};
use crate::log::Log;
use crate::options::{RecoveryMode, WalOptions};
use crate::reader::{RawReader, ReadPoint};
use crate::recovery::RecoveryReport;
use crate::scan::{scan_segment_marked, Damage, SegmentScan, TornTail};
use crate::segment::{self, SegmentFile};
use crate::storage::{OpenMode, Storage};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use stela_format::header::{HEADER_BYTES, MAX_CAPACITY_V2};
use stela_format::synced::SyncedEnd;
use stela_format::{Codec, Lsn, SegmentHeader};

/// One segment as `verify` saw it.
#[derive(Debug)]
pub struct SegmentReport {
    pub path: PathBuf,
    pub start: Lsn,
    pub header: std::result::Result<SegmentHeader, Error>,
    pub scan: Option<SegmentScan>,
}

/// Everything `verify` found. The log is damaged when `problems` is not empty. A torn tail is
/// not damage (opening the log removes it), but the log is clean only if that tail holds no
/// record whose checksum is good: when it does ([`VerifyReport::would_cut_records`]), opening
/// or repairing the log would remove records, and the tools say how many.
#[derive(Debug, Default)]
pub struct VerifyReport {
    pub segments: Vec<SegmentReport>,
    pub records: u64,
    pub first_lsn: Option<Lsn>,
    pub last_lsn: Option<Lsn>,
    pub codec: Option<Codec>,
    pub torn_tail: Option<(PathBuf, TornTail)>,
    /// Human-readable descriptions, each naming the file and offset.
    pub problems: Vec<String>,
    /// The first LSN that is not part of the log's valid prefix: where the first damage is
    /// (`None` when clean). `dump` prints the records before it; `repair --corrupt-suffix`
    /// keeps exactly those.
    pub valid_prefix_end: Option<Lsn>,
    /// The log's synced-end mark (`SYNCED`), if it has one: below it nothing is a torn tail.
    pub synced_mark: Option<SyncedEnd>,
}

impl VerifyReport {
    /// No damage, and nothing an open would cut but the remains of a write.
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty() && self.would_cut_records() == 0
    }

    /// Damage was found (`problems`).
    pub fn is_damaged(&self) -> bool {
        !self.problems.is_empty()
    }

    /// Records with good checksums (and LSNs that continue the log) inside the torn tail:
    /// opening the log, or `repair`, removes them with the tail (`repair` keeps a copy). They
    /// were never synced, so none of them was acknowledged at `disk`, but they are records.
    pub fn would_cut_records(&self) -> u64 {
        self.torn_tail
            .as_ref()
            .map_or(0, |(_, torn)| torn.unsynced_records)
    }

    /// Records a problem found where the record `lsn` was expected.
    fn damaged_at(&mut self, lsn: Lsn, problem: String) {
        self.problems.push(problem);
        self.valid_prefix_end = Some(self.valid_prefix_end.map_or(lsn, |end| end.min(lsn)));
    }
}

/// The segments of the log in `dir`, or [`Error::NotALog`] when there is no log there: the
/// tools must never call a typo'd path or an application's directory a clean (empty) log.
fn log_segments(dir: &Path, storage: &dyn Storage) -> Result<segment::Listing> {
    let not_a_log = |reason| Error::NotALog {
        path: dir.to_path_buf(),
        reason,
    };
    let listing = match segment::list(storage, dir) {
        Ok(listing) => listing,
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            return Err(not_a_log("no such file or directory"))
        }
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotADirectory => {
            return Err(not_a_log("a file, not a log directory"))
        }
        Err(error) => return Err(error),
    };
    if listing.segments.is_empty() {
        return Err(not_a_log(
            "a directory without segment files (<first LSN>.wal)",
        ));
    }
    Ok(listing)
}

/// Checks every segment of the log in `dir` without changing anything: headers, checksums, LSN
/// continuity within and across segments. Reports all damage, not only the first.
///
/// # Errors
/// [`Error::NotALog`] when `dir` holds no log; I/O errors naming the file.
pub fn verify(dir: &Path, storage: &dyn Storage) -> Result<VerifyReport> {
    let listing = log_segments(dir, storage)?;
    let mut report = VerifyReport {
        synced_mark: crate::synced::read(storage, dir)?,
        ..VerifyReport::default()
    };
    let mut expected: Option<Lsn> = None;
    let count = listing.segments.len();
    for (index, seg) in listing.segments.into_iter().enumerate() {
        let is_last = index + 1 == count;
        let file = storage
            .open(&seg.path, OpenMode::Read)
            .map_err(|e| Error::io("open", &seg.path, e))?;
        let header = segment::read_header(file.as_ref(), &seg.path);
        let mut entry = SegmentReport {
            path: seg.path.clone(),
            start: seg.start,
            header,
            scan: None,
        };
        // Where this segment's records should begin: a damaged header or a gap ends the valid
        // prefix there.
        let here = expected.unwrap_or(seg.start).min(seg.start);
        let header = match &entry.header {
            Ok(header) => header.clone(),
            Err(error) => {
                report.damaged_at(here, error.to_string());
                report.segments.push(entry);
                expected = None;
                continue;
            }
        };
        match report.codec {
            None => report.codec = Some(header.codec),
            Some(codec) if codec != header.codec => report.damaged_at(
                here,
                format!(
                    "{}: codec {} differs from earlier segments' {codec}",
                    seg.path.display(),
                    header.codec
                ),
            ),
            Some(_) => {}
        }
        if header.start_lsn != seg.start {
            report.damaged_at(
                here,
                format!(
                    "{}: header says first LSN {}, file name says {}",
                    seg.path.display(),
                    header.start_lsn,
                    seg.start
                ),
            );
        }
        if let Some(exp) = expected.filter(|&e| e != seg.start) {
            report.damaged_at(
                here,
                format!(
                    "{}: records {exp}..{} are missing before this segment",
                    seg.path.display(),
                    seg.start
                ),
            );
        }
        let mark = synced_end_in(report.synced_mark, seg.start, is_last);
        let scan = scan_segment_file(file.as_ref(), &seg, header.layout, is_last, mark)?;
        report.records += scan.records;
        if report.first_lsn.is_none() {
            report.first_lsn = scan.first_lsn;
        }
        if scan.last_lsn.is_some() {
            report.last_lsn = scan.last_lsn;
        }
        for damage in &scan.damage {
            report.damaged_at(damage.expected_lsn, describe(&seg.path, damage));
        }
        if let Some(torn) = &scan.torn_tail {
            report.torn_tail = Some((seg.path.clone(), torn.clone()));
        }
        expected = Some(scan.last_lsn.map_or(seg.start, Lsn::next));
        entry.scan = Some(scan);
        report.segments.push(entry);
    }
    Ok(report)
}

/// The last LSN of the valid records of the log in `dir`, read from its newest segment alone,
/// as [`verify`] would find it there: every older segment was synced whole before its
/// successor was created, so only the newest can end early. What a node reports when it
/// promises an epoch, in the time of one segment's read however long the log. Damage in an
/// older segment is not looked for (opening the log refuses it).
///
/// # Errors
/// [`Error::NotALog`] when `dir` holds no log; I/O errors naming the file.
pub fn tail_last_lsn(dir: &Path, storage: &dyn Storage) -> Result<Lsn> {
    let listing = log_segments(dir, storage)?;
    let newest = listing
        .segments
        .last()
        .expect("log_segments lists at least one");
    let file = storage
        .open(&newest.path, OpenMode::Read)
        .map_err(|e| Error::io("open", &newest.path, e))?;
    let header = segment::read_header(file.as_ref(), &newest.path)?;
    // The mark is read before the segment's bytes (as `verify` does): bytes read after it are
    // at least as new, so a mark can never be found beyond the bytes it describes.
    let mark = synced_end_in(crate::synced::read(storage, dir)?, newest.start, true);
    let scan = scan_segment_file(file.as_ref(), newest, header.layout, true, mark)?;
    let before_start = Lsn::new(newest.start.get() - 1);
    Ok(match scan.damage.first() {
        Some(damage) => Lsn::new(damage.expected_lsn.get().saturating_sub(1)).max(before_start),
        None => scan.last_lsn.unwrap_or(before_start),
    })
}

/// Where the bytes of the segment starting at `start` are known synced: the log's `SYNCED`
/// mark when it names this segment (only ever the newest), else the header's end.
fn synced_end_in(mark: Option<SyncedEnd>, start: Lsn, is_last: bool) -> u64 {
    mark.filter(|m| is_last && m.segment_start == start)
        .map_or(HEADER_BYTES as u64, |m| m.synced_offset)
}

/// One segment read whole and scanned as [`verify`] and [`tail_last_lsn`] scan it: past
/// damage, with no payload limit, `mark` its synced end.
fn scan_segment_file(
    file: &dyn crate::storage::StorageFile,
    seg: &SegmentFile,
    layout: stela_format::frame::Layout,
    is_last: bool,
    mark: u64,
) -> Result<SegmentScan> {
    let bytes = file
        .read_to_vec()
        .map_err(|e| Error::io("read", &seg.path, e))?;
    Ok(scan_segment_marked(
        &bytes,
        seg.start,
        layout,
        is_last,
        u32::MAX,
        true,
        mark,
    ))
}

fn describe(path: &Path, damage: &Damage) -> String {
    let mut text = format!(
        "{}: corruption at byte offset {} (expected record LSN {}): {}",
        path.display(),
        damage.offset,
        damage.expected_lsn,
        damage.reason
    );
    if let Some(at) = damage.resumes_at {
        text.push_str(&format!("; valid records resume at offset {at}"));
    }
    text
}

/// Which records [`dump_with`] reads, and how it writes them.
#[derive(Clone, Copy, Debug)]
pub struct DumpOptions {
    /// The first LSN read.
    pub from: Lsn,
    /// The last LSN read (inclusive); `None`: to the log's end.
    pub to: Option<Lsn>,
    /// At most this many records; `None`: all.
    pub limit: Option<u64>,
    pub format: DumpFormat,
}

impl Default for DumpOptions {
    fn default() -> DumpOptions {
        DumpOptions {
            from: Lsn::FIRST,
            to: None,
            limit: None,
            format: DumpFormat::JsonLines,
        }
    }
}

/// How [`dump_with`] writes each record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DumpFormat {
    /// `{"lsn":N,"record":...}`, one line each.
    JsonLines,
    /// `lsn N  len B  {record as compact JSON}`, one line each, for reading (pg_waldump's
    /// habit).
    Text,
    /// Nothing per record: the [`DumpReport`]'s counts are the output.
    Stats,
}

/// What `dump` wrote, and the damage that ended it.
#[derive(Debug, Default)]
pub struct DumpReport {
    /// Records read (and, unless [`DumpFormat::Stats`], written).
    pub records: u64,
    /// Payload bytes of those records (as stored: encoded, before framing).
    pub payload_bytes: u64,
    /// Their LSN range, when there was any.
    pub first: Option<Lsn>,
    pub last: Option<Lsn>,
    /// The smallest and largest payload.
    pub min_payload: u64,
    pub max_payload: u64,
    /// The log's codec.
    pub codec: Option<Codec>,
    /// `verify`'s problems: when not empty, the records written are the log's valid prefix
    /// (from `from`) and the log is damaged after them; the caller must not call it a success.
    pub problems: Vec<String>,
}

/// Writes every record of the log in `dir` as a JSON line `{"lsn":N,"record":...}` (postcard
/// payloads, which cannot be decoded without their type, as `{"hex":"..."}`; compact MessagePack
/// structs with the field names of the log's `SCHEMA.json` when it has one). Read only. On a
/// damaged log it writes the valid prefix, the records before the first damage `verify` finds,
/// and returns the damage in [`DumpReport::problems`]; it never reads past the damage.
///
/// # Errors
/// [`Error::NotALog`] when `dir` holds no log; I/O and decoding errors.
pub fn dump(
    dir: &Path,
    storage: Arc<dyn Storage>,
    from: Lsn,
    out: &mut dyn Write,
) -> Result<DumpReport> {
    let options = DumpOptions {
        from,
        ..DumpOptions::default()
    };
    dump_with(dir, storage, options, out)
}

/// [`dump`] of the records from `options.from` to `options.to`, at most `options.limit` of
/// them, in `options.format`. The damage rules are `dump`'s: never past the first damage, which
/// is returned in [`DumpReport::problems`] when the range reaches it.
///
/// # Errors
/// As [`dump`].
pub fn dump_with(
    dir: &Path,
    storage: Arc<dyn Storage>,
    options: DumpOptions,
    out: &mut dyn Write,
) -> Result<DumpReport> {
    let report = verify(dir, storage.as_ref())?;
    let mut dumped = DumpReport {
        codec: report.codec,
        problems: report.problems.clone(),
        ..DumpReport::default()
    };
    let Some(codec) = report.codec else {
        return Ok(dumped);
    };
    let from = options.from;
    // Stop before a torn tail (it is not part of the log) and before the first damage.
    let mut end = report.last_lsn.map_or(Lsn::FIRST, Lsn::next);
    if let Some(damage) = report.valid_prefix_end {
        end = end.min(damage);
    }
    if let Some(to) = options.to {
        // Damage past the range asked for is not this dump's to report.
        if to.next() <= end {
            dumped.problems.clear();
        }
        end = end.min(to.next());
    }
    let segments: Vec<SegmentFile> = report
        .segments
        .iter()
        .filter(|s| s.start < end && s.scan.is_some())
        .map(|s| SegmentFile {
            start: s.start,
            path: s.path.clone(),
        })
        .collect();
    // Field names kept once for the log (compact MessagePack records are arrays).
    let schema = crate::schema::load(storage.as_ref(), dir);
    let mut reader = RawReader::new(storage, segments, from, end, u32::MAX, false);
    while let Some(item) = reader.next_record() {
        if options.limit.is_some_and(|limit| dumped.records >= limit) {
            // The damage, if any, lies past what was asked for.
            dumped.problems.clear();
            break;
        }
        let (lsn, payload) = item?;
        let size = payload.len() as u64;
        dumped.first.get_or_insert(lsn);
        dumped.last = Some(lsn);
        dumped.min_payload = if dumped.records == 0 {
            size
        } else {
            dumped.min_payload.min(size)
        };
        dumped.max_payload = dumped.max_payload.max(size);
        dumped.payload_bytes += size;
        if options.format == DumpFormat::Stats {
            dumped.records += 1;
            continue;
        }
        let record = codec
            .to_json_value(payload)
            .map_err(|source| Error::Codec {
                lsn: Some(lsn),
                source,
            })?;
        let record = match &schema {
            Some(schema) => crate::schema::render(record, schema),
            None => record,
        };
        let written = match options.format {
            DumpFormat::Text => writeln!(out, "lsn {lsn}  len {size}  {record}"),
            _ => writeln!(
                out,
                "{}",
                serde_json::json!({ "lsn": lsn.get(), "record": record })
            ),
        };
        written.map_err(|e| Error::io("write", "<output>", e))?;
        dumped.records += 1;
    }
    if options.limit.is_some_and(|limit| dumped.records >= limit) {
        // Every record asked for was read: the damage, if any, lies past them.
        dumped.problems.clear();
    }
    Ok(dumped)
}

/// Repairs the log in `dir` by opening it for writing: a torn tail is cut, and with
/// `cut_corrupt_suffix` so is everything from the first damage `verify` reports on. Every
/// removed byte and segment is kept in a `salvage-lsn-<first cut>-<ISO time>/` folder inside
/// `dir`.
///
/// Damage to a whole segment (an unreadable or mismatched header, or records missing before it
/// because a segment was lost or cut short) moves that segment and every later one aside;
/// damage inside a segment is cut there by the open. When the oldest segment's header is
/// unreadable nothing of the log can be trusted (not even its codec and record type): every
/// segment is moved aside and the directory no longer holds a log.
///
/// # Errors
/// [`Error::NotALog`] when `dir` holds no log; without `cut_corrupt_suffix`, corruption is an
/// error and nothing is changed.
pub fn repair(
    dir: &Path,
    storage: Arc<dyn Storage>,
    cut_corrupt_suffix: bool,
) -> Result<RecoveryReport> {
    log_segments(dir, storage.as_ref())?;
    let mut set_aside = RecoveryReport::default();
    if cut_corrupt_suffix {
        set_aside = set_aside_damaged_segments(dir, storage.as_ref())?;
        if set_aside.segments == 0 {
            return Ok(set_aside);
        }
    }
    let listing = segment::list(storage.as_ref(), dir)?;
    let first = &listing.segments[0];
    let file = storage
        .open(&first.path, OpenMode::Read)
        .map_err(|e| Error::io("open", &first.path, e))?;
    let header = segment::read_header(file.as_ref(), &first.path)?;
    // New segments get the first one's capacity, cut to what a version 2 segment can have (a
    // version 1 log may have bigger segments).
    let options = WalOptions::default()
        .codec(header.codec)
        .storage(storage)
        .create_if_missing(false)
        .segment_bytes(header.capacity.min(MAX_CAPACITY_V2))
        .recovery(if cut_corrupt_suffix {
            RecoveryMode::KeepValidPrefix
        } else {
            RecoveryMode::Strict
        });
    let log = Log::open_inner(dir, options, header.type_tag, true)?;
    let mut report = log.recovery_report().clone();
    set_aside.damage.append(&mut report.damage);
    report.damage = set_aside.damage;
    report.salvage_dir = report.salvage_dir.or(set_aside.salvage_dir);
    Ok(report)
}

/// Moves aside, durably, the segments from the first one that is damaged as a whole (see
/// [`repair`]). Returns what it moved in `damage` and `salvage_dir`, and in `segments` how many
/// segments are left.
fn set_aside_damaged_segments(dir: &Path, storage: &dyn Storage) -> Result<RecoveryReport> {
    let verdict = verify(dir, storage)?;
    let mut report = RecoveryReport {
        segments: verdict.segments.len(),
        ..RecoveryReport::default()
    };
    let Some(end) = verdict.valid_prefix_end else {
        return Ok(report);
    };
    let whole_segment_damage = |s: &SegmentReport| match &s.header {
        Err(_) => true,
        Ok(header) => header.start_lsn != s.start || Some(header.codec) != verdict.codec,
    };
    let Some(from) = verdict.segments.iter().position(|s| {
        s.start > end || (s.start == end && (whole_segment_damage(s) || s.scan.is_none()))
    }) else {
        return Ok(report);
    };
    // The oldest segment's header decides the codec and record type: if it is the damaged one
    // while a later header is fine, the later segments do not belong to a log we can name.
    let salvage = dir.join(crate::recovery::salvage_name(
        end,
        std::time::SystemTime::now(),
    ));
    storage
        .create_dir_all(&salvage)
        .map_err(|e| Error::io("create directory", &salvage, e))?;
    let first_moved = &verdict.segments[from];
    report.damage.push((
        first_moved.path.clone(),
        Damage {
            offset: 0,
            expected_lsn: end,
            reason: verdict
                .problems
                .first()
                .cloned()
                .unwrap_or_else(|| "damaged segment".to_owned()),
            resumes_at: None,
        },
    ));
    for moved in &verdict.segments[from..] {
        let to = salvage.join(moved.path.file_name().expect("segment name"));
        storage
            .rename(&moved.path, &to)
            .map_err(|e| Error::io("move aside", &moved.path, e))?;
    }
    for synced in [&salvage, dir] {
        storage
            .sync_dir(synced)
            .map_err(|e| Error::io("fsync directory", synced, e))?;
    }
    report.segments = from;
    report.salvage_dir = Some(salvage);
    Ok(report)
}

/// What [`read_available`] found: records in log order, where the next read may start, and the
/// segment files the records came from (a follower syncs them before it trusts the records).
#[derive(Debug)]
pub struct Available {
    pub codec: Codec,
    pub records: Vec<(Lsn, Vec<u8>)>,
    pub next: Option<ReadPoint>,
    pub segments: Vec<PathBuf>,
}

/// Reads up to `max` records from LSN `from` out of the log in `dir` while another process
/// appends to it (a standby's mirror, written by its daemon): read only, taking no lock. It
/// stops quietly where the newest segment's written bytes end, including at a frame that is
/// still being written (it fails its checks: it is read again next time); damage anywhere
/// before the newest segment is an error. `at`, a [`ReadPoint`] returned by an earlier call,
/// saves reading the segment from its beginning again.
///
/// # Errors
/// [`Error::NotALog`] when `dir` holds no log; [`Error::Truncated`] when `from` is below the
/// log's first segment (the records asked for are gone); I/O errors; damage before the newest
/// segment.
pub fn read_available(
    dir: &Path,
    storage: Arc<dyn Storage>,
    from: Lsn,
    max: usize,
    at: Option<ReadPoint>,
) -> Result<Available> {
    let listing = log_segments(dir, storage.as_ref())?;
    let segments = listing.segments;
    let first = segments[0].start;
    if from < first {
        return Err(Error::Truncated { lsn: from, first });
    }
    let codec = {
        let file = storage
            .open(&segments[0].path, OpenMode::Read)
            .map_err(|e| Error::io("open", &segments[0].path, e))?;
        segment::read_header(file.as_ref(), &segments[0].path)?.codec
    };
    let newest = segments.last().map(|s| s.start).unwrap_or(first);
    let paths: Vec<(Lsn, PathBuf)> = segments.iter().map(|s| (s.start, s.path.clone())).collect();
    let mut reader = RawReader::new(storage, segments, from, Lsn::new(u64::MAX), u32::MAX, false);
    reader.end_at_tail();
    if let Some(point) = at {
        reader.start_at(point);
    }
    let mut available = Available {
        codec,
        records: Vec::new(),
        next: None,
        segments: Vec::new(),
    };
    let segment_of = |lsn: Lsn, found: &mut Vec<PathBuf>| {
        if let Some((_, path)) = paths.iter().rev().find(|(start, _)| *start <= lsn) {
            if found.last() != Some(path) {
                found.push(path.clone());
            }
        }
    };
    while available.records.len() < max {
        let point = reader.read_point();
        match reader.next_record() {
            Some(Ok((lsn, payload))) => {
                available.records.push((lsn, payload.to_vec()));
                segment_of(lsn, &mut available.segments);
            }
            None => break,
            Some(Err(error)) => {
                // The bytes after the last complete record of the newest segment are the
                // writer's, not damage. (A reader stopping in an older segment was not at the
                // tail: that segment is complete, so what fails there is damage.)
                let in_newest = point.is_none_or(|p| p.segment_start >= newest);
                if in_newest && matches!(error, Error::Corruption(_)) {
                    break;
                }
                return Err(error);
            }
        }
    }
    available.next = reader.read_point();
    Ok(available)
}
