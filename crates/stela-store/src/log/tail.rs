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
//!   reads the log files instead), then [`OVER_CAP_BATCH`] at a time. Without consumers, or
//!   below every consumer's release, nothing is kept.

use crate::error::Result;
use crate::format::{LogBody, LogRecord};
use crate::log::device::{LogDevice, RecordIter};
use crate::sync::Mutex;
use std::collections::VecDeque;
use std::sync::Arc;
use stela_format::Lsn;

/// Records dropped at once when the copy goes over its cap.
pub const OVER_CAP_BATCH: usize = 256;

/// Which decoupled service releases records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Consumer {
    Checkpoint = 0,
    Cleaner = 1,
}

/// Records with their LSNs, shared with readers without copying them.
pub type SharedRecords<'a> = Box<dyn Iterator<Item = Result<(Lsn, Arc<LogRecord>)>> + 'a>;

/// A reader's buffer for [`LogTail::records_reusing`], kept between its calls.
pub type RecordBuffer = Vec<(Lsn, Arc<LogRecord>)>;

struct Copy {
    records: VecDeque<(Lsn, Arc<LogRecord>)>,
    /// The LSN of the first record held (or of the next to append, when none is).
    base: Lsn,
    /// Per consumer: `None` if not registered, else the first LSN it still needs.
    needs: [Option<Lsn>; 2],
}

