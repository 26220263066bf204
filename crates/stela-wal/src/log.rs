//! [`Log`]: the untyped log of byte payloads, and the group commit at its heart.
//!
//! How a commit works. Appenders frame their records into one shared in-memory buffer under a
//! short lock (the LSN is assigned there, so buffer order is LSN order). A committer whose record
//! is not yet durable either waits, if a flush is already in progress, or becomes the *leader*:
//! it takes the whole buffer, writes it with one positioned write, calls fdatasync once, and then
//! wakes everyone whose record that covered. While the leader is in fdatasync, new records pile
//! up in the buffer and the next leader takes them all at once, so N concurrent committers cost
//! one fdatasync per round instead of N.
//!
//! The files underneath (the newest segment's writer, the segment list, the directory lock) are
//! [`crate::files`]'s; this module adds the buffer, the numbering and the waiting.
//!
//! Invariants:
//! - At most one flush (write + sync) is in progress (`State::flushing`); only its leader touches
//!   [`Tail`], the open segment.
//! - `durable_lsn <= written_lsn < next_lsn`; all three only grow.
//! - A segment is fdatasync'ed before the first byte is written to its successor, so only the
//!   newest segment can have a torn tail.
//! - Every frame carries the sync base of its segment at framing time: the offset below which
//!   that segment is known durable, which only a *returned* fdatasync moves (a write to the OS
//!   does not), and 256 for a segment that does not exist yet. So no frame claims more durability
//!   than a completed sync gave, which is what lets recovery cut a torn last write without an
//!   operator (see `docs/FORMAT.md`).
//! - The last sync is recorded too: when a durable round leaves nothing pending and nobody
//!   waiting, the log asks for its synced-end mark to be written ([`crate::synced`]), off the
//!   commit path; `close` writes it before it returns.
//! - After a failed write or sync the log is *poisoned*: the error is stored, every waiter and
//!   every later call gets it, and nothing is retried (a retried fdatasync can report success for
//!   data the kernel already dropped).

use crate::error::{Error, Result};
use crate::files::{LogFiles, SegmentSet, SegmentWriter};
use crate::options::{SyncMode, WalOptions};
use crate::reader::RawReader;
use crate::recovery::RecoveryReport;
use crate::segment::SegmentFile;
use crate::synced::SyncedMark;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::task::{Context, Poll, Waker};
use std::thread::Thread;
use std::time::Duration;
use stela_format::header::HEADER_BYTES;
use stela_format::{frame, Codec, Lsn, TypeTag};

/// A write-ahead log of opaque byte records. Cheap to clone; all clones share one log.
#[derive(Clone)]
pub struct Log {
    core: Arc<Core>,
}

struct Core {
    dir: PathBuf,
    options: WalOptions,
    codec: Codec,
    max_record: usize,
    state: Mutex<State>,
    /// Held only by the flush leader.
    tail: Mutex<Tail>,
    /// Every segment; holds the directory lock.
    segments: Arc<SegmentSet>,
    report: RecoveryReport,
    /// The writer's synced-end mark (the writer publishes to it; this asks for it to be written).
    mark: Arc<SyncedMark>,
    async_syncer: OnceLock<Arc<AsyncSyncer>>,
    stats: Counters,
}

struct State {
    next_lsn: Lsn,
    /// Framed records not yet handed to the OS, with the segment boundaries inside them.
    pending: Vec<u8>,
    cuts: Vec<Cut>,
    /// Bytes assigned in the segment new frames go to, counting pending ones: decides rotation.
    fill: u64,
    /// Capacity of that segment: the newest segment's own at open, the configured size for
    /// segments cut since.
    capacity: u64,
    /// Which segment new frames go to, as the number of cuts made since open. The flush that
    /// carries the last cut brings [`Tail::generation`] to the same number.
    generation: u64,
    /// The sync base of new frames: the offset below which their segment is known durable.
    sync_base: u32,
    written_lsn: Lsn,
    durable_lsn: Lsn,
    flushing: bool,
    failure: Option<Arc<Error>>,
    /// Buffer handed back by the last leader, reused to avoid reallocating.
    spare: Vec<u8>,
    /// Threads blocked in `commit` or `flush` while another thread leads a flush.
    waiters: Vec<Arc<Waiter>>,
    /// Committers the last durable round released (they are likely to commit again soon).
    last_round_woken: usize,
    /// Duration of the last fdatasync, in microseconds.
    last_sync_micros: u64,
    /// A leader gathering appends before its round (see [`Log::gather`]): the appender that
    /// brings `next_lsn` to `target` wakes it.
    gatherer: Option<(Thread, Lsn)>,
    async_waiters: Vec<(Lsn, Waker)>,
}

