//! The daemon: configuration, start-up (directory lock, disk measurement, socket), the accept
//! loops, signals, the power-failure flush and the orderly shutdown.
//!
//! Invariants: the socket appears at its path only once its mode is set (it is bound under a
//! temporary name, chmod'ed, then renamed); a second daemon on the same socket refuses to start
//! rather than steal it; shutdown (SIGTERM, SIGINT, [`Server::shutdown`]) stops admitting,
//! writes and syncs every buffer, then closes the logs, so it loses nothing acknowledged.

use crate::logs::Logs;
use crate::measure;
use crate::pool::{Admission, Pool, PoolConfig};
use crate::sync::lock;
use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use stela_net::SpinStream;
use stela_proto::{DirtyCap, EmergencyFlush, LogStatus, StatusReport, MAX_FRAME_BYTES};
use stela_wal::storage::{StdStorage, Storage};

/// How to run a daemon. [`ServerConfig::new`] gives the documented defaults.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub dir: PathBuf,
    /// Unix socket path (default `DIR/stela.sock`).
    pub socket: Option<PathBuf>,
    pub socket_mode: u32,
    pub tcp: Option<SocketAddr>,
    pub buffers: usize,
    pub buffer_bytes: usize,
    pub write_threshold: usize,
    pub flush_interval: Duration,
    pub power_window: Duration,
    /// Skip the start-up measurement and assume this rate (bytes/s). For tests and for
    /// machines whose disk must not be touched at start.
    pub assume_write_rate: Option<u64>,
    pub segment_bytes: u64,
    pub storage: Arc<dyn Storage>,
    /// How long a connection thread polls its socket for the next request before sleeping
    /// (adaptive; see stela-net). Zero turns spinning off.
    pub spin: Duration,
    /// React to SIGPWR (emergency flush) and SIGTERM/SIGINT (flush and stop). Only one daemon
    /// per process may.
    pub handle_signals: bool,
}

impl ServerConfig {
    pub fn new(dir: impl Into<PathBuf>) -> ServerConfig {
        let pool = PoolConfig::rapilog_default();
        ServerConfig {
            dir: dir.into(),
            socket: None,
            socket_mode: 0o600,
            tcp: None,
            buffers: pool.buffers,
            buffer_bytes: pool.buffer_bytes,
            write_threshold: pool.write_threshold,
            flush_interval: pool.flush_interval,
            power_window: Duration::from_millis(50),
            assume_write_rate: None,
            spin: stela_net::DEFAULT_SPIN,
            segment_bytes: 64 << 20,
            storage: Arc::new(StdStorage),
            handle_signals: false,
        }
    }

    pub fn socket_path(&self) -> PathBuf {
        self.socket
            .clone()
            .unwrap_or_else(|| self.dir.join("stela.sock"))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("creating {path}: {source}")]
    Dir { path: PathBuf, source: io::Error },
    #[error("measuring the disk's write rate in {path}: {source}")]
    Measure { path: PathBuf, source: io::Error },
    #[error("another daemon is already serving on {0}")]
    SocketInUse(PathBuf),
    #[error("binding {what}: {source}")]
    Bind { what: String, source: io::Error },
    #[error("installing signal handlers: {0}")]
    Signals(io::Error),
    #[error("invalid configuration: {0}")]
    Config(String),
}

/// State every connection and thread shares.
#[derive(Debug)]
pub struct Shared {
    pub(crate) pool: Arc<Pool>,
    pub(crate) logs: Arc<Logs>,
    pub(crate) max_frame_bytes: usize,
    config: ServerConfig,
    cap: DirtyCap,
    started: Instant,
    power: Mutex<PowerState>,
    connections: AtomicU32,
    next_connection: AtomicU64,
    /// Clones of every open stream, so shutdown can close them.
    streams: Mutex<HashMap<u64, Stream>>,
    stop: (Mutex<bool>, Condvar),
    stopping: AtomicBool,
}

