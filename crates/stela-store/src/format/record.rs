//! Log records: what the store writes to its log, as serde types. Pure, no I/O.
//!
//! This module owns the record types and their validation. Every record that changes a page
//! names the page and the LSN of the previous record that changed the same page (the per-page
//! chain: followed backwards it yields the page's whole history, which single-page recovery and,
//! later, on-demand redo use). Every record of a transaction names the transaction's previous
//! record (the per-transaction chain that undo walks). A record read back from the log is
//! checked by [`LogRecord::validate`] before restart acts on it, so a record that decodes but
//! could not have been written (an oversized key, a node larger than a page) is a clear error.

use crate::format::page::{Node, PageError, PageId, MAX_KEY, MAX_VALUE};
use serde::{Deserialize, Serialize};
use stela_format::{Codec, Lsn};

/// Identifies a transaction. 0 is the system: structure changes belong to no transaction.
pub type TxnId = u64;

/// The transaction id of records that belong to none (structure changes).
pub const SYSTEM_TXN: TxnId = 0;

/// One record of the store's log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogRecord {
    pub txn: TxnId,
    /// The previous record of `txn` ([`Lsn::ZERO`] for its first, and for system records).
    pub prev_txn_lsn: Lsn,
    pub body: LogBody,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LogBody {
    /// A transaction set `key` on leaf `page` from `before` to `after` (`None`: absent).
    /// Redo is physiological: set `after` on that page. Undo is logical: the key may have moved
    /// to another leaf by a split since, so undo finds it from the root and restores `before`.
    Write {
        page: PageId,
        prev_page_lsn: Lsn,
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        #[serde(with = "serde_bytes")]
        before: Option<Vec<u8>>,
        #[serde(with = "serde_bytes")]
        after: Option<Vec<u8>>,
    },
    /// Undo of a `Write`, logged as it is done (a compensation record): redo-only, and its
    /// `undo_next` is the `prev_txn_lsn` of the write it undid, so a rollback interrupted by a
    /// crash resumes after it instead of undoing anything twice.
    Compensate {
        page: PageId,
        prev_page_lsn: Lsn,
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        #[serde(with = "serde_bytes")]
        value: Option<Vec<u8>>,
        undo_next: Lsn,
    },
    /// A structure change (a split), atomic because it is one record: the new image of every
    /// page it touched. Redo-only and never undone, even if the transaction whose insert caused
    /// it aborts: the tree stays valid either way.
    Structure { pages: Vec<PageImage> },
    /// The transaction committed.
    Commit,
    /// The transaction's rollback is complete: every write has its compensation in the log.
    Aborted,
    /// These page images reached the page file and the file was synced afterwards: each image
    /// holds every change of its page up to the LSN given. Logged only after the sync, so a
    /// durable record of this kind is always true; log analysis (a decoupled checkpoint, and
    /// restart) uses it to learn that a page became clean without asking the buffer pool.
    PagesWritten { pages: Vec<(PageId, Lsn)> },
    /// A checkpoint starts here. Its tables describe the state at this record (decoupled) or at
    /// some moment between this record and its end (classical, fuzzy); either way, analysis
    /// from this record on with the tables as its start gives the state at the end of the log.
    CheckpointBegin,
    /// A checkpoint is complete: the tables for the begin record at `begin`.
    CheckpointEnd {
        begin: Lsn,
        kind: CheckpointKind,
        tables: CheckpointTables,
    },
    /// A decoupled checkpoint is complete, its tables for the begin record at `begin` given as
    /// what changed since an earlier checkpoint's: `base` is the LSN of that checkpoint's end
    /// record (itself a delta or a `CheckpointEnd`), and `root` the end record of the
    /// `CheckpointEnd` the chain of bases leads back to. The tables are those of `root` with
    /// every delta of the chain applied in LSN order. Checkpoints taken every millisecond
    /// change a few dozen of a dirty-page table's thousands of entries; logging the whole
    /// table each time multiplied the log's volume.
    CheckpointDelta {
        begin: Lsn,
        base: Lsn,
        root: Lsn,
        changes: TableChanges,
    },
}

