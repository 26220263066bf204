//! Bad input and failing storage: each has a test that provokes it and checks the error says what
//! went wrong and where (its `Display` names the file, offset, LSN, codec or type involved), that
//! a refused open changed nothing on disk, and that after a failed write, fsync or full disk no
//! acknowledged record is lost and no call hangs or pretends to succeed.
//!
//! Covered: wrong codec, wrong record type, damage in the middle of a segment (refused in
//! `Strict`, cut in `KeepValidPrefix`, skipped in `SkipCorrupt`, reported once by the iterator),
//! damage in a sealed segment, a missing segment, a damaged segment header, torn tails (written
//! by hand and left by simulated power cuts), a full disk, a failed fsync with concurrent
//! waiters, payloads that do not decode as the record type, and the API misuses (oversized
//! record, commit of an unappended LSN, a second open, a missing directory).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};
use stela_wal::storage::{Call, CrashPlan, FaultStorage, Hooked, Hooks, OpenMode, Storage};
use stela_wal::{Codec, Error, Log, Lsn, RecoveryMode, Wal, WalOptions};

/// Segment header and frame header sizes, from docs/FORMAT.md.
const SEGMENT_HEADER: usize = 256;
const FRAME_HEADER: usize = 20;

const SMALL_SEGMENT: u64 = 1024;

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Rec {
    id: u32,
    note: String,
    pairs: Vec<(u32, u32)>,
}

/// Another record type, to open a log of `Rec` as.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Other {
    name: String,
}

fn rec(id: u32) -> Rec {
    Rec {
        id,
        note: format!("note {id}"),
        pairs: vec![(id, id + 1), (7, 8)],
    }
}

fn recs(ids: Range<u32>) -> Vec<Rec> {
    ids.map(rec).collect()
}

fn numbered(records: &[Rec]) -> Vec<(Lsn, Rec)> {
    records
        .iter()
        .enumerate()
        .map(|(i, r)| (Lsn::new(i as u64 + 1), r.clone()))
        .collect()
}

fn collect(wal: &Wal<Rec>) -> Vec<(Lsn, Rec)> {
    wal.iter().unwrap().collect::<Result<Vec<_>, _>>().unwrap()
}

/// The error a poisoned log's `Poisoned` wraps, or the error itself.
fn root(error: &Error) -> &Error {
    match error {
        Error::Poisoned { cause } => root(cause),
        other => other,
    }
}

fn std_options(codec: Codec, segment_bytes: u64) -> WalOptions {
    WalOptions::default()
        .codec(codec)
        .segment_bytes(segment_bytes)
}

/// Writes `records` durably into a new log in `dir`, committing each on its own: every record
/// is then framed after the sync that made its predecessor durable, so damage to any record but
/// the last is followed by a frame whose sync base says the damaged bytes had been synced (damage,
/// not a torn write).
fn write_log(dir: &Path, codec: Codec, segment_bytes: u64, records: &[Rec]) {
    let wal: Wal<Rec> = Wal::open(dir, std_options(codec, segment_bytes)).unwrap();
    for record in records {
        wal.append_durable(record).unwrap();
    }
    wal.close().unwrap();
}

fn segment_paths(dir: &Path) -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "wal"))
        .collect();
    paths.sort();
    paths
}

/// Every file below `dir` with its bytes, to show that an open changed nothing.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(snapshot(&path));
        } else {
            let bytes = std::fs::read(&path).unwrap();
            files.insert(path, bytes);
        }
    }
    files
}

/// Byte ranges of the frames of an intact segment, found by the format's length field alone.
fn frames(segment: &[u8]) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut pos = SEGMENT_HEADER;
    while pos + FRAME_HEADER <= segment.len() {
        let len = u32::from_le_bytes(segment[pos..pos + 4].try_into().unwrap()) as usize;
        let lsn = u64::from_le_bytes(segment[pos + 8..pos + 16].try_into().unwrap());
        if lsn == 0 {
            break;
        }
        out.push(pos..pos + FRAME_HEADER + len);
        pos += FRAME_HEADER + len;
    }
    out
}

fn write_at(path: &Path, offset: usize, bytes: &[u8]) {
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    file.write_all_at(bytes, offset as u64).unwrap();
}

/// Flips every bit of one payload byte of frame `index` of `path`; returns the frame's range.
fn damage_frame(path: &Path, index: usize) -> Range<usize> {
    let bytes = std::fs::read(path).unwrap();
    let frame = frames(&bytes)[index].clone();
    let at = frame.start + FRAME_HEADER + 1;
    write_at(path, at, &[!bytes[at]]);
    frame
}

fn name_of(path: &Path) -> String {
    path.file_name().unwrap().to_str().unwrap().to_string()
}

