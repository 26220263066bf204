//! Cutting a log back to an LSN without losing what is cut: a node that was the primary before
//! a failover rejoins as the standby, and its records after the point it shares with the new
//! primary (the divergence point) must go, but they may include records acknowledged at
//! `buffered` or `disk` that no other node ever held. [`cut_after`] keeps them in a salvage
//! folder first, then cuts.
//!
//! Invariants:
//! - **Kept before cut.** Every segment holding a record after the cut is copied whole, written
//!   and synced, into `SALVAGE_ROOT/<log>/<unix ms>-from-<first cut LSN>/`, the folder synced,
//!   and `SALVAGE.json` written and synced last: its presence marks a complete copy. Only then is
//!   the live log touched.
//! - **Every step leaves a log that opens.** Later segments are removed newest first (each step a
//!   shorter valid log), then the segment holding the cut point is shortened to the end of the
//!   last kept frame and extended again with zeros (a crash between leaves a short file, which
//!   opens as a clean end). A crash anywhere leaves the old log or a shorter one whose records
//!   beyond the cut are all in a complete salvage copy; cutting again is safe.
//! - **The term history follows the log**: entries beginning after the cut are dropped last.
//! - A copy in salvage is an ordinary log directory: `stela wal dump` and `Wal::open` read it
//!   (from its first segment's start LSN).

use crate::error::{Error, Result};
use crate::files::LogFiles;
use crate::options::WalOptions;
use crate::scan::scan_segment;
use crate::storage::{OpenMode, Storage};
use crate::TermStore;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};
use stela_format::header::{SegmentHeader, HEADER_BYTES};
use stela_format::Lsn;

/// The file that marks a complete salvage copy and says what it holds.
pub const MANIFEST: &str = "SALVAGE.json";

/// What a cut kept, as `SALVAGE.json` records it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Salvaged {
    /// The log's directory name.
    pub log: String,
    /// Why it was cut (who the new primary is, which term).
    pub reason: String,
    /// The first LSN cut from the live log, and the last.
    pub cut_from_lsn: u64,
    pub last_lsn: u64,
    pub records: u64,
    /// Bytes of the cut frames.
    pub bytes: u64,
    /// The log's term history at the cut: (term, first LSN).
    pub terms: Vec<(u64, u64)>,
    pub at_unix_ms: u64,
    /// Where the copy is (not stored: filled in when listed).
    #[serde(skip)]
    pub dir: PathBuf,
}

/// One folder under a salvage root, complete or not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SalvageEntry {
    pub dir: PathBuf,
    /// `None`: no readable `SALVAGE.json`: a copy a crash interrupted (the live log was not cut
    /// for it).
    pub manifest: Option<Salvaged>,
}

/// Cuts the log in `dir` after `after_lsn`, keeping the records after it in a new folder under
/// `salvage_root` first. `Ok(None)`: the log ends at or before `after_lsn`; nothing was done.
///
/// # Errors
/// The log cannot be opened (damage, a lock), the cut point is before the log's first record
/// (only a full copy can help then), or a copy, removal, truncation or sync failed (the log is
/// then the old one or a shorter one, and what it lost is in a complete salvage copy).
pub fn cut_after(
    dir: &Path,
    options: WalOptions,
    type_tag: &str,
    after_lsn: u64,
    salvage_root: &Path,
    reason: &str,
) -> Result<Option<Salvaged>> {
    let storage = std::sync::Arc::clone(&options.storage);
    let files = LogFiles::open(dir, options, type_tag)?;
    let last = files.next_lsn.get() - 1;
    if last <= after_lsn {
        drop(files);
        drop_history_after(&storage, dir, after_lsn)?;
        return Ok(None);
    }
    let cut_from = after_lsn + 1;
    let segments = files.segments.list();
    let first = segments.first().map_or(1, |s| s.start.get());
    if cut_from < first || (cut_from == first && first > 1) {
        return Err(Error::CutRefused {
            dir: dir.to_owned(),
            reason: format!(
                "the cut point (after LSN {after_lsn}) is before the log's first record ({first}): only a full copy can bring this copy in line"
            ),
        });
    }
    // The segment holding the first cut record, and those after it.
    let at = segments
        .iter()
        .rposition(|s| s.start.get() <= cut_from)
        .unwrap_or(0);
    let doomed = &segments[at..];
    let plan = plan_cut(&storage, dir, doomed, after_lsn, files.segments.max_payload)?;
    // 1. The copy, complete before anything is cut.
    let terms = TermStore::open(std::sync::Arc::clone(&storage), dir)?;
    let manifest = Salvaged {
        log: dir
            .file_name()
            .map_or_else(|| "log".to_owned(), |n| n.to_string_lossy().into_owned()),
        reason: reason.to_owned(),
        cut_from_lsn: cut_from,
        last_lsn: last,
        records: last - after_lsn,
        bytes: plan.cut_bytes,
        terms: terms
            .history()
            .entries()
            .iter()
            .map(|&(t, f)| (t.0, f))
            .collect(),
        at_unix_ms: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
        dir: PathBuf::new(),
    };
    let manifest = write_copy(storage.as_ref(), dir, salvage_root, doomed, manifest)?;
    // 2. The live log. Its writer holds no data we need (recovery synced it); drop it before
    // the files under it change, but keep the directory lock (in the segment set) until done.
    let LogFiles {
        writer, segments, ..
    } = files;
    drop(writer);
    cut_live(storage.as_ref(), dir, doomed, cut_from, plan.keep_bytes)?;
    drop(segments);
    // 3. The term history follows.
    let mut terms = terms;
    terms.truncate_after(after_lsn)?;
    tracing::warn!(
        log = %dir.display(),
        cut_from,
        last,
        records = manifest.records,
        salvage = %manifest.dir.display(),
        reason,
        "cut the log; the records cut are kept in salvage"
    );
    Ok(Some(manifest))
}

