//! The power-failure notice (SIGPWR, sent with kill(2) to a real `stela serve`) while clients
//! append through shared-memory rings. The daemon is SIGKILLed after the emergency flush, so
//! only what that flush wrote can be in the files; the logs are then read embedded.
//!
//! What it proves:
//! - `sigpwr_flushes_what_ring_clients_had_acknowledged`: ring clients fill the pool to its
//!   dirty cap (appends wait for space: the cap, set by the power window, is below the
//!   buffers, and nothing else makes a buffer go to disk), stop, and commit at `disk`; then ring
//!   clients of a second log leave records in memory only (a buffer that is neither full, nor
//!   old, nor wanted by a `disk` waiter: `status` shows them dirty and not durable, and nothing
//!   else dirty). SIGPWR: the emergency flush reports no failure and exactly those bytes;
//!   afterwards nothing is dirty and everything appended is durable; `buffered` and `disk`
//!   appends through rings (of connections opened before and after the notice) are refused
//!   with `PowerFailing`; `stela status`, human and JSON, shows the flush and the refusal of
//!   writes. After a SIGKILL both logs hold exactly the acknowledged records at their LSNs.
//! - `sigpwr_amid_ring_appends_acknowledges_only_what_it_flushes`: SIGPWR at a random moment
//!   while three ring clients append (batches at `buffered`, singles at `buffered`, batches at
//!   `disk`): when the flush is reported nothing is dirty and everything appended is durable;
//!   every client's appends end with `PowerFailing`, none is acknowledged once the flush is
//!   over, and after a SIGKILL the log is exactly the acknowledged records: nothing
//!   acknowledged was left out of the flush, nothing refused was written.
//!
//! Randomness (the signal's moment) comes from `STELA_SHM_SEED`, printed. The long version:
//! `cargo test -p stela --test shm_power -- --ignored`.

mod common;

use common::records::{key_of, open_ring_client, read_embedded, rec, rec_sized, Key, Rec, Rng};
use common::{stela, text, Daemon};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use stela_client::{Address, Connection, Durability, ErrorCode, Lsn};
use stela_proto::{EmergencyFlush, RequestBody, ResponseBody, StatusReport};

/// A pool of 4 x 256 KiB under a cap of about 200 kB (an assumed disk rate of 16 MB/s x half
/// of the 50 ms window x 0.5). A buffer is written only when an append finds the cap reached,
/// when a `disk` waiter needs it, or at the power failure: never because it is full (the cap
/// comes first), old, or past the write threshold. So the pool fills to its cap whatever the
/// speed of the disk.
const DAEMON_ARGS: [&str; 10] = [
    "--buffers",
    "4",
    "--buffer-size",
    "256KiB",
    "--write-threshold",
    "256KiB",
    "--flush-interval",
    "600000",
    "--assume-write-rate",
    "16000000",
];
const RECORD_BYTES: usize = 1000;

fn status(daemon: &Daemon) -> StatusReport {
    let answer = Connection::connect_admin(&Address::Unix(daemon.socket()))
        .and_then(|mut admin| admin.request(RequestBody::Status));
    match answer {
        Ok(ResponseBody::Status(report)) => *report,
        Ok(other) => panic!("Status answered {other:?}"),
        Err(error) => panic!("status: {error}\ndaemon output:\n{}", daemon.output()),
    }
}

fn send_sigpwr(daemon: &Daemon) {
    // SAFETY: kill(2) on the daemon child this test started and has not reaped.
    let sent = unsafe { libc::kill(daemon.child.id() as libc::pid_t, libc::SIGPWR) };
    assert_eq!(sent, 0, "kill(daemon, SIGPWR)");
}

