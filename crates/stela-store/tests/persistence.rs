//! Checkpoints and page cleaning, of both kinds, against crashes.
//!
//! - The decoupled checkpoint, computed from the log alone, must know at least what the
//!   classical one copies from memory at the same log point: every page the pool holds dirty,
//!   from no later a change, and every running transaction. Failure this provokes: a page write
//!   logged before it happened or a page change analysis misses (a page dropped from the
//!   dirty-page table while the stored image lacks a change: a lost commit after restart).
//! - A workload with checkpoints and cleaning rounds between its transactions runs on a log
//!   that stops after record `k`, for every `k`: the crash lands between a checkpoint's begin
//!   and end, between a cleaner's page writes and its `PagesWritten` record, in the middle of
//!   a rollback, inside a chain of decoupled checkpoints logged as deltas. The reopened store
//!   must hold exactly the committed transactions, for every pairing of checkpoint kind and
//!   cleaner, restarted in either mode.
//! - Restart starts from the latest checkpoint (it reads less than the whole log), and after
//!   the decoupled cleaner caught up, eviction drops dirty pages without writing them.
//! - A cleaning round on a synced page file starts the writeback of its writes as it goes.

mod common;

use std::collections::BTreeMap;
use stela_store::{CheckpointKind, CleanerKind, LogBody, RestartMode, Store, StoreOptions};

const KINDS: [(CheckpointKind, CleanerKind); 4] = [
    (CheckpointKind::Classical, CleanerKind::Classical),
    (CheckpointKind::Classical, CleanerKind::Decoupled),
    (CheckpointKind::Decoupled, CleanerKind::Classical),
    (CheckpointKind::Decoupled, CleanerKind::Decoupled),
];

/// Services on request only (the tests call them), but with intervals so long they never run
/// on their own in a test: the store then keeps its in-memory log tail, as with running services.
fn options(checkpoints: CheckpointKind, cleaner: CleanerKind) -> StoreOptions {
    let hour = Some(std::time::Duration::from_secs(3600));
    common::options()
        .checkpoints(checkpoints)
        .cleaner(cleaner)
        .checkpoint_interval(hour)
        .clean_interval(hour)
}

fn key(i: usize) -> Vec<u8> {
    let mut key = format!("{i:04}").into_bytes();
    key.resize(30 + i * 53 % 300, b'-');
    key
}

#[derive(Clone, Copy)]
enum Step {
    /// Put keys `from..to` with values of this byte and length, then commit (or abort).
    Txn {
        from: usize,
        to: usize,
        fill: u8,
        len: usize,
        commit: bool,
    },
    Checkpoint,
    Clean,
}

fn workload() -> Vec<Step> {
    use Step::*;
    let txn = |from, to, fill, len, commit| Txn {
        from,
        to,
        fill,
        len,
        commit,
    };
    vec![
        txn(0, 40, b'a', 300, true),
        Checkpoint,
        txn(10, 30, b'b', 600, true),
        Clean,
        txn(0, 20, b'x', 700, false),
        Checkpoint,
        Clean,
        txn(30, 60, b'c', 200, true),
        Checkpoint,
        txn(5, 15, b'd', 900, true),
        Clean,
        Checkpoint,
        // A few pages dirty, then small changes between checkpoints: decoupled ones are logged
        // as deltas, so the crash lands inside a chain too.
        txn(44, 56, b'e', 300, true),
        Checkpoint,
        txn(41, 42, b'f', 50, true),
        Checkpoint,
        txn(42, 43, b'g', 50, false),
        Checkpoint,
        txn(43, 44, b'h', 50, true),
        Checkpoint,
    ]
}

/// Runs the workload until the log refuses a record; returns the committed state.
fn run_until_crash(store: &Store, steps: &[Step]) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut committed = BTreeMap::new();
    for step in steps {
        match *step {
            Step::Txn {
                from,
                to,
                fill,
                len,
                commit,
            } => {
                let mut txn = store.begin();
                for i in from..to {
                    if txn.put(&key(i), &vec![fill; len]).is_err() {
                        common::crash(Some(txn));
                        return committed;
                    }
                }
                if commit {
                    if txn.commit().is_err() {
                        return committed;
                    }
                    for i in from..to {
                        committed.insert(key(i), vec![fill; len]);
                    }
                } else if txn.abort().is_err() {
                    return committed;
                }
            }
            Step::Checkpoint => {
                if store.checkpoint().is_err() {
                    return committed;
                }
            }
            Step::Clean => {
                if store.clean().is_err() {
                    return committed;
                }
            }
        }
    }
    committed
}

