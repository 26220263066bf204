//! Logs written by older builds (segment format version 1: 16-byte frames, no sync base) stay
//! readable everywhere, and grow in version 2 segments.
//!
//! The version 1 segments here are built with the format crate's version 1 encoder
//! (`resync::encode_v1` and a header with `Layout::V1`), byte for byte what an older build wrote;
//! `tests/data/skip-corrupt-damage-completed-by-append.wal` (used by `bad_input.rs`) is a
//! checked-in one.
//!
//! Checked: open (strict, verifying every segment), iteration, parallel iteration, `verify`,
//! `dump`, `repair` and truncation of a v1 log; the first append after opening a v1 log starts a
//! v2 segment (never a v2 frame in a v1 segment), also when the v1 newest segment is empty (it
//! is replaced); a log of v1 then v2 segments reopens, survives a power cut, and is read across
//! the boundary; and the v1 recovery rules are unchanged (a torn v1 tail is cut, damage in the
//! middle is refused).

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use stela_format::frame::Layout;
use stela_format::resync;
use stela_format::{Codec, Lsn, SegmentHeader, TypeTag};
use stela_wal::storage::{CrashPlan, FaultStorage, OpenMode, Storage};
use stela_wal::{tools, RecoveryMode, Wal, WalOptions};

const CAPACITY: u64 = 1024;
const CODEC: Codec = Codec::MessagePack;

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Rec {
    id: u64,
    text: String,
}

fn rec(id: u64) -> Rec {
    Rec {
        id,
        text: format!("record number {id}"),
    }
}

fn dir() -> PathBuf {
    PathBuf::from("/v1log")
}

fn tag() -> &'static str {
    std::any::type_name::<Rec>()
}

/// A version 1 segment of `ids` (LSNs from `start` on), as an older build wrote it.
fn v1_segment(seq: u64, start: u64, ids: std::ops::Range<u64>) -> Vec<u8> {
    let header = SegmentHeader {
        layout: Layout::V1,
        codec: CODEC,
        segment_seq: seq,
        start_lsn: Lsn::new(start),
        capacity: CAPACITY,
        type_tag: TypeTag::new(tag()),
    };
    let mut bytes = header.encode().to_vec();
    for (i, id) in ids.enumerate() {
        let payload = CODEC.encode(&rec(id)).unwrap();
        resync::encode_v1(&mut bytes, Lsn::new(start + i as u64), &payload);
    }
    assert!(
        bytes.len() as u64 <= CAPACITY,
        "too many records for a segment"
    );
    bytes.resize(CAPACITY as usize, 0);
    bytes
}

fn put(fs: &FaultStorage, start: u64, bytes: &[u8]) -> PathBuf {
    fs.create_dir_all(&dir()).unwrap();
    let path = dir().join(format!("{start:020}.wal"));
    let file = fs.open(&path, OpenMode::CreateNew).unwrap();
    file.write_all_at(bytes, 0).unwrap();
    file.sync_data().unwrap();
    fs.sync_dir(&dir()).unwrap();
    path
}

/// A v1 log of two segments: records 1..=6, then 7..=10.
fn v1_log(fs: &FaultStorage) -> Vec<PathBuf> {
    vec![
        put(fs, 1, &v1_segment(0, 1, 1..7)),
        put(fs, 7, &v1_segment(1, 7, 7..11)),
    ]
}

fn options(fs: &FaultStorage) -> WalOptions {
    WalOptions::default()
        .codec(CODEC)
        .segment_bytes(CAPACITY)
        .storage(Arc::new(fs.clone()))
}

fn open(fs: &FaultStorage) -> Wal<Rec> {
    Wal::open(dir(), options(fs)).unwrap()
}

fn all(wal: &Wal<Rec>) -> Vec<(Lsn, Rec)> {
    wal.iter().unwrap().collect::<Result<_, _>>().unwrap()
}

fn expected(ids: impl IntoIterator<Item = u64>) -> Vec<(Lsn, Rec)> {
    ids.into_iter().map(|id| (Lsn::new(id), rec(id))).collect()
}

fn version_of(fs: &FaultStorage, path: &Path) -> u16 {
    let bytes = fs.read_file(path).unwrap();
    SegmentHeader::decode(&bytes).unwrap().layout.version()
}

#[test]
fn a_v1_log_opens_and_reads_with_every_reader() {
    let fs = FaultStorage::new();
    let paths = v1_log(&fs);
    let before: Vec<_> = paths.iter().map(|p| fs.read_file(p).unwrap()).collect();
    let wal = open(&fs);
    let report = wal.recovery_report();
    assert_eq!(report.records_verified, 10);
    assert!(
        report.torn_tail.is_none() && report.damage.is_empty(),
        "{report:?}"
    );
    assert_eq!(wal.last_lsn(), Lsn::new(10));
    assert_eq!(all(&wal), expected(1..=10));
    let parallel: Vec<_> = wal
        .par_iter_from(Lsn::new(3), 2)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(parallel, expected(3..=10));
    drop(wal);
    let after: Vec<_> = paths.iter().map(|p| fs.read_file(p).unwrap()).collect();
    assert_eq!(after, before, "opening a v1 log changed its bytes");

    let report = tools::verify(&dir(), &fs).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    assert_eq!(report.records, 10);
    let mut out = Vec::new();
    let dumped = tools::dump(&dir(), Arc::new(fs.clone()), Lsn::FIRST, &mut out).unwrap();
    assert_eq!(dumped.records, 10);
    assert!(dumped.problems.is_empty(), "{:?}", dumped.problems);
    assert!(String::from_utf8(out).unwrap().contains("record number 10"));
}

