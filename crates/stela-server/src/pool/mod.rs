//! The RapiLog buffer pool (paper sections 3.2 and 4.2): a fixed set of equal buffers that hold
//! acknowledged records, already framed in the on-disk format, until a flusher has written and
//! synced them. It is the daemon's one LSN authority and the one place that decides where each
//! byte goes in the segment files.
//!
//! It owns every acknowledged-but-not-durable byte in the daemon, and keeps these invariants:
//! - **One numbering, one set of bytes.** A record is framed here (`stela_format::frame`), under
//!   the LSN assigned here, at the segment and offset chosen here; the flusher writes those bytes
//!   unchanged. A log's records get consecutive LSNs, and a batch's are contiguous (space for the
//!   whole batch is found before any of it is placed).
//! - **Bounded.** Dirty bytes (acknowledged, not yet fdatasync'ed) never exceed `dirty_cap` and
//!   never more than `buffers` buffers exist. Below that, the live cap ([`Pool::set_live_cap`],
//!   kept by [`crate::cap`]) admits a batch only if the dirty bytes stay within it, or if
//!   nothing is dirty (so a batch larger than a shrunk cap still goes, alone). An append that does not fit is refused with
//!   [`PoolError::NoSpace`] and retried by its caller after a completion frees space: nothing is
//!   dropped, nothing grows memory, and no caller blocks the daemon's event loop.
//! - **Sequential runs.** A buffer holds one contiguous run of one log's frames within one
//!   segment, so writing it is one sequential write at a known offset.
//! - **In order per log.** A log's runs are written strictly in LSN order, one piece of work at
//!   a time, so a crash never leaves a hole before valid records. Across logs the largest
//!   eligible run goes first, as in the paper.
//! - **Torn writes are recognisable.** Every frame carries the offset below which its segment was
//!   synced when it was framed (its sync base), so recovery can tell a torn last write from
//!   corruption (`docs/FORMAT.md`).
//! - **Fail stop.** When a log's write or sync fails its records are dropped from memory, the log
//!   refuses every later call, and every waiter is told; nothing retries the same file. A full
//!   disk met while creating a segment is not a failed write: the records stay, appends are
//!   refused with `DiskFull`, and the creation is retried later (a new file each time).
//! - **`DiskFull` places nothing.** It is answered only to an append refused before any of
//!   its records got an LSN; a `disk` wait on records already placed is never ended by a full
//!   disk (they will be written, at their LSNs, once space returns): it waits for space, as a
//!   `replicated` wait waits for the standby. So a client that retries after `DiskFull` never
//!   writes a record twice (issue 54, finding 7).
//!
//! A buffer becomes eligible for writing once it is sealed, holds `write_threshold` bytes (one
//! disk block: RapiLog never writes partial blocks when it can wait), is older than
//! `flush_interval`, is needed by a `disk` waiter, or the daemon is draining (power failure,
//! shutdown, closing the log). No I/O happens here: a flusher takes [`Work`], writes it and
//! reports back with [`Pool::complete`], which hands back the `disk` waiters it satisfied.
//! When a log's next round starts under concurrent `disk` commits is [`gather`]'s decision.

mod gather;
mod view;

pub use view::{PoolRead, PoolStats, Ship};

use crate::sync::{self, lock, Arc, Condvar, Mutex};
use std::collections::VecDeque;
use std::time::{Duration, Instant};
use stela_format::frame;
use stela_format::header::HEADER_BYTES as SEGMENT_HEADER_BYTES;
use stela_format::Lsn;

/// A log's index in the pool. Never reused while the daemon runs.
pub type LogId = usize;

/// Why a log cannot be written: what the flusher reported.
// The failure itself is shared data, not a synchronisation point: std's Arc even under loom.
pub type Failure = std::sync::Arc<stela_wal::Error>;

/// How long a log whose next segment could not be created for lack of space waits before the
/// next attempt.
pub const DISK_FULL_RETRY: Duration = Duration::from_secs(1);

#[derive(Clone, Debug)]
pub struct PoolConfig {
    pub buffers: usize,
    pub buffer_bytes: usize,
    /// Most dirty bytes allowed at once (at most `buffers * buffer_bytes`).
    pub dirty_cap: usize,
    pub write_threshold: usize,
    pub flush_interval: Duration,
}

