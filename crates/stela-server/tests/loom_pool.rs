//! A loom model of the buffer pool: every interleaving (up to a preemption bound) of two
//! appenders, the flusher and an emergency flush, run against the pool's own code (under
//! `--cfg loom`, `pool.rs` takes its Mutex, Condvar and Arc from loom through `crate::sync`).
//!
//! Run it (about 2 minutes on 2 cores, plus the build; not part of the default `cargo test`,
//! where this file compiles to nothing):
//!
//! ```sh
//! RUSTFLAGS="--cfg loom" cargo test -p stela-server --test loom_pool --release
//! ```
//!
//! (Add `CARGO_TARGET_DIR=target/loom` to keep the loom build from replacing the normal one.)
//!
//! `LOOM_MAX_PREEMPTIONS=N` overrides the preemption bound each model sets (4, 4, 3 and 4: about
//! 620,000, 320,000, 110,000 and 560,000 interleavings, 71 s in all); one more explores several times as many. Each
//! model prints how many it explored (`-- --nocapture`). On a failure loom prints the
//! interleaving; set `LOOM_LOG=trace LOOM_LOCATION=1` to see every step.
//!
//! What it proves, in every explored interleaving:
//! - no deadlock and no lost wake-up: every thread finishes (loom reports a deadlock when all
//!   threads block), including an appender waiting for space while the flusher holds the only
//!   buffers, a `disk` waiter, and the flusher's exit once shutdown has drained everything;
//! - nothing acknowledged is lost: every append that returned `Ok` was handed to the flusher
//!   and completed, each payload exactly once, at the LSNs the append returned;
//! - nothing is invented: the flusher completes only payloads whose append returned `Ok`;
//! - LSNs are consecutive per log from 1, and the flusher sees each log's runs in LSN order;
//! - a batch gets consecutive LSNs even when another thread appends to the same log;
//! - a `disk` waiter (`wait_durable`, or `wait_durable_leading`, which writes the log itself
//!   when nobody else is) returns `Ok` only once its LSN has been completed;
//! - the emergency flush (`begin_drain(PowerFailing)` + `wait_drained`) leaves no dirty byte,
//!   and appends after it are refused with `PowerFailing`;
//! - fail stop: once a write of one log fails, its `disk` waiter and its later appends are told
//!   (`Failed`, naming the failure), its buffers are given back, the drain still ends, and the
//!   other log's records are all completed.
#![cfg(loom)]

use loom::sync::{Arc, Mutex};
use loom::thread;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use stela_server::pool::{Admission, LogId, Pool, PoolConfig, PoolError};

/// A record: which appender, which of its records. One byte each, so a record takes 5 bytes of
/// buffer (4 bytes of length prefix).
fn payload(appender: u8, index: u8) -> Vec<u8> {
    vec![appender << 4 | index]
}

/// Two buffers of 10 bytes: two records fill one, so two logs, or one log with three records,
/// already need both, and an appender has to wait for the flusher to give one back.
fn config() -> PoolConfig {
    PoolConfig {
        buffers: 2,
        buffer_bytes: 10,
        dirty_cap: 20,
        // Every non-empty buffer is eligible at once: the model never depends on time (loom has
        // no clock; `sync::wait_timeout` is an untimed wait under loom).
        write_threshold: 1,
        flush_interval: Duration::from_secs(3600),
    }
}

/// What one append was given.
#[derive(Debug, Clone)]
struct Acked {
    log: LogId,
    first: u64,
    last: u64,
    payloads: Vec<Vec<u8>>,
}

/// What the flusher completed: (log, lsn, payload), in completion order.
type Completed = Arc<Mutex<Vec<(LogId, u64, Vec<u8>)>>>;

fn flusher(pool: Arc<Pool>, completed: Completed) {
    while let Some(work) = pool.next_work() {
        {
            let mut done = completed.lock().unwrap();
            for (lsn, payload) in (work.first_lsn()..).zip(work.payloads()) {
                done.push((work.log, lsn, payload.to_vec()));
            }
            assert_eq!(
                work.first_lsn() + work.payloads().count() as u64 - 1,
                work.last_lsn(),
                "a work item's runs are not contiguous"
            );
        }
        pool.complete(work, Ok(()));
    }
}

/// Appends `records` (as one batch when `batch`, else one at a time); stops at the first refusal,
/// which must be the emergency flush's. Returns what was acknowledged.
fn appender(pool: &Pool, log: LogId, records: &[Vec<u8>], batch: bool) -> Vec<Acked> {
    let mut acked = Vec::new();
    let groups: Vec<&[Vec<u8>]> = if batch {
        vec![records]
    } else {
        records.chunks(1).collect()
    };
    for group in groups {
        let slices: Vec<&[u8]> = group.iter().map(Vec::as_slice).collect();
        match pool.append(log, &slices) {
            Ok((first, last)) => {
                assert_eq!(last + 1 - first, group.len() as u64, "a batch's LSNs");
                acked.push(Acked {
                    log,
                    first,
                    last,
                    payloads: group.to_vec(),
                });
            }
            Err(PoolError::PowerFailing) => break,
            Err(other) => panic!("append refused with {other:?}"),
        }
    }
    acked
}