#[derive(Debug, Default)]
struct PowerState {
    failing: bool,
    last: Option<EmergencyFlush>,
}

#[derive(Debug)]
enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Stream {
    fn shutdown(&self) {
        let _ = match self {
            Stream::Unix(s) => s.shutdown(std::net::Shutdown::Both),
            Stream::Tcp(s) => s.shutdown(std::net::Shutdown::Both),
        };
    }
}

/// A running daemon. Dropping it without [`Server::shutdown`] also flushes and stops.
pub struct Server {
    shared: Arc<Shared>,
    socket_path: PathBuf,
    tcp_addr: Option<SocketAddr>,
    threads: Vec<JoinHandle<()>>,
    flusher: Option<JoinHandle<()>>,
    signals: Option<signal_hook::iterator::Handle>,
}

impl Server {
    /// Starts a daemon: measures the disk, binds the socket(s), starts the flusher and the
    /// accept loops. Returns once clients can connect.
    pub fn start(config: ServerConfig) -> Result<Server, StartError> {
        if config.buffers == 0 || config.buffer_bytes < 4096 {
            return Err(StartError::Config(
                "need at least one buffer of at least 4096 bytes".into(),
            ));
        }
        config
            .storage
            .create_dir_all(&config.dir.join("logs"))
            .map_err(|source| StartError::Dir {
                path: config.dir.clone(),
                source,
            })?;
        let rate = match config.assume_write_rate {
            Some(rate) => rate,
            None => measure::measure_write_rate_with(
                &config.storage,
                &config.dir,
                measure::measure_bytes_for((config.buffers * config.buffer_bytes) as u64),
            )
            .map_err(|source| StartError::Measure {
                path: config.dir.clone(),
                source,
            })?,
        };
        let pool_bytes = (config.buffers * config.buffer_bytes) as u64;
        let cap = measure::dirty_cap(pool_bytes, rate, config.power_window);
        let pool_config = PoolConfig {
            buffers: config.buffers,
            buffer_bytes: config.buffer_bytes,
            dirty_cap: cap.bytes.max(4096) as usize,
            write_threshold: config.write_threshold.max(1),
            flush_interval: config.flush_interval,
        };
        let max_frame_bytes =
            (pool_config.dirty_cap * 2 + (64 << 10)).clamp(1 << 20, MAX_FRAME_BYTES);
        let pool = Arc::new(Pool::new(pool_config));
        let logs = Arc::new(Logs::new(
            &config.dir,
            Arc::clone(&config.storage),
            config.segment_bytes,
        ));
        tracing::info!(derivation = %cap.derivation, "dirty-byte cap");

        let socket_path = config.socket_path();
        let unix = bind_unix(&socket_path, config.socket_mode)?;
        let tcp = match config.tcp {
            Some(addr) => Some(TcpListener::bind(addr).map_err(|source| StartError::Bind {
                what: addr.to_string(),
                source,
            })?),
            None => None,
        };
        let tcp_addr = tcp.as_ref().and_then(|l| l.local_addr().ok());

        let shared = Arc::new(Shared {
            pool: Arc::clone(&pool),
            logs: Arc::clone(&logs),
            max_frame_bytes,
            config: config.clone(),
            cap,
            started: Instant::now(),
            power: Mutex::new(PowerState::default()),
            connections: AtomicU32::new(0),
            next_connection: AtomicU64::new(0),
            streams: Mutex::new(HashMap::new()),
            stop: (Mutex::new(false), Condvar::new()),
            stopping: AtomicBool::new(false),
        });
        let flusher = {
            let (pool, logs) = (Arc::clone(&pool), Arc::clone(&logs));
            std::thread::Builder::new()
                .name("stela-flusher".into())
                .spawn(move || crate::flusher::run(pool, logs))
                .expect("spawning the flusher")
        };
        let mut threads = Vec::new();
        {
            let shared = Arc::clone(&shared);
            threads.push(
                std::thread::Builder::new()
                    .name("stela-accept-unix".into())
                    .spawn(move || accept_unix(shared, unix))
                    .expect("spawning the accept loop"),
            );
        }
        if let Some(tcp) = tcp {
            let shared = Arc::clone(&shared);
            threads.push(
                std::thread::Builder::new()
                    .name("stela-accept-tcp".into())
                    .spawn(move || accept_tcp(shared, tcp))
                    .expect("spawning the accept loop"),
            );
        }
        let signals = if config.handle_signals {
            use libc::{SIGINT, SIGPWR, SIGTERM};
            let mut signals = signal_hook::iterator::Signals::new([SIGPWR, SIGTERM, SIGINT])
                .map_err(StartError::Signals)?;
            let handle = signals.handle();
            let shared = Arc::clone(&shared);
            threads.push(
                std::thread::Builder::new()
                    .name("stela-signals".into())
                    .spawn(move || {
                        for signal in signals.forever() {
                            if signal == SIGPWR {
                                tracing::warn!("SIGPWR: power is failing");
                                shared.power_fail();
                            } else {
                                tracing::info!(signal, "stopping: flushing every buffer first");
                                shared.request_stop();
                            }
                        }
                    })
                    .expect("spawning the signal thread"),
            );
            Some(handle)
        } else {
            None
        };
        Ok(Server {
            shared,
            socket_path,
            tcp_addr,
            threads,
            flusher: Some(flusher),
            signals,
        })
    }

