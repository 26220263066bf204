//! The typed API, `Wal<T>`, against its promises: what is appended comes back, in order, under
//! the LSN `append` returned, for every codec and any interleaving of appends, batches, commits
//! and reopens; `iter_from` and `truncate_before` return exactly the promised suffix; durability
//! moves only through `commit` (blocking, grouped or async) and survives a simulated power cut;
//! and damage is never read as data: a log cut at any byte recovers exactly the records written
//! in full before the cut, and a single flipped bit anywhere in a record is refused, or cut as a
//! torn write when it lies in the last write of the log, never returned as a changed record.
//!
//! Most tests run on `FaultStorage` (in memory, so proptest can afford many cases and a crash is
//! one call); the cut tests use the real file system, since cutting files is what they are about.

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, TestRunner};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use std::future::Future;
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};
use stela_wal::storage::{Call, CrashPlan, FaultStorage, Hooked, Hooks};
use stela_wal::{Codec, Error, Lsn, Wal, WalOptions};

/// Segment header and frame header sizes, from docs/FORMAT.md. Spelled out here rather than
/// taken from the crate so that the tests check the format instead of restating the code.
const SEGMENT_HEADER: usize = 256;
const FRAME_HEADER: usize = 20;

/// Small, so that a few dozen records span several segments.
const SMALL_SEGMENT: u64 = 1024;

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Rec {
    id: u32,
    note: String,
    pairs: Vec<(u32, u32)>,
}

fn rec(id: u32) -> Rec {
    Rec {
        id,
        note: format!("record {id}"),
        pairs: vec![(id, id.wrapping_mul(7))],
    }
}

fn any_rec() -> impl Strategy<Value = Rec> {
    // Any chars, control characters included: JSON escapes them, the binary codecs do not.
    let note = prop::collection::vec(any::<char>(), 0..12).prop_map(String::from_iter);
    let pairs = prop::collection::vec((any::<u32>(), any::<u32>()), 0..5);
    (any::<u32>(), note, pairs).prop_map(|(id, note, pairs)| Rec { id, note, pairs })
}

fn any_codec() -> impl Strategy<Value = Codec> {
    prop::sample::select(Codec::ALL.to_vec())
}

fn mem_dir() -> PathBuf {
    PathBuf::from("/wal")
}

fn mem_options(fs: &FaultStorage, codec: Codec, segment_bytes: u64) -> WalOptions {
    WalOptions::default()
        .codec(codec)
        .segment_bytes(segment_bytes)
        .storage(Arc::new(fs.clone()))
}

fn open_mem(fs: &FaultStorage, codec: Codec, segment_bytes: u64) -> Wal<Rec> {
    Wal::open(mem_dir(), mem_options(fs, codec, segment_bytes)).expect("open")
}

fn collect(iter: stela_wal::Result<stela_wal::Iter<Rec>>) -> Vec<(Lsn, Rec)> {
    iter.expect("iter")
        .collect::<Result<Vec<_>, _>>()
        .expect("records")
}

/// `records` as the log should hold them: numbered from LSN 1.
fn numbered(records: &[Rec]) -> Vec<(Lsn, Rec)> {
    records
        .iter()
        .enumerate()
        .map(|(i, r)| (Lsn::new(i as u64 + 1), r.clone()))
        .collect()
}

/// First LSNs of the segment files in an in-memory log directory, from their names.
fn mem_segment_starts(fs: &FaultStorage) -> Vec<u64> {
    let mut starts: Vec<u64> = fs
        .file_names(&mem_dir())
        .iter()
        .filter_map(|name| name.strip_suffix(".wal")?.parse().ok())
        .collect();
    starts.sort_unstable();
    starts
}

/// Where the segments must start, by the packing rule of docs/FORMAT.md: frames are packed
/// with no padding, and a frame that does not fit in the rest of a segment starts a new one.
fn expected_segment_starts(
    payload_lens: impl IntoIterator<Item = usize>,
    capacity: u64,
) -> Vec<u64> {
    let mut starts = vec![1];
    let mut fill = SEGMENT_HEADER as u64;
    for (i, len) in payload_lens.into_iter().enumerate() {
        let frame = (FRAME_HEADER + len) as u64;
        if fill + frame > capacity {
            starts.push(i as u64 + 1);
            fill = SEGMENT_HEADER as u64;
        }
        fill += frame;
    }
    starts
}

