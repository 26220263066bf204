//! The log tail: the records appended since open, kept in memory for the decoupled services
//! (checkpoint analysis and the decoupled cleaner), so that they consume the log as it is
//! written instead of reading it back from the log files. The paper's authors name this as the
//! way to take the extra log reads out of decoupled checkpoints; here it matters more, because
//! the embedded log reads a segment from its start to reach an LSN.
//!
//! [`LogTail`] is a [`LogDevice`] around the real one. It owns the in-memory copy and keeps:
//! - the copy holds every record from `base` to the last appended, in LSN order, with no gap
//!   (an append and its copy happen under one mutex, so LSN order is copy order);
//! - `read_from(lsn)` answers from memory when `lsn >= base`, else from the real log, so a
//!   reader never sees less than the real log would give it (records after the call may be
//!   missing from either);
//! - records are dropped once every registered consumer has released them, or when the copy
//!   exceeds its cap (a consumer that stopped must not make memory grow without bound; it then
//!   reads the log files instead). Without consumers nothing is kept.

use crate::error::Result;
use crate::format::{LogBody, LogRecord};
use crate::log::{LogDevice, RecordIter};
use crate::sync::Mutex;
use std::collections::VecDeque;
use std::sync::Arc;
use stela_format::Lsn;

/// Which decoupled service releases records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Consumer {
    Checkpoint = 0,
    Cleaner = 1,
}

/// Records with their LSNs, shared with readers without copying them.
pub type SharedRecords<'a> = Box<dyn Iterator<Item = Result<(Lsn, Arc<LogRecord>)>> + 'a>;

struct Copy {
    records: VecDeque<(Lsn, Arc<LogRecord>)>,
    /// The LSN of the first record held (or of the next to append, when none is).
    base: Lsn,
    /// Per consumer: `None` if not registered, else the first LSN it still needs.
    needs: [Option<Lsn>; 2],
}

pub struct LogTail {
    inner: Arc<dyn LogDevice>,
    copy: Mutex<Copy>,
    cap: usize,
}

impl LogTail {
    /// A tail around `inner` for the given consumers, each starting at `from` (the first LSN it
    /// will read), holding at most `cap` records.
    pub fn new(inner: Arc<dyn LogDevice>, consumers: &[Consumer], cap: usize) -> LogTail {
        let next = Lsn::new(inner.last_lsn().get() + 1);
        let mut needs = [None; 2];
        for &consumer in consumers {
            needs[consumer as usize] = Some(Lsn::ZERO);
        }
        LogTail {
            inner,
            copy: Mutex::new(Copy {
                records: VecDeque::new(),
                base: next,
                needs,
            }),
            cap,
        }
    }

    /// `consumer` will not read records below `lsn` again.
    pub fn release(&self, consumer: Consumer, lsn: Lsn) {
        let mut copy = self.copy.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(need) = &mut copy.needs[consumer as usize] {
            *need = (*need).max(lsn);
        }
        let keep_from = copy.needs.iter().flatten().min().copied();
        let Some(keep_from) = keep_from else {
            return;
        };
        let released =
            (keep_from.get().saturating_sub(copy.base.get()) as usize).min(copy.records.len());
        let dropped: Vec<_> = copy.records.drain(..released).collect();
        copy.base = Lsn::new(copy.base.get() + released as u64);
        // Freed after the lock: a second of records is a few hundred thousand frees, which
        // every append (the engine's, under its latch) would otherwise wait behind.
        drop(copy);
        drop(dropped);
    }

    /// Records held in memory now.
    pub fn held(&self) -> usize {
        self.copy
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .records
            .len()
    }

    /// Appends `record` to the real log and, while a consumer is registered, keeps the record
    /// `keep` makes of it (a copy, or the caller's shared one).
    fn append_keeping(
        &self,
        record: &LogRecord,
        keep: impl FnOnce() -> Arc<LogRecord>,
    ) -> Result<Lsn> {
        // A bulky record (a checkpoint's tables: tens of kilobytes for a few thousand dirty
        // pages; a cleaning round's page list) is encoded before the lock, which every append
        // takes, the engine's under its latch: encoding it under the lock stalled transactions
        // for the whole encoding at every checkpoint.
        // Its copy for the tail is made there too (taken even if no consumer wants it then).
        let mut keep = Some(keep);
        let (encoded, kept) = if is_bulky(record) {
            (self.inner.encode(record)?, keep.take().map(|keep| keep()))
        } else {
            (None, None)
        };
        let mut copy = self.copy.lock().unwrap_or_else(|p| p.into_inner());
        let lsn = match &encoded {
            Some(encoded) => self.inner.append_encoded(record, encoded)?,
            None => self.inner.append(record)?,
        };
        if copy.needs.iter().any(Option::is_some) {
            // Exactly one of the two is there: the copy made before the lock, or its maker.
            let kept = match (kept, keep) {
                (Some(kept), _) => kept,
                (None, Some(keep)) => keep(),
                (None, None) => Arc::new(record.clone()),
            };
            copy.records.push_back((lsn, kept));
            if copy.records.len() > self.cap {
                copy.records.pop_front();
                copy.base = Lsn::new(copy.base.get() + 1);
            }
        } else {
            copy.base = Lsn::new(lsn.get() + 1);
        }
        Ok(lsn)
    }
}

