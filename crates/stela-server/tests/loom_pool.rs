//! A loom model of the buffer pool: every interleaving (up to a preemption bound) of appenders,
//! flushers, `disk` waiters and the emergency flush, run against the pool's own code (under
//! `--cfg stela_loom`, `pool.rs` takes its Mutex, Condvar and Arc from loom through `crate::sync`).
//!
//! Run it (a few minutes on 2 cores, plus the build; not part of the default `cargo test`,
//! where this file compiles to nothing):
//!
//! ```sh
//! RUSTFLAGS="--cfg stela_loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test -p stela-server --test loom_pool --release -- --nocapture
//! ```
//!
//! `LOOM_MAX_PREEMPTIONS=N` overrides the preemption bound each model sets. Each model prints
//! how many interleavings it explored. On a failure loom prints the interleaving; set
//! `LOOM_LOG=trace LOOM_LOCATION=1` to see every step.
//!
//! The model drives the pool the way the daemon does: appends never block in the pool
//! (`try_append` refuses with `NoSpace`; the appender waits for the flusher's "space freed",
//! as the event loop parks the request), and `disk` waiters are callbacks the flusher that
//! completed the write releases (`when_durable`), as the event loop's and the rings' are.
//!
//! What it proves, in every explored interleaving:
//! - no deadlock and no lost wake-up: every thread finishes (loom reports a deadlock when all
//!   threads block), including an appender refused for space while the flusher holds the only
//!   buffers (the "space freed" report cannot be missed), a `disk` waiter, two flushers
//!   sharing the work, and the flushers' exit once shutdown has drained everything;
//! - nothing acknowledged is lost: every append that returned `Ok` was written and completed,
//!   each record exactly once, at the LSN the append returned, with the bytes appended;
//! - nothing is invented: only records whose append returned `Ok` are written;
//! - LSNs are consecutive per log from 1, each log's runs are written in LSN order and at
//!   consecutive file offsets (the pool, not the writer, places every byte);
//! - a batch gets consecutive LSNs even when another thread appends to the same log;
//! - a `disk` waiter is released `Ok` only once its LSN has been written, and exactly once;
//! - the emergency flush (`begin_drain(PowerFailing)` + `wait_drained`) leaves no dirty byte,
//!   and appends after it are refused with `PowerFailing`;
//! - fail stop: once a write of one log fails, its `disk` waiter and its later appends are told
//!   (`Failed`), its buffers are given back, the drain still ends, and the other log's records
//!   are all written.
#![cfg(stela_loom)]

use loom::sync::{Arc, Condvar, Mutex};
use loom::thread;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use stela_server::pool::{
    Admission, LogId, LogSetup, Outcome, Pool, PoolConfig, PoolError, Record,
};

/// A `disk` waiter: the slot its release fills.
type Note = Arc<(Mutex<Vec<Result<(), String>>>, Condvar)>;

fn note() -> Note {
    Arc::new((Mutex::new(Vec::new()), Condvar::new()))
}

/// Waits until `note` is released; panics if it is released twice.
fn wait_note(note: &Note) -> Result<(), String> {
    let (slot, condvar) = &**note;
    let mut released = slot.lock().unwrap();
    while released.is_empty() {
        released = condvar.wait(released).unwrap();
    }
    assert_eq!(released.len(), 1, "a waiter released twice");
    released[0].clone()
}

/// "Space was freed", as a generation counter: an appender reads it before trying, so a report
/// that comes between its refusal and its wait is not missed.
type Space = Arc<(Mutex<u64>, Condvar)>;

/// A record: which appender, which of its records. One byte each, so a frame takes 21 bytes.
fn payload(appender: u8, index: u8) -> Vec<u8> {
    vec![appender << 4 | index]
}

const FRAME: usize = stela_format::frame::HEADER_BYTES + 1;

/// Two buffers of two frames: two logs, or one log with three records, already need both, and
/// an appender has to wait for a flusher to give one back.
fn config() -> PoolConfig {
    PoolConfig {
        buffers: 2,
        buffer_bytes: 2 * FRAME,
        dirty_cap: 4 * FRAME,
        // Every non-empty buffer is eligible at once: the model never depends on time (loom has
        // no clock; `sync::wait_timeout` is an untimed wait under loom).
        write_threshold: 1,
        flush_interval: Duration::from_secs(3600),
    }
}

fn new_log(pool: &Pool<Note>) -> LogId {
    pool.add_log(LogSetup {
        next_lsn: 1,
        segment_start: 1,
        capacity: 1 << 20,
        write_offset: 256,
        durable_offset: 256,
        segment_bytes: 1 << 20,
    })
}

