//! A full disk in the daemon, end to end through the socket, over an in-memory disk
//! (`FaultStorage` with a space limit) behind a gate (`GatedStorage`).
//!
//! Segments are preallocated, so space runs out when the daemon creates a log's next segment.
//! With the disk held, a log is given records that run past its first (64 KiB) segment, the
//! last one appended at `disk` (its waiter is registered before the disk moves); then the space
//! is limited to what the files use now plus less than a segment, and the disk released.
//!
//! What `disk_full_refuses_then_resumes_by_itself` proves:
//! - the records that fit the current segment are written and synced (`durable_lsn` reaches
//!   them); the `disk` waiter whose record needed the new segment is not answered while the
//!   disk is full (its record is placed and kept: a `DiskFull` answer would tell its client to
//!   write it again, issue 54 finding 7);
//! - from then on that log's appends (`buffered` and `disk`) are refused with `DiskFull`
//!   (nothing of them placed), and `disk` commits too (they name their LSN, which stays
//!   appended), with a message naming the log and the lack of space, while
//!   nothing acknowledged is dropped: the records past the segment stay in the daemon's memory
//!   (dirty, and served by a read);
//! - the daemon stays up, `status` shows the log waiting for space (not stopped), and another log whose segment has
//!   room goes on taking and syncing records;
//! - once space is freed the log goes on by itself (the daemon retries the segment every
//!   second; the test allows ten): the waiting `disk` append is answered `Ok` at its LSN,
//!   appends are acknowledged again and a `disk` commit of everything succeeds, the status
//!   shows no log waiting for space or stopped, and after shutdown the files hold every
//!   acknowledged record at its LSN, in order, and nothing else.

mod common;

use common::{check_acked, read_back, rec, NoHang, RawClient, Rec};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use stela_proto::{Durability, ErrorCode, RequestBody, ResponseBody};
use stela_server::{DaemonConfig, Server};
use stela_wal::storage::{FaultStorage, GatedStorage};

const SEGMENT_BYTES: u64 = 64 << 10;
const RECORD_BYTES: usize = 1000;
/// Records appended with the disk held: well past the first segment (about 60 fit).
const HELD: u64 = 100;

fn log_dir(name: &str) -> PathBuf {
    PathBuf::from("/stela/logs").join(name)
}

/// Bytes the logs' files occupy on the in-memory disk.
fn used_bytes(fault: &FaultStorage) -> u64 {
    ["full", "other"]
        .iter()
        .flat_map(|log| {
            let dir = log_dir(log);
            fault
                .file_names(&dir)
                .into_iter()
                .map(move |name| dir.join(name))
        })
        .map(|path| fault.read_file(&path).map_or(0, |bytes| bytes.len() as u64))
        .sum()
}

/// Polls `condition` for up to ten seconds.
fn eventually(what: &str, condition: impl FnMut() -> bool) {
    stela_testkit::eventually(what, Duration::from_secs(10), condition);
}

fn assert_disk_full(what: &str, refused: &common::Refused) {
    assert_eq!(
        refused.code,
        ErrorCode::DiskFull,
        "{what}: refused with another code: {refused:?}"
    );
    assert!(
        refused.message.contains("\"full\"") && refused.message.contains("space"),
        "{what}: the message does not name the log and the lack of space: {}",
        refused.message
    );
}