#[test]
fn wrong_codec_is_refused_naming_the_segment_and_both_codecs() {
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path(), Codec::Json, SMALL_SEGMENT, &recs(0..3));
    let before = snapshot(dir.path());
    let segment = &segment_paths(dir.path())[0];

    let error = Wal::<Rec>::open(dir.path(), std_options(Codec::MessagePack, SMALL_SEGMENT))
        .err()
        .expect("opened a JSON log as MessagePack");
    match &error {
        Error::WrongCodec {
            segment: named,
            found,
            expected,
        } => {
            assert_eq!(named, segment);
            assert_eq!((*found, *expected), (Codec::Json, Codec::MessagePack));
        }
        other => panic!("expected WrongCodec, got {other:?}"),
    }
    let message = error.to_string();
    for part in [&segment.display().to_string(), "json", "msgpack"] {
        assert!(message.contains(part), "{message:?} does not name {part}");
    }
    assert_eq!(snapshot(dir.path()), before);
}

#[test]
fn wrong_record_type_is_refused_naming_both_types() {
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path(), Codec::MessagePack, SMALL_SEGMENT, &recs(0..3));
    let before = snapshot(dir.path());

    let error = Wal::<Other>::open(dir.path(), std_options(Codec::MessagePack, SMALL_SEGMENT))
        .err()
        .expect("opened a log of Rec as Other");
    assert!(
        matches!(&error, Error::WrongRecordType { segment, .. } if *segment == segment_paths(dir.path())[0]),
        "{error:?}"
    );
    let message = error.to_string();
    for part in [
        stela_format::default_type_tag::<Rec>(),
        stela_format::default_type_tag::<Other>(),
        "type_tag".to_owned(),
    ] {
        assert!(message.contains(&part), "{message:?} does not name {part}");
    }
    assert_eq!(snapshot(dir.path()), before);

    // The tag is what is checked, not the Rust name: a renamed type reads the log once it
    // declares the old tag.
    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct RenamedRec {
        id: u32,
        note: String,
        pairs: Vec<(u32, u32)>,
    }
    let options =
        std_options(Codec::MessagePack, SMALL_SEGMENT).type_tag(std::any::type_name::<Rec>());
    let renamed = Wal::<RenamedRec>::open(dir.path(), options).unwrap();
    let first = renamed.iter().unwrap().next().unwrap().unwrap();
    assert_eq!(first.1.note, "note 0");
}

/// Ten records in one segment, the fifth damaged: a bad frame with valid ones after it.
fn log_with_damaged_middle(codec: Codec) -> (tempfile::TempDir, Vec<Rec>, Range<usize>) {
    let dir = tempfile::tempdir().unwrap();
    let records = recs(0..10);
    write_log(dir.path(), codec, 1 << 16, &records);
    let frame = damage_frame(&segment_paths(dir.path())[0], 4);
    (dir, records, frame)
}

#[test]
fn damage_in_the_middle_is_refused_naming_file_and_offset_and_changes_nothing() {
    let (dir, _, frame) = log_with_damaged_middle(Codec::Postcard);
    let segment = segment_paths(dir.path())[0].clone();
    let before = snapshot(dir.path());

    let error = Wal::<Rec>::open(dir.path(), std_options(Codec::Postcard, 1 << 16))
        .err()
        .expect("opened a damaged log in strict mode");
    let c = error.as_corruption().expect("a corruption error");
    assert_eq!(c.segment, segment);
    assert_eq!(c.offset, frame.start as u64);
    assert_eq!(c.expected_lsn, Lsn::new(5));
    assert_eq!(c.valid_record_at, Some(frame.end as u64));
    let message = error.to_string();
    for part in [
        name_of(&segment),
        format!("byte offset {}", frame.start),
        "LSN 5".to_string(),
        "checksum".to_string(),
    ] {
        assert!(message.contains(&part), "{message:?} does not say {part}");
    }
    assert_eq!(
        snapshot(dir.path()),
        before,
        "a refused open changed the disk"
    );
}

#[test]
fn keep_valid_prefix_cuts_at_the_damage_and_keeps_a_copy_of_the_cut() {
    let (dir, records, frame) = log_with_damaged_middle(Codec::Json);
    let segment = segment_paths(dir.path())[0].clone();
    let original = std::fs::read(&segment).unwrap();
    let options = || std_options(Codec::Json, 1 << 16);

    let wal: Wal<Rec> = Wal::open(
        dir.path(),
        options().recovery(RecoveryMode::KeepValidPrefix),
    )
    .unwrap();
    assert_eq!(collect(&wal), numbered(&records[..4]));
    let report = wal.recovery_report().clone();
    assert_eq!(report.damage.len(), 1, "{report:?}");
    assert_eq!(report.damage[0].0, segment);
    assert_eq!(report.damage[0].1.offset, frame.start as u64);
    // The cut bytes are kept, from the damage to the last record written.
    let salvage = report.salvage_dir.expect("a salvage folder");
    let kept =
        std::fs::read(salvage.join(format!("{}.from-{}", name_of(&segment), frame.start))).unwrap();
    let data_end = frames(&original).last().unwrap().end;
    assert_eq!(kept, original[frame.start..data_end]);
    let cut = std::fs::read(&segment).unwrap();
    assert!(cut[frame.start..].iter().all(|&b| b == 0));
    assert_eq!(cut[..frame.start], original[..frame.start]);

    // The log goes on from the prefix, and is clean for a strict open.
    let next = wal.append_durable(&rec(100)).unwrap();
    assert_eq!(next, Lsn::new(5));
    drop(wal);
    let wal: Wal<Rec> = Wal::open(dir.path(), options()).unwrap();
    assert!(wal.recovery_report().damage.is_empty() && wal.recovery_report().torn_tail.is_none());
    let mut expected = numbered(&records[..4]);
    expected.push((next, rec(100)));
    assert_eq!(collect(&wal), expected);
}