/// Checks the outcome of a model run against what the appenders were told.
fn check(acked: &[Acked], completed: &[(LogId, u64, Vec<u8>)], logs: usize) {
    // Completed, per log: consecutive LSNs from 1, in order.
    for log in 0..logs {
        let lsns: Vec<u64> = completed
            .iter()
            .filter(|c| c.0 == log)
            .map(|c| c.1)
            .collect();
        let expected: Vec<u64> = (1..=lsns.len() as u64).collect();
        assert_eq!(lsns, expected, "log {log}: completed LSNs");
    }
    // Exactly the acknowledged records, each once, where the append said.
    let mut from_acks: Vec<(LogId, u64, Vec<u8>)> = acked
        .iter()
        .flat_map(|a| {
            (a.first..=a.last)
                .zip(&a.payloads)
                .map(move |(lsn, p)| (a.log, lsn, p.clone()))
        })
        .collect();
    let mut done = completed.to_vec();
    from_acks.sort();
    done.sort();
    assert_eq!(
        done, from_acks,
        "completed records differ from acknowledged ones"
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

/// Two logs. Appender 0 appends two records one at a time to log 0 and waits for the second to
/// be durable (a `disk` commit); appender 1 appends a batch of two to log 1. Meanwhile the main
/// thread announces a power failure and waits for the emergency flush, then shuts the flusher
/// down.
#[test]
fn emergency_flush_with_two_logs() {
    explore("emergency_flush_with_two_logs", 4, || {
        let pool = Arc::new(Pool::new(config()));
        let logs = [pool.add_log(0), pool.add_log(0)];
        let completed: Completed = Arc::new(Mutex::new(Vec::new()));

        let flush = {
            let (pool, completed) = (Arc::clone(&pool), Arc::clone(&completed));
            thread::spawn(move || flusher(pool, completed))
        };
        let disk = {
            let (pool, completed) = (Arc::clone(&pool), Arc::clone(&completed));
            thread::spawn(move || {
                let records = [payload(0, 0), payload(0, 1)];
                let acked = appender(&pool, logs[0], &records, false);
                if let Some(last) = acked.last().map(|a| a.last) {
                    pool.wait_durable(logs[0], last).expect("disk commit");
                    let done = completed.lock().unwrap();
                    assert!(
                        done.iter().any(|c| c.0 == logs[0] && c.1 == last),
                        "wait_durable returned before LSN {last} was completed"
                    );
                }
                acked
            })
        };
        let batch = {
            let pool = Arc::clone(&pool);
            thread::spawn(move || appender(&pool, logs[1], &[payload(1, 0), payload(1, 1)], true))
        };

        // The emergency flush.
        pool.begin_drain(Admission::PowerFailing);
        pool.wait_drained();
        assert_eq!(pool.stats().dirty_bytes, 0, "dirty bytes after the drain");
        assert_eq!(
            pool.append(logs[0], &[b"late".as_slice()]),
            Err(PoolError::PowerFailing)
        );

        // The appenders finish (refused or done) before shutdown, so that a refusal can only be
        // the power failure's.
        let mut acked = disk.join().unwrap();
        acked.extend(batch.join().unwrap());
        pool.begin_drain(Admission::ShuttingDown);
        flush.join().unwrap();

        let stats = pool.stats();
        assert_eq!(stats.dirty_bytes, 0);
        assert_eq!(stats.free_buffers, 2, "a buffer was never given back");
        check(&acked, &completed.lock().unwrap(), logs.len());
    });
}

/// One log, two appenders: single records from one, a batch from the other, racing for LSNs and
/// for the two buffers (three records need both, and the flusher must give one back before the
/// next fits). The main thread drains for shutdown once both are done: nothing may be left.
#[test]
fn two_appenders_one_log_then_shutdown() {
    explore("two_appenders_one_log_then_shutdown", 4, || {
        let pool = Arc::new(Pool::new(config()));
        let log = pool.add_log(0);
        let completed: Completed = Arc::new(Mutex::new(Vec::new()));

        let flush = {
            let (pool, completed) = (Arc::clone(&pool), Arc::clone(&completed));
            thread::spawn(move || flusher(pool, completed))
        };
        let single = {
            let pool = Arc::clone(&pool);
            thread::spawn(move || appender(&pool, log, &[payload(0, 0), payload(0, 1)], false))
        };
        let batch = {
            let pool = Arc::clone(&pool);
            thread::spawn(move || appender(&pool, log, &[payload(1, 0), payload(1, 1)], true))
        };
        let mut acked = single.join().unwrap();
        acked.extend(batch.join().unwrap());
        assert_eq!(acked.iter().map(|a| a.payloads.len()).sum::<usize>(), 4);

        pool.begin_drain(Admission::ShuttingDown);
        pool.wait_drained();
        assert_eq!(
            pool.positions(log),
            (5, 4),
            "(next, durable) after the drain"
        );
        flush.join().unwrap();
        assert_eq!(
            pool.append(log, &[b"late".as_slice()]),
            Err(PoolError::ShuttingDown)
        );
        check(&acked, &completed.lock().unwrap(), 1);
    });
}

/// Fail stop. The flusher fails every write of log 0 and completes those of log 1. Appender 0
/// appends two records to log 0 and waits for them to be durable; appender 1 appends a batch of
/// two to log 1 and waits too. The main thread then shuts down.
#[test]
fn a_failed_write_stops_only_its_log() {
    explore("a_failed_write_stops_only_its_log", 3, || {
        let pool = Arc::new(Pool::new(config()));
        let logs = [pool.add_log(0), pool.add_log(0)];
        let completed: Completed = Arc::new(Mutex::new(Vec::new()));

        let flush = {
            let (pool, completed) = (Arc::clone(&pool), Arc::clone(&completed));
            thread::spawn(move || {
                while let Some(work) = pool.next_work() {
                    if work.log == logs[0] {
                        pool.complete(work, Err("disk gone".into()));
                        continue;
                    }
                    let mut done = completed.lock().unwrap();
                    for (lsn, payload) in (work.first_lsn()..).zip(work.payloads()) {
                        done.push((work.log, lsn, payload.to_vec()));
                    }
                    drop(done);
                    pool.complete(work, Ok(()));
                }
            })
        };
        let failing = {
            let pool = Arc::clone(&pool);
            thread::spawn(move || {
                let mut acked = 0;
                for index in 0..2 {
                    match pool.append(logs[0], &[payload(0, index).as_slice()]) {
                        Ok(_) => acked += 1,
                        Err(PoolError::Failed(why)) => {
                            assert_eq!(why, "disk gone");
                            break;
                        }
                        Err(other) => panic!("append to log 0 refused with {other:?}"),
                    }
                }
                assert!(
                    acked >= 1,
                    "the first append comes before any write of log 0"
                );
                assert_eq!(
                    pool.wait_durable(logs[0], 1),
                    Err(PoolError::Failed("disk gone".into())),
                    "a disk waiter of the failed log"
                );
            })
        };
        let healthy = {
            let pool = Arc::clone(&pool);
            thread::spawn(move || {
                let acked = appender(&pool, logs[1], &[payload(1, 0), payload(1, 1)], true);
                pool.wait_durable(logs[1], 2)
                    .expect("log 1 is not affected");
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
        assert_eq!(pool.log_failure(logs[0]).as_deref(), Some("disk gone"));
        assert_eq!(pool.log_failure(logs[1]), None);
        assert_eq!(pool.log_dirty_bytes(logs[0]), 0);
        let completed = completed.lock().unwrap();
        assert!(completed.iter().all(|c| c.0 == logs[1]));
        check(&acked, &completed, logs.len());
    });
}

/// The waiter-led `disk` commit (`wait_durable_leading`, what a connection does for `disk`):
/// two appenders on one log each append a record and then wait for it with the leading wait,
/// writing the log themselves when nobody else is, while the flusher runs too. Checks that every
/// leading waiter returns only once its LSN is completed (by itself, the other waiter or the
/// flusher), that no run is written twice or out of order, and that shutdown drains.
#[test]
fn disk_waiters_lead_their_own_rounds_beside_the_flusher() {
    explore(
        "disk_waiters_lead_their_own_rounds_beside_the_flusher",
        4,
        || {
            let pool = Arc::new(Pool::new(config()));
            let log = pool.add_log(0);
            let completed: Completed = Arc::new(Mutex::new(Vec::new()));
            let flush = {
                let (pool, completed) = (Arc::clone(&pool), Arc::clone(&completed));
                thread::spawn(move || flusher(pool, completed))
            };
            let waiters: Vec<_> = (0..2u8)
                .map(|appender_id| {
                    let (pool, completed) = (Arc::clone(&pool), Arc::clone(&completed));
                    thread::spawn(move || {
                        let acked = appender(&pool, log, &[payload(appender_id, 0)], false);
                        let lsn = acked[0].last;
                        pool.wait_durable_leading(log, lsn, |work| {
                            let mut done = completed.lock().unwrap();
                            for (lsn, payload) in (work.first_lsn()..).zip(work.payloads()) {
                                done.push((work.log, lsn, payload.to_vec()));
                            }
                            Ok(())
                        })
                        .expect("a disk wait on a healthy log succeeds");
                        assert!(
                            completed.lock().unwrap().iter().any(|c| c.1 == lsn),
                            "returned before LSN {lsn} was written"
                        );
                        acked
                    })
                })
                .collect();
            let mut acked = Vec::new();
            for waiter in waiters {
                acked.extend(waiter.join().unwrap());
            }
            pool.begin_drain(Admission::ShuttingDown);
            pool.wait_drained();
            flush.join().unwrap();
            check(&acked, &completed.lock().unwrap(), 1);
        },
    );
}
