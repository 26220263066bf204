//! The RapiLog buffer manager (paper sections 3.2 and 4.2): a fixed set of equal buffers that
//! hold acknowledged records until the flusher has written and synced them.
//!
//! It owns every acknowledged-but-not-durable byte in the daemon, and keeps these invariants:
//! - **Bounded.** Dirty bytes (acknowledged, not yet fdatasync'ed) never exceed `dirty_cap`, and
//!   never more than `buffers` buffers exist. An append that does not fit waits (backpressure);
//!   none is dropped, none grows memory.
//! - **Sequential runs.** A record goes into the buffer that ends where its log ends, so every
//!   buffer holds one contiguous run of LSNs of one log, and a write is one large sequential one.
//! - **In order per log.** A log's buffers are written strictly in LSN order, one write at a time,
//!   so a crash never leaves a hole before valid records (which recovery would call corruption).
//!   Across logs the largest eligible run goes first, as in the paper.
//! - **Batches are contiguous.** The records of one append get consecutive LSNs: space for the
//!   whole batch is found before any of it is placed.
//! - **Fail stop.** When a log's write or sync fails its records are dropped from memory, the log
//!   refuses every later call, and every waiter is told; nothing retries the same file.
//!
//! A buffer becomes eligible for writing once it is sealed (full), holds `write_threshold` bytes
//! (one disk block by default: RapiLog never issues writes of partial blocks when it can wait),
//! is older than `flush_interval`, is needed by a `disk` waiter, or the daemon is draining
//! (power failure, shutdown). No I/O happens here: the flusher (`flusher.rs`), or a `disk` waiter
//! leading its own round ([`Pool::wait_durable_leading`]), takes [`Work`],
//! writes it through stela-wal and reports back with [`Pool::complete`].

use crate::sync::{self, lock, Arc, Condvar, Mutex};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// A log's index in the pool (its position in the daemon's log table).
pub type LogId = usize;

/// Bytes stored in a buffer ahead of each payload: its length.
pub const RECORD_PREFIX: usize = 4;

#[derive(Clone, Debug)]
pub struct PoolConfig {
    pub buffers: usize,
    pub buffer_bytes: usize,
    /// Most dirty bytes allowed at once (at most `buffers * buffer_bytes`).
    pub dirty_cap: usize,
    pub write_threshold: usize,
    pub flush_interval: Duration,
}

impl PoolConfig {
    /// The paper's configuration: six buffers of 512 KiB, one flush a second.
    pub fn rapilog_default() -> PoolConfig {
        PoolConfig {
            buffers: 6,
            buffer_bytes: 512 << 10,
            dirty_cap: 6 * (512 << 10),
            write_threshold: 4096,
            flush_interval: Duration::from_secs(1),
        }
    }

    /// The largest payload an append can carry.
    pub fn max_record_bytes(&self) -> usize {
        self.buffer_bytes.min(self.dirty_cap) - RECORD_PREFIX
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    #[error("record of {bytes} bytes is larger than the daemon's limit of {max} bytes (its buffer size)")]
    RecordTooLarge { bytes: usize, max: usize },
    #[error("batch of {bytes} bytes is larger than the dirty cap of {cap} bytes; send it in smaller appends")]
    BatchTooLarge { bytes: usize, cap: usize },
    #[error("a power failure was announced: writes are refused until power-restore or a restart")]
    PowerFailing,
    #[error("the daemon is shutting down")]
    ShuttingDown,
    #[error("the log stopped after a failed write or sync: {0}")]
    Failed(String),
    #[error("LSN {lsn} has not been appended (next is {next})")]
    NotAppended { lsn: u64, next: u64 },
}

/// Whether appends are admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    Open,
    PowerFailing,
    ShuttingDown,
}

/// A run of records of one log in one buffer: `[u32 LE length][payload]` repeated.
#[derive(Debug)]
pub struct Run {
    data: Vec<u8>,
    first_lsn: u64,
    records: u32,
    opened_at: Instant,
}

impl Run {
    pub fn first_lsn(&self) -> u64 {
        self.first_lsn
    }

    pub fn last_lsn(&self) -> u64 {
        self.first_lsn + u64::from(self.records) - 1
    }

    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    /// The payloads in LSN order.
    pub fn payloads(&self) -> impl Iterator<Item = &[u8]> {
        let mut at = 0;
        std::iter::from_fn(move || {
            let len_bytes = self.data.get(at..at + RECORD_PREFIX)?;
            let len = u32::from_le_bytes(len_bytes.try_into().expect("4 bytes")) as usize;
            let payload = &self.data[at + RECORD_PREFIX..at + RECORD_PREFIX + len];
            at += RECORD_PREFIX + len;
            Some(payload)
        })
    }
}

