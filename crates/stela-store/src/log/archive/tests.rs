//! Tests of the parent module.

use super::*;
use crate::format::{LogBody, LogRecord};
use proptest::prelude::*;

fn disk() -> Arc<dyn Storage> {
    Arc::new(stela_wal::storage::StdStorage)
}

fn open_log(dir: &Path) -> stela_wal::Wal<LogRecord> {
    stela_wal::Wal::open(
        dir.join("log"),
        stela_wal::WalOptions::default().sync(stela_wal::SyncMode::None),
    )
    .unwrap()
}

/// A log of `records` writes, spread over pages `0..pages`, archived in runs ending at
/// each of `ends`, in `dir/archive` on the real disk, unsynced.
fn archived_in_runs(
    dir: &Path,
    records: u8,
    pages: u64,
    ends: &[u64],
) -> (stela_wal::Wal<LogRecord>, PathBuf, LogArchive) {
    let log = open_log(dir);
    for i in 0..records {
        log.append(&write(u64::from(i) % pages, i)).unwrap();
    }
    let at = dir.join("archive");
    let archive = LogArchive::open(disk(), &at, false).unwrap();
    for &end in ends {
        archive.archive_from(&log, Lsn::new(end)).unwrap();
    }
    (log, at, archive)
}

fn write(page: PageId, key: u8) -> LogRecord {
    LogRecord {
        txn: 1,
        prev_txn_lsn: Lsn::ZERO,
        body: LogBody::Write {
            page,
            prev_page_lsn: Lsn::ZERO,
            key: vec![key],
            before: None,
            after: Some(vec![key]),
        },
    }
}

fn commit() -> LogRecord {
    LogRecord {
        txn: 1,
        prev_txn_lsn: Lsn::new(1),
        body: LogBody::Commit,
    }
}

/// Every page's history from the log itself, for comparison.
fn from_log(log: &dyn LogDevice, page: PageId) -> Vec<(Lsn, LogRecord)> {
    log.read_from(Lsn::FIRST)
        .unwrap()
        .map(|item| item.unwrap())
        .filter(|(_, r)| r.pages().any(|(p, _)| p == page))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    /// Archiving in steps of any size, then merging down to any number of runs, keeps
    /// each page's history exactly what the log holds.
    #[test]
    fn merged_runs_hold_what_their_inputs_held(
        pages in proptest::collection::vec(0u64..5, 1..60),
        steps in proptest::collection::vec(1u64..12, 1..8),
        keep in 1usize..4,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let log = open_log(dir.path());
        for (i, &page) in pages.iter().enumerate() {
            let record = if i % 7 == 6 { commit() } else { write(page, i as u8) };
            log.append(&record).unwrap();
        }
        let archive = LogArchive::open(disk(), dir.path().join("archive"), false).unwrap();
        let mut upto = 0;
        for step in &steps {
            upto += step;
            archive.archive_from(&log, Lsn::new(upto)).unwrap();
        }
        archive.archive_from(&log, log.last_lsn()).unwrap();
        let before: Vec<_> = (0..5).map(|p| archive.page_history(p, Lsn::ZERO).unwrap().0).collect();
        for page in 0..5 {
            prop_assert_eq!(&before[page as usize], &from_log(&log, page));
        }
        archive.merge_down_to(keep).unwrap();
        prop_assert!(archive.runs().len() <= keep);
        let reopened = LogArchive::open(disk(), dir.path().join("archive"), false).unwrap();
        prop_assert_eq!(reopened.archived_lsn(), log.last_lsn());
        for page in 0..5 {
            prop_assert_eq!(&reopened.page_history(page, Lsn::ZERO).unwrap().0, &before[page as usize]);
            let after = Lsn::new(upto.min(30));
            let tail: Vec<_> = before[page as usize].iter().filter(|(l, _)| *l > after).cloned().collect();
            prop_assert_eq!(reopened.page_history(page, after).unwrap().0, tail);
        }
        // A cleaner's slice of the merged runs: exactly the log's changes in the range.
        let (from, upto) = (Lsn::new(upto.min(20) + 1), Lsn::new(upto.min(20) + 25));
        let changes = reopened.changes_between(from, upto).unwrap();
        for page in 0..5 {
            let expected: Vec<_> = from_log(&log, page)
                .into_iter()
                .filter(|(l, _)| (from..=upto).contains(l))
                .collect();
            prop_assert_eq!(changes.get(&page).cloned().unwrap_or_default(), expected);
        }
    }
}

