//! The daemon's Prometheus metrics and the `/metrics` endpoint (`stela serve --metrics ADDR`).
//!
//! Owns: the registry, the counters the hot paths bump (one atomic add each: requests and
//! acknowledgements by level,
//! flushes, failed writes), and the gauges set from the engine's and the event loop's own
//! statistics at scrape time (dirty and buffered bytes against the cap, connections, refusals,
//! power state), so a scrape costs the hot paths nothing.
//!
//! The endpoint is a small blocking HTTP/1.1 responder: one thread accepts and hands each
//! connection to one of [`HANDLERS`] threads through a queue of [`QUEUED`]; a connection that
//! finds the queue full is closed at once. `GET /metrics` gets the text exposition format, any
//! other path 404, anything unreadable 400. The format is negotiated: OpenMetrics 1.0.0 to a
//! client whose `Accept` names `application/openmetrics-text` (Prometheus does), the classic
//! text format 0.0.4 to any other. Counters are counters (`_total`): those kept elsewhere as
//! running totals (bytes written, refusals, shipped bytes) are set to them at scrape time.
//! `process_*` ([`crate::process_metrics`]) and `stela_build_info` come with every scrape.
//!
//! A client has [`HEAD_DEADLINE`] for its whole request head, however it dribbles the bytes (issue 54: one byte every 1.5 s held the one
//! thread there was, and every scrape behind it), and as long again to take the answer; so one
//! slow client holds one handler for at most twice that, and never the others. It never panics
//! on input.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::AtomicU64;
use std::sync::mpsc::{Receiver, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use stela_proto::Durability;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Level {
    level: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LogLabel {
    log: String,
}

/// The kind of a replication session's end (`replication::SessionEnd::kind`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndKind {
    kind: String,
}

/// Per-log gauges of the hot standby, set from `stela status` at scrape time.
struct StandbyGauges {
    connected: Family<LogLabel, Gauge<u64, AtomicU64>>,
    received_lsn: Family<LogLabel, Gauge<u64, AtomicU64>>,
    lag_records: Family<LogLabel, Gauge<u64, AtomicU64>>,
    lag_bytes: Family<LogLabel, Gauge<u64, AtomicU64>>,
    lag_seconds: Family<LogLabel, Gauge<f64, AtomicU64>>,
    shipped_bytes: Family<LogLabel, Counter<u64, AtomicU64>>,
    wire_bytes: Family<LogLabel, Counter<u64, AtomicU64>>,
    degraded: Family<LogLabel, Gauge<u64, AtomicU64>>,
    degraded_acks: Family<LogLabel, Counter<u64, AtomicU64>>,
    degraded_through: Family<LogLabel, Gauge<u64, AtomicU64>>,
    unprotected_acks: Family<LogLabel, Counter<u64, AtomicU64>>,
    stalled: Family<LogLabel, Gauge<u64, AtomicU64>>,
}

/// The node's place in a failover pair, set from `stela status` at scrape time.
struct NodeGauges {
    epoch: Gauge<u64, AtomicU64>,
    primary: Gauge<u64, AtomicU64>,
    coordinator_reachable: Gauge<u64, AtomicU64>,
    unprotected: Gauge<u64, AtomicU64>,
    last_failover_seconds: Gauge<f64, AtomicU64>,
    last_failover_at: Gauge<f64, AtomicU64>,
    session_ends: Family<EndKind, Counter<u64, AtomicU64>>,
}

/// Every metric of the daemon.
pub struct Metrics {
    registry: Registry,
    /// Append and commit requests received, by the level asked, indexed as [`level_index`].
    commits: [Counter; 5],
    /// Appends and commits acknowledged, by level, indexed as [`level_index`].
    acknowledged: [Counter; 5],
    flush_bytes: Histogram,
    flush_seconds: Histogram,
    failed_writes: Counter,
    dirty_bytes: Gauge<u64, AtomicU64>,
    dirty_cap_bytes: Gauge<u64, AtomicU64>,
    buffered_bytes: Gauge<u64, AtomicU64>,
    bytes_written: Counter<u64, AtomicU64>,
    connections: Gauge<u64, AtomicU64>,
    refused_connections: Counter<u64, AtomicU64>,
    refused_logins: Counter<u64, AtomicU64>,
    power_failing: Gauge<u64, AtomicU64>,
    stopped_logs: Gauge<u64, AtomicU64>,
    standby: StandbyGauges,
    node: NodeGauges,
    /// `process_*`, without the `stela_` prefix.
    process_registry: Registry,
    process: crate::process_metrics::ProcessMetrics,
}

/// Sets a counter to a running total kept elsewhere (the engine's, the loop's, the kernel's),
/// read at scrape time: such totals only grow while the daemon runs.
fn set_total(counter: &Counter<u64, AtomicU64>, total: u64) {
    counter
        .inner()
        .store(total, std::sync::atomic::Ordering::Relaxed);
}

const LEVELS: [&str; 5] = ["unsafe", "buffered", "disk", "replicated", "all"];

fn level_index(level: Durability) -> usize {
    match level {
        Durability::Unsafe => 0,
        Durability::Buffered => 1,
        Durability::Disk => 2,
        Durability::Replicated => 3,
        Durability::All => 4,
    }
}

/// What a scrape reads from the rest of the daemon.
pub struct Snapshot {
    pub dirty_bytes: u64,
    pub dirty_cap_bytes: u64,
    pub buffered_bytes: u64,
    pub bytes_written: u64,
    pub connections: u64,
    pub refused_connections: u64,
    pub refused_logins: u64,
    pub power_failing: bool,
    pub stopped_logs: u64,
    /// The hot standby's part of `stela status`, if any.
    pub replication: Option<stela_proto::ReplicationStatus>,
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

/// Registers a gauge without labels.
fn gauge(registry: &mut Registry, name: &str, help: &str) -> Gauge<u64, AtomicU64> {
    let gauge = Gauge::<u64, AtomicU64>::default();
    registry.register(name, help, gauge.clone());
    gauge
}

/// Registers a counter without labels.
fn counter(registry: &mut Registry, name: &str, help: &str) -> Counter<u64, AtomicU64> {
    let counter = Counter::<u64, AtomicU64>::default();
    registry.register(name, help, counter.clone());
    counter
}

/// Registers a gauge per log.
fn log_gauges(
    registry: &mut Registry,
    name: &str,
    help: &str,
) -> Family<LogLabel, Gauge<u64, AtomicU64>> {
    let family = Family::<LogLabel, Gauge<u64, AtomicU64>>::default();
    registry.register(name, help, family.clone());
    family
}

/// Registers a counter per log.
fn log_counters(
    registry: &mut Registry,
    name: &str,
    help: &str,
) -> Family<LogLabel, Counter<u64, AtomicU64>> {
    let family = Family::<LogLabel, Counter<u64, AtomicU64>>::default();
    registry.register(name, help, family.clone());
    family
}

/// Registers the requests received and the acknowledgements given, one counter per level
/// each, indexed as [`level_index`].
fn register_levels(registry: &mut Registry) -> ([Counter; 5], [Counter; 5]) {
    let family = Family::<Level, Counter>::default();
    let commits = LEVELS.map(|level| family.get_or_create(&Level { level }).clone());
    registry.register(
        "commit_requests",
        "Append and commit requests received (socket and shared-memory ring), by the level asked",
        family,
    );
    let acked = Family::<Level, Counter>::default();
    let acknowledged = LEVELS.map(|level| acked.get_or_create(&Level { level }).clone());
    registry.register(
        "commits",
        "Appends and commits acknowledged, by the level they were acknowledged at",
        acked,
    );
    (commits, acknowledged)
}

/// Registers `stela_build_info`: always 1, its label the version.
fn register_build_info(registry: &mut Registry) {
    let build_info = Family::<Vec<(&'static str, &'static str)>, Gauge>::default();
    build_info
        .get_or_create(&vec![("version", env!("CARGO_PKG_VERSION"))])
        .set(1);
    registry.register(
        "build_info",
        "Always 1; the labels say which stela this is",
        build_info,
    );
}

impl StandbyGauges {
    fn register(r: &mut Registry) -> StandbyGauges {
        let lag_seconds = Family::<LogLabel, Gauge<f64, AtomicU64>>::default();
        r.register(
            "standby_lag_seconds",
            "How long the standby has acknowledged nothing while behind (0 when caught up)",
            lag_seconds.clone(),
        );
        let shipped_bytes = log_counters(
            r,
            "shipped_bytes",
            "Segment bytes of a log shipped to the standby since start",
        );
        let wire_bytes = log_counters(
            r,
            "shipped_wire_bytes",
            "What the shipped segment bytes took on the wire (lz4 where it pays)",
        );
        let degraded_acks = log_counters(
            r,
            "replication_degraded_acks",
            "Replicated commits of a log answered Unprotected (never Ok) without the standby since start (--degrade-after)",
        );
        let unprotected_acks = log_counters(
            r,
            "replication_unprotected_acks",
            "Replicated commits of a log a promoted primary answered Unprotected (never Ok) before a standby rejoined",
        );
        StandbyGauges {
            connected: log_gauges(
                r,
                "standby_connected",
                "1 while a log's stream to (primary) or from (standby) the other node is up",
            ),
            received_lsn: log_gauges(
                r,
                "standby_received_lsn",
                "The highest LSN of a log the standby holds in memory",
            ),
            lag_records: log_gauges(
                r,
                "standby_lag_records",
                "Records of a log appended on the primary that the standby does not hold yet",
            ),
            lag_bytes: log_gauges(
                r,
                "standby_lag_bytes",
                "Segment bytes of a log between what the standby acknowledged and the log's end",
            ),
            lag_seconds,
            shipped_bytes,
            wire_bytes,
            degraded: log_gauges(
                r,
                "replication_degraded",
                "1 while replicated commits of a log are answered Unprotected without the standby (--degrade-after)",
            ),
            degraded_acks,
            degraded_through: log_gauges(
                r,
                "replication_degraded_through_lsn",
                "The highest LSN of a log acknowledged without the standby (--degrade-after); on the primary alone until the standby's received LSN reaches it",
            ),
            unprotected_acks,
            stalled: log_gauges(
                r,
                "replication_stalled",
                "1 while a log's stream is up but the standby has acknowledged nothing within the link's deadline (black-holed or one-way link); the stream is then opened again",
            ),
        }
    }
}

impl NodeGauges {
    fn register(r: &mut Registry) -> NodeGauges {
        let node = NodeGauges {
            epoch: gauge(r, "epoch", "The failover pair's epoch as this node knows it"),
            primary: gauge(r, "primary", "1 while this node is the primary"),
            coordinator_reachable: gauge(
                r,
                "coordinator_reachable",
                "1 while the failover coordinator answers (0: failover unavailable)",
            ),
            unprotected: gauge(
                r,
                "unprotected",
                "1 while a promoted primary has no standby and acknowledges replicated commits alone",
            ),
            last_failover_seconds: Gauge::default(),
            last_failover_at: Gauge::default(),
            session_ends: Family::default(),
        };
        r.register(
            "last_failover_duration_seconds",
            "The last promotion of this node: from the old primary's last message to serving",
            node.last_failover_seconds.clone(),
        );
        r.register(
            "last_failover_timestamp_seconds",
            "When this node was last promoted, Unix time (0: never since start)",
            node.last_failover_at.clone(),
        );
        r.register(
            "replication_session_ends",
            "Replication sessions ended since start, by kind of end (link, tls, protocol, refused, rejected, fenced, storage, stopped): on a primary each failed attempt to reach a standby, on a standby each stream it ended or refused",
            node.session_ends.clone(),
        );
        node
    }
}

impl Metrics {
    /// Registers every metric. The exposition lists them in the order registered here.
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("stela");
        let (commits, acknowledged) = register_levels(&mut registry);
        let flush_bytes = Histogram::new(exponential_buckets(4096.0, 4.0, 10));
        registry.register(
            "flush_bytes",
            "Bytes written and synced by one flush of one log",
            flush_bytes.clone(),
        );
        let flush_seconds = Histogram::new(exponential_buckets(0.000_05, 2.0, 14));
        registry.register(
            "flush_seconds",
            "Time of one flush of one log: its writes and its fdatasync",
            flush_seconds.clone(),
        );
        let failed_writes = Counter::default();
        registry.register(
            "failed_writes",
            "Flushes whose write or fdatasync failed (each stops its log for good)",
            failed_writes.clone(),
        );
        let r = &mut registry;
        let dirty_bytes = gauge(
            r,
            "dirty_bytes",
            "Acknowledged bytes not yet written and synced",
        );
        let dirty_cap_bytes = gauge(
            r,
            "dirty_cap_bytes",
            "The cap on dirty bytes: what can be flushed within half the power window",
        );
        let buffered_bytes = gauge(
            r,
            "buffered_bytes",
            "Bytes held in the daemon's buffers (dirty, or written and kept for reads)",
        );
        let connections = gauge(r, "connections", "Client connections open now");
        let power_failing = gauge(
            r,
            "power_failing",
            "1 while a power-fail notice is in force (writes refused)",
        );
        let stopped_logs = gauge(
            r,
            "stopped_logs",
            "Logs that take no writes: a failed write or sync, or no space for a segment",
        );
        let bytes_written = counter(r, "written_bytes", "Bytes written to the logs since start");
        let refused_connections = counter(
            r,
            "refused_connections",
            "Connections refused since start (limit, timeouts, failed logins)",
        );
        let refused_logins = counter(
            r,
            "refused_logins",
            "TCP peers refused for failing authentication since start",
        );
        register_build_info(r);
        let standby = StandbyGauges::register(r);
        let node = NodeGauges::register(r);
        let mut process_registry = Registry::default();
        let process = crate::process_metrics::ProcessMetrics::register(&mut process_registry);
        Metrics {
            registry,
            commits,
            acknowledged,
            flush_bytes,
            flush_seconds,
            failed_writes,
            dirty_bytes,
            dirty_cap_bytes,
            buffered_bytes,
            bytes_written,
            connections,
            refused_connections,
            refused_logins,
            power_failing,
            stopped_logs,
            standby,
            node,
            process_registry,
            process,
        }
    }

    /// An append or commit request at `level` received.
    pub fn requested(&self, level: Durability) {
        self.commits[level_index(level)].inc();
    }

    /// An append or commit acknowledged at `level`.
    pub fn acked(&self, level: Durability) {
        self.acknowledged[level_index(level)].inc();
    }

    /// One flush of one log: `bytes` in `elapsed`, or a failure.
    pub fn flushed(&self, bytes: u64, elapsed: Duration, failed: bool) {
        if failed {
            self.failed_writes.inc();
        } else {
            self.flush_bytes.observe(bytes as f64);
            self.flush_seconds.observe(elapsed.as_secs_f64());
        }
    }

    /// The classic Prometheus text (version 0.0.4), after setting the gauges from `now`.
    pub fn render(&self, now: &Snapshot) -> String {
        to_classic_text(&self.render_openmetrics(now))
    }

    /// The OpenMetrics text (1.0.0), after setting the gauges from `now`.
    pub fn render_openmetrics(&self, now: &Snapshot) -> String {
        self.dirty_bytes.set(now.dirty_bytes);
        self.dirty_cap_bytes.set(now.dirty_cap_bytes);
        self.buffered_bytes.set(now.buffered_bytes);
        set_total(&self.bytes_written, now.bytes_written);
        self.connections.set(now.connections);
        set_total(&self.refused_connections, now.refused_connections);
        set_total(&self.refused_logins, now.refused_logins);
        self.power_failing.set(u64::from(now.power_failing));
        self.stopped_logs.set(now.stopped_logs);
        for log in now.replication.iter().flat_map(|r| &r.logs) {
            let label = LogLabel {
                log: log.log.clone(),
            };
            let g = &self.standby;
            g.connected
                .get_or_create(&label)
                .set(u64::from(log.connected && !log.stalled));
            g.stalled.get_or_create(&label).set(u64::from(log.stalled));
            g.received_lsn.get_or_create(&label).set(log.received_lsn);
            g.lag_records.get_or_create(&label).set(log.lag_records);
            g.lag_bytes.get_or_create(&label).set(log.lag_bytes);
            g.lag_seconds
                .get_or_create(&label)
                .set(log.lag_ms as f64 / 1e3);
            set_total(&g.shipped_bytes.get_or_create(&label), log.shipped_bytes);
            set_total(&g.wire_bytes.get_or_create(&label), log.wire_bytes);
            g.degraded
                .get_or_create(&label)
                .set(u64::from(log.degraded));
            set_total(&g.degraded_acks.get_or_create(&label), log.degraded_acks);
            g.degraded_through
                .get_or_create(&label)
                .set(log.degraded_through);
            set_total(
                &g.unprotected_acks.get_or_create(&label),
                log.unprotected_acks,
            );
        }
        if let Some(replication) = &now.replication {
            let n = &self.node;
            n.epoch.set(replication.epoch);
            n.primary.set(u64::from(replication.role == "primary"));
            n.coordinator_reachable.set(u64::from(
                replication
                    .coordinator
                    .as_ref()
                    .is_some_and(|c| c.reachable),
            ));
            n.unprotected
                .set(u64::from(replication.unprotected_since_ms > 0));
            if let Some(failover) = &replication.last_failover {
                n.last_failover_seconds.set(failover.took_ms as f64 / 1e3);
                n.last_failover_at.set(failover.at_unix_ms as f64 / 1e3);
            }
            for (kind, &ends) in &replication.session_ends {
                let kind = EndKind { kind: kind.clone() };
                set_total(&n.session_ends.get_or_create(&kind), ends);
            }
        }
        self.process.update();
        let mut text = String::new();
        // Writing into a String cannot fail.
        use prometheus_client::encoding::text::{encode_eof, encode_registry};
        let _ = encode_registry(&mut text, &self.registry);
        let _ = encode_registry(&mut text, &self.process_registry);
        let _ = encode_eof(&mut text);
        text
    }
}

/// OpenMetrics text as the classic Prometheus text format (version 0.0.4), which every
/// scraper and `promtool check metrics` read: a counter's HELP and TYPE name its `_total`
/// sample, and there is no `# EOF` line.
fn to_classic_text(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    let mut classic = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(name)
                .then(|| format!("{prefix}{name}_total {tail}"))
        });
        classic.push_str(renamed.as_deref().unwrap_or(line));
        classic.push('\n');
    }
    classic
}

