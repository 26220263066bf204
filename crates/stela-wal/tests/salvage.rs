//! Cutting a log back with a salvage copy (`stela_wal::salvage`): the live log keeps exactly the
//! records up to the cut and continues from there, the copy holds every record cut and opens as a
//! log, the term history follows; a crash at any sync leaves the old log or a shorter one whose
//! lost records are all in a complete copy; refused cuts change nothing.

use proptest::prelude::*;
use std::path::Path;
use std::sync::Arc;
use stela_format::term::Term;
use stela_wal::salvage::{cut_after, list};
use stela_wal::storage::{CrashPlan, FaultStorage, StdStorage, Storage};
use stela_wal::{Codec, Log, Lsn, TermStore, WalOptions};

const TAG: &str = "test::Record";

fn options(storage: Arc<dyn Storage>) -> WalOptions {
    WalOptions::default()
        .codec(Codec::MessagePack)
        .segment_bytes(4096)
        .storage(storage)
}

fn payload(lsn: u64) -> Vec<u8> {
    vec![(lsn % 251) as u8 | 1; 40 + (lsn as usize * 13) % 200]
}

/// A log of `n` records over several 4 KiB segments, with a term history.
fn write_log(dir: &Path, storage: &Arc<dyn Storage>, n: u64) {
    storage.create_dir_all(dir).unwrap();
    let log = Log::open(dir, options(Arc::clone(storage)), TAG).unwrap();
    for lsn in 1..=n {
        log.append_all([payload(lsn).as_slice()]).unwrap();
    }
    log.commit(Lsn::new(n)).unwrap();
    log.close().unwrap();
    let mut terms = TermStore::open(Arc::clone(storage), dir).unwrap();
    terms.begin(Term(1 << 32 | 1), 1).unwrap();
    if n > 10 {
        terms.begin(Term(1 << 32 | 2), n - 10).unwrap();
    }
}

/// Every (LSN, payload) of the log in `dir`.
fn records(dir: &Path, storage: &Arc<dyn Storage>) -> Vec<(u64, Vec<u8>)> {
    let files = stela_wal::LogFiles::open(dir, options(Arc::clone(storage)), TAG).unwrap();
    files
        .segments
        .reader(Lsn::FIRST, files.next_lsn)
        .map(|r| {
            let (lsn, bytes) = r.unwrap();
            (lsn.get(), bytes)
        })
        .collect()
}

fn expected(range: std::ops::RangeInclusive<u64>) -> Vec<(u64, Vec<u8>)> {
    range.map(|lsn| (lsn, payload(lsn))).collect()
}

#[test]
fn a_cut_keeps_the_prefix_and_copies_the_rest_whole() {
    let root = tempfile::tempdir().unwrap();
    let storage: Arc<dyn Storage> = Arc::new(StdStorage);
    let (dir, salvage) = (root.path().join("ledger"), root.path().join("salvage"));
    write_log(&dir, &storage, 120);
    let segments_before = std::fs::read_dir(&dir).unwrap().count();
    let kept = cut_after(
        &dir,
        options(Arc::clone(&storage)),
        TAG,
        77,
        &salvage,
        "test",
    )
    .unwrap()
    .expect("something was cut");
    assert_eq!(
        (kept.cut_from_lsn, kept.last_lsn, kept.records),
        (78, 120, 43)
    );
    assert!(kept.bytes >= (78..=120).map(|l| payload(l).len() as u64).sum::<u64>());
    assert_eq!(kept.terms, vec![(1 << 32 | 1, 1), (1 << 32 | 2, 110)]);
    assert_eq!(records(&dir, &storage), expected(1..=77));
    assert!(std::fs::read_dir(&dir).unwrap().count() <= segments_before);
    // The history no longer names a term that begins after the cut.
    let terms = TermStore::open(Arc::clone(&storage), &dir).unwrap();
    assert_eq!(terms.history().entries(), &[(Term(1 << 32 | 1), 1)]);
    // The copy is a log: from its first segment's start through 120.
    let copy = records(&kept.dir, &storage);
    assert_eq!(copy.last().map(|r| r.0), Some(120));
    assert!(copy.first().unwrap().0 <= 78);
    assert_eq!(copy, expected(copy.first().unwrap().0..=120));
    // Listed, complete.
    let listed = list(storage.as_ref(), &salvage).unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        listed[0].manifest.as_ref().map(|m| m.cut_from_lsn),
        Some(78)
    );
    // The live log goes on from 78.
    let log = Log::open(&dir, options(Arc::clone(&storage)), TAG).unwrap();
    assert_eq!(
        log.append_all([b"after the cut".as_slice()]).unwrap(),
        Lsn::new(78)
    );
    log.commit(Lsn::new(78)).unwrap();
    log.close().unwrap();
    let after = records(&dir, &storage);
    assert_eq!(after.len(), 78);
    assert_eq!(after[77], (78, b"after the cut".to_vec()));
}