/// Byte ranges of the frames in a segment's bytes, read with nothing but the format's length
/// field; only for files known to be intact.
fn frames(segment: &[u8]) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut pos = SEGMENT_HEADER;
    while pos + FRAME_HEADER <= segment.len() {
        let len = u32::from_le_bytes(segment[pos..pos + 4].try_into().unwrap()) as usize;
        let lsn = u64::from_le_bytes(segment[pos + 8..pos + 16].try_into().unwrap());
        if lsn == 0 {
            break;
        }
        out.push(pos..pos + FRAME_HEADER + len);
        pos += FRAME_HEADER + len;
    }
    out
}

#[derive(Debug, Clone)]
enum Op {
    Append(Rec),
    Batch(Vec<Rec>),
    CommitLast,
    AppendDurable(Rec),
    Reopen,
}

fn any_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => any_rec().prop_map(Op::Append),
        3 => prop::collection::vec(any_rec(), 0..6).prop_map(Op::Batch),
        2 => Just(Op::CommitLast),
        2 => any_rec().prop_map(Op::AppendDurable),
        1 => Just(Op::Reopen),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Whatever mix of calls wrote the log, a reader (live, and after close and reopen) sees
    /// exactly the appended records, in order, under the LSNs the appends returned, and the
    /// segment files sit where the packing rule puts them, reopens included.
    #[test]
    fn any_operation_sequence_round_trips(
        codec in any_codec(),
        ops in prop::collection::vec(any_op(), 1..40),
        // A tiny write buffer makes appends hand bytes to the OS on their own, between commits.
        write_buffer in prop::sample::select(vec![64usize, 1 << 20]),
    ) {
        let fs = FaultStorage::new();
        let open = || -> Wal<Rec> {
            Wal::open(
                mem_dir(),
                mem_options(&fs, codec, SMALL_SEGMENT).write_buffer_bytes(write_buffer),
            )
            .expect("open")
        };
        let mut wal = open();
        let mut model: Vec<Rec> = Vec::new();
        for op in ops {
            match op {
                Op::Append(r) => {
                    let lsn = wal.append(&r).unwrap();
                    model.push(r);
                    prop_assert_eq!(lsn.get(), model.len() as u64);
                }
                Op::Batch(rs) => {
                    let last = wal.append_batch(&rs).unwrap();
                    model.extend(rs);
                    // An empty batch returns the last LSN already in the log.
                    prop_assert_eq!(last.get(), model.len() as u64);
                }
                Op::CommitLast => {
                    let last = wal.last_lsn();
                    prop_assert_eq!(last.get(), model.len() as u64);
                    wal.commit(last).unwrap();
                    prop_assert!(wal.durable_lsn() >= last);
                }
                Op::AppendDurable(r) => {
                    let lsn = wal.append_durable(&r).unwrap();
                    model.push(r);
                    prop_assert_eq!(lsn.get(), model.len() as u64);
                    prop_assert!(wal.durable_lsn() >= lsn);
                }
                Op::Reopen => {
                    wal.close().unwrap();
                    wal = open();
                    let report = wal.recovery_report();
                    prop_assert!(report.torn_tail.is_none() && report.damage.is_empty(), "{:?}", report);
                    prop_assert_eq!(wal.last_lsn().get(), model.len() as u64);
                    prop_assert_eq!(wal.durable_lsn(), wal.last_lsn());
                }
            }
        }
        prop_assert_eq!(collect(wal.iter()), numbered(&model));
        wal.close().unwrap();
        let wal = open();
        prop_assert_eq!(wal.recovery_report().last_lsn.get(), model.len() as u64);
        prop_assert_eq!(collect(wal.iter()), numbered(&model));
        let lens = model.iter().map(|r| codec.encode(r).unwrap().len());
        prop_assert_eq!(mem_segment_starts(&fs), expected_segment_starts(lens, SMALL_SEGMENT));
    }

    /// `iter_from(lsn)` is the suffix from `lsn` on: from the start for 0 and 1, empty past the
    /// end, and the same before and after reopen (the live log reads buffered records too).
    #[test]
    fn iter_from_yields_exactly_the_suffix(
        codec in any_codec(),
        records in prop::collection::vec(any_rec(), 0..40),
        committed in any::<Index>(),
        from in 0u64..45,
    ) {
        let fs = FaultStorage::new();
        let wal = open_mem(&fs, codec, SMALL_SEGMENT);
        let split = committed.index(records.len() + 1);
        if split > 0 {
            let last = wal.append_batch(&records[..split]).unwrap();
            wal.commit(last).unwrap();
        }
        wal.append_batch(&records[split..]).unwrap();
        let expected: Vec<_> = numbered(&records)
            .into_iter()
            .filter(|(lsn, _)| lsn.get() >= from)
            .collect();
        prop_assert_eq!(collect(wal.iter_from(Lsn::new(from))), expected.clone());
        wal.close().unwrap();
        let wal = open_mem(&fs, codec, SMALL_SEGMENT);
        prop_assert_eq!(collect(wal.iter_from(Lsn::new(from))), expected);
    }

    /// `truncate_before(lsn)` removes exactly the segments that have a successor starting at or
    /// before `lsn` (so all their records are below it), never the newest; the removal is
    /// durable; everything from `lsn` on stays readable, and the LSN sequence continues.
    #[test]
    fn truncate_before_removes_exactly_the_segments_below(
        codec in any_codec(),
        records in prop::collection::vec(any_rec(), 1..60),
        at in 0u64..65,
    ) {
        let fs = FaultStorage::new();
        let wal = open_mem(&fs, codec, SMALL_SEGMENT);
        let last = wal.append_batch(&records).unwrap();
        wal.commit(last).unwrap();
        let starts = mem_segment_starts(&fs);
        let lens = records.iter().map(|r| codec.encode(r).unwrap().len());
        prop_assert_eq!(&starts, &expected_segment_starts(lens, SMALL_SEGMENT));

        let doomed = starts.windows(2).take_while(|pair| pair[1] <= at).count();
        prop_assert_eq!(wal.truncate_before(Lsn::new(at)).unwrap(), doomed);
        let first = starts[doomed];
        let from = |lsn: u64| -> Vec<(Lsn, Rec)> {
            numbered(&records).into_iter().filter(|(l, _)| l.get() >= lsn).collect()
        };
        let check = |wal: &Wal<Rec>| -> Result<(), TestCaseError> {
            prop_assert_eq!(mem_segment_starts(&fs), starts[doomed..].to_vec());
            prop_assert_eq!(wal.log().first_lsn().get(), first);
            // Records below `at` that share a segment with later ones stay; older ones are gone.
            prop_assert_eq!(collect(wal.iter()), from(first));
            prop_assert_eq!(collect(wal.iter_from(Lsn::new(at))), from(at.max(first)));
            Ok(())
        };
        check(&wal)?;

        // The removal was made durable (directory synced), the remaining records too.
        drop(wal);
        fs.crash(CrashPlan::LoseUnsynced);
        let wal = open_mem(&fs, codec, SMALL_SEGMENT);
        prop_assert_eq!(wal.recovery_report().first_lsn.get(), first);
        check(&wal)?;
        prop_assert_eq!(wal.truncate_before(Lsn::new(at)).unwrap(), 0);
        let next = wal.append_durable(&rec(7)).unwrap();
        prop_assert_eq!(next.get(), records.len() as u64 + 1);
    }

    /// Flipping any one bit of any record, in any segment, of a log closed after its commits is
    /// refused at open as corruption, naming the segment, the frame's offset and the LSN
    /// expected there: every record was synced, and `close` recorded the synced end (`SYNCED`),
    /// so even a flip in the newest segment's last write is not taken for a torn write (before
    /// the mark it was: the records from the flip on were cut). No changed record is ever
    /// returned; `SkipCorrupt` then returns every other record still in the log.
    #[test]
    fn any_flipped_bit_is_refused_or_cut_never_returned(
        codec in any_codec(),
        records in prop::collection::vec(any_rec(), 2..30),
        commit_points in prop::collection::vec(any::<Index>(), 0..4),
        segment in any::<Index>(),
        bit in any::<Index>(),
    ) {
        let fs = FaultStorage::new();
        let wal = open_mem(&fs, codec, SMALL_SEGMENT);
        // Commit after each group of records; the last group ends at the last record.
        let n = records.len();
        let mut commits: Vec<usize> = commit_points.iter().map(|i| 1 + i.index(n)).collect();
        commits.push(n);
        commits.sort_unstable();
        commits.dedup();
        let mut appended = 0;
        for &upto in &commits {
            let last = wal.append_batch(&records[appended..upto]).unwrap();
            wal.commit(last).unwrap();
            appended = upto;
        }
        wal.close().unwrap();

        let starts = mem_segment_starts(&fs);
        let s = segment.index(starts.len());
        let path = mem_dir().join(format!("{:020}.wal", starts[s]));
        let bytes = fs.read_file(&path).unwrap();
        let frames = frames(&bytes);
        let data = SEGMENT_HEADER..frames.last().unwrap().end;
        let bit = data.start * 8 + bit.index(data.len() * 8);
        let (byte, mask) = (bit / 8, 1u8 << (bit % 8));
        let k = frames.iter().position(|f| f.contains(&byte)).unwrap();
        let hit_lsn = starts[s] + k as u64;
        fs.corrupt(&path, byte, &[bytes[byte] ^ mask]);

        // Nothing synced is ever a torn write; the arm below stays to name what went wrong.
        let torn = false;
        let mut survivors = numbered(&records);
        match Wal::<Rec>::open(mem_dir(), mem_options(&fs, codec, SMALL_SEGMENT)) {
            Ok(wal) => {
                prop_assert!(torn, "damage at LSN {} of {} was accepted", hit_lsn, n);
                let (torn_path, tail) = wal.recovery_report().torn_tail.clone().expect("torn tail");
                prop_assert_eq!(torn_path, path.clone());
                prop_assert_eq!(tail.offset as usize, frames[k].start);
                prop_assert_eq!(tail.unsynced_records, n as u64 - hit_lsn);
                survivors.truncate(hit_lsn as usize - 1);
                prop_assert_eq!(collect(wal.iter()), survivors.clone());
            }
            Err(error) => {
                prop_assert!(!torn, "a flip in the last write must be a torn write: {}", error);
                let c = error.as_corruption().unwrap_or_else(|| panic!("not corruption: {error}"));
                prop_assert_eq!(&c.segment, &path);
                prop_assert_eq!(c.offset as usize, frames[k].start);
                prop_assert_eq!(c.expected_lsn.get(), hit_lsn);
                survivors.remove(hit_lsn as usize - 1);
            }
        }
        let skipping = mem_options(&fs, codec, SMALL_SEGMENT)
            .recovery(stela_wal::RecoveryMode::SkipCorrupt);
        let wal = Wal::<Rec>::open(mem_dir(), skipping).unwrap();
        prop_assert_eq!(collect(wal.iter()), survivors);
    }
}