/// Threads answering requests: a slow client holds one, the others go on answering.
pub const HANDLERS: usize = 4;
/// Accepted connections waiting for a handler; one more is closed unanswered.
pub const QUEUED: usize = 32;
/// Time a client has to send its whole request head, and again to take the answer.
pub const HEAD_DEADLINE: Duration = Duration::from_secs(2);
/// Longest request head read; the rest is not read.
const MAX_HEAD_BYTES: u64 = 16 << 10;

type Render = dyn Fn() -> String + Send + Sync;

/// Serves `/metrics` on `listener` until the process ends; `render` renders one scrape, in
/// OpenMetrics (converted for a client that does not ask for it).
pub fn serve(listener: TcpListener, render: impl Fn() -> String + Send + Sync + 'static) {
    let render: Arc<Render> = Arc::new(render);
    let (queue, waiting) = std::sync::mpsc::sync_channel::<TcpStream>(QUEUED);
    let waiting = Arc::new(Mutex::new(waiting));
    for n in 0..HANDLERS {
        let (render, waiting) = (Arc::clone(&render), Arc::clone(&waiting));
        let spawned = std::thread::Builder::new()
            .name(format!("stela-metrics-{n}"))
            .spawn(move || handle(&waiting, render.as_ref()));
        if let Err(error) = spawned {
            tracing::warn!(%error, "starting a metrics handler thread");
        }
    }
    for stream in listener.incoming() {
        match stream {
            Ok(stream) => match queue.try_send(stream) {
                Ok(()) => {}
                Err(TrySendError::Full(_)) => {
                    tracing::debug!("metrics: every handler busy and the queue full; closed")
                }
                Err(TrySendError::Disconnected(_)) => {
                    tracing::error!("metrics: no handler thread left; endpoint stops");
                    return;
                }
            },
            Err(error) => tracing::warn!(%error, "accepting a metrics connection"),
        }
    }
}

