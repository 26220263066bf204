//! Instant restart's on-demand paths, with the background thread off so that they are the only
//! ones at work: a crash leaves many dirty pages (none written: the pool holds them all) and a
//! loser whose writes reached the log.
//!
//! - A read of a committed key on a page whose redo is still pending must return the committed
//!   value (failure provoked: the pool hands out the stored image without its records).
//! - The loser's keys stay locked under its id until it is rolled back (a classical checkpoint
//!   copies the lock table), and a transaction that needs one rolls the loser back itself and
//!   then sees the committed value, not the loser's (failure provoked: a loser's write visible,
//!   or a wait that never ends because nothing rolls the loser back).
//! - A checkpoint of either kind taken while redo is pending counts the pending pages as dirty,
//!   and the decoupled cleaner's round during it writes images with their pending records:
//!   a crash then, and a restart from that checkpoint, still hold the committed state (failure
//!   provoked: a page missing from the classical checkpoint's dirty-page table, so the next
//!   restart never redoes it).

mod common;

use std::collections::BTreeMap;
use stela_store::{
    CheckpointKind, CleanerKind, LogBody, RestartMode, Store, StoreOptions, Transaction,
};

fn key(i: usize) -> Vec<u8> {
    format!("key{i:05}").into_bytes()
}

/// A pool large enough for the whole store, so that the crash finds every page dirty in it.
fn options() -> StoreOptions {
    common::options().pool_pages(4096)
}

fn instant() -> StoreOptions {
    options()
        .restart(RestartMode::Instant)
        .recover_in_background(false)
}

/// Loads 2,000 keys and updates a quarter of them, in two committed transactions; returns
/// what they committed.
fn load_and_update(store: &Store) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut committed = BTreeMap::new();
    let mut txn = store.begin();
    for i in 0..2000 {
        txn.put(&key(i), &[b'a'; 200]).unwrap();
        committed.insert(key(i), vec![b'a'; 200]);
    }
    txn.commit().unwrap();
    let mut txn = store.begin();
    for i in (0..2000).step_by(4) {
        txn.put(&key(i), &[b'b'; 150]).unwrap();
        committed.insert(key(i), vec![b'b'; 150]);
    }
    txn.commit().unwrap();
    committed
}

/// Loads 2,000 keys and updates a quarter of them, all committed, then leaves a loser that
/// changed keys 0..20 and inserted 20 new ones, and crashes. Returns the committed state and
/// the loser's id.
fn crash_with_dirty_pages_and_a_loser(dir: &std::path::Path) -> (BTreeMap<Vec<u8>, Vec<u8>>, u64) {
    let store = Store::open(dir, options()).unwrap();
    let mut committed = load_and_update(&store);
    let mut loser = store.begin();
    for i in 0..20 {
        loser.put(&key(i), b"loser").unwrap();
        loser.put(&key(10_000 + i), b"loser").unwrap();
    }
    let loser_id = loser.id();
    // A commit after the loser's writes makes them durable with it.
    let mut txn = store.begin();
    txn.put(&key(5000), b"last").unwrap();
    txn.commit().unwrap();
    committed.insert(key(5000), b"last".to_vec());
    assert_eq!(
        store.pool_stats().writes,
        0,
        "every page stays dirty in the pool"
    );
    common::crash(Some(loser));
    drop(store);
    (committed, loser_id)
}