#[test]
fn a_crash_at_every_record_with_checkpoints_and_cleaning_keeps_the_committed_state() {
    let steps = workload();
    for (checkpoints, cleaner) in KINDS {
        let length = {
            let dir = tempfile::tempdir().unwrap();
            let log = common::StopAfter::open(dir.path(), u64::MAX);
            let store =
                Store::open_with_log(dir.path(), log.clone(), options(checkpoints, cleaner))
                    .unwrap();
            run_until_crash(&store, &steps);
            drop(store);
            let deltas = log
                .wal
                .iter()
                .unwrap()
                .filter(|item| {
                    matches!(item, Ok((_, r)) if matches!(r.body, LogBody::CheckpointDelta { .. }))
                })
                .count();
            if checkpoints == CheckpointKind::Decoupled {
                assert!(
                    deltas >= 2,
                    "{cleaner:?} cleaner: {deltas} checkpoint deltas"
                );
            }
            log.wal.last_lsn().get()
        };
        assert!(length > 100, "{length} records");
        for k in 0..=length {
            let dir = tempfile::tempdir().unwrap();
            let store = Store::open_with_log(
                dir.path(),
                common::StopAfter::open(dir.path(), k),
                options(checkpoints, cleaner),
            )
            .unwrap();
            let committed: Vec<_> = run_until_crash(&store, &steps).into_iter().collect();
            drop(store);
            for mode in common::MODES {
                let copy = common::copy_store(dir.path());
                let options = options(checkpoints, cleaner).restart(mode);
                let store = Store::open(copy.path(), options).unwrap();
                assert_eq!(
                    common::contents(&store),
                    committed,
                    "{checkpoints:?} checkpoints, {cleaner:?} cleaner, {mode:?} restart: crash \
                     after record {k}"
                );
            }
        }
    }
}

#[test]
fn the_decoupled_dirty_page_table_covers_the_classical_one_at_the_same_point() {
    for cleaner in [CleanerKind::Classical, CleanerKind::Decoupled] {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(
            dir.path(),
            options(CheckpointKind::Decoupled, cleaner).pool_pages(16),
        )
        .unwrap();
        let mut compared = 0;
        for round in 0..12usize {
            let mut txn = store.begin();
            for i in 0..40 {
                let k = (round * 37 + i * 11) % 400;
                txn.put(&key(k), &vec![round as u8; 100 + k % 500]).unwrap();
            }
            // Half the rounds leave a transaction running across the checkpoints.
            let running = if round % 2 == 1 {
                Some(txn)
            } else {
                txn.commit().unwrap();
                None
            };
            if round % 3 == 0 {
                store.clean().unwrap();
            }
            // Both orders: the second checkpoint sees the first one's records, nothing else.
            let (classical, decoupled) = if round % 4 < 2 {
                let c = store.checkpoint_of(CheckpointKind::Classical).unwrap();
                (c, store.checkpoint_of(CheckpointKind::Decoupled).unwrap())
            } else {
                let d = store.checkpoint_of(CheckpointKind::Decoupled).unwrap();
                (store.checkpoint_of(CheckpointKind::Classical).unwrap(), d)
            };
            for page in &classical.tables.dirty_pages {
                let found = decoupled
                    .tables
                    .dirty_pages
                    .iter()
                    .find(|d| d.page == page.page);
                let found = found.unwrap_or_else(|| {
                    panic!(
                        "{cleaner:?} cleaner, round {round}: page {} dirty in the pool \
                         ({:?}) but not in the decoupled table {:?}",
                        page.page, page, decoupled.tables.dirty_pages
                    )
                });
                // With the classical cleaner the pool knows when each page became dirty, and
                // the log must not claim a later change; with the decoupled one the pool knows
                // only a bound (the clean LSN) and the log may know better, but never later
                // than the page's newest change, which the stored image lacks.
                let bound = match cleaner {
                    CleanerKind::Classical => page.rec_lsn,
                    CleanerKind::Decoupled => page.page_lsn,
                };
                assert!(
                    found.rec_lsn <= bound,
                    "round {round}: page {}: decoupled rec_lsn {} after classical {}",
                    page.page,
                    found.rec_lsn,
                    page.rec_lsn
                );
                compared += 1;
            }
            let classical_txns: Vec<_> = classical.tables.active.iter().map(|t| t.txn).collect();
            let decoupled_txns: Vec<_> = decoupled.tables.active.iter().map(|t| t.txn).collect();
            assert_eq!(classical_txns, decoupled_txns, "round {round}");
            for (c, d) in classical.tables.active.iter().zip(&decoupled.tables.active) {
                assert_eq!(c.last_lsn, d.last_lsn);
                assert_eq!(c.locks, d.locks, "the lock table from the log");
            }
            if let Some(txn) = running {
                txn.commit().unwrap();
            }
        }
        assert!(compared > 20, "{compared} dirty pages compared");
    }
}

