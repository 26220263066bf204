//! A synced record is never called a torn tail (issue 54, finding 8).
//!
//! The bug these pin: a frame's sync base proves every sync but the last, so before the
//! `SYNCED` mark a flipped bit in the last acknowledged (synced) record of a log was taken for
//! a torn write: `verify` said "clean" and opening the log cut the record in silence. And a
//! flipped bit early in a log written without syncs made `verify` say "clean" while opening
//! cut every valid record after it. Each test here failed on main at 40e0404 (see the report
//! of the branch `synced-tail`).

use proptest::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use stela_format::frame::{self, Decoded, Layout};
use stela_format::header::HEADER_BYTES;
use stela_wal::storage::{CrashPlan, FaultStorage, Storage};
use stela_wal::{tools, Error, Log, Lsn, SyncMode, WalOptions};

const TAG: &str = "synced-mark-test";

fn options(storage: Arc<dyn Storage>) -> WalOptions {
    WalOptions::default()
        .storage(storage)
        .segment_bytes(1 << 20)
        .zero_ahead_bytes(0)
}

fn payload(i: u64) -> Vec<u8> {
    format!("record {i:05} {}", "x".repeat((i % 37) as usize)).into_bytes()
}

fn segment_path(dir: &Path) -> PathBuf {
    dir.join(format!("{:020}.wal", 1))
}

/// Start offset of every frame in a segment's bytes.
fn frame_starts(bytes: &[u8]) -> Vec<usize> {
    let mut at = HEADER_BYTES;
    let mut starts = Vec::new();
    while let Decoded::Record(rec) = frame::decode(Layout::V2, &bytes[at..]) {
        starts.push(at);
        at += rec.frame_len();
    }
    starts
}

/// Commits `n` records one by one (each acknowledged at `disk`).
fn committed_log(storage: Arc<dyn Storage>, dir: &Path, n: u64) -> Log {
    let log = Log::open(dir, options(storage), TAG).unwrap();
    for i in 1..=n {
        let lsn = log.append(&payload(i)).unwrap();
        log.commit(lsn).unwrap();
    }
    log
}

fn assert_refused_naming(error: Error, segment: &Path, offset: usize, lsn: u64) {
    let corruption = error
        .as_corruption()
        .unwrap_or_else(|| panic!("not corruption: {error}"));
    assert_eq!(corruption.segment, segment);
    assert_eq!(corruption.offset as usize, offset);
    assert_eq!(corruption.expected_lsn, Lsn::new(lsn));
}