#[test]
fn skip_corrupt_reads_around_the_damage_and_changes_nothing() {
    let (dir, records, frame) = log_with_damaged_middle(Codec::MessagePack);
    let before = snapshot(dir.path());
    let options = std_options(Codec::MessagePack, 1 << 16).recovery(RecoveryMode::SkipCorrupt);
    let wal: Wal<Rec> = Wal::open(dir.path(), options).unwrap();
    let report = wal.recovery_report();
    assert_eq!(report.damage.len(), 1);
    assert_eq!(report.damage[0].1.offset, frame.start as u64);
    assert_eq!(report.damage[0].1.resumes_at, Some(frame.end as u64));
    let mut expected = numbered(&records);
    expected.remove(4);
    assert_eq!(collect(&wal), expected, "LSN 5 skipped, the rest intact");
    assert_eq!(wal.last_lsn(), Lsn::new(10));
    drop(wal);
    assert_eq!(snapshot(dir.path()), before);
}

/// Three or more segments of `SMALL_SEGMENT` bytes; returns the records.
fn log_with_segments(dir: &Path, codec: Codec) -> Vec<Rec> {
    let records = recs(0..80);
    write_log(dir, codec, SMALL_SEGMENT, &records);
    assert!(segment_paths(dir).len() >= 3, "{:?}", segment_paths(dir));
    records
}

#[test]
fn damage_in_a_sealed_segment_names_that_segment() {
    let dir = tempfile::tempdir().unwrap();
    log_with_segments(dir.path(), Codec::Postcard);
    let segments = segment_paths(dir.path());
    // The last record of the first segment: nothing valid follows it in its file, but the
    // segment was synced before its successor began, so this is damage, not a torn write.
    let last_frame = frames(&std::fs::read(&segments[0]).unwrap()).len() - 1;
    let frame = damage_frame(&segments[0], last_frame);
    let before = snapshot(dir.path());

    let error = Wal::<Rec>::open(dir.path(), std_options(Codec::Postcard, SMALL_SEGMENT))
        .err()
        .expect("opened with a damaged sealed segment");
    let c = error.as_corruption().expect("a corruption error");
    assert_eq!(c.segment, segments[0]);
    assert_eq!(c.offset, frame.start as u64);
    let message = error.to_string();
    assert!(message.contains(&name_of(&segments[0])), "{message}");
    assert!(message.contains("sealed segment"), "{message}");
    assert_eq!(snapshot(dir.path()), before);

    // A salvage open keeps the prefix and moves every later segment aside.
    let options =
        std_options(Codec::Postcard, SMALL_SEGMENT).recovery(RecoveryMode::KeepValidPrefix);
    let wal: Wal<Rec> = Wal::open(dir.path(), options).unwrap();
    assert_eq!(wal.last_lsn(), Lsn::new(last_frame as u64));
    assert_eq!(segment_paths(dir.path()), segments[..1]);
    let salvage = wal.recovery_report().salvage_dir.clone().unwrap();
    for moved in &segments[1..] {
        assert!(salvage.join(moved.file_name().unwrap()).exists());
    }
}

#[test]
fn damage_seen_first_by_the_iterator_is_reported_once_then_iteration_stops() {
    let dir = tempfile::tempdir().unwrap();
    let records = log_with_segments(dir.path(), Codec::MessagePack);
    let segments = segment_paths(dir.path());
    let frame = damage_frame(&segments[0], 2);

    // Without verify_on_open only the newest segment is checked at open; the reader finds the
    // damage in the first.
    let options = std_options(Codec::MessagePack, SMALL_SEGMENT).verify_on_open(false);
    let wal: Wal<Rec> = Wal::open(dir.path(), options).unwrap();
    let mut iter = wal.iter().unwrap();
    for expected in numbered(&records[..2]) {
        assert_eq!(iter.next().unwrap().unwrap(), expected);
    }
    let error = iter.next().unwrap().expect_err("damage must be an error");
    let c = error.as_corruption().expect("a corruption error");
    assert_eq!((&c.segment, c.offset), (&segments[0], frame.start as u64));
    let message = error.to_string();
    assert!(
        message.contains(&name_of(&segments[0]))
            && message.contains(&format!("byte offset {}", frame.start))
    );
    assert!(iter.next().is_none(), "iteration goes on after damage");
    assert!(iter.next().is_none());

    // Reading from a later segment does not pass the damage.
    let second: u64 = name_of(&segments[1])[..20].parse().unwrap();
    let expected: Vec<_> = numbered(&records)
        .into_iter()
        .filter(|(lsn, _)| lsn.get() >= second)
        .collect();
    assert_eq!(collect_from(&wal, Lsn::new(second)), expected);
}

