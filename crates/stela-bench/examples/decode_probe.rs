//! Throwaway probe: open + replay timings of an existing log (not part of the product).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use std::time::Instant;
use stela_bench::record::Record;
use stela_wal::{Codec, Lsn, Wal, WalOptions};
fn main() {
    let dir = std::env::args().nth(1).unwrap();
    let threads: usize = std::env::args().nth(2).map_or(2, |s| s.parse().unwrap());
    for _ in 0..5 {
        let t = Instant::now();
        let wal: Wal<Record> =
            Wal::open(&dir, WalOptions::default().codec(Codec::MessagePack)).unwrap();
        let opened = t.elapsed().as_secs_f64();
        let mut n = 0u64;
        for item in wal.par_iter_from(Lsn::FIRST, threads).unwrap() {
            let (_, r) = item.unwrap();
            n += r.id as u64 & 1;
        }
        let total = t.elapsed().as_secs_f64();
        println!("threads {threads}: open {opened:.3}s total {total:.3}s {n}");
    }
}
