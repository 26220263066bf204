//! A loom model of the decoupled cleaner against eviction and page fixes (issue 11): every
//! interleaving, up to a preemption bound, of cleaner rounds, page fixes + updates + commits,
//! and evictions, run against the store's own code, not a copy of its protocol. Under
//! `--cfg stela_store_loom` the clean LSN, the page file's write map, unreported writes and
//! write/sync counters, and the log tail's copy are loom's (`src/sync.rs`), so the model runs
//! `cleaner::decoupled_round` (through `decoupled_round_for_model`, which only leaves out the
//! archive), `LogTail`, `BufferPool` (fix, modify, clock eviction with and without a write;
//! built with one frame by `with_frames_for_model`, the only other model-only entry) and
//! `PageFile` (never back in time, writes reported after a sync) unchanged. Only what is below
//! the store is fake: the log device (records in memory, a durable LSN that `flush` advances)
//! and the storage under the page file (page images in memory, what the last sync covered kept
//! apart, the write-ahead rule asserted on every write). The engine latch is a loom mutex around
//! the pool, as the store's `Mutex<Engine>` is: the pool runs only under it, the cleaner never
//! takes it.
//!
//! Run it (about a minute on 2 cores, plus the build; not part of the default `cargo test`,
//! where this file compiles to nothing). The cfg is this crate's own, `stela_store_loom`, not
//! the `stela_loom` of the server's and the rings' models: under that one stela-net swaps its
//! shared-memory rings for a loom model and stela-client, which this crate depends on, does not
//! build.
//!
//! ```sh
//! RUSTFLAGS="--cfg stela_store_loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test -p stela-store --test loom_cleaner --release -- --nocapture
//! ```
//!
//! `LOOM_MAX_PREEMPTIONS=N` overrides the preemption bound (3) each model sets. Each model
//! prints how many interleavings it explored and how many of them had the evicting thread drop
//! a dirty page without a write and write one (it fails if either never happens). On a failure
//! loom prints the interleaving; set `LOOM_LOG=trace LOOM_LOCATION=1` to see every step.
//!
//! The state every model starts from: one frame in the pool (so fixing one page evicts the
//! other), two pages, page 0 changed by a committed record its stored image lacks, clean LSN
//! zero. Then three threads: the cleaner runs its rounds (records after the clean LSN up to the
//! durable LSN replayed onto the stored images, written, synced, the clean LSN published, the
//! tail released); a transaction fixes a page, logs a change, stamps and dirties the page, and
//! commits (flushes) after the latch, once or twice; and an evicting thread fixes the other
//! page, which evicts the dirty one without a write if the clean LSN covers it and writes it
//! (log first) otherwise. Afterwards the pages are fixed again in turn (each fix evicts the
//! other page) and one more cleaner round runs, alone.
//!
//! What it checks, in every explored interleaving:
//! - no change is lost: every fix sees every change logged to its page (page LSN at least the
//!   newest record's, each key with its value), including a page re-read after an eviction that
//!   dropped it without a write;
//! - the page LSN never goes back: neither a fix nor the stored image ever sees an older LSN
//!   than before (the storage asserts no write goes back in time);
//! - the write-ahead rule: no image reaches the storage ahead of the durable log, whoever
//!   writes it (eviction or the cleaner);
//! - the clean LSN never exceeds the durable LSN nor what the synced images hold: whenever it
//!   is read (by the evicting thread after each fix, and at the end) every change at or below
//!   it is in the synced image of its page, which is what a power cut would leave;
//! - no deadlock between the latch, the page file's and the log tail's mutexes.
//!
//! Not modelled: the archive (the round's archive branch and single-page repair), write
//! elision through `PageRepair`, redo left pending by instant restart, the classical cleaner,
//! torn writes, and restart itself (the synced images are checked against the clean LSN
//! instead).
//!
//! The model can fail. Each of these bugs, put in by hand, was found with the default bound,
//! within seconds (the slowest in 20): the clean LSN published before the page file's sync
//! (an eviction reads it while the synced image lacks the change); the cleaner publishing the
//! durable LSN read at the end of its round instead of the one it replayed up to (the clean
//! LSN covers a change no image has; with that check off, a re-fix lacks the change after an
//! eviction without a write); the cleaner replaying records above the durable LSN (an image
//! written ahead of the log); the pool's `needs_write` comparing the clean LSN with the page's
//! first change (`rec_lsn`) instead of its last (a re-fix lacks the change); the page file
//! letting an older image overwrite a newer one (the stored image goes back).
#![cfg(stela_store_loom)]