/// A thread waiting for a flush. The leader that ends a flush wakes exactly the waiters it
/// satisfied, plus one unsatisfied waiter to lead the next flush, instead of waking everyone:
/// with dozens of committers on two cores, needless wake-ups cost more than the fdatasync.
struct Waiter {
    lsn: Lsn,
    sync: bool,
    thread: Thread,
    /// `WAITING`, then `SATISFIED` (return without looking at the state again) or `RECHECK`
    /// (lead the next flush, or see the failure).
    signal: AtomicU8,
    /// Satisfied waiters this one must wake once it runs (see [`wake_tree`]).
    chain: Mutex<Vec<Arc<Waiter>>>,
}

const WAITING: u8 = 0;
const SATISFIED: u8 = 1;
const RECHECK: u8 = 2;

impl Waiter {
    fn wake(&self, signal: u8) {
        self.signal.store(signal, Ordering::Release);
        self.thread.unpark();
    }
}

/// Wakes `waiters` as a binary tree: this thread wakes the heads of two halves, and each woken
/// waiter wakes the heads of its own halves before it returns. On a small machine the wake-up
/// system calls are the main cost of a group commit; a tree spreads them over the woken
/// threads (each makes at most two) instead of serialising all of them in the leader.
fn wake_tree(mut waiters: Vec<Arc<Waiter>>) {
    let second = waiters.split_off(waiters.len().div_ceil(2));
    for mut half in [waiters, second] {
        if half.is_empty() {
            continue;
        }
        let head = half.remove(0);
        *lock(&head.chain) = half;
        head.wake(SATISFIED);
    }
}

/// A segment boundary inside the pending buffer: bytes from `at` on go to a new segment whose
/// first record is `start`.
#[derive(Clone, Copy, Debug)]
struct Cut {
    at: usize,
    start: Lsn,
}

/// The open newest segment.
struct Tail {
    writer: SegmentWriter,
    /// Where the next byte goes.
    offset: u64,
    /// Rotations since open (see [`State::generation`]).
    generation: u64,
}

impl Tail {
    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        if bytes.is_empty() {
            return Ok(());
        }
        self.writer.write_at(self.offset, &[bytes])?;
        self.offset += bytes.len() as u64;
        Ok(())
    }
}

/// The sync base a frame stores for a durable offset. Offsets in segments that are written fit
/// (version 2 segments are at most `u32::MAX` bytes); a bigger one can only be the capacity of a
/// full version 1 segment, which no frame goes to.
fn sync_base_of(durable_offset: u64) -> u32 {
    u32::try_from(durable_offset).unwrap_or(u32::MAX)
}

/// Counters of the I/O the log did since it was opened.
#[derive(Debug, Default)]
struct Counters {
    flushes: AtomicU64,
    syncs: AtomicU64,
    bytes_written: AtomicU64,
    last_sync_micros: AtomicU64,
}

/// What the log has done since it was opened: how well group commit is sharing syncs shows as
/// `records / syncs`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogStats {
    /// Writes of the buffer to the OS (one per flush round).
    pub flushes: u64,
    /// fdatasync calls on segments (one per durable round, plus one per segment sealed).
    pub syncs: u64,
    /// Writes of the synced-end mark (`SYNCED`, each with its own fdatasync of that file), the
    /// one open makes included: off the commit path, when the log went idle after a sync.
    pub marks: u64,
    pub bytes_written: u64,
}

