//! The defaults a user keeps (issue 55): the persistence services run in the background without
//! being asked, a lock wait ends in `LockTimeout`, `scan` is an iterator that reads the tree a
//! batch at a time and locks what it returns, `get_for_update` locks a key exclusively up front.

use std::ops::Bound;
use std::time::{Duration, Instant};
use stela_store::{
    Error, Store, StoreOptions, DEFAULT_ARCHIVE_INTERVAL, DEFAULT_CHECKPOINT_INTERVAL,
    DEFAULT_CLEAN_INTERVAL, DEFAULT_LOCK_TIMEOUT, SCAN_BATCH,
};

fn key(i: usize) -> Vec<u8> {
    format!("key-{i:06}").into_bytes()
}

/// Polls `done` until it holds, failing after `limit` with `what`.
fn eventually(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A store opened with the defaults and never asked for a checkpoint, a cleaning round or an
/// archiving step has all three done for it: after a crash, restart starts from a checkpoint it
/// did not request, the page file holds images, and the archive holds the log.
#[test]
fn the_defaults_checkpoint_clean_and_archive_in_the_background() {
    let defaults = StoreOptions::default();
    assert_eq!(
        defaults.checkpoint_interval,
        Some(DEFAULT_CHECKPOINT_INTERVAL)
    );
    assert_eq!(defaults.clean_interval, Some(DEFAULT_CLEAN_INTERVAL));
    assert!(defaults.archive);
    assert_eq!(defaults.archive_interval, Some(DEFAULT_ARCHIVE_INTERVAL));
    assert_eq!(defaults.lock_timeout, Some(DEFAULT_LOCK_TIMEOUT));

    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    for batch in 0..20 {
        let mut txn = store.begin();
        for i in 0..50 {
            txn.put(&key(batch * 50 + i), &[7u8; 100]).unwrap();
        }
        txn.commit().unwrap();
    }
    let mut txn = store.begin();
    txn.put(b"last", b"1").unwrap();
    txn.commit().unwrap();
    let archive = store.log_archive().expect("the archive is kept by default");
    eventually(Duration::from_secs(60), "archiving step", || {
        archive.archived_lsn().get() > 0
    });
    let pages = dir.path().join("pages");
    eventually(Duration::from_secs(60), "cleaning round", || {
        std::fs::metadata(&pages).map_or(0, |m| m.len()) > 0
    });
    // A checkpoint after the writes: wait for a master record newer than the open's.
    std::thread::sleep(DEFAULT_CHECKPOINT_INTERVAL * 3);
    drop(store); // a crash

    let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
    let report = store.restart_report().clone();
    assert!(
        report.checkpoint.is_some(),
        "restart found no checkpoint: {report:?}"
    );
    let mut txn = store.begin();
    assert_eq!(txn.get(b"last").unwrap().as_deref(), Some(&b"1"[..]));
    assert_eq!(txn.scan(Bound::Unbounded, Bound::Unbounded).count(), 1001);
    txn.commit().unwrap();
    store.close().unwrap();
}

/// `on_request` starts no service thread: nothing is archived until asked.
#[test]
fn on_request_runs_no_service_until_asked() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), StoreOptions::on_request()).unwrap();
    let mut txn = store.begin();
    txn.put(b"a", b"1").unwrap();
    txn.commit().unwrap();
    std::thread::sleep(DEFAULT_ARCHIVE_INTERVAL * 2);
    let archive = store.log_archive().expect("archive kept");
    assert_eq!(archive.archived_lsn().get(), 0);
    store.archive().unwrap();
    assert!(archive.archived_lsn().get() > 0);
    store.close().unwrap();
}

fn with_timeout(timeout: Duration) -> StoreOptions {
    StoreOptions::on_request().lock_timeout(Some(timeout))
}

/// A wait for a lock held by a transaction that does not end fails with `LockTimeout` after
/// the configured time, holds nothing, and the key is granted once the holder ends.
#[test]
fn a_lock_wait_past_the_timeout_fails_with_lock_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), with_timeout(Duration::from_millis(300))).unwrap();
    let mut holder = store.begin();
    holder.put(b"k", b"held").unwrap();

    let mut waiter = store.begin();
    let started = Instant::now();
    let waited = waiter.get(b"k");
    let elapsed = started.elapsed();
    match waited {
        Err(Error::LockTimeout { txn, waited }) => {
            assert_eq!(txn, waiter.id());
            assert!(waited >= Duration::from_millis(300), "{waited:?}");
        }
        other => panic!("expected LockTimeout, got {other:?}"),
    }
    assert!(elapsed >= Duration::from_millis(300), "{elapsed:?}");
    // The waiter may go on: another key is free.
    waiter.put(b"other", b"1").unwrap();
    waiter.commit().unwrap();

    holder.commit().unwrap();
    let mut reader = store.begin();
    assert_eq!(reader.get(b"k").unwrap().as_deref(), Some(&b"held"[..]));
    reader.commit().unwrap();
    store.close().unwrap();
}