/// Blocks the first fdatasync after `hold` until `n` appenders have called `arrive`, so that a
/// test can put several committers into one group-commit round without sleeping.
#[derive(Debug, Default)]
struct Gate {
    state: Mutex<GateState>,
    arrivals: Condvar,
}

#[derive(Debug, Default)]
struct GateState {
    hold_for: Option<usize>,
    arrived: usize,
}

impl Gate {
    fn hold(&self, n: usize) {
        *self.state.lock().unwrap() = GateState {
            hold_for: Some(n),
            arrived: 0,
        };
    }

    fn arrive(&self) {
        self.state.lock().unwrap().arrived += 1;
        self.arrivals.notify_all();
    }

    fn pass(&self) {
        let mut state = self.state.lock().unwrap();
        if let Some(n) = state.hold_for.take() {
            let (_state, wait) = self
                .arrivals
                .wait_timeout_while(state, Duration::from_secs(10), |s| s.arrived < n)
                .unwrap();
            assert!(!wait.timed_out(), "only some of {n} appenders arrived");
        }
    }
}

impl Hooks for Gate {
    fn before(&self, call: &Call<'_>) -> io::Result<()> {
        if let Call::SyncData { .. } = call {
            self.pass();
        }
        Ok(())
    }
}

/// Eight threads each append and commit 200 records, one at a time. Every commit that returns
/// covers its record (durable_lsn says so, and a power cut right after the last one loses
/// nothing), and the committers share fdatasyncs: the first sync is held until all eight have
/// appended, so at least seven commits ride on two syncs, which makes "fewer syncs than
/// commits" hold on every run, not just on a lucky schedule.
#[test]
fn concurrent_committers_share_syncs_and_lose_nothing() {
    const THREADS: u32 = 8;
    const EACH: u32 = 200;
    let fs = FaultStorage::new();
    // `FaultStorage` with the gate in front of `sync_data`.
    let storage = Hooked::wrap(Arc::new(fs.clone()), Gate::default());
    let gate = storage.clone();
    // One large segment: no seal syncs, so every counted sync is a commit round's.
    let options = WalOptions::default()
        .codec(Codec::Postcard)
        .segment_bytes(1 << 20)
        .storage(Arc::new(storage));
    let wal: Wal<Rec> = Wal::open(mem_dir(), options).unwrap();
    gate.hooks().hold(THREADS as usize);

    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let wal = wal.clone();
            let gate = gate.clone();
            std::thread::spawn(move || {
                let mut acked = Vec::new();
                for i in 0..EACH {
                    let lsn = wal.append(&rec(t * EACH + i)).unwrap();
                    if i == 0 {
                        gate.hooks().arrive();
                    }
                    wal.commit(lsn).unwrap();
                    assert!(
                        wal.durable_lsn() >= lsn,
                        "commit returned before {lsn} was durable"
                    );
                    acked.push((lsn, t * EACH + i));
                }
                acked
            })
        })
        .collect();
    let acked: Vec<(Lsn, u32)> = handles
        .into_iter()
        .flat_map(|h| h.join().expect("committer panicked"))
        .collect();

    // Each sync round is led by one commit call and each call leads at most one round; the
    // eight first commits fit in two rounds (the held one, and the next, which takes all eight
    // records), so at least six commits led nothing.
    let commits = u64::from(THREADS * EACH);
    let stats = wal.log().stats();
    assert!(
        stats.syncs <= commits - u64::from(THREADS - 2),
        "{} syncs for {commits} commits: group commit did not share",
        stats.syncs
    );
    assert_eq!(wal.durable_lsn().get(), commits);

    drop(wal);
    fs.crash(CrashPlan::LoseUnsynced);
    let wal = open_mem(&fs, Codec::Postcard, 1 << 20);
    let recovered = collect(wal.iter());
    assert_eq!(recovered.len() as u64, commits);
    for (lsn, id) in acked {
        assert_eq!(recovered[lsn.get() as usize - 1], (lsn, rec(id)));
    }
}

