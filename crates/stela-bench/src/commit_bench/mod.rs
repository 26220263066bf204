//! `stela-bench commit`: commits/s and commit latency of the embedded log against the log
//! daemon, by number of concurrent clients, record size, transport (shared-memory ring or
//! socket) and idle connections held open. It owns the arguments, the order of the runs, the
//! result rows (table, JSON lines), and the ratios the daemon is judged by (over the ring, with
//! no idle connections): `service-buffered` reaches at least half of `embedded-unsafe` at 1, 16
//! and 64 clients and answers a one-client commit in at most 2 us (p50); `service-disk` reaches
//! at least 0.9 of `embedded-group` at 16 and 64 clients; with N idle connections held,
//! `service-buffered` keeps at least 90 % of its commits/s with none. The socket transport's
//! figures are printed beside, without a target.
//!
//! Every (mode, transport, idle connections, clients, record size) is one run on a fresh log.
//! Embedded runs: a temporary directory, or `--dir DIR/<mode>-c<clients>-<N>B-r<repeat>`.
//! Service runs: by default a daemon started in this process for the run, in a temporary
//! directory or `--dir DIR/<mode>-<transport>-i<idle>-c<clients>-<N>B-r<repeat>`; with
//! `--socket PATH`, the daemon already running there, with its own settings, in a log of its
//! own named `bench-<mode>-<transport>-i<idle>-c<clients>-<N>B-r<repeat>-<pid>-<start time>`
//! (left in the daemon afterwards). All clients of a run write to one log. How a run is timed is
//! in [`stela::drive`], the driver the product's demo runs on too.

mod targets;

use crate::harness::RunDir;
use crate::record::{encoded_len, make_sized_records, Record};
use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Duration;
use stela::drive::{self, Daemon, DaemonEnv, Mode, RecordSource, ServiceRun, Timing, WARMUP};
use stela_client::Transport;
use stela_format::Codec;
use targets::print_ratios;

/// Record sizes run when `--record-bytes` is not given.
pub const DEFAULT_RECORD_BYTES: [usize; 2] = [100, 4096];
/// Smallest and largest `--record-bytes`: a [`Record`] cannot encode smaller, and the daemon's
/// default buffers (512 KiB) must hold one.
const RECORD_BYTES_RANGE: std::ops::RangeInclusive<usize> = 32..=256 << 10;
/// Distinct records each run cycles through (generated once, untimed).
const RECORDS_PER_SIZE: usize = 256;
/// Most idle connections one run may hold.
const MAX_IDLE_CONNECTIONS: usize = 1_000_000;

/// How the service modes' clients reach the daemon.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TransportChoice {
    /// The shared-memory ring (a run that cannot get one fails rather than use the socket).
    Shm,
    /// The Unix socket.
    Socket,
}

impl TransportChoice {
    pub fn name(self) -> &'static str {
        self.transport().name()
    }

    pub fn transport(self) -> Transport {
        match self {
            TransportChoice::Shm => Transport::SharedMemory,
            TransportChoice::Socket => Transport::Socket,
        }
    }
}

