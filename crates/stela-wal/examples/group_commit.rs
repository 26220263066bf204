//! Many threads committing through one log: shows how group commit shares fdatasyncs.
//!
//! `cargo run --release -p stela-wal --example group_commit -- [WRITERS] [SECONDS] [DIR]`

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use stela_wal::{Codec, Wal, WalOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let writers: usize = args.next().map_or(Ok(64), |a| a.parse())?;
    let seconds: f64 = args.next().map_or(Ok(3.0), |a| a.parse())?;
    let base = args.next().map_or_else(std::env::temp_dir, Into::into);
    let dir = tempfile::tempdir_in(base)?;
    let wal: Wal<Vec<u8>> = Wal::open(dir.path(), WalOptions::default().codec(Codec::Postcard))?;
    let record = vec![7u8; 98]; // ~100 bytes encoded
    let stop = AtomicBool::new(false);
    let commits = AtomicU64::new(0);
    let started = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..writers {
            scope.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    let lsn = wal.append(&record).expect("append");
                    wal.commit(lsn).expect("commit");
                    commits.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        std::thread::sleep(Duration::from_secs_f64(seconds));
        stop.store(true, Ordering::Relaxed);
    });
    let elapsed = started.elapsed().as_secs_f64();
    let n = commits.load(Ordering::Relaxed);
    let stats = wal.log().stats();
    println!(
        "{writers} writers: {n} durable commits in {elapsed:.2}s = {:.0} commits/s; {} fdatasyncs, {:.1} commits per sync, {:.0} us per sync round",
        n as f64 / elapsed,
        stats.syncs,
        n as f64 / stats.syncs as f64,
        elapsed * 1e6 / stats.syncs as f64,
    );
    Ok(())
}