    pub fn socket_path(&self) -> &Path {
        &self.socket_path
    }

    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.tcp_addr
    }

    pub fn status(&self) -> StatusReport {
        self.shared.status()
    }

    pub fn power_fail(&self) -> EmergencyFlush {
        self.shared.power_fail()
    }

    pub fn power_restore(&self) {
        self.shared.power_restore()
    }

    /// Blocks until a stop is requested (SIGTERM, SIGINT), then shuts down.
    pub fn run_until_stopped(self) -> Result<(), String> {
        {
            let (lock_, condvar) = &self.shared.stop;
            let mut stop = lock(lock_);
            while !*stop {
                stop = condvar.wait(stop).unwrap_or_else(|e| e.into_inner());
            }
        }
        self.shutdown()
    }

    /// Stops admitting, writes and syncs every buffer, closes connections and logs.
    pub fn shutdown(mut self) -> Result<(), String> {
        self.stop_all()
    }

    fn stop_all(&mut self) -> Result<(), String> {
        let Some(flusher) = self.flusher.take() else {
            return Ok(());
        };
        let shared = &self.shared;
        shared.stopping.store(true, Ordering::SeqCst);
        let started = Instant::now();
        let bytes = shared.pool.begin_drain(Admission::ShuttingDown);
        shared.pool.wait_drained();
        let _ = flusher.join();
        tracing::info!(
            bytes,
            micros = started.elapsed().as_micros() as u64,
            "flushed every buffer for shutdown"
        );
        // Unblock the accept loops (a connection to ourselves) and every connection.
        let _ = UnixStream::connect(&self.socket_path);
        if let Some(addr) = self.tcp_addr {
            let _ = TcpStream::connect(addr);
        }
        for stream in lock(&shared.streams).values() {
            stream.shutdown();
        }
        if let Some(handle) = self.signals.take() {
            handle.close();
        }
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
        let _ = std::fs::remove_file(&self.socket_path);
        // Connection threads hold the logs while they finish their last request; the logs'
        // directory locks are released only once every holder is gone.
        let deadline = Instant::now() + Duration::from_secs(5);
        while shared.connections.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        let mut failures = Vec::new();
        for (id, entry) in shared.logs.take_all().into_iter().enumerate() {
            if let Some(failure) = shared.pool.log_failure(id) {
                failures.push(format!("{}: {failure}", entry.name));
            }
            match Arc::try_unwrap(entry) {
                Ok(entry) => {
                    if let Err(e) = entry.log.close() {
                        failures.push(format!("{}: {e}", entry.name));
                    }
                }
                Err(entry) => failures.push(format!("{}: still in use at shutdown", entry.name)),
            }
        }
        if failures.is_empty() {
            Ok(())
        } else {
            Err(failures.join("; "))
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.stop_all();
    }
}

