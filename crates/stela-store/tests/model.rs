//! The B+tree and the whole store against a `BTreeMap` model, under random puts, deletes,
//! updates, gets, scans, commits, aborts, checkpoints, cleaning rounds and crashes, with each kind of
//! checkpoint and each page cleaner, and each restart mode (instant with and without its
//! background thread: without it, redo and undo happen only on demand, so the operations after
//! a restart, checkpoints and cleaning rounds included, run while most of it is pending, and a
//! crash then lands in the middle of the restart).
//!
//! Keys are long (up to ~600 bytes) and values up to 600 bytes, so leaves and internal nodes
//! split after a few dozen operations; the pool has 8 frames, so dirty pages of running
//! transactions are evicted (steal). A crash drops the running transaction and the store
//! without writing the pool; the reopened store must hold exactly the committed transactions'
//! state. Failures this provokes: a lost committed write (redo), a visible uncommitted one
//! (undo, or a page written before its log records: the write-ahead rule), a key lost or
//! misrouted by a split, a wrong scan range; a checkpoint whose tables miss a dirty page or a
//! running transaction (restart starts from the latest one), a cleaner that writes an image
//! older than the stored one or a page change before its log record is durable.

mod common;

use proptest::prelude::*;
use std::collections::BTreeMap;
use std::ops::Bound;
use stela_store::{CheckpointKind, CleanerKind, RestartMode, Store, StoreOptions, Transaction};

#[derive(Clone, Debug)]
enum Op {
    Put {
        key: u16,
        len: u16,
        fill: u8,
    },
    Delete {
        key: u16,
    },
    /// `Transaction::update` with [`grown`]: a read and a write (or a removal) in one step.
    Update {
        key: u16,
        fill: u8,
    },
    Get {
        key: u16,
    },
    Scan {
        from: u16,
        to: u16,
    },
    Commit,
    Abort,
    Crash,
    /// A checkpoint of the kind the store was opened with.
    Checkpoint,
    /// A round of the page cleaner the store was opened with.
    Clean,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        40 => (0..300u16, 0..600u16, any::<u8>()).prop_map(|(key, len, fill)| Op::Put { key, len, fill }),
        15 => (0..300u16).prop_map(|key| Op::Delete { key }),
        15 => (0..300u16, any::<u8>()).prop_map(|(key, fill)| Op::Update { key, fill }),
        12 => (0..300u16).prop_map(|key| Op::Get { key }),
        4 => (0..300u16, 0..300u16).prop_map(|(from, to)| Op::Scan { from, to }),
        10 => Just(Op::Commit),
        4 => Just(Op::Abort),
        2 => Just(Op::Crash),
        2 => Just(Op::Checkpoint),
        2 => Just(Op::Clean),
    ]
}

/// What `Op::Update` makes of a value: a new one for an absent key, a removal for a length
/// divisible by 3, else the value one byte longer; so updates insert, grow (until a split) and
/// remove.
fn grown(old: Option<&[u8]>, fill: u8) -> Option<Vec<u8>> {
    match old {
        None => Some(vec![fill; 1 + usize::from(fill) * 2]),
        Some(value) if value.len() % 3 == 0 => None,
        Some(value) => Some([value, &[fill]].concat()),
    }
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
    for (mode, background) in [
        (RestartMode::Classical, true),
        (RestartMode::Instant, true),
        (RestartMode::Instant, false),
    ] {
        run_with(
            ops.clone(),
            CheckpointKind::Decoupled,
            CleanerKind::Decoupled,
            mode,
            background,
        )?;
    }
    Ok(())
}

