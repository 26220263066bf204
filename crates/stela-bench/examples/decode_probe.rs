#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use std::time::Instant;
use stela_bench::record::Record;
use stela_wal::{Codec, Lsn, Wal, WalOptions};
fn main() {
    let dir = std::env::args().nth(1).unwrap();
    for verify in [true, false] {
        for threads in [0usize, 1, 2, 3] {
            let t = Instant::now();
            let wal: Wal<Record> = Wal::open(
                &dir,
                WalOptions::default()
                    .codec(Codec::MessagePack)
                    .verify_on_open(verify),
            )
            .unwrap();
            let opened = t.elapsed().as_secs_f64();
            let mut n = 0u64;
            if threads == 0 {
                for item in wal.iter().unwrap() {
                    let (_, r) = item.unwrap();
                    n += r.id as u64 & 1;
                }
            } else {
                for item in wal.par_iter_from(Lsn::FIRST, threads).unwrap() {
                    let (_, r) = item.unwrap();
                    n += r.id as u64 & 1;
                }
            }
            let total = t.elapsed().as_secs_f64();
            println!("verify {verify} threads {threads}: open {opened:.3}s total {total:.3}s {n}");
        }
    }
}