/// One handler: answers the queued connections one at a time, until the queue goes away.
fn handle(waiting: &Mutex<Receiver<TcpStream>>, render: &Render) {
    loop {
        let next = waiting.lock().unwrap_or_else(|e| e.into_inner()).recv();
        let Ok(stream) = next else { return };
        if let Err(error) = answer(stream, render) {
            tracing::debug!(%error, "metrics request");
        }
    }
}

/// Binds the endpoint and starts its threads.
pub fn start(
    addr: SocketAddr,
    render: impl Fn() -> String + Send + Sync + 'static,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)?;
    let bound = listener.local_addr()?;
    std::thread::Builder::new()
        .name("stela-metrics".into())
        .spawn(move || serve(listener, render))?;
    Ok(bound)
}

/// Reads a stream until a deadline for the whole of what is read, not for each read: every
/// read waits at most for what is left.
struct UntilDeadline<'a> {
    stream: &'a TcpStream,
    deadline: Instant,
}

impl std::io::Read for UntilDeadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        self.stream.set_read_timeout(Some(left))?;
        let mut stream = self.stream;
        stream.read(buf)
    }
}

fn answer(stream: TcpStream, render: &Render) -> std::io::Result<()> {
    stream.set_write_timeout(Some(HEAD_DEADLINE))?;
    let head = UntilDeadline {
        stream: &stream,
        deadline: Instant::now() + HEAD_DEADLINE,
    };
    let mut reader = BufReader::new(head).take(MAX_HEAD_BYTES);
    let mut request_line = String::new();
    if let Err(error) = reader.read_line(&mut request_line) {
        return refuse(stream, &error);
    }
    // The headers are read to the blank line, so the client sees its request consumed before
    // the answer; only Accept is looked at (content negotiation, as Prometheus asks).
    let mut header = String::new();
    let mut openmetrics = false;
    loop {
        header.clear();
        match reader.read_line(&mut header) {
            Ok(0) => break,
            Ok(_) if header == "\r\n" || header == "\n" => break,
            Ok(_) => openmetrics |= accepts_openmetrics(&header),
            Err(error) => return refuse(stream, &error),
        }
    }
    drop(reader);
    let mut parts = request_line.split_whitespace();
    match (parts.next(), parts.next()) {
        (Some("GET"), Some("/metrics")) if openmetrics => respond(
            stream,
            "200 OK",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            &render(),
        ),
        (Some("GET"), Some("/metrics")) => respond(
            stream,
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            &to_classic_text(&render()),
        ),
        (Some(_), Some(_)) => respond(stream, "404 Not Found", "text/plain", "try /metrics\n"),
        _ => respond(stream, "400 Bad Request", "text/plain", "bad request\n"),
    }
}

/// Whether a request header asks for OpenMetrics: an `Accept` naming
/// `application/openmetrics-text` (Prometheus sends it first, with the classic text as a
/// fallback at a lower weight). Anything else gets the classic text.
fn accepts_openmetrics(header: &str) -> bool {
    let Some((name, value)) = header.split_once(':') else {
        return false;
    };
    name.trim().eq_ignore_ascii_case("accept")
        && value.split(',').any(|kind| {
            let mut parts = kind.split(';').map(str::trim);
            let accepted = parts.next() == Some("application/openmetrics-text");
            let refused = parts.any(|p| p.replace(' ', "") == "q=0");
            accepted && !refused
        })
}

/// Answers a request head that could not be read: too slow (408) or not text (400).
fn refuse(stream: TcpStream, error: &std::io::Error) -> std::io::Result<()> {
    if matches!(
        error.kind(),
        std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
    ) {
        respond(
            stream,
            "408 Request Timeout",
            "text/plain",
            "request too slow\n",
        )
    } else {
        respond(stream, "400 Bad Request", "text/plain", "bad request\n")
    }
}

use std::io::Read as _;

fn respond(mut stream: TcpStream, status: &str, kind: &str, body: &str) -> std::io::Result<()> {
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    stream.flush()
}