#[test]
fn cuts_at_the_ends_and_refusals() {
    let root = tempfile::tempdir().unwrap();
    let storage: Arc<dyn Storage> = Arc::new(StdStorage);
    let salvage = root.path().join("salvage");
    // Nothing after the cut point: nothing done, nothing copied.
    let dir = root.path().join("a");
    write_log(&dir, &storage, 30);
    assert!(
        cut_after(&dir, options(Arc::clone(&storage)), TAG, 30, &salvage, "t")
            .unwrap()
            .is_none()
    );
    assert!(
        cut_after(&dir, options(Arc::clone(&storage)), TAG, 99, &salvage, "t")
            .unwrap()
            .is_none()
    );
    assert!(list(storage.as_ref(), &salvage).unwrap().is_empty());
    // Everything cut: an empty log that starts at 1 again.
    let kept = cut_after(&dir, options(Arc::clone(&storage)), TAG, 0, &salvage, "t")
        .unwrap()
        .unwrap();
    assert_eq!((kept.cut_from_lsn, kept.records), (1, 30));
    assert!(records(&dir, &storage).is_empty());
    // A cut at every LSN of a segment boundary region keeps exactly the prefix.
    for at in [1, 15, 16, 17, 29] {
        let dir = root.path().join(format!("b{at}"));
        write_log(&dir, &storage, 30);
        cut_after(&dir, options(Arc::clone(&storage)), TAG, at, &salvage, "t").unwrap();
        assert_eq!(records(&dir, &storage), expected(1..=at), "cut after {at}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// A crash at any sync of a cut (the `n`-th sync fails, then the power goes): the log
    /// reopens; it holds 1..=k for some k between the cut point and its old end; every record
    /// it lost (k+1..=end) is in a complete salvage copy; cutting again finishes the job.
    #[test]
    fn a_crash_at_any_step_loses_nothing(n in 1u64..60, cut in 0u64..60, fail_at in 0u64..40) {
        let fs = Arc::new(FaultStorage::new());
        let storage: Arc<dyn Storage> = fs.clone();
        let (dir, salvage) = (Path::new("/log/ledger"), Path::new("/log/salvage"));
        write_log(dir, &storage, n);
        fs.fail_sync_after(fail_at);
        let outcome = cut_after(dir, options(Arc::clone(&storage)), TAG, cut, salvage, "t");
        fs.crash(CrashPlan::LoseUnsynced);
        let now = records(dir, &storage);
        let k = now.len() as u64;
        prop_assert_eq!(&now, &expected(1..=k));
        if cut >= n {
            prop_assert_eq!(k, n);
            return Ok(());
        }
        prop_assert!(k >= cut && k <= n, "k {} cut {} n {}", k, cut, n);
        if outcome.is_ok() {
            prop_assert_eq!(k, cut);
        }
        if k < n {
            // What the log lost is in a complete copy.
            let copies: Vec<_> = list(storage.as_ref(), salvage).unwrap()
                .into_iter().filter_map(|e| e.manifest).collect();
            prop_assert!(!copies.is_empty(), "records {}..={} lost without a copy", k + 1, n);
            let copy = records(&copies[0].dir, &storage);
            for lsn in k + 1..=n {
                prop_assert!(copy.contains(&(lsn, payload(lsn))), "LSN {} in no copy", lsn);
            }
        }
        // Cutting again (the primary asks again) finishes it.
        cut_after(dir, options(Arc::clone(&storage)), TAG, cut, salvage, "again").unwrap();
        prop_assert_eq!(records(dir, &storage), expected(1..=cut));
        let terms = TermStore::open(Arc::clone(&storage), dir).unwrap();
        prop_assert!(terms.history().entries().iter().all(|&(_, first)| first <= cut.max(1)));
    }
}
