//! Timed commit loops, shared by `stela demo` and `stela-bench commit`: the six ways a client
//! can commit a record ([`Mode`]), opening what each needs (an embedded log, or a daemon in this
//! process plus one connection per client), and N client threads committing for a fixed time.
//! It lives with the product because the demo is the product's main job; the benchmark crate
//! drives its runs through it (never the other way round).
//!
//! What a measurement means, for every mode alike:
//! - Before anything is opened, the file system's dirty pages are written back (`syncfs`,
//!   untimed), so a run's fdatasyncs do not queue behind the writeback of an earlier run (a
//!   `--sync none` run leaves gigabytes dirty) or of anything else.
//! - Opening the log, starting the daemon, connecting the clients, and stopping it all afterwards
//!   are outside the timed window.
//! - The clients run for a warm-up (not counted), then for the measured window. A commit counts
//!   when it completes inside the window; its latency is from just before it was handed to the
//!   log (so encoding is included) to its return.
//! - `seconds` is the length of the window, so commits/s = commits / seconds.
//!
//! Records come from a [`RecordSource`] per client; [`SplitMix64`] is the seeded generator the
//! demo's and the benchmarks' sources draw from, fixed so a seed names the same records on every
//! machine and build.

use crate::latency::Histogram;
use anyhow::{anyhow, Context};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, Mutex, OnceLock};
use std::time::{Duration, Instant};
use stela_format::Codec;
use stela_proto::Durability;
use stela_server::{DaemonConfig, Server};
use stela_wal::storage::{StdStorage, Storage};
use stela_wal::SyncMode;

/// How a client commits one record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, clap::ValueEnum)]
pub enum Mode {
    /// Embedded log; append + commit under one lock, so every commit pays its own fdatasync.
    EmbeddedSync,
    /// Embedded log shared by all clients; concurrent commits share an fdatasync (group commit).
    EmbeddedGroup,
    /// Embedded log that never syncs: a commit hands the record to the OS.
    EmbeddedUnsafe,
    /// Through the daemon, acknowledged once fdatasync'ed (the daemon's group commit).
    ServiceDisk,
    /// Through the daemon, acknowledged once in its protected buffers.
    ServiceBuffered,
    /// Through the daemon, acknowledged on receipt (what the protection costs is measured
    /// against this).
    ServiceUnsafe,
}

impl Mode {
    pub const ALL: [Mode; 6] = [
        Mode::EmbeddedSync,
        Mode::EmbeddedGroup,
        Mode::EmbeddedUnsafe,
        Mode::ServiceDisk,
        Mode::ServiceBuffered,
        Mode::ServiceUnsafe,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Mode::EmbeddedSync => "embedded-sync",
            Mode::EmbeddedGroup => "embedded-group",
            Mode::EmbeddedUnsafe => "embedded-unsafe",
            Mode::ServiceDisk => "service-disk",
            Mode::ServiceBuffered => "service-buffered",
            Mode::ServiceUnsafe => "service-unsafe",
        }
    }

    pub fn from_name(name: &str) -> Option<Mode> {
        Mode::ALL.into_iter().find(|m| m.name() == name)
    }

    /// The daemon's durability level, for the service modes.
    pub fn durability(self) -> Option<Durability> {
        match self {
            Mode::ServiceDisk => Some(Durability::Disk),
            Mode::ServiceBuffered => Some(Durability::Buffered),
            Mode::ServiceUnsafe => Some(Durability::Unsafe),
            _ => None,
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

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
}

impl Outcome {
    pub fn commits_per_s(&self) -> f64 {
        self.commits as f64 / self.seconds.max(1e-9)
    }
}

/// Where each client's next record comes from. Returns a reference so the timed loop neither
/// allocates nor copies a record.
pub trait RecordSource: Send {
    type Record;
    fn next_record(&mut self) -> &Self::Record;
}

/// SplitMix64 (Steele, Lea, Flood 2014): tiny, fast, and fixed forever (unlike `rand`'s
/// `StdRng`, whose algorithm may change between versions).
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `lo..=hi` (the slight modulo bias does not matter here).
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }
}

/// The daemon settings shared by every service run of one invocation: the disk's write rate is
/// measured once, so every run gets the same dirty-byte cap and no run pays the measurement.
#[derive(Clone, Debug)]
pub struct DaemonEnv {
    pub write_bytes_per_s: u64,
}

impl DaemonEnv {
    /// Measures the write rate of the file system holding `dir` as the daemon does at start.
    pub fn measure(dir: &Path) -> anyhow::Result<DaemonEnv> {
        let scratch = tempfile::Builder::new()
            .prefix("stela-measure-")
            .tempdir_in(dir)
            .with_context(|| format!("create a scratch directory in {}", dir.display()))?;
        let storage: Arc<dyn Storage> = Arc::new(StdStorage);
        let rate = stela_server::measure::measure_write_rate(&storage, scratch.path())
            .with_context(|| format!("measure the write rate of {}", dir.display()))?;
        Ok(DaemonEnv {
            write_bytes_per_s: rate,
        })
    }