fn collect_from(wal: &Wal<Rec>, from: Lsn) -> Vec<(Lsn, Rec)> {
    wal.iter_from(from)
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap()
}

fn mem_dir() -> PathBuf {
    PathBuf::from("/wal")
}

fn mem_options(storage: Arc<dyn Storage>, codec: Codec) -> WalOptions {
    WalOptions::default()
        .codec(codec)
        .segment_bytes(SMALL_SEGMENT)
        .storage(storage)
}

#[test]
fn damage_appearing_after_open_is_reported_by_the_iterator() {
    let fs = FaultStorage::new();
    let wal: Wal<Rec> =
        Wal::open(mem_dir(), mem_options(Arc::new(fs.clone()), Codec::Json)).unwrap();
    let last = wal.append_batch(&recs(0..5)).unwrap();
    wal.commit(last).unwrap();
    let path = mem_dir().join(format!("{:020}.wal", 1));
    let frame = frames(&fs.read_file(&path).unwrap())[2].clone();
    fs.corrupt(&path, frame.start + FRAME_HEADER, b"#");

    let mut iter = wal.iter().unwrap();
    assert_eq!(iter.next().unwrap().unwrap().0, Lsn::new(1));
    assert_eq!(iter.next().unwrap().unwrap().0, Lsn::new(2));
    let error = iter
        .next()
        .unwrap()
        .expect_err("changed record was returned");
    assert_eq!(error.as_corruption().unwrap().offset, frame.start as u64);
    assert_eq!(error.as_corruption().unwrap().expected_lsn, Lsn::new(3));
    assert!(iter.next().is_none());
}

#[test]
fn a_missing_segment_is_refused_even_by_salvage_and_skipped_by_skip_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let records = log_with_segments(dir.path(), Codec::Postcard);
    let segments = segment_paths(dir.path());
    std::fs::remove_file(&segments[1]).unwrap();
    let before = snapshot(dir.path());

    for mode in [RecoveryMode::Strict, RecoveryMode::KeepValidPrefix] {
        let options = std_options(Codec::Postcard, SMALL_SEGMENT).recovery(mode);
        let error = Wal::<Rec>::open(dir.path(), options)
            .err()
            .expect("opened with a gap");
        let c = error.as_corruption().expect("a corruption error");
        assert_eq!(c.segment, segments[2], "{mode:?}");
        assert!(error.to_string().contains("missing"), "{error}");
        assert_eq!(snapshot(dir.path()), before, "{mode:?}");
    }

    let options = std_options(Codec::Postcard, SMALL_SEGMENT).recovery(RecoveryMode::SkipCorrupt);
    let wal: Wal<Rec> = Wal::open(dir.path(), options).unwrap();
    let in_first = frames(&std::fs::read(&segments[0]).unwrap()).len();
    let third: usize = name_of(&segments[2])[..20].parse().unwrap();
    let expected: Vec<_> = numbered(&records)
        .into_iter()
        .filter(|(lsn, _)| (lsn.get() as usize) <= in_first || lsn.get() as usize >= third)
        .collect();
    assert_eq!(collect(&wal), expected);
}

#[test]
fn a_damaged_segment_header_is_a_bad_header_naming_the_segment() {
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path(), Codec::Json, SMALL_SEGMENT, &recs(0..3));
    let segment = segment_paths(dir.path())[0].clone();
    // A byte of the type tag: the header checksum catches it.
    write_at(&segment, 60, b"?");
    let before = snapshot(dir.path());
    let error = Wal::<Rec>::open(dir.path(), std_options(Codec::Json, SMALL_SEGMENT))
        .err()
        .expect("opened with a bad header");
    assert!(
        matches!(&error, Error::BadHeader { segment: s, .. } if *s == segment),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(
        message.contains(&segment.display().to_string()),
        "{message}"
    );
    assert!(message.contains("checksum"), "{message}");
    assert_eq!(snapshot(dir.path()), before);
}