/// A ticket for a flush: what the leader took and must publish.
struct Batch {
    bytes: Vec<u8>,
    cuts: Vec<Cut>,
    last_lsn: Lsn,
    sync: bool,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Panics never happen while these locks are held (no user code runs under them), so a
    // poisoned mutex still guards consistent data.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Log {
    /// Opens (or creates) the log in `dir`, holding records of `type_tag` encoded with
    /// `options.codec`, and recovers it. See [`RecoveryReport`] for what recovery did.
    ///
    /// # Errors
    /// [`Error::WrongCodec`] / [`Error::WrongRecordType`] if the log holds something else,
    /// [`Error::Corruption`] for damage (in `Strict` mode), [`Error::Locked`] if another handle
    /// has it open, I/O errors.
    pub fn open(dir: impl AsRef<Path>, options: WalOptions, type_tag: &str) -> Result<Log> {
        Log::open_inner(dir.as_ref(), options, TypeTag::new(type_tag), false)
    }

    pub(crate) fn open_inner(
        dir: &Path,
        options: WalOptions,
        type_tag: TypeTag,
        keep_removed_bytes: bool,
    ) -> Result<Log> {
        let files = LogFiles::open_inner(dir, &options, type_tag, keep_removed_bytes)?;
        let (codec, max_record) = (files.codec(), files.max_record_bytes());
        let LogFiles {
            writer,
            segments,
            next_lsn,
            write_offset,
            durable_offset,
            report,
            ..
        } = files;
        let last = Lsn::new(next_lsn.get() - 1);
        let mark = Arc::clone(writer.synced_mark());
        let core = Core {
            mark,
            dir: dir.to_path_buf(),
            codec,
            max_record,
            state: Mutex::new(State {
                next_lsn,
                pending: Vec::new(),
                cuts: Vec::new(),
                fill: write_offset,
                capacity: writer.capacity(),
                generation: 0,
                sync_base: sync_base_of(durable_offset),
                written_lsn: last,
                durable_lsn: last,
                flushing: false,
                failure: None,
                spare: Vec::new(),
                waiters: Vec::new(),
                last_round_woken: 0,
                last_sync_micros: 0,
                gatherer: None,
                async_waiters: Vec::new(),
            }),
            tail: Mutex::new(Tail {
                writer,
                offset: write_offset,
                generation: 0,
            }),
            segments,
            report,
            async_syncer: OnceLock::new(),
            stats: Counters::default(),
            options,
        };
        Ok(Log {
            core: Arc::new(core),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.core.dir
    }

    pub fn codec(&self) -> Codec {
        self.core.codec
    }

    pub fn options(&self) -> &WalOptions {
        &self.core.options
    }

    /// What recovery found when the log was opened.
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.core.report
    }

    /// The largest payload accepted.
    pub fn max_record_bytes(&self) -> usize {
        self.core.max_record
    }

    /// Appends one record to the buffer and returns its LSN. Not durable until committed.
    ///
    /// # Errors
    /// [`Error::RecordTooLarge`], or the stored failure if the log is poisoned.
    pub fn append(&self, payload: &[u8]) -> Result<Lsn> {
        self.append_all(std::iter::once(payload))
    }

    /// Appends records as one contiguous run of LSNs; returns the LSN of the last one (or the
    /// last LSN in the log if `payloads` is empty).
    pub fn append_all<'a>(&self, payloads: impl IntoIterator<Item = &'a [u8]>) -> Result<Lsn> {
        let mut checked: Vec<(&[u8], u32)> = Vec::new();
        for payload in payloads {
            if payload.len() > self.core.max_record {
                return Err(Error::RecordTooLarge {
                    bytes: payload.len(),
                    max: self.core.max_record,
                });
            }
            // Checksum the payload before taking the lock; only the 12 header bytes are folded
            // in under it, once the LSN is known.
            checked.push((payload, crc32c::crc32c(payload)));
        }
        let core = &self.core;
        let mut state = lock(&core.state);
        if let Some(failure) = &state.failure {
            return Err(poisoned(failure));
        }
        // LSNs are never reused: a log whose numbers run out stops taking records (only a
        // crafted segment can start that close to the end; 2^64 appends take centuries).
        let needed = checked.len() as u64;
        let last_needed = state.next_lsn.get().checked_add(needed.saturating_sub(1));
        if needed > 0 && last_needed.is_none_or(|last| last > Lsn::MAX.get()) {
            return Err(Error::LsnExhausted {
                next: state.next_lsn,
                records: needed,
            });
        }
        for (payload, crc) in checked {
            let lsn = state.next_lsn;
            let frame_len = frame::frame_len(payload.len()) as u64;
            if state.fill + frame_len > state.capacity {
                let at = state.pending.len();
                state.cuts.push(Cut { at, start: lsn });
                state.fill = HEADER_BYTES as u64;
                state.capacity = core.options.segment_bytes;
                state.generation += 1;
                // Nothing of a segment that does not exist yet is durable.
                state.sync_base = frame::MIN_SYNC_BASE;
            }
            let sync_base = state.sync_base;
            frame::encode_with_crc(&mut state.pending, lsn, payload, crc, sync_base);
            state.fill += frame_len;
            state.next_lsn = lsn.next();
        }
        if let Some((_, target)) = &state.gatherer {
            if state.next_lsn >= *target {
                let (gatherer, _) = state.gatherer.take().expect("checked");
                gatherer.unpark();
            }
        }
        let last = Lsn::new(state.next_lsn.get() - 1);
        if state.pending.len() >= core.options.write_buffer_bytes && !state.flushing {
            // Bound memory: hand the buffer to the OS now (no sync; committers still sync).
            let batch = take_batch(&mut state, false);
            drop(state);
            self.run_flush(batch)?;
        }
        Ok(last)
    }