/// `durable_lsn` is what a power cut keeps, and only `commit` moves it: not appends, not the
/// write to the OS a reader or `flush` causes.
#[test]
fn durable_lsn_moves_only_through_commit() {
    let fs = FaultStorage::new();
    let wal = open_mem(&fs, Codec::MessagePack, SMALL_SEGMENT);
    assert_eq!(wal.durable_lsn(), Lsn::ZERO);
    let records: Vec<Rec> = (0..10).map(rec).collect();
    let last = wal.append_batch(&records).unwrap();
    assert_eq!(wal.durable_lsn(), Lsn::ZERO);
    assert_eq!(collect(wal.iter()), numbered(&records));
    assert_eq!(wal.log().written_lsn(), last, "a reader flushes the buffer");
    assert_eq!(wal.durable_lsn(), Lsn::ZERO, "but flushing is not syncing");

    wal.commit(Lsn::new(5)).unwrap();
    let durable = wal.durable_lsn();
    assert!(durable >= Lsn::new(5) && durable <= last, "{durable}");
    wal.append(&rec(10)).unwrap();
    wal.log().flush().unwrap();
    assert_eq!(wal.durable_lsn(), durable);

    drop(wal);
    fs.crash(CrashPlan::LoseUnsynced);
    let wal = open_mem(&fs, Codec::MessagePack, SMALL_SEGMENT);
    let recovered = collect(wal.iter());
    assert!(recovered.len() as u64 >= durable.get());
    assert_eq!(recovered, numbered(&records)[..recovered.len()]);
    assert_eq!(wal.durable_lsn().get(), recovered.len() as u64);
}

struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

fn waker() -> Waker {
    Waker::from(Arc::new(Unpark(std::thread::current())))
}

fn poll_once<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
    Pin::new(future).poll(&mut Context::from_waker(&waker()))
}

/// Polls `future` on this thread, parking between polls, until it is ready. Fails the test
/// after 10 s instead of hanging.
fn block_on<F: Future + Unpin>(future: &mut F) -> F::Output {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Poll::Ready(output) = poll_once(future) {
            return output;
        }
        let left = deadline
            .checked_duration_since(Instant::now())
            .expect("future not ready within 10 s");
        std::thread::park_timeout(left);
    }
}

/// `commit_async` is pending while the record is not durable, is woken (by the log's own
/// syncer: nobody else commits here) once it is, and what it acknowledged survives a power cut.
#[test]
fn commit_async_resolves_once_durable() {
    let fs = FaultStorage::new();
    let wal = open_mem(&fs, Codec::Json, SMALL_SEGMENT);
    let lsn = wal.append(&rec(1)).unwrap();
    assert!(wal.durable_lsn() < lsn);
    let mut future = wal.commit_async(lsn);
    assert!(poll_once(&mut future).is_pending());
    block_on(&mut future).unwrap();
    assert!(wal.durable_lsn() >= lsn);

    // Several futures over one batch: waiting for the last makes them all ready.
    let last = wal
        .append_batch(&(2..20).map(rec).collect::<Vec<_>>())
        .unwrap();
    let mut futures: Vec<_> = (2..=last.get())
        .map(|l| wal.commit_async(Lsn::new(l)))
        .collect();
    block_on(futures.last_mut().unwrap()).unwrap();
    for future in &mut futures {
        assert!(matches!(poll_once(future), Poll::Ready(Ok(()))));
    }
    assert!(matches!(
        poll_once(&mut wal.commit_async(lsn)),
        Poll::Ready(Ok(()))
    ));

    drop(futures);
    drop(wal);
    fs.crash(CrashPlan::LoseUnsynced);
    let wal = open_mem(&fs, Codec::Json, SMALL_SEGMENT);
    assert_eq!(
        collect(wal.iter()),
        numbered(&(1..20).map(rec).collect::<Vec<_>>())
    );
}