#[test]
fn restart_starts_at_the_latest_checkpoint_of_either_kind() {
    for (checkpoints, cleaner) in KINDS {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), options(checkpoints, cleaner)).unwrap();
        for round in 0..5u8 {
            let mut txn = store.begin();
            for i in 0..50 {
                txn.put(&key(i), &[round; 200]).unwrap();
            }
            txn.commit().unwrap();
        }
        let total = store.checkpoint().unwrap().end.get();
        let mut txn = store.begin();
        txn.put(&key(7), b"after").unwrap();
        txn.commit().unwrap();
        drop(store);
        let store = Store::open(dir.path(), options(checkpoints, cleaner)).unwrap();
        let report = store.restart_report();
        assert!(report.checkpoint.is_some());
        assert!(
            report.records_analyzed < 10 && total > 200,
            "{checkpoints:?}: analysed {} of {total} records",
            report.records_analyzed
        );
        let contents = common::contents(&store);
        assert_eq!(contents.len(), 50);
        assert!(contents.contains(&(key(7), b"after".to_vec())));
        // A clean close leaves nothing to redo.
        store.close().unwrap();
        let store = Store::open(dir.path(), options(checkpoints, cleaner)).unwrap();
        assert_eq!(store.restart_report().redo_start, None, "{checkpoints:?}");
        assert_eq!(common::contents(&store).len(), 50);
    }
}