    /// The daemon's default configuration with the measured rate, in `dir`.
    pub fn config(&self, dir: &Path) -> DaemonConfig {
        let mut config = DaemonConfig::new(dir);
        config.assume_write_rate = Some(self.write_bytes_per_s);
        config
    }

    /// How the default daemon derives its dirty-byte cap from the measured rate.
    pub fn describe(&self) -> String {
        let config = DaemonConfig::new("");
        let pool = (config.buffers * config.buffer_bytes) as u64;
        stela_server::measure::dirty_cap(pool, self.write_bytes_per_s, config.power_window)
            .derivation
    }
}

/// Name of the log every client of a service run writes to.
const LOG_NAME: &str = "bench";

/// Unix socket paths are limited to about 108 bytes; a deep `--dir` would exceed it.
const MAX_SOCKET_PATH: usize = 100;

/// One run: `sources.len()` clients commit records in `mode` to one log in `dir` (which must be
/// fresh) for `timing`.
pub fn run_mode<S>(
    mode: Mode,
    dir: &Path,
    daemon: Option<&DaemonEnv>,
    timing: Timing,
    sources: Vec<S>,
) -> anyhow::Result<Outcome>
where
    S: RecordSource,
    S::Record: Serialize + DeserializeOwned + Send + Sync + 'static,
{
    anyhow::ensure!(!sources.is_empty(), "at least one client is needed");
    settle_writeback(dir)?;
    match mode.durability() {
        None => run_embedded(mode, dir, timing, sources),
        Some(durability) => {
            let daemon = daemon.ok_or_else(|| anyhow!("{mode} needs the daemon's settings"))?;
            run_service(durability, dir, daemon, timing, sources)
        }
    }
}

/// Writes back every dirty page of the file system holding `dir` and waits for it.
pub fn settle_writeback(dir: &Path) -> anyhow::Result<()> {
    let handle = std::fs::File::open(dir).with_context(|| format!("open {}", dir.display()))?;
    rustix::fs::syncfs(&handle).with_context(|| format!("syncfs {}", dir.display()))?;
    Ok(())
}

type Commit<'a, T> = Box<dyn FnMut(&T) -> anyhow::Result<()> + Send + 'a>;

fn run_embedded<S>(
    mode: Mode,
    dir: &Path,
    timing: Timing,
    sources: Vec<S>,
) -> anyhow::Result<Outcome>
where
    S: RecordSource,
    S::Record: Serialize + DeserializeOwned + Send + Sync + 'static,
{
    let sync = if mode == Mode::EmbeddedUnsafe {
        SyncMode::None
    } else {
        SyncMode::Data
    };
    let options = stela_wal::WalOptions::default()
        .codec(Codec::MessagePack)
        .sync(sync);
    let wal: stela_wal::Wal<S::Record> =
        stela_wal::Wal::open(dir, options).with_context(|| format!("{mode}: open the log"))?;
    // Held across append + commit in embedded-sync: a commit cannot find its record already
    // synced by another client's fdatasync, so each pays one of its own.
    let one_at_a_time = Mutex::new(());
    let serialize = mode == Mode::EmbeddedSync;
    let commits: Vec<Commit<'_, S::Record>> = sources
        .iter()
        .map(|_| {
            let wal = wal.clone();
            let lock = &one_at_a_time;
            Box::new(move |record: &S::Record| {
                let _turn = serialize.then(|| lock.lock().unwrap_or_else(|e| e.into_inner()));
                wal.append_durable(record)?;
                Ok(())
            }) as Commit<'_, S::Record>
        })
        .collect();
    let outcome = drive(sources, commits, timing)?;
    wal.close()
        .with_context(|| format!("{mode}: close the log"))?;
    Ok(outcome)
}