/// Waits (at most 10 s) for the emergency flush the SIGPWR started to be reported; returns it
/// and a status taken after it was.
fn emergency_flush(daemon: &Daemon) -> (EmergencyFlush, StatusReport) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        // (A report's fields are read one after the other: one that shows the flush may show
        // the dirty bytes from before it. The next report is wholly after it.)
        if let Some(flush) = status(daemon).last_emergency_flush {
            return (flush, status(daemon));
        }
        assert!(
            Instant::now() < deadline,
            "SIGPWR never led to an emergency flush"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn assert_power_failing(what: &str, result: Result<stela_client::Lsn, stela_client::Error>) {
    match result {
        Err(error) => assert_eq!(
            error.code(),
            Some(ErrorCode::PowerFailing),
            "{what}: refused for another reason: {error}"
        ),
        Ok(lsn) => panic!("{what}: acknowledged (LSN {lsn}) after the power-failure notice"),
    }
}

/// Checks that `log` holds exactly the acknowledged records, each at its LSN.
fn assert_exactly(log: &[Rec], acked: &BTreeMap<u64, Key>, name: &str) {
    for (&lsn, &key) in acked {
        let found = log.get(lsn as usize - 1).map(key_of);
        assert_eq!(
            found,
            Some(key),
            "log {name}: acknowledged LSN {lsn} is missing or holds another record"
        );
    }
    assert_eq!(
        log.len(),
        acked.len(),
        "log {name} holds records that were never acknowledged"
    );
}

/// Sets its flag when dropped, panicking or not.
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

fn insert_acks(acked: &mut BTreeMap<u64, Key>, last: u64, keys: &[Key]) {
    let n = keys.len() as u64;
    for (i, &key) in keys.iter().enumerate() {
        let lsn = last + 1 - n + i as u64;
        assert!(acked.insert(lsn, key).is_none(), "LSN {lsn} acked twice");
    }
}

#[test]
fn sigpwr_flushes_what_ring_clients_had_acknowledged() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("d");
    let daemon = Daemon::start(&dir, &DAEMON_ARGS);
    let socket = daemon.socket();
    let cap = status(&daemon).dirty_cap;
    assert!(
        cap.derivation.contains("limited by the power window"),
        "{cap:?}"
    );
    let cap = cap.bytes;
    assert!((190_000..=200_000).contains(&cap), "cap {cap}");

    // 1. Fill: three ring clients append until the pool has made appends wait for space.
    let stop = AtomicBool::new(false);
    let mut fill_acked = BTreeMap::new();
    std::thread::scope(|scope| {
        let writers: Vec<_> = (0..3u32)
            .map(|writer| {
                let (socket, stop) = (&socket, &stop);
                scope.spawn(move || {
                    let wal = open_ring_client(socket, "fill", Durability::Buffered);
                    let mut acks = Vec::new();
                    let mut seq = 0;
                    while !stop.load(Ordering::SeqCst) {
                        let key = Key::new(0, writer, seq);
                        let lsn = wal
                            .append(&rec_sized(key, RECORD_BYTES))
                            .expect("an append while filling");
                        acks.push((lsn.get(), key));
                        seq += 1;
                    }
                    acks
                })
            })
            .collect();
        let stopper = SetOnDrop(&stop); // the writers stop even if an assertion fails
        let deadline = Instant::now() + Duration::from_secs(30);
        while status(&daemon).appends_waited == 0 {
            assert!(Instant::now() < deadline, "the pool never filled");
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(stopper);
        for writer in writers {
            for (lsn, key) in writer.join().unwrap() {
                assert!(
                    fill_acked.insert(lsn, key).is_none(),
                    "LSN {lsn} acked twice"
                );
            }
        }
    });

    // The fill log goes to disk (a `disk` commit through a ring): nothing is dirty now, and
    // the next records stay in memory until the notice.
    let last_fill = *fill_acked.keys().next_back().unwrap();
    open_ring_client(&socket, "fill", Durability::Disk)
        .commit(Lsn::new(last_fill))
        .expect("a disk commit through a ring");
    let quiet = status(&daemon);
    assert_eq!(
        quiet.dirty_bytes, 0,
        "dirty bytes after a disk commit of everything"
    );
    assert_eq!(quiet.free_buffers, 4);

    // 2. Records only in memory: a second log's buffer, far from full, not old, not waited for,
    // and well under the cap (so no append waits for space, which would make it eligible).
    let tail: Vec<_> = (0..3)
        .map(|_| open_ring_client(&socket, "tail", Durability::Buffered))
        .collect();
    let mut tail_acked = BTreeMap::new();
    for seq in 0..20 {
        for (writer, wal) in tail.iter().enumerate() {
            let key = Key::new(1, writer as u32, seq);
            let lsn = wal.append(&rec_sized(key, RECORD_BYTES)).unwrap();
            insert_acks(&mut tail_acked, lsn.get(), &[key]);
        }
    }
    let before = status(&daemon);
    let tail_before = before.logs.iter().find(|l| l.name == "tail").unwrap();
    assert_eq!(tail_before.positions.last_lsn, 60);
    assert_eq!(
        tail_before.positions.durable_lsn, 0,
        "the tail records were written before the notice"
    );
    let tail_dirty = tail_before.dirty_bytes;
    assert!(tail_dirty >= 60 * RECORD_BYTES as u64, "{tail_before:?}");
    assert_eq!(before.dirty_bytes, tail_dirty, "only the tail is dirty");
    assert_eq!(before.power, "normal");

    // 3. The notice.
    send_sigpwr(&daemon);
    let (flush, after) = emergency_flush(&daemon);
    eprintln!(
        "emergency flush: {} B in {} us (budget {} us); {} B were only in memory in log tail, \
         {} acknowledged while filling",
        flush.bytes,
        flush.micros,
        flush.budget_micros,
        tail_dirty,
        fill_acked.len()
    );
    assert!(flush.failures.is_empty(), "{:?}", flush.failures);
    assert_eq!(
        flush.bytes, tail_dirty,
        "the flush did not write what was dirty (the cap is {cap} B)"
    );
    assert_eq!(after.dirty_bytes, 0, "dirty bytes left after the flush");
    assert!(after.power.starts_with("failed"), "{}", after.power);
    for log in &after.logs {
        assert_eq!(
            log.positions.durable_lsn, log.positions.last_lsn,
            "log {} is not all durable after the flush",
            log.name
        );
        assert!(log.failure.is_none(), "{log:?}");
    }

    // 4. Writes are refused, through rings opened before and after the notice.
    assert_power_failing(
        "a buffered append by a ring opened before",
        tail[0].append(&rec(Key::new(1, 0, 20))),
    );
    let disk = open_ring_client(&socket, "tail", Durability::Disk);
    assert_power_failing(
        "a disk append by a ring opened after",
        disk.append_durable(&rec(Key::new(1, 9, 0))),
    );
    assert_power_failing(
        "a buffered batch by a ring opened after",
        disk.append_batch(&[rec(Key::new(1, 9, 0)), rec(Key::new(1, 9, 1))]),
    );

    // 5. What the administrator sees.
    let out = stela(&["status", "--dir", daemon.dir_arg()]);
    // Exit 3: unhealthy while the power-fail notice is in force (the health check).
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let human = text(&out);
    assert!(
        human.contains("power: failed: writes refused until power-restore"),
        "{human}"
    );
    assert!(
        human.contains(&format!("last emergency flush: {} B in", flush.bytes)),
        "{human}"
    );
    let out = stela(&["status", "--dir", daemon.dir_arg(), "--json"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let shown = &json["last_emergency_flush"];
    assert_eq!(shown["bytes"], flush.bytes, "{json:#}");
    assert_eq!(shown["micros"], flush.micros, "{json:#}");
    assert_eq!(shown["failures"].as_array().map(Vec::len), Some(0));
    assert_eq!(json["dirty_bytes"], 0);

    // 6. Only what the flush wrote survives a SIGKILL: everything acknowledged, nothing else.
    drop((tail, disk));
    daemon.kill();
    assert_exactly(&read_embedded(&dir, "fill"), &fill_acked, "fill");
    assert_exactly(&read_embedded(&dir, "tail"), &tail_acked, "tail");
}

/// How a writer ended: its number, its acknowledgements, and the refusal that stopped it (or
/// the LSN it was given after the flush).
type WriterEnd = (u32, BTreeMap<u64, Key>, Result<stela_client::Error, u64>);

fn sigpwr_amid_appends(rounds: u32) {
    let mut rng = Rng::from_env("sigpwr_amid_ring_appends");
    for round in 0..rounds {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("d");
        let daemon = Daemon::start(&dir, &DAEMON_ARGS);
        let socket = daemon.socket();
        let writers = [
            (0u32, Durability::Buffered, 4u64),
            (1, Durability::Buffered, 1),
            (2, Durability::Disk, 3),
        ];
        // Set once the flush is reported: an append that starts after that and is acknowledged
        // fails the test.
        let flushed = AtomicBool::new(false);
        let delay = rng.millis(10, 150);
        let results: Vec<WriterEnd> = std::thread::scope(|scope| {
            let handles: Vec<_> = writers
                .iter()
                .map(|&(writer, durability, batch)| {
                    let (socket, flushed) = (&socket, &flushed);
                    scope.spawn(move || {
                        let wal = open_ring_client(socket, "amid", durability);
                        let mut acked = BTreeMap::new();
                        let mut seq = 0;
                        let end = loop {
                            let after_flush = flushed.load(Ordering::SeqCst);
                            let n = 1 + seq % batch;
                            let keys: Vec<Key> =
                                (seq..seq + n).map(|s| Key::new(round, writer, s)).collect();
                            let records: Vec<Rec> =
                                keys.iter().map(|&k| rec_sized(k, RECORD_BYTES)).collect();
                            let result = match durability {
                                Durability::Disk => wal.append_batch_durable(&records),
                                _ => wal.append_batch(&records),
                            };
                            match result {
                                Ok(last) if after_flush => break Err(last.get()),
                                Ok(last) => insert_acks(&mut acked, last.get(), &keys),
                                Err(error) => break Ok(error),
                            }
                            seq += n;
                        };
                        (writer, acked, end)
                    })
                })
                .collect();
            // Should an assertion fail before the flush, the writers still stop.
            let release = SetOnDrop(&flushed);
            std::thread::sleep(delay);
            send_sigpwr(&daemon);
            let (flush, report) = emergency_flush(&daemon);
            assert!(flush.failures.is_empty(), "{:?}", flush.failures);
            // Reported only once everything acknowledged is on disk.
            assert_eq!(report.dirty_bytes, 0, "dirty bytes left after the flush");
            for log in &report.logs {
                assert_eq!(log.positions.durable_lsn, log.positions.last_lsn, "{log:?}");
            }
            drop(release);
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut acked = BTreeMap::new();
        for (writer, acks, end) in results {
            match end {
                Ok(error) => assert_eq!(
                    error.code(),
                    Some(ErrorCode::PowerFailing),
                    "round {round}: writer {writer} was refused for another reason: {error}"
                ),
                Err(lsn) => panic!(
                    "round {round}: writer {writer} was acknowledged (LSN {lsn}) after the \
                     emergency flush"
                ),
            }
            for (lsn, key) in acks {
                assert!(acked.insert(lsn, key).is_none(), "LSN {lsn} acked twice");
            }
        }
        daemon.kill();
        let log = read_embedded(&dir, "amid");
        assert_exactly(&log, &acked, "amid");
        eprintln!(
            "round {round}: SIGPWR after {delay:?}: {} acknowledged, all in the log, nothing else",
            acked.len()
        );
    }
}

#[test]
fn sigpwr_amid_ring_appends_acknowledges_only_what_it_flushes() {
    sigpwr_amid_appends(2);
}

#[test]
#[ignore = "long: 30 rounds"]
fn sigpwr_amid_ring_appends_acknowledges_only_what_it_flushes_30_rounds() {
    sigpwr_amid_appends(30);
}