/// A log written durably with the real file system, to be cut in copies.
struct Source {
    dir: tempfile::TempDir,
    records: Vec<Rec>,
    /// Segment paths, oldest first.
    segments: Vec<PathBuf>,
}

const CUT_SEGMENT: u64 = 1024;

fn write_source(codec: Codec, seed: u64) -> Source {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut records: Vec<Rec> = (0..100)
        .map(|i| {
            let note_len = rng.gen_range(0..24);
            let mut pairs: Vec<(u32, u32)> = (0..rng.gen_range(0..4))
                .map(|_| (rng.gen(), rng.gen()))
                .collect();
            // Payloads that end in zero bytes: cutting inside such a tail leaves the record
            // whole, since the zeros are what the cut leaves anyway.
            if i % 3 == 0 {
                pairs.push((rng.gen(), 0));
            }
            Rec {
                id: rng.gen(),
                note: (0..note_len).map(|_| rng.gen_range('a'..='z')).collect(),
                pairs,
            }
        })
        .collect();
    // Keep enough records for several segments and several records in the newest one, which
    // is the one the cut test cuts.
    let lens: Vec<usize> = records
        .iter()
        .map(|r| codec.encode(r).unwrap().len())
        .collect();
    let in_newest = |n: usize| {
        let starts = expected_segment_starts(lens[..n].iter().copied(), CUT_SEGMENT);
        n as u64 + 1 - starts.last().unwrap()
    };
    let n = (50..=lens.len())
        .find(|&n| in_newest(n) >= 5)
        .expect("a length with 5 records in the newest segment");
    records.truncate(n);
    let dir = tempfile::tempdir().unwrap();
    let wal: Wal<Rec> = Wal::open(
        dir.path(),
        WalOptions::default()
            .codec(codec)
            .segment_bytes(CUT_SEGMENT),
    )
    .unwrap();
    let last = wal.append_batch(&records).unwrap();
    wal.commit(last).unwrap();
    wal.close().unwrap();
    let segments = segment_paths(dir.path());
    assert!(
        segments.len() >= 3,
        "want several segments, got {segments:?}"
    );
    let in_last = frames(&std::fs::read(segments.last().unwrap()).unwrap()).len();
    assert!(in_last >= 5, "want several records in the last segment");
    Source {
        dir,
        records,
        segments,
    }
}

fn segment_paths(dir: &Path) -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "wal"))
        .collect();
    paths.sort();
    paths
}

/// A fresh copy of a log directory's segment files.
fn copy_log(from: &Path) -> tempfile::TempDir {
    let to = tempfile::tempdir().unwrap();
    for path in segment_paths(from) {
        std::fs::copy(&path, to.path().join(path.file_name().unwrap())).unwrap();
    }
    to
}

