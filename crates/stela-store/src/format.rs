//! Log records: what the store writes to its log, as serde types. Pure, no I/O.
//!
//! This module owns the record types and their validation. Every record that changes a page
//! names the page and the LSN of the previous record that changed the same page (the per-page
//! chain: followed backwards it yields the page's whole history, which single-page recovery and,
//! later, on-demand redo use). Every record of a transaction names the transaction's previous
//! record (the per-transaction chain that undo walks). A record read back from the log is
//! checked by [`LogRecord::validate`] before restart acts on it, so a record that decodes but
//! could not have been written (an oversized key, a node larger than a page) is a clear error.

use crate::page::{Node, PageError, PageId, MAX_KEY, MAX_VALUE};
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
    #[serde(with = "crate::page::byte_strings")]
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
                if tables.active.iter().any(|t| t.txn == SYSTEM_TXN) {
                    return Err(RecordError::Invalid("the system as an active transaction"));
                }
                for txn in &tables.active {
                    if txn.locks.iter().any(|k| k.len() > MAX_KEY) {
                        return Err(RecordError::Invalid("a lock on a key larger than MAX_KEY"));
                    }
                }
            }
        }
        Ok(())
    }

    /// The pages this record changes, each with the previous LSN of that page.
    pub fn pages(&self) -> Vec<(PageId, Lsn)> {
        match &self.body {
            LogBody::Write {
                page,
                prev_page_lsn,
                ..
            }
            | LogBody::Compensate {
                page,
                prev_page_lsn,
                ..
            } => vec![(*page, *prev_page_lsn)],
            LogBody::Structure { pages } => {
                pages.iter().map(|p| (p.page, p.prev_page_lsn)).collect()
            }
            LogBody::Commit
            | LogBody::Aborted
            | LogBody::PagesWritten { .. }
            | LogBody::CheckpointBegin
            | LogBody::CheckpointEnd { .. } => Vec::new(),
        }
    }
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
    use crate::page::Leaf;

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
}