/// What one append was given.
#[derive(Debug, Clone)]
struct Acked {
    log: LogId,
    first: u64,
    last: u64,
    payloads: Vec<Vec<u8>>,
}

/// What the flushers wrote: (log, lsn, payload, file offset), in completion order.
type Written = Arc<Mutex<Vec<(LogId, u64, Vec<u8>, u64)>>>;

fn failure() -> stela_server::pool::Failure {
    stela_server::pool::Failure::new(stela_wal::Error::Io {
        op: "write",
        path: "/model".into(),
        source: std::io::Error::other("disk gone"),
    })
}

/// A flusher: writes every piece of work (or fails those of `failing`), releases what that
/// releases, reports freed space.
fn flusher(pool: Arc<Pool<Note>>, written: Written, space: Space, failing: Option<LogId>) {
    while let Some(work) = pool.next_work() {
        let outcome = if Some(work.log) == failing {
            Outcome::Failed(failure())
        } else {
            let mut done = written.lock().unwrap();
            for run in &work.runs {
                let mut offset = run.offset();
                for (lsn, payload) in run.records() {
                    done.push((work.log, lsn, payload.to_vec(), offset));
                    offset += (stela_format::frame::HEADER_BYTES + payload.len()) as u64;
                }
            }
            Outcome::Durable
        };
        let released = pool.complete(work, outcome);
        for (note, outcome) in released.waiters {
            let (slot, condvar) = &*note;
            slot.lock()
                .unwrap()
                .push(outcome.map_err(|e| e.to_string()));
            condvar.notify_all();
        }
        if released.space_freed {
            let (generation, condvar) = &*space;
            *generation.lock().unwrap() += 1;
            condvar.notify_all();
        }
    }
}

/// Appends `records` (as one batch when `batch`, else one at a time), waiting for space like
/// the event loop; stops at the first refusal. Returns what was acknowledged and the refusal.
fn appender(
    pool: &Pool<Note>,
    space: &Space,
    log: LogId,
    records: &[Vec<u8>],
    batch: bool,
) -> (Vec<Acked>, Option<PoolError>) {
    let mut acked = Vec::new();
    let groups: Vec<&[Vec<u8>]> = if batch {
        vec![records]
    } else {
        records.chunks(1).collect()
    };
    for group in groups {
        let recs: Vec<Record<'_>> = group.iter().map(|p| Record::new(p)).collect();
        loop {
            let seen = *space.0.lock().unwrap();
            match pool.try_append(log, &recs) {
                Ok((first, last)) => {
                    assert_eq!(last + 1 - first, group.len() as u64, "a batch's LSNs");
                    acked.push(Acked {
                        log,
                        first,
                        last,
                        payloads: group.to_vec(),
                    });
                    break;
                }
                Err(PoolError::NoSpace) => {
                    let (generation, condvar) = &**space;
                    let mut current = generation.lock().unwrap();
                    while *current == seen {
                        current = condvar.wait(current).unwrap();
                    }
                }
                Err(refused) => return (acked, Some(refused)),
            }
        }
    }
    (acked, None)
}

/// Checks what was written against what the appenders were told.
fn check(acked: &[Acked], written: &[(LogId, u64, Vec<u8>, u64)], logs: &[LogId]) {
    for &log in logs {
        let mine: Vec<_> = written.iter().filter(|w| w.0 == log).collect();
        let lsns: Vec<u64> = mine.iter().map(|w| w.1).collect();
        let expected: Vec<u64> = (1..=lsns.len() as u64).collect();
        assert_eq!(lsns, expected, "log {log}: written LSNs");
        // Consecutive offsets from the segment header's end.
        let mut offset = 256;
        for w in &mine {
            assert_eq!(
                w.3, offset,
                "log {log}: LSN {} written at the wrong offset",
                w.1
            );
            offset += (stela_format::frame::HEADER_BYTES + w.2.len()) as u64;
        }
    }
    let mut from_acks: Vec<(LogId, u64, Vec<u8>)> = acked
        .iter()
        .flat_map(|a| {
            (a.first..=a.last)
                .zip(&a.payloads)
                .map(move |(lsn, p)| (a.log, lsn, p.clone()))
        })
        .collect();
    let mut done: Vec<_> = written.iter().map(|w| (w.0, w.1, w.2.clone())).collect();
    from_acks.sort();
    done.sort();
    assert_eq!(
        done, from_acks,
        "written records differ from acknowledged ones"
    );
}