#[derive(Debug)]
enum Slot {
    Free(Vec<u8>),
    /// The tail of its log's run; takes more records.
    Filling(Run),
    /// Full; waits for the flusher.
    Sealed(Run),
    /// Handed to the flusher; still readable until written.
    Writing(Arc<Run>),
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

#[derive(Debug, Default)]
struct LogState {
    next_lsn: u64,
    /// Written and fdatasync'ed by the flusher.
    durable_lsn: u64,
    /// This log's slots in LSN order; only the last may be `Filling`.
    queue: VecDeque<usize>,
    writing: bool,
    /// A `disk` waiter needs everything up to here written now.
    urgent_to: u64,
    failure: Option<String>,
    dirty: usize,
}

#[derive(Debug)]
struct State {
    slots: Vec<Slot>,
    free: Vec<usize>,
    logs: Vec<LogState>,
    dirty: usize,
    admission: Admission,
    appends_waited: u64,
    bytes_written: u64,
}

/// What the flusher writes next: a prefix of one log's queue.
#[derive(Debug)]
pub struct Work {
    pub log: LogId,
    pub runs: Vec<Arc<Run>>,
    slots: Vec<usize>,
}

impl Work {
    pub fn last_lsn(&self) -> u64 {
        self.runs.last().map_or(0, |r| r.last_lsn())
    }

    pub fn first_lsn(&self) -> u64 {
        self.runs.first().map_or(0, |r| r.first_lsn())
    }

    pub fn bytes(&self) -> usize {
        self.runs.iter().map(|r| r.bytes()).sum()
    }

    pub fn payloads(&self) -> impl Iterator<Item = &[u8]> {
        self.runs.iter().flat_map(|r| r.payloads())
    }
}

/// Writes and syncs a piece of work (a `disk` waiter leading its own round).
type WriteWork<'a> = dyn Fn(&Work) -> Result<(), String> + 'a;

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
}

#[derive(Debug)]
pub struct Pool {
    config: PoolConfig,
    state: Mutex<State>,
    /// Appenders waiting for space.
    space: Condvar,
    /// The flusher waiting for work.
    work: Condvar,
    /// Waiters for durability and for the drain.
    progress: Condvar,
}

impl Pool {
    pub fn new(mut config: PoolConfig) -> Pool {
        assert!(config.buffers > 0 && config.buffer_bytes > RECORD_PREFIX);
        config.dirty_cap = config
            .dirty_cap
            .clamp(RECORD_PREFIX + 1, config.buffers * config.buffer_bytes);
        let slots = (0..config.buffers)
            .map(|_| Slot::Free(Vec::with_capacity(config.buffer_bytes)))
            .collect();
        Pool {
            state: Mutex::new(State {
                slots,
                free: (0..config.buffers).rev().collect(),
                logs: Vec::new(),
                dirty: 0,
                admission: Admission::Open,
                appends_waited: 0,
                bytes_written: 0,
            }),
            config,
            space: Condvar::new(),
            work: Condvar::new(),
            progress: Condvar::new(),
        }
    }

    pub fn config(&self) -> &PoolConfig {
        &self.config
    }

    /// Adds a log whose files end at `last_lsn` (all of it durable). Returns its id.
    pub fn add_log(&self, last_lsn: u64) -> LogId {
        let mut state = lock(&self.state);
        state.logs.push(LogState {
            next_lsn: last_lsn + 1,
            durable_lsn: last_lsn,
            ..LogState::default()
        });
        state.logs.len() - 1
    }

