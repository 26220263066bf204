//! Timed commit loops, shared by `stela demo` and `stela-bench commit`: the six ways a client
//! can commit a record ([`Mode`]), opening what each needs (an embedded log, or a daemon plus
//! one connection per client), and N client threads committing for a fixed time. It lives with
//! the product because the demo is the product's main job; the benchmark crate drives its runs
//! through it (never the other way round).
//!
//! The daemon of a service run ([`ServiceRun`]) is either started in this process for the run
//! ([`Daemon::InProcess`], in the run's directory) or one already running
//! ([`Daemon::Running`], whose own settings then apply; the run writes a log of its own there,
//! which must be new). A service run can also hold idle connections ([`IdleConnections`]:
//! connected, through their Hello, then silent) for its whole length, and it samples the
//! daemon's memory, threads and connections in the middle of the measured window
//! ([`DaemonSample`]).
//!
//! What a measurement means, for every mode alike:
//! - Before anything is opened, the file system's dirty pages are written back (`syncfs`,
//!   untimed), so a run's fdatasyncs do not queue behind the writeback of an earlier run (a
//!   `--sync none` run leaves gigabytes dirty) or of anything else.
//! - Opening the log, starting the daemon, opening the idle connections, connecting the clients,
//!   and stopping it all afterwards are outside the timed window.
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
use std::collections::HashSet;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, Mutex, OnceLock};
use std::time::{Duration, Instant};
use stela_client::{Address, Connection, Transport};
use stela_format::Codec;
use stela_proto::frame;
use stela_proto::{
    Durability, Request, RequestBody, Response, ResponseBody, Role, StatusReport, PROTOCOL_VERSION,
};
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
    /// Through a daemon with a standby, acknowledged once the standby holds the record (not in
    /// the default set: it needs a daemon started with `--standby`).
    ServiceReplicated,
    /// Through a daemon with a standby: on its disk and in the standby's memory.
    ServiceAll,
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
            Mode::ServiceReplicated => "service-replicated",
            Mode::ServiceAll => "service-all",
        }
    }

    pub fn from_name(name: &str) -> Option<Mode> {
        Mode::ALL
            .into_iter()
            .chain([Mode::ServiceReplicated, Mode::ServiceAll])
            .find(|m| m.name() == name)
    }

    /// The daemon's durability level, for the service modes.
    pub fn durability(self) -> Option<Durability> {
        match self {
            Mode::ServiceDisk => Some(Durability::Disk),
            Mode::ServiceBuffered => Some(Durability::Buffered),
            Mode::ServiceUnsafe => Some(Durability::Unsafe),
            Mode::ServiceReplicated => Some(Durability::Replicated),
            Mode::ServiceAll => Some(Durability::All),
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

/// Name of the log every client of a service run writes to, in a daemon started for the run.
const LOG_NAME: &str = "bench";

/// Unix socket paths are limited to about 108 bytes; a deep `--dir` would exceed it.
const MAX_SOCKET_PATH: usize = 100;

/// Which daemon a service run commits through.
#[derive(Clone, Copy, Debug)]
pub enum Daemon<'a> {
    /// One started in this process for the run, in the run's directory, with these settings.
    InProcess(&'a DaemonEnv),
    /// One already running at `socket`, with its own settings; the run writes the log `log`,
    /// which must hold no records yet (runs never share a log).
    Running { socket: &'a Path, log: &'a str },
}

/// How a service run reaches its daemon.
#[derive(Clone, Copy, Debug)]
pub struct ServiceRun<'a> {
    pub daemon: Daemon<'a>,
    /// How the clients' appends and commits travel. [`Transport::SharedMemory`] fails the run at
    /// open when the daemon gives no ring, rather than measuring the socket under its name.
    pub transport: Transport,
    /// Connections opened before the clients, through their Hello and silent until the run ends.
    pub idle_connections: usize,
}

impl<'a> ServiceRun<'a> {
    /// A daemon in this process, the default transport, no idle connections (the demo's runs).
    pub fn in_process(daemon: &'a DaemonEnv) -> ServiceRun<'a> {
        ServiceRun {
            daemon: Daemon::InProcess(daemon),
            transport: Transport::Auto,
            idle_connections: 0,
        }
    }
}

/// One run: `sources.len()` clients commit records in `mode` to one log in `dir` (which must be
/// fresh) for `timing`; the service modes through a daemon started in this process in `dir`.
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
    let service = daemon.map(ServiceRun::in_process);
    run_mode_with(mode, dir, service.as_ref(), timing, sources)
}

/// One run, the service modes as `service` says. `dir` holds the log of an embedded run and the
/// daemon of an in-process one (fresh, in both cases); a run against a running daemon does not
/// use it.
pub fn run_mode_with<S>(
    mode: Mode,
    dir: &Path,
    service: Option<&ServiceRun<'_>>,
    timing: Timing,
    sources: Vec<S>,
) -> anyhow::Result<Outcome>
where
    S: RecordSource,
    S::Record: Serialize + DeserializeOwned + Send + Sync + 'static,
{
    anyhow::ensure!(!sources.is_empty(), "at least one client is needed");
    match mode.durability() {
        None => {
            settle_writeback(dir)?;
            run_embedded(mode, dir, timing, sources)
        }
        Some(durability) => {
            let service = service.ok_or_else(|| anyhow!("{mode} needs a daemon"))?;
            run_service(durability, dir, service, timing, sources)
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
    let outcome = drive(sources, commits, timing, None)?;
    wal.close()
        .with_context(|| format!("{mode}: close the log"))?;
    Ok(outcome)
}

fn run_service<S>(
    durability: Durability,
    dir: &Path,
    service: &ServiceRun<'_>,
    timing: Timing,
    sources: Vec<S>,
) -> anyhow::Result<Outcome>
where
    S: RecordSource,
    S::Record: Serialize + DeserializeOwned + Send + Sync + 'static,
{
    let clients = sources.len();
    let options = stela_client::WalOptions::default()
        .codec(Codec::MessagePack)
        .durability(durability)
        .transport(service.transport);
    match service.daemon {
        Daemon::InProcess(env) => {
            settle_writeback(dir)?;
            check_descriptors(service.idle_connections, clients, true)?;
            let mut config = env.config(dir);
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
            let served = stela_server::limits::limits(
                stela_server::limits::raise_file_limit(),
                config.max_connections,
                config.admin_connections,
            )
            .clients;
            anyhow::ensure!(
                service.idle_connections + clients <= served,
                "{} idle connections and {clients} clients are more than the daemon serves at \
                 once with this file limit ({served})",
                service.idle_connections
            );
            let threads_before: HashSet<u32> = tasks().into_iter().map(|(tid, _)| tid).collect();
            let server = Server::start(config).context("start the daemon")?;
            let probe = || -> anyhow::Result<DaemonSample> {
                let status = server.status();
                Ok(DaemonSample {
                    pid: status.pid,
                    rss_kib: rss_kib(Path::new("/proc/self/status")),
                    threads: daemon_threads_in_process(&threads_before),
                    connections: status.connections,
                    in_process: true,
                })
            };
            let result = connect_and_drive(
                server.socket_path(),
                LOG_NAME,
                service.idle_connections,
                &options,
                timing,
                sources,
                &probe,
            );
            let stopped = server.shutdown();
            drop(short_socket);
            let outcome = result?;
            stopped.map_err(|e| anyhow!("stopping the daemon: {e}"))?;
            Ok(outcome)
        }
        Daemon::Running { socket, log } => {
            check_descriptors(service.idle_connections, clients, false)?;
            let report = daemon_status(socket)?;
            let free = report.max_connections.saturating_sub(report.connections) as usize;
            anyhow::ensure!(
                service.idle_connections + clients <= free,
                "the daemon at {} serves at most {} client connections and holds {} now: no room \
                 for {} idle connections and {clients} clients",
                socket.display(),
                report.max_connections,
                report.connections,
                service.idle_connections
            );
            // Its logs are in its directory: settle that file system when it is on this machine.
            if Path::new(&report.dir).is_dir() {
                settle_writeback(Path::new(&report.dir))?;
            }
            let probe = || -> anyhow::Result<DaemonSample> {
                let report = daemon_status(socket)?;
                Ok(DaemonSample {
                    pid: report.pid,
                    rss_kib: rss_kib(Path::new(&format!("/proc/{}/status", report.pid))),
                    threads: report.threads,
                    connections: report.connections,
                    in_process: false,
                })
            };
            connect_and_drive(
                socket,
                log,
                service.idle_connections,
                &options,
                timing,
                sources,
                &probe,
            )
        }
    }
}

/// Opens the idle connections, then one client per source on `log`, and drives them.
fn connect_and_drive<S>(
    socket: &Path,
    log: &str,
    idle_connections: usize,
    options: &stela_client::WalOptions,
    timing: Timing,
    sources: Vec<S>,
    probe: &dyn Fn() -> anyhow::Result<DaemonSample>,
) -> anyhow::Result<Outcome>
where
    S: RecordSource,
    S::Record: Serialize + DeserializeOwned + Send + Sync + 'static,
{
    let idle = IdleConnections::open(socket, idle_connections)?;
    let clients = sources
        .iter()
        .map(|_| {
            stela_client::Wal::<S::Record>::open(socket, log, options.clone()).with_context(|| {
                format!(
                    "connect a client to the daemon at {} (transport {})",
                    socket.display(),
                    options.transport.name()
                )
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let positions = clients[0].positions()?;
    anyhow::ensure!(
        positions.last_lsn == 0,
        "the log {log:?} of the daemon at {} already holds records (up to LSN {}): a run needs a \
         log of its own",
        socket.display(),
        positions.last_lsn
    );
    let transport = clients[0].transport();
    if let Some(other) = clients.iter().find(|c| c.transport() != transport) {
        anyhow::bail!(
            "the clients of one run got different transports ({transport} and {})",
            other.transport()
        );
    }
    let commits = clients
        .into_iter()
        .map(|client| {
            Box::new(move |record: &S::Record| {
                client.append_durable(record)?;
                Ok(())
            }) as Commit<'_, S::Record>
        })
        .collect();
    // The clients (and their connections) are dropped when their threads end.
    let mut outcome = drive(sources, commits, timing, Some(probe))?;
    drop(idle);
    outcome.transport = Some(transport);
    Ok(outcome)
}

/// The daemon's Status answer, over an administrator's connection.
pub fn daemon_status(socket: &Path) -> anyhow::Result<StatusReport> {
    let address = Address::Unix(socket.to_path_buf());
    let mut connection = Connection::connect_admin(&address)
        .with_context(|| format!("is a daemon running at {address}?"))?;
    match connection.request(RequestBody::Status)? {
        ResponseBody::Status(report) => Ok(*report),
        other => anyhow::bail!("the daemon at {address} answered Status with {other:?}"),
    }
}

/// Batches in which idle connections are opened: every connection of a batch says Hello
/// before any answer is read, and a batch stays below the daemon's slots for connections not
/// yet through their Hello (64), so none is closed as a laggard.
const IDLE_BATCH: usize = 32;
/// How long an idle connection waits for its Welcome.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest Welcome accepted.
const MAX_WELCOME_BYTES: usize = 64 << 10;

/// Connections that said Hello (role Client), were welcomed, and then say nothing: what a
/// daemon holds for applications connected but quiet. Spoken in the raw protocol, so each costs
/// this process one socket and no buffers. Closed when dropped.
#[derive(Debug)]
pub struct IdleConnections {
    streams: Vec<UnixStream>,
}

impl IdleConnections {
    /// Opens `count` connections to the daemon at `socket`, each through its Hello.
    ///
    /// # Errors
    /// A connection cannot be made (the file limit, most likely) or the daemon refuses one (its
    /// connection limit); the message names which connection of how many.
    pub fn open(socket: &Path, count: usize) -> anyhow::Result<IdleConnections> {
        let mut hello = Vec::new();
        frame::encode(
            &Request {
                id: 1,
                body: RequestBody::Hello {
                    version: PROTOCOL_VERSION,
                    client: format!("stela idle connection {}", env!("CARGO_PKG_VERSION")),
                    role: Role::Client,
                    token: None,
                },
            },
            &mut hello,
        )?;
        let mut streams: Vec<UnixStream> = Vec::with_capacity(count);
        while streams.len() < count {
            let first = streams.len();
            for number in first + 1..=(first + IDLE_BATCH).min(count) {
                let which = || {
                    format!(
                        "idle connection {number} of {count} to {}",
                        socket.display()
                    )
                };
                let mut stream = UnixStream::connect(socket).map_err(|error| {
                    let hint = if error.raw_os_error() == Some(libc_emfile()) {
                        " (this process is out of file descriptors: raise its hard limit)"
                    } else {
                        ""
                    };
                    anyhow!("{}: {error}{hint}", which())
                })?;
                stream.set_read_timeout(Some(HELLO_TIMEOUT))?;
                stream.write_all(&hello).with_context(which)?;
                streams.push(stream);
            }
            for (offset, stream) in streams[first..].iter_mut().enumerate() {
                read_welcome(stream).with_context(|| {
                    format!(
                        "idle connection {} of {count} to {}",
                        first + offset + 1,
                        socket.display()
                    )
                })?;
            }
        }
        Ok(IdleConnections { streams })
    }

    pub fn len(&self) -> usize {
        self.streams.len()
    }

    pub fn is_empty(&self) -> bool {
        self.streams.is_empty()
    }
}

/// EMFILE, without a libc dependency for one number (the same on every Linux architecture).
fn libc_emfile() -> i32 {
    rustix::io::Errno::MFILE.raw_os_error()
}

/// Reads the answer to an idle connection's Hello: a Welcome, or the daemon's refusal.
fn read_welcome(stream: &mut UnixStream) -> anyhow::Result<()> {
    let response: Response = match frame::read_blocking(stream, MAX_WELCOME_BYTES) {
        Ok(response) => response,
        Err(frame::ReadError::Header(e)) => Err(e)
            .context("no answer to Hello (the daemon closed the connection or did not answer)")?,
        Err(frame::ReadError::Body(e)) => Err(e).context("the answer to Hello was cut short")?,
        Err(frame::ReadError::Cut) => anyhow::bail!("the answer to Hello was cut short"),
        Err(frame::ReadError::Frame(e)) => Err(e)?,
    };
    match response.body {
        ResponseBody::Welcome { .. } => Ok(()),
        ResponseBody::Error { code, message } => {
            anyhow::bail!("the daemon refused it ({code:?}): {message}")
        }
        other => anyhow::bail!("the daemon answered Hello with {other:?}"),
    }
}

/// Descriptors this process uses per client: its socket three times (reader, writer, the
/// handle kept for the ring), the watcher's copy, the ring's memory and doorbell.
const FDS_PER_CLIENT: u64 = 6;
/// What a daemon in this process adds per client: its socket and the ring's doorbell, and a
/// spare.
const DAEMON_FDS_PER_CLIENT: u64 = 3;
/// Everything else: the logs, listeners, event loops, files the benchmark opens.
const SPARE_FDS: u64 = 64;

/// Raises this process's file limit to its hard limit and checks that `idle` idle connections
/// and `clients` clients fit under it (both ends of every connection when the daemon is in this
/// process).
///
/// # Errors
/// They do not fit: the message says how many descriptors they need and what the limit is.
pub fn check_descriptors(idle: usize, clients: usize, in_process: bool) -> anyhow::Result<()> {
    let limit = stela_server::limits::raise_file_limit();
    let open = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64);
    let (idle, clients) = (idle as u64, clients as u64);
    let needed = if in_process {
        idle.saturating_mul(2)
            .saturating_add(clients.saturating_mul(FDS_PER_CLIENT + DAEMON_FDS_PER_CLIENT))
            .saturating_add(stela_server::limits::RESERVED_FDS)
    } else {
        idle.saturating_add(clients.saturating_mul(FDS_PER_CLIENT))
    }
    .saturating_add(open + SPARE_FDS);
    anyhow::ensure!(
        needed <= limit,
        "{idle} idle connections and {clients} client(s) need about {needed} file descriptors in \
         this process{} ({open} open already), above its file limit of {limit}: raise the hard \
         limit (ulimit -Hn, LimitNOFILE=) or ask for fewer",
        if in_process {
            ", which holds both ends of each connection since the daemon runs in it"
        } else {
            ""
        }
    );
    Ok(())
}

/// `VmRSS` of a `/proc/<pid>/status` file, in KiB; `None` if it cannot be read.
fn rss_kib(status: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(status).ok()?;
    let line = text.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
    line.trim().trim_end_matches("kB").trim().parse().ok()
}

/// This process's threads: id and name.
fn tasks() -> Vec<(u32, String)> {
    let Ok(entries) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let tid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
            Some((tid, comm.trim_end().to_string()))
        })
        .collect()
}

/// Names of the driver's client threads (the kernel keeps 15 bytes of a name: the prefix
/// survives).
const CLIENT_THREAD: &str = "drive-client";
/// The client library's watcher thread ("stela-client-watcher", cut to 15 bytes).
const CLIENT_LIBRARY_THREAD: &str = "stela-client";

/// Threads of a daemon in this process: those not there before it started, less the clients'.
fn daemon_threads_in_process(before: &HashSet<u32>) -> u32 {
    tasks()
        .into_iter()
        .filter(|(tid, name)| {
            !before.contains(tid)
                && !name.starts_with(CLIENT_THREAD)
                && !name.starts_with(CLIENT_LIBRARY_THREAD)
        })
        .count() as u32
}

/// Runs one thread per (source, commit) pair for the warm-up and the window; merges what the
/// threads measured. With a `probe`, samples the daemon in the middle of the window.
fn drive<S>(
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
            // A short window first; a longer one only if nothing committed in it (right after
            // a build the machine may be flushing gigabytes, and one fdatasync, or the
            // daemon's start, can outlast 100 ms). What is checked is that commits happen, not
            // how fast.
            let (dir, outcome) = [100, 1_000, 10_000]
                .into_iter()
                .map(|window_ms| {
                    let dir = tempfile::tempdir().unwrap();
                    let sources = (0..3).map(|c| Same(c << 32)).collect();
                    let timing = Timing {
                        window: Duration::from_millis(window_ms),
                        ..short()
                    };
                    let outcome =
                        run_mode(mode, dir.path(), Some(&daemon), timing, sources).unwrap();
                    (dir, outcome)
                })
                .find(|(_, outcome)| outcome.commits > 0)
                .unwrap_or_else(|| panic!("{mode}: nothing committed even in a 10 s window"));
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

    fn daemon_in(dir: &Path, max_connections: usize) -> Server {
        let mut config = DaemonConfig::new(dir);
        config.assume_write_rate = Some(1 << 30);
        config.max_connections = max_connections;
        Server::start(config).unwrap()
    }

    #[test]
    fn a_run_holds_its_idle_connections_and_samples_the_daemon() {
        let daemon = DaemonEnv {
            write_bytes_per_s: 1 << 30,
        };
        for (clients, idle) in [(1, 0), (3, 20)] {
            let dir = tempfile::tempdir().unwrap();
            let service = ServiceRun {
                daemon: Daemon::InProcess(&daemon),
                transport: Transport::SharedMemory,
                idle_connections: idle,
            };
            let sources = (0..clients).map(|c| Same(c << 32)).collect();
            let outcome = run_mode_with(
                Mode::ServiceBuffered,
                dir.path(),
                Some(&service),
                short(),
                sources,
            )
            .unwrap();
            assert!(outcome.commits > 0);
            assert_eq!(outcome.transport, Some("shm"));
            let sample = outcome.daemon.unwrap();
            assert!(sample.in_process);
            assert_eq!(sample.pid, std::process::id());
            assert!(sample.rss_kib.unwrap() > 0);
            assert!(sample.connections as usize >= clients as usize + idle);
            // That the count leaves out the clients' threads is checked where no other test
            // starts threads beside it: stela-bench's black-box tests.
            assert!(sample.threads > 0);
        }
    }

    #[test]
    fn a_running_daemon_keeps_its_other_logs_and_a_run_refuses_a_used_log() {
        let dir = tempfile::tempdir().unwrap();
        let server = daemon_in(dir.path(), 100);
        let socket = server.socket_path().to_path_buf();
        let keep: stela_client::Wal<u64> =
            stela_client::Wal::open(&*socket, "keep", stela_client::WalOptions::default()).unwrap();
        for n in 1..=5u64 {
            keep.append(&n).unwrap();
        }
        let service = ServiceRun {
            daemon: Daemon::Running {
                socket: &socket,
                log: "fresh",
            },
            transport: Transport::Socket,
            idle_connections: 4,
        };
        let unused = tempfile::tempdir().unwrap();
        let sources = (0..2).map(|c| Same(c << 32)).collect();
        let outcome = run_mode_with(
            Mode::ServiceDisk,
            unused.path(),
            Some(&service),
            short(),
            sources,
        )
        .unwrap();
        assert!(outcome.commits > 0);
        assert_eq!(outcome.transport, Some("socket"));
        let sample = outcome.daemon.unwrap();
        assert!(!sample.in_process);
        assert_eq!(sample.pid, std::process::id());
        // `keep`, the two clients, the four idle ones (the sampler's own admin connection too).
        assert!(sample.connections >= 7, "{sample:?}");
        assert_eq!(keep.positions().unwrap().last_lsn, 5);
        assert!(std::fs::read_dir(unused.path()).unwrap().next().is_none());
        let again = (0..1).map(Same).collect();
        let error = run_mode_with(
            Mode::ServiceBuffered,
            unused.path(),
            Some(&service),
            short(),
            again,
        )
        .unwrap_err();
        assert!(
            format!("{error:#}").contains("already holds records"),
            "{error:#}"
        );
        drop(keep);
        server.shutdown().unwrap();
    }

    #[test]
    fn idle_connections_past_the_daemons_limit_fail_naming_which_and_why() {
        let dir = tempfile::tempdir().unwrap();
        let server = daemon_in(dir.path(), 3);
        let held = IdleConnections::open(server.socket_path(), 3).unwrap();
        assert_eq!(held.len(), 3);
        assert_eq!(server.status().connections, 3);
        let error = IdleConnections::open(server.socket_path(), 2).unwrap_err();
        let message = format!("{error:#}");
        assert!(message.contains("idle connection 1 of 2"), "{message}");
        assert!(message.contains("TooManyConnections"), "{message}");
        drop(held);
        server.shutdown().unwrap();
    }

    #[test]
    fn descriptors_that_cannot_fit_are_refused_before_anything_opens() {
        check_descriptors(10, 4, true).unwrap();
        let error = check_descriptors(usize::MAX, 4, true).unwrap_err();
        assert!(error.to_string().contains("file limit"), "{error}");
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
