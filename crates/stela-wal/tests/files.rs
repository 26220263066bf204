//! The files layer (`LogFiles`, `SegmentWriter`, `SegmentSet`) as the log daemon uses it, and
//! the sync base the embedded log puts in every frame.
//!
//! - A writer that frames records itself, writes them with vectored positioned writes, syncs and
//!   rotates leaves a log that `Log` and `LogFiles` reopen with every record, in order.
//! - The writer stops for good after a failed write or fdatasync (it never syncs that file
//!   again), and refuses writes that would leave the segment.
//! - The embedded log frames each record with the offset its segment was durable below when the
//!   record was framed: moved by a returned sync only (not by a write to the OS), 256 in a
//!   segment that did not exist yet, the end of the data after an open.
//! - `segment_bytes` above `u32::MAX` is refused before anything is created.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use stela_format::frame::{self, Decoded, Layout};
use stela_wal::files::LogFiles;
use stela_wal::storage::{CrashPlan, FaultStorage, Storage};
use stela_wal::{Error, Log, Lsn, WalOptions};

const TAG: &str = "tests::Bytes";
const SEGMENT_HEADER: u64 = 256;

fn dir() -> PathBuf {
    PathBuf::from("/files")
}

fn options(fs: &FaultStorage, segment_bytes: u64) -> WalOptions {
    WalOptions::default()
        .storage(Arc::new(fs.clone()))
        .segment_bytes(segment_bytes)
}

/// `(offset, lsn, sync base)` of every frame of a version 2 segment, up to the end of its data.
fn frames_of(bytes: &[u8]) -> Vec<(u64, Lsn, u32)> {
    let mut out = Vec::new();
    let mut pos = SEGMENT_HEADER as usize;
    while let Decoded::Record(rec) = frame::decode(Layout::V2, &bytes[pos..]) {
        out.push((pos as u64, rec.lsn, rec.sync_base.expect("a v2 frame")));
        pos += rec.frame_len();
    }
    out
}

fn segment_path(start: u64) -> PathBuf {
    dir().join(format!("{start:020}.wal"))
}

fn payload(lsn: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (lsn as u8).wrapping_mul(13) ^ i as u8)
        .collect()
}