/// Cuts `path` at byte `cut`: by zeroing everything from there (what a crash leaves in a
/// preallocated file) or by shortening the file (a file system that lost the tail blocks).
fn cut_file(path: &Path, cut: usize, shorten: bool) {
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    if shorten {
        file.set_len(cut as u64).unwrap();
    } else {
        let len = file.metadata().unwrap().len() as usize;
        file.write_all_at(&vec![0; len - cut], cut as u64).unwrap();
    }
}

fn open_std(dir: &Path, codec: Codec) -> stela_wal::Result<Wal<Rec>> {
    Wal::open(
        dir,
        WalOptions::default()
            .codec(codec)
            .segment_bytes(CUT_SEGMENT),
    )
}

/// Cutting the newest segment at any byte of its data, by zeroing or by shortening the file,
/// recovers exactly the records whose frames are whole before the cut (a prefix), reports the
/// non-zero bytes it dropped as a torn tail, and leaves a log that reopens clean, restored to
/// full size, and continues with the next LSN.
#[test]
fn cutting_the_newest_segment_anywhere_recovers_the_whole_records() {
    let sources: Vec<(Codec, Source)> = Codec::ALL
        .into_iter()
        .enumerate()
        .map(|(i, codec)| (codec, write_source(codec, i as u64)))
        .collect();
    let mut runner = TestRunner::new(Config::with_cases(96));
    let strategy = (0..sources.len(), any::<Index>(), any::<bool>());
    runner
        .run(&strategy, |(which, cut, shorten)| {
            let (codec, source) = &sources[which];
            let last = source.segments.last().unwrap();
            let name = last.file_name().unwrap();
            let full = std::fs::read(last).unwrap();
            let frames = frames(&full);
            let before = source.records.len() - frames.len();
            let data_end = frames.last().unwrap().end;
            let cut = SEGMENT_HEADER + cut.index(data_end - SEGMENT_HEADER + 1);

            let copy = copy_log(source.dir.path());
            let path = copy.path().join(name);
            cut_file(&path, cut, shorten);
            let mut left = full.clone();
            if shorten {
                left.truncate(cut);
            } else {
                left[cut..].fill(0);
            }
            let whole = |f: &Range<usize>| {
                if shorten {
                    f.end <= cut
                } else {
                    full[cut.clamp(f.start, f.end)..f.end]
                        .iter()
                        .all(|&b| b == 0)
                }
            };
            let kept = frames.iter().take_while(|f| whole(f)).count();
            let kept_end = if kept == 0 {
                SEGMENT_HEADER
            } else {
                frames[kept - 1].end
            };
            let dropped = left[kept_end..]
                .iter()
                .rposition(|&b| b != 0)
                .map(|i| i as u64 + 1);

            let wal = open_std(copy.path(), *codec).unwrap();
            let expected = numbered(&source.records[..before + kept]);
            prop_assert_eq!(collect(wal.iter()), expected.clone());
            let report = wal.recovery_report();
            prop_assert_eq!(report.last_lsn.get(), (before + kept) as u64);
            match (&report.torn_tail, dropped) {
                (None, None) => {}
                (Some((torn_path, torn)), Some(bytes)) => {
                    prop_assert_eq!(torn_path.file_name().unwrap(), name);
                    prop_assert_eq!(torn.offset as usize, kept_end);
                    prop_assert_eq!(torn.bytes, bytes);
                }
                (report, dropped) => {
                    prop_assert!(
                        false,
                        "torn tail {:?}, expected {:?} bytes dropped",
                        report,
                        dropped
                    )
                }
            }
            let repaired = std::fs::read(&path).unwrap();
            prop_assert_eq!(repaired.len() as u64, CUT_SEGMENT);
            prop_assert!(repaired[kept_end..].iter().all(|&b| b == 0));

            let next = wal.append_durable(&rec(99)).unwrap();
            prop_assert_eq!(next.get(), (before + kept + 1) as u64);
            drop(wal);
            let wal = open_std(copy.path(), *codec).unwrap();
            prop_assert!(wal.recovery_report().torn_tail.is_none());
            let mut expected = expected;
            expected.push((next, rec(99)));
            prop_assert_eq!(collect(wal.iter()), expected);
            Ok(())
        })
        .unwrap();
}