fn run_with(
    ops: Vec<Op>,
    checkpoints: CheckpointKind,
    cleaner: CleanerKind,
    restart: RestartMode,
    background: bool,
) -> Result<(), TestCaseError> {
    // Intervals far longer than a test: the services run only when the ops say, but the store
    // keeps its in-memory log tail for them as it does when they run on their own.
    let hour = Some(std::time::Duration::from_secs(3600));
    let options = || -> StoreOptions {
        common::options()
            .checkpoints(checkpoints)
            .cleaner(cleaner)
            .checkpoint_interval(hour)
            .clean_interval(hour)
            .restart(restart)
            .recover_in_background(background)
    };
    let dir = tempfile::tempdir().unwrap();
    let mut committed: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    let mut ops = ops.into_iter().peekable();
    while ops.peek().is_some() {
        let store = Store::open(dir.path(), options()).unwrap();
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
                    Op::Update { key: k, fill } => {
                        let want = grown(
                            visible(&committed, &pending)
                                .get(&key(k))
                                .map(Vec::as_slice),
                            fill,
                        );
                        let got = t.update(&key(k), |old| grown(old, fill)).unwrap();
                        prop_assert_eq!(&got, &want);
                        pending.insert(key(k), want);
                    }
                    Op::Get { key: k } => {
                        let got = t.get(&key(k)).unwrap();
                        prop_assert_eq!(got, visible(&committed, &pending).get(&key(k)).cloned());
                    }
                    Op::Scan { from, to } => {
                        let (from, to) = (key(from.min(to)), key(from.max(to)));
                        let got = t
                            .scan(Bound::Included(&from[..]), Bound::Excluded(&to[..]))
                            .collect::<Result<Vec<_>, _>>()
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
                    Op::Checkpoint => {
                        store.checkpoint().unwrap();
                    }
                    Op::Clean => {
                        store.clean().unwrap();
                    }
                }
            }
            // A crash, or the end of the run (also a crash: nothing is closed).
            common::crash(txn.take());
        }
        drop(store);
    }
    let store = Store::open(dir.path(), options()).unwrap();
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
        ops in proptest::collection::vec(op(), 1..400),
        checkpoints in prop_oneof![Just(CheckpointKind::Classical), Just(CheckpointKind::Decoupled)],
        cleaner in prop_oneof![Just(CleanerKind::Classical), Just(CleanerKind::Decoupled)],
        restart in prop_oneof![Just(RestartMode::Classical), Just(RestartMode::Instant)],
        background in any::<bool>(),
    ) {
        run_with(ops, checkpoints, cleaner, restart, background)?;
    }
}

/// The workloads above are big enough to split internal nodes and to evict dirty pages of
/// running transactions; this pins that, so the property test cannot silently stop covering it.
#[test]
fn a_workload_of_this_size_splits_internal_nodes_and_steals() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), common::options()).unwrap();
    let mut txn = store.begin();
    // In a scrambled order, as the property test's keys come: keys in ascending order would
    // fill each leaf before starting the next (the append split), with fewer splits.
    for i in 0..300u16 {
        txn.put(&key(i * 151 % 300), &[7u8; 300]).unwrap();
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
    let copy = common::copy_store(dir.path());
    let options = common::options().restart(RestartMode::Classical);
    let store = Store::open(dir.path(), options).unwrap();
    assert_eq!(common::contents(&store).len(), 300);
    assert!(store.restart_report().redo_applied > 0);
    // Instant: nothing redone at open, every page left pending is redone when read.
    let options = common::options()
        .restart(RestartMode::Instant)
        .recover_in_background(false);
    let store = Store::open(copy.path(), options).unwrap();
    let report = store.restart_report().clone();
    assert_eq!(report.redo_applied, 0);
    assert!(report.pending_pages > 8, "{report:?}");
    assert_eq!(common::contents(&store).len(), 300);
    assert_eq!(
        store.pool_stats().redone_on_read,
        report.pending_pages,
        "a full scan reads every page"
    );
    assert!(store.recovery_pending().is_done());
}