/// Runs `model` under loom with preemption bound `bound` (unless `LOOM_MAX_PREEMPTIONS` is
/// set), and prints how many interleavings it explored.
fn explore(name: &str, bound: usize, model: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(bound);
    }
    let bound = builder.preemption_bound;
    let iterations = std::sync::Arc::new(AtomicUsize::new(0));
    let counter = std::sync::Arc::clone(&iterations);
    let started = std::time::Instant::now();
    builder.check(move || {
        counter.fetch_add(1, Ordering::Relaxed);
        model();
    });
    let iterations = iterations.load(Ordering::Relaxed);
    eprintln!(
        "{name}: {iterations} interleavings explored (preemption bound {bound:?}) in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(iterations > 1, "loom explored a single interleaving");
}

fn space() -> Space {
    Arc::new((Mutex::new(0), Condvar::new()))
}

/// Two logs. Appender 0 appends two records one at a time to log 0 and waits for the second to
/// be durable (a `disk` commit); appender 1 appends a batch of two to log 1. Meanwhile the main
/// thread announces a power failure and waits for the emergency flush, then shuts down.
#[test]
fn emergency_flush_with_two_logs() {
    explore("emergency_flush_with_two_logs", 3, || {
        let pool = Arc::new(Pool::new(config()));
        let logs = [new_log(&pool), new_log(&pool)];
        let (written, space): (Written, Space) = (Arc::new(Mutex::new(Vec::new())), space());
        let flush = {
            let (pool, written, space) =
                (Arc::clone(&pool), Arc::clone(&written), Arc::clone(&space));
            thread::spawn(move || flusher(pool, written, space, None))
        };
        let disk = {
            let (pool, written, space) =
                (Arc::clone(&pool), Arc::clone(&written), Arc::clone(&space));
            thread::spawn(move || {
                let (acked, refused) = appender(
                    &pool,
                    &space,
                    logs[0],
                    &[payload(0, 0), payload(0, 1)],
                    false,
                );
                assert!(
                    matches!(refused, None | Some(PoolError::PowerFailing)),
                    "{refused:?}"
                );
                if let Some(last) = acked.last().map(|a| a.last) {
                    let waiter = note();
                    match pool.when_durable(logs[0], last, Arc::clone(&waiter)) {
                        Ok(Some(_)) => {}
                        Ok(None) => wait_note(&waiter).expect("disk commit"),
                        Err((_, e)) => panic!("disk wait refused: {e}"),
                    }
                    assert!(
                        written
                            .lock()
                            .unwrap()
                            .iter()
                            .any(|w| w.0 == logs[0] && w.1 == last),
                        "released before LSN {last} was written"
                    );
                }
                acked
            })
        };
        let batch = {
            let (pool, space) = (Arc::clone(&pool), Arc::clone(&space));
            thread::spawn(move || {
                let (acked, refused) = appender(
                    &pool,
                    &space,
                    logs[1],
                    &[payload(1, 0), payload(1, 1)],
                    true,
                );
                assert!(
                    matches!(refused, None | Some(PoolError::PowerFailing)),
                    "{refused:?}"
                );
                acked
            })
        };

        pool.begin_drain(Admission::PowerFailing);
        pool.wait_drained();
        assert_eq!(pool.stats().dirty_bytes, 0, "dirty bytes after the drain");
        assert!(matches!(
            pool.try_append(logs[0], &[Record::new(b"late")]),
            Err(PoolError::PowerFailing)
        ));

        let mut acked = disk.join().unwrap();
        acked.extend(batch.join().unwrap());
        pool.begin_drain(Admission::ShuttingDown);
        flush.join().unwrap();
        let stats = pool.stats();
        assert_eq!(stats.dirty_bytes, 0);
        assert_eq!(stats.free_buffers, 2, "a buffer was never given back");
        check(&acked, &written.lock().unwrap(), &logs);
    });
}

