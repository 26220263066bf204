//! `tools::read_available`: reading a log another process is appending to (a standby's mirror,
//! followed by `stela mount-follow`). It returns records in order from any LSN, resumes at a
//! read point, ends quietly where the newest segment's complete frames end (a frame being
//! written is not damage), and refuses an LSN below the log's first segment.

use std::io::{Seek, SeekFrom, Write};
use std::sync::Arc;
use stela_wal::storage::StdStorage;
use stela_wal::{tools, Error, Lsn, Wal, WalOptions};

fn write_log(dir: &std::path::Path, records: u64) {
    let wal: Wal<u64> = Wal::open(
        dir,
        WalOptions::default()
            .segment_bytes(64 << 10)
            .create_if_missing(true),
    )
    .unwrap();
    for n in 1..=records {
        wal.append(&n).unwrap();
    }
    wal.commit(Lsn::new(records)).unwrap();
}

#[test]
fn records_are_read_in_order_from_any_point_and_resumed() {
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path(), 5000);
    let storage = Arc::new(StdStorage);
    let first =
        tools::read_available(dir.path(), storage.clone(), Lsn::new(1), 3000, None).unwrap();
    assert_eq!(first.records.len(), 3000);
    assert!(first.segments.len() > 1, "the log spans several segments");
    let second = tools::read_available(
        dir.path(),
        storage.clone(),
        Lsn::new(3001),
        usize::MAX,
        first.next,
    )
    .unwrap();
    let lsns: Vec<u64> = first
        .records
        .iter()
        .chain(&second.records)
        .map(|(lsn, payload)| {
            assert_eq!(first.codec.decode::<u64>(payload).unwrap(), lsn.get());
            lsn.get()
        })
        .collect();
    assert_eq!(lsns, (1..=5000).collect::<Vec<_>>());
    let nothing =
        tools::read_available(dir.path(), storage, Lsn::new(5001), 10, second.next).unwrap();
    assert!(nothing.records.is_empty());
}

#[test]
fn a_frame_still_being_written_ends_the_read_quietly() {
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path(), 100);
    // Half a frame after the last record of the newest segment, as a writer caught mid-write
    // leaves it.
    let mut segments: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| {
            let path = e.unwrap().path();
            (path.extension()? == "wal").then_some(path)
        })
        .collect();
    segments.sort();
    let newest = segments.last().unwrap();
    let all =
        tools::read_available(dir.path(), Arc::new(StdStorage), Lsn::new(1), 1000, None).unwrap();
    assert_eq!(all.records.len(), 100);
    let end = all
        .next
        .expect("the reader stands in the newest segment")
        .offset;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .open(newest)
        .unwrap();
    file.seek(SeekFrom::Start(end)).unwrap();
    file.write_all(&[0x5a; 7]).unwrap();
    let again =
        tools::read_available(dir.path(), Arc::new(StdStorage), Lsn::new(1), 1000, None).unwrap();
    assert_eq!(again.records.len(), 100);
}

#[test]
fn records_below_the_first_segment_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path(), 5000);
    let wal: Wal<u64> = Wal::open(
        dir.path(),
        WalOptions::default()
            .segment_bytes(64 << 10)
            .create_if_missing(true),
    )
    .unwrap();
    wal.truncate_before(Lsn::new(4000)).unwrap();
    drop(wal);
    let read = tools::read_available(dir.path(), Arc::new(StdStorage), Lsn::new(1), 10, None);
    assert!(matches!(read, Err(Error::Truncated { .. })), "{read:?}");
}