fn read_all(log: &Log) -> Vec<(Lsn, Vec<u8>)> {
    log.read_from(Lsn::FIRST)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// The daemon's way of writing: frame into its own buffers under its own LSNs and sync bases,
/// write several buffers at once at the right offset, sync, rotate when the next frame does
/// not fit. The files reopen as a log with exactly those records.
#[test]
fn a_writer_driven_like_the_daemon_leaves_a_log_that_reopens_whole() {
    let fs = FaultStorage::new();
    let segment_bytes = 1024;
    let mut files = LogFiles::open(&dir(), options(&fs, segment_bytes), TAG).unwrap();
    assert_eq!(files.next_lsn, Lsn::FIRST);
    assert_eq!(files.write_offset, SEGMENT_HEADER);
    assert_eq!(files.durable_offset, SEGMENT_HEADER);
    assert_eq!(files.writer.capacity(), segment_bytes);
    assert_eq!(files.writer.segment_start(), Lsn::FIRST);
    assert_eq!(files.writer.path(), segment_path(1));

    let mut offset = files.write_offset;
    let mut durable = files.durable_offset;
    let mut lsn = files.next_lsn;
    let mut written = Vec::new();
    for round in 0..12u64 {
        // A few frames per round, each in its own buffer (as pool buffers would be).
        let mut buffers: Vec<Vec<u8>> = Vec::new();
        for i in 0..3 {
            let body = payload(lsn.get(), 20 + (round as usize * 7 + i * 11) % 90);
            if offset + frame::frame_len(body.len()) as u64 > files.writer.capacity() {
                let bufs: Vec<&[u8]> = buffers.iter().map(Vec::as_slice).collect();
                files
                    .writer
                    .write_at(offset - len_of(&buffers), &bufs)
                    .unwrap();
                buffers.clear();
                files.writer.rotate(lsn).unwrap();
                offset = SEGMENT_HEADER;
                durable = SEGMENT_HEADER;
            }
            let mut buf = Vec::new();
            frame::encode(&mut buf, lsn, &body, durable as u32);
            offset += buf.len() as u64;
            buffers.push(buf);
            written.push((lsn, body));
            lsn = lsn.next();
        }
        let bufs: Vec<&[u8]> = buffers.iter().map(Vec::as_slice).collect();
        files
            .writer
            .write_at(offset - len_of(&buffers), &bufs)
            .unwrap();
        files.writer.sync().unwrap();
        durable = offset;
    }
    let segments = files.segments.list();
    assert!(segments.len() >= 3, "{segments:?}");
    assert_eq!(files.segments.first_lsn(), Lsn::FIRST);
    let read: Vec<_> = files
        .segments
        .reader(Lsn::FIRST, lsn)
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(read, written);
    drop(files);

    // Everything was synced: a power cut loses nothing.
    fs.crash(CrashPlan::LoseUnsynced);
    let log = Log::open(dir(), options(&fs, segment_bytes), TAG).unwrap();
    assert!(log.recovery_report().torn_tail.is_none());
    assert_eq!(read_all(&log), written);
    assert_eq!(log.segments(), segments);
}

fn len_of(buffers: &[Vec<u8>]) -> u64 {
    buffers.iter().map(|b| b.len() as u64).sum()
}

/// A failed fdatasync stops the writer: the error names the segment, every later call is
/// refused as poisoned, and the file is never synced again (nothing more reaches the disk).
#[test]
fn a_writer_stops_for_good_after_a_failed_sync() {
    let fs = FaultStorage::new();
    let mut files = LogFiles::open(&dir(), options(&fs, 4096), TAG).unwrap();
    let mut bytes = Vec::new();
    frame::encode(&mut bytes, Lsn::FIRST, b"first", 256);
    files.writer.write_at(256, &[&bytes]).unwrap();
    fs.fail_sync_after(0);
    let error = files.writer.sync().unwrap_err();
    assert!(
        matches!(&error, Error::Io { op: "fdatasync", path, .. } if path == &segment_path(1)),
        "{error:?}"
    );
    for later in [
        files.writer.sync().unwrap_err(),
        files.writer.write_at(256, &[&bytes]).unwrap_err(),
        files.writer.rotate(Lsn::new(2)).unwrap_err(),
    ] {
        assert!(matches!(later, Error::Poisoned { .. }), "{later:?}");
        assert!(later.to_string().contains("fdatasync"), "{later}");
    }
    drop(files);
    fs.crash(CrashPlan::LoseUnsynced);
    let log = Log::open(dir(), options(&fs, 4096), TAG).unwrap();
    assert_eq!(
        log.last_lsn(),
        Lsn::ZERO,
        "the failed sync made nothing durable"
    );
}

#[test]
#[should_panic(expected = "leaves the segment")]
fn a_write_past_the_capacity_is_refused() {
    let fs = FaultStorage::new();
    let mut files = LogFiles::open(&dir(), options(&fs, 1024), TAG).unwrap();
    let _ = files.writer.write_at(1000, &[&[1u8; 25]]);
}

#[test]
#[should_panic(expected = "leaves the segment")]
fn a_write_over_the_segment_header_is_refused() {
    let fs = FaultStorage::new();
    let mut files = LogFiles::open(&dir(), options(&fs, 1024), TAG).unwrap();
    let _ = files.writer.write_at(200, &[&[1u8; 25]]);
}

/// Rotating to the newest segment's own first LSN (it holds no record) replaces that segment
/// under its name instead of adding a second one.
#[test]
fn rotating_an_empty_segment_replaces_it() {
    let fs = FaultStorage::new();
    let mut files = LogFiles::open(&dir(), options(&fs, 1024), TAG).unwrap();
    files.writer.rotate(Lsn::FIRST).unwrap();
    assert_eq!(files.segments.list().len(), 1);
    let mut bytes = Vec::new();
    frame::encode(&mut bytes, Lsn::FIRST, b"only", 256);
    files.writer.write_at(256, &[&bytes]).unwrap();
    files.writer.sync().unwrap();
    drop(files);
    fs.crash(CrashPlan::LoseUnsynced);
    let log = Log::open(dir(), options(&fs, 1024), TAG).unwrap();
    assert_eq!(read_all(&log), vec![(Lsn::FIRST, b"only".to_vec())]);
    assert_eq!(log.segments().len(), 1);
}

/// The directory lock lives as long as the segment set: a second open is refused while a
/// reader's set is alive, even after the `LogFiles` itself is gone.
#[test]
fn the_segment_set_holds_the_directory_lock() {
    let fs = FaultStorage::new();
    let files = LogFiles::open(&dir(), options(&fs, 1024), TAG).unwrap();
    let set = Arc::clone(&files.segments);
    drop(files);
    let again = LogFiles::open(&dir(), options(&fs, 1024), TAG).unwrap_err();
    assert!(matches!(again, Error::Locked { .. }), "{again:?}");
    drop(set);
    LogFiles::open(&dir(), options(&fs, 1024), TAG).unwrap();
}

#[test]
fn segments_larger_than_u32_are_refused_before_anything_is_created() {
    let fs = FaultStorage::new();
    let too_big = u64::from(u32::MAX) + 1;
    let error = LogFiles::open(&dir(), options(&fs, too_big), TAG).unwrap_err();
    assert!(
        matches!(error, Error::SegmentTooLarge { bytes, max } if bytes == too_big && max == u64::from(u32::MAX)),
        "{error:?}"
    );
    assert!(error.to_string().contains("segment_bytes"), "{error}");
    assert!(fs.list(&dir()).is_err(), "the directory was created");
    Log::open(dir(), options(&fs, 1 << 20), TAG).unwrap();
}

/// The sync base the embedded log puts in frames: the offset of the last *returned* sync in
/// the frame's segment at framing time. Writes to the OS (`flush`, the write buffer spilling)
/// do not move it; a rotation resets it to 256 for the new segment; an open sets it to the end
/// of the recovered data (which the open synced).
#[test]
fn the_embedded_log_frames_records_with_the_synced_offset() {
    let fs = FaultStorage::new();
    let open = || Log::open(dir(), options(&fs, 1024).write_buffer_bytes(1 << 20), TAG).unwrap();
    let log = open();
    let one = log.append(&payload(1, 30)).unwrap();
    log.commit(one).unwrap(); // durable up to the end of frame 1
    log.append(&payload(2, 30)).unwrap();
    log.flush().unwrap(); // written, not synced
    log.append(&payload(3, 30)).unwrap();
    let four = log.append(&payload(4, 30)).unwrap();
    log.commit(four).unwrap();
    log.append(&payload(5, 30)).unwrap();
    log.commit_all().unwrap();

    let bytes = fs.read_file(&segment_path(1)).unwrap();
    let frames = frames_of(&bytes);
    let ends: Vec<u64> = frames
        .iter()
        .map(|&(at, lsn, _)| at + frame::frame_len(payload(lsn.get(), 30).len()) as u64)
        .collect();
    let bases: Vec<u32> = frames.iter().map(|f| f.2).collect();
    let end = |i: usize| ends[i] as u32;
    assert_eq!(bases, [256, end(0), end(0), end(0), end(3)]);

    // Records that go to a segment that does not exist yet get 256, and once a sync in the new
    // segment returned, its offset.
    let mut lsn = Lsn::new(5);
    while log.segments().len() == 1 {
        lsn = log.append(&payload(lsn.get() + 1, 100)).unwrap();
        log.flush().unwrap(); // rotates when the record does not fit; no sync in the new one
    }
    let second = log.segments()[1].start;
    log.commit(lsn).unwrap();
    let next = log.append(&payload(lsn.get() + 1, 10)).unwrap();
    log.commit(next).unwrap();
    let bytes = fs.read_file(&segment_path(second.get())).unwrap();
    let frames = frames_of(&bytes);
    let last = frames.len() - 1;
    assert!(frames[..last].iter().all(|f| f.2 == 256), "{frames:?}");
    let synced_end = frames[last].0 as u32;
    assert_eq!(frames[last], (frames[last].0, next, synced_end));
    drop(log);

    // After an open, new frames start from the end of what the open found (and synced).
    let log = open();
    let after = log.append(&payload(next.get() + 1, 10)).unwrap();
    log.commit(after).unwrap();
    let bytes = fs.read_file(&segment_path(second.get())).unwrap();
    let frames = frames_of(&bytes);
    let (at, lsn, base) = *frames.last().unwrap();
    assert_eq!((lsn, base), (after, at as u32));
}

/// `Log` keeps its behaviour on top of the files layer: the segment list, first LSN and
/// truncation go through the shared set.
#[test]
fn log_lists_and_truncates_through_the_segment_set() {
    let fs = FaultStorage::new();
    let log = Log::open(dir(), options(&fs, 512), TAG).unwrap();
    for i in 1..=40u64 {
        log.append(&payload(i, 40)).unwrap();
    }
    log.commit_all().unwrap();
    let segments = log.segments();
    assert!(segments.len() > 3);
    let removed = log.truncate_before(segments[2].start).unwrap();
    assert_eq!(removed, 2);
    assert_eq!(log.first_lsn(), segments[2].start);
    assert_eq!(log.segments(), segments[2..]);
    for gone in &segments[..2] {
        assert!(fs.read_file(gone.path.as_path()).is_none());
    }
    let first = read_all(&log).first().unwrap().0;
    assert_eq!(first, segments[2].start);
    assert_exists(&fs, &segments[2].path);
}

fn assert_exists(fs: &FaultStorage, path: &Path) {
    assert!(fs.read_file(path).is_some(), "{} is gone", path.display());
}

/// `tools::tail_last_lsn` reads the newest segment alone and agrees with a whole-log `verify`
/// on a log of many segments, as it grows and after a reopen; a directory without a log is an
/// error, not LSN 0.
#[test]
fn the_last_lsn_from_the_tail_agrees_with_a_whole_verify() {
    let fs = FaultStorage::new();
    let log = Log::open(dir(), options(&fs, 64 << 10), TAG).unwrap();
    let whole_verify = |fs: &FaultStorage| {
        let report = stela_wal::tools::verify(&dir(), fs).unwrap();
        report.last_lsn.unwrap_or(Lsn::ZERO)
    };
    for n in 1..=900u64 {
        let lsn = log.append(&payload(n, 200)).unwrap();
        if n % 150 == 0 {
            log.commit(lsn).unwrap();
            let tail = stela_wal::tools::tail_last_lsn(&dir(), &fs).unwrap();
            assert_eq!(tail, lsn);
            assert_eq!(tail, whole_verify(&fs));
        }
    }
    log.close().unwrap();
    let segments = fs.list(&dir()).unwrap().len();
    assert!(
        segments > 3,
        "the test needs several segments, made {segments}"
    );
    let log = Log::open(dir(), options(&fs, 64 << 10), TAG).unwrap();
    let last = log.append(&payload(901, 200)).unwrap();
    log.commit(last).unwrap();
    drop(log);
    assert_eq!(stela_wal::tools::tail_last_lsn(&dir(), &fs).unwrap(), last);
    assert!(matches!(
        stela_wal::tools::tail_last_lsn(Path::new("/no/such/log"), &fs),
        Err(Error::NotALog { .. })
    ));
}