/// A decoupled checkpoint soon after another logs only what changed: the entries a small
/// transaction changed. Restart after a crash then starts from the newest delta, composing its
/// tables from the chain's full checkpoint, and has exactly the tables the checkpoint had: a
/// checkpoint taken right after it records the same dirty pages. After a cleaning round, which
/// leaves a table smaller than the changes to it, the checkpoint is logged whole. Failure this
/// provokes: a delta applied wrongly (a changed entry lost), restart reading the delta as a
/// whole table, or its chain's records missing from instant restart's pending redo.
#[test]
fn a_decoupled_checkpoint_logs_what_changed_and_restart_composes_the_chain() {
    for cleaner in [CleanerKind::Classical, CleanerKind::Decoupled] {
        let dir = tempfile::tempdir().unwrap();
        // A pool larger than the test's default, so that many pages stay dirty.
        let options = || options(CheckpointKind::Decoupled, cleaner).pool_pages(256);
        let store = Store::open(dir.path(), options()).unwrap();
        let mut txn = store.begin();
        for i in 0..500 {
            txn.put(&key(i), &[b'a'; 300]).unwrap();
        }
        txn.commit().unwrap();
        let full = store.checkpoint().unwrap();
        assert_eq!(full.delta_entries, None);
        let dirty = full.tables.dirty_pages.len();
        assert!(dirty > 10, "{dirty} dirty pages");
        let mut last = full;
        let rounds = 3;
        for round in 0..rounds {
            let mut txn = store.begin();
            txn.put(&key(round), &[round as u8; 10]).unwrap();
            txn.commit().unwrap();
            let report = store.checkpoint().unwrap();
            let entries = report
                .delta_entries
                .unwrap_or_else(|| panic!("{cleaner:?}: round {round} logged whole"));
            assert!(entries <= 3, "{entries} entries for one key");
            last = report;
        }
        // The last delta is the newest checkpoint restart finds below; a cleaning round and
        // a checkpoint on a copy show the other side of the choice. Classical restart, so that
        // every page with redo is in the pool when the round runs: after an instant one the
        // classical cleaner skips the pages the background redo has not reached yet (by
        // design), and how many those are is timing (a CI run failed on it).
        let copy = common::copy_store(dir.path());
        {
            let options = options().restart(RestartMode::Classical);
            let store = Store::open(copy.path(), options).unwrap();
            store.checkpoint().unwrap();
            let mut txn = store.begin();
            txn.put(&key(9), b"x").unwrap();
            txn.commit().unwrap();
            store.clean().unwrap();
            let report = store.checkpoint().unwrap();
            let left = report.tables.dirty_pages.len();
            assert!(
                left < dirty / 2,
                "{cleaner:?}: {left} of {dirty} pages dirty after cleaning"
            );
            assert_eq!(report.delta_entries, None, "{cleaner:?}: after cleaning");
        }
        drop(store);
        for mode in common::MODES {
            let copy = common::copy_store(dir.path());
            let store = Store::open(copy.path(), options().restart(mode)).unwrap();
            assert_eq!(
                store.restart_report().checkpoint,
                Some(last.begin),
                "{mode:?}"
            );
            let next = store.checkpoint().unwrap();
            assert_eq!(
                next.tables.dirty_pages, last.tables.dirty_pages,
                "{cleaner:?}, {mode:?} restart"
            );
            let contents = common::contents(&store);
            assert_eq!(contents.len(), 500);
            for (i, (_, value)) in contents.iter().enumerate() {
                let expected = if i < rounds {
                    vec![i as u8; 10]
                } else {
                    vec![b'a'; 300]
                };
                assert_eq!(value, &expected, "{cleaner:?}, {mode:?} restart: key {i}");
            }
        }
    }
}

#[test]
fn after_a_decoupled_cleaning_round_eviction_drops_dirty_pages_without_writing() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(
        dir.path(),
        options(CheckpointKind::Decoupled, CleanerKind::Decoupled).pool_pages(16),
    )
    .unwrap();
    let mut txn = store.begin();
    for i in 0..400 {
        txn.put(&key(i), &[1; 200]).unwrap();
    }
    txn.commit().unwrap();
    // Dirty pages of one leaf range, then cleaned from the log.
    let mut txn = store.begin();
    for i in 0..20 {
        txn.put(&key(i), &[2; 200]).unwrap();
    }
    txn.commit().unwrap();
    let round = store.clean().unwrap();
    assert!(round.written > 0 && round.replayed > 0, "{round:?}");
    let before = store.pool_stats();
    // Reading the whole tree evicts those pages: without a write.
    assert_eq!(common::contents(&store).len(), 400);
    let after = store.pool_stats();
    assert!(after.elided > before.elided, "{after:?}");
    assert_eq!(after.eviction_writes, before.eviction_writes, "{after:?}");
    drop(store);
    let contents = reopened_contents(dir.path());
    assert_eq!(contents.len(), 400);
    assert_eq!(contents[3].1, vec![2; 200]);
}

/// Everything a store with decoupled services holds, reopened from `dir`.
fn reopened_contents(dir: &std::path::Path) -> Vec<(Vec<u8>, Vec<u8>)> {
    let store = Store::open(
        dir,
        options(CheckpointKind::Decoupled, CleanerKind::Decoupled),
    )
    .unwrap();
    common::contents(&store)
}

#[test]
fn the_decoupled_cleaner_replays_onto_the_images_it_kept_instead_of_reading_them_again() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(
        dir.path(),
        options(CheckpointKind::Decoupled, CleanerKind::Decoupled),
    )
    .unwrap();
    let update = |value: u8| {
        let mut txn = store.begin();
        for i in 0..400 {
            txn.put(&key(i), &[value; 200]).unwrap();
        }
        txn.commit().unwrap();
    };
    update(1);
    let first = store.clean().unwrap();
    assert!(first.read > 0 && first.written > 0, "{first:?}");
    // The same pages changed again: replayed onto the kept images, none read back.
    update(2);
    let second = store.clean().unwrap();
    assert_eq!(second.read, 0, "{second:?}");
    assert!(second.written > 0, "{second:?}");
    drop(store);
    let contents = reopened_contents(dir.path());
    assert_eq!(contents.len(), 400);
    assert!(contents.iter().all(|(_, value)| value == &vec![2; 200]));
}

