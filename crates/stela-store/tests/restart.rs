//! Restart at every point of a short workload, and restart interrupted and restarted.
//!
//! The workload (splits, updates, deletes, an abort, a transaction left running) runs on a log
//! that stops after record `k` (`common::StopAfter`), for every `k` from 0 to the workload's
//! length: the machine dies just as record `k + 1` would be written, with whatever pages the
//! 8-frame pool had evicted by then. The reopened store must hold exactly the transactions whose
//! commit returned. Failures this provokes: redo that misses a change (lost commit), undo that
//! misses one (visible uncommitted write, including the halves of an interrupted abort), a
//! split half redone.
//!
//! Then the same crash points, but restart itself dies after each record it writes (each
//! compensation), over and over until one restart gets through: the result must be the same,
//! and no write may have been compensated twice (a compensation's `undo_next` is followed, not
//! the undone write again).
//!
//! Every crash is restarted in both modes (from copies of the same files). An instant restart
//! is read while its redo and undo are still under way, then crashed again before it has
//! finished, and the store restarted once more (the other mode) must still hold exactly the
//! committed state. An instant restart that dies counts from the open to the end of its
//! background work.

mod common;

use std::collections::{BTreeMap, HashMap};
use stela_store::{LogBody, LogRecord, RestartMode, Store, Transaction};
use stela_wal::Wal;

enum End {
    Commit,
    Abort,
    /// Still running at the end of the workload: a loser at restart.
    Running,
}

type Write = (Vec<u8>, Option<Vec<u8>>);

fn key(prefix: &str, i: usize) -> Vec<u8> {
    let mut key = format!("{prefix}{i:03}").into_bytes();
    key.resize(40 + i * 37 % 200, b'-');
    key
}

fn workload() -> Vec<(Vec<Write>, End)> {
    let put = |prefix, range: std::ops::Range<usize>, fill: u8, len: usize| -> Vec<Write> {
        range
            .map(|i| (key(prefix, i), Some(vec![fill; len])))
            .collect()
    };
    let delete = |prefix, range: std::ops::Range<usize>| -> Vec<Write> {
        range.map(|i| (key(prefix, i), None)).collect()
    };
    vec![
        (put("k", 0..60, b'a', 500), End::Commit),
        (
            [
                put("k", 0..8, b'b', 900),
                delete("k", 10..14),
                put("n", 0..8, b'n', 900),
            ]
            .concat(),
            End::Abort,
        ),
        (
            [delete("k", 15..19), put("k", 20..24, b'c', 100)].concat(),
            End::Commit,
        ),
        (put("m", 0..16, b'm', 900), End::Running),
    ]
}

/// Runs the workload until the log refuses a record. Returns the committed state.
fn run_until_crash(store: &Store) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut committed = BTreeMap::new();
    for (writes, end) in workload() {
        let mut txn = store.begin();
        if apply(&mut txn, &writes).is_err() {
            common::crash(Some(txn));
            return committed;
        }
        match end {
            End::Commit => {
                if txn.commit().is_err() {
                    return committed;
                }
                for (k, v) in writes {
                    match v {
                        Some(v) => committed.insert(k, v),
                        None => committed.remove(&k),
                    };
                }
            }
            End::Abort => {
                if txn.abort().is_err() {
                    return committed;
                }
            }
            End::Running => common::crash(Some(txn)),
        }
    }
    committed
}

fn apply(txn: &mut Transaction, writes: &[Write]) -> stela_store::Result<()> {
    for (k, v) in writes {
        match v {
            Some(v) => txn.put(k, v)?,
            None => {
                txn.delete(k)?;
            }
        }
    }
    Ok(())
}

fn log_records(dir: &std::path::Path) -> Vec<LogRecord> {
    let wal: Wal<LogRecord> = Wal::open(dir.join("log"), common::options().wal).unwrap();
    wal.iter().unwrap().map(|r| r.unwrap().1).collect()
}

/// No write compensated twice; every aborted transaction compensated every write.
fn check_compensations(records: &[LogRecord]) {
    let mut per_txn: HashMap<u64, (usize, usize, bool)> = HashMap::new();
    for record in records {
        let entry = per_txn.entry(record.txn).or_default();
        match record.body {
            LogBody::Write { .. } => entry.0 += 1,
            LogBody::Compensate { .. } => entry.1 += 1,
            LogBody::Aborted => entry.2 = true,
            _ => {}
        }
    }
    for (txn, (writes, compensations, aborted)) in per_txn {
        assert!(
            compensations <= writes,
            "txn {txn}: {compensations} compensations of {writes} writes"
        );
        if aborted {
            assert_eq!(
                compensations, writes,
                "txn {txn} ended without undoing everything"
            );
        }
    }
}