/// How a checkpoint's tables were obtained.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CheckpointKind {
    /// Copied from the buffer pool, the transaction table and the lock table under their
    /// latches.
    Classical,
    /// Computed by analysing the log from the previous checkpoint to the begin record.
    Decoupled,
}

/// What restart needs to know about the state at a checkpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointTables {
    /// Pages whose stored image may lack changes, ascending by page id.
    pub dirty_pages: Vec<DirtyPage>,
    /// Transactions that had written and not ended, ascending by id.
    pub active: Vec<ActiveTxn>,
    /// Above every page id in use.
    pub next_page: PageId,
    /// The largest transaction id used so far.
    pub max_txn: TxnId,
}

/// How a checkpoint's tables differ from an earlier checkpoint's. The transaction table, which
/// holds only the transactions running at the checkpoint, is given whole.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableChanges {
    /// Entries new in the dirty-page table or changed, ascending by page id.
    pub dirty_pages: Vec<DirtyPage>,
    /// Pages that left the dirty-page table (their images became current), ascending.
    pub cleaned: Vec<PageId>,
    /// The whole transaction table, as in [`CheckpointTables::active`].
    pub active: Vec<ActiveTxn>,
    pub next_page: PageId,
    pub max_txn: TxnId,
}

impl TableChanges {
    /// Dirty-page entries the delta names, new, changed or cleaned: its size.
    pub fn entries(&self) -> usize {
        self.dirty_pages.len() + self.cleaned.len()
    }
}

impl CheckpointTables {
    /// What changed from `base` to `self`. Both dirty-page tables must be ascending by page id
    /// (as checkpoints write them).
    pub fn changes_since(&self, base: &CheckpointTables) -> TableChanges {
        let mut changes = TableChanges {
            active: self.active.clone(),
            next_page: self.next_page,
            max_txn: self.max_txn,
            ..TableChanges::default()
        };
        let (mut old, mut new) = (base.dirty_pages.iter().peekable(), self.dirty_pages.iter());
        for entry in new.by_ref() {
            while let Some(gone) = old.next_if(|o| o.page < entry.page) {
                changes.cleaned.push(gone.page);
            }
            match old.next_if(|o| o.page == entry.page) {
                Some(same) if same == entry => {}
                _ => changes.dirty_pages.push(*entry),
            }
        }
        changes.cleaned.extend(old.map(|gone| gone.page));
        changes
    }

    /// Applies `changes` (validated: both lists strictly ascending, no page in both), giving
    /// the tables of the checkpoint that logged them.
    pub fn apply(&mut self, changes: &TableChanges) {
        let old = std::mem::take(&mut self.dirty_pages);
        let mut merged = Vec::with_capacity(old.len() + changes.dirty_pages.len());
        let mut cleaned = changes.cleaned.iter().peekable();
        let mut changed = changes.dirty_pages.iter().peekable();
        for entry in old {
            while let Some(new) = changed.next_if(|c| c.page < entry.page) {
                merged.push(*new);
            }
            while cleaned.next_if(|&&page| page < entry.page).is_some() {}
            if cleaned.next_if(|&&page| page == entry.page).is_some() {
                continue;
            }
            match changed.next_if(|c| c.page == entry.page) {
                Some(new) => merged.push(*new),
                None => merged.push(entry),
            }
        }
        merged.extend(changed.copied());
        self.dirty_pages = merged;
        self.active = changes.active.clone();
        self.next_page = changes.next_page;
        self.max_txn = changes.max_txn;
    }
}

/// One entry of a dirty-page table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirtyPage {
    pub page: PageId,
    /// The oldest change the stored image may lack (redo starts there).
    pub rec_lsn: Lsn,
    /// The newest change of the page known (the page LSN in the pool).
    pub page_lsn: Lsn,
}