/// Where a log's files stand when it joins the pool (from `stela_wal::files::LogFiles`).
#[derive(Clone, Copy, Debug)]
pub struct LogSetup {
    /// The first LSN not in the files.
    pub next_lsn: u64,
    /// First LSN of the newest segment, its capacity, where the next frame goes in it, and
    /// how far it is synced.
    pub segment_start: u64,
    pub capacity: u64,
    pub write_offset: u64,
    pub durable_offset: u64,
    /// Capacity of the segments created from now on.
    pub segment_bytes: u64,
}

/// A payload and its CRC32C, computed by the caller outside the pool's lock (for a record
/// copied out of a shared-memory ring: over the daemon's private copy).
#[derive(Clone, Copy, Debug)]
pub struct Record<'a> {
    pub payload: &'a [u8],
    pub crc: u32,
}

impl<'a> Record<'a> {
    pub fn new(payload: &'a [u8]) -> Record<'a> {
        Record {
            payload,
            crc: crc32c::crc32c(payload),
        }
    }
}

#[derive(Clone, Debug, thiserror::Error)]
pub enum PoolError {
    #[error("no buffer space now; retry after the next write completes")]
    NoSpace,
    #[error("record of {bytes} bytes is larger than the daemon's limit of {max} bytes")]
    RecordTooLarge { bytes: usize, max: usize },
    #[error("batch of {bytes} bytes is larger than the dirty cap of {cap} bytes; send it in smaller appends")]
    BatchTooLarge { bytes: usize, cap: usize },
    #[error("a power failure was announced: writes are refused until power-restore or a restart")]
    PowerFailing,
    #[error("the daemon is shutting down")]
    ShuttingDown,
    #[error("the log is being closed")]
    Closed,
    /// A `replicated` wait ended without an answer: this primary learned of a newer term (or
    /// stepped down), so whether the record survives is for the new primary's history to say.
    #[error("commit in doubt: {0}")]
    InDoubt(String),
    /// A `replicated` (or `all`) wait answered by a policy that runs without a standby: the
    /// record is appended and held by this primary alone.
    #[error("not replicated: {0}")]
    Unprotected(String),
    #[error("the log stopped after a failed write or sync: {0}")]
    Failed(Failure),
    #[error("the disk is full: {0}; appends are refused until a new segment can be created")]
    DiskFull(Failure),
    #[error("a switchover is handing this primary's epoch to another node")]
    HandingOver,
    #[error("LSN {lsn} has not been appended (next is {next})")]
    NotAppended { lsn: u64, next: u64 },
    #[error("no LSNs left: the next is {next} and {records} records were appended")]
    LsnExhausted { next: u64, records: usize },
}

/// Whether appends are admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    Open,
    PowerFailing,
    ShuttingDown,
    /// A planned switchover: appends refused while the standbys catch up
    /// ([`Pool::hand_over`]).
    HandingOver,
}

/// A run of one log's frames in one buffer, all in one segment.
#[derive(Debug)]
pub struct Run {
    data: Vec<u8>,
    /// First LSN of the segment the run belongs to, and the file offset of `data[0]` in it.
    segment: u64,
    offset: u64,
    first_lsn: u64,
    records: u64,
    opened_at: Instant,
}

impl Run {
    /// The framed bytes, exactly as they go to the file.
    pub fn bytes(&self) -> &[u8] {
        &self.data
    }

    pub fn segment(&self) -> u64 {
        self.segment
    }

    pub fn offset(&self) -> u64 {
        self.offset
    }

    pub fn first_lsn(&self) -> u64 {
        self.first_lsn
    }

    pub fn last_lsn(&self) -> u64 {
        self.first_lsn + self.records - 1
    }
}

#[derive(Debug)]
enum Slot {
    Free(Vec<u8>),
    /// The tail of its log's run; takes more records.
    Filling(Run),
    /// Full (or its segment ended); waits for a flusher.
    Sealed(Run),
    /// Handed to a flusher; still readable until written.
    Writing(Arc<Run>),
}

/// Where the next frame of a log goes.
#[derive(Clone, Copy, Debug)]
struct Place {
    segment: u64,
    offset: u64,
    capacity: u64,
}