#[test]
fn the_classical_cleaner_leaves_the_pool_clean_and_the_checkpoint_empty() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(
        dir.path(),
        options(CheckpointKind::Classical, CleanerKind::Classical).pool_pages(256),
    )
    .unwrap();
    let mut txn = store.begin();
    for i in 0..300 {
        txn.put(&key(i), &[1; 200]).unwrap();
    }
    txn.commit().unwrap();
    assert!(!store.checkpoint().unwrap().tables.dirty_pages.is_empty());
    let round = store.clean().unwrap();
    assert!(round.written > 0);
    assert_eq!(store.checkpoint().unwrap().tables.dirty_pages, vec![]);
    // And restart, with nothing dirty in the checkpoint, redoes nothing.
    drop(store);
    let store = Store::open(
        dir.path(),
        options(CheckpointKind::Classical, CleanerKind::Classical),
    )
    .unwrap();
    assert_eq!(store.restart_report().redo_start, None);
    assert_eq!(common::contents(&store).len(), 300);
}

/// The services on their own threads, every millisecond, while two clients commit; the log
/// stops at a record chosen so that the crash lands while they all run (in a cleaning round, a
/// checkpoint, a commit). Each client owns its keys, so its committed state is known exactly:
/// a commit that returned is in the log (the stopping log makes each record durable as it is
/// appended), one that failed is not.
///
/// The point is that the services run between the clients' records, so every run must log at
/// least one checkpoint (only the checkpoint thread logs those) and one page-write record (the
/// cleaner's, or an eviction's) before its crash. On a loaded machine the clients can fill the
/// log before the services' threads get a CPU; such a run is checked like any other, then
/// repeated with a log twice as long, up to 16 times the first length. A run in which the
/// services never ran by then fails the test.
#[test]
fn a_crash_while_background_services_run_keeps_the_committed_state() {
    let mut service_records = (0, 0);
    for (checkpoints, cleaner) in KINDS {
        for first_limit in [400u64, 900, 1500] {
            let mut limit = first_limit;
            loop {
                let (checkpoints_logged, page_writes_logged) =
                    crash_while_services_run(checkpoints, cleaner, limit);
                service_records.0 += checkpoints_logged;
                service_records.1 += page_writes_logged;
                if checkpoints_logged > 0 && page_writes_logged > 0 {
                    break;
                }
                assert!(
                    limit < first_limit * 16,
                    "{checkpoints:?} checkpoints, {cleaner:?} cleaner: the services logged \
                     {checkpoints_logged} checkpoints and {page_writes_logged} page-write \
                     records before a crash at record {limit}"
                );
                limit *= 2;
            }
        }
    }
    // The services did run while the clients committed (so crashes could land inside them).
    assert!(
        service_records.0 > 12 && service_records.1 > 12,
        "checkpoints, page-write records: {service_records:?}"
    );
}