/// Appends bytes after the last record of the newest segment, as a crash in mid-write leaves
/// them, opens, and checks the cut: reported, zeroed, gone for good.
fn check_torn_tail(codec: Codec, tail: impl FnOnce(usize) -> Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let records = recs(0..10);
    write_log(dir.path(), codec, 1 << 16, &records);
    let segment = segment_paths(dir.path())[0].clone();
    let data_end = frames(&std::fs::read(&segment).unwrap())
        .last()
        .unwrap()
        .end;
    let garbage = tail(records.len() + 1);
    write_at(&segment, data_end, &garbage);
    let dropped = garbage.iter().rposition(|&b| b != 0).unwrap() as u64 + 1;

    let wal: Wal<Rec> = Wal::open(dir.path(), std_options(codec, 1 << 16)).unwrap();
    let (path, torn) = wal
        .recovery_report()
        .torn_tail
        .clone()
        .expect("torn tail reported");
    assert_eq!(path, segment);
    assert_eq!(torn.offset, data_end as u64);
    assert_eq!(torn.bytes, dropped);
    assert!(!torn.reason.is_empty());
    assert_eq!(collect(&wal), numbered(&records));
    let bytes = std::fs::read(&segment).unwrap();
    assert!(
        bytes[data_end..].iter().all(|&b| b == 0),
        "torn bytes left on disk"
    );
    drop(wal);

    let wal: Wal<Rec> = Wal::open(dir.path(), std_options(codec, 1 << 16)).unwrap();
    assert!(
        wal.recovery_report().torn_tail.is_none(),
        "the cut did not stick"
    );
    let next = wal.append_durable(&rec(99)).unwrap();
    assert_eq!(next.get(), records.len() as u64 + 1);
}

#[test]
fn a_half_written_last_record_is_cut_as_a_torn_tail() {
    for codec in Codec::ALL {
        check_torn_tail(codec, |next_lsn| {
            let mut frame = Vec::new();
            let payload = codec.encode(&rec(1000)).unwrap();
            stela_format::frame::encode(
                &mut frame,
                Lsn::new(next_lsn as u64),
                &payload,
                stela_format::frame::MIN_SYNC_BASE,
            );
            frame.truncate(frame.len() - payload.len() / 2);
            frame
        });
    }
}

#[test]
fn garbage_after_the_last_record_is_cut_as_a_torn_tail() {
    check_torn_tail(Codec::MessagePack, |_| {
        (0..300u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8 | 1)
            .collect()
    });
}

/// Power cuts during unsynced writes, with the last write torn at a random byte and garbage to
/// the end of its sector: whatever survives, opening succeeds, keeps every acknowledged record,
/// yields a prefix of what was appended, and leaves nothing to cut for the next open.
#[test]
fn power_cuts_in_mid_write_never_lose_acknowledged_records() {
    for seed in 0..60 {
        let fs = FaultStorage::new();
        let storage: Arc<dyn Storage> = Arc::new(fs.clone());
        let wal: Wal<Rec> = Wal::open(
            mem_dir(),
            mem_options(Arc::clone(&storage), Codec::Postcard),
        )
        .unwrap();
        let records = recs(0..40);
        let acked = 5 + (seed % 20) as usize;
        for r in &records[..acked] {
            wal.append_durable(r).unwrap();
        }
        wal.append_batch(&records[acked..]).unwrap();
        wal.log().flush().unwrap();
        drop(wal);
        fs.crash(CrashPlan::TearUnsynced { seed });

        let wal: Wal<Rec> = Wal::open(
            mem_dir(),
            mem_options(Arc::clone(&storage), Codec::Postcard),
        )
        .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        let got = collect(&wal);
        assert!(
            got.len() >= acked,
            "seed {seed}: {} of {acked} acknowledged records",
            got.len()
        );
        assert_eq!(got, numbered(&records)[..got.len()], "seed {seed}");
        drop(wal);
        let wal: Wal<Rec> = Wal::open(mem_dir(), mem_options(storage, Codec::Postcard)).unwrap();
        assert!(wal.recovery_report().torn_tail.is_none(), "seed {seed}");
        assert_eq!(collect(&wal), got);
    }
}

fn used_bytes(fs: &FaultStorage) -> u64 {
    fs.file_names(&mem_dir())
        .iter()
        .map(|name| fs.read_file(&mem_dir().join(name)).unwrap().len() as u64)
        .sum()
}

/// Fills a log on a device with no room for another segment; returns the records appended,
/// how many were acknowledged, and the first error.
fn fill_disk(wal: &Wal<Rec>) -> (Vec<Rec>, usize, Error) {
    let mut appended = Vec::new();
    for id in 0..1000 {
        let r = rec(id);
        appended.push(r.clone());
        if let Err(error) = wal.append_durable(&r) {
            let acked = appended.len() - 1;
            return (appended, acked, error);
        }
    }
    panic!("1000 records fit on a full disk");
}