/// The case the property test above recorded (shrunk) before it was fixed; see the commit that
/// adds this test for the bug it pins. Kept as plain code so that a change to the strategies,
/// which changes what a recorded seed generates, does not silently drop it.
#[test]
fn recorded_case_with_crashes_between_transactions() {
    run(vec![
        Op::Put {
            key: 227,
            len: 199,
            fill: 113,
        },
        Op::Put {
            key: 22,
            len: 145,
            fill: 94,
        },
        Op::Put {
            key: 185,
            len: 470,
            fill: 84,
        },
        Op::Put {
            key: 163,
            len: 230,
            fill: 97,
        },
        Op::Put {
            key: 16,
            len: 476,
            fill: 106,
        },
        Op::Put {
            key: 31,
            len: 324,
            fill: 146,
        },
        Op::Commit,
        Op::Put {
            key: 229,
            len: 201,
            fill: 239,
        },
        Op::Put {
            key: 68,
            len: 535,
            fill: 221,
        },
        Op::Commit,
        Op::Put {
            key: 25,
            len: 173,
            fill: 193,
        },
        Op::Put {
            key: 146,
            len: 563,
            fill: 10,
        },
        Op::Put {
            key: 100,
            len: 556,
            fill: 212,
        },
        Op::Commit,
        Op::Put {
            key: 108,
            len: 357,
            fill: 95,
        },
        Op::Put {
            key: 234,
            len: 374,
            fill: 176,
        },
        Op::Commit,
        Op::Put {
            key: 213,
            len: 203,
            fill: 99,
        },
        Op::Put {
            key: 198,
            len: 469,
            fill: 100,
        },
        Op::Put {
            key: 203,
            len: 43,
            fill: 23,
        },
        Op::Put {
            key: 243,
            len: 533,
            fill: 122,
        },
        Op::Commit,
        Op::Put {
            key: 219,
            len: 273,
            fill: 236,
        },
        Op::Put {
            key: 297,
            len: 194,
            fill: 137,
        },
        Op::Put {
            key: 166,
            len: 414,
            fill: 188,
        },
        Op::Commit,
        Op::Put {
            key: 250,
            len: 212,
            fill: 8,
        },
        Op::Put {
            key: 179,
            len: 331,
            fill: 32,
        },
        Op::Delete { key: 299 },
        Op::Put {
            key: 212,
            len: 273,
            fill: 81,
        },
        Op::Scan { from: 238, to: 108 },
        Op::Put {
            key: 251,
            len: 582,
            fill: 252,
        },
        Op::Put {
            key: 51,
            len: 262,
            fill: 158,
        },
        Op::Put {
            key: 95,
            len: 463,
            fill: 108,
        },
        Op::Put {
            key: 205,
            len: 502,
            fill: 158,
        },
        Op::Put {
            key: 71,
            len: 187,
            fill: 84,
        },
        Op::Put {
            key: 76,
            len: 296,
            fill: 86,
        },
        Op::Put {
            key: 105,
            len: 486,
            fill: 109,
        },
        Op::Scan { from: 177, to: 240 },
        Op::Delete { key: 298 },
        Op::Delete { key: 56 },
        Op::Get { key: 279 },
        Op::Put {
            key: 221,
            len: 0,
            fill: 38,
        },
        Op::Put {
            key: 25,
            len: 103,
            fill: 27,
        },
        Op::Delete { key: 283 },
        Op::Delete { key: 182 },
        Op::Delete { key: 264 },
        Op::Abort,
        Op::Delete { key: 38 },
        Op::Get { key: 58 },
        Op::Get { key: 23 },
        Op::Put {
            key: 185,
            len: 134,
            fill: 246,
        },
        Op::Put {
            key: 17,
            len: 463,
            fill: 163,
        },
        Op::Put {
            key: 88,
            len: 370,
            fill: 165,
        },
        Op::Put {
            key: 158,
            len: 531,
            fill: 32,
        },
        Op::Get { key: 180 },
        Op::Put {
            key: 272,
            len: 395,
            fill: 25,
        },
        Op::Get { key: 143 },
        Op::Put {
            key: 118,
            len: 274,
            fill: 22,
        },
        Op::Put {
            key: 60,
            len: 358,
            fill: 19,
        },
        Op::Abort,
        Op::Abort,
        Op::Get { key: 93 },
        Op::Abort,
        Op::Abort,
        Op::Scan { from: 258, to: 130 },
        Op::Put {
            key: 244,
            len: 144,
            fill: 128,
        },
        Op::Get { key: 146 },
        Op::Put {
            key: 8,
            len: 442,
            fill: 55,
        },
        Op::Crash,
        Op::Crash,
        Op::Delete { key: 123 },
        Op::Put {
            key: 283,
            len: 120,
            fill: 93,
        },
        Op::Put {
            key: 45,
            len: 11,
            fill: 9,
        },
        Op::Put {
            key: 80,
            len: 185,
            fill: 182,
        },
        Op::Put {
            key: 121,
            len: 570,
            fill: 123,
        },
        Op::Delete { key: 24 },
        Op::Get { key: 232 },
        Op::Delete { key: 178 },
        Op::Put {
            key: 200,
            len: 264,
            fill: 49,
        },
        Op::Commit,
        Op::Get { key: 70 },
        Op::Put {
            key: 118,
            len: 574,
            fill: 175,
        },
        Op::Delete { key: 208 },
        Op::Get { key: 281 },
        Op::Put {
            key: 141,
            len: 90,
            fill: 191,
        },
        Op::Delete { key: 202 },
        Op::Put {
            key: 222,
            len: 275,
            fill: 69,
        },
        Op::Put {
            key: 164,
            len: 412,
            fill: 217,
        },
        Op::Put {
            key: 36,
            len: 61,
            fill: 78,
        },
        Op::Get { key: 206 },
        Op::Scan { from: 122, to: 132 },
        Op::Put {
            key: 80,
            len: 335,
            fill: 100,
        },
        Op::Delete { key: 280 },
        Op::Scan { from: 0, to: 288 },
        Op::Put {
            key: 263,
            len: 216,
            fill: 3,
        },
        Op::Scan { from: 28, to: 189 },
        Op::Commit,
        Op::Put {
            key: 193,
            len: 419,
            fill: 118,
        },
        Op::Get { key: 242 },
        Op::Put {
            key: 273,
            len: 31,
            fill: 30,
        },
        Op::Delete { key: 205 },
        Op::Put {
            key: 122,
            len: 441,
            fill: 164,
        },
        Op::Put {
            key: 71,
            len: 305,
            fill: 32,
        },
        Op::Put {
            key: 48,
            len: 188,
            fill: 139,
        },
        Op::Get { key: 263 },
        Op::Delete { key: 137 },
        Op::Put {
            key: 244,
            len: 193,
            fill: 46,
        },
        Op::Commit,
        Op::Commit,
        Op::Commit,
        Op::Delete { key: 1 },
        Op::Put {
            key: 224,
            len: 125,
            fill: 213,
        },
        Op::Put {
            key: 1,
            len: 457,
            fill: 192,
        },
        Op::Delete { key: 171 },
        Op::Put {
            key: 91,
            len: 412,
            fill: 74,
        },
        Op::Commit,
        Op::Put {
            key: 268,
            len: 185,
            fill: 250,
        },
        Op::Scan { from: 75, to: 174 },
        Op::Get { key: 132 },
        Op::Put {
            key: 141,
            len: 521,
            fill: 149,
        },
        Op::Delete { key: 277 },
        Op::Crash,
        Op::Get { key: 181 },
        Op::Scan { from: 291, to: 229 },
        Op::Put {
            key: 10,
            len: 95,
            fill: 67,
        },
        Op::Delete { key: 297 },
        Op::Abort,
        Op::Delete { key: 188 },
        Op::Get { key: 4 },
        Op::Commit,
        Op::Put {
            key: 271,
            len: 287,
            fill: 227,
        },
        Op::Put {
            key: 295,
            len: 27,
            fill: 247,
        },
        Op::Put {
            key: 7,
            len: 125,
            fill: 91,
        },
        Op::Put {
            key: 127,
            len: 480,
            fill: 59,
        },
        Op::Commit,
        Op::Put {
            key: 250,
            len: 533,
            fill: 113,
        },
        Op::Delete { key: 39 },
        Op::Put {
            key: 74,
            len: 144,
            fill: 201,
        },
        Op::Put {
            key: 65,
            len: 597,
            fill: 112,
        },
        Op::Put {
            key: 19,
            len: 463,
            fill: 201,
        },
        Op::Put {
            key: 298,
            len: 233,
            fill: 30,
        },
        Op::Commit,
        Op::Put {
            key: 272,
            len: 177,
            fill: 151,
        },
        Op::Commit,
        Op::Abort,
        Op::Commit,
        Op::Crash,
        Op::Scan { from: 83, to: 195 },
        Op::Abort,
        Op::Put {
            key: 142,
            len: 579,
            fill: 98,
        },
        Op::Put {
            key: 57,
            len: 529,
            fill: 109,
        },
        Op::Put {
            key: 176,
            len: 297,
            fill: 148,
        },
        Op::Delete { key: 164 },
        Op::Put {
            key: 289,
            len: 331,
            fill: 16,
        },
        Op::Get { key: 268 },
        Op::Delete { key: 159 },
        Op::Put {
            key: 117,
            len: 391,
            fill: 64,
        },
        Op::Delete { key: 53 },
        Op::Get { key: 85 },
        Op::Put {
            key: 235,
            len: 345,
            fill: 14,
        },
        Op::Delete { key: 205 },
        Op::Put {
            key: 36,
            len: 395,
            fill: 178,
        },
        Op::Commit,
        Op::Commit,
        Op::Delete { key: 66 },
        Op::Put {
            key: 107,
            len: 163,
            fill: 158,
        },
        Op::Put {
            key: 145,
            len: 536,
            fill: 91,
        },
        Op::Delete { key: 146 },
        Op::Commit,
        Op::Put {
            key: 34,
            len: 41,
            fill: 182,
        },
        Op::Get { key: 201 },
        Op::Delete { key: 53 },
        Op::Put {
            key: 166,
            len: 595,
            fill: 161,
        },
        Op::Put {
            key: 55,
            len: 17,
            fill: 96,
        },
        Op::Commit,
        Op::Delete { key: 196 },
        Op::Put {
            key: 137,
            len: 447,
            fill: 178,
        },
        Op::Delete { key: 26 },
        Op::Put {
            key: 171,
            len: 532,
            fill: 160,
        },
        Op::Abort,
        Op::Commit,
        Op::Put {
            key: 268,
            len: 222,
            fill: 232,
        },
        Op::Put {
            key: 5,
            len: 469,
            fill: 162,
        },
        Op::Delete { key: 136 },
        Op::Get { key: 150 },
        Op::Put {
            key: 173,
            len: 376,
            fill: 209,
        },
        Op::Put {
            key: 111,
            len: 172,
            fill: 161,
        },
        Op::Delete { key: 290 },
        Op::Commit,
        Op::Get { key: 123 },
        Op::Get { key: 80 },
        Op::Abort,
        Op::Put {
            key: 61,
            len: 297,
            fill: 95,
        },
        Op::Put {
            key: 255,
            len: 14,
            fill: 217,
        },
        Op::Delete { key: 242 },
        Op::Delete { key: 173 },
        Op::Put {
            key: 194,
            len: 180,
            fill: 154,
        },
        Op::Crash,
        Op::Commit,
        Op::Scan { from: 169, to: 87 },
        Op::Commit,
        Op::Put {
            key: 130,
            len: 575,
            fill: 208,
        },
        Op::Put {
            key: 54,
            len: 40,
            fill: 32,
        },
        Op::Get { key: 62 },
        Op::Commit,
        Op::Abort,
        Op::Put {
            key: 190,
            len: 485,
            fill: 43,
        },
        Op::Get { key: 104 },
        Op::Get { key: 183 },
        Op::Crash,
        Op::Put {
            key: 271,
            len: 116,
            fill: 169,
        },
        Op::Scan { from: 152, to: 0 },
        Op::Put {
            key: 4,
            len: 287,
            fill: 241,
        },
        Op::Delete { key: 288 },
    ])
    .unwrap();
}
