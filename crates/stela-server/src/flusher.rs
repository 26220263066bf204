//! The flushers: the threads that move framed runs from the pool to the segment files.
//!
//! A flusher takes the largest eligible run of a log nobody else is writing, writes its bytes
//! unchanged at the offsets the pool chose (one positioned write per stretch of a segment),
//! crossing into a new segment where the pool put the segment boundary, fdatasyncs, and reports
//! to the pool. Syncing every round is what keeps the promise of the power window: bytes the OS
//! holds but has not synced would be lost in a power cut too, so they count as dirty until
//! synced. Several flushers run, so a slow write of one log never holds up another's `disk`
//! commits. A failed write or sync stops that log for good (the pool's fail-stop invariant); a
//! full disk met while creating a segment leaves the records in memory for a later attempt.
//!
//! When a log goes idle after a durable round, the flusher asks for the log's synced-end mark
//! to be written (by stela-wal's keeper thread, not this one), so damage to the last synced
//! write is never mistaken for a torn one.
//!
//! Invariant: the bytes written are exactly [`crate::pool::Run::bytes`] at
//! [`crate::pool::Run::offset`] of segment [`crate::pool::Run::segment`]; a flusher never frames,
//! numbers or reorders anything.

use crate::logs::Logs;
use crate::metrics::Metrics;
use crate::pool::{Failure, Outcome, Pool, Released, Work};
use crate::sync::lock;
use stela_wal::Lsn;

/// Writes `work` and syncs it; says how it ended.
pub fn write(logs: &Logs, work: &Work) -> Outcome {
    // A log leaves the table only after the pool removed it, which it does only once nothing of
    // the log is queued or being written: work always finds its log.
    let entry = logs
        .get(work.log)
        .expect("a log with work in the pool is open");
    let mut writer = lock(&entry.writer);
    let runs = &work.runs;
    let mut at = 0;
    while at < runs.len() {
        let segment = runs[at].segment();
        if segment != writer.segment_start().get() {
            // Everything written so far goes to disk before the new segment exists, so the
            // runs before this one are durable whatever the creation does.
            if at > 0 {
                if let Err(error) = writer.sync() {
                    return failed(&entry.name, error);
                }
            }
            if let Err(error) = writer.rotate(Lsn::new(segment)) {
                return if is_disk_full_at_creation(&error) {
                    tracing::warn!(log = %entry.name, %error, "disk full: segment not created; records kept, retrying");
                    Outcome::DiskFull {
                        synced: at,
                        error: Failure::new(error),
                    }
                } else {
                    failed(&entry.name, error)
                };
            }
        }
        // One write for the stretch of runs that continue each other in this segment.
        let mut end = at + 1;
        while end < runs.len()
            && runs[end].segment() == segment
            && runs[end].offset() == runs[end - 1].offset() + runs[end - 1].bytes().len() as u64
        {
            end += 1;
        }
        let bufs: Vec<&[u8]> = runs[at..end].iter().map(|r| r.bytes()).collect();
        if let Err(error) = writer.write_at(runs[at].offset(), &bufs) {
            return failed(&entry.name, error);
        }
        at = end;
    }
    match writer.sync() {
        Ok(()) => Outcome::Durable,
        Err(error) => failed(&entry.name, error),
    }
}

fn failed(log: &str, error: stela_wal::Error) -> Outcome {
    tracing::error!(%log, %error, "log stopped: write or sync failed");
    Outcome::Failed(Failure::new(error))
}

/// A full disk while a segment was being made (not while syncing data): nothing written was
/// lost, and trying again later with a new file is safe.
fn is_disk_full_at_creation(error: &stela_wal::Error) -> bool {
    matches!(error, stela_wal::Error::DiskFull { op, .. } if *op != "fdatasync")
}

/// One flusher thread's loop: until the pool is shut down and drained. `observe` sees each
/// durable round's bytes and time (before the completion, so a cap it changes is in force when
/// waiting appends retry).
pub fn run<W>(
    pool: &Pool<W>,
    logs: &Logs,
    metrics: &Metrics,
    observe: &dyn Fn(u64, std::time::Duration),
    release: &dyn Fn(Released<W>),
) {
    while let Some(work) = pool.next_work() {
        let started = std::time::Instant::now();
        let outcome = write(logs, &work);
        let bytes = work.runs.iter().map(|r| r.bytes().len() as u64).sum();
        if matches!(outcome, Outcome::Durable) {
            observe(bytes, started.elapsed());
        }
        metrics.flushed(
            bytes,
            started.elapsed(),
            matches!(outcome, Outcome::Failed(_)),
        );
        let log = work.log;
        let released = pool.complete(work, outcome);
        if released.idle {
            if let Some(entry) = logs.get(log) {
                lock(&entry.writer).synced_mark().request();
            }
        }
        if !released.waiters.is_empty() || released.space_freed {
            release(released);
        }
    }
}