/// Nothing to cut: a history entry beginning after the cut point (a crash after an earlier cut,
/// before its last step) still goes, as the cut would have done.
fn drop_history_after(
    storage: &std::sync::Arc<dyn Storage>,
    dir: &Path,
    after_lsn: u64,
) -> Result<()> {
    let mut terms = TermStore::open(std::sync::Arc::clone(storage), dir)?;
    if terms
        .history()
        .entries()
        .iter()
        .any(|&(_, first)| first > after_lsn)
    {
        terms.truncate_after(after_lsn)?;
    }
    Ok(())
}

/// Where a cut ends the kept data, and how much it removes.
struct CutPlan {
    /// Where frame `after_lsn` ends in the first doomed segment (its header's end if that
    /// segment starts with the first cut record).
    keep_bytes: u64,
    /// Bytes of the cut frames.
    cut_bytes: u64,
}

/// Reads the `doomed` segments (the one holding the first cut record, and those after it) and
/// finds where the kept records end and how many bytes are cut.
fn plan_cut(
    storage: &std::sync::Arc<dyn Storage>,
    dir: &Path,
    doomed: &[crate::segment::SegmentFile],
    after_lsn: u64,
    max_payload: u32,
) -> Result<CutPlan> {
    let cut_from = after_lsn + 1;
    let mut plan = CutPlan {
        keep_bytes: HEADER_BYTES as u64,
        cut_bytes: 0,
    };
    for (i, segment) in doomed.iter().enumerate() {
        let file = storage
            .open(&segment.path, OpenMode::Read)
            .map_err(|e| Error::io("open", &segment.path, e))?;
        let bytes = file
            .read_to_vec()
            .map_err(|e| Error::io("read", &segment.path, e))?;
        let header =
            SegmentHeader::decode(bytes.get(..HEADER_BYTES).unwrap_or(&[])).map_err(|reason| {
                Error::BadHeader {
                    segment: segment.path.clone(),
                    reason,
                }
            })?;
        let is_last = i + 1 == doomed.len();
        let whole = scan_segment(
            &bytes,
            segment.start,
            header.layout,
            is_last,
            max_payload,
            false,
        );
        if i == 0 && segment.start.get() < cut_from {
            // The kept part: the records up to `after_lsn`, scanned alone.
            let kept_records = (after_lsn + 1 - segment.start.get()) as usize;
            plan.keep_bytes = end_of_records(&bytes, segment.start, header.layout, kept_records)
                .ok_or_else(|| Error::CutRefused {
                    dir: dir.to_owned(),
                    reason: format!(
                        "{}: LSN {after_lsn} is not where the scan finds it",
                        segment.path.display()
                    ),
                })?;
            plan.cut_bytes += whole.end_offset.saturating_sub(plan.keep_bytes);
        } else {
            plan.cut_bytes += whole.end_offset.saturating_sub(HEADER_BYTES as u64);
        }
    }
    debug_assert!(plan.keep_bytes >= HEADER_BYTES as u64);
    Ok(plan)
}

/// Copies the `doomed` segments whole into a new folder under `salvage_root`, synced, then
/// writes and syncs `SALVAGE.json` last (its presence marks a complete copy). Returns the
/// manifest with its folder filled in.
fn write_copy(
    storage: &dyn Storage,
    dir: &Path,
    salvage_root: &Path,
    doomed: &[crate::segment::SegmentFile],
    mut manifest: Salvaged,
) -> Result<Salvaged> {
    let copy_dir = salvage_root.join(&manifest.log).join(format!(
        "{}-from-{}",
        manifest.at_unix_ms, manifest.cut_from_lsn
    ));
    storage
        .create_dir_all(&copy_dir)
        .map_err(|e| Error::io("create directory", &copy_dir, e))?;
    for segment in doomed {
        copy_file(storage, &segment.path, &copy_dir)?;
    }
    storage
        .sync_dir(&copy_dir)
        .map_err(|e| Error::io("fsync directory", &copy_dir, e))?;
    manifest.dir = copy_dir.clone();
    let json = serde_json::to_vec_pretty(&manifest).map_err(|e| Error::CutRefused {
        dir: dir.to_owned(),
        reason: format!("encoding {MANIFEST}: {e}"),
    })?;
    write_synced(storage, &copy_dir.join(MANIFEST), &json)?;
    storage
        .sync_dir(&copy_dir)
        .map_err(|e| Error::io("fsync directory", &copy_dir, e))?;
    Ok(manifest)
}