/// A log of writes to `pages` pages, one each, then a few more: runs whose index has
/// several blocks.
fn many_pages_log(dir: &Path, pages: u64) -> stela_wal::Wal<LogRecord> {
    let log = open_log(dir);
    for page in 0..pages {
        log.append(&write(page, page as u8)).unwrap();
    }
    for page in (0..pages).step_by(7) {
        log.append(&write(page, 1)).unwrap();
    }
    log
}

fn version_of(path: &Path) -> u32 {
    let bytes = std::fs::read(path).unwrap();
    u32::from_le_bytes(bytes[8..12].try_into().unwrap())
}

#[test]
fn runs_of_layout_version_1_open_read_and_merge_into_version_2() {
    let dir = tempfile::tempdir().unwrap();
    let pages = run_format::INDEX_BLOCK_PAGES as u64 * 3 + 5;
    let log = many_pages_log(dir.path(), pages);
    let at = dir.path().join("archive");
    let archive = LogArchive::open(disk(), &at, false).unwrap();
    for upto in [pages / 2, pages, log.last_lsn().get()] {
        archive.archive_from(&log, Lsn::new(upto)).unwrap();
    }
    let paths: Vec<PathBuf> = archive.snapshot().iter().map(|r| r.path.clone()).collect();
    assert_eq!(paths.len(), 3);
    drop(archive);
    // The runs as an older release wrote them.
    for path in &paths {
        assert_eq!(version_of(path), 2);
        let old = crate::format::run::to_version_1(&std::fs::read(path).unwrap());
        std::fs::write(path, old).unwrap();
        assert_eq!(version_of(path), 1);
    }
    let reopened = LogArchive::open(disk(), &at, false).unwrap();
    for page in (0..pages).step_by(13).chain([pages - 1]) {
        assert_eq!(
            reopened.page_history(page, Lsn::ZERO).unwrap().0,
            from_log(&log, page),
            "page {page}"
        );
    }
    reopened.merge_down_to(1).unwrap();
    let merged = reopened.snapshot();
    assert_eq!(merged.len(), 1);
    assert_eq!(version_of(&merged[0].path), 2);
    assert!(merged[0].index.blocks() > 1);
    for page in (0..pages).step_by(11).chain([pages - 1]) {
        assert_eq!(
            reopened.page_history(page, Lsn::ZERO).unwrap().0,
            from_log(&log, page),
            "page {page}"
        );
    }
}

#[test]
fn a_damaged_index_block_is_refused_when_first_read_and_names_its_run() {
    let dir = tempfile::tempdir().unwrap();
    let pages = run_format::INDEX_BLOCK_PAGES as u64 * 2 + 10;
    let log = many_pages_log(dir.path(), pages);
    let at = dir.path().join("archive");
    let archive = LogArchive::open(disk(), &at, false).unwrap();
    archive.archive_from(&log, log.last_lsn()).unwrap();
    let run = Arc::clone(&archive.snapshot()[0]);
    drop(archive);
    // A flipped bit in the second index block: open reads only the summary, so it opens;
    // the first reader of a page in that block gets the damage, never a wrong history.
    let span = run.index.block_span(1);
    let mut bytes = std::fs::read(&run.path).unwrap();
    bytes[(span.start + 25) as usize] ^= 0x10;
    std::fs::write(&run.path, &bytes).unwrap();
    let reopened = LogArchive::open(disk(), &at, false).unwrap();
    let in_first_block = 3;
    assert_eq!(
        reopened.page_history(in_first_block, Lsn::ZERO).unwrap().0,
        from_log(&log, in_first_block)
    );
    let in_second_block = run_format::INDEX_BLOCK_PAGES as u64 + 3;
    match reopened.page_history(in_second_block, Lsn::ZERO) {
        Err(Error::Archive {
            path,
            source: RunError::Checksum { .. },
        }) => assert_eq!(path, run.path),
        other => panic!("expected the damaged block refused, got {other:?}"),
    }
    // And again: a damaged block is not cached as good.
    assert!(reopened.page_history(in_second_block, Lsn::ZERO).is_err());
}

