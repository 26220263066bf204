//! Group commit in isolation, for a fixed count of records: N threads each append a 98-byte
//! record and commit it, RECORDS_PER_WRITER times, on one log; prints records/s and how many
//! records each fdatasync covered. It is the quick loop for working on `stela_wal::log` (the
//! timed variant is stela-wal's own `group_commit` example; the full comparison with peers is
//! `stela-bench wal --writers ...`).
//!
//! `cargo run --release -p stela-bench --example group_commit_count -- WRITERS RECORDS_PER_WRITER`

use std::time::Instant;
use stela_wal::{Codec, Wal, WalOptions};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let mut args = std::env::args().skip(1);
    let writers: usize = args.next().map_or(64, |s| s.parse().expect("WRITERS"));
    let per_writer: usize = args.next().map_or(3000, |s| s.parse().expect("RECORDS"));
    let dir = tempfile::tempdir().expect("temporary directory");
    let options = WalOptions::default().codec(Codec::Postcard);
    let wal: Wal<Vec<u8>> = Wal::open(dir.path(), options).expect("open");
    let record = vec![7u8; 98];
    let barrier = std::sync::Barrier::new(writers + 1);
    let started = std::thread::scope(|scope| {
        for _ in 0..writers {
            scope.spawn(|| {
                barrier.wait();
                for _ in 0..per_writer {
                    let lsn = wal.append(&record).expect("append");
                    wal.commit(lsn).expect("commit");
                }
            });
        }
        barrier.wait();
        Instant::now()
    });
    let seconds = started.elapsed().as_secs_f64();
    let stats = wal.log().stats();
    let records = (writers * per_writer) as f64;
    println!(
        "writers {writers}: {:.0} records/s, {} fdatasyncs, {:.1} records per fdatasync",
        records / seconds,
        stats.syncs,
        records / stats.syncs as f64
    );
}