/// One log, two appenders (single records and a batch) racing for LSNs and for the two
/// buffers, two flushers sharing the work. The main thread drains for shutdown once both are
/// done: nothing may be left.
#[test]
fn two_appenders_two_flushers_one_log_then_shutdown() {
    explore(
        "two_appenders_two_flushers_one_log_then_shutdown",
        3,
        || {
            let pool = Arc::new(Pool::new(config()));
            let log = new_log(&pool);
            let (written, space): (Written, Space) = (Arc::new(Mutex::new(Vec::new())), space());
            let flushers: Vec<_> = (0..2)
                .map(|_| {
                    let (pool, written, space) =
                        (Arc::clone(&pool), Arc::clone(&written), Arc::clone(&space));
                    thread::spawn(move || flusher(pool, written, space, None))
                })
                .collect();
            let single = {
                let (pool, space) = (Arc::clone(&pool), Arc::clone(&space));
                thread::spawn(move || {
                    appender(&pool, &space, log, &[payload(0, 0), payload(0, 1)], false).0
                })
            };
            let mut acked = appender(&pool, &space, log, &[payload(1, 0), payload(1, 1)], true).0;
            acked.extend(single.join().unwrap());
            assert_eq!(acked.iter().map(|a| a.payloads.len()).sum::<usize>(), 4);

            pool.begin_drain(Admission::ShuttingDown);
            pool.wait_drained();
            assert_eq!(
                pool.positions(log),
                (5, 4),
                "(next, durable) after the drain"
            );
            for flusher in flushers {
                flusher.join().unwrap();
            }
            assert!(matches!(
                pool.try_append(log, &[Record::new(b"late")]),
                Err(PoolError::ShuttingDown)
            ));
            check(&acked, &written.lock().unwrap(), &[log]);
        },
    );
}

/// Fail stop. The flusher fails every write of log 0 and completes those of log 1. Appender 0
/// appends two records to log 0 and waits for the first to be durable; appender 1 appends a
/// batch of two to log 1 and waits too. The main thread then shuts down.
#[test]
fn a_failed_write_stops_only_its_log() {
    explore("a_failed_write_stops_only_its_log", 3, || {
        let pool = Arc::new(Pool::new(config()));
        let logs = [new_log(&pool), new_log(&pool)];
        let (written, space): (Written, Space) = (Arc::new(Mutex::new(Vec::new())), space());
        let flush = {
            let (pool, written, space) =
                (Arc::clone(&pool), Arc::clone(&written), Arc::clone(&space));
            thread::spawn(move || flusher(pool, written, space, Some(logs[0])))
        };
        let failing = {
            let (pool, space) = (Arc::clone(&pool), Arc::clone(&space));
            thread::spawn(move || {
                let (acked, refused) = appender(
                    &pool,
                    &space,
                    logs[0],
                    &[payload(0, 0), payload(0, 1)],
                    false,
                );
                assert!(
                    !acked.is_empty(),
                    "the first append comes before any write of log 0"
                );
                if let Some(refused) = refused {
                    assert!(matches!(refused, PoolError::Failed(_)), "{refused:?}");
                }
                let waiter = note();
                let outcome = match pool.when_durable(logs[0], 1, Arc::clone(&waiter)) {
                    Ok(Some(_)) => Ok(()),
                    Ok(None) => wait_note(&waiter),
                    Err((_, e)) => Err(e.to_string()),
                };
                assert!(
                    outcome.as_ref().is_err_and(|e| e.contains("disk gone")),
                    "a disk waiter of the failed log: {outcome:?}"
                );
            })
        };
        let healthy = {
            let (pool, space) = (Arc::clone(&pool), Arc::clone(&space));
            thread::spawn(move || {
                let (acked, refused) = appender(
                    &pool,
                    &space,
                    logs[1],
                    &[payload(1, 0), payload(1, 1)],
                    true,
                );
                assert!(refused.is_none(), "log 1 is not affected: {refused:?}");
                let waiter = note();
                match pool.when_durable(logs[1], 2, Arc::clone(&waiter)) {
                    Ok(Some(_)) => {}
                    Ok(None) => wait_note(&waiter).expect("log 1 is not affected"),
                    Err((_, e)) => panic!("log 1 is not affected: {e}"),
                }
                acked
            })
        };
        failing.join().unwrap();
        let acked = healthy.join().unwrap();

        pool.begin_drain(Admission::ShuttingDown);
        pool.wait_drained();
        flush.join().unwrap();
        let stats = pool.stats();
        assert_eq!(stats.dirty_bytes, 0);
        assert_eq!(
            stats.free_buffers, 2,
            "the failed log's buffers were not given back"
        );
        assert!(matches!(
            pool.log_failure(logs[0]),
            Some(PoolError::Failed(_))
        ));
        assert!(pool.log_failure(logs[1]).is_none());
        assert_eq!(pool.log_dirty_bytes(logs[0]), 0);
        let written = written.lock().unwrap();
        assert!(written.iter().all(|w| w.0 == logs[1]));
        check(&acked, &written, &logs[1..]);
    });
}