#[derive(Debug)]
struct LogState<W> {
    next_lsn: u64,
    /// Written and fdatasync'ed.
    durable_lsn: u64,
    place: Place,
    /// The newest segment with synced records, and how far: the sync base of new frames in it.
    synced: (u64, u64),
    segment_bytes: u64,
    max_payload: usize,
    /// This log's slots in LSN order; only the last may be `Filling`.
    queue: VecDeque<usize>,
    writing: bool,
    /// A `disk` waiter needs everything up to here written now.
    urgent_to: u64,
    failure: Option<Failure>,
    /// The disk was full when a segment had to be created: when to try again, and whether a
    /// A drain does not wait for it: space may never come.
    disk_full: Option<(Instant, Failure)>,
    closing: bool,
    dirty: usize,
    /// `disk` waiters: (LSN, who to tell).
    waiters: Vec<(u64, W)>,
    gather: gather::Gathering,
}

#[derive(Debug)]
struct State<W> {
    slots: Vec<Slot>,
    free: Vec<usize>,
    logs: Vec<Option<LogState<W>>>,
    dirty: usize,
    admission: Admission,
    /// Some append was refused with `NoSpace` since space was last freed.
    space_wanted: bool,
    appends_waited: u64,
    bytes_written: u64,
    writes: u64,
    /// Flushers asleep in `next_work`, and threads asleep in `wait_drained`: only they need a
    /// wake-up call (each costs a system call, asleep or not).
    idle_flushers: usize,
    /// A sleeping flusher was called and has not looked yet: it takes what is there and calls
    /// another if more is left, so a second call would only wake one to find nothing.
    flusher_called: bool,
    drain_waiters: usize,
    /// The live cap: at most `dirty_cap`.
    live_cap: usize,
}

/// What a flusher writes next: a prefix of one log's queue.
#[derive(Debug)]
pub struct Work {
    pub log: LogId,
    pub runs: Vec<Arc<Run>>,
    slots: Vec<usize>,
}

/// How writing a piece of work ended.
#[derive(Debug)]
pub enum Outcome {
    /// Every run is written and fdatasync'ed.
    Durable,
    /// The first `synced` runs are durable; the next needed a new segment, which could not be
    /// created for lack of space. The rest stays in memory and is tried again later.
    DiskFull { synced: usize, error: Failure },
    /// A write or sync failed: the log stops.
    Failed(Failure),
}

/// What a completion releases: the `disk` waiters it settled, and whether appends refused with
/// `NoSpace` should be retried.
#[derive(Debug)]
pub struct Released<W> {
    pub waiters: Vec<(W, Result<(), PoolError>)>,
    pub space_freed: bool,
    /// The work ended durable and the log has nothing more queued and nobody waiting: no next
    /// frame will soon carry this sync's end as its sync base, so the flusher has the log's
    /// synced-end mark written (off the commit path; `stela_wal::synced`).
    pub idle: bool,
}

/// The pool; `W` is whoever a `disk` waiter is (a connection's request, a ring's entry).
#[derive(Debug)]
pub struct Pool<W> {
    config: PoolConfig,
    state: Mutex<State<W>>,
    /// Flushers waiting for work.
    work: Condvar,
    /// A flusher gathering committers ([`gather`]): its own, so an append's wake-up for an
    /// idle flusher is never taken by it.
    gathered: Condvar,
    /// Blocking waiters: for the drain, for a log to be written out.
    progress: Condvar,
}

/// What placing one frame does to a log's position: whether it starts a new segment and a new
/// buffer. [`Pool::fits`] and [`Pool::place`] both follow these steps, so the check and the
/// placement cannot disagree.
struct Cursor {
    place: Place,
    /// Bytes left in the buffer the next frame would go into (0: a new buffer is needed).
    room: usize,
}

impl Cursor {
    /// Advances past a frame of `len` bytes; returns (new segment, new buffer).
    fn step(&mut self, len: usize, buffer_bytes: usize, segment_bytes: u64) -> (bool, bool) {
        let new_segment = self.place.offset + len as u64 > self.place.capacity;
        if new_segment {
            self.place.offset = SEGMENT_HEADER_BYTES as u64;
            self.place.capacity = segment_bytes;
            self.room = 0;
        }
        let new_buffer = len > self.room;
        if new_buffer {
            self.room = buffer_bytes;
        }
        self.room -= len;
        self.place.offset += len as u64;
        (new_segment, new_buffer)
    }
}

