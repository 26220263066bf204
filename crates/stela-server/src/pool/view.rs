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

    /// Where the oldest record of `log` still in the buffers begins: (segment, offset, LSN) of
    /// the first run of its queue (written or not); `None` when nothing is buffered or the log
    /// left the pool.
    pub fn oldest_buffered(&self, log: LogId) -> Option<(u64, u64, u64)> {
        let state = lock(&self.state);
        let entry = state.logs.get(log)?.as_ref()?;
        let run = entry
            .queue
            .iter()
            .find_map(|&slot| state.slots[slot].run())?;
        Some((run.segment, run.offset, run.first_lsn()))
    }

    /// Where the log's next frame goes: (segment, offset, the segment's capacity); `None` once
    /// the log left the pool.
    pub fn append_place(&self, log: LogId) -> Option<(u64, u64, u64)> {
        let state = lock(&self.state);
        let place = &state.logs[log].as_ref()?.place;
        Some((place.segment, place.offset, place.capacity))
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

/// What a log's shipper to its standby sends next ([`Pool::ship`]).
#[derive(Debug, PartialEq, Eq)]
pub enum Ship {
    /// The position is durable: read the bytes from the segment files.
    OnDisk,
    /// Nothing appended past the position yet.
    Nothing,
    /// Framed bytes of segment `segment` from `offset` on, copied out of the buffers, ending
    /// before record `next_lsn`. `new_segment_capacity`: the capacity of segments the log creates
    /// from now on (for the header of a segment the flusher has not created yet).
    Bytes {
        segment: u64,
        offset: u64,
        bytes: Vec<u8>,
        next_lsn: u64,
        new_segment_capacity: u64,
    },
}

impl<W> Pool<W> {
    /// The bytes a standby standing at (`segment`, `offset`, `next_lsn`) lacks, if the buffers
    /// still hold them: whole frames, at most about `max_bytes` (at least one run's tail), from
    /// the run that holds the position, or from the run that starts the next segment at
    /// `next_lsn`, on through the runs that continue it in the same segment. Read only.
    pub fn ship(
        &self,
        log: LogId,
        (segment, offset, next_lsn): (u64, u64, u64),
        max_bytes: usize,
    ) -> Ship {
        let state = lock(&self.state);
        let Some(entry) = state.logs.get(log).and_then(|l| l.as_ref()) else {
            return Ship::Nothing;
        };
        if next_lsn <= entry.durable_lsn {
            return Ship::OnDisk;
        }
        if next_lsn >= entry.next_lsn {
            return Ship::Nothing;
        }
        let mut out: Option<(u64, u64, Vec<u8>, u64)> = None;
        for &slot in &entry.queue {
            let Some(run) = state.slots[slot].run() else {
                continue;
            };
            let end = run.offset + run.data.len() as u64;
            match &mut out {
                None => {
                    let from = if run.segment == segment && run.offset <= offset && offset < end {
                        (offset - run.offset) as usize
                    } else if run.segment == next_lsn && run.segment != segment {
                        0
                    } else {
                        continue;
                    };
                    out = Some((
                        run.segment,
                        run.offset + from as u64,
                        run.data[from..].to_vec(),
                        run.last_lsn() + 1,
                    ));
                }
                Some((seg, at, bytes, next)) => {
                    if run.segment != *seg
                        || run.offset != *at + bytes.len() as u64
                        || bytes.len() >= max_bytes
                    {
                        break;
                    }
                    bytes.extend_from_slice(&run.data);
                    *next = run.last_lsn() + 1;
                }
            }
        }
        match out {
            Some((segment, offset, bytes, next_lsn)) if !bytes.is_empty() => Ship::Bytes {
                segment,
                offset,
                bytes,
                next_lsn,
                new_segment_capacity: entry.segment_bytes,
            },
            _ => Ship::OnDisk,
        }
    }
}