use loom::sync::atomic::AtomicU64;
use loom::sync::Mutex;
use loom::thread;
use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use stela_format::Lsn;
use stela_store::format::page::{self, Node, Page, PageId, PAGE_SIZE};
use stela_store::format::{LogBody, LogRecord};
use stela_store::log::RecordIter;
use stela_store::loom_model::{
    decoupled_round_for_model, BufferPool, Consumer, ImageCache, LogTail, PageFile,
};
use stela_store::{LogDevice, PoolStats};
use stela_wal::storage::StorageFile;

/// The log under the store: records in memory, durable up to what `flush` was asked for.
///
/// The records sit behind a std mutex: their order is the log tail's (which appends under its
/// own, loom's, mutex), and the model's checks read them without adding scheduling points. The
/// durable LSN is loom's atomic, so that every read of it (the cleaner's target, eviction's
/// write-ahead check, the storage's assertion) and every flush is a point where loom switches.
/// (A std mutex is safe in a loom model as long as no loom operation runs while it is held,
/// which holds for every one in this file: loom switches threads only at its own operations.)
#[derive(Debug)]
struct MemLog {
    records: std::sync::Mutex<Vec<LogRecord>>,
    durable: AtomicU64,
}

impl MemLog {
    fn new() -> MemLog {
        MemLog {
            records: std::sync::Mutex::new(Vec::new()),
            durable: AtomicU64::new(0),
        }
    }

    fn records(&self) -> Vec<LogRecord> {
        self.records.lock().unwrap().clone()
    }

    /// Every change logged to page `id`.
    fn changes_of(&self, id: PageId) -> Vec<Change> {
        changes(&self.records(), id, u64::MAX)
    }
}

/// A change to a page: the LSN of its record, the key, the value after.
type Change = (Lsn, Vec<u8>, Option<Vec<u8>>);

/// The writes to page `id` among `records` (LSN 1 first) up to LSN `upto`.
fn changes(records: &[LogRecord], id: PageId, upto: u64) -> Vec<Change> {
    records
        .iter()
        .enumerate()
        .map(|(i, record)| (Lsn::new(i as u64 + 1), record))
        .filter(|(lsn, _)| lsn.get() <= upto)
        .filter_map(|(lsn, record)| match &record.body {
            LogBody::Write {
                page, key, after, ..
            } if *page == id => Some((lsn, key.clone(), after.clone())),
            _ => None,
        })
        .collect()
}

impl LogDevice for MemLog {
    fn append(&self, record: &LogRecord) -> stela_store::Result<Lsn> {
        let mut records = self.records.lock().unwrap();
        records.push(record.clone());
        Ok(Lsn::new(records.len() as u64))
    }

    fn flush(&self, lsn: Lsn) -> stela_store::Result<()> {
        let last = self.records.lock().unwrap().len() as u64;
        assert!(lsn.get() <= last, "a flush past the last record");
        self.durable.fetch_max(lsn.get(), Ordering::SeqCst);
        Ok(())
    }

    fn durable_lsn(&self) -> Lsn {
        Lsn::new(self.durable.load(Ordering::SeqCst))
    }

    fn last_lsn(&self) -> Lsn {
        Lsn::new(self.records.lock().unwrap().len() as u64)
    }

    fn read_from(&self, lsn: Lsn) -> stela_store::Result<RecordIter<'_>> {
        let from = lsn.get().max(1);
        let records: Vec<_> = self
            .records()
            .into_iter()
            .enumerate()
            .map(|(i, record)| (Lsn::new(i as u64 + 1), record))
            .filter(|(at, _)| at.get() >= from)
            .map(Ok)
            .collect();
        Ok(Box::new(records.into_iter()))
    }
}

/// The storage under the page file: each page's current image (what a read sees, the OS's
/// cache) and its image as of the last sync (what a power cut would leave).
///
/// A std mutex: a page-sized write, a read and a sync are each atomic here, as whole-page
/// positioned I/O is on the file system (torn writes are the archive's business, not this
/// model's); the page file's own loom mutex and counters around them are where loom switches.
#[derive(Debug)]
struct MemStorage {
    log: Arc<MemLog>,
    images: std::sync::Mutex<Images>,
}

