//! What the pool tells without changing anything: reads of records still in the buffers,
//! positions, counters, failures. Apart from the pool's durability-critical core ([`super`]).

use super::{log_ref, Admission, Failure, LogId, Pool, PoolConfig, PoolError, Run, Slot, Work};
use crate::sync::lock;
use stela_format::frame;

/// The answer to a read of LSNs the pool may hold.
#[derive(Debug, PartialEq, Eq)]
pub enum PoolRead {
    /// `from` is durable: read it from the log files.
    OnDisk,
    /// Records from `from` on, in order, copied out of the buffers (empty: nothing yet).
    Buffered(Vec<(u64, Vec<u8>)>),
}

/// Counters for `stela status`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    pub dirty_bytes: usize,
    pub free_buffers: usize,
    pub appends_waited: u64,
    pub bytes_written: u64,
    pub writes: u64,
}

impl Run {
    /// The records, in LSN order.
    pub fn records(&self) -> impl Iterator<Item = (u64, &[u8])> {
        let mut at = 0;
        std::iter::from_fn(move || {
            let frame::Decoded::Record(record) =
                frame::decode(frame::Layout::V2, self.data.get(at..)?)
            else {
                return None;
            };
            at += record.frame_len();
            Some((record.lsn.get(), record.payload))
        })
    }
}

impl Slot {
    fn run(&self) -> Option<&Run> {
        match self {
            Slot::Free(_) => None,
            Slot::Filling(run) | Slot::Sealed(run) => Some(run),
            Slot::Writing(run) => Some(run),
        }
    }
}

impl Work {
    pub fn first_lsn(&self) -> u64 {
        self.runs.first().map_or(0, |r| r.first_lsn())
    }

    pub fn last_lsn(&self) -> u64 {
        self.runs.last().map_or(0, |r| r.last_lsn())
    }

    pub fn bytes(&self) -> usize {
        self.runs.iter().map(|r| r.data.len()).sum()
    }
}

impl<W> Pool<W> {
    /// The largest payload `log` accepts.
    pub fn max_record_bytes(&self, log: LogId) -> usize {
        lock(&self.state).logs[log]
            .as_ref()
            .map_or(0, |l| l.max_payload)
    }

    /// Reads records of `log` from `from` on, if they are still only in the buffers.
    pub fn read(&self, log: LogId, from: u64, max_records: usize, max_bytes: usize) -> PoolRead {
        let state = lock(&self.state);
        let entry = log_ref(&state, log);
        if from <= entry.durable_lsn {
            return PoolRead::OnDisk;
        }
        let mut out = Vec::new();
        let mut bytes = 0;
        'runs: for &slot in &entry.queue {
            let Some(run) = state.slots[slot].run() else {
                continue;
            };
            if run.last_lsn() < from {
                continue;
            }
            for (lsn, payload) in run.records() {
                if lsn < from {
                    continue;
                }
                if out.len() >= max_records
                    || (!out.is_empty() && bytes + payload.len() > max_bytes)
                {
                    break 'runs;
                }
                bytes += payload.len();
                out.push((lsn, payload.to_vec()));
            }
        }
        PoolRead::Buffered(out)
    }

    /// The log's next LSN and durable LSN.
    pub fn positions(&self, log: LogId) -> (u64, u64) {
        let state = lock(&self.state);
        let entry = log_ref(&state, log);
        (entry.next_lsn, entry.durable_lsn)
    }

    /// As [`Pool::positions`], or `None` once the log left the pool: for a look at every open
    /// log (status), which may meet one whose last handle is being closed.
    pub fn positions_if_present(&self, log: LogId) -> Option<(u64, u64)> {
        let state = lock(&self.state);
        let entry = state.logs[log].as_ref()?;
        Some((entry.next_lsn, entry.durable_lsn))
    }

    pub fn log_dirty_bytes(&self, log: LogId) -> usize {
        lock(&self.state).logs[log].as_ref().map_or(0, |l| l.dirty)
    }

    /// Why the log cannot take writes, if it cannot: it stopped, or the disk is full.
    pub fn log_failure(&self, log: LogId) -> Option<PoolError> {
        let state = lock(&self.state);
        let entry = state.logs[log].as_ref()?;
        if let Some(failure) = &entry.failure {
            return Some(PoolError::Failed(Failure::clone(failure)));
        }
        entry
            .disk_full
            .as_ref()
            .map(|d| PoolError::DiskFull(Failure::clone(&d.1)))
    }

    pub fn stats(&self) -> PoolStats {
        let state = lock(&self.state);
        PoolStats {
            dirty_bytes: state.dirty,
            free_buffers: state.free.len(),
            appends_waited: state.appends_waited,
            bytes_written: state.bytes_written,
            writes: state.writes,
        }
    }

    pub fn admission(&self) -> Admission {
        lock(&self.state).admission
    }

    pub fn config(&self) -> &PoolConfig {
        &self.config
    }
}