/// One entry of a transaction table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActiveTxn {
    pub txn: TxnId,
    /// Its last record: where undo starts.
    pub last_lsn: Lsn,
    /// The keys it holds exclusively (what it wrote), ascending.
    #[serde(with = "crate::format::page::byte_strings")]
    pub locks: Vec<Vec<u8>>,
}

/// One page of a [`LogBody::Structure`] record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PageImage {
    pub page: PageId,
    pub prev_page_lsn: Lsn,
    pub node: Node,
}

/// A record that could not have been written by the store.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("does not decode: {0}")]
    Decode(String),
    #[error("{0}")]
    Invalid(&'static str),
    #[error("page {page}: {source}")]
    BadImage { page: PageId, source: PageError },
}

/// The codec the store's records are written with.
pub const CODEC: Codec = Codec::MessagePack;

impl LogRecord {
    /// Decodes one record payload as the embedded log writes it, then validates it.
    ///
    /// # Errors
    /// [`RecordError`]; never panics, whatever the bytes.
    pub fn decode(payload: &[u8]) -> Result<LogRecord, RecordError> {
        let record: LogRecord = CODEC
            .decode(payload)
            .map_err(|e| RecordError::Decode(e.to_string()))?;
        record.validate()?;
        Ok(record)
    }

    /// Encodes the record as the embedded log writes it.
    pub fn encode(&self) -> Vec<u8> {
        CODEC
            .encode(self)
            .expect("MessagePack encodes every LogRecord")
    }

    /// Checks the rules every record the store writes keeps.
    ///
    /// # Errors
    /// [`RecordError::Invalid`] or [`RecordError::BadImage`] naming the broken rule.
    pub fn validate(&self) -> Result<(), RecordError> {
        let system = self.txn == SYSTEM_TXN;
        match &self.body {
            LogBody::Write {
                key, before, after, ..
            } => {
                check_entry(key, before.as_deref())?;
                check_entry(key, after.as_deref())?;
                if system {
                    return Err(RecordError::Invalid("a write without a transaction"));
                }
            }
            LogBody::Compensate {
                key,
                value,
                undo_next,
                ..
            } => {
                check_entry(key, value.as_deref())?;
                if system {
                    return Err(RecordError::Invalid("a compensation without a transaction"));
                }
                if *undo_next >= self.prev_txn_lsn && *undo_next != Lsn::ZERO {
                    return Err(RecordError::Invalid(
                        "a compensation's undo_next is not before the record it follows",
                    ));
                }
            }
            LogBody::Structure { pages } => {
                if !system || self.prev_txn_lsn != Lsn::ZERO {
                    return Err(RecordError::Invalid(
                        "a structure change inside a transaction",
                    ));
                }
                check_structure(pages)?;
            }
            LogBody::Commit | LogBody::Aborted => {
                if system {
                    return Err(RecordError::Invalid("an end of no transaction"));
                }
            }
            LogBody::PagesWritten { .. } | LogBody::CheckpointBegin => {
                if !system || self.prev_txn_lsn != Lsn::ZERO {
                    return Err(RecordError::Invalid("a system record inside a transaction"));
                }
            }
            LogBody::CheckpointEnd { tables, .. } => {
                if !system || self.prev_txn_lsn != Lsn::ZERO {
                    return Err(RecordError::Invalid("a system record inside a transaction"));
                }
                check_active(&tables.active)?;
            }
            LogBody::CheckpointDelta {
                begin,
                base,
                root,
                changes,
            } => {
                if !system || self.prev_txn_lsn != Lsn::ZERO {
                    return Err(RecordError::Invalid("a system record inside a transaction"));
                }
                check_delta(*begin, *base, *root, changes)?;
            }
        }
        Ok(())
    }