#[test]
fn a_full_disk_fails_the_commit_and_keeps_every_acknowledged_record() {
    let fs = FaultStorage::new();
    let storage: Arc<dyn Storage> = Arc::new(fs.clone());
    let wal: Wal<Rec> = Wal::open(
        mem_dir(),
        mem_options(Arc::clone(&storage), Codec::MessagePack),
    )
    .unwrap();
    // Room for what exists, not one more segment.
    fs.set_space_limit(Some(used_bytes(&fs)));
    let (appended, acked, error) = fill_disk(&wal);
    assert!(
        acked > 0,
        "the preallocated segment should have taken records"
    );
    assert!(matches!(root(&error), Error::DiskFull { .. }), "{error:?}");
    assert!(error.to_string().contains("no space"), "{error}");

    // The log has stopped: nothing more is accepted, and it says why.
    for later in [
        wal.append(&rec(5000)).map(|_| ()),
        wal.commit(Lsn::new(1)),
        wal.append_durable(&rec(5001)).map(|_| ()),
    ] {
        let later = later.expect_err("a call succeeded after the disk filled");
        assert!(matches!(later, Error::Poisoned { .. }), "{later:?}");
        assert!(matches!(root(&later), Error::DiskFull { .. }));
        assert!(later.to_string().contains("no space"), "{later}");
    }
    drop(wal);

    fs.crash(CrashPlan::LoseUnsynced);
    let wal: Wal<Rec> = Wal::open(mem_dir(), mem_options(storage, Codec::MessagePack)).unwrap();
    let got = collect(&wal);
    assert!(
        got.len() >= acked,
        "{} of {acked} acknowledged records",
        got.len()
    );
    assert_eq!(got, numbered(&appended)[..got.len()]);
    assert!(
        fs.file_names(&mem_dir())
            .iter()
            .all(|n| !n.ends_with(".tmp")),
        "half-made segment left behind"
    );
    // With space again (the crash lifted the limit) the log continues.
    let next = wal.append_durable(&rec(7)).unwrap();
    assert_eq!(next.get(), got.len() as u64 + 1);
}

/// docs/DURABILITY.md: "The commit that needed it fails with `Error::DiskFull`", and "every
/// later call gets `Error::Poisoned`": the first failure should reach its committer unwrapped.
#[test]

fn a_full_disk_reaches_the_committer_that_hit_it_as_disk_full() {
    let fs = FaultStorage::new();
    let wal: Wal<Rec> = Wal::open(
        mem_dir(),
        mem_options(Arc::new(fs.clone()), Codec::Postcard),
    )
    .unwrap();
    fs.set_space_limit(Some(used_bytes(&fs)));
    let (_, _, error) = fill_disk(&wal);
    assert!(matches!(error, Error::DiskFull { .. }), "{error:?}");
}

/// Holds the first fdatasync after `hold` until `n` appenders have arrived (so their commits
/// are in flight together) and records the outcome of every fdatasync.
#[derive(Debug, Default)]
struct Probe {
    state: Mutex<ProbeState>,
    arrivals: Condvar,
}

#[derive(Debug, Default)]
struct ProbeState {
    hold_for: Option<usize>,
    arrived: usize,
    /// Each `sync_data` call, in order: the file and whether it succeeded.
    syncs: Vec<(PathBuf, bool)>,
}

impl Probe {
    fn hold(&self, n: usize) {
        let mut state = self.state.lock().unwrap();
        state.hold_for = Some(n);
        state.arrived = 0;
    }

    fn arrive(&self) {
        self.state.lock().unwrap().arrived += 1;
        self.arrivals.notify_all();
    }

    fn syncs(&self) -> Vec<(PathBuf, bool)> {
        self.state.lock().unwrap().syncs.clone()
    }
}

impl Hooks for Probe {
    fn before(&self, call: &Call<'_>) -> io::Result<()> {
        // Segment syncs only: the synced-end mark (`SYNCED`) is synced by its own thread.
        if let Call::SyncData { path } = call {
            if !is_segment(path) {
                return Ok(());
            }
            let mut state = self.state.lock().unwrap();
            if let Some(n) = state.hold_for.take() {
                let wait;
                (state, wait) = self
                    .arrivals
                    .wait_timeout_while(state, Duration::from_secs(10), |s| s.arrived < n)
                    .unwrap();
                assert!(
                    !wait.timed_out(),
                    "only {} of {n} committers arrived",
                    state.arrived
                );
            }
        }
        Ok(())
    }

    fn after(&self, call: &Call<'_>, outcome: Result<(), &io::Error>) {
        if let Call::SyncData { path } = call {
            if !is_segment(path) {
                return;
            }
            let mut state = self.state.lock().unwrap();
            state.syncs.push((path.to_path_buf(), outcome.is_ok()));
        }
    }
}

/// A segment file, by the name it was opened under (`<lsn>.wal` or `<lsn>.wal.tmp`), not the
/// synced-end mark (`SYNCED`, `SYNCED.tmp`).
fn is_segment(path: &std::path::Path) -> bool {
    path.file_name()
        .is_some_and(|name| !name.to_string_lossy().starts_with("SYNCED"))
}

struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Drives a future on this thread; fails the test after 10 s instead of hanging.
fn block_on<F: Future + Unpin>(future: &mut F) -> F::Output {
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Poll::Ready(output) = Pin::new(&mut *future).poll(&mut Context::from_waker(&waker)) {
            return output;
        }
        let left = deadline
            .checked_duration_since(Instant::now())
            .expect("future not ready within 10 s");
        std::thread::park_timeout(left);
    }
}