impl Copy {
    /// The first LSN some registered consumer still needs; `None` without consumers.
    fn keep_from(&self) -> Option<Lsn> {
        self.needs.iter().flatten().min().copied()
    }
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
        let keep_from = copy.keep_from();
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
    #[cfg(any(test, stela_store_loom))]
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
        let mut over_cap = Vec::new();
        let mut copy = self.copy.lock().unwrap_or_else(|p| p.into_inner());
        let lsn = match &encoded {
            Some(encoded) => self.inner.append_encoded(record, encoded)?,
            None => self.inner.append(record)?,
        };
        let keep_from = copy.keep_from();
        if keep_from.is_some_and(|keep_from| lsn >= keep_from) {
            // Exactly one of the two is there: the copy made before the lock, or its maker.
            let kept = match (kept, keep) {
                (Some(kept), _) => kept,
                (None, Some(keep)) => keep(),
                (None, None) => Arc::new(record.clone()),
            };
            copy.records.push_back((lsn, kept));
            if copy.records.len() > self.cap {
                // A batch at once, freed after the lock, as releases are: nothing is freed
                // under the lock every append takes (one cold record per append, while the
                // tail sat at its cap, before).
                let count = OVER_CAP_BATCH.min(copy.records.len());
                over_cap.extend(copy.records.drain(..count));
                copy.base = Lsn::new(copy.base.get() + count as u64);
            }
        } else {
            // No consumer, or every consumer released past this record already (then every
            // record before it was released too, so the copy is empty).
            copy.base = Lsn::new(lsn.get() + 1);
        }
        drop(copy);
        drop(over_cap);
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
        let mut records = Vec::new();
        if !self.copy_held_from(lsn, &mut records) {
            return self.read_log_from(lsn);
        }
        Ok(Box::new(records.into_iter().map(Ok)))
    }

    /// [`LogTail::records_from`] for a reader that comes back every round (the decoupled
    /// checkpoint's analysis and the decoupled cleaner): the pointers are copied into `buffer`,
    /// emptied first, whose allocation the reader keeps. Why: a fresh vector each round came
    /// from memory the thread had not touched, and the kernel's zeroing of it (`clear_page`)
    /// took 5.4 % of the checkpoint thread and 3.5 % of the cleaner's at 1 ms rounds (perf).
    /// Records the iterator is dropped before reaching are released with it; the buffer keeps
    /// no record after that.
    pub fn records_reusing<'a>(
        &'a self,
        lsn: Lsn,
        buffer: &'a mut RecordBuffer,
    ) -> Result<SharedRecords<'a>> {
        buffer.clear();
        if !self.copy_held_from(lsn, buffer) {
            return self.read_log_from(lsn);
        }
        Ok(Box::new(buffer.drain(..).map(Ok)))
    }

    /// Appends to `into` the copy's records from `lsn` on, under the lock; `false` (nothing
    /// appended) when `lsn` is below the copy, whose reader must read the log instead.
    fn copy_held_from(&self, lsn: Lsn, into: &mut RecordBuffer) -> bool {
        let copy = self.copy.lock().unwrap_or_else(|p| p.into_inner());
        if lsn < copy.base {
            return false;
        }
        let skip = ((lsn.get() - copy.base.get()) as usize).min(copy.records.len());
        into.extend(copy.records.range(skip..).cloned());
        true
    }

    /// The real log's records from `lsn` on, shared.
    fn read_log_from(&self, lsn: Lsn) -> Result<SharedRecords<'_>> {
        let records = self.inner.read_from(lsn)?;
        Ok(Box::new(records.map(|item| {
            item.map(|(lsn, record)| (lsn, Arc::new(record)))
        })))
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

    /// An embedded log in `dir` (unsynced) holding records 1 to `records`.
    fn log_holding(dir: &std::path::Path, records: u64) -> Arc<dyn LogDevice> {
        let wal: stela_wal::Wal<LogRecord> = stela_wal::Wal::open(
            dir,
            stela_wal::WalOptions::default().sync(stela_wal::SyncMode::None),
        )
        .unwrap();
        let wal: Arc<dyn LogDevice> = Arc::new(wal);
        for i in 1..=records {
            wal.append(&record(i)).unwrap();
        }
        wal
    }

    #[test]
    fn the_tail_answers_as_the_log_would_and_drops_only_what_every_consumer_released() {
        let dir = tempfile::tempdir().unwrap();
        let wal = log_holding(dir.path(), 5);
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

    #[derive(Debug, Clone)]
    enum Op {
        Append(u8),
        Release(bool, u16),
        Read(u16),
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            4 => (1u8..=150).prop_map(Op::Append),
            2 => (any::<bool>(), 0u16..1200).prop_map(|(c, l)| Op::Release(c, l)),
            2 => (0u16..1200).prop_map(Op::Read),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]
        /// Against the log it wraps, whatever the appends, releases and reads: every read
        /// answers as the log would, and the copy holds no released record, never more than
        /// its cap, and, of what its consumers still need, at least the cap less one batch.
        #[test]
        fn the_tail_reads_as_the_log_and_holds_what_it_must(
            cap in 1usize..700,
            before in 0u64..5,
            ops in proptest::collection::vec(op(), 1..40),
        ) {
            let dir = tempfile::tempdir().unwrap();
            let wal = log_holding(dir.path(), before);
            let tail = LogTail::new(
                Arc::clone(&wal),
                &[Consumer::Checkpoint, Consumer::Cleaner],
                cap,
            );
            let first = before + 1;
            let mut needs = [0u64; 2];
            let mut buffer = RecordBuffer::new();
            for op in ops {
                match op {
                    Op::Append(n) => {
                        for _ in 0..n {
                            let next = tail.last_lsn().get() + 1;
                            let lsn = if next.is_multiple_of(3) {
                                tail.append_shared(&Arc::new(record(next))).unwrap()
                            } else {
                                tail.append(&record(next)).unwrap()
                            };
                            proptest::prop_assert_eq!(lsn.get(), next);
                        }
                    }
                    Op::Release(cleaner, lsn) => {
                        let consumer = if cleaner { Consumer::Cleaner } else { Consumer::Checkpoint };
                        tail.release(consumer, Lsn::new(lsn.into()));
                        let need = &mut needs[consumer as usize];
                        *need = (*need).max(lsn.into());
                    }
                    Op::Read(from) => {
                        let from = u64::from(from);
                        let expected = read(wal.as_ref(), from);
                        proptest::prop_assert_eq!(&read(&tail, from), &expected);
                        // The same through a reused buffer, which may hold an earlier read's.
                        let reused: Vec<(Lsn, LogRecord)> = tail
                            .records_reusing(Lsn::new(from), &mut buffer)
                            .unwrap()
                            .map(|item| item.map(|(lsn, record)| (lsn, (*record).clone())))
                            .collect::<Result<_>>()
                            .unwrap();
                        proptest::prop_assert_eq!(&reused, &expected);
                        proptest::prop_assert!(buffer.is_empty(), "the buffer kept records");
                    }
                }
                let last = tail.last_lsn().get();
                let keep_from = needs[0].min(needs[1]).max(first);
                let needed = (last + 1).saturating_sub(keep_from) as usize;
                let held = tail.held();
                proptest::prop_assert!(held <= cap, "held {} over the cap {}", held, cap);
                proptest::prop_assert!(held <= needed, "held {} of {} needed", held, needed);
                proptest::prop_assert!(
                    held >= needed.min(cap.saturating_sub(OVER_CAP_BATCH)),
                    "held {} of {} needed, cap {}", held, needed, cap
                );
            }
        }
    }
}
