//! The timed loop of one run: one thread per client commits records for the warm-up and the
//! measured window ([`Timing`]), and what the threads measured is merged into an [`Outcome`]
//! (commits counted and latencies recorded only inside the window; the daemon, when there is
//! one, sampled in its middle while every client is still connected).

use super::records::RecordSource;
use crate::latency::Histogram;
use anyhow::Context;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Barrier, OnceLock};
use std::time::{Duration, Instant};

/// The warm-up and the measured window of one run.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub warmup: Duration,
    pub window: Duration,
}

/// Warm-up before every measured window: connections and the page cache settle, the adaptive
/// spin of the daemon's connections finds its budget.
pub const WARMUP: Duration = Duration::from_millis(300);

/// What one run measured.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub commits: u64,
    pub seconds: f64,
    pub latency: Histogram,
    /// Service runs: what the clients committed over, `shm` or `socket` (as
    /// [`stela_client::Wal::transport`] names it).
    pub transport: Option<&'static str>,
    /// Service runs: the daemon, sampled in the middle of the measured window.
    pub daemon: Option<DaemonSample>,
}

/// The daemon of a service run, sampled in the middle of its measured window (the clients
/// committing, the idle connections held).
#[derive(Clone, Debug, PartialEq)]
pub struct DaemonSample {
    pub pid: u32,
    /// Resident memory in KiB (`VmRSS` of `/proc/<pid>/status`). For a daemon in this process it
    /// is the whole process's: the daemon, its clients and whatever runs them. `None` when the
    /// daemon's pid cannot be read here (another machine or pid namespace).
    pub rss_kib: Option<u64>,
    /// The daemon's threads. A running daemon counts its own (its Status answer); in this
    /// process, the threads that appeared since just before the daemon started, less the
    /// clients' (the driver's and the client library's watcher).
    pub threads: u32,
    /// Connections the daemon held (the clients, the idle ones, the sample's own when it asks
    /// a running daemon).
    pub connections: u32,
    /// True when the daemon runs in this process.
    pub in_process: bool,
}

impl Outcome {
    pub fn commits_per_s(&self) -> f64 {
        self.commits as f64 / self.seconds.max(1e-9)
    }
}

/// How one client commits one record: the embedded log's append, or its connection's.
pub(super) type Commit<'a, T> = Box<dyn FnMut(&T) -> anyhow::Result<()> + Send + 'a>;

/// Names of the driver's client threads (the kernel keeps 15 bytes of a name: the prefix
/// survives).
pub(super) const CLIENT_THREAD: &str = "drive-client";

/// Runs one thread per (source, commit) pair for the warm-up and the window; merges what the
/// threads measured. With a `probe`, samples the daemon in the middle of the window.
pub(super) fn drive<S>(
    sources: Vec<S>,
    commits: Vec<Commit<'_, S::Record>>,
    timing: Timing,
    probe: Option<&dyn Fn() -> anyhow::Result<DaemonSample>>,
) -> anyhow::Result<Outcome>
where
    S: RecordSource,
{
    let clients = sources.len();
    let barrier = Barrier::new(clients + 1);
    let window: OnceLock<(Instant, Instant)> = OnceLock::new();
    // A failing client stops the others at once rather than at the end of the window.
    let failed = AtomicBool::new(false);
    // The clients keep their connections until the daemon is sampled: on a loaded machine the
    // sampling thread can wake after the window, and must still see them connected.
    let sampled = AtomicBool::new(probe.is_none());
    let (results, sample) = std::thread::scope(|scope| {
        let handles: Vec<_> = sources
            .into_iter()
            .zip(commits)
            .enumerate()
            .map(|(index, (mut source, mut commit))| {
                let (barrier, window, failed, sampled) = (&barrier, &window, &failed, &sampled);
                std::thread::Builder::new()
                    .name(format!("{CLIENT_THREAD}-{index}"))
                    .spawn_scoped(scope, move || -> anyhow::Result<Histogram> {
                        let mut latency = Histogram::new();
                        barrier.wait();
                        let &(from, to) = window.get().expect("set before the barrier");
                        loop {
                            let record = source.next_record();
                            let started = Instant::now();
                            if started >= to || failed.load(Ordering::Relaxed) {
                                break;
                            }
                            if let Err(error) = commit(record) {
                                failed.store(true, Ordering::Relaxed);
                                return Err(error);
                            }
                            let ended = Instant::now();
                            if ended >= from && ended < to {
                                latency.record((ended - started).as_nanos() as u64);
                            }
                        }
                        while !sampled.load(Ordering::Acquire) && !failed.load(Ordering::Relaxed) {
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        // Drop the commit (for the service modes: the connection) here, so the
                        // daemon sees its clients go before it is asked to stop.
                        drop(commit);
                        Ok(latency)
                    })
                    .expect("spawn a client thread")
            })
            .collect();
        let from = Instant::now() + timing.warmup;
        let _ = window.set((from, from + timing.window));
        barrier.wait();
        let sample = probe.map(|probe| {
            let at = from + timing.window / 2;
            while !failed.load(Ordering::Relaxed) {
                let now = Instant::now();
                if now >= at {
                    break;
                }
                std::thread::sleep((at - now).min(Duration::from_millis(10)));
            }
            let sample = probe();
            sampled.store(true, Ordering::Release);
            sample
        });
        let results: Vec<_> = handles.into_iter().map(|h| h.join()).collect();
        (results, sample)
    });
    let mut latency = Histogram::new();
    for result in results {
        match result {
            Ok(Ok(histogram)) => latency.merge(&histogram),
            Ok(Err(error)) => return Err(error),
            Err(_) => anyhow::bail!("a client thread panicked"),
        }
    }
    let daemon = sample
        .transpose()
        .context("sample the daemon's memory and threads")?;
    Ok(Outcome {
        commits: latency.count(),
        seconds: timing.window.as_secs_f64(),
        latency,
        transport: None,
        daemon,
    })
}

/// Writes back every dirty page of the file system holding `dir` and waits for it.
pub fn settle_writeback(dir: &Path) -> anyhow::Result<()> {
    let handle = std::fs::File::open(dir).with_context(|| format!("open {}", dir.display()))?;
    rustix::fs::syncfs(&handle).with_context(|| format!("syncfs {}", dir.display()))?;
    Ok(())
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(in crate::drive) struct Same(pub u64);

    impl RecordSource for Same {
        type Record = u64;
        fn next_record(&mut self) -> &u64 {
            self.0 += 1;
            &self.0
        }
    }

    pub(in crate::drive) fn short() -> Timing {
        Timing {
            warmup: Duration::from_millis(20),
            window: Duration::from_millis(100),
        }
    }

    /// A daemon in this process in `dir`, taking at most `max_connections` clients.
    pub(in crate::drive) fn daemon_in(dir: &Path, max_connections: usize) -> stela_server::Server {
        let mut config = stela_server::DaemonConfig::new(dir);
        config.assume_write_rate = Some(1 << 30);
        config.max_connections = max_connections;
        stela_server::Server::start(config).unwrap()
    }
}