/// `scan` is an iterator over more entries than one batch, in key order, with every bound.
#[test]
fn scan_iterates_batch_after_batch_in_key_order() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), StoreOptions::on_request()).unwrap();
    let n = SCAN_BATCH * 3 + 17;
    let mut txn = store.begin();
    for i in 0..n {
        txn.put(&key(i), &i.to_le_bytes()).unwrap();
    }
    txn.commit().unwrap();

    let mut txn = store.begin();
    let all: Vec<_> = txn
        .scan(Bound::Unbounded, Bound::Unbounded)
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(all.len(), n);
    for (i, (k, v)) in all.iter().enumerate() {
        assert_eq!(k, &key(i));
        assert_eq!(v, &i.to_le_bytes());
    }
    let (from, to) = (key(SCAN_BATCH - 1), key(2 * SCAN_BATCH + 1));
    let keys: Vec<_> = txn
        .scan(Bound::Excluded(&from[..]), Bound::Included(&to[..]))
        .map(|entry| entry.unwrap().0)
        .collect();
    let want: Vec<_> = (SCAN_BATCH..=2 * SCAN_BATCH + 1).map(key).collect();
    assert_eq!(keys, want);
    // Taking a few entries reads one batch only, and the rest of the range stays unlocked.
    assert_eq!(
        txn.scan(Bound::Unbounded, Bound::Unbounded).take(3).count(),
        3
    );
    txn.commit().unwrap();
    store.close().unwrap();
}

/// Each key a scan returned stays locked shared until the scanning transaction ends, beyond
/// the first batch too; another transaction's uncommitted write in a later batch's range makes
/// the scan wait for it (here, time out).
#[test]
fn a_scan_locks_what_it_returns_and_waits_for_uncommitted_writes_in_any_batch() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), with_timeout(Duration::from_millis(300))).unwrap();
    let n = SCAN_BATCH * 2 + 5;
    let mut txn = store.begin();
    for i in 0..n {
        txn.put(&key(i), b"v").unwrap();
    }
    txn.commit().unwrap();

    let mut scanner = store.begin();
    assert_eq!(scanner.scan(Bound::Unbounded, Bound::Unbounded).count(), n);
    let mut writer = store.begin();
    let late = key(SCAN_BATCH + 3);
    assert!(matches!(
        writer.put(&late, b"w"),
        Err(Error::LockTimeout { .. })
    ));
    writer.abort().unwrap();
    scanner.commit().unwrap();

    // An uncommitted insert past the first batch: the scan reaches it in its second batch.
    let mut inserter = store.begin();
    let inserted = format!("key-{:06}x", SCAN_BATCH + 10).into_bytes();
    inserter.put(&inserted, b"new").unwrap();
    let mut scanner = store.begin();
    let results: Vec<_> = scanner.scan(Bound::Unbounded, Bound::Unbounded).collect();
    assert!(results[..SCAN_BATCH].iter().all(Result::is_ok));
    assert!(
        matches!(results.last(), Some(Err(Error::LockTimeout { .. }))),
        "the scan must wait for the uncommitted insert"
    );
    assert!(
        results.len() <= SCAN_BATCH + 1,
        "the scan ends at its error"
    );
    drop(scanner);
    inserter.commit().unwrap();
    store.close().unwrap();
}

/// `get_for_update` takes the key exclusively from the read on: a plain `get` by another
/// transaction waits for it (a plain `get` would have shared the key).
#[test]
fn get_for_update_locks_the_key_exclusively() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), with_timeout(Duration::from_millis(300))).unwrap();
    let mut txn = store.begin();
    txn.put(b"k", b"1").unwrap();
    txn.commit().unwrap();

    let mut shared = store.begin();
    assert_eq!(shared.get(b"k").unwrap().as_deref(), Some(&b"1"[..]));
    let mut other = store.begin();
    assert_eq!(other.get(b"k").unwrap().as_deref(), Some(&b"1"[..]));
    shared.commit().unwrap();
    other.commit().unwrap();

    let mut updater = store.begin();
    assert_eq!(
        updater.get_for_update(b"k").unwrap().as_deref(),
        Some(&b"1"[..])
    );
    let mut reader = store.begin();
    assert!(matches!(reader.get(b"k"), Err(Error::LockTimeout { .. })));
    reader.abort().unwrap();
    updater.put(b"k", b"2").unwrap();
    updater.commit().unwrap();
    let mut reader = store.begin();
    assert_eq!(reader.get(b"k").unwrap().as_deref(), Some(&b"2"[..]));
    reader.commit().unwrap();
    store.close().unwrap();
}