impl std::fmt::Display for TransportChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Arguments of `stela-bench commit`.
#[derive(clap::Args, Debug, Clone)]
pub struct CommitBenchArgs {
    /// Numbers of concurrent clients (threads; each has its own connection or Wal handle), comma
    /// list; one run each.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64")]
    pub clients: Vec<usize>,
    /// Modes, comma list (default: all six).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = Mode::ALL)]
    pub modes: Vec<Mode>,
    /// Size of each record as MessagePack, in bytes (default: both 100 and 4096).
    #[arg(long, value_name = "N")]
    pub record_bytes: Option<usize>,
    /// Measured seconds of each run (after a 0.3 s warm-up).
    #[arg(long, value_name = "SECONDS", default_value_t = 3.0)]
    pub duration: f64,
    /// Print one JSON object per run instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Save an SVG chart of commits/s by clients to PATH (one per record size, suffixed -<N>B,
    /// when there are several).
    #[arg(long, value_name = "PATH")]
    pub chart: Option<PathBuf>,
    /// Keep each run's log in DIR/<mode>-c<clients>-<N>B-r<repeat> (service modes:
    /// DIR/<mode>-<transport>-i<idle>-c<clients>-<N>B-r<repeat>) instead of a temporary
    /// directory.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Run the service modes against the daemon already running at this Unix socket instead of
    /// one started in this process per run. Its own settings then apply; each run writes a log
    /// of its own there (bench-<mode>-<transport>-i<idle>-c<clients>-<N>B-r<repeat>-<pid>-<time>),
    /// left in place, and touches no other.
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// How the service modes' clients commit, comma list: shm (the shared-memory ring; a run
    /// that cannot get one fails) or socket. Several take turns like the modes.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [TransportChoice::Shm])]
    pub transport: Vec<TransportChoice>,
    /// Connections held open, through their Hello and silent, during each service run; comma
    /// list (e.g. 0,5000), the counts taking turns like the modes. Raises this process's file
    /// limit to its hard limit; fails at once if they do not fit.
    #[arg(long, value_name = "N", value_delimiter = ',', default_value = "0")]
    pub idle_connections: Vec<usize>,
    /// Run every (mode, transport, idle connections, clients, size) this many times, taking
    /// turns, and report the run with the median commits/s: run-to-run swings on a VM are larger
    /// than some of the differences between modes, and taking turns exposes every one to the
    /// same drift.
    #[arg(long, default_value_t = 1)]
    pub repeats: usize,
    /// Do not show a progress bar.
    #[arg(long)]
    pub no_progress: bool,
}

/// What to run; [`CommitBenchArgs::to_config`] validates the arguments into one.
#[derive(Clone, Debug)]
pub struct CommitBenchConfig {
    pub modes: Vec<Mode>,
    pub clients: Vec<usize>,
    pub record_bytes: Vec<usize>,
    pub timing: Timing,
    pub dir: Option<PathBuf>,
    /// A running daemon for the service modes (none: one in this process per run).
    pub socket: Option<PathBuf>,
    pub transports: Vec<TransportChoice>,
    pub idle_connections: Vec<usize>,
    pub json: bool,
    pub progress: bool,
    pub repeats: usize,
}

impl CommitBenchArgs {
    pub fn to_config(&self) -> anyhow::Result<CommitBenchConfig> {
        anyhow::ensure!(
            self.duration.is_finite() && self.duration > 0.0 && self.duration <= 3600.0,
            "--duration must be a number of seconds above 0 (and at most 3600), not {}",
            self.duration
        );
        anyhow::ensure!(
            !self.clients.is_empty() && self.clients.iter().all(|&c| (1..=4096).contains(&c)),
            "--clients must be a list of numbers from 1 to 4096"
        );
        anyhow::ensure!(
            !self.modes.is_empty(),
            "--modes must name at least one mode"
        );
        anyhow::ensure!(
            !self.transport.is_empty(),
            "--transport must name shm, socket or both"
        );
        anyhow::ensure!(
            !self.idle_connections.is_empty()
                && self
                    .idle_connections
                    .iter()
                    .all(|&n| n <= MAX_IDLE_CONNECTIONS),
            "--idle-connections must be a list of numbers from 0 to {MAX_IDLE_CONNECTIONS}"
        );
        let record_bytes = match self.record_bytes {
            Some(bytes) => {
                anyhow::ensure!(
                    RECORD_BYTES_RANGE.contains(&bytes),
                    "--record-bytes must be from {} to {}, not {bytes}",
                    RECORD_BYTES_RANGE.start(),
                    RECORD_BYTES_RANGE.end()
                );
                vec![bytes]
            }
            None => DEFAULT_RECORD_BYTES.to_vec(),
        };
        Ok(CommitBenchConfig {
            modes: dedup(&self.modes),
            clients: dedup(&self.clients),
            record_bytes,
            timing: Timing {
                warmup: WARMUP,
                window: Duration::from_secs_f64(self.duration),
            },
            dir: self.dir.clone(),
            socket: self.socket.clone(),
            transports: dedup(&self.transport),
            idle_connections: dedup(&self.idle_connections),
            json: self.json,
            repeats: self.repeats.max(1),
            progress: !self.no_progress,
        })
    }
}

