//! The least a blocking group commit can cost on this machine: `cargo run --release -p
//! stela-bench --example wake_ceiling -- [WRITERS] [SECONDS]`.
//!
//! W threads each "commit" in a loop: join the current round and sleep on a condition variable
//! until a leader has done one real `pwrite` of 100 bytes + `fdatasync` for the round, then go
//! again. There is no encoding, no copying and no log format: only the fdatasync and the thread
//! hand-offs. Whatever this reaches bounds any design in which each committer is a blocked OS
//! thread (stela's `commit`, okaywal, raft-engine), so it tells how far the WAL's own work is
//! from the machine's floor. It prints commits/s and the mean committers per fdatasync.

use std::io::Write as _;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

#[derive(Default)]
struct Round {
    /// Rounds completed so far.
    done: u64,
    leader: bool,
    commits: u64,
    syncs: u64,
}

fn main() {
    let mut args = std::env::args().skip(1);
    let writers: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(64);
    let seconds: f64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(3.0);
    let dir = tempfile::tempdir_in(".").expect("temp dir in the current directory");
    let file = std::fs::File::create(dir.path().join("ceiling")).expect("scratch file");
    // Sized up front: extending the file on every write would add metadata to each sync.
    file.set_len(64 << 20).expect("sizing the scratch file");
    let file = Arc::new(file);
    let state = Arc::new((Mutex::new(Round::default()), Condvar::new()));
    let stop_at = Instant::now() + Duration::from_secs_f64(seconds);
    let threads: Vec<_> = (0..writers)
        .map(|_| {
            let (state, file) = (Arc::clone(&state), Arc::clone(&file));
            std::thread::spawn(move || {
                let (lock, woken) = &*state;
                let mut offset = 0u64;
                while Instant::now() < stop_at {
                    let mut round = lock.lock().unwrap();
                    // A round already syncing started before this commit's write: it needs
                    // the round after that one.
                    let needed = round.done + if round.leader { 2 } else { 1 };
                    while round.done < needed {
                        if round.leader {
                            round = woken.wait(round).unwrap();
                            continue;
                        }
                        // Lead the next round: one write + one fdatasync for everyone who joined.
                        round.leader = true;
                        drop(round);
                        file.write_all_at(&[7u8; 100], offset % (64 << 20)).unwrap();
                        file.sync_data().unwrap();
                        offset += 100;
                        round = lock.lock().unwrap();
                        round.leader = false;
                        round.done += 1;
                        round.syncs += 1;
                        woken.notify_all();
                    }
                    round.commits += 1;
                }
            })
        })
        .collect();
    let started = Instant::now();
    for thread in threads {
        thread.join().unwrap();
    }
    let elapsed = started.elapsed().as_secs_f64();
    let round = state.0.lock().unwrap();
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "writers {writers}: {:.0} commits/s, {:.1} committers per fdatasync, {:.0} fdatasync/s",
        round.commits as f64 / elapsed,
        round.commits as f64 / round.syncs.max(1) as f64,
        round.syncs as f64 / elapsed
    )
    .unwrap();
}
