//! A neighbour for `stela-bench tpcb --neighbour`: a thread in the benchmark's process that
//! shares nothing with the store (no lock, no file, no page of its memory) and keeps a CPU busy
//! for a set share of each 10 ms while the clients run, either streaming through a buffer
//! larger than the last-level cache or computing in registers.
//!
//! What it is for: telling apart the two ways a background service can slow transactions. A
//! service can interfere through the store's own structures (latches, the log, the pool), which
//! the decoupled services exist to avoid, or only through the machine (CPU time, the caches
//! and the memory bus the CPUs share). A neighbour shows the second kind alone: if a neighbour
//! doing the decoupled cleaner's amount of memory traffic costs the clients what the cleaner
//! costs them, the cleaner's cost is the machine's, and no change to the store removes it.
//!
//! Invariant: the thread stops, and is joined, when the [`Neighbour`] is dropped; it never
//! touches anything but its own buffer.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What the neighbour does while it is busy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NeighbourKind {
    /// Reads and writes one byte per 64-byte line of a 64 MiB buffer, in order: memory
    /// traffic through the caches the CPUs share, as a cleaner's page images make.
    Memory,
    /// Multiplies and adds in registers: CPU time with (almost) no memory traffic.
    Compute,
}

impl NeighbourKind {
    /// The label of a run with this neighbour, after the system's name.
    pub fn label(self) -> &'static str {
        match self {
            NeighbourKind::Memory => "memory-neighbour",
            NeighbourKind::Compute => "compute-neighbour",
        }
    }
}

/// The period the busy share is taken of: the 1 ms cleaner's rounds fit several times.
const PERIOD: Duration = Duration::from_millis(10);

/// Larger than the last-level cache of the machines this runs on (32 MiB on the benchmark
/// VM), so that streaming through it evicts what other threads keep there.
const BUFFER_BYTES: usize = 64 << 20;

/// A running neighbour; dropping it stops it.
pub struct Neighbour {
    stop: Arc<AtomicBool>,
    /// Busy passes made (a statistic for tests: it did run).
    passes: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl Neighbour {
    /// Starts a neighbour of `kind`, busy `busy_percent` (1 to 100) of each period. The
    /// thread inherits the CPUs of the calling thread (with `--pin-clients`, the CPUs the
    /// clients do not use).
    pub fn start(kind: NeighbourKind, busy_percent: u32) -> std::io::Result<Neighbour> {
        let stop = Arc::new(AtomicBool::new(false));
        let passes = Arc::new(AtomicU64::new(0));
        let busy = PERIOD * busy_percent.clamp(1, 100) / 100;
        let thread = std::thread::Builder::new()
            .name(format!("stela-bench-{}", kind.label()))
            .spawn({
                let (stop, passes) = (Arc::clone(&stop), Arc::clone(&passes));
                move || run(kind, busy, &stop, &passes)
            })?;
        Ok(Neighbour {
            stop,
            passes,
            thread: Some(thread),
        })
    }

    /// Busy passes made so far.
    pub fn passes(&self) -> u64 {
        self.passes.load(Ordering::Relaxed)
    }
}

impl Drop for Neighbour {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn run(kind: NeighbourKind, busy: Duration, stop: &AtomicBool, passes: &AtomicU64) {
    // Touched once before the first period, so that the periods measure traffic, not faults.
    let mut buffer = match kind {
        NeighbourKind::Memory => vec![1u8; BUFFER_BYTES],
        NeighbourKind::Compute => Vec::new(),
    };
    let mut at = 0usize;
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    while !stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        while started.elapsed() < busy {
            match kind {
                NeighbourKind::Memory => {
                    for _ in 0..4096 {
                        buffer[at] = buffer[at].wrapping_add(1);
                        at = (at + 64) % BUFFER_BYTES;
                    }
                }
                NeighbourKind::Compute => {
                    for _ in 0..20_000 {
                        state = state
                            .wrapping_mul(6_364_136_223_846_793_005)
                            .wrapping_add(1_442_695_040_888_963_407);
                    }
                }
            }
            passes.fetch_add(1, Ordering::Relaxed);
        }
        std::hint::black_box((&buffer, state));
        if let Some(rest) = PERIOD.checked_sub(started.elapsed()) {
            std::thread::sleep(rest);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_neighbour_works_until_dropped_and_then_stops() {
        for kind in [NeighbourKind::Memory, NeighbourKind::Compute] {
            let neighbour = Neighbour::start(kind, 50).unwrap();
            let deadline = Instant::now() + Duration::from_secs(30);
            while neighbour.passes() == 0 {
                assert!(Instant::now() < deadline, "{kind:?} never ran");
                std::thread::sleep(Duration::from_millis(5));
            }
            let passes = Arc::clone(&neighbour.passes);
            drop(neighbour); // joins the thread
            let after = passes.load(Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(30));
            assert_eq!(passes.load(Ordering::Relaxed), after, "{kind:?} ran on");
        }
    }
}
