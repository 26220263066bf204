//! The B+tree and the whole store against a `BTreeMap` model, under random puts, deletes,
//! gets, scans, commits, aborts and crashes.
//!
//! Keys are long (up to ~600 bytes) and values up to 600 bytes, so leaves and internal nodes
//! split after a few dozen operations; the pool has 8 frames, so dirty pages of running
//! transactions are evicted (steal). A crash drops the running transaction and the store
//! without writing the pool; the reopened store must hold exactly the committed transactions'
//! state. Failures this provokes: a lost committed write (redo), a visible uncommitted one
//! (undo, or a page written before its log records: the write-ahead rule), a key lost or
//! misrouted by a split, a wrong scan range.

mod common;

use proptest::prelude::*;
use std::collections::BTreeMap;
use std::ops::Bound;
use stela_store::{Store, Transaction};

#[derive(Clone, Debug)]
enum Op {
    Put { key: u16, len: u16, fill: u8 },
    Delete { key: u16 },
    Get { key: u16 },
    Scan { from: u16, to: u16 },
    Commit,
    Abort,
    Crash,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        40 => (0..300u16, 0..600u16, any::<u8>()).prop_map(|(key, len, fill)| Op::Put { key, len, fill }),
        15 => (0..300u16).prop_map(|key| Op::Delete { key }),
        12 => (0..300u16).prop_map(|key| Op::Get { key }),
        4 => (0..300u16, 0..300u16).prop_map(|(from, to)| Op::Scan { from, to }),
        10 => Just(Op::Commit),
        4 => Just(Op::Abort),
        2 => Just(Op::Crash),
    ]
}

/// Key `i`: its number first (so the order is the numbers'), padded to a length between 5 and
/// 604 bytes that varies without a short period (so separators of every size go up).
fn key(i: u16) -> Vec<u8> {
    let mut key = format!("{i:05}").into_bytes();
    key.resize(5 + usize::from(i) * 7919 % 600, b'.');
    key
}

/// The model of what a transaction sees: committed state overlaid with its own writes.
fn visible(
    committed: &BTreeMap<Vec<u8>, Vec<u8>>,
    pending: &BTreeMap<Vec<u8>, Option<Vec<u8>>>,
) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut view = committed.clone();
    for (k, v) in pending {
        match v {
            Some(v) => view.insert(k.clone(), v.clone()),
            None => view.remove(k),
        };
    }
    view
}

/// Entries as (key number, value length, value byte): short enough to read in a failure.
fn summary(entries: impl IntoIterator<Item = (Vec<u8>, Vec<u8>)>) -> Vec<(String, usize, u8)> {
    entries
        .into_iter()
        .map(|(k, v)| {
            let number = String::from_utf8_lossy(&k[..k.len().min(5)]).into_owned();
            (number, v.len(), v.first().copied().unwrap_or(0))
        })
        .collect()
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let mut committed: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    let mut ops = ops.into_iter().peekable();
    while ops.peek().is_some() {
        let store = Store::open(dir.path(), common::options()).unwrap();
        prop_assert_eq!(
            summary(common::contents(&store)),
            summary(committed.clone()),
            "after restart: exactly the committed state"
        );
        {
            let mut txn: Option<Transaction> = None;
            let mut pending: BTreeMap<Vec<u8>, Option<Vec<u8>>> = BTreeMap::new();
            for op in ops.by_ref() {
                let t = txn.get_or_insert_with(|| store.begin());
                match op {
                    Op::Put { key: k, len, fill } => {
                        let value = vec![fill; usize::from(len)];
                        t.put(&key(k), &value).unwrap();
                        pending.insert(key(k), Some(value));
                    }
                    Op::Delete { key: k } => {
                        let existed = t.delete(&key(k)).unwrap();
                        prop_assert_eq!(
                            existed,
                            visible(&committed, &pending).contains_key(&key(k))
                        );
                        pending.insert(key(k), None);
                    }
                    Op::Get { key: k } => {
                        let got = t.get(&key(k)).unwrap();
                        prop_assert_eq!(got, visible(&committed, &pending).get(&key(k)).cloned());
                    }
                    Op::Scan { from, to } => {
                        let (from, to) = (key(from.min(to)), key(from.max(to)));
                        let got = t
                            .scan(Bound::Included(&from[..]), Bound::Excluded(&to[..]))
                            .unwrap();
                        let want: Vec<_> = visible(&committed, &pending)
                            .range(from..to)
                            .map(|(k, v)| (k.clone(), v.clone()))
                            .collect();
                        prop_assert_eq!(summary(got), summary(want));
                    }
                    Op::Commit => {
                        txn.take().unwrap().commit().unwrap();
                        committed = visible(&committed, &pending);
                        pending.clear();
                    }
                    Op::Abort => {
                        txn.take().unwrap().abort().unwrap();
                        pending.clear();
                    }
                    Op::Crash => break,
                }
            }
            // A crash, or the end of the run (also a crash: nothing is closed).
            common::crash(txn.take());
        }
        drop(store);
    }
    let store = Store::open(dir.path(), common::options()).unwrap();
    prop_assert_eq!(
        summary(common::contents(&store)),
        summary(committed),
        "after the last restart: exactly the committed state"
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    #[test]
    fn the_store_equals_the_model_of_committed_transactions_across_crashes(
        ops in proptest::collection::vec(op(), 1..400)
    ) {
        run(ops)?;
    }
}

/// The workloads above are big enough to split internal nodes and to evict dirty pages of
/// running transactions; this pins that, so the property test cannot silently stop covering it.
#[test]
fn a_workload_of_this_size_splits_internal_nodes_and_steals() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), common::options()).unwrap();
    let mut txn = store.begin();
    for i in 0..300u16 {
        txn.put(&key(i), &[7u8; 300]).unwrap();
    }
    // Still running, and pages were written: steal.
    assert!(store.pool_stats().writes > 0);
    txn.commit().unwrap();
    drop(store);
    // A split of a leaf touches 3 pages (left, right, parent; a root leaf: root and two new
    // pages); 4 or more in one structure change means an internal node split too.
    let largest_structure_change = {
        let wal: stela_wal::Wal<stela_store::LogRecord> =
            stela_wal::Wal::open(dir.path().join("log"), common::options().wal).unwrap();
        let largest = wal
            .iter()
            .unwrap()
            .filter_map(|r| match r.unwrap().1.body {
                stela_store::LogBody::Structure { pages } => Some(pages.len()),
                _ => None,
            })
            .max();
        largest.unwrap()
    };
    assert!(
        largest_structure_change >= 4,
        "{largest_structure_change} pages"
    );
    let store = Store::open(dir.path(), common::options()).unwrap();
    assert_eq!(common::contents(&store).len(), 300);
    assert!(store.restart_report().redo_applied > 0);
}