/// Cutting a sealed segment (one with a successor) loses records that were durable before the
/// successor got its first byte, so a strict open must refuse, naming the cut segment (when a
/// partial frame remains) or its successor (when the cut fell on a frame boundary and the gap
/// shows as missing LSNs), and must change nothing on disk. A cut that removed no record byte
/// changes nothing at all.
#[test]
fn cutting_a_sealed_segment_is_refused() {
    let codec = Codec::MessagePack;
    let source = write_source(codec, 7);
    let sealed = source.segments.len() - 1;
    let mut runner = TestRunner::new(Config::with_cases(48));
    runner
        .run(&(0..sealed, any::<Index>()), |(s, cut)| {
            let path = &source.segments[s];
            let full = std::fs::read(path).unwrap();
            let frames = frames(&full);
            let cut = SEGMENT_HEADER + cut.index(frames.last().unwrap().end - SEGMENT_HEADER + 1);
            let copy = copy_log(source.dir.path());
            cut_file(&copy.path().join(path.file_name().unwrap()), cut, false);
            let before = segment_bytes(copy.path());

            let hit = frames.iter().find(|f| {
                full[cut.clamp(f.start, f.end)..f.end]
                    .iter()
                    .any(|&b| b != 0)
            });
            match (open_std(copy.path(), codec), hit) {
                (Ok(wal), None) => {
                    prop_assert_eq!(collect(wal.iter()), numbered(&source.records));
                }
                (Err(Error::Corruption(c)), Some(frame)) => {
                    let (named, offset) = if cut <= frame.start {
                        (&source.segments[s + 1], 0)
                    } else {
                        (path, frame.start as u64)
                    };
                    prop_assert_eq!(c.segment.file_name(), named.file_name());
                    prop_assert_eq!(c.offset, offset);
                    prop_assert_eq!(segment_bytes(copy.path()), before);
                }
                (Ok(_), Some(frame)) => prop_assert!(false, "cut into {:?} was accepted", frame),
                (Err(e), hit) => prop_assert!(false, "{} (cut hit {:?})", e, hit),
            }
            Ok(())
        })
        .unwrap();
}

fn segment_bytes(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    segment_paths(dir)
        .into_iter()
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            (p, bytes)
        })
        .collect()
}

/// Closing the log releases it: a reopen right after must not find it locked, also when
/// `commit_async` started the log's background syncer.
#[test]

fn reopening_right_after_commit_async_is_not_locked() {
    let fs = FaultStorage::new();
    for i in 0..100 {
        let wal = open_mem(&fs, Codec::Postcard, SMALL_SEGMENT);
        let lsn = wal.append(&rec(i)).unwrap();
        block_on(&mut wal.commit_async(lsn)).unwrap();
        wal.close().unwrap();
        if let Err(error) =
            Wal::<Rec>::open(mem_dir(), mem_options(&fs, Codec::Postcard, SMALL_SEGMENT))
        {
            panic!("reopen {i} after close: {error}");
        }
    }
}

mod tag_compat {
    //! The default record type tag is the type's name without module paths: a log written by
    //! an earlier version (full `std::any::type_name` path) or by another binary of the same
    //! package opens with it; a log of another type does not.
    use serde::{Deserialize, Serialize};
    use stela_wal::{Error, Wal, WalOptions};

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    pub struct Invoice {
        pub id: u64,
    }

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    pub struct Receipt {
        pub id: u64,
    }

    #[test]
    fn a_log_opens_whatever_module_path_named_its_type() {
        let dir = tempfile::tempdir().unwrap();
        let wal: Wal<Invoice> = Wal::open(
            dir.path(),
            WalOptions::default().type_tag("billing_v1::model::Invoice"),
        )
        .unwrap();
        let lsn = wal.append(&Invoice { id: 7 }).unwrap();
        wal.commit(lsn).unwrap();
        wal.close().unwrap();

        let wal: Wal<Invoice> = Wal::open(dir.path(), WalOptions::default()).unwrap();
        let records: Vec<Invoice> = wal.iter().unwrap().map(|r| r.unwrap().1).collect();
        assert_eq!(records, vec![Invoice { id: 7 }]);
        wal.close().unwrap();

        match Wal::<Receipt>::open(dir.path(), WalOptions::default()) {
            Err(Error::WrongRecordType {
                found, expected, ..
            }) => {
                assert_eq!(found.shown, "billing_v1::model::Invoice");
                assert_eq!(expected.shown, "Receipt");
            }
            Err(other) => panic!("opening invoices as receipts: {other}"),
            Ok(_) => panic!("a log of invoices opened as receipts"),
        }
    }
}