#[test]
fn a_crash_mid_write_or_mid_merge_leaves_an_archive_that_opens_consistent() {
    let dir = tempfile::tempdir().unwrap();
    let (_log, at, archive) = archived_in_runs(dir.path(), 30, 3, &[10, 20, 30]);
    let history = archive.page_history(1, Lsn::ZERO).unwrap().0;
    // A merge that crashed after naming its run, before removing the inputs: copy the
    // inputs back beside the merged run.
    let inputs: Vec<(PathBuf, Vec<u8>)> = archive
        .snapshot()
        .iter()
        .take(2)
        .map(|r| (r.path.clone(), std::fs::read(&r.path).unwrap()))
        .collect();
    archive.merge_down_to(2).unwrap();
    assert_eq!(archive.runs().len(), 2);
    for (path, bytes) in &inputs {
        std::fs::write(path, bytes).unwrap();
    }
    // A run cut short by a crash before its rename.
    std::fs::write(
        at.join(format!(
            "{}{PARTIAL}",
            run_name(RunRange {
                first: Lsn::new(31),
                last: Lsn::new(40)
            })
        )),
        b"STELARUN half a run",
    )
    .unwrap();
    drop(archive);
    let reopened = LogArchive::open(disk(), &at, false).unwrap();
    assert_eq!(
        reopened.runs(),
        vec![(Lsn::new(1), Lsn::new(20)), (Lsn::new(21), Lsn::new(30))]
    );
    assert_eq!(
        std::fs::read_dir(&at).unwrap().count(),
        2,
        "leftovers removed"
    );
    assert_eq!(reopened.page_history(1, Lsn::ZERO).unwrap().0, history);

    // A named run that is damaged is an error naming it, not a silent loss.
    let victim = at.join(run_name(RunRange {
        first: Lsn::new(21),
        last: Lsn::new(30),
    }));
    let mut bytes = std::fs::read(&victim).unwrap();
    let last = bytes.len() - 10;
    bytes[last] ^= 0x40;
    std::fs::write(&victim, &bytes).unwrap();
    drop(reopened);
    match LogArchive::open(disk(), &at, false) {
        Err(Error::Archive { path, .. }) => assert_eq!(path, victim),
        other => panic!("a damaged run opened: {:?}", other.err()),
    }
    // And so is a gap: the runs must cover the log from its first record.
    bytes[last] ^= 0x40;
    std::fs::write(&victim, &bytes).unwrap();
    std::fs::remove_file(at.join(run_name(RunRange {
        first: Lsn::new(1),
        last: Lsn::new(20),
    })))
    .unwrap();
    assert!(matches!(
        LogArchive::open(disk(), &at, false),
        Err(Error::Archive {
            source: RunError::Gap { .. },
            ..
        })
    ));
}

/// Dies (fails every call from then on) after `budget` calls that reach the storage: the
/// process stops there, mid-operation.
#[derive(Debug)]
struct DieAfter(std::sync::atomic::AtomicU64);

impl stela_wal::storage::Hooks for DieAfter {
    fn before(&self, _call: &stela_wal::storage::Call<'_>) -> std::io::Result<()> {
        use std::sync::atomic::Ordering::SeqCst;
        match self
            .0
            .fetch_update(SeqCst, SeqCst, |left| left.checked_sub(1))
        {
            Ok(_) => Ok(()),
            Err(_) => Err(std::io::Error::other("simulated crash")),
        }
    }
}

/// Page `id` with every change of `log` up to `upto`, replayed from the empty page.
fn page_at(log: &stela_wal::Wal<LogRecord>, id: PageId, upto: Lsn) -> Page {
    let mut page = Page::empty();
    for (lsn, record) in from_log(log, id) {
        if lsn <= upto {
            crate::access::redo::redo(id, &mut page, lsn, &record).unwrap();
        }
    }
    page
}

/// Page `id` as the archive rebuilds it: its base image, then its history after it.
fn rebuilt(archive: &LogArchive, id: PageId) -> Page {
    let mut page = archive.base_image(id).unwrap();
    for (lsn, record) in archive.page_history(id, page.lsn).unwrap().0 {
        crate::access::redo::redo(id, &mut page, lsn, &record).unwrap();
    }
    page
}

