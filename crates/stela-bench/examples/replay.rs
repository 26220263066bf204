//! Open and replay timings of an existing log of the benchmark's records, for working on
//! recovery and `Wal::par_iter_from` (keep a log with `stela-bench wal --dir DIR`).
//!
//! `cargo run --release -p stela-bench --example replay -- DIR [DECODE_THREADS]`

use std::time::Instant;
use stela_bench::record::Record;
use stela_wal::{Codec, Lsn, Wal, WalOptions};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = args
        .next()
        .expect("DIR: a log of MessagePack benchmark records");
    let threads: usize = args
        .next()
        .map_or(2, |s| s.parse().expect("DECODE_THREADS"));
    for _ in 0..5 {
        let started = Instant::now();
        let options = WalOptions::default().codec(Codec::MessagePack);
        let wal: Wal<Record> = Wal::open(&dir, options).expect("open");
        let opened = started.elapsed().as_secs_f64();
        let mut records = 0u64;
        for item in wal.par_iter_from(Lsn::FIRST, threads).expect("reader") {
            item.expect("record");
            records += 1;
        }
        let total = started.elapsed().as_secs_f64();
        println!(
            "{records} records, {threads} decode threads: open {opened:.3} s, open + replay \
             {total:.3} s, {:.2} M records/s",
            records as f64 / total / 1e6
        );
    }
}