    /// Blocks until every record up to `lsn` is durable (in [`SyncMode::None`]: written to the
    /// OS). Concurrent callers share one fdatasync.
    ///
    /// # Errors
    /// [`Error::NotAppended`] for an LSN not yet appended; the failure that poisoned the log if
    /// a write or sync failed (then no later commit succeeds either).
    pub fn commit(&self, lsn: Lsn) -> Result<()> {
        self.wait_for(lsn, self.core.options.sync == SyncMode::Data)
    }

    /// Blocks until `lsn` is written (and, if `sync`, synced), leading flushes as needed.
    fn wait_for(&self, lsn: Lsn, sync: bool) -> Result<()> {
        let core = &self.core;
        let mut state = lock(&core.state);
        loop {
            if let Some(failure) = &state.failure {
                return Err(poisoned(failure));
            }
            if lsn <= state.done(sync) {
                return Ok(());
            }
            if lsn >= state.next_lsn {
                return Err(Error::NotAppended {
                    lsn,
                    next: state.next_lsn,
                });
            }
            if state.flushing {
                let waiter = Arc::new(Waiter {
                    lsn,
                    sync,
                    thread: std::thread::current(),
                    signal: AtomicU8::new(WAITING),
                    chain: Mutex::new(Vec::new()),
                });
                state.waiters.push(Arc::clone(&waiter));
                drop(state);
                let signal = loop {
                    match waiter.signal.load(Ordering::Acquire) {
                        WAITING => std::thread::park(),
                        signal => break signal,
                    }
                };
                if signal == SATISFIED {
                    wake_tree(std::mem::take(&mut *lock(&waiter.chain)));
                    return Ok(());
                }
                state = lock(&core.state);
            } else {
                if sync && state.last_round_woken > 1 {
                    state = self.gather(state);
                }
                let batch = take_batch(&mut state, sync);
                drop(state);
                // The flush this thread led failed: report that failure as it is. Other waiters
                // see it through `state.failure`.
                self.run_flush(batch)?;
                state = lock(&core.state);
            }
        }
    }

    /// Commits everything appended so far.
    pub fn commit_all(&self) -> Result<Lsn> {
        let last = self.last_lsn();
        if last != Lsn::ZERO {
            self.commit(last)?;
        }
        Ok(last)
    }

    /// Waits, without blocking a thread, until `lsn` is durable. A background thread (started on
    /// first use) runs the flushes for async waiters, sharing rounds with blocking committers.
    pub fn commit_async(&self, lsn: Lsn) -> CommitFuture {
        CommitFuture {
            log: self.clone(),
            lsn,
        }
    }

    /// The highest LSN known durable (fdatasync'ed).
    pub fn durable_lsn(&self) -> Lsn {
        lock(&self.core.state).durable_lsn
    }