/// A failed fdatasync while several committers wait on it: every one of them gets an error
/// (none hangs, none is told its record is durable), the log never calls fdatasync again (a
/// retry could report success for pages the kernel already dropped), every later call is
/// refused as poisoned, and a reopen after a power cut has every record acknowledged before.
#[test]
fn a_failed_fsync_fails_every_waiter_poisons_the_log_and_is_never_retried() {
    const COMMITTERS: usize = 4;
    let fs = FaultStorage::new();
    let storage = Hooked::wrap(Arc::new(fs.clone()), Probe::default());
    // A handle on the same hooks, for this test and its committer threads.
    let probe = storage.clone();
    let wal: Wal<Rec> =
        Wal::open(mem_dir(), mem_options(Arc::new(storage), Codec::Postcard)).unwrap();
    let acked = recs(0..5);
    for r in &acked {
        wal.append_durable(r).unwrap();
    }
    let syncs_before = probe.hooks().syncs().len();
    fs.fail_sync_after(0);
    probe.hooks().hold(COMMITTERS);

    let (results, received) = mpsc::channel();
    for t in 0..COMMITTERS {
        let wal = wal.clone();
        let probe = probe.clone();
        let results = results.clone();
        std::thread::spawn(move || {
            let lsn = wal.append(&rec(100 + t as u32)).unwrap();
            probe.hooks().arrive();
            results.send((lsn, wal.commit(lsn))).unwrap();
        });
    }
    for _ in 0..COMMITTERS {
        let (lsn, result) = received
            .recv_timeout(Duration::from_secs(10))
            .expect("a committer hung after the fsync failed");
        let error = result.expect_err("commit succeeded although its fsync failed");
        assert!(wal.durable_lsn() < lsn);
        match root(&error) {
            Error::Io { op, .. } => assert_eq!(*op, "fdatasync"),
            other => panic!("expected the fdatasync error, got {other:?}"),
        }
        assert!(
            error.to_string().contains("injected fsync failure"),
            "{error}"
        );
    }

    let later: Vec<Error> = vec![
        wal.append(&rec(200)).unwrap_err(),
        wal.commit(Lsn::new(1)).unwrap_err(),
        wal.append_durable(&rec(201)).unwrap_err(),
        block_on(&mut wal.commit_async(Lsn::new(6))).unwrap_err(),
        wal.clone().close().unwrap_err(),
    ];
    for error in &later {
        assert!(matches!(error, Error::Poisoned { .. }), "{error:?}");
        assert!(error.to_string().contains("fdatasync"), "{error}");
    }
    let syncs = probe.hooks().syncs();
    assert_eq!(
        syncs[syncs_before..]
            .iter()
            .map(|(_, ok)| *ok)
            .collect::<Vec<_>>(),
        [false],
        "after the failed fdatasync the log synced again: {syncs:?}"
    );
    drop(wal);

    fs.crash(CrashPlan::LoseUnsynced);
    let wal: Wal<Rec> = Wal::open(
        mem_dir(),
        mem_options(Arc::new(fs.clone()), Codec::Postcard),
    )
    .unwrap();
    assert_eq!(collect(&wal), numbered(&acked));
}

/// A frame that checks out but whose payload is not a `Rec`: the iterator returns an error
/// naming the LSN and the codec (never a panic, never a made-up record) and stops; the records
/// around it read fine on their own.
#[test]
fn a_payload_that_does_not_decode_is_an_error_naming_the_lsn() {
    for codec in Codec::ALL {
        let dir = tempfile::tempdir().unwrap();
        let tag = std::any::type_name::<Rec>();
        let log = Log::open(dir.path(), std_options(codec, SMALL_SEGMENT), tag).unwrap();
        log.append(&codec.encode(&rec(1)).unwrap()).unwrap();
        log.append(&[0xff; 8][..]).unwrap();
        log.append(&codec.encode(&rec(3)).unwrap()).unwrap();
        log.close().unwrap();

        let wal: Wal<Rec> = Wal::open(dir.path(), std_options(codec, SMALL_SEGMENT)).unwrap();
        let mut iter = wal.iter().unwrap();
        assert_eq!(iter.next().unwrap().unwrap(), (Lsn::new(1), rec(1)));
        let error = iter
            .next()
            .unwrap()
            .expect_err("garbage decoded as a record");
        assert!(
            matches!(error, Error::Codec { lsn: Some(lsn), .. } if lsn == Lsn::new(2)),
            "{codec}: {error:?}"
        );
        let message = error.to_string();
        assert!(message.contains("record 2"), "{message}");
        assert!(message.contains(codec.name()), "{message}");
        assert!(
            iter.next().is_none(),
            "{codec}: iteration went on past a bad record"
        );
        assert_eq!(collect_from(&wal, Lsn::new(3)), vec![(Lsn::new(3), rec(3))]);
    }
}