#[derive(Debug, Default)]
struct Images {
    current: BTreeMap<PageId, Vec<u8>>,
    synced: BTreeMap<PageId, Vec<u8>>,
}

impl MemStorage {
    /// The synced image of page `id` (empty if never synced).
    fn synced(&self, id: PageId) -> Page {
        match self.images.lock().unwrap().synced.get(&id) {
            Some(bytes) => page::decode(id, bytes).expect("a synced image decodes"),
            None => Page::empty(),
        }
    }
}

/// The page file's storage handle: the model keeps another `Arc` to look inside.
#[derive(Debug)]
struct MemFile(Arc<MemStorage>);

impl StorageFile for MemFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let id = offset / PAGE_SIZE as u64;
        let within = (offset % PAGE_SIZE as u64) as usize;
        let images = self.0.images.lock().unwrap();
        let Some(image) = images.current.get(&id) else {
            return Ok(0);
        };
        let n = buf.len().min(PAGE_SIZE - within);
        buf[..n].copy_from_slice(&image[within..within + n]);
        Ok(n)
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        assert_eq!(
            offset % PAGE_SIZE as u64,
            0,
            "a write not at a page boundary"
        );
        assert_eq!(buf.len(), PAGE_SIZE, "a write of part of a page");
        let id = offset / PAGE_SIZE as u64;
        let written = page::decode(id, buf).expect("the page file writes valid images");
        let durable = self.0.log.durable_lsn();
        assert!(
            written.lsn <= durable,
            "write-ahead rule broken: page {id} written at LSN {} with the log durable to {}",
            written.lsn.get(),
            durable.get()
        );
        let mut images = self.0.images.lock().unwrap();
        if let Some(before) = images.current.get(&id) {
            let before = page::decode(id, before).expect("a stored image decodes");
            assert!(
                written.lsn >= before.lsn,
                "page {id}'s stored image went back in time: LSN {} over {}",
                written.lsn.get(),
                before.lsn.get()
            );
        }
        images.current.insert(id, buf.to_vec());
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        let mut images = self.0.images.lock().unwrap();
        images.synced = images.current.clone();
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        let images = self.0.images.lock().unwrap();
        Ok(images
            .current
            .keys()
            .next_back()
            .map_or(0, |id| (id + 1) * PAGE_SIZE as u64))
    }

    fn allocate(&self, _len: u64) -> io::Result<()> {
        Ok(())
    }

    fn set_len(&self, _len: u64) -> io::Result<()> {
        Ok(())
    }
}

/// Asserts that `page`, as a fix of page `id` sees it, has every change logged to it: a lost
/// change, or a page LSN gone back, fails here.
fn assert_has_every_change(id: PageId, page: &Page, log: &MemLog, what: &str) {
    let Node::Leaf(leaf) = &page.node else {
        panic!("{what}: page {id} is not a leaf");
    };
    for (lsn, key, after) in log.changes_of(id) {
        assert!(
            page.lsn >= lsn,
            "{what}: page {id} at LSN {} lacks the change at LSN {} (lost, or gone back)",
            page.lsn.get(),
            lsn.get()
        );
        assert_eq!(
            leaf.get(&key),
            after.as_deref(),
            "{what}: page {id} lacks the change at LSN {}",
            lsn.get()
        );
    }
}

/// Asserts the cleaner's invariant for clean LSN `clean`: it is durable, and every change at
/// or below it is in the synced image of its page.
fn assert_clean_lsn_covered(clean: u64, storage: &MemStorage, log: &MemLog, pages: &[PageId]) {
    assert!(
        clean <= log.durable_lsn().get(),
        "the clean LSN {clean} is above the durable LSN {}",
        log.durable_lsn().get()
    );
    let records = log.records();
    for &id in pages {
        let synced = storage.synced(id);
        let Node::Leaf(leaf) = &synced.node else {
            panic!("page {id}'s synced image is not a leaf");
        };
        for (lsn, key, after) in changes(&records, id, clean) {
            assert!(
                synced.lsn >= lsn && leaf.get(&key) == after.as_deref(),
                "the clean LSN is {clean}, but page {id}'s synced image (LSN {}) lacks the \
                 change at LSN {}",
                synced.lsn.get(),
                lsn.get()
            );
        }
    }
}