    /// Writes down, and syncs, how far the newest segment is synced (the `SYNCED` mark), now
    /// and on this thread. The log does this by itself off the commit path when it goes idle,
    /// and in `close`; this is for a caller (or a test) that must know it is done, e.g. before
    /// it stops the process. Waits for a write of the mark in progress.
    ///
    /// # Errors
    /// The failed write or fdatasync of the mark file (marks then stop for good; records are
    /// unaffected).
    pub fn mark_synced(&self) -> Result<()> {
        self.core.mark.persist().map(|_| ())
    }

    /// The highest LSN handed to the OS.
    pub fn written_lsn(&self) -> Lsn {
        lock(&self.core.state).written_lsn
    }

    /// I/O counters since open.
    pub fn stats(&self) -> LogStats {
        let c = &self.core.stats;
        LogStats {
            flushes: c.flushes.load(Ordering::Relaxed),
            syncs: c.syncs.load(Ordering::Relaxed),
            marks: self.core.mark.writes(),
            bytes_written: c.bytes_written.load(Ordering::Relaxed),
        }
    }

    /// The highest LSN appended (`Lsn::ZERO` if none).
    pub fn last_lsn(&self) -> Lsn {
        Lsn::new(lock(&self.core.state).next_lsn.get() - 1)
    }

    /// The first LSN still in the log.
    pub fn first_lsn(&self) -> Lsn {
        self.core.segments.first_lsn()
    }

    /// Hands buffered records to the OS without syncing, so readers see them.
    pub fn flush(&self) -> Result<()> {
        match self.last_lsn() {
            Lsn::ZERO => Ok(()),
            last => self.wait_for(last, false),
        }
    }

    /// Reads records from `from` (clamped to the first LSN present) up to everything appended
    /// so far, in order. Buffered records are flushed to the OS first so the reader sees them.
    pub fn read_from(&self, from: Lsn) -> Result<RawReader> {
        self.flush()?;
        let end = self.written_lsn().next();
        Ok(self.core.segments.reader(from, end))
    }

    /// Releases whole segments whose records are all below `lsn`, so a checkpoint at `lsn` frees
    /// disk space. Records below `lsn` that share a segment with later ones stay readable. The
    /// newest segment is never removed. Returns how many segments were removed.
    pub fn truncate_before(&self, lsn: Lsn) -> Result<usize> {
        self.core.segments.truncate_before(lsn)
    }

    /// Commits everything and closes the log. Dropping a log without `close` leaves records
    /// that were appended but not committed unwritten, exactly as a crash would.
    pub fn close(self) -> Result<()> {
        let committed = self.commit_all();
        if let Some(syncer) = self.core.async_syncer.get() {
            syncer.quiesce(&self.core);
        }
        committed?;
        self.core.mark.persist().map(|_| ())
    }

    /// Segment files currently in the log, oldest first.
    pub fn segments(&self) -> Vec<SegmentFile> {
        self.core.segments.list()
    }