impl<W> Pool<W> {
    pub fn new(mut config: PoolConfig) -> Pool<W> {
        assert!(config.buffers > 0 && config.buffer_bytes > frame::HEADER_BYTES);
        config.dirty_cap = config.dirty_cap.clamp(
            frame::HEADER_BYTES + 1,
            config.buffers * config.buffer_bytes,
        );
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
                space_wanted: false,
                appends_waited: 0,
                idle_flushers: 0,
                flusher_called: false,
                drain_waiters: 0,
                bytes_written: 0,
                writes: 0,
                live_cap: config.dirty_cap,
            }),
            config,
            work: Condvar::new(),
            gathered: Condvar::new(),
            progress: Condvar::new(),
        }
    }

    /// Adds a log positioned where its files end. Returns its id.
    pub fn add_log(&self, setup: LogSetup) -> LogId {
        // A frame must fit one buffer, the cap, and a fresh segment after its header.
        let room = (self.config.buffer_bytes.min(self.config.dirty_cap) as u64)
            .min(setup.segment_bytes - SEGMENT_HEADER_BYTES as u64);
        let max_payload = room.saturating_sub(frame::HEADER_BYTES as u64) as usize;
        let mut state = lock(&self.state);
        state.logs.push(Some(LogState {
            next_lsn: setup.next_lsn,
            durable_lsn: setup.next_lsn - 1,
            place: Place {
                segment: setup.segment_start,
                offset: setup.write_offset,
                capacity: setup.capacity,
            },
            synced: (setup.segment_start, setup.durable_offset),
            segment_bytes: setup.segment_bytes,
            max_payload,
            queue: VecDeque::new(),
            writing: false,
            urgent_to: 0,
            failure: None,
            disk_full: None,
            closing: false,
            dirty: 0,
            waiters: Vec::new(),
            gather: gather::Gathering::default(),
        }));
        state.logs.len() - 1
    }

    /// Frames `records` into the buffers as one run of LSNs and returns the first and last
    /// LSN, or refuses. When this returns `Ok` the records are acknowledged at `buffered`: they
    /// reach the disk unless the daemon dies first. `NoSpace` leaves nothing placed.
    pub fn try_append(&self, log: LogId, records: &[Record<'_>]) -> Result<(u64, u64), PoolError> {
        let mut state = lock(&self.state);
        match state.admission {
            Admission::Open => {}
            Admission::PowerFailing => return Err(PoolError::PowerFailing),
            Admission::ShuttingDown => return Err(PoolError::ShuttingDown),
            Admission::HandingOver => return Err(PoolError::HandingOver),
        }
        let entry = log_mut(&mut state, log);
        if let Some(failure) = &entry.failure {
            return Err(PoolError::Failed(Failure::clone(failure)));
        }
        if let Some((_, failure)) = &entry.disk_full {
            return Err(PoolError::DiskFull(Failure::clone(failure)));
        }
        if entry.closing {
            return Err(PoolError::Closed);
        }
        let mut total = 0;
        for record in records {
            if record.payload.len() > entry.max_payload {
                return Err(PoolError::RecordTooLarge {
                    bytes: record.payload.len(),
                    max: entry.max_payload,
                });
            }
            total += frame::HEADER_BYTES + record.payload.len();
        }
        let next = entry.next_lsn;
        if records.is_empty() {
            return Ok((next, next - 1));
        }
        if next
            .checked_add(records.len() as u64 - 1)
            .is_none_or(|last| last > Lsn::MAX.get())
        {
            return Err(PoolError::LsnExhausted {
                next,
                records: records.len(),
            });
        }
        if total > self.config.dirty_cap {
            return Err(PoolError::BatchTooLarge {
                bytes: total,
                cap: self.config.dirty_cap,
            });
        }
        let over_live =
            state.dirty > 0 && state.dirty + total > state.live_cap && over_live_cap(&state, total);
        if over_live
            || state.dirty + total > self.config.dirty_cap
            || !self.fits(&state, log, records)
        {
            state.appends_waited += 1;
            state.space_wanted = true;
            // Whatever is eligible must go out for space to appear.
            self.wake_flusher(&mut state);
            return Err(PoolError::NoSpace);
        }
        for record in records {
            self.place(&mut state, log, record);
        }
        state.dirty += total;
        debug_assert!(state.dirty <= self.config.dirty_cap);
        log_mut(&mut state, log).dirty += total;
        if self.eligible_bytes(&state, log, Instant::now()) > 0 {
            self.wake_flusher(&mut state);
        }
        Ok((next, next + records.len() as u64 - 1))
    }

    /// Sets the live cap (clamped to `dirty_cap`); dirty bytes above it stay and are flushed.
    pub fn set_live_cap(&self, bytes: usize) {
        lock(&self.state).live_cap = bytes.clamp(frame::HEADER_BYTES + 1, self.config.dirty_cap);
    }

    fn cursor(&self, state: &State<W>, log: LogId) -> Cursor {
        let entry = log_ref(state, log);
        let room = match entry.queue.back().map(|&s| &state.slots[s]) {
            Some(Slot::Filling(run)) => self.config.buffer_bytes - run.data.len(),
            _ => 0,
        };
        Cursor {
            place: entry.place,
            room,
        }
    }

    /// Whether `records` fit in the log's tail buffer plus the free buffers.
    fn fits(&self, state: &State<W>, log: LogId, records: &[Record<'_>]) -> bool {
        let segment_bytes = log_ref(state, log).segment_bytes;
        let mut cursor = self.cursor(state, log);
        let new_buffers = records
            .iter()
            .filter(|r| {
                let len = frame::HEADER_BYTES + r.payload.len();
                cursor.step(len, self.config.buffer_bytes, segment_bytes).1
            })
            .count();
        new_buffers <= state.free.len()
    }

    /// Frames one record into the log's tail buffer, sealing it and opening a free one when
    /// the frame does not fit or starts a new segment. [`Pool::fits`] has guaranteed the
    /// buffer.
    fn place(&self, state: &mut State<W>, log: LogId, record: &Record<'_>) {
        let len = frame::HEADER_BYTES + record.payload.len();
        let mut cursor = self.cursor(state, log);
        let at = cursor.place;
        let entry = log_ref(state, log);
        let segment_bytes = entry.segment_bytes;
        let lsn = entry.next_lsn;
        let (new_segment, new_buffer) = cursor.step(len, self.config.buffer_bytes, segment_bytes);
        let (segment, offset) = if new_segment {
            (lsn, SEGMENT_HEADER_BYTES as u64)
        } else {
            (at.segment, at.offset)
        };
        let tail = log_ref(state, log).queue.back().copied();
        let slot = if new_buffer {
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
                segment,
                offset,
                first_lsn: lsn,
                records: 0,
                opened_at: Instant::now(),
            });
            log_mut(state, log).queue.push_back(slot);
            slot
        } else {
            tail.expect("a frame that needs no new buffer goes into the tail")
        };
        let entry = log_mut(state, log);
        // Frames in a segment nothing has been synced in yet get the header's end as base.
        let sync_base = if entry.synced.0 == segment {
            entry.synced.1
        } else {
            SEGMENT_HEADER_BYTES as u64
        };
        entry.next_lsn = lsn + 1;
        entry.place = Place {
            segment,
            offset: offset + len as u64,
            capacity: cursor.place.capacity,
        };
        let Slot::Filling(run) = &mut state.slots[slot] else {
            unreachable!("the chosen slot is filling")
        };
        frame::encode_with_crc(
            &mut run.data,
            Lsn::new(lsn),
            record.payload,
            record.crc,
            sync_base as u32,
        );
        run.records += 1;
        if run.data.len() + frame::HEADER_BYTES >= self.config.buffer_bytes {
            seal(&mut state.slots[slot]);
        }
    }

    /// The bytes of `log` a flusher could take now (0: none).
    fn eligible_bytes(&self, state: &State<W>, log: LogId, now: Instant) -> usize {
        let Some(entry) = state.logs[log].as_ref() else {
            return 0;
        };
        if entry.writing || entry.gather.active || entry.failure.is_some() {
            return 0;
        }
        let draining = state.admission != Admission::Open || entry.closing;
        if entry.disk_full.as_ref().is_some_and(|d| now < d.0) {
            return 0;
        }
        let mut bytes = 0;
        for &slot in &entry.queue {
            match &state.slots[slot] {
                Slot::Sealed(run) => bytes += run.data.len(),
                Slot::Filling(run) => {
                    // Appends waiting for space need every buffer that can go to go.
                    let eligible = draining
                        || state.space_wanted
                        || run.data.len() >= self.config.write_threshold
                        || entry.urgent_to >= run.first_lsn
                        || entry.disk_full.is_some()
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

    /// Takes the largest eligible run of any log, if there is one.
    fn take_work(&self, state: &mut State<W>) -> Option<Work> {
        let now = Instant::now();
        let (log, bytes) = (0..state.logs.len())
            .map(|log| (log, self.eligible_bytes(state, log, now)))
            .max_by_key(|&(_, bytes)| bytes)?;
        if bytes == 0 {
            return None;
        }
        let mut work = Work {
            log,
            runs: Vec::new(),
            slots: Vec::new(),
        };
        let mut taken = 0;
        let queue: Vec<usize> = log_ref(state, log).queue.iter().copied().collect();
        for slot in queue {
            if taken == bytes {
                break;
            }
            let run = match std::mem::replace(&mut state.slots[slot], Slot::Free(Vec::new())) {
                Slot::Filling(run) | Slot::Sealed(run) => Arc::new(run),
                other => unreachable!("queue of an idle log held {other:?}"),
            };
            taken += run.data.len();
            state.slots[slot] = Slot::Writing(Arc::clone(&run));
            work.runs.push(run);
            work.slots.push(slot);
        }
        log_mut(state, log).writing = true;
        log_mut(state, log).gather.round_started(now);
        Some(work)
    }

    /// For a flusher: waits until there is work and takes it. Returns `None` once the pool is
    /// shutting down and holds nothing more it can write.
    pub fn next_work(&self) -> Option<Work> {
        let mut state = lock(&self.state);
        loop {
            state = self.gather_if_due(state);
            if let Some(work) = self.take_work(&mut state) {
                // More may be waiting for another flusher (another log).
                if (0..state.logs.len()).any(|l| self.eligible_bytes(&state, l, Instant::now()) > 0)
                {
                    self.wake_flusher(&mut state);
                }
                return Some(work);
            }
            if state.admission == Admission::ShuttingDown && self.drained(&state) {
                // Wake the other flushers so they see it too.
                self.work.notify_all();
                return None;
            }
            // Sleep until the oldest unwritten buffer or a disk-full retry comes due (or an
            // append wakes us).
            let now = Instant::now();
            let buffer_due = state.slots.iter().filter_map(|slot| match slot {
                Slot::Filling(run) => Some(run.opened_at + self.config.flush_interval),
                _ => None,
            });
            let retry_due = state
                .logs
                .iter()
                .flatten()
                .filter_map(|l| l.disk_full.as_ref().map(|d| d.0));
            let due = buffer_due
                .chain(retry_due)
                .min()
                .map_or(self.config.flush_interval, |at| {
                    at.saturating_duration_since(now)
                })
                .max(Duration::from_millis(1));
            state.idle_flushers += 1;
            state = sync::wait_timeout(&self.work, state, due);
            state.idle_flushers -= 1;
            state.flusher_called = false;
        }
    }

    /// For a flusher: reports how writing `work` ended, and hands back what that releases.
    pub fn complete(&self, work: Work, outcome: Outcome) -> Released<W> {
        let Work { log, runs, slots } = work;
        let mut state = lock(&self.state);
        let mut released = Vec::new();
        let synced = match &outcome {
            Outcome::Durable => runs.len(),
            Outcome::DiskFull { synced, .. } => *synced,
            Outcome::Failed(_) => 0,
        };
        let freed_any = synced > 0 || matches!(outcome, Outcome::Failed(_));
        // The synced prefix: its buffers go back, its waiters are told. The work's references
        // to the runs go first, so each buffer's allocation is reused, not replaced.
        let end = runs[..synced].last().map(|last| {
            (
                last.last_lsn(),
                last.segment,
                last.offset + last.data.len() as u64,
            )
        });
        let bytes: usize = runs[..synced].iter().map(|r| r.data.len()).sum();
        drop(runs);
        if let Some((last_lsn, segment, offset)) = end {
            for &slot in &slots[..synced] {
                let front = log_mut(&mut state, log).queue.pop_front();
                debug_assert_eq!(front, Some(slot));
                free_slot(&mut state, slot, self.config.buffer_bytes);
            }
            let entry = log_mut(&mut state, log);
            entry.durable_lsn = entry.durable_lsn.max(last_lsn);
            entry.synced = (segment, offset);
            entry.dirty -= bytes;
            let durable = entry.durable_lsn;
            let (done, waiting) = std::mem::take(&mut entry.waiters)
                .into_iter()
                .partition::<Vec<_>, _>(|(lsn, _)| *lsn <= durable);
            entry.waiters = waiting;
            entry.gather.round_done(done.len());
            released.extend(done.into_iter().map(|(_, w)| (w, Ok(()))));
            state.dirty -= bytes;
            state.bytes_written += bytes as u64;
            state.writes += 1;
        }
        let entry = log_mut(&mut state, log);
        entry.writing = false;
        let idle = matches!(outcome, Outcome::Durable)
            && entry.queue.is_empty()
            && entry.waiters.is_empty();
        match outcome {
            Outcome::Durable => entry.disk_full = None,
            Outcome::DiskFull { error, .. } => {
                // The rest goes back to the front of the queue, as it was: same bytes, same
                // offsets, written once a segment can be created.
                entry.disk_full = Some((Instant::now() + DISK_FULL_RETRY, error));
                for &slot in &slots[synced..] {
                    let Slot::Writing(run) =
                        std::mem::replace(&mut state.slots[slot], Slot::Free(Vec::new()))
                    else {
                        unreachable!("work slots are writing")
                    };
                    let run = Arc::try_unwrap(run).expect("the flusher gave its runs back");
                    state.slots[slot] = Slot::Sealed(run);
                }
                // Waiters of this log keep waiting: their records are placed and will be
                // written at their LSNs once space returns, so `DiskFull` would be a refusal
                // of records that are in fact kept (a client retrying would write them twice).
            }
            Outcome::Failed(failure) => {
                // Fail stop: the records of this log in memory can no longer reach its files in
                // order, so drop them all and refuse everything after.
                let queue: Vec<usize> = entry.queue.drain(..).collect();
                let dropped = std::mem::take(&mut entry.dirty);
                entry.failure = Some(Failure::clone(&failure));
                let waiters = std::mem::take(&mut entry.waiters);
                for slot in queue {
                    free_slot(&mut state, slot, self.config.buffer_bytes);
                }
                state.dirty -= dropped;
                released.extend(
                    waiters
                        .into_iter()
                        .map(|(_, w)| (w, Err(PoolError::Failed(Failure::clone(&failure))))),
                );
            }
        }
        let space_freed = freed_any && std::mem::take(&mut state.space_wanted);
        if state.drain_waiters > 0 {
            self.progress.notify_all();
        }
        // The caller, a flusher, looks for more work next, and wakes another if there is more.
        Released {
            waiters: released,
            space_freed,
            idle,
        }
    }

    /// Registers `waiter` to be released once every record of `log` up to `lsn` is durable.
    /// Returns it back at once (`Ok(Some)`) if that is already so, keeps it (`Ok(None)`), or
    /// refuses with the reason.
    pub fn when_durable(
        &self,
        log: LogId,
        lsn: u64,
        waiter: W,
    ) -> Result<Option<W>, (W, PoolError)> {
        let mut state = lock(&self.state);
        let entry = log_mut(&mut state, log);
        if let Some(failure) = &entry.failure {
            return Err((waiter, PoolError::Failed(Failure::clone(failure))));
        }
        if lsn <= entry.durable_lsn {
            return Ok(Some(waiter));
        }
        let next = entry.next_lsn;
        if lsn >= next {
            return Err((waiter, PoolError::NotAppended { lsn, next }));
        }
        // A full disk does not end the wait (see "`DiskFull` places nothing" above): the
        // records up to `lsn` are placed and are written once a segment can be created.
        entry.waiters.push((lsn, waiter));
        // A flusher writing this log takes the rest when it is done; one gathering committers
        // for it is told by `note_waiter`.
        let wake = lsn > entry.urgent_to && !entry.writing && !entry.gather.active;
        entry.urgent_to = entry.urgent_to.max(lsn);
        self.note_waiter(entry);
        if wake {
            self.wake_flusher(&mut state);
        }
        Ok(None)
    }

    /// Stops taking appends for `log` and makes all of it eligible; then a wait for its last
    /// LSN ([`Pool::when_durable`]) and [`Pool::remove_log`] close it.
    pub fn close_log(&self, log: LogId) -> u64 {
        let mut state = lock(&self.state);
        let entry = log_mut(&mut state, log);
        entry.closing = true;
        let last = entry.next_lsn - 1;
        self.work.notify_all();
        last
    }

    /// Forgets a closed log once nothing of it is left in memory; `false` if something is.
    pub fn remove_log(&self, log: LogId) -> bool {
        let mut state = lock(&self.state);
        let idle = state.logs[log]
            .as_ref()
            .is_some_and(|l| l.closing && !l.writing && l.queue.is_empty() && l.waiters.is_empty());
        if idle {
            state.logs[log] = None;
        }
        idle
    }

    /// Stops admitting appends, makes every buffer eligible, and returns the dirty bytes at
    /// that moment: what the drain has to write.
    pub fn begin_drain(&self, admission: Admission) -> usize {
        let mut state = lock(&self.state);
        // Shutting down outranks a power failure: once exiting, power-restore cannot reopen.
        if state.admission != Admission::ShuttingDown {
            state.admission = admission;
        }
        self.work.notify_all();
        state.dirty
    }

    /// A planned switchover: with `refusing`, refuses appends from now on (`HandingOver`);
    /// without, admits them again (the switchover was abandoned). Never overrides a power
    /// failure or a shutdown: `false` when nothing changed.
    pub fn hand_over(&self, refusing: bool) -> bool {
        let mut state = lock(&self.state);
        match (state.admission, refusing) {
            (Admission::Open, true) => state.admission = Admission::HandingOver,
            (Admission::HandingOver, false) => state.admission = Admission::Open,
            _ => return false,
        }
        true
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

    /// Waits until nothing dirty is left that can be written: every log written, failed and
    /// dropped, or stuck on a full disk.
    pub fn wait_drained(&self) {
        let mut state = lock(&self.state);
        while !self.drained(&state) {
            self.work.notify_all();
            state.drain_waiters += 1;
            state = sync::wait(&self.progress, state);
            state.drain_waiters -= 1;
        }
    }

    fn drained(&self, state: &State<W>) -> bool {
        state
            .logs
            .iter()
            .flatten()
            .all(|l| !l.writing && (l.dirty == 0 || l.failure.is_some() || l.disk_full.is_some()))
    }
}

/// Whether `total` bytes more would take the dirty bytes that can still be flushed past the
/// live cap. The cap bounds what a flush owes within the power window; a log waiting for space
/// on a full disk, or stopped by a failure, keeps its dirty bytes however the others flush, so
/// they do not count: counted, they held every other log's appends once the cap came down to
/// its floor (a slow flush had lowered it) while one log's disk was full
/// (`tests/disk_full.rs`: the other log's append waited for ever). Called only when the whole
/// count is over the cap, so the logs are walked only then.
fn over_live_cap<W>(state: &State<W>, total: usize) -> bool {
    let mut stuck = 0;
    for l in state.logs.iter().flatten() {
        if l.failure.is_some() || l.disk_full.is_some() {
            stuck += l.dirty;
        }
    }
    debug_assert!(stuck <= state.dirty, "stuck bytes are dirty bytes");
    let flushable = state.dirty - stuck;
    flushable > 0 && flushable + total > state.live_cap
}

fn log_ref<W>(state: &State<W>, log: LogId) -> &LogState<W> {
    state.logs[log]
        .as_ref()
        .expect("a removed log is never used: its handles were released first")
}

fn log_mut<W>(state: &mut State<W>, log: LogId) -> &mut LogState<W> {
    state.logs[log]
        .as_mut()
        .expect("a removed log is never used: its handles were released first")
}

/// Moves a filling buffer to sealed (it takes no more records).
fn seal(slot: &mut Slot) {
    *slot = match std::mem::replace(slot, Slot::Free(Vec::new())) {
        Slot::Filling(run) => Slot::Sealed(run),
        other => other,
    };
}

/// Returns a slot to the free list, reusing its allocation when nobody else holds it.
fn free_slot<W>(state: &mut State<W>, slot: usize, buffer_bytes: usize) {
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