/// Cuts the live log: the later segments newest first (each step a shorter valid log), then
/// the segment holding the cut point shortened to `keep_bytes` and extended again with zeros.
fn cut_live(
    storage: &dyn Storage,
    dir: &Path,
    doomed: &[crate::segment::SegmentFile],
    cut_from: u64,
    keep_bytes: u64,
) -> Result<()> {
    let (first_doomed, later) = doomed.split_first().expect("at least one segment");
    let keep_first = first_doomed.start.get() < cut_from;
    let removable: Vec<_> = if keep_first {
        later.iter().collect()
    } else {
        doomed.iter().collect()
    };
    // The mark may name a segment about to go, or an offset about to be cut: it claims nothing
    // until the next open writes the true one (a crash in between leaves a log that opens).
    crate::synced::forget(storage, dir)?;
    crate::files::SegmentSet::remove_one_by_one(storage, dir, removable.iter().rev().copied())?;
    if !keep_first {
        return Ok(());
    }
    let file = storage
        .open(&first_doomed.path, OpenMode::ReadWrite)
        .map_err(|e| Error::io("open", &first_doomed.path, e))?;
    let capacity = file
        .len()
        .map_err(|e| Error::io("size of", &first_doomed.path, e))?;
    file.set_len(keep_bytes)
        .and_then(|()| file.sync_data())
        .map_err(|e| Error::io("truncate", &first_doomed.path, e))?;
    // Back to its capacity, as zeros: the writer expects a preallocated segment.
    file.allocate(capacity)
        .and_then(|()| file.sync_data())
        .map_err(|e| Error::io("preallocate", &first_doomed.path, e))
}

/// The offset just past the first `records` frames of a segment's bytes, if they are all there.
fn end_of_records(
    bytes: &[u8],
    start: Lsn,
    layout: stela_format::frame::Layout,
    records: usize,
) -> Option<u64> {
    let mut pos = HEADER_BYTES;
    let mut expected = start;
    for _ in 0..records {
        match stela_format::frame::decode(layout, bytes.get(pos..)?) {
            stela_format::frame::Decoded::Record(rec) if rec.lsn == expected => {
                pos += rec.frame_len();
                expected = rec.lsn.next();
            }
            _ => return None,
        }
    }
    Some(pos as u64)
}

fn copy_file(storage: &dyn Storage, from: &Path, to_dir: &Path) -> Result<()> {
    let bytes = storage
        .open(from, OpenMode::Read)
        .and_then(|f| f.read_to_vec())
        .map_err(|e| Error::io("read", from, e))?;
    let name = from.file_name().unwrap_or_default();
    write_synced(storage, &to_dir.join(name), &bytes)
}

fn write_synced(storage: &dyn Storage, path: &Path, bytes: &[u8]) -> Result<()> {
    let _ = storage.remove(path);
    let file = storage
        .open(path, OpenMode::CreateNew)
        .map_err(|e| Error::io("create", path, e))?;
    file.write_all_at(bytes, 0)
        .map_err(|e| Error::io("write", path, e))?;
    file.sync_data()
        .map_err(|e| Error::io("fdatasync", path, e))
}

/// Every folder under `salvage_root/<log>/`, oldest first, with its manifest if complete.
///
/// # Errors
/// A folder cannot be listed.
pub fn list(storage: &dyn Storage, salvage_root: &Path) -> Result<Vec<SalvageEntry>> {
    let mut entries = Vec::new();
    let logs = match storage.list(salvage_root) {
        Ok(logs) => logs,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(entries),
        Err(e) => return Err(Error::io("list", salvage_root, e)),
    };
    for log in logs {
        let log_dir = salvage_root.join(&log);
        let Ok(copies) = storage.list(&log_dir) else {
            continue;
        };
        for copy in copies {
            let dir = log_dir.join(&copy);
            let manifest = storage
                .open(&dir.join(MANIFEST), OpenMode::Read)
                .and_then(|f| f.read_to_vec())
                .ok()
                .and_then(|bytes| serde_json::from_slice::<Salvaged>(&bytes).ok())
                .map(|mut m| {
                    m.dir = dir.clone();
                    m
                });
            entries.push(SalvageEntry { dir, manifest });
        }
    }
    entries.sort_by_key(|e| e.manifest.as_ref().map_or(0, |m| m.at_unix_ms));
    Ok(entries)
}