/// The first append after opening a v1 log goes to a new version 2 segment; the v1 segments are
/// never written again. The mixed log reopens, reads across the boundary, survives a power cut
/// and truncates like any other.
#[test]
fn a_v1_log_grows_in_v2_segments() {
    let fs = FaultStorage::new();
    let paths = v1_log(&fs);
    let v1_bytes: Vec<_> = paths.iter().map(|p| fs.read_file(p).unwrap()).collect();
    let wal = open(&fs);
    for id in 11..=14 {
        wal.append_durable(&rec(id)).unwrap();
    }
    let segments = wal.log().segments();
    assert_eq!(segments.len(), 3);
    assert_eq!(segments[2].start, Lsn::new(11));
    assert_eq!(version_of(&fs, &segments[2].path), 2);
    for (path, bytes) in paths.iter().zip(&v1_bytes) {
        assert_eq!(
            &fs.read_file(path).unwrap(),
            bytes,
            "a v1 segment was written"
        );
    }
    wal.append(&rec(15)).unwrap(); // not committed: may be lost
    wal.log().flush().unwrap();
    drop(wal);
    fs.crash(CrashPlan::TearUnsynced { seed: 7 });

    let wal = open(&fs);
    let records = all(&wal);
    assert!(records.len() >= 14, "{} records", records.len());
    assert_eq!(records[..14], expected(1..=14));
    let report = tools::verify(&dir(), &fs).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    assert_eq!(wal.truncate_before(Lsn::new(11)).unwrap(), 2);
    assert_eq!(all(&wal)[..4], expected(11..=14));
}

/// A v1 newest segment without records (a crash right after an older build created it) is
/// replaced by a v2 segment of the same name at the first append.
#[test]
fn an_empty_v1_newest_segment_is_replaced() {
    let fs = FaultStorage::new();
    put(&fs, 1, &v1_segment(0, 1, 1..4));
    let empty = put(&fs, 4, &v1_segment(1, 4, 4..4));
    let wal = open(&fs);
    assert_eq!(wal.last_lsn(), Lsn::new(3));
    assert_eq!(wal.append_durable(&rec(4)).unwrap(), Lsn::new(4));
    assert_eq!(wal.log().segments().len(), 2);
    assert_eq!(version_of(&fs, &empty), 2);
    drop(wal);
    fs.crash(CrashPlan::LoseUnsynced);
    let wal = open(&fs);
    assert_eq!(all(&wal), expected(1..=4));
}

/// Version 1 segments keep the rules they were written under: garbage after the last record of
/// the newest segment is a torn tail, cut at open (and by `repair`); a bad frame with valid
/// frames after it is damage, refused in strict mode.
#[test]
fn v1_recovery_rules_are_unchanged() {
    // A torn tail.
    let fs = FaultStorage::new();
    let mut bytes = v1_segment(0, 1, 1..5);
    let end = bytes.iter().rposition(|&b| b != 0).unwrap() + 1;
    bytes[end..end + 9].copy_from_slice(&[40, 0, 0, 0, 7, 7, 7, 7, 5]);
    let path = put(&fs, 1, &bytes);
    let report = tools::verify(&dir(), &fs).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    assert_eq!(report.torn_tail.as_ref().unwrap().1.offset, end as u64);
    let repaired = tools::repair(&dir(), Arc::new(fs.clone()), false).unwrap();
    assert_eq!(repaired.torn_tail.unwrap().1.offset, end as u64);
    assert!(fs.read_file(&path).unwrap()[end..].iter().all(|&b| b == 0));
    let wal = open(&fs);
    assert_eq!(all(&wal), expected(1..=4));
    drop(wal);

    // Damage in the middle of the newest segment: refused, then skipped.
    let fs = FaultStorage::new();
    let mut bytes = v1_segment(0, 1, 1..5);
    bytes[256 + 16 + 3] ^= 0x20; // a payload byte of record 1
    put(&fs, 1, &bytes);
    let error = Wal::<Rec>::open(dir(), options(&fs)).err().unwrap();
    let corruption = error.as_corruption().expect("corruption");
    assert_eq!(
        (corruption.offset, corruption.expected_lsn),
        (256, Lsn::FIRST)
    );
    let skipping = options(&fs).recovery(RecoveryMode::SkipCorrupt);
    let wal: Wal<Rec> = Wal::open(dir(), skipping).unwrap();
    assert_eq!(all(&wal), expected(2..=4));
}