fn dedup<T: PartialEq + Copy>(items: &[T]) -> Vec<T> {
    let mut out = Vec::new();
    for &item in items {
        if !out.contains(&item) {
            out.push(item);
        }
    }
    out
}

/// One run's result. Serializes to JSON with exactly these keys.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct CommitRow {
    pub mode: String,
    /// `shm` or `socket` for the service modes (what the clients actually got); null for the
    /// embedded ones.
    pub transport: Option<String>,
    /// Connections held idle during the run (service modes; null for the embedded ones).
    pub idle_connections: Option<usize>,
    pub clients: usize,
    pub record_bytes: usize,
    pub commits: u64,
    pub seconds: f64,
    pub commits_per_s: f64,
    /// Median latency of one commit in microseconds (null if nothing committed).
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    /// The daemon in the middle of the run (service modes): resident memory in KiB (for a
    /// daemon in this process, the whole process's; null if its pid is not readable here),
    /// threads, and connections held.
    pub daemon_rss_kib: Option<u64>,
    pub daemon_threads: Option<u32>,
    pub daemon_connections: Option<u32>,
}

/// One kind of run: a mode, and for the service modes a transport and an idle-connection count.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Variant {
    mode: Mode,
    transport: Option<TransportChoice>,
    idle: Option<usize>,
}

impl Variant {
    /// Every variant of `cfg`, modes first, so a mode's variants are measured next to each
    /// other.
    fn all(cfg: &CommitBenchConfig) -> Vec<Variant> {
        let mut variants = Vec::new();
        for &mode in &cfg.modes {
            if mode.durability().is_none() {
                variants.push(Variant {
                    mode,
                    transport: None,
                    idle: None,
                });
                continue;
            }
            for &transport in &cfg.transports {
                for &idle in &cfg.idle_connections {
                    variants.push(Variant {
                        mode,
                        transport: Some(transport),
                        idle: Some(idle),
                    });
                }
            }
        }
        variants
    }

    /// `<mode>` or `<mode>-<transport>-i<idle>`: names a run's folder or log.
    fn label(&self) -> String {
        match (self.transport, self.idle) {
            (Some(transport), Some(idle)) => format!("{}-{transport}-i{idle}", self.mode),
            _ => self.mode.to_string(),
        }
    }
}

/// Where the service runs' daemon comes from, settled once per invocation.
enum DaemonSource {
    /// None needed: no service mode is run.
    None,
    /// One per run in this process, with the disk rate measured once.
    InProcess(DaemonEnv),
    /// The one running at this socket.
    Running(PathBuf),
}