fn workload_length() -> u64 {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_with_log(
        dir.path(),
        common::StopAfter::open(dir.path(), u64::MAX),
        common::options(),
    )
    .unwrap();
    run_until_crash(&store);
    assert!(
        store.pool_stats().writes > 0,
        "the workload must make the pool steal"
    );
    drop(store);
    log_records(dir.path()).len() as u64
}

#[test]
fn a_crash_at_every_record_keeps_exactly_the_committed_transactions() {
    let length = workload_length();
    assert!(length > 50, "{length} records");
    for k in 0..=length {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_with_log(
            dir.path(),
            common::StopAfter::open(dir.path(), k),
            common::options(),
        )
        .unwrap();
        let committed = run_until_crash(&store);
        drop(store);
        let committed: Vec<_> = committed.into_iter().collect();

        for mode in common::MODES {
            let dir = common::copy_store(dir.path());
            let options = common::options().restart(mode);
            let store = Store::open(dir.path(), options.clone()).unwrap();
            assert_eq!(
                common::contents(&store),
                committed,
                "{mode:?} restart, crash after record {k}"
            );
            // Instant: the background redo and undo may not have finished; a crash now must
            // lose nothing either.
            drop(store);
            let again = match mode {
                RestartMode::Classical => RestartMode::Instant,
                RestartMode::Instant => RestartMode::Classical,
            };
            let store = Store::open(dir.path(), common::options().restart(again)).unwrap();
            assert_eq!(
                common::contents(&store),
                committed,
                "{mode:?} restart crashed, then {again:?}, crash after record {k}"
            );
            drop(store);
            check_compensations(&log_records(dir.path()));
        }
    }
}

/// The default run crashes the workload at about 40 points spread over it (the exhaustive
/// run, every record, takes 6-11 minutes here: `--ignored`).
#[test]
fn a_restart_interrupted_at_every_record_it_writes_still_ends_in_the_committed_state() {
    let length = workload_length();
    interrupted_restarts_end_in_the_committed_state((length / 40).max(1) as usize);
}

#[test]
#[ignore = "exhaustive: a crash at every record of the workload, 6-11 minutes"]
fn a_restart_interrupted_at_every_record_it_writes_at_every_crash_point() {
    interrupted_restarts_end_in_the_committed_state(1);
}

fn interrupted_restarts_end_in_the_committed_state(stride: usize) {
    let length = workload_length();
    let mut interrupted_restarts = 0;
    let mut crash_points = 0;
    for k in (0..=length).step_by(stride) {
        crash_points += 1;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_with_log(
            dir.path(),
            common::StopAfter::open(dir.path(), k),
            common::options(),
        )
        .unwrap();
        let committed = run_until_crash(&store);
        drop(store);

        for mode in common::MODES {
            let dir = common::copy_store(dir.path());
            let options = common::options().restart(mode);
            // Each restart may write one record more than the last before it dies.
            let mut attempts = 0;
            let mut durable = log_records(dir.path()).len() as u64;
            let store = loop {
                let log = common::StopAfter::open(dir.path(), durable + 1);
                let restarted = Store::open_with_log(dir.path(), log.clone(), options.clone())
                    .and_then(|store| store.finish_recovery().map(|()| store));
                match restarted {
                    Ok(store) => break store,
                    Err(_) => {
                        // The log the failed restart wrote to, read before it is closed.
                        durable = log.wal.last_lsn().get();
                        attempts += 1;
                        assert!(attempts < 200, "crash after {k}: restart makes no progress");
                    }
                }
            };
            interrupted_restarts += attempts;
            assert_eq!(
                common::contents(&store),
                committed.clone().into_iter().collect::<Vec<_>>(),
                "{mode:?}: crash after record {k}, then {attempts} interrupted restarts"
            );
            drop(store);
            check_compensations(&log_records(dir.path()));
        }
    }
    assert!(
        interrupted_restarts > crash_points,
        "restarts were interrupted {interrupted_restarts} times over {crash_points} crash points"
    );
}