    /// Places `records` in the buffers as one run of LSNs, waiting for space if needed, and
    /// returns the first and last LSN. When this returns the records are acknowledged at
    /// `buffered`: they reach the disk unless the daemon dies first.
    pub fn append(&self, log: LogId, records: &[&[u8]]) -> Result<(u64, u64), PoolError> {
        let max = self.config.max_record_bytes();
        let mut total = 0;
        for record in records {
            if record.len() > max {
                return Err(PoolError::RecordTooLarge {
                    bytes: record.len(),
                    max,
                });
            }
            total += RECORD_PREFIX + record.len();
        }
        if total > self.config.dirty_cap {
            return Err(PoolError::BatchTooLarge {
                bytes: total,
                cap: self.config.dirty_cap,
            });
        }
        let mut state = lock(&self.state);
        let mut waited = false;
        loop {
            match state.admission {
                Admission::Open => {}
                Admission::PowerFailing => return Err(PoolError::PowerFailing),
                Admission::ShuttingDown => return Err(PoolError::ShuttingDown),
            }
            if let Some(failure) = &state.logs[log].failure {
                return Err(PoolError::Failed(failure.clone()));
            }
            if records.is_empty() {
                let last = state.logs[log].next_lsn - 1;
                return Ok((last + 1, last));
            }
            if state.dirty + total <= self.config.dirty_cap && self.fits(&state, log, records) {
                break;
            }
            if !waited {
                waited = true;
                state.appends_waited += 1;
            }
            // Whatever is eligible must go out for space to appear.
            self.work.notify_one();
            state = sync::wait(&self.space, state);
        }
        let first = state.logs[log].next_lsn;
        for record in records {
            self.place(&mut state, log, record);
        }
        state.dirty += total;
        state.logs[log].dirty += total;
        let last = state.logs[log].next_lsn - 1;
        if self.has_eligible(&state, log) {
            self.work.notify_one();
        }
        Ok((first, last))
    }

    /// Whether `records` fit in the log's tail buffer plus the free buffers.
    fn fits(&self, state: &State, log: LogId, records: &[&[u8]]) -> bool {
        let mut room = match state.logs[log].queue.back().map(|&s| &state.slots[s]) {
            Some(Slot::Filling(run)) => self.config.buffer_bytes - run.data.len(),
            _ => 0,
        };
        let mut new_buffers = 0;
        for record in records {
            let need = RECORD_PREFIX + record.len();
            if need <= room {
                room -= need;
            } else {
                new_buffers += 1;
                room = self.config.buffer_bytes - need;
            }
        }
        new_buffers <= state.free.len()
    }

    /// Copies one record into the log's tail buffer, sealing it and opening a free one if it
    /// does not fit. [`Pool::fits`] has guaranteed the free buffer.
    fn place(&self, state: &mut State, log: LogId, record: &[u8]) {
        let need = RECORD_PREFIX + record.len();
        let lsn = state.logs[log].next_lsn;
        let tail = state.logs[log].queue.back().copied();
        let slot = match tail {
            Some(slot) if matches!(&state.slots[slot], Slot::Filling(run) if run.data.len() + need <= self.config.buffer_bytes) => {
                slot
            }
            _ => {
                if let Some(slot) = tail {
                    seal(&mut state.slots[slot]);
                }
                let slot = state.free.pop().expect("fits() found a free buffer");
                let Slot::Free(mut data) =
                    std::mem::replace(&mut state.slots[slot], Slot::Free(Vec::new()))
                else {
                    unreachable!("the free list holds only free slots")
                };
                data.clear();
                state.slots[slot] = Slot::Filling(Run {
                    data,
                    first_lsn: lsn,
                    records: 0,
                    opened_at: Instant::now(),
                });
                state.logs[log].queue.push_back(slot);
                slot
            }
        };
        let Slot::Filling(run) = &mut state.slots[slot] else {
            unreachable!("chosen slot is filling")
        };
        run.data
            .extend_from_slice(&(record.len() as u32).to_le_bytes());
        run.data.extend_from_slice(record);
        run.records += 1;
        if run.data.len() + RECORD_PREFIX >= self.config.buffer_bytes {
            seal(&mut state.slots[slot]);
        }
        state.logs[log].next_lsn = lsn + 1;
    }

    /// The bytes of `log` the flusher could take now (0: none).
    fn eligible_bytes(&self, state: &State, log: LogId, now: Instant) -> usize {
        let entry = &state.logs[log];
        if entry.writing || entry.failure.is_some() {
            return 0;
        }
        let draining = state.admission != Admission::Open;
        let mut bytes = 0;
        for &slot in &entry.queue {
            match &state.slots[slot] {
                Slot::Sealed(run) => bytes += run.data.len(),
                Slot::Filling(run) => {
                    let eligible = draining
                        || run.data.len() >= self.config.write_threshold
                        || entry.urgent_to >= run.first_lsn
                        || now.duration_since(run.opened_at) >= self.config.flush_interval;
                    if eligible {
                        bytes += run.data.len();
                    }
                }
                Slot::Writing(_) | Slot::Free(_) => unreachable!("queue of an idle log"),
            }
        }
        bytes
    }

    fn has_eligible(&self, state: &State, log: LogId) -> bool {
        self.eligible_bytes(state, log, Instant::now()) > 0
    }