#[test]
fn reads_after_an_instant_restart_see_the_committed_state_before_redo_and_undo_are_done() {
    let dir = tempfile::tempdir().unwrap();
    let (committed, loser) = crash_with_dirty_pages_and_a_loser(dir.path());

    let store = Store::open(dir.path(), instant()).unwrap();
    let report = store.restart_report().clone();
    assert_eq!(report.redo_applied, 0);
    assert!(report.pending_pages > 50, "{report:?}");
    assert_eq!(report.losers, vec![loser]);
    let pending = store.recovery_pending();
    assert_eq!(pending.pages as u64, report.pending_pages);
    assert_eq!(pending.losers, 1);

    // The loser holds its keys: a classical checkpoint copies them from the lock table.
    let checkpoint = store.checkpoint_of(CheckpointKind::Classical).unwrap();
    let held = checkpoint
        .tables
        .active
        .iter()
        .find(|t| t.txn == loser)
        .expect("the loser is in the transaction table");
    assert_eq!(held.locks.len(), 40);
    assert!(held.locks.contains(&key(3)) && held.locks.contains(&key(10_003)));

    // A committed key far from the loser's: its page is read, and redone, on this get.
    let mut txn = store.begin();
    assert_eq!(
        txn.get(&key(1501)).unwrap(),
        committed.get(&key(1501)).cloned()
    );
    assert_eq!(
        txn.get(&key(1500)).unwrap(),
        committed.get(&key(1500)).cloned()
    );
    txn.commit().unwrap();
    let redone = store.pool_stats().redone_on_read;
    assert!(redone >= 2, "root to leaf: {redone} pages redone on read");
    assert_eq!(
        store.recovery_pending().pages as u64,
        report.pending_pages - redone
    );
    assert_eq!(
        store.recovery_pending().losers,
        1,
        "no lock of the loser was needed yet"
    );

    // A key the loser changed: the reader needs its lock, rolls the loser back, and sees the
    // committed value; the loser's insert is gone.
    let mut txn = store.begin();
    assert_eq!(txn.get(&key(3)).unwrap(), committed.get(&key(3)).cloned());
    assert_eq!(txn.get(&key(10_003)).unwrap(), None);
    // A write, so that the commit makes the rollback's records durable too (they come first).
    txn.put(&key(9999), b"reader").unwrap();
    txn.commit().unwrap();
    let mut committed = committed;
    committed.insert(key(9999), b"reader".to_vec());
    assert_eq!(store.recovery_pending().losers, 0);
    assert!(store.recovery_pending().pages > 0, "redo still pending");

    // A crash in the middle of the instant restart, then a classical restart.
    drop(store);
    let store = Store::open(dir.path(), options().restart(RestartMode::Classical)).unwrap();
    assert_eq!(
        common::contents(&store),
        committed.clone().into_iter().collect::<Vec<_>>()
    );
    assert!(
        store.restart_report().losers.is_empty(),
        "the rollback was logged"
    );
    drop(store);
    let wal: stela_wal::Wal<stela_store::LogRecord> =
        stela_wal::Wal::open(dir.path().join("log"), common::options().wal).unwrap();
    let (mut compensations, mut aborted) = (0, false);
    for item in wal.iter().unwrap() {
        let (_, record) = item.unwrap();
        if record.txn == loser {
            match record.body {
                LogBody::Compensate { .. } => compensations += 1,
                LogBody::Aborted => aborted = true,
                _ => {}
            }
        }
    }
    assert_eq!((compensations, aborted), (40, true));
}

#[test]
fn a_writer_blocked_on_a_losers_key_proceeds_once_the_background_rolls_it_back() {
    let dir = tempfile::tempdir().unwrap();
    let (committed, _) = crash_with_dirty_pages_and_a_loser(dir.path());
    // With the background thread this time: the writer either finds the loser rolled back or
    // rolls it back itself; either way it must not wait forever nor see the loser's value.
    let store = Store::open(dir.path(), options()).unwrap();
    let mut txn = store.begin();
    txn.put(&key(7), b"new").unwrap();
    txn.commit().unwrap();
    store.finish_recovery().unwrap();
    assert!(store.recovery_pending().is_done());
    let mut expected = committed;
    expected.insert(key(7), b"new".to_vec());
    assert_eq!(
        common::contents(&store),
        expected.clone().into_iter().collect::<Vec<_>>()
    );
    store.close().unwrap();
    let store = Store::open(dir.path(), options()).unwrap();
    assert_eq!(store.restart_report().redo_start, None, "a clean close");
    assert_eq!(
        common::contents(&store),
        expected.into_iter().collect::<Vec<_>>()
    );
}

