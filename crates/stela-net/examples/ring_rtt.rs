//! The round trip of a `buffered` append of one 100-byte record through the shared-memory ring,
//! between two threads that both spin: the client submits and waits; the daemon thread copies
//! the entry out, checks it, copies the record into a buffer (standing in for the pool),
//! consumes and completes. Prints the median and the tail.
//!
//! ```sh
//! cargo run --release -p stela-net --example ring_rtt [-- ROUNDS [sleep]]
//! ```
//!
//! Both threads spin the whole time: on a machine with fewer than two idle cores the numbers
//! mostly measure the scheduler. With `sleep` the client does not spin: for every answer it
//! sets `client_waiting` and calls FUTEX_WAIT (the daemon still spins, and pays a FUTEX_WAKE
//! each time). The answer usually lands before the client really blocks, so this measures the
//! cost of the sleeping protocol more than that of a wake-up from a real sleep (the tail does).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};
use stela_net::shm::{ClientRing, Completion, DaemonRing, EntryKind};
use stela_proto::Durability;

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("ROUNDS is a number"))
        .unwrap_or(200_000);
    let sleep = std::env::args().nth(2).as_deref() == Some("sleep");
    let (mut daemon, memfd, eventfd) = DaemonRing::create(1 << 20, 64).expect("create the ring");
    let mut client = ClientRing::from_fds(memfd, eventfd).expect("open the client end");
    client.set_spin(if sleep {
        Duration::ZERO
    } else {
        Duration::from_millis(1)
    });

    let stop = Arc::new(AtomicBool::new(false));
    let daemon_stop = stop.clone();
    let server = thread::spawn(move || {
        let mut scratch = Vec::with_capacity(4096);
        let mut pool = Vec::with_capacity(1 << 20);
        let mut lsn = 0u64;
        while !daemon_stop.load(Ordering::Relaxed) {
            match daemon.next_entry(&mut scratch) {
                Ok(Some(entry)) => {
                    let seq = entry.seq;
                    if pool.len() > (1 << 20) - 4096 {
                        pool.clear();
                    }
                    let first = lsn + 1;
                    for (payload, _crc) in entry.records() {
                        pool.extend_from_slice(payload);
                        lsn += 1;
                    }
                    daemon.consume();
                    daemon.complete(seq, Completion::ok(first, lsn));
                }
                Ok(None) => std::hint::spin_loop(),
                Err(fault) => panic!("{fault}"),
            }
        }
    });

    let record = [0x42u8; 100];
    let mut round_trip = || {
        let started = Instant::now();
        let seq = client
            .submit(0, EntryKind::Append, Durability::Buffered, 0, &[&record])
            .expect("submit");
        let completion = client.wait(seq).expect("wait");
        let elapsed = started.elapsed();
        assert!(completion.is_ok());
        elapsed
    };
    for _ in 0..rounds / 10 {
        round_trip(); // warm up: caches, page faults, the spin budget
    }
    let started = Instant::now();
    let mut samples: Vec<Duration> = (0..rounds).map(|_| round_trip()).collect();
    let total = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    server.join().expect("daemon thread");

    samples.sort_unstable();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize];
    let ns = |d: Duration| d.as_nanos();
    println!(
        "ring round trip, 100-byte buffered append, {rounds} rounds, {}:\n  \
         median {} ns, p90 {} ns, p99 {} ns, p99.9 {} ns, max {} ns\n  \
         {:.0} round trips/s (one client, one at a time)",
        if sleep {
            "client not spinning (futex protocol every time)"
        } else {
            "both ends spinning"
        },
        ns(at(0.5)),
        ns(at(0.9)),
        ns(at(0.99)),
        ns(at(0.999)),
        ns(at(1.0)),
        rounds as f64 / total.as_secs_f64()
    );
}