    /// Before leading a durable round under concurrency, lets the committers the previous
    /// round just released append their next records, so this round's fdatasync covers them
    /// too. Without it, committers split into two groups that take turns (one appends while the
    /// other syncs) and each fdatasync covers only half of them. Waits at most half an
    /// fdatasync, yielding the CPU to the appenders, and holds `flushing` meanwhile so
    /// that committers arriving now queue up for this round instead of starting their own.
    fn gather<'a>(&'a self, mut state: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        let target = Lsn::new(state.written_lsn.get() + 1 + state.last_round_woken as u64);
        let budget = Duration::from_micros(state.last_sync_micros / 2);
        if state.next_lsn >= target {
            return state;
        }
        state.flushing = true;
        state.gatherer = Some((std::thread::current(), target));
        drop(state);
        // Sleep rather than spin: the appenders need both cores, and the one that completes the
        // round wakes us. The deadline bounds what a lost committer can cost this round.
        let deadline = std::time::Instant::now() + budget;
        let mut state = loop {
            let now = std::time::Instant::now();
            if now >= deadline {
                break lock(&self.core.state);
            }
            std::thread::park_timeout(deadline - now);
            let state = lock(&self.core.state);
            if state.gatherer.is_none() {
                break state;
            }
        };
        state.gatherer = None;
        state.flushing = false;
        state
    }

    /// Writes (and, if `batch.sync`, syncs) a batch as the only leader, then publishes the
    /// outcome and wakes the waiters.
    fn run_flush(&self, batch: Batch) -> Result<()> {
        let core = &self.core;
        let outcome = {
            let mut tail = lock(&core.tail);
            self.write_batch(&mut tail, &batch)
                .map(|()| (tail.generation, tail.offset))
        };
        let mut state = lock(&core.state);
        state.flushing = false;
        let result = match outcome {
            Ok((generation, offset)) => {
                state.written_lsn = state.written_lsn.max(batch.last_lsn);
                if batch.sync {
                    state.durable_lsn = state.durable_lsn.max(batch.last_lsn);
                    // Frames framed from now on into the segment this sync covered may say so.
                    // If appends have already cut a later segment, their frames are not in
                    // this one and keep their base.
                    if state.generation == generation {
                        state.sync_base = state.sync_base.max(sync_base_of(offset));
                    }
                }
                Ok(())
            }
            Err(error) => {
                tracing::error!("write-ahead log stopped: {error}");
                // The leader gets the failure itself (a full disk is `DiskFull`); every other
                // waiter and every later call gets `Poisoned` wrapping it.
                let own = error.duplicate_io();
                let error = Arc::new(error);
                state.failure = Some(Arc::clone(&error));
                Err(own.unwrap_or_else(|| poisoned(&error)))
            }
        };
        let mut bytes = batch.bytes;
        if bytes.capacity() > state.spare.capacity() && bytes.capacity() <= 64 << 20 {
            bytes.clear();
            state.spare = bytes;
        }
        let failed = state.failure.is_some();
        // Idle after a durable round: nothing pending, nobody waiting, so no next frame will
        // carry this sync's end as its sync base soon. Have the mark record it instead.
        let idle = batch.sync
            && !failed
            && state.pending.is_empty()
            && state.waiters.is_empty()
            && state.async_waiters.is_empty();
        // Wake the waiters this flush satisfied, and the oldest unsatisfied one to lead the
        // next flush (it is woken first, so that flush starts as soon as possible). After a
        // failure, wake everyone: they all return the error.
        let (wake, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut state.waiters)
            .into_iter()
            .partition(|w| failed || w.lsn <= state.done(w.sync));
        let mut keep = keep.into_iter();
        let next_leader = keep.next();
        state.waiters = keep.collect();
        if batch.sync {
            state.last_round_woken = wake.len() + 1;
            state.last_sync_micros = core.stats.last_sync_micros.load(Ordering::Relaxed);
        }
        let done = state.done(core.options.sync == SyncMode::Data);
        let ready: Vec<Waker> = {
            let mut ready = Vec::new();
            state.async_waiters.retain(|(lsn, waker)| {
                let wake = failed || *lsn <= done;
                if wake {
                    ready.push(waker.clone());
                }
                !wake
            });
            ready
        };
        drop(state);
        if let Some(leader) = next_leader {
            leader.wake(RECHECK);
        }
        if failed {
            wake.iter().for_each(|w| w.wake(RECHECK));
        } else {
            wake_tree(wake);
        }
        ready.into_iter().for_each(Waker::wake);
        if idle {
            core.mark.request();
        }
        result
    }

    fn write_batch(&self, tail: &mut Tail, batch: &Batch) -> Result<()> {
        let stats = &self.core.stats;
        stats.flushes.fetch_add(1, Ordering::Relaxed);
        stats
            .bytes_written
            .fetch_add(batch.bytes.len() as u64, Ordering::Relaxed);
        let mut from = 0;
        for cut in &batch.cuts {
            tail.write(&batch.bytes[from..cut.at])?;
            // Seal (the rotation syncs the old segment before anything reaches the new one).
            stats.syncs.fetch_add(1, Ordering::Relaxed);
            tail.writer.rotate(cut.start)?;
            tail.offset = HEADER_BYTES as u64;
            tail.generation += 1;
            from = cut.at;
        }
        tail.write(&batch.bytes[from..])?;
        if batch.sync {
            stats.syncs.fetch_add(1, Ordering::Relaxed);
            let started = std::time::Instant::now();
            tail.writer.sync()?;
            stats
                .last_sync_micros
                .store(started.elapsed().as_micros() as u64, Ordering::Relaxed);
        }
        Ok(())
    }

    fn syncer(&self) -> Arc<AsyncSyncer> {
        Arc::clone(self.core.async_syncer.get_or_init(|| {
            let syncer = Arc::new(AsyncSyncer::default());
            let weak = Arc::downgrade(&self.core);
            let for_thread = Arc::clone(&syncer);
            std::thread::Builder::new()
                .name("stela-wal-async-commit".into())
                .spawn(move || for_thread.run(weak))
                .expect("spawn async commit thread");
            syncer
        }))
    }
}