#[test]
fn checkpoints_and_cleaning_while_redo_is_pending_lose_nothing() {
    for (checkpoints, cleaner) in [
        (CheckpointKind::Classical, CleanerKind::Classical),
        (CheckpointKind::Classical, CleanerKind::Decoupled),
        (CheckpointKind::Decoupled, CleanerKind::Classical),
        (CheckpointKind::Decoupled, CleanerKind::Decoupled),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (mut committed, _) = crash_with_dirty_pages_and_a_loser(dir.path());
        let options = || instant().checkpoints(checkpoints).cleaner(cleaner);
        let store = Store::open(dir.path(), options()).unwrap();
        let pending = store.recovery_pending().pages;

        // Some pages redone and changed again, then a cleaning round and a checkpoint while
        // most are still pending.
        let mut txn: Transaction = store.begin();
        for i in (1000..1100).step_by(10) {
            txn.put(&key(i), b"after").unwrap();
            committed.insert(key(i), b"after".to_vec());
        }
        txn.commit().unwrap();
        store.clean().unwrap();
        let checkpoint = store.checkpoint().unwrap();
        let still_pending = store.recovery_pending().pages;
        assert!(still_pending > 0 && still_pending < pending);
        if cleaner == CleanerKind::Classical {
            assert!(
                checkpoint.tables.dirty_pages.len() >= still_pending,
                "{checkpoints:?}: {} dirty pages in the checkpoint, {still_pending} pending",
                checkpoint.tables.dirty_pages.len()
            );
        }

        // A crash now; the next restart starts from that checkpoint.
        drop(store);
        for mode in common::MODES {
            let copy = common::copy_store(dir.path());
            let store = Store::open(copy.path(), options().restart(mode)).unwrap();
            assert_eq!(store.restart_report().checkpoint, Some(checkpoint.begin));
            assert_eq!(
                common::contents(&store),
                committed.clone().into_iter().collect::<Vec<_>>(),
                "{checkpoints:?} checkpoints, {cleaner:?} cleaner, then {mode:?}"
            );
        }
    }
}

/// With a log archive, instant restart leaves the older changes of the dirty pages in the
/// archive and the page's first read redoes them from there: open reads from the log only
/// what the archive had not reached. The pool held every page (none written), so a redo that
/// skipped the archived part would lose the loaded keys (failure provoked so: the keys of the
/// first two transactions missing); and the store ends as a classical restart of a copy of the
/// same files ends.
#[test]
fn instant_restart_redoes_a_pages_older_changes_from_the_log_archive() {
    let dir = tempfile::tempdir().unwrap();
    let options = || options().archive(true).archive_interval(None);
    let store = Store::open(dir.path(), options()).unwrap();
    let mut committed = load_and_update(&store);
    let archived = store.archive().unwrap();
    assert!(archived.entries > 2000, "{archived:?}");
    // After the archive's end: changes open must read from the log.
    let mut txn = store.begin();
    for i in (1..2000).step_by(100) {
        txn.put(&key(i), b"after the archive").unwrap();
        committed.insert(key(i), b"after the archive".to_vec());
    }
    txn.commit().unwrap();
    let mut loser = store.begin();
    for i in 0..20 {
        loser.put(&key(i * 7), b"loser").unwrap();
    }
    let mut txn = store.begin();
    txn.put(&key(5000), b"last").unwrap();
    txn.commit().unwrap();
    committed.insert(key(5000), b"last".to_vec());
    store.checkpoint().unwrap();
    assert_eq!(store.pool_stats().writes, 0, "every page stays dirty");
    common::crash(Some(loser));
    drop(store);
    let classical_copy = common::copy_store(dir.path());
    let drained_copy = common::copy_store(dir.path());
    let want: Vec<_> = committed.into_iter().collect();
    let check = |store: &Store, how: &str| {
        let found = common::contents(store);
        assert_eq!(found.len(), want.len(), "{how}: keys after the restart");
        assert!(
            found == want,
            "{how}: a committed value differs after the restart"
        );
    };

    // Each page redone as a read first needs it: its archived changes read from the archive
    // by the page.
    let store = Store::open(dir.path(), options().restart(RestartMode::Instant)).unwrap();
    let report = store.restart_report().clone();
    assert!(report.pending_from_archive > 50, "{report:?}");
    assert_eq!(
        report.pending_from_archive, report.pending_pages,
        "{report:?}"
    );
    // The writes after the archive, the loser's and the last one, on their pages: nothing of
    // the 2,500 archived.
    assert!(report.pending_records <= 200, "{report:?}");
    check(&store, "redone on read");
    store.finish_recovery().unwrap();
    check(&store, "redone on read, then the losers rolled back");
    store.close().unwrap();

    // Every page redone by the background drain before anything reads it: the archived
    // changes read for a batch of pages at a time.
    let store = Store::open(drained_copy.path(), options().restart(RestartMode::Instant)).unwrap();
    store.finish_recovery().unwrap();
    assert!(store.recovery_pending().is_done());
    check(&store, "redone by the drain");
    store.close().unwrap();

    let store = Store::open(
        classical_copy.path(),
        options().restart(RestartMode::Classical),
    )
    .unwrap();
    check(&store, "classical");
}