/// Every (record size, clients, variant) of `cfg`, in that order, so the rows of one client
/// count are measured next to each other. Prints rows as they come, then the ratios (not in
/// JSON).
pub fn run(cfg: &CommitBenchConfig, out: &mut dyn Write) -> anyhow::Result<Vec<CommitRow>> {
    if let Some(dir) = &cfg.dir {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    let variants = Variant::all(cfg);
    let any_service = cfg.modes.iter().any(|m| m.durability().is_some());
    let daemon = match (&cfg.socket, any_service) {
        (_, false) => DaemonSource::None,
        (Some(socket), true) => DaemonSource::Running(socket.clone()),
        (None, true) => {
            let base = cfg.dir.clone().unwrap_or_else(std::env::temp_dir);
            DaemonSource::InProcess(DaemonEnv::measure(&base)?)
        }
    };
    // Fail before the first run, not after an hour of them, if the idle connections do not fit.
    let most_idle = cfg.idle_connections.iter().copied().max().unwrap_or(0);
    let most_clients = cfg.clients.iter().copied().max().unwrap_or(1);
    match &daemon {
        DaemonSource::None => {}
        DaemonSource::InProcess(_) => drive::check_descriptors(most_idle, most_clients, true)?,
        DaemonSource::Running(socket) => {
            drive::check_descriptors(most_idle, most_clients, false)?;
            // Reachable at all? (Each run checks its room for connections again.)
            drive::daemon_status(socket)?;
        }
    }
    if !cfg.json {
        print_preamble(cfg, &daemon, out)?;
        writeln!(out, "{}", table_header())?;
    }
    let show_daemon = !cfg.json && any_service && most_idle > 0;
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let runs = cfg.record_bytes.len() * cfg.clients.len() * variants.len() * cfg.repeats;
    let progress = if cfg.progress && !cfg.json && std::io::stderr().is_terminal() {
        let bar = ProgressBar::new(runs as u64);
        bar.set_style(
            ProgressStyle::with_template(
                "{msg:40} [{bar:30}] {pos}/{len} runs, {elapsed} elapsed, eta {eta}",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        bar.enable_steady_tick(Duration::from_millis(250));
        bar
    } else {
        ProgressBar::hidden()
    };
    let mut rows = Vec::with_capacity(runs);
    for &bytes in &cfg.record_bytes {
        let records = make_sized_records(RECORDS_PER_SIZE, 42, bytes);
        for &clients in &cfg.clients {
            let mut outcomes: Vec<Vec<CommitRow>> = vec![Vec::new(); variants.len()];
            for repeat in 0..cfg.repeats {
                for (index, variant) in variants.iter().enumerate() {
                    let name = format!("{}-c{clients}-{bytes}B-r{repeat}", variant.label());
                    progress.set_message(name.clone());
                    let sources = (0..clients)
                        .map(|c| Cycle {
                            records: &records,
                            next: c * RECORDS_PER_SIZE / clients,
                        })
                        .collect();
                    let log = format!("bench-{name}-{}-{started}", std::process::id());
                    let service = match (&daemon, variant.transport, variant.idle) {
                        (DaemonSource::InProcess(env), Some(transport), Some(idle)) => {
                            Some(ServiceRun {
                                daemon: Daemon::InProcess(env),
                                transport: transport.transport(),
                                idle_connections: idle,
                            })
                        }
                        (DaemonSource::Running(socket), Some(transport), Some(idle)) => {
                            Some(ServiceRun {
                                daemon: Daemon::Running { socket, log: &log },
                                transport: transport.transport(),
                                idle_connections: idle,
                            })
                        }
                        _ => None,
                    };
                    // A run against a running daemon keeps nothing here: no folder for it.
                    let dir = match service.map(|s| s.daemon) {
                        Some(Daemon::Running { .. }) => None,
                        _ => Some(RunDir::new(cfg.dir.as_deref(), &name)?),
                    };
                    let scratch = std::env::temp_dir();
                    let path = dir.as_ref().map_or(scratch.as_path(), RunDir::path);
                    let outcome = drive::run_mode_with(
                        variant.mode,
                        path,
                        service.as_ref(),
                        cfg.timing,
                        sources,
                    )
                    .with_context(|| format!("{name}: run failed"))?;
                    drop(dir);
                    let sample = outcome.daemon.as_ref();
                    outcomes[index].push(CommitRow {
                        mode: variant.mode.name().to_string(),
                        transport: outcome.transport.map(str::to_string),
                        idle_connections: variant.idle,
                        clients,
                        record_bytes: bytes,
                        commits: outcome.commits,
                        seconds: outcome.seconds,
                        commits_per_s: outcome.commits_per_s(),
                        p50_us: outcome.latency.percentile_us(50.0),
                        p99_us: outcome.latency.percentile_us(99.0),
                        daemon_rss_kib: sample.and_then(|s| s.rss_kib),
                        daemon_threads: sample.map(|s| s.threads),
                        daemon_connections: sample.map(|s| s.connections),
                    });
                    progress.inc(1);
                }
            }
            for mut runs in outcomes {
                runs.sort_by(|a, b| a.commits_per_s.total_cmp(&b.commits_per_s));
                let row = runs.swap_remove(runs.len() / 2);
                let mut lines = vec![if cfg.json {
                    serde_json::to_string(&row)?
                } else {
                    table_row(&row)
                }];
                if show_daemon && row.transport.is_some() {
                    lines.push(daemon_line(&row, &daemon));
                }
                progress.suspend(|| -> std::io::Result<()> {
                    for line in &lines {
                        writeln!(out, "{line}")?;
                    }
                    out.flush()
                })?;
                rows.push(row);
            }
        }
    }
    progress.finish_and_clear();
    if !cfg.json {
        let baseline = baseline_idle(&cfg.idle_connections);
        for &bytes in &cfg.record_bytes {
            print_ratios(&rows, bytes, baseline, out)?;
        }
    }
    Ok(rows)
}

/// One client's records: the shared set, from its own starting point.
struct Cycle<'a> {
    records: &'a [Record],
    next: usize,
}

impl RecordSource for Cycle<'_> {
    type Record = Record;

    fn next_record(&mut self) -> &Record {
        let record = &self.records[self.next % self.records.len()];
        self.next = self.next.wrapping_add(1);
        record
    }
}

fn print_preamble(
    cfg: &CommitBenchConfig,
    daemon: &DaemonSource,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let sizes: Vec<String> = cfg
        .record_bytes
        .iter()
        .map(|&bytes| {
            let records = make_sized_records(RECORDS_PER_SIZE, 42, bytes);
            let mean = records
                .iter()
                .map(|r| encoded_len(Codec::MessagePack, r))
                .sum::<usize>() as f64
                / records.len() as f64;
            format!("{bytes} B (mean encoded {mean:.1} B)")
        })
        .collect();
    writeln!(
        out,
        "commit = one record appended and committed; records as msgpack: {}",
        sizes.join(", ")
    )?;
    writeln!(
        out,
        "each run: fresh log shared by all clients, {:.1} s warm-up excluded, {:.1} s measured; \
         latency = one commit (encode included)",
        cfg.timing.warmup.as_secs_f64(),
        cfg.timing.window.as_secs_f64()
    )?;
    let transports: Vec<&str> = cfg.transports.iter().map(|t| t.name()).collect();
    let idle: Vec<String> = cfg.idle_connections.iter().map(|n| n.to_string()).collect();
    match daemon {
        DaemonSource::None => {}
        DaemonSource::InProcess(env) => writeln!(
            out,
            "daemon: in this process, default config, one per run; disk rate measured once: {}",
            env.describe()
        )?,
        DaemonSource::Running(socket) => {
            let report = drive::daemon_status(socket)?;
            writeln!(
                out,
                "daemon: already running at {} ({}, pid {}, dir {}), its own settings apply: {}",
                socket.display(),
                report.server,
                report.pid,
                report.dir,
                report.dirty_cap.derivation
            )?;
            writeln!(
                out,
                "each service run writes a log of its own there, bench-<run>-{}-<time>, left in \
                 place",
                std::process::id()
            )?;
        }
    }
    if !matches!(daemon, DaemonSource::None) {
        writeln!(
            out,
            "service modes over: {}; idle connections held during each run: {}",
            transports.join(", "),
            idle.join(", ")
        )?;
    }
    Ok(())
}

/// The header line of the table.
pub fn table_header() -> String {
    format!(
        "{:<17} {:>9} {:>6} {:>7} {:>8} {:>10} {:>7} {:>12} {:>9} {:>9}",
        "mode",
        "transport",
        "idle",
        "clients",
        "record B",
        "commits",
        "seconds",
        "commits/s",
        "p50 us",
        "p99 us"
    )
}

/// One row of the table, aligned with [`table_header`].
pub fn table_row(row: &CommitRow) -> String {
    let latency = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.1}"));
    format!(
        "{:<17} {:>9} {:>6} {:>7} {:>8} {:>10} {:>7.2} {:>12.0} {:>9} {:>9}",
        row.mode,
        row.transport.as_deref().unwrap_or("-"),
        row.idle_connections
            .map_or_else(|| "-".to_string(), |n| n.to_string()),
        row.clients,
        row.record_bytes,
        row.commits,
        row.seconds,
        row.commits_per_s,
        latency(row.p50_us),
        latency(row.p99_us)
    )
}