#[test]
fn disk_full_refuses_then_resumes_by_itself() {
    let socket_dir = tempfile::tempdir().unwrap();
    let fault = FaultStorage::new();
    let gated = GatedStorage::new(Arc::new(fault.clone()));
    let mut config = DaemonConfig::new("/stela");
    config.socket = Some(socket_dir.path().join("stela.sock"));
    config.storage = Arc::new(gated.clone());
    config.segment_bytes = SEGMENT_BYTES;
    // 16 x 16 KiB: room for everything appended while the disk is held.
    config.buffers = 16;
    config.buffer_bytes = 16 << 10;
    config.write_threshold = 4096;
    config.flush_interval = Duration::from_millis(5);
    config.assume_write_rate = Some(1 << 30);
    config.spin = Duration::ZERO;
    let server = NoHang::new(Server::start(config).expect("daemon starts"));
    let socket = server.socket_path().to_owned();

    let mut full = RawClient::connect(&socket);
    let hf = full.open("full");
    let mut other = RawClient::connect(&socket);
    let ho = other.open("other");
    let mut other_acked = vec![(1, vec![rec(9, 0, 10)])];
    other
        .append(ho, Durability::Disk, &other_acked[0].1)
        .unwrap();

    // With the disk held, records past the first segment; the last at `disk`.
    let mut acked: Vec<(u64, Vec<Rec>)> = Vec::new();
    gated.stall();
    for seq in 0..HELD - 1 {
        let record = rec(0, seq, RECORD_BYTES);
        let (first, _) = full
            .append(hf, Durability::Buffered, std::slice::from_ref(&record))
            .unwrap();
        assert_eq!(first, seq + 1);
        acked.push((first, vec![record]));
    }
    let last_held = rec(0, HELD - 1, RECORD_BYTES);
    let waiter = {
        let (socket, record) = (socket.clone(), last_held.clone());
        std::thread::spawn(move || {
            let mut client = RawClient::connect(&socket);
            let handle = client.open("full");
            client.append(handle, Durability::Disk, std::slice::from_ref(&record))
        })
    };
    // Placed, and so its waiter registered (one event loop answers both connections).
    eventually("the disk append to be placed", || {
        full.positions(hf).last_lsn == HELD
    });
    // No room for a second segment of either log; then the disk comes back.
    fault.set_space_limit(Some(used_bytes(&fault) + SEGMENT_BYTES / 2));
    gated.release();
    eventually("the segment to be found full", || {
        server
            .status()
            .logs
            .iter()
            .any(|l| l.name == "full" && l.waiting_for_space.is_some())
    });
    acked.push((HELD, vec![last_held.clone()]));

    // The first segment's records are durable; the rest wait in memory.
    let positions = full.positions(hf);
    assert_eq!(positions.last_lsn, HELD);
    let in_first_segment = positions.durable_lsn;
    assert!(
        in_first_segment > 0 && in_first_segment < HELD,
        "durable {in_first_segment} of {HELD}"
    );
    eprintln!("{in_first_segment} records fit the first segment; the disk is full");

    // Refused from now on, at every level.
    for durability in [Durability::Buffered, Durability::Disk] {
        let refused = full
            .append(hf, durability, &[rec(0, 999, 10)])
            .expect_err("an append acknowledged on a full disk");
        assert_disk_full(&format!("an append at {durability:?}"), &refused);
    }
    // A `disk` commit is refused: it names its LSN, which stays appended (placed, kept,
    // written once space returns), so its answer says which record it is about.
    let refused = full
        .commit(hf, HELD - 1, Durability::Disk)
        .expect_err("a disk commit acknowledged without its segment");
    assert_disk_full("a disk commit", &refused);
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !waiter.is_finished(),
        "the disk append ended while the disk is full: {:?}",
        waiter.join()
    );

    // Nothing was dropped: the records past the segment are in memory, and served.
    let status = server.status();
    let full_status = status.logs.iter().find(|l| l.name == "full").unwrap();
    let waiting = full_status
        .waiting_for_space
        .as_deref()
        .expect("status shows the full disk");
    assert!(waiting.contains("space"), "{waiting}");
    assert!(
        full_status.failure.is_none(),
        "a log waiting for space is not stopped: {full_status:?}"
    );
    assert!(full_status.dirty_bytes > 0, "{full_status:?}");
    match full.request(RequestBody::Read {
        handle: hf,
        from: in_first_segment + 1,
        max_records: 1000,
        max_bytes: 1 << 20,
    }) {
        Ok(ResponseBody::Records { records, .. }) => {
            let lsns: Vec<u64> = records.iter().map(|(lsn, _)| *lsn).collect();
            assert_eq!(
                lsns,
                (in_first_segment + 1..=HELD).collect::<Vec<_>>(),
                "the records waiting for space are not all readable"
            );
        }
        other => panic!("read on a full disk: {other:?}"),
    }

    // The daemon is up, and a log with room in its segment goes on.
    for seq in 1..10u64 {
        let record = rec(9, seq, 10);
        let durability = if seq % 3 == 0 {
            Durability::Disk
        } else {
            Durability::Buffered
        };
        let (first, _) = other
            .append(ho, durability, std::slice::from_ref(&record))
            .expect("the other log's append on a full disk");
        other_acked.push((first, vec![record]));
    }
    other
        .commit(ho, 10, Durability::Disk)
        .expect("the other log syncs");
    let status = server.status();
    assert!(status
        .logs
        .iter()
        .find(|l| l.name == "other")
        .unwrap()
        .failure
        .is_none());

    // Space is freed: the log goes on by itself.
    fault.set_space_limit(None);
    let mut seq = HELD;
    let resumed = Instant::now();
    eventually("the log to take appends again", || {
        let record = rec(0, seq, RECORD_BYTES);
        match full.append(hf, Durability::Buffered, std::slice::from_ref(&record)) {
            Ok((first, _)) => {
                acked.push((first, vec![record]));
                seq += 1;
                true
            }
            Err(refused) => {
                assert_disk_full("an append before the retry", &refused);
                std::thread::sleep(Duration::from_millis(20));
                false
            }
        }
    });
    eprintln!(
        "appends resumed {} ms after the space was freed",
        resumed.elapsed().as_millis()
    );
    let (first, _) = waiter
        .join()
        .unwrap()
        .expect("the disk append placed before the disk filled, once space is back");
    assert_eq!(first, HELD);
    // More than a segment more, then everything synced.
    while seq < 3 * HELD {
        let records: Vec<Rec> = (seq..seq + 3).map(|s| rec(0, s, RECORD_BYTES)).collect();
        let (first, _) = full.append(hf, Durability::Buffered, &records).unwrap();
        acked.push((first, records));
        seq += 3;
    }
    let last = full.positions(hf).last_lsn;
    full.commit(hf, last, Durability::Disk)
        .expect("a disk commit once space is back");
    assert_eq!(full.positions(hf).durable_lsn, last);
    let status = server.status();
    assert!(
        status
            .logs
            .iter()
            .all(|l| l.failure.is_none() && l.waiting_for_space.is_none()),
        "{:?}",
        status.logs
    );
    assert_eq!(status.dirty_bytes, 0);

    drop((full, other));
    server.shutdown().expect("clean shutdown");
    let log = read_back(&log_dir("full"), Arc::new(fault.clone()));
    check_acked(&log, &acked, false);
    assert_eq!(
        log.len(),
        acked.iter().map(|(_, r)| r.len()).sum::<usize>(),
        "the log holds records nobody appended"
    );
    let other_log = read_back(&log_dir("other"), Arc::new(fault.clone()));
    check_acked(&other_log, &other_acked, true);
}