    /// Takes the largest eligible run of any log, if there is one.
    fn take_work(&self, state: &mut State) -> Option<Work> {
        let now = Instant::now();
        let (log, bytes) = (0..state.logs.len())
            .map(|log| (log, self.eligible_bytes(state, log, now)))
            .max_by_key(|&(_, bytes)| bytes)?;
        self.take_work_of(state, log, bytes)
    }

    /// Takes the first `bytes` (the eligible ones) of `log`'s queue as one piece of work.
    fn take_work_of(&self, state: &mut State, log: LogId, bytes: usize) -> Option<Work> {
        if bytes == 0 {
            return None;
        }
        let mut work = Work {
            log,
            runs: Vec::new(),
            slots: Vec::new(),
        };
        let mut taken = 0;
        for index in 0..state.logs[log].queue.len() {
            if taken == bytes {
                break;
            }
            let slot = state.logs[log].queue[index];
            let run = match std::mem::replace(&mut state.slots[slot], Slot::Free(Vec::new())) {
                Slot::Filling(run) | Slot::Sealed(run) => Arc::new(run),
                other => unreachable!("queue of an idle log held {other:?}"),
            };
            taken += run.data.len();
            state.slots[slot] = Slot::Writing(Arc::clone(&run));
            work.runs.push(run);
            work.slots.push(slot);
        }
        state.logs[log].writing = true;
        Some(work)
    }

    /// For the flusher: waits until there is work and takes it. Returns `None` once the pool is
    /// shutting down and holds nothing more to write.
    pub fn next_work(&self) -> Option<Work> {
        let mut state = lock(&self.state);
        loop {
            if let Some(work) = self.take_work(&mut state) {
                return Some(work);
            }
            if state.admission == Admission::ShuttingDown && self.drained(&state) {
                return None;
            }
            // Sleep until the oldest unwritten buffer comes due (or an append wakes us).
            let now = Instant::now();
            let due = state
                .slots
                .iter()
                .filter_map(|slot| match slot {
                    Slot::Filling(run) => Some(
                        (run.opened_at + self.config.flush_interval).saturating_duration_since(now),
                    ),
                    _ => None,
                })
                .min()
                .unwrap_or(self.config.flush_interval)
                .max(Duration::from_millis(1));
            state = sync::wait_timeout(&self.work, state, due);
        }
    }

    /// For the flusher: reports the outcome of writing and syncing `work`.
    pub fn complete(&self, work: Work, outcome: Result<(), String>) {
        let Work { log, runs, slots } = work;
        let last = runs.last().map_or(0, |r| r.last_lsn());
        let bytes: usize = runs.iter().map(|r| r.data.len()).sum();
        drop(runs);
        let mut state = lock(&self.state);
        state.logs[log].writing = false;
        match outcome {
            Ok(()) => {
                for slot in slots {
                    let front = state.logs[log].queue.pop_front();
                    debug_assert_eq!(front, Some(slot));
                    free_slot(&mut state, slot, self.config.buffer_bytes);
                }
                let entry = &mut state.logs[log];
                entry.durable_lsn = entry.durable_lsn.max(last);
                entry.dirty -= bytes;
                state.dirty -= bytes;
                state.bytes_written += bytes as u64;
            }
            Err(failure) => {
                // Fail stop: the records of this log in memory can no longer reach its files in
                // order, so drop them all and refuse everything after.
                let queue: Vec<usize> = state.logs[log].queue.drain(..).collect();
                for slot in queue {
                    free_slot(&mut state, slot, self.config.buffer_bytes);
                }
                let dropped = std::mem::take(&mut state.logs[log].dirty);
                state.dirty -= dropped;
                state.logs[log].failure = Some(failure);
            }
        }
        self.space.notify_all();
        self.progress.notify_all();
        // Another log (or this one) may have become eligible meanwhile; the flusher is the
        // caller, so it will look again without being woken.
    }

    /// Waits until every record of `log` up to `lsn` is written and synced (a `disk` commit),
    /// leaving the writing to the flusher.
    pub fn wait_durable(&self, log: LogId, lsn: u64) -> Result<(), PoolError> {
        self.wait_durable_with(log, lsn, None)
    }

    /// Like [`Pool::wait_durable`], but when nobody is writing `log` the caller writes it
    /// itself with `write` (and reports through [`Pool::complete`]), as a group-commit leader
    /// does: a `disk` commit then costs no hand-off to the flusher thread and back, which on
    /// virtual CPUs is two wake-ups of ~60 us. Everything eligible of the log goes in the same
    /// write and sync, so concurrent `disk` waiters still share one fdatasync.
    pub fn wait_durable_leading(
        &self,
        log: LogId,
        lsn: u64,
        write: impl Fn(&Work) -> Result<(), String>,
    ) -> Result<(), PoolError> {
        self.wait_durable_with(log, lsn, Some(&write))
    }

