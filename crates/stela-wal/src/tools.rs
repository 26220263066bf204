//! Offline tools over a log directory: verify (read only), dump (read only), repair.
//! These back `stela wal verify|dump|repair`; they need no knowledge of the record type.

use crate::error::{Error, Result};
use crate::log::Log;
use crate::options::{RecoveryMode, WalOptions};
use crate::reader::RawReader;
use crate::recovery::RecoveryReport;
use crate::scan::{scan_segment, Damage, SegmentScan, TornTail};
use crate::segment::{self, SegmentFile};
use crate::storage::{OpenMode, Storage};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use stela_format::header::MAX_CAPACITY_V2;
use stela_format::{Codec, Lsn, SegmentHeader};

/// One segment as `verify` saw it.
#[derive(Debug)]
pub struct SegmentReport {
    pub path: PathBuf,
    pub start: Lsn,
    pub header: std::result::Result<SegmentHeader, String>,
    pub scan: Option<SegmentScan>,
}

/// Everything `verify` found. The log is clean when `problems` is empty; a torn tail is
/// reported but is not a problem (opening the log removes it).
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
}

impl VerifyReport {
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Checks every segment of the log in `dir` without changing anything: headers, checksums, LSN
/// continuity within and across segments. Reports all damage, not only the first.
pub fn verify(dir: &Path, storage: &dyn Storage) -> Result<VerifyReport> {
    let listing = segment::list(storage, dir)?;
    let mut report = VerifyReport::default();
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
            header: header.as_ref().map(Clone::clone).map_err(|e| e.to_string()),
            scan: None,
        };
        let header = match header {
            Ok(header) => header,
            Err(error) => {
                report.problems.push(error.to_string());
                report.segments.push(entry);
                expected = None;
                continue;
            }
        };
        match report.codec {
            None => report.codec = Some(header.codec),
            Some(codec) if codec != header.codec => report.problems.push(format!(
                "{}: codec {} differs from earlier segments' {codec}",
                seg.path.display(),
                header.codec
            )),
            Some(_) => {}
        }
        if header.start_lsn != seg.start {
            report.problems.push(format!(
                "{}: header says first LSN {}, file name says {}",
                seg.path.display(),
                header.start_lsn,
                seg.start
            ));
        }
        if let Some(exp) = expected.filter(|&e| e != seg.start) {
            report.problems.push(format!(
                "{}: records {exp}..{} are missing before this segment",
                seg.path.display(),
                seg.start
            ));
        }
        let bytes = file
            .read_to_vec()
            .map_err(|e| Error::io("read", &seg.path, e))?;
        let scan = scan_segment(&bytes, seg.start, header.layout, is_last, u32::MAX, true);
        report.records += scan.records;
        if report.first_lsn.is_none() {
            report.first_lsn = scan.first_lsn;
        }
        if scan.last_lsn.is_some() {
            report.last_lsn = scan.last_lsn;
        }
        for damage in &scan.damage {
            report.problems.push(describe(&seg.path, damage));
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

/// Writes every record of the log in `dir` as a JSON line `{"lsn":N,"record":...}` (postcard
/// payloads, which cannot be decoded without their type, as `{"hex":"..."}`). Read only. Stops
/// with an error at damage, after writing every record before it.
pub fn dump(dir: &Path, storage: Arc<dyn Storage>, from: Lsn, out: &mut dyn Write) -> Result<u64> {
    let report = verify(dir, storage.as_ref())?;
    let Some(codec) = report.codec else {
        return Ok(0);
    };
    let segments: Vec<SegmentFile> = report
        .segments
        .iter()
        .map(|s| SegmentFile {
            start: s.start,
            path: s.path.clone(),
        })
        .collect();
    // Stop before a torn tail: it is not part of the log.
    let end = report.last_lsn.map_or(Lsn::FIRST, Lsn::next);
    let mut reader = RawReader::new(storage, segments, from, end, u32::MAX, false);
    let mut written = 0;
    while let Some(item) = reader.next_record() {
        let (lsn, payload) = item?;
        let record = codec
            .to_json_value(payload)
            .map_err(|source| Error::Codec {
                lsn: Some(lsn),
                source,
            })?;
        let line = serde_json::json!({ "lsn": lsn.get(), "record": record });
        writeln!(out, "{line}").map_err(|e| Error::io("write", "<output>", e))?;
        written += 1;
    }
    Ok(written)
}

/// Repairs the log in `dir` by opening it for writing: a torn tail is cut, and with
/// `cut_corrupt_suffix` so is everything from the first damage on. Every removed byte and
/// segment is kept in a `salvage-<unix-ms>/` folder inside `dir`.
pub fn repair(
    dir: &Path,
    storage: Arc<dyn Storage>,
    cut_corrupt_suffix: bool,
) -> Result<RecoveryReport> {
    let listing = segment::list(storage.as_ref(), dir)?;
    let Some(first) = listing.segments.first() else {
        return Ok(RecoveryReport::default());
    };
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
    Ok(log.recovery_report().clone())
}