/// One run of [`a_crash_while_background_services_run_keeps_the_committed_state`]: two clients
/// commit until the log stops at record `limit`, the store reopens and must hold exactly their
/// committed writes. Returns the checkpoints and page-write records the services logged.
fn crash_while_services_run(
    checkpoints: CheckpointKind,
    cleaner: CleanerKind,
    limit: u64,
) -> (usize, usize) {
    let dir = tempfile::tempdir().unwrap();
    let log = common::StopAfter::open(dir.path(), limit);
    let options = options(checkpoints, cleaner)
        .pool_pages(12)
        .checkpoint_interval(Some(std::time::Duration::from_millis(1)))
        .clean_interval(Some(std::time::Duration::from_millis(1)));
    let store = Store::open_with_log(dir.path(), log, options).unwrap();
    let models: Vec<BTreeMap<Vec<u8>, Vec<u8>>> = std::thread::scope(|scope| {
        let clients: Vec<_> = (0..2usize)
            .map(|client| {
                let store = &store;
                scope.spawn(move || {
                    let mut model = BTreeMap::new();
                    for round in 0.. {
                        let mut txn = store.begin();
                        let writes: Vec<(Vec<u8>, Vec<u8>)> = (0..4)
                            .map(|i| {
                                let k = client * 1000 + (round * 7 + i * 13) % 120;
                                (key(k), vec![(round % 251) as u8; 150 + k % 300])
                            })
                            .collect();
                        let mut failed = false;
                        for (k, v) in &writes {
                            if txn.put(k, v).is_err() {
                                failed = true;
                                break;
                            }
                        }
                        if failed {
                            common::crash(Some(txn));
                            return model;
                        }
                        if txn.commit().is_err() {
                            return model;
                        }
                        model.extend(writes);
                    }
                    model
                })
            })
            .collect();
        clients.into_iter().map(|c| c.join().unwrap()).collect()
    });
    drop(store);
    let store = Store::open(dir.path(), self::options(checkpoints, cleaner)).unwrap();
    let mut expected: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    for model in models {
        expected.extend(model);
    }
    assert_eq!(
        common::contents(&store),
        expected.into_iter().collect::<Vec<_>>(),
        "{checkpoints:?} checkpoints, {cleaner:?} cleaner, log stopped at {limit}"
    );
    drop(store);
    let wal: stela_wal::Wal<stela_store::LogRecord> =
        stela_wal::Wal::open(dir.path().join("log"), common::options().wal).unwrap();
    let mut logged = (0, 0);
    for item in wal.iter().unwrap() {
        match item.unwrap().1.body {
            LogBody::CheckpointEnd { .. } => logged.0 += 1,
            LogBody::PagesWritten { .. } => logged.1 += 1,
            _ => {}
        }
    }
    logged
}

/// Master records are written without a sync; after a machine crash both slots may be empty.
/// Restart must then analyse the whole log (no checkpoint), not fail or trust the bytes.
#[test]
fn a_damaged_master_record_means_restart_from_the_whole_log() {
    let dir = tempfile::tempdir().unwrap();
    let options = || options(CheckpointKind::Decoupled, CleanerKind::Decoupled);
    let store = Store::open(dir.path(), options()).unwrap();
    let mut txn = store.begin();
    for i in 0..30 {
        txn.put(&key(i), &[9; 100]).unwrap();
    }
    txn.commit().unwrap();
    store.checkpoint().unwrap();
    drop(store);
    for slot in ["checkpoint", "checkpoint.1"] {
        std::fs::write(dir.path().join(slot), b"\0\0\0").unwrap();
    }
    let store = Store::open(dir.path(), options()).unwrap();
    assert_eq!(store.restart_report().checkpoint, None);
    assert!(store.restart_report().records_analyzed > 30);
    assert_eq!(common::contents(&store).len(), 30);
}

/// A crash can keep a cleaner's page writes and lose the `PagesWritten` record that reports
/// them (the writes were synced, the record was not). Restart then finds the pages dirty from
/// an old LSN although their images hold every change. The next decoupled cleaning round must
/// say so, or a page nothing changes again stays dirty in every later checkpoint: redo starts
/// at its old LSN after every restart, and the log behind it is never truncated (seen in the
/// TPC-B power-cut soak: redo's start stuck at one LSN for good, restarts growing cut by cut).
#[test]
fn a_page_whose_write_report_a_crash_lost_is_reported_clean_by_the_next_round() {
    for cleaner in [CleanerKind::Decoupled, CleanerKind::Classical] {
        for mode in common::MODES {
            a_lost_write_report_is_made_good(cleaner, mode);
        }
    }
}