impl Shared {
    fn request_stop(&self) {
        let (lock_, condvar) = &self.stop;
        *lock(lock_) = true;
        condvar.notify_all();
    }

    /// The emergency flush: stop admitting, write and sync everything, report how long it took.
    pub(crate) fn power_fail(&self) -> EmergencyFlush {
        let at_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let started = Instant::now();
        lock(&self.power).failing = true;
        let bytes = self.pool.begin_drain(Admission::PowerFailing);
        self.pool.wait_drained();
        let micros = started.elapsed().as_micros() as u64;
        let failures: Vec<String> = self
            .logs
            .all()
            .iter()
            .enumerate()
            .filter_map(|(id, entry)| {
                self.pool
                    .log_failure(id)
                    .map(|f| format!("{}: {f}", entry.name))
            })
            .collect();
        let budget_micros = (self.config.power_window / 2).as_micros() as u64;
        let report = EmergencyFlush {
            bytes: bytes as u64,
            micros,
            budget_micros,
            at_unix_ms,
            failures,
        };
        if micros <= budget_micros {
            tracing::warn!(bytes, micros, budget_micros, "power failure: every buffer written and synced; writes refused until power-restore");
        } else {
            tracing::error!(
                bytes,
                micros,
                budget_micros,
                "power failure: flush took longer than the budget"
            );
        }
        lock(&self.power).last = Some(report.clone());
        report
    }

    pub(crate) fn power_restore(&self) {
        if self.pool.reopen() {
            tracing::info!("power restored: admitting writes again");
        }
        lock(&self.power).failing = false;
    }

    pub(crate) fn status(&self) -> StatusReport {
        let stats = self.pool.stats();
        let power = lock(&self.power);
        let logs = self
            .logs
            .all()
            .iter()
            .enumerate()
            .map(|(id, entry)| LogStatus {
                name: entry.name.clone(),
                codec: entry.codec.name().to_owned(),
                positions: self.positions(id),
                dirty_bytes: self.pool.log_dirty_bytes(id) as u64,
                failure: self.pool.log_failure(id),
            })
            .collect();
        let budget_ms = self.config.power_window.as_secs_f64() * 1000.0 / 2.0;
        StatusReport {
            server: format!("stela {}", env!("CARGO_PKG_VERSION")),
            pid: std::process::id(),
            dir: self.config.dir.display().to_string(),
            uptime_ms: self.started.elapsed().as_millis() as u64,
            buffers: self.config.buffers as u32,
            buffer_bytes: self.config.buffer_bytes as u64,
            flush_interval_ms: self.config.flush_interval.as_millis() as u64,
            dirty_cap: self.cap.clone(),
            dirty_bytes: stats.dirty_bytes as u64,
            free_buffers: stats.free_buffers as u32,
            power: match self.pool.admission() {
                Admission::Open => "normal",
                Admission::PowerFailing => "failed: writes refused until power-restore",
                Admission::ShuttingDown => "shutting down",
            }
            .to_owned(),
            last_emergency_flush: power.last.clone(),
            logs,
            connections: self.connections.load(Ordering::Relaxed),
            appends_waited: stats.appends_waited,
            bytes_written: stats.bytes_written,
            crash_semantics: vec![
                "client crash: loses nothing acknowledged (buffered or disk)".into(),
                "daemon SIGTERM/SIGINT: writes and syncs every buffer, then exits: loses nothing acknowledged".into(),
                format!(
                    "daemon SIGKILL or crash: loses buffered records not yet written (now {} B); never disk records",
                    stats.dirty_bytes
                ),
                "OS crash: same as daemon crash (the flusher syncs every write, so written = synced)".into(),
                format!(
                    "power loss with notice (SIGPWR, stela power-fail, UPS hook): flushes at most {} B in about {:.1} ms, within {budget_ms:.0} ms: loses nothing acknowledged",
                    self.cap.bytes,
                    self.cap.bytes as f64 / self.cap.measured_write_bytes_per_s.max(1) as f64 * 1000.0
                ),
                "power loss without notice: like a daemon crash".into(),
                "machine or disk loss: loses everything (no standby yet; replicated and all are refused)".into(),
            ],
        }
    }