/// Whether `record` may be large enough that encoding it is worth doing outside the lock: the
/// system's records that carry tables or page lists. A transaction's records are small and
/// encoded in the log's own scratch buffer.
fn is_bulky(record: &LogRecord) -> bool {
    matches!(
        record.body,
        LogBody::CheckpointEnd { .. } | LogBody::PagesWritten { .. }
    )
}

impl LogDevice for LogTail {
    fn append(&self, record: &LogRecord) -> Result<Lsn> {
        self.append_keeping(record, || Arc::new(record.clone()))
    }

    fn append_shared(&self, record: &Arc<LogRecord>) -> Result<Lsn> {
        self.append_keeping(record, || Arc::clone(record))
    }

    fn flush(&self, lsn: Lsn) -> Result<()> {
        self.inner.flush(lsn)
    }

    fn durable_lsn(&self) -> Lsn {
        self.inner.durable_lsn()
    }

    fn last_lsn(&self) -> Lsn {
        self.inner.last_lsn()
    }

    fn truncate_before(&self, lsn: Lsn) -> Result<usize> {
        // The copy is left alone: what it holds stays right to read, and it drops records as
        // its consumers release them.
        self.inner.truncate_before(lsn)
    }

    fn read_from(&self, lsn: Lsn) -> Result<RecordIter<'_>> {
        Ok(Box::new(self.records_from(lsn)?.map(|item| {
            let (lsn, record) = item?;
            Ok((lsn, Arc::unwrap_or_clone(record)))
        })))
    }
}

impl LogTail {
    /// Records from `lsn` on, as [`LogDevice::read_from`] gives them, but shared: from memory
    /// when the tail holds `lsn` (the lock is held only to copy the pointers), else read from
    /// the log.
    pub fn records_from(&self, lsn: Lsn) -> Result<SharedRecords<'_>> {
        let copy = self.copy.lock().unwrap_or_else(|p| p.into_inner());
        if lsn < copy.base {
            drop(copy);
            let records = self.inner.read_from(lsn)?;
            return Ok(Box::new(
                records.map(|item| item.map(|(lsn, record)| (lsn, Arc::new(record)))),
            ));
        }
        let skip = ((lsn.get() - copy.base.get()) as usize).min(copy.records.len());
        let records: Vec<(Lsn, Arc<LogRecord>)> = copy.records.range(skip..).cloned().collect();
        Ok(Box::new(records.into_iter().map(Ok)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{LogBody, SYSTEM_TXN};

    fn record(i: u64) -> LogRecord {
        LogRecord {
            txn: SYSTEM_TXN,
            prev_txn_lsn: Lsn::ZERO,
            body: LogBody::PagesWritten {
                pages: vec![(i, Lsn::new(i))],
            },
        }
    }

    fn read(log: &dyn LogDevice, from: u64) -> Vec<(Lsn, LogRecord)> {
        log.read_from(Lsn::new(from))
            .unwrap()
            .collect::<Result<_>>()
            .unwrap()
    }

    #[test]
    fn the_tail_answers_as_the_log_would_and_drops_only_what_every_consumer_released() {
        let dir = tempfile::tempdir().unwrap();
        let wal: stela_wal::Wal<LogRecord> = stela_wal::Wal::open(
            dir.path(),
            stela_wal::WalOptions::default().sync(stela_wal::SyncMode::None),
        )
        .unwrap();
        let wal: Arc<dyn LogDevice> = Arc::new(wal);
        for i in 1..=5 {
            wal.append(&record(i)).unwrap();
        }
        // Records from before the tail existed come from the log files.
        let tail = LogTail::new(
            Arc::clone(&wal),
            &[Consumer::Checkpoint, Consumer::Cleaner],
            100,
        );
        for i in 6..=20 {
            tail.append(&record(i)).unwrap();
        }
        for from in [1, 4, 6, 13, 20, 21] {
            assert_eq!(read(&tail, from), read(wal.as_ref(), from), "from {from}");
        }
        tail.release(Consumer::Checkpoint, Lsn::new(15));
        assert_eq!(tail.held(), 15, "the cleaner still needs them all");
        tail.release(Consumer::Cleaner, Lsn::new(10));
        assert_eq!(tail.held(), 11);
        assert_eq!(
            read(&tail, 8),
            read(wal.as_ref(), 8),
            "below the tail: the files"
        );
        assert_eq!(read(&tail, 10), read(wal.as_ref(), 10));
    }
}