#[test]
fn an_oversized_record_is_refused_without_consuming_an_lsn_or_stopping_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let options = std_options(Codec::Json, SMALL_SEGMENT).max_record_bytes(64);
    let wal: Wal<Rec> = Wal::open(dir.path(), options).unwrap();
    let big = Rec {
        id: 1,
        note: "x".repeat(100),
        pairs: Vec::new(),
    };
    let error = wal.append(&big).unwrap_err();
    assert!(
        matches!(error, Error::RecordTooLarge { max: 64, .. }),
        "{error:?}"
    );
    assert!(error.to_string().contains("limit of 64 bytes"), "{error}");
    // A batch is all or nothing.
    assert!(wal.append_batch(&[rec(1), big]).is_err());
    assert_eq!(wal.last_lsn(), Lsn::ZERO);
    assert_eq!(wal.append_durable(&rec(2)).unwrap(), Lsn::new(1));
}

#[test]
fn committing_an_unappended_lsn_is_refused_without_stopping_the_log() {
    let fs = FaultStorage::new();
    let wal: Wal<Rec> = Wal::open(mem_dir(), mem_options(Arc::new(fs), Codec::Postcard)).unwrap();
    wal.append(&rec(1)).unwrap();
    let error = wal.commit(Lsn::new(5)).unwrap_err();
    assert!(
        matches!(error, Error::NotAppended { lsn, next } if lsn == Lsn::new(5) && next == Lsn::new(2)),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        "LSN 5 has not been appended (next LSN is 2)"
    );
    let error = block_on(&mut wal.commit_async(Lsn::new(5))).unwrap_err();
    assert!(matches!(error, Error::NotAppended { .. }), "{error:?}");
    wal.commit(Lsn::new(1)).unwrap();
}

#[test]
fn a_second_open_of_the_same_log_is_locked_out() {
    let dir = tempfile::tempdir().unwrap();
    let wal: Wal<Rec> = Wal::open(dir.path(), std_options(Codec::Json, SMALL_SEGMENT)).unwrap();
    let error = Wal::<Rec>::open(dir.path(), std_options(Codec::Json, SMALL_SEGMENT))
        .err()
        .expect("two handles on one log");
    assert!(
        matches!(&error, Error::Locked { dir: d } if d == dir.path()),
        "{error:?}"
    );
    assert!(
        error
            .to_string()
            .contains(&dir.path().display().to_string()),
        "{error}"
    );
    drop(wal);
    Wal::<Rec>::open(dir.path(), std_options(Codec::Json, SMALL_SEGMENT)).unwrap();
}

#[test]
fn a_missing_directory_without_create_if_missing_is_not_found() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("nowhere");
    let options = std_options(Codec::Json, SMALL_SEGMENT).create_if_missing(false);
    let error = Wal::<Rec>::open(&dir, options)
        .err()
        .expect("opened a missing log");
    assert!(
        matches!(&error, Error::NotFound { dir: d } if *d == dir),
        "{error:?}"
    );
    assert!(error.to_string().contains("nowhere"), "{error}");
    assert!(!dir.exists(), "the directory was created anyway");
}

/// Found by the `recovery_open` fuzz target: in skip mode a damaged frame stays on disk, and
/// records appended after it in the same segment can complete it into a frame whose checksum
/// holds (the fuzzer forged one; by chance it is a 2^-32 event per damaged frame). The next
/// scan then resumed at that frame and cut the acknowledged records after it as a torn tail.
/// Skip mode now seals a damaged newest segment at the first append and appends into a new one.
#[test]
fn skip_mode_never_appends_after_damage_in_the_same_segment() {
    let fs = FaultStorage::new();
    let dir = Path::new("/log");
    fs.create_dir_all(dir).unwrap();
    let segment = include_bytes!("data/skip-corrupt-damage-completed-by-append.wal");
    let file = fs
        .open(&dir.join("00000000000000000001.wal"), OpenMode::CreateNew)
        .unwrap();
    file.write_all_at(segment, 0).unwrap();
    file.sync_data().unwrap();
    fs.sync_dir(dir).unwrap();
    let options = || {
        WalOptions::default()
            .codec(Codec::MessagePack)
            .storage(Arc::new(fs.clone()))
            .segment_bytes(1024)
            .max_record_bytes(512)
            .create_if_missing(false)
            .recovery(RecoveryMode::SkipCorrupt)
    };
    const TAG: &str = "stela_fuzz::Record";
    let log = Log::open(dir, options(), TAG).unwrap();
    assert!(!log.recovery_report().damage.is_empty());
    assert_eq!(log.last_lsn(), Lsn::new(3));
    // The payload that completes the forged frame: [7, "transfer", [[1, 2], [3, 4]]].
    let lsn = log
        .append(b"\x93\x07\xa8transfer\x92\x92\x01\x02\x92\x03\x04")
        .unwrap();
    log.commit(lsn).unwrap();
    assert_eq!(log.segments().len(), 2, "appends go to a fresh segment");
    drop(log);
    let log = Log::open(dir, options(), TAG).unwrap();
    assert_eq!(log.last_lsn(), lsn, "{:?}", log.recovery_report());
    let lsns: Vec<Lsn> = log
        .read_from(Lsn::FIRST)
        .unwrap()
        .map(|item| item.unwrap().0)
        .collect();
    assert_eq!(lsns, vec![Lsn::new(3), lsn]);
}