fn run_service<S>(
    durability: Durability,
    dir: &Path,
    daemon: &DaemonEnv,
    timing: Timing,
    sources: Vec<S>,
) -> anyhow::Result<Outcome>
where
    S: RecordSource,
    S::Record: Serialize + DeserializeOwned + Send + Sync + 'static,
{
    let mut config = daemon.config(dir);
    let short_socket = if config.socket_path().as_os_str().len() > MAX_SOCKET_PATH {
        let socket_dir = tempfile::Builder::new()
            .prefix("stela-")
            .tempdir()
            .context("create a directory for the daemon's socket")?;
        config.socket = Some(socket_dir.path().join("stela.sock"));
        Some(socket_dir)
    } else {
        None
    };
    let server = Server::start(config).context("start the daemon")?;
    let options = stela_client::WalOptions::default()
        .codec(Codec::MessagePack)
        .durability(durability);
    let result = (|| {
        let commits = sources
            .iter()
            .map(|_| {
                let client: stela_client::Wal<S::Record> =
                    stela_client::Wal::open(server.socket_path(), LOG_NAME, options.clone())
                        .context("connect a client to the daemon")?;
                Ok(Box::new(move |record: &S::Record| {
                    client.append_durable(record)?;
                    Ok(())
                }) as Commit<'_, S::Record>)
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        // The clients (and their connections) are dropped when their threads end.
        drive(sources, commits, timing)
    })();
    let stopped = server.shutdown();
    drop(short_socket);
    let outcome = result?;
    stopped.map_err(|e| anyhow!("stopping the daemon: {e}"))?;
    Ok(outcome)
}

/// Runs one thread per (source, commit) pair for the warm-up and the window; merges what the
/// threads measured.
fn drive<S>(
    sources: Vec<S>,
    commits: Vec<Commit<'_, S::Record>>,
    timing: Timing,
) -> anyhow::Result<Outcome>
where
    S: RecordSource,
{
    let clients = sources.len();
    let barrier = Barrier::new(clients + 1);
    let window: OnceLock<(Instant, Instant)> = OnceLock::new();
    // A failing client stops the others at once rather than at the end of the window.
    let failed = AtomicBool::new(false);
    let results = std::thread::scope(|scope| {
        let handles: Vec<_> = sources
            .into_iter()
            .zip(commits)
            .map(|(mut source, mut commit)| {
                let (barrier, window, failed) = (&barrier, &window, &failed);
                scope.spawn(move || -> anyhow::Result<Histogram> {
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
                    // Drop the commit (for the service modes: the connection) here, so the
                    // daemon sees its clients go before it is asked to stop.
                    drop(commit);
                    Ok(latency)
                })
            })
            .collect();
        let from = Instant::now() + timing.warmup;
        let _ = window.set((from, from + timing.window));
        barrier.wait();
        handles.into_iter().map(|h| h.join()).collect::<Vec<_>>()
    });
    let mut latency = Histogram::new();
    for result in results {
        match result {
            Ok(Ok(histogram)) => latency.merge(&histogram),
            Ok(Err(error)) => return Err(error),
            Err(_) => anyhow::bail!("a client thread panicked"),
        }
    }
    Ok(Outcome {
        commits: latency.count(),
        seconds: timing.window.as_secs_f64(),
        latency,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Same(u64);

    impl RecordSource for Same {
        type Record = u64;
        fn next_record(&mut self) -> &u64 {
            self.0 += 1;
            &self.0
        }
    }

    fn short() -> Timing {
        Timing {
            warmup: Duration::from_millis(20),
            window: Duration::from_millis(100),
        }
    }

    #[test]
    fn every_mode_commits_and_the_log_holds_the_records() {
        let daemon = DaemonEnv {
            write_bytes_per_s: 1 << 30,
        };
        for mode in Mode::ALL {
            let dir = tempfile::tempdir().unwrap();
            let sources = (0..3).map(|c| Same(c << 32)).collect();
            let outcome = run_mode(mode, dir.path(), Some(&daemon), short(), sources).unwrap();
            assert!(outcome.commits > 0, "{mode}");
            assert!(outcome.latency.percentile_us(50.0).unwrap() > 0.0, "{mode}");
            // Whatever was committed is an ordinary log of the records, however it got there.
            let log = if mode.durability().is_some() {
                dir.path().join("logs").join(LOG_NAME)
            } else {
                dir.path().to_path_buf()
            };
            let wal: stela_wal::Wal<u64> =
                stela_wal::Wal::open(&log, stela_wal::WalOptions::default()).unwrap();
            assert!(wal.last_lsn().get() >= outcome.commits, "{mode}");
        }
    }

    #[test]
    fn splitmix64_is_the_published_stream() {
        // The reference outputs for seed 0: a change to the generator would silently change
        // every seeded record of the demo and the benchmarks.
        let mut rng = SplitMix64::new(0);
        assert_eq!(rng.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(rng.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        assert_eq!(rng.next_u64(), 0x06C4_5D18_8009_454F);
        let mut rng = SplitMix64::new(7);
        assert!((0..1000).all(|_| (3..=5).contains(&rng.between(3, 5))));
    }

    #[test]
    fn modes_round_trip_their_names() {
        for mode in Mode::ALL {
            assert_eq!(Mode::from_name(mode.name()), Some(mode));
            let value = clap::ValueEnum::to_possible_value(&mode).unwrap();
            assert_eq!(value.get_name(), mode.name());
        }
    }
}