impl State {
    /// The highest LSN that is written (`sync == false`) or durable (`sync == true`).
    fn done(&self, sync: bool) -> Lsn {
        if sync {
            self.durable_lsn
        } else {
            self.written_lsn
        }
    }
}

fn take_batch(state: &mut State, sync: bool) -> Batch {
    state.flushing = true;
    let spare = std::mem::take(&mut state.spare);
    Batch {
        bytes: std::mem::replace(&mut state.pending, spare),
        cuts: std::mem::take(&mut state.cuts),
        last_lsn: Lsn::new(state.next_lsn.get() - 1),
        sync,
    }
}

fn poisoned(failure: &Arc<Error>) -> Error {
    Error::Poisoned {
        cause: Arc::clone(failure),
    }
}

/// The thread that runs flushes on behalf of async waiters.
///
/// It holds the log only while it runs a round (`active`), so that the log's directory lock is
/// released when the user's last handle goes; [`Log::close`] waits for a running round to end
/// and, when it closes the last handle, stops the thread for good (`closed`).
#[derive(Default)]
struct AsyncSyncer {
    state: Mutex<SyncerState>,
    wake: Condvar,
}

#[derive(Default)]
struct SyncerState {
    requested: bool,
    active: bool,
    closed: bool,
}

impl AsyncSyncer {
    fn request(&self) {
        lock(&self.state).requested = true;
        self.wake.notify_all();
    }

    /// Waits for a running round to finish; if `last_handle`, stops the thread.
    fn quiesce(&self, core: &Arc<Core>) {
        let mut state = lock(&self.state);
        while state.active {
            state = self
                .wake
                .wait(state)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        // Under the lock the thread cannot start a round, so this count is exact: only the
        // closing handle remains.
        if Arc::strong_count(core) == 1 {
            state.closed = true;
            self.wake.notify_all();
        }
    }

    fn run(&self, core: Weak<Core>) {
        loop {
            let log = {
                let mut state = lock(&self.state);
                while !state.requested && !state.closed {
                    // Wake up now and then to notice that the log was dropped.
                    let (guard, _) = self
                        .wake
                        .wait_timeout(state, Duration::from_millis(100))
                        .unwrap_or_else(|poisoned| poisoned.into_inner());
                    state = guard;
                    if core.strong_count() == 0 {
                        return;
                    }
                }
                if state.closed {
                    return;
                }
                state.requested = false;
                let Some(core) = core.upgrade() else { return };
                state.active = true;
                Log { core }
            };
            // The outcome reaches the futures through the state they poll.
            let _ = log.commit_all();
            drop(log);
            lock(&self.state).active = false;
            self.wake.notify_all();
        }
    }
}

/// Resolves when an LSN is durable. See [`Log::commit_async`].
pub struct CommitFuture {
    log: Log,
    lsn: Lsn,
}

impl Future for CommitFuture {
    type Output = Result<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let core = &self.log.core;
        let mut state = lock(&core.state);
        if let Some(failure) = &state.failure {
            return Poll::Ready(Err(poisoned(failure)));
        }
        let done = if core.options.sync == SyncMode::Data {
            state.durable_lsn
        } else {
            state.written_lsn
        };
        if self.lsn <= done {
            return Poll::Ready(Ok(()));
        }
        if self.lsn >= state.next_lsn {
            return Poll::Ready(Err(Error::NotAppended {
                lsn: self.lsn,
                next: state.next_lsn,
            }));
        }
        state.async_waiters.push((self.lsn, cx.waker().clone()));
        drop(state);
        self.log.syncer().request();
        Poll::Pending
    }
}