/// A page fix and update, as `Engine::set` does it under the engine latch: fix the page (which
/// may evict the other and read this one from the page file), log the change with the page's
/// LSN as its chain, apply it, stamp the page and mark it dirty. Returns the record's LSN, for
/// the caller to commit after the latch.
fn fix_and_update(
    latch: &Mutex<BufferPool>,
    log: &LogTail,
    mem: &MemLog,
    id: PageId,
    key: &[u8],
    value: &[u8],
) -> Lsn {
    let mut pool = latch.lock().unwrap();
    let page = pool.page(id, log).expect("fix");
    assert_has_every_change(id, page, mem, "a fix for an update");
    let Node::Leaf(leaf) = &page.node else {
        unreachable!("checked")
    };
    let record = LogRecord {
        txn: 1,
        prev_txn_lsn: Lsn::ZERO,
        body: LogBody::Write {
            page: id,
            prev_page_lsn: page.lsn,
            key: key.to_vec(),
            before: leaf.get(key).map(<[u8]>::to_vec),
            after: Some(value.to_vec()),
        },
    };
    let lsn = log.append(&record).expect("append");
    pool.modify(id, lsn, log, |page| {
        if let Node::Leaf(leaf) = &mut page.node {
            leaf.set(key, Some(value));
        }
    })
    .expect("modify");
    lsn
}

/// A fix of page `id` (which, with one frame, evicts whatever page the pool holds), checked.
/// Returns the pool's counters from before and after it.
fn fix(
    latch: &Mutex<BufferPool>,
    log: &LogTail,
    mem: &MemLog,
    id: PageId,
    what: &str,
) -> (PoolStats, PoolStats) {
    let mut pool = latch.lock().unwrap();
    let before = pool.stats();
    let page = pool.page(id, log).expect("fix");
    assert_has_every_change(id, page, mem, what);
    (before, pool.stats())
}

/// One cleaner round, as `Store::clean` runs it (the round, then the tail released up to the
/// new clean LSN), checked against what it reports.
fn clean_round(
    log: &LogTail,
    file: &PageFile,
    clean: &AtomicU64,
    cache: &mut ImageCache,
    mem: &MemLog,
) {
    let report = decoupled_round_for_model(log, file, clean, cache).expect("cleaner round");
    assert!(
        report.clean_lsn <= mem.durable_lsn(),
        "the round reports a clean LSN above the durable log"
    );
    log.release(Consumer::Cleaner, report.clean_lsn.next());
}

const PAGES: [PageId; 2] = [0, 1];

/// What the threads do, on top of the state every model starts from.
struct Scenario {
    name: &'static str,
    /// Cleaner rounds, one after the other (the store runs one at a time).
    rounds: usize,
    /// Page fix + update + commit, one after the other, each setting a key of its own.
    updates: &'static [(PageId, &'static [u8])],
    /// Page fixes of the evicting thread, each followed by a check of the clean LSN.
    evictions: &'static [PageId],
}