/// The line under a service row: what the daemon held in the middle of the run.
fn daemon_line(row: &CommitRow, daemon: &DaemonSource) -> String {
    let rss = row.daemon_rss_kib.map_or_else(
        || "RSS unknown (its pid is not on this machine)".to_string(),
        |kib| format!("RSS {:.1} MiB", kib as f64 / 1024.0),
    );
    let whose = match daemon {
        DaemonSource::Running(_) => "the daemon's own; the connections include this sample's",
        _ => "in this process: RSS is the whole process's, threads the daemon's",
    };
    format!(
        "  daemon: {rss}, {} threads, {} connections ({whose})",
        row.daemon_threads.unwrap_or(0),
        row.daemon_connections.unwrap_or(0)
    )
}

/// The idle-connection count the targets are judged at: 0 when it was run, else the fewest.
fn baseline_idle(idle: &[usize]) -> usize {
    idle.iter().copied().min().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: CommitBenchArgs,
    }

    #[test]
    fn defaults_and_lists() {
        let cfg = Cli::try_parse_from(["x"])
            .unwrap()
            .args
            .to_config()
            .unwrap();
        assert_eq!(cfg.modes, Mode::ALL.to_vec());
        assert_eq!(cfg.clients, vec![1, 4, 16, 64]);
        assert_eq!(cfg.record_bytes, vec![100, 4096]);
        assert_eq!(cfg.timing.window, Duration::from_secs(3));
        let cli = Cli::try_parse_from([
            "x",
            "--clients",
            "1,16",
            "--modes",
            "embedded-unsafe,service-buffered",
            "--record-bytes",
            "100",
            "--duration",
            "0.3",
        ])
        .unwrap();
        let cfg = cli.args.to_config().unwrap();
        assert_eq!(cfg.modes, vec![Mode::EmbeddedUnsafe, Mode::ServiceBuffered]);
        assert_eq!(cfg.clients, vec![1, 16]);
        assert_eq!(cfg.record_bytes, vec![100]);
        assert!(Cli::try_parse_from(["x", "--modes", "fast"]).is_err());
        for bad in [
            &["x", "--duration", "0"][..],
            &["x", "--duration", "NaN"],
            &["x", "--clients", "0"],
            &["x", "--record-bytes", "4"],
        ] {
            let args = Cli::try_parse_from(bad).unwrap().args;
            assert!(args.to_config().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn transports_idle_counts_and_socket_parse() {
        let cfg = Cli::try_parse_from(["x"])
            .unwrap()
            .args
            .to_config()
            .unwrap();
        assert_eq!(cfg.transports, vec![TransportChoice::Shm]);
        assert_eq!(cfg.idle_connections, vec![0]);
        assert_eq!(cfg.socket, None);
        let cfg = Cli::try_parse_from([
            "x",
            "--transport",
            "shm,socket",
            "--idle-connections",
            "0,5000",
            "--socket",
            "/run/stela/stela.sock",
        ])
        .unwrap()
        .args
        .to_config()
        .unwrap();
        assert_eq!(
            cfg.transports,
            vec![TransportChoice::Shm, TransportChoice::Socket]
        );
        assert_eq!(cfg.idle_connections, vec![0, 5000]);
        assert_eq!(cfg.socket, Some(PathBuf::from("/run/stela/stela.sock")));
        assert!(Cli::try_parse_from(["x", "--transport", "pigeon"]).is_err());
        let too_many = Cli::try_parse_from(["x", "--idle-connections", "2000000"])
            .unwrap()
            .args;
        assert!(too_many.to_config().is_err());
        // Every service mode runs once per (transport, idle count); an embedded one once.
        let cfg = Cli::try_parse_from([
            "x",
            "--modes",
            "embedded-unsafe,service-disk",
            "--transport",
            "shm,socket",
            "--idle-connections",
            "0,10",
        ])
        .unwrap()
        .args
        .to_config()
        .unwrap();
        let labels: Vec<String> = Variant::all(&cfg).iter().map(Variant::label).collect();
        assert_eq!(
            labels,
            [
                "embedded-unsafe",
                "service-disk-shm-i0",
                "service-disk-shm-i10",
                "service-disk-socket-i0",
                "service-disk-socket-i10"
            ]
        );
    }

    fn short_config(base: &std::path::Path) -> CommitBenchConfig {
        CommitBenchConfig {
            modes: vec![Mode::EmbeddedUnsafe, Mode::ServiceBuffered],
            clients: vec![1, 2],
            record_bytes: vec![100],
            timing: Timing {
                warmup: Duration::from_millis(10),
                window: Duration::from_millis(100),
            },
            dir: Some(base.to_path_buf()),
            socket: None,
            transports: vec![TransportChoice::Shm, TransportChoice::Socket],
            idle_connections: vec![0, 3],
            json: false,
            progress: false,
            repeats: 1,
        }
    }

    #[test]
    fn runs_table_ratios_and_dir() {
        let base = tempfile::tempdir().unwrap();
        let cfg = short_config(base.path());
        let mut out = Vec::new();
        let rows = run(&cfg, &mut out).unwrap();
        assert_eq!(rows.len(), 10);
        assert!(rows.iter().all(|r| r.commits > 0 && r.p99_us >= r.p50_us));
        for row in &rows {
            if row.mode == "embedded-unsafe" {
                assert_eq!(row.transport, None, "{row:?}");
                assert_eq!(row.daemon_threads, None, "{row:?}");
                continue;
            }
            let idle = row.idle_connections.unwrap();
            // The daemon held the idle connections and the clients while it was sampled.
            let connections = row.daemon_connections.unwrap() as usize;
            assert!(connections >= idle + row.clients, "{row:?}");
            assert!(row.daemon_threads.unwrap() > 0, "{row:?}");
            assert!(row.daemon_rss_kib.unwrap() > 0, "{row:?}");
        }
        let transports: Vec<Option<&str>> = rows.iter().map(|r| r.transport.as_deref()).collect();
        assert_eq!(
            &transports[..5],
            [
                None,
                Some("shm"),
                Some("shm"),
                Some("socket"),
                Some("socket")
            ]
        );
        let text = String::from_utf8(out).unwrap();
        for line in [
            "shm: service-buffered / embedded-unsafe",
            "socket: service-buffered / embedded-unsafe",
            "shm: service-buffered p50 at 1 client",
            "shm: buffered commits/s with 3 idle / with 0",
            "socket: buffered commits/s with 3 idle / with 0",
            "  daemon: RSS ",
        ] {
            assert!(text.contains(line), "{line:?} missing from\n{text}");
        }
        assert!(base
            .path()
            .join("service-buffered-socket-i3-c2-100B-r0/logs/bench")
            .is_dir());
        assert!(base.path().join("embedded-unsafe-c1-100B-r0").is_dir());
        // A second run into the same folders refuses rather than appending to old logs.
        assert!(run(&cfg, &mut Vec::new()).is_err());
    }
}
