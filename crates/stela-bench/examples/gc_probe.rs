use std::time::Instant;
use stela_wal::{Codec, Wal, WalOptions};
fn main() {
    let writers: usize = std::env::args().nth(1).map_or(64, |s| s.parse().unwrap());
    let per: usize = std::env::args().nth(2).map_or(3000, |s| s.parse().unwrap());
    let dir = tempfile::tempdir().unwrap();
    let wal: Wal<Vec<u8>> =
        Wal::open(dir.path(), WalOptions::default().codec(Codec::Postcard)).unwrap();
    let rec = vec![7u8; 98];
    let barrier = std::sync::Barrier::new(writers + 1);
    let t = std::thread::scope(|s| {
        for _ in 0..writers {
            s.spawn(|| {
                barrier.wait();
                for _ in 0..per {
                    let l = wal.append(&rec).unwrap();
                    wal.commit(l).unwrap();
                }
            });
        }
        barrier.wait();
        Instant::now()
    });
    let secs = t.elapsed().as_secs_f64();
    let st = wal.log().stats();
    let n = (writers * per) as f64;
    println!(
        "writers {writers}: {:.0} rec/s, syncs {}, flushes {}, rec/sync {:.1}, sync/s {:.0}",
        n / secs,
        st.syncs,
        st.flushes,
        n / st.syncs as f64,
        st.syncs as f64 / secs
    );
}