/// The last acknowledged record's bit flipped, after the log closed (the mark written by
/// `close`) or crashed once the log had gone idle (the mark written by the keeper thread):
/// `verify` reports damage naming the file and offset, a `Strict` open refuses naming the LSN,
/// and not one byte of the segment changes.
#[test]
fn a_flipped_bit_in_the_last_synced_record_is_refused_and_nothing_is_cut() {
    for closed in [true, false] {
        let disk = FaultStorage::new();
        let dir = Path::new("/synced/last");
        let log = committed_log(Arc::new(disk.clone()), dir, 40);
        if closed {
            log.close().unwrap();
        } else {
            // The keeper writes the mark once the log is idle (an earlier idle spell may have
            // left one for an earlier commit); wait for the last, then crash.
            let bytes = disk.read_file(&segment_path(dir)).unwrap();
            let end = frame_starts(&bytes)[39] + frame::frame_len(payload(40).len());
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while stela_wal::synced::read(&disk, dir)
                .unwrap()
                .is_none_or(|m| m.synced_offset < end as u64)
            {
                assert!(std::time::Instant::now() < deadline, "no mark after 10 s");
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            drop(log);
            disk.crash(CrashPlan::LoseUnsynced);
        }
        let path = segment_path(dir);
        let bytes = disk.read_file(&path).unwrap();
        let starts = frame_starts(&bytes);
        assert_eq!(starts.len(), 40);
        let last = starts[39];
        disk.corrupt(&path, last + 25, &[bytes[last + 25] ^ 0x04]);
        let damaged = disk.read_file(&path).unwrap();

        let report = tools::verify(dir, &disk).unwrap();
        assert!(report.is_damaged(), "closed={closed}: {report:?}");
        assert!(report.torn_tail.is_none(), "{:?}", report.torn_tail);
        assert!(
            report.problems[0].contains(&format!("offset {last}")),
            "{:?}",
            report.problems
        );
        let error = Log::open(dir, options(Arc::new(disk.clone())), TAG)
            .err()
            .expect("the open refuses");
        assert_refused_naming(error, &path, last, 40);
        assert_eq!(disk.read_file(&path).unwrap(), damaged, "nothing was cut");
    }
}

/// The background path alone: after a commit the log goes idle, and the mark reaches the
/// durable end of the data without `close` or `mark_synced`, with no segment sync added.
#[test]
fn an_idle_log_records_its_last_sync_by_itself() {
    let disk = FaultStorage::new();
    let dir = Path::new("/synced/idle");
    let log = committed_log(Arc::new(disk.clone()), dir, 3);
    let end = *frame_starts(&disk.read_file(&segment_path(dir)).unwrap())
        .last()
        .unwrap()
        + frame::frame_len(payload(3).len());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let mark = stela_wal::synced::read(&disk, dir).unwrap();
        if mark.is_some_and(|m| m.synced_offset == end as u64) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "mark {mark:?}, data end {end}"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // One segment sync per commit: the marks add none to the segment.
    assert_eq!(log.stats().syncs, 3);
    assert!(log.stats().marks >= 2, "{:?}", log.stats());
}

/// The second case: 3,000 records written without a sync (`SyncMode::None`), the
/// process gone, one bit flipped a third of the way in. Nothing was synced, so this may be a
/// torn write and opening may cut it, but `verify` must not call the log clean: it counts the
/// valid records an open would remove. Had the same records been synced (and the log closed),
/// the flip is damage.
#[test]
fn a_flip_early_in_an_unsynced_log_is_not_clean_and_counts_what_an_open_cuts() {
    for synced in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let storage: Arc<dyn Storage> = Arc::new(stela_wal::storage::StdStorage);
        let sync = if synced {
            SyncMode::Data
        } else {
            SyncMode::None
        };
        let log = Log::open(
            dir.path(),
            options(Arc::clone(&storage))
                .sync(sync)
                .segment_bytes(4 << 20),
            TAG,
        )
        .unwrap();
        for i in 1..=3000 {
            log.append(&payload(i)).unwrap();
        }
        log.close().unwrap();
        let path = segment_path(dir.path());
        let mut bytes = std::fs::read(&path).unwrap();
        let starts = frame_starts(&bytes);
        assert_eq!(starts.len(), 3000);
        bytes[starts[1000] + 22] ^= 0x01; // LSN 1001's payload
        std::fs::write(&path, &bytes).unwrap();

        let report = tools::verify(dir.path(), storage.as_ref()).unwrap();
        assert!(!report.is_clean(), "synced={synced}");
        if synced {
            assert!(report.is_damaged());
            assert_eq!(report.valid_prefix_end, Some(Lsn::new(1001)));
        } else {
            assert!(!report.is_damaged(), "{:?}", report.problems);
            assert_eq!(report.would_cut_records(), 1999, "LSNs 1002..=3000");
            let log = Log::open(dir.path(), options(Arc::clone(&storage)), TAG).unwrap();
            let (_, torn) = log.recovery_report().torn_tail.clone().unwrap();
            assert_eq!(torn.unsynced_records, 1999);
            assert_eq!(log.last_lsn(), Lsn::new(1000));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Commits of random sizes, the mark written, then more appends that a power cut tears in
    /// any way, and one bit flipped anywhere in the synced bytes: the open always refuses at or
    /// before the flip (never cuts it as a torn tail, never changes a byte), and `verify` calls
    /// it damage. Faults overlap: the tear of the unsynced tail and the rot below the mark.
    #[test]
    fn damage_to_synced_bytes_is_always_corruption_never_cut(
        groups in proptest::collection::vec(1usize..6, 1..8),
        unsynced in 0usize..6,
        seed in any::<u64>(),
        bit in any::<prop::sample::Index>(),
    ) {
        let disk = FaultStorage::new();
        let dir = Path::new("/synced/prop");
        let log = Log::open(dir, options(Arc::new(disk.clone())), TAG).unwrap();
        let mut i = 0;
        for group in groups {
            let mut last = Lsn::ZERO;
            for _ in 0..group {
                i += 1;
                last = log.append(&payload(i)).unwrap();
            }
            log.commit(last).unwrap();
        }
        log.mark_synced().unwrap();
        let synced_end = stela_wal::synced::read(&disk, dir).unwrap().unwrap().synced_offset;
        for _ in 0..unsynced {
            i += 1;
            log.append(&payload(i)).unwrap();
        }
        log.flush().unwrap();
        drop(log);
        disk.crash(CrashPlan::ScrambleSectors { seed });

        let path = segment_path(dir);
        let bytes = disk.read_file(&path).unwrap();
        let span = (synced_end as usize - HEADER_BYTES) * 8;
        let bit = HEADER_BYTES * 8 + bit.index(span);
        disk.corrupt(&path, bit / 8, &[bytes[bit / 8] ^ (1 << (bit % 8))]);
        let damaged = disk.read_file(&path).unwrap();

        let report = tools::verify(dir, &disk).unwrap();
        prop_assert!(report.is_damaged(), "{:?}", report);
        match Log::open(dir, options(Arc::new(disk.clone())), TAG) {
            Ok(log) => prop_assert!(false, "opened: {:?}", log.recovery_report()),
            Err(error) => {
                let c = error.as_corruption().unwrap_or_else(|| panic!("{error}"));
                prop_assert!(c.offset as usize <= bit / 8, "{} after the flip at {}", c.offset, bit / 8);
            }
        }
        prop_assert_eq!(disk.read_file(&path).unwrap(), damaged);
    }
}
