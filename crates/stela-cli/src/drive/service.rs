//! A run through a daemon ([`ServiceRun`]): one started in this process in the run's directory
//! with the settings of [`DaemonEnv`], or one already running (its own settings, a log of the
//! run's own that must be new). Before anything opens, the run checks that its connections fit
//! under this process's file limit and the daemon's connection limit; the daemon is sampled
//! (memory, threads, connections) in the middle of the window.

use super::idle::IdleConnections;
use super::records::LoggedSource;
use super::timed::{drive, settle_writeback, Commit, DaemonSample, Outcome, Timing, CLIENT_THREAD};
use anyhow::{anyhow, Context};
use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use stela_client::{Address, Connection, Transport};
use stela_format::Codec;
use stela_proto::{Durability, RequestBody, ResponseBody, StatusReport};
use stela_server::{DaemonConfig, Server};
use stela_wal::storage::{StdStorage, Storage};

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
pub(super) const LOG_NAME: &str = "bench";

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

pub(super) fn run_service<S: LoggedSource>(
    durability: Durability,
    dir: &Path,
    service: &ServiceRun<'_>,
    timing: Timing,
    sources: Vec<S>,
) -> anyhow::Result<Outcome> {
    let run = Run {
        idle_connections: service.idle_connections,
        options: stela_client::WalOptions::default()
            .codec(Codec::MessagePack)
            .durability(durability)
            .transport(service.transport),
        timing,
        sources,
    };
    match service.daemon {
        Daemon::InProcess(env) => run_in_process(env, dir, run),
        Daemon::Running { socket, log } => run_against(socket, log, run),
    }
}

/// What a service run puts on its daemon, whichever daemon that is: the idle connections,
/// then one client per record source, opened with `options` and driven for `timing`.
struct Run<S> {
    idle_connections: usize,
    options: stela_client::WalOptions,
    timing: Timing,
    sources: Vec<S>,
}

/// A service run through a daemon started in this process in `dir` for the run (its socket in
/// a short temporary directory when `dir` is too deep for one), stopped afterwards.
fn run_in_process<S: LoggedSource>(
    env: &DaemonEnv,
    dir: &Path,
    run: Run<S>,
) -> anyhow::Result<Outcome> {
    let clients = run.sources.len();
    settle_writeback(dir)?;
    check_descriptors(run.idle_connections, clients, true)?;
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
        run.idle_connections + clients <= served,
        "{} idle connections and {clients} clients are more than the daemon serves at \
         once with this file limit ({served})",
        run.idle_connections
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
    let result = connect_and_drive(server.socket_path(), LOG_NAME, run, &probe);
    let stopped = server.shutdown();
    drop(short_socket);
    let outcome = result?;
    stopped.map_err(|e| anyhow!("stopping the daemon: {e}"))?;
    Ok(outcome)
}

/// A service run through the daemon already running at `socket`, on its log `log`.
fn run_against<S: LoggedSource>(socket: &Path, log: &str, run: Run<S>) -> anyhow::Result<Outcome> {
    let clients = run.sources.len();
    check_descriptors(run.idle_connections, clients, false)?;
    let report = daemon_status(socket)?;
    let free = report.max_connections.saturating_sub(report.connections) as usize;
    anyhow::ensure!(
        run.idle_connections + clients <= free,
        "the daemon at {} serves at most {} client connections and holds {} now: no room \
         for {} idle connections and {clients} clients",
        socket.display(),
        report.max_connections,
        report.connections,
        run.idle_connections
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
    connect_and_drive(socket, log, run, &probe)
}

/// Opens the idle connections, then one client per source on `log`, and drives them.
fn connect_and_drive<S: LoggedSource>(
    socket: &Path,
    log: &str,
    run: Run<S>,
    probe: &dyn Fn() -> anyhow::Result<DaemonSample>,
) -> anyhow::Result<Outcome> {
    let Run {
        idle_connections,
        options,
        timing,
        sources,
    } = run;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drive::timed::tests::{daemon_in, short, Same};
    use crate::drive::{run_mode_with, Mode};
    use std::time::Duration;

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
        // At `disk` a window of 100 ms can hold no completed commit when one fdatasync stalls
        // that long (CI saw 0 commits): this test is about the logs, so half a second of it.
        let timing = Timing {
            window: Duration::from_millis(500),
            ..short()
        };
        let outcome = run_mode_with(
            Mode::ServiceDisk,
            unused.path(),
            Some(&service),
            timing,
            sources,
        )
        .unwrap();
        assert!(
            outcome.commits > 0,
            "no disk commit completed in half a second"
        );
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
    fn descriptors_that_cannot_fit_are_refused_before_anything_opens() {
        check_descriptors(10, 4, true).unwrap();
        let error = check_descriptors(usize::MAX, 4, true).unwrap_err();
        assert!(error.to_string().contains("file limit"), "{error}");
    }
}