fn a_lost_write_report_is_made_good(cleaner: CleanerKind, mode: stela_store::RestartMode) {
    let dir = tempfile::tempdir().unwrap();
    let options = || options(CheckpointKind::Decoupled, cleaner).restart(mode);
    // Pages changed and committed; the log then stops accepting records, so the cleaner's
    // writes reach the page file and its `PagesWritten` record never reaches the log.
    let committed = {
        let log = common::StopAfter::open(dir.path(), u64::MAX);
        let store = Store::open_with_log(dir.path(), log.clone(), options()).unwrap();
        let mut txn = store.begin();
        for i in 0..200 {
            txn.put(&key(i), &[7; 100]).unwrap();
        }
        txn.commit().unwrap();
        let committed = common::contents(&store);
        drop(store);
        committed
    };
    {
        let last = {
            let log = common::StopAfter::open(dir.path(), u64::MAX);
            stela_store::LogDevice::last_lsn(&*log).get()
        };
        let log = common::StopAfter::open(dir.path(), last);
        let store = Store::open_with_log(dir.path(), log, options()).unwrap();
        store.finish_recovery().unwrap();
        assert!(
            store.clean().is_err(),
            "the cleaner's report cannot be logged"
        );
    }
    // Restart: the pages look dirty from an old LSN, their images are current.
    let store = Store::open(dir.path(), options()).unwrap();
    let stuck = store
        .restart_report()
        .redo_start
        .expect("the lost report leaves pages dirty");
    store.finish_recovery().unwrap();
    // Read every page (instant restart redoes a page on its first read), clean, checkpoint.
    assert_eq!(common::contents(&store), committed);
    store.clean().unwrap();
    store.checkpoint().unwrap();
    drop(store);
    let store = Store::open(dir.path(), options()).unwrap();
    let redo_start = store.restart_report().redo_start;
    assert!(
        redo_start.is_none_or(|lsn| lsn > stuck),
        "{cleaner:?} cleaner, {mode:?} restart: redo still starts at {redo_start:?}, as \
         before the cleaning round ({stuck})"
    );
    assert_eq!(common::contents(&store), committed);
}

/// Counts the writebacks started on the page file.
#[derive(Debug, Default)]
struct PageWritebacks(std::sync::atomic::AtomicUsize);

impl stela_wal::storage::Hooks for PageWritebacks {
    fn before(&self, call: &stela_wal::storage::Call<'_>) -> std::io::Result<()> {
        if let stela_wal::storage::Call::StartWriteback { path } = call {
            if path.ends_with("pages") {
                self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        Ok(())
    }
}

/// A cleaning round of either kind on a synced page file starts the writeback of its writes as
/// it makes them (every 512 KiB), so that its sync does not put the whole round on the disk at
/// once ahead of the log's syncs; on a page file that is never synced (the log's `SyncMode::None`)
/// it leaves writeback to the OS.
#[test]
fn a_cleaning_round_starts_the_writeback_of_its_writes_on_a_synced_page_file() {
    for cleaner in [CleanerKind::Classical, CleanerKind::Decoupled] {
        for synced in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let storage = stela_wal::storage::Hooked::wrap(
                std::sync::Arc::new(stela_wal::storage::StdStorage),
                PageWritebacks::default(),
            );
            let sync = match synced {
                true => stela_wal::SyncMode::Data,
                false => stela_wal::SyncMode::None,
            };
            let defaults = StoreOptions::on_request().archive(false).lock_timeout(None);
            let wal = defaults
                .wal
                .clone()
                .sync(sync)
                .storage(std::sync::Arc::new(storage.clone()));
            let options = defaults
                .wal(wal)
                .pool_pages(2048)
                .checkpoints(CheckpointKind::Decoupled)
                .cleaner(cleaner)
                .clean_interval(Some(std::time::Duration::from_secs(3600)));
            let store = Store::open(dir.path(), options).unwrap();
            // About 2 MiB of rows: a few hundred leaves, written in one round.
            for batch in 0..10 {
                let mut txn = store.begin();
                for i in 0..1000 {
                    txn.put(&key(batch * 1000 + i), &[batch as u8; 200])
                        .unwrap();
                }
                txn.commit().unwrap();
            }
            let round = store.clean().unwrap();
            assert!(round.written >= 128, "{cleaner:?}: {round:?}");
            let count = storage.hooks().0.load(std::sync::atomic::Ordering::Relaxed);
            if synced {
                assert!(
                    count as u64 >= round.written / 64 - 1,
                    "{cleaner:?}: {count} writebacks started for {} pages",
                    round.written
                );
            } else {
                assert_eq!(count, 0, "{cleaner:?}: never synced, left to the OS");
            }
            drop(store);
            let store = Store::open(dir.path(), common::options()).unwrap();
            assert_eq!(common::contents(&store).len(), 10_000);
        }
    }
}
