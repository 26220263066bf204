//! Round trip of one `buffered` append through a daemon in this process: `cargo run --release
//! -p stela-client --example rtt [N]`. Prints p50/p99 and appends per second.

use std::time::Instant;
use stela_client::{Wal, WalOptions};
use stela_server::{DaemonConfig, Server};

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(100_000);
    let dir = tempfile::tempdir().unwrap();
    let mut config = DaemonConfig::new(dir.path());
    config.assume_write_rate = Some(1 << 30);
    let server = Server::start(config).unwrap();
    let wal: Wal<Vec<u8>> = Wal::open(server.socket_path(), "rtt", WalOptions::default()).unwrap();
    let record = vec![7u8; 90];
    let mut lat = Vec::with_capacity(n);
    let start = Instant::now();
    for _ in 0..n {
        let t = Instant::now();
        wal.append(&record).unwrap();
        lat.push(t.elapsed().as_nanos() as u64);
    }
    let secs = start.elapsed().as_secs_f64();
    lat.sort_unstable();
    println!(
        "{n} appends: {:.0}/s p50 {:.1} us p99 {:.1} us",
        n as f64 / secs,
        lat[n / 2] as f64 / 1e3,
        lat[n * 99 / 100] as f64 / 1e3
    );
    drop(wal);
    server.shutdown().unwrap();
}