    fn register(&self, stream: Stream) -> u64 {
        let id = self.next_connection.fetch_add(1, Ordering::Relaxed);
        lock(&self.streams).insert(id, stream);
        self.connections.fetch_add(1, Ordering::Relaxed);
        id
    }

    fn unregister(&self, id: u64) {
        lock(&self.streams).remove(&id);
        self.connections.fetch_sub(1, Ordering::Relaxed);
    }
}

fn bind_unix(path: &Path, mode: u32) -> Result<UnixListener, StartError> {
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            return Err(StartError::SocketInUse(path.to_owned()));
        }
        // A socket file left by a daemon that died: nobody listens on it.
        let _ = std::fs::remove_file(path);
    }
    let bind_err = |source| StartError::Bind {
        what: path.display().to_string(),
        source,
    };
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(bind_err)?;
    }
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temp = path.with_file_name(format!(".{file_name}.{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&temp);
    let listener = UnixListener::bind(&temp).map_err(bind_err)?;
    std::fs::set_permissions(&temp, std::fs::Permissions::from_mode(mode)).map_err(bind_err)?;
    std::fs::rename(&temp, path).map_err(bind_err)?;
    Ok(listener)
}

/// What the accept loop needs of a stream, for Unix and TCP alike.
trait Socket: std::io::Read + std::io::Write + std::os::fd::AsFd + Send + Sized + 'static {
    fn try_clone(&self) -> io::Result<Self>;
    fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()>;
    fn into_closer(self) -> Stream;
}

impl Socket for UnixStream {
    fn try_clone(&self) -> io::Result<Self> {
        UnixStream::try_clone(self)
    }
    fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        UnixStream::set_nonblocking(self, nonblocking)
    }
    fn into_closer(self) -> Stream {
        Stream::Unix(self)
    }
}

impl Socket for TcpStream {
    fn try_clone(&self) -> io::Result<Self> {
        TcpStream::try_clone(self)
    }
    fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        TcpStream::set_nonblocking(self, nonblocking)
    }
    fn into_closer(self) -> Stream {
        Stream::Tcp(self)
    }
}

fn accept_unix(shared: Arc<Shared>, listener: UnixListener) {
    accept(&shared, listener.incoming());
}

fn accept_tcp(shared: Arc<Shared>, listener: TcpListener) {
    accept(
        &shared,
        listener.incoming().inspect(|stream| {
            if let Ok(stream) = stream {
                let _ = stream.set_nodelay(true);
            }
        }),
    );
}

/// Gives every accepted stream its own connection thread, until the daemon stops.
fn accept<S: Socket>(shared: &Arc<Shared>, incoming: impl Iterator<Item = io::Result<S>>) {
    for stream in incoming {
        if shared.stopping.load(Ordering::SeqCst) {
            break;
        }
        let Ok(stream) = stream else { continue };
        let (Ok(reader), Ok(closer)) = (stream.try_clone(), stream.try_clone()) else {
            continue;
        };
        let spin = shared.config.spin;
        let (Ok(reader), Ok(writer)) = (
            SpinStream::new(reader, spin, |s| s.set_nonblocking(true)),
            SpinStream::new(stream, Duration::ZERO, |_| Ok(())),
        ) else {
            continue;
        };
        let shared = Arc::clone(shared);
        let _ = std::thread::Builder::new()
            .name("stela-conn".into())
            .spawn(move || {
                let id = shared.register(closer.into_closer());
                crate::conn::serve(&shared, reader, writer);
                shared.unregister(id);
            });
    }
}