    fn wait_durable_with(
        &self,
        log: LogId,
        lsn: u64,
        write: Option<&WriteWork<'_>>,
    ) -> Result<(), PoolError> {
        let mut state = lock(&self.state);
        loop {
            let entry = &mut state.logs[log];
            if let Some(failure) = &entry.failure {
                return Err(PoolError::Failed(failure.clone()));
            }
            if lsn <= entry.durable_lsn {
                return Ok(());
            }
            if lsn >= entry.next_lsn {
                return Err(PoolError::NotAppended {
                    lsn,
                    next: entry.next_lsn,
                });
            }
            if lsn > entry.urgent_to {
                entry.urgent_to = lsn;
                self.work.notify_one();
            }
            if let Some(write) = write.filter(|_| !state.logs[log].writing) {
                let bytes = self.eligible_bytes(&state, log, Instant::now());
                if let Some(work) = self.take_work_of(&mut state, log, bytes) {
                    drop(state);
                    let outcome = write(&work);
                    self.complete(work, outcome);
                    state = lock(&self.state);
                    continue;
                }
            }
            state = sync::wait(&self.progress, state);
        }
    }

    /// Reads records of `log` from `from` on, if they are still only in the buffers.
    pub fn read(&self, log: LogId, from: u64, max_records: usize, max_bytes: usize) -> PoolRead {
        let state = lock(&self.state);
        let entry = &state.logs[log];
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
            for (lsn, payload) in (run.first_lsn..).zip(run.payloads()) {
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
        (state.logs[log].next_lsn, state.logs[log].durable_lsn)
    }

    pub fn log_dirty_bytes(&self, log: LogId) -> usize {
        lock(&self.state).logs[log].dirty
    }

    pub fn log_failure(&self, log: LogId) -> Option<String> {
        lock(&self.state).logs[log].failure.clone()
    }

    pub fn stats(&self) -> PoolStats {
        let state = lock(&self.state);
        PoolStats {
            dirty_bytes: state.dirty,
            free_buffers: state.free.len(),
            appends_waited: state.appends_waited,
            bytes_written: state.bytes_written,
        }
    }

    pub fn admission(&self) -> Admission {
        lock(&self.state).admission
    }

    /// Stops admitting appends (waiting ones fail), makes every buffer eligible, and returns the
    /// dirty bytes at that moment: what the drain has to write.
    pub fn begin_drain(&self, admission: Admission) -> usize {
        let mut state = lock(&self.state);
        // Shutting down outranks a power failure: once exiting, power-restore cannot reopen.
        if state.admission != Admission::ShuttingDown {
            state.admission = admission;
        }
        self.space.notify_all();
        self.work.notify_all();
        state.dirty
    }

    /// Admits appends again after a power failure (not after shutdown).
    pub fn reopen(&self) -> bool {
        let mut state = lock(&self.state);
        if state.admission == Admission::PowerFailing {
            state.admission = Admission::Open;
            true
        } else {
            false
        }
    }

    /// Waits until nothing dirty is left (every log written, or failed and dropped).
    pub fn wait_drained(&self) {
        let mut state = lock(&self.state);
        while !self.drained(&state) {
            self.work.notify_one();
            state = sync::wait(&self.progress, state);
        }
    }

    fn drained(&self, state: &State) -> bool {
        state.dirty == 0 && state.logs.iter().all(|l| !l.writing)
    }
}

/// Moves a filling buffer to sealed (it takes no more records).
fn seal(slot: &mut Slot) {
    if let Slot::Filling(_) = slot {
        let Slot::Filling(run) = std::mem::replace(slot, Slot::Free(Vec::new())) else {
            unreachable!()
        };
        *slot = Slot::Sealed(run);
    }
}

/// Returns a slot to the free list, reusing its allocation when nobody else holds it.
fn free_slot(state: &mut State, slot: usize, buffer_bytes: usize) {
    let data = match std::mem::replace(&mut state.slots[slot], Slot::Free(Vec::new())) {
        Slot::Writing(run) => Arc::try_unwrap(run)
            .map(|run| run.data)
            .unwrap_or_else(|_| Vec::with_capacity(buffer_bytes)),
        Slot::Filling(run) | Slot::Sealed(run) => run.data,
        Slot::Free(data) => data,
    };
    state.slots[slot] = Slot::Free(data);
    state.free.push(slot);
}