    /// The pages this record changes, each with the previous LSN of that page. An iterator,
    /// not a `Vec`: every record the cleaner, the archiver and log analysis read passes here,
    /// and an allocation each cost more than the rest of the call.
    pub fn pages(&self) -> impl Iterator<Item = (PageId, Lsn)> + Clone + '_ {
        let (single, images): (Option<(PageId, Lsn)>, &[PageImage]) = match &self.body {
            LogBody::Write {
                page,
                prev_page_lsn,
                ..
            }
            | LogBody::Compensate {
                page,
                prev_page_lsn,
                ..
            } => (Some((*page, *prev_page_lsn)), &[]),
            LogBody::Structure { pages } => (None, pages),
            LogBody::Commit
            | LogBody::Aborted
            | LogBody::PagesWritten { .. }
            | LogBody::CheckpointBegin
            | LogBody::CheckpointEnd { .. }
            | LogBody::CheckpointDelta { .. } => (None, &[]),
        };
        single
            .into_iter()
            .chain(images.iter().map(|image| (image.page, image.prev_page_lsn)))
    }
}

/// The rules of a structure change's page images: at least one, no page twice, each a valid
/// node, no internal node its own child.
fn check_structure(pages: &[PageImage]) -> Result<(), RecordError> {
    if pages.is_empty() {
        return Err(RecordError::Invalid("a structure change of no page"));
    }
    for (i, image) in pages.iter().enumerate() {
        if pages[..i].iter().any(|other| other.page == image.page) {
            return Err(RecordError::Invalid("a page twice in one structure change"));
        }
        image
            .node
            .validate()
            .map_err(|source| RecordError::BadImage {
                page: image.page,
                source,
            })?;
        if let Node::Internal(internal) = &image.node {
            if internal.children.contains(&image.page) {
                return Err(RecordError::Invalid("a page is its own child"));
            }
        }
    }
    Ok(())
}

/// The rules of a checkpoint delta: its base between its root and its begin, its page lists
/// strictly ascending, no page both changed and cleaned.
fn check_delta(
    begin: Lsn,
    base: Lsn,
    root: Lsn,
    changes: &TableChanges,
) -> Result<(), RecordError> {
    if !(root <= base && base < begin) {
        return Err(RecordError::Invalid(
            "a checkpoint delta whose base is not between its root and its begin",
        ));
    }
    check_active(&changes.active)?;
    let ascending = |pages: &[PageId]| pages.windows(2).all(|w| w[0] < w[1]);
    let changed: Vec<PageId> = changes.dirty_pages.iter().map(|d| d.page).collect();
    if !ascending(&changed) || !ascending(&changes.cleaned) {
        return Err(RecordError::Invalid(
            "a checkpoint delta whose pages are not strictly ascending",
        ));
    }
    if changed
        .iter()
        .any(|page| changes.cleaned.binary_search(page).is_ok())
    {
        return Err(RecordError::Invalid(
            "a checkpoint delta that both changes and cleans a page",
        ));
    }
    Ok(())
}

/// The transaction table of a checkpoint: no system entry, no lock on an oversized key.
fn check_active(active: &[ActiveTxn]) -> Result<(), RecordError> {
    if active.iter().any(|t| t.txn == SYSTEM_TXN) {
        return Err(RecordError::Invalid("the system as an active transaction"));
    }
    for txn in active {
        if txn.locks.iter().any(|k| k.len() > MAX_KEY) {
            return Err(RecordError::Invalid("a lock on a key larger than MAX_KEY"));
        }
    }
    Ok(())
}