fn model(scenario: &'static Scenario, preemptions: usize) {
    let started = std::time::Instant::now();
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(preemptions);
    }
    let bound = builder.preemption_bound;
    let explored = Arc::new(AtomicUsize::new(0));
    // How many interleavings had the evicting thread drop a dirty page without a write, and
    // how many had it write one: the model must reach both, or it proves less than it says.
    let elided = Arc::new(AtomicUsize::new(0));
    let written = Arc::new(AtomicUsize::new(0));
    let (counted, elided_in, written_in) = (
        Arc::clone(&explored),
        Arc::clone(&elided),
        Arc::clone(&written),
    );
    builder.check(move || {
        counted.fetch_add(1, Ordering::Relaxed);
        let mem = Arc::new(MemLog::new());
        let storage = Arc::new(MemStorage {
            log: Arc::clone(&mem),
            images: std::sync::Mutex::new(Images::default()),
        });
        // Syncing on: `sync_data` is what moves images into `synced`.
        let file = Arc::new(PageFile::new(Box::new(MemFile(Arc::clone(&storage))), true));
        let inner: Arc<dyn LogDevice> = Arc::clone(&mem) as Arc<dyn LogDevice>;
        let log = Arc::new(LogTail::new(inner, &[Consumer::Cleaner], 64));
        let clean = Arc::new(AtomicU64::new(0));
        let latch = Arc::new(Mutex::new(BufferPool::with_frames_for_model(
            Arc::clone(&file),
            1,
            Arc::clone(&clean),
        )));

        // Before the threads: a committed change to page 0 that no stored image has yet, so
        // the cleaner has work whatever the transaction does.
        let first = fix_and_update(&latch, &log, &mem, 0, b"a", b"a");
        mem.flush(first).unwrap();

        let cleaner = {
            let (log, file, clean, mem) = (
                Arc::clone(&log),
                Arc::clone(&file),
                Arc::clone(&clean),
                Arc::clone(&mem),
            );
            thread::spawn(move || {
                let mut cache = ImageCache::default();
                for _ in 0..scenario.rounds {
                    clean_round(&log, &file, &clean, &mut cache, &mem);
                }
                cache
            })
        };
        let updater = {
            let (latch, log, mem) = (Arc::clone(&latch), Arc::clone(&log), Arc::clone(&mem));
            thread::spawn(move || {
                for &(id, key) in scenario.updates {
                    let lsn = fix_and_update(&latch, &log, &mem, id, key, key);
                    // The commit, after the latch, as `Transaction::commit` flushes.
                    log.flush(lsn).unwrap();
                }
            })
        };
        let evictor = {
            let (latch, log, mem, storage, clean) = (
                Arc::clone(&latch),
                Arc::clone(&log),
                Arc::clone(&mem),
                Arc::clone(&storage),
                Arc::clone(&clean),
            );
            let (elided, written) = (Arc::clone(&elided_in), Arc::clone(&written_in));
            thread::spawn(move || {
                let (mut did_elide, mut did_write) = (false, false);
                for &id in scenario.evictions {
                    let (before, after) = fix(&latch, &log, &mem, id, "an evicting fix");
                    did_elide |= after.elided > before.elided;
                    did_write |= after.eviction_writes > before.eviction_writes;
                    // A power cut now would leave the synced images: whatever clean LSN the
                    // pool can see from here on, they must hold it.
                    let seen = clean.load(Ordering::Acquire);
                    assert_clean_lsn_covered(seen, &storage, &mem, &PAGES);
                }
                if did_elide {
                    elided.fetch_add(1, Ordering::Relaxed);
                }
                if did_write {
                    written.fetch_add(1, Ordering::Relaxed);
                }
            })
        };
        let mut cache = cleaner.join().unwrap();
        updater.join().unwrap();
        evictor.join().unwrap();

        let seen = clean.load(Ordering::Acquire);
        assert_clean_lsn_covered(seen, &storage, &mem, &PAGES);
        // Each fix evicts the other page (with or without a write) and re-reads this one.
        for (round, &id) in [0, 1, 0].iter().enumerate() {
            fix(&latch, &log, &mem, id, &format!("re-fix {round}"));
        }
        // One more round, from the cache of the last, must bring the clean LSN up to the
        // durable log and keep the invariant.
        clean_round(&log, &file, &clean, &mut cache, &mem);
        let seen = clean.load(Ordering::Acquire);
        assert_clean_lsn_covered(seen, &storage, &mem, &PAGES);
        assert_eq!(
            seen,
            mem.durable_lsn().get(),
            "a round with nothing running alongside cleans up to the durable LSN"
        );
        fix(&latch, &log, &mem, 1, "the final fix");
        fix(&latch, &log, &mem, 0, "the final fix");
    });
    let (elided, written) = (
        elided.load(Ordering::Relaxed),
        written.load(Ordering::Relaxed),
    );
    println!(
        "{}: {} interleavings explored (preemption bound {bound:?}) in {:.1} s; the evicting \
         thread elided a write in {elided} and wrote a page in {written}",
        scenario.name,
        explored.load(Ordering::Relaxed),
        started.elapsed().as_secs_f64(),
    );
    assert!(
        elided > 0,
        "no interleaving evicted a dirty page without a write"
    );
    assert!(
        written > 0,
        "no interleaving evicted a dirty page with a write"
    );
}

#[test]
fn one_round_against_one_update_and_one_eviction() {
    static SCENARIO: Scenario = Scenario {
        name: "one round, one update, one eviction",
        rounds: 1,
        updates: &[(0, b"b")],
        evictions: &[1],
    };
    model(&SCENARIO, 3);
}

#[test]
fn two_rounds_against_updates_and_evictions_of_both_pages() {
    static SCENARIO: Scenario = Scenario {
        name: "two rounds, two updates, two evictions",
        rounds: 2,
        updates: &[(0, b"b"), (1, b"c")],
        evictions: &[1, 0],
    };
    model(&SCENARIO, 3);
}
