//! Checks (or, with `STELA_WRITE_SEEDS=1`, rewrites) the seeds of the stela-store targets in
//! `fuzz/seeds/store_record_decode/`, `store_page_decode/` and `store_archive_run/`: one record
//! of every kind, a leaf and an internal page, and a run of a few pages' histories, all made
//! by the store's own encoders. Without them `store_archive_run` stays shallow: random bytes
//! almost never make a run whose checksums hold.
//!
//! `cargo test` inside `fuzz/` (with `RUSTC_BOOTSTRAP=1`, like every command here).

use stela_format::Lsn;
use stela_store::format::page::{self, Internal, Leaf, Node, Page};
use stela_store::format::{encode_run, ActiveTxn, Entry, PageImage, RunRange, SYSTEM_TXN};
use stela_store::{
    CheckpointKind, CheckpointTables, DirtyPage, LogBody, LogRecord, TableChanges,
};

fn leaf(entries: &[(&str, &str)]) -> Node {
    let mut leaf = Leaf::default();
    for (key, value) in entries {
        leaf.set(key.as_bytes(), Some(value.as_bytes()));
    }
    Node::Leaf(leaf)
}

fn internal() -> Node {
    Node::Internal(Internal {
        keys: vec![b"k".to_vec(), b"t".to_vec()],
        children: vec![1, 2, 3],
    })
}

fn write(txn: u64, prev: u64, page: u64, key: &str, after: Option<&str>) -> LogRecord {
    LogRecord {
        txn,
        prev_txn_lsn: Lsn::new(prev),
        body: LogBody::Write {
            page,
            prev_page_lsn: Lsn::new(prev.saturating_sub(1)),
            key: key.as_bytes().to_vec(),
            before: Some(b"old".to_vec()),
            after: after.map(|v| v.as_bytes().to_vec()),
        },
    }
}

fn records() -> Vec<(&'static str, LogRecord)> {
    let system = |body| LogRecord {
        txn: SYSTEM_TXN,
        prev_txn_lsn: Lsn::ZERO,
        body,
    };
    vec![
        ("write", write(3, 0, 2, "account-17", Some("balance=100"))),
        ("write-delete", write(3, 4, 2, "account-17", None)),
        (
            "compensate",
            LogRecord {
                txn: 3,
                prev_txn_lsn: Lsn::new(5),
                body: LogBody::Compensate {
                    page: 2,
                    prev_page_lsn: Lsn::new(5),
                    key: b"account-17".to_vec(),
                    value: Some(b"old".to_vec()),
                    undo_next: Lsn::new(4),
                },
            },
        ),
        (
            "structure",
            LogRecord {
                txn: SYSTEM_TXN,
                prev_txn_lsn: Lsn::ZERO,
                body: LogBody::Structure {
                    pages: vec![
                        PageImage {
                            page: 0,
                            prev_page_lsn: Lsn::new(1),
                            node: internal(),
                        },
                        PageImage {
                            page: 2,
                            prev_page_lsn: Lsn::new(6),
                            node: leaf(&[("a", "1"), ("b", "2")]),
                        },
                    ],
                },
            },
        ),
        (
            "commit",
            LogRecord {
                txn: 3,
                prev_txn_lsn: Lsn::new(7),
                body: LogBody::Commit,
            },
        ),
        (
            "aborted",
            LogRecord {
                txn: 4,
                prev_txn_lsn: Lsn::new(8),
                body: LogBody::Aborted,
            },
        ),
        (
            "pages-written",
            system(LogBody::PagesWritten {
                pages: vec![(2, Lsn::new(7)), (9, Lsn::new(3))],
            }),
        ),
        ("checkpoint-begin", system(LogBody::CheckpointBegin)),
        (
            "checkpoint-end",
            system(LogBody::CheckpointEnd {
                begin: Lsn::new(10),
                kind: CheckpointKind::Decoupled,
                tables: CheckpointTables {
                    dirty_pages: vec![DirtyPage {
                        page: 2,
                        rec_lsn: Lsn::new(4),
                        page_lsn: Lsn::new(7),
                    }],
                    active: vec![ActiveTxn {
                        txn: 4,
                        last_lsn: Lsn::new(8),
                        locks: vec![b"account-3".to_vec()],
                    }],
                    next_page: 10,
                    max_txn: 4,
                },
            }),
        ),
        (
            "checkpoint-delta",
            system(LogBody::CheckpointDelta {
                begin: Lsn::new(20),
                base: Lsn::new(15),
                root: Lsn::new(11),
                changes: TableChanges {
                    dirty_pages: vec![DirtyPage {
                        page: 3,
                        rec_lsn: Lsn::new(16),
                        page_lsn: Lsn::new(18),
                    }],
                    cleaned: vec![2],
                    active: vec![ActiveTxn {
                        txn: 5,
                        last_lsn: Lsn::new(19),
                        locks: vec![b"account-4".to_vec()],
                    }],
                    next_page: 10,
                    max_txn: 5,
                },
            }),
        ),
    ]
}

/// A page image without its trailing zeros (the target pads its input to a page).
fn image(id: u64, node: Node) -> Vec<u8> {
    let bytes = page::encode(
        id,
        &Page {
            lsn: Lsn::new(42),
            node,
        },
    )
    .expect("a seed page encodes");
    let end = bytes.iter().rposition(|&b| b != 0).map_or(0, |at| at + 1);
    bytes[..end].to_vec()
}

fn seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    let mut seeds = Vec::new();
    for (name, record) in records() {
        record
            .validate()
            .expect("a seed is a record the store could write");
        seeds.push(("store_record_decode", name.to_owned(), record.encode()));
    }
    // The target decodes its input as page 7.
    seeds.push((
        "store_page_decode",
        "leaf".to_owned(),
        image(
            7,
            leaf(&[("a", "1"), ("account-17", "balance=100"), ("z", "")]),
        ),
    ));
    seeds.push((
        "store_page_decode",
        "internal".to_owned(),
        image(7, internal()),
    ));
    // Every record under each page it touches, at LSNs 1, 2, ... in order.
    let records = records();
    let range = RunRange {
        first: Lsn::new(1),
        last: Lsn::new(records.len() as u64),
    };
    let entries: Vec<Entry> = records
        .into_iter()
        .enumerate()
        .flat_map(|(at, (_, record))| {
            let lsn = Lsn::new(at as u64 + 1);
            let pages: Vec<_> = record.pages().map(|(page, _)| page).collect();
            pages.into_iter().map(move |page| Entry {
                page,
                lsn,
                record: record.clone(),
            })
        })
        .collect();
    seeds.push((
        "store_archive_run",
        "run".to_owned(),
        encode_run(range, entries).expect("a seed run encodes"),
    ));
    seeds
}

#[test]
fn store_seeds_are_the_encoders_output() {
    let total = stela_fuzz::check_or_write_seeds(seeds());
    assert!(total < 16 << 10, "the store seeds are {total} bytes");
}