fn check_entry(key: &[u8], value: Option<&[u8]>) -> Result<(), RecordError> {
    if key.len() > MAX_KEY {
        return Err(RecordError::Invalid("a key larger than MAX_KEY"));
    }
    if value.is_some_and(|v| v.len() > MAX_VALUE) {
        return Err(RecordError::Invalid("a value larger than MAX_VALUE"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::page::Leaf;

    /// A write of transaction 3 (after its record 5) on page 2 (after its record 4).
    fn write_record(key: &[u8], before: Option<&[u8]>, after: Option<&[u8]>) -> LogRecord {
        LogRecord {
            txn: 3,
            prev_txn_lsn: Lsn::new(5),
            body: LogBody::Write {
                page: 2,
                prev_page_lsn: Lsn::new(4),
                key: key.to_vec(),
                before: before.map(<[u8]>::to_vec),
                after: after.map(<[u8]>::to_vec),
            },
        }
    }

    /// Keys, values and images are MessagePack `bin` strings: the bytes as they are, not one
    /// integer each (up to two bytes per byte, and an encoder call each, before). A record
    /// written the old way still decodes, so a log from before reads back.
    #[test]
    fn byte_strings_are_bins_and_records_with_integer_arrays_still_decode() {
        let value = vec![0xFF; 100];
        let write = write_record(b"key", Some(&value), Some(&value));
        let encoded = write.encode();
        assert!(encoded.len() < 2 * 100 + 40, "{} bytes", encoded.len());
        assert!(
            encoded.windows(100).any(|w| w == &value[..]),
            "the value verbatim"
        );

        // The same record as serde's default writes byte vectors: arrays of integers.
        #[derive(Serialize)]
        struct OldRecord {
            txn: TxnId,
            prev_txn_lsn: Lsn,
            body: OldBody,
        }
        #[derive(Serialize)]
        enum OldBody {
            Write {
                page: PageId,
                prev_page_lsn: Lsn,
                key: Vec<u8>,
                before: Option<Vec<u8>>,
                after: Option<Vec<u8>>,
            },
        }
        let old = OldRecord {
            txn: 3,
            prev_txn_lsn: Lsn::new(5),
            body: OldBody::Write {
                page: 2,
                prev_page_lsn: Lsn::new(4),
                key: b"key".to_vec(),
                before: Some(value.clone()),
                after: Some(value),
            },
        };
        let old = CODEC.encode(&old).unwrap();
        assert!(old.len() > 2 * 200, "integers: {} bytes", old.len());
        assert_eq!(LogRecord::decode(&old).unwrap(), write);
    }

    #[test]
    fn records_round_trip_and_impossible_ones_are_refused() {
        let write = write_record(b"k", None, Some(b"v"));
        assert_eq!(LogRecord::decode(&write.encode()).unwrap(), write);

        let huge = LogRecord {
            body: LogBody::Write {
                page: 2,
                prev_page_lsn: Lsn::ZERO,
                key: vec![0; MAX_KEY + 1],
                before: None,
                after: None,
            },
            ..write.clone()
        };
        assert!(LogRecord::decode(&huge.encode()).is_err());

        let unsorted = LogRecord {
            txn: SYSTEM_TXN,
            prev_txn_lsn: Lsn::ZERO,
            body: LogBody::Structure {
                pages: vec![PageImage {
                    page: 1,
                    prev_page_lsn: Lsn::ZERO,
                    node: Node::Leaf(Leaf {
                        entries: vec![(b"b".to_vec(), vec![]), (b"a".to_vec(), vec![])],
                    }),
                }],
            },
        };
        assert!(matches!(
            LogRecord::decode(&unsorted.encode()),
            Err(RecordError::BadImage { page: 1, .. })
        ));
        assert!(LogRecord::decode(b"\xff\x00garbage").is_err());
    }

    /// Dirty-page tables from (page, rec, page LSN offsets) triples, ascending by page.
    fn table(entries: &std::collections::BTreeMap<PageId, (u64, u64)>) -> CheckpointTables {
        CheckpointTables {
            dirty_pages: entries
                .iter()
                .map(|(&page, &(rec, newer))| DirtyPage {
                    page,
                    rec_lsn: Lsn::new(rec),
                    page_lsn: Lsn::new(rec + newer),
                })
                .collect(),
            ..CheckpointTables::default()
        }
    }

    proptest::proptest! {
        /// The changes from one table to another, applied to the first, give the second; and
        /// the delta record carrying them passes validation and decodes to itself.
        #[test]
        fn changes_applied_to_the_base_give_the_tables_back(
            base in proptest::collection::btree_map(0u64..64, (1u64..100, 0u64..5), 0..40),
            new in proptest::collection::btree_map(0u64..64, (1u64..100, 0u64..5), 0..40),
            txns in proptest::collection::vec(1u64..9, 0..4),
        ) {
            let base = table(&base);
            let mut new = table(&new);
            new.active = txns
                .iter()
                .map(|&txn| ActiveTxn { txn, last_lsn: Lsn::new(txn), locks: vec![b"k".to_vec()] })
                .collect();
            new.next_page = 70;
            new.max_txn = 9;
            let changes = new.changes_since(&base);
            // Only what differs is logged: pages gone, and entries new or changed.
            let gone = base
                .dirty_pages
                .iter()
                .filter(|b| !new.dirty_pages.iter().any(|d| d.page == b.page))
                .count();
            let differing = new
                .dirty_pages
                .iter()
                .filter(|d| !base.dirty_pages.contains(d))
                .count();
            proptest::prop_assert_eq!(changes.entries(), gone + differing);
            let mut composed = base.clone();
            composed.apply(&changes);
            proptest::prop_assert_eq!(&composed, &new);
            let record = LogRecord {
                txn: SYSTEM_TXN,
                prev_txn_lsn: Lsn::ZERO,
                body: LogBody::CheckpointDelta {
                    begin: Lsn::new(200),
                    base: Lsn::new(150),
                    root: Lsn::new(100),
                    changes,
                },
            };
            proptest::prop_assert_eq!(LogRecord::decode(&record.encode()), Ok(record));
        }
    }

    #[test]
    fn a_delta_out_of_order_or_off_its_chain_is_refused() {
        let delta = |begin: u64, base: u64, root: u64, changes: TableChanges| LogRecord {
            txn: SYSTEM_TXN,
            prev_txn_lsn: Lsn::ZERO,
            body: LogBody::CheckpointDelta {
                begin: Lsn::new(begin),
                base: Lsn::new(base),
                root: Lsn::new(root),
                changes,
            },
        };
        let entry = |page| DirtyPage {
            page,
            rec_lsn: Lsn::new(3),
            page_lsn: Lsn::new(4),
        };
        let good = TableChanges {
            dirty_pages: vec![entry(2), entry(5)],
            cleaned: vec![1, 3],
            ..TableChanges::default()
        };
        assert_eq!(delta(20, 15, 10, good.clone()).validate(), Ok(()));
        assert_eq!(delta(20, 10, 10, good.clone()).validate(), Ok(()));
        for (begin, base, root) in [(20, 9, 10), (15, 15, 10), (20, 25, 10)] {
            assert!(
                delta(begin, base, root, good.clone()).validate().is_err(),
                "{begin} {base} {root}"
            );
        }
        let unsorted = TableChanges {
            dirty_pages: vec![entry(5), entry(2)],
            ..good.clone()
        };
        let repeated = TableChanges {
            cleaned: vec![3, 3],
            ..good.clone()
        };
        let both = TableChanges {
            cleaned: vec![1, 5],
            ..good.clone()
        };
        let system_txn = TableChanges {
            active: vec![ActiveTxn {
                txn: SYSTEM_TXN,
                last_lsn: Lsn::new(4),
                locks: Vec::new(),
            }],
            ..good.clone()
        };
        for changes in [unsorted, repeated, both, system_txn] {
            assert!(
                delta(20, 15, 10, changes.clone()).validate().is_err(),
                "{changes:?}"
            );
        }
        let inside = LogRecord {
            txn: 4,
            ..delta(20, 15, 10, good)
        };
        assert!(inside.validate().is_err());
    }
}
