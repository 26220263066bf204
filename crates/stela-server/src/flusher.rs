//! The flusher: the one thread that moves records from the pool's buffers into the log files.
//!
//! Each round it takes the largest eligible run of one log, appends it to that log through
//! stela-wal (which frames and checksums every record, exactly as an embedded writer would),
//! writes it in one sequential write and fdatasyncs it, then frees the buffers. Syncing every
//! round is what keeps the promise of the power window: bytes the OS holds but has not synced
//! would be lost in a power cut too, so they count as dirty until synced. A failed write or
//! sync stops that log for good (see the pool's fail-stop invariant); the flusher goes on with
//! the others.

use crate::logs::Logs;
use crate::pool::{Pool, Work};
use std::sync::Arc;

pub fn run(pool: Arc<Pool>, logs: Arc<Logs>) {
    while let Some(work) = pool.next_work() {
        let outcome = write(&logs, &work);
        pool.complete(work, outcome);
    }
}

/// Appends `work` to its log, writes it and fdatasyncs it. Used by the flusher and by a `disk`
/// waiter that leads the round itself (`Pool::wait_durable_leading`).
pub fn write(logs: &Logs, work: &Work) -> Result<(), String> {
    let Some(entry) = logs.get(work.log) else {
        return Err("the log was closed with records still buffered".into());
    };
    let expected_first = work.first_lsn();
    let expected_last = work.last_lsn();
    let outcome = (|| {
        let last = entry
            .log
            .append_all(work.payloads())
            .map_err(|e| e.to_string())?;
        if last.get() != expected_last {
            // The pool and the files disagree on numbering: stop rather than write records
            // under LSNs their clients were not told.
            return Err(format!(
                "internal error: buffered LSNs {expected_first}..={expected_last} were given \
                 {}..={} by the log files",
                last.get() + 1 - (expected_last - expected_first + 1),
                last.get()
            ));
        }
        entry.log.commit(last).map_err(|e| e.to_string())
    })();
    if let Err(failure) = &outcome {
        tracing::error!(log = %entry.name, %failure, "log stopped: write or sync failed");
    }
    outcome
}