/// A backup and the pruning behind it, stopped after every number of storage calls and
/// then cut by a power loss (unsynced writes lost or torn): the archive reopens, and every
/// page rebuilt from its base image and its history is the page with every archived
/// change. Failure this provokes: a run removed before the backup that replaces it is
/// durable, or a half-written backup taken for a whole one.
#[test]
fn a_crash_anywhere_in_a_backup_and_prune_leaves_every_page_rebuildable() {
    use stela_wal::storage::{CrashPlan, FaultStorage, Hooked};
    let dir = tempfile::tempdir().unwrap();
    let log = open_log(dir.path());
    let pages: u64 = 3;
    for i in 0..45u8 {
        log.append(&write(u64::from(i) % pages, i)).unwrap();
    }
    let at = Path::new("/store/archive");
    let mut calls_of_a_whole_backup = None;
    for budget in 0.. {
        if calls_of_a_whole_backup.is_some_and(|whole| budget > whole) {
            break;
        }
        for plan_seed in 0..3u64 {
            let fault = FaultStorage::new();
            let hooked = Arc::new(Hooked::wrap(
                Arc::new(fault.clone()),
                DieAfter(std::sync::atomic::AtomicU64::new(u64::MAX)),
            ));
            let archive = LogArchive::open(hooked.clone(), at, true).unwrap();
            fault.sync_dir(Path::new("/")).unwrap();
            fault.sync_dir(Path::new("/store")).unwrap();
            for upto in [10, 20, 30, 45] {
                archive.archive_from(&log, Lsn::new(upto)).unwrap();
            }
            // An older backup first, so that replacing one is covered too.
            let read = |through: Lsn| {
                let log = &log;
                move |id: PageId| Ok((page_at(log, id, through), false))
            };
            archive
                .backup_and_prune(Lsn::new(10), pages, &mut read(Lsn::new(10)))
                .unwrap();
            assert_eq!(archive.runs().len(), 3);
            hooked
                .hooks()
                .0
                .store(budget, std::sync::atomic::Ordering::SeqCst);
            let outcome = archive.backup_and_prune(Lsn::new(30), pages, &mut read(Lsn::new(30)));
            if outcome.is_ok() && calls_of_a_whole_backup.is_none() {
                calls_of_a_whole_backup = Some(budget);
            }
            drop(archive);
            fault.crash(match plan_seed {
                0 => CrashPlan::LoseUnsynced,
                seed => CrashPlan::TearUnsynced { seed },
            });
            let reopened = LogArchive::open(Arc::new(fault.clone()), at, true)
                .unwrap_or_else(|e| panic!("budget {budget}, plan {plan_seed}: {e}"));
            let floor = reopened.floor();
            assert!(
                floor == Lsn::new(10) || floor == Lsn::new(30),
                "budget {budget}: floor {floor:?}"
            );
            if outcome.is_ok() {
                assert_eq!(floor, Lsn::new(30), "a completed backup survives");
                assert_eq!(reopened.runs(), vec![(Lsn::new(31), Lsn::new(45))]);
            }
            assert_eq!(reopened.archived_lsn(), Lsn::new(45));
            for id in 0..pages {
                assert_eq!(
                    rebuilt(&reopened, id),
                    page_at(&log, id, Lsn::new(45)),
                    "budget {budget}, plan {plan_seed}: page {id}"
                );
            }
        }
    }
    assert!(calls_of_a_whole_backup.is_some_and(|calls| calls > 5));
}

#[test]
fn without_a_backup_the_runs_must_start_at_lsn_1_and_with_one_at_or_below_its_lsn() {
    let dir = tempfile::tempdir().unwrap();
    let (log, at, archive) = archived_in_runs(dir.path(), 30, 2, &[10, 20, 30]);
    let mut read = |id: PageId| Ok((page_at(&log, id, Lsn::new(15)), false));
    // Nothing ends at or below 15 but the first run; the newest is never removed.
    let report = archive
        .backup_and_prune(Lsn::new(15), 2, &mut read)
        .unwrap();
    assert_eq!((report.runs_removed, report.pages), (1, 2));
    assert_eq!(
        archive.runs(),
        vec![(Lsn::new(11), Lsn::new(20)), (Lsn::new(21), Lsn::new(30))]
    );
    for id in 0..2 {
        assert_eq!(rebuilt(&archive, id), page_at(&log, id, Lsn::new(30)));
    }
    assert_eq!(
        archive.base_image(7).unwrap(),
        Page::empty(),
        "past the backup"
    );
    drop(archive);
    // The backup gone: the runs no longer reach back to LSN 1, which open refuses.
    let backup = at.join(backup_name(Lsn::new(15)));
    let bytes = std::fs::read(&backup).unwrap();
    std::fs::remove_file(&backup).unwrap();
    assert!(matches!(
        LogArchive::open(disk(), &at, false),
        Err(Error::Archive {
            source: RunError::Gap { .. },
            ..
        })
    ));
    // A damaged backup image is an error naming the page, not a wrong page.
    let mut damaged = bytes.clone();
    damaged[PAGE_SIZE + 100] ^= 0x10;
    std::fs::write(&backup, &damaged).unwrap();
    let reopened = LogArchive::open(disk(), &at, false).unwrap();
    assert!(reopened.base_image(0).is_ok());
    assert!(matches!(
        reopened.base_image(1),
        Err(Error::Corrupt { page: 1, .. })
    ));
}
