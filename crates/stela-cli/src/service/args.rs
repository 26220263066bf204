//! `stela serve`'s flags and settings: the flags themselves, a TOML config file read as flags
//! (`--config`, with a suggestion for a misspelt key), and the daemon's configuration built
//! from them.
//!
//! Invariant: every default comes from `stela_server::config` (the one place the daemon's
//! defaults live); a config file's keys are exactly the long flags, checked by clap's own
//! parsers, so a file can say nothing a command line cannot.

use anyhow::Context;
use clap::Args;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use stela_server::{config, DaemonConfig};

use crate::units::{parse_ms, parse_rate, parse_secs, parse_size, parse_us, Dur, Size};

/// `stela serve`'s flags. Every default comes from `stela_server::config` (the one place the
/// daemon's defaults live; `docs/DAEMON.md` lists them and a test checks it does). Sizes and
/// durations are spelt as in [`crate::units`] (`512KiB`, `50ms`); a bare number keeps each
/// flag's old unit.
#[derive(Args, Debug, serde::Serialize)]
#[command(args_override_self = true)]
#[serde(rename_all = "kebab-case")]
pub struct ServeArgs {
    /// Read settings from this TOML file (flags on the command line override it).
    ///
    /// One key per flag, without its dashes: `buffer-size = "1MiB"`, `no-realtime = true`,
    /// `tls-admin-name = ["ops"]`. An unknown key or a bad value is refused with the file and
    /// line, at start and on SIGHUP.
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Print the effective settings as TOML and exit.
    ///
    /// File, flags and defaults together: a file that `--config` reads back.
    #[arg(long)]
    #[serde(skip)]
    pub print_config: bool,
    /// The daemon's directory: logs in DIR/logs/NAME, the socket at DIR/stela.sock.
    #[arg(long, value_name = "DIR")]
    pub dir: PathBuf,
    /// Unix socket to listen on [default: DIR/stela.sock].
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Permission bits of the socket, in octal (660 lets its group connect).
    #[arg(long, value_name = "MODE", default_value = "600", value_parser = parse_octal)]
    #[serde(serialize_with = "octal")]
    pub socket_mode: u32,
    /// Group of the socket (a name or a number), e.g. the database's, with --socket-mode 660.
    #[arg(long, value_name = "GROUP")]
    pub socket_group: Option<String>,
    /// Also listen on TCP at this address.
    ///
    /// Under TLS (--tls-cert, --tls-key) with client authentication (--tls-client-ca,
    /// --token-file, --admin-token-file), or plain with --tcp-insecure on loopback.
    #[arg(long, value_name = "ADDR")]
    pub tcp: Option<SocketAddr>,
    /// Serve Prometheus metrics at http://ADDR/metrics.
    ///
    /// Plain HTTP: bind it to an address only the monitoring can reach. Port 0 picks a free
    /// port, printed at start.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<SocketAddr>,
    /// Serve --tcp without TLS or authentication (refused unless --tcp is loopback).
    #[arg(long, requires = "tcp")]
    pub tcp_insecure: bool,
    /// The daemon's TLS certificate chain (PEM), for --tcp and --repl-listen.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Require TCP clients to present a certificate issued by this CA (PEM): mutual TLS.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
    /// A client certificate naming this (DNS name) is an administrator's (repeatable).
    #[arg(long, value_name = "NAME", requires = "tls_client_ca")]
    pub tls_admin_name: Vec<String>,
    /// Tokens (one per line) that authenticate TCP clients as clients.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Tokens (one per line) that authenticate administrators.
    ///
    /// TCP clients, and with --repl-listen a primary, present one to be an administrator.
    #[arg(long, value_name = "FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// Number of log buffers.
    #[arg(long, value_name = "N", default_value_t = config::BUFFERS)]
    pub buffers: usize,
    /// Size of each buffer; a record's frame must fit in one.
    #[arg(long, value_name = "SIZE", default_value_t = Size(config::BUFFER_BYTES as u64), value_parser = parse_size)]
    pub buffer_size: Size,
    /// A buffer is written once it holds this much.
    ///
    /// Or sooner, when a `disk` commit waits for it.
    #[arg(long, value_name = "SIZE", default_value_t = Size(config::WRITE_THRESHOLD as u64), value_parser = parse_size)]
    pub write_threshold: Size,
    /// Every buffer is written at least this often (a bare number: milliseconds).
    #[arg(long, value_name = "DURATION", default_value_t = Dur(config::FLUSH_INTERVAL), value_parser = parse_ms)]
    pub flush_interval: Dur,
    /// Hold-up time of the power supply after a power-fail notice (a bare number: ms).
    ///
    /// Dirty bytes are capped so that writing them takes at most half of it.
    #[arg(long, value_name = "DURATION", default_value_t = Dur(config::POWER_WINDOW), value_parser = parse_ms)]
    pub power_window: Dur,
    /// Skip the start-up disk measurement and assume this write rate (e.g. 200MB/s).
    #[arg(long, value_name = "RATE", value_parser = parse_rate)]
    pub assume_write_rate: Option<Size>,
    /// Retention: keep about this much of each open log's newest segments.
    ///
    /// Older whole segments are removed. Default: keep all until a client truncates.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub retain_bytes: Option<Size>,
    /// Size of each segment file of the logs the daemon creates.
    #[arg(long, value_name = "SIZE", default_value_t = Size(config::SEGMENT_BYTES), value_parser = parse_size)]
    pub segment_size: Size,
    /// Threads writing and syncing buffers (logs written side by side).
    #[arg(long, value_name = "N", default_value_t = config::FLUSHERS)]
    pub flushers: usize,
    /// Threads for requests that wait for the disk (open, read, truncate, power-fail).
    #[arg(long, value_name = "N", default_value_t = config::WORKERS)]
    pub workers: usize,
    /// Client connections served at once (lowered to what the file limit allows).
    #[arg(long, value_name = "N", default_value_t = config::MAX_CONNECTIONS)]
    pub max_connections: usize,
    /// Administrator connections (`stela status`, power hooks) served beyond the limit.
    #[arg(long, value_name = "N", default_value_t = config::ADMIN_CONNECTIONS)]
    pub admin_connections: usize,
    /// Time a new connection has to say Hello (a bare number: seconds).
    #[arg(long, value_name = "DURATION", default_value_t = Dur(config::HANDSHAKE_TIMEOUT), value_parser = parse_secs)]
    pub handshake_timeout: Dur,
    /// Time a begun frame may take to arrive whole (a bare number: seconds).
    ///
    /// A connection holding part of a frame for longer is closed; so is one whose answers
    /// wait for longer without a byte of them read (its socket's buffer full).
    #[arg(long, value_name = "DURATION", default_value_t = Dur(config::FRAME_TIMEOUT), value_parser = parse_secs)]
    pub frame_timeout: Dur,
    /// Close a connection idle this long; 0: never (a bare number: seconds).
    #[arg(long, value_name = "DURATION", default_value_t = Dur(config::IDLE_TIMEOUT), value_parser = parse_secs)]
    pub idle_timeout: Dur,
    /// Partly received frames held for all connections together.
    #[arg(long, value_name = "SIZE", default_value_t = Size(config::PARTIAL_FRAME_BYTES as u64), value_parser = parse_size)]
    pub partial_frame_bytes: Size,
    /// Unsent answers held for all connections together.
    #[arg(long, value_name = "SIZE", default_value_t = Size(config::OUTPUT_BYTES as u64), value_parser = parse_size)]
    pub output_bytes: Size,
    /// Logs each client credential may create (a Unix uid, a token, a certificate).
    ///
    /// Administrators have no quota. A creation past it is refused (`QuotaExceeded`) and makes
    /// nothing. Default: unlimited.
    #[arg(long, value_name = "N")]
    pub quota_logs: Option<u64>,
    /// Bytes of records each client credential's logs may hold (e.g. 10GiB).
    ///
    /// Charged to the credential that created the log, whoever appends; an append past it is
    /// refused (`QuotaExceeded`) and places nothing. Default: unlimited.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub quota_bytes: Option<Size>,
    /// Data area of each shared-memory ring (a power of two).
    #[arg(long, value_name = "SIZE", default_value_t = Size(config::RING_BYTES as u64), value_parser = parse_size)]
    pub ring_size: Size,
    /// How long the event loop polls after its last event before it sleeps; 0: never.
    ///
    /// A bare number is microseconds (`--spin-us`, the old name, still works).
    #[arg(long = "spin", alias = "spin-us", value_name = "DURATION", default_value_t = Dur(config::SPIN), value_parser = parse_us)]
    #[serde(rename = "spin")]
    pub spin_us: Dur,
    /// Run the event loop with normal scheduling even where realtime is permitted.
    ///
    /// Also the replication threads that acknowledgements pass through.
    #[arg(long)]
    pub no_realtime: bool,
    /// Primary role: ship every open log to the standby at ADDR (its --repl-listen).
    ///
    /// Serves the `replicated` and `all` levels. Off loopback the stream runs over TLS
    /// (--standby-ca), or, inside a private network, --repl-insecure.
    #[arg(long, value_name = "ADDR")]
    pub standby: Option<std::net::SocketAddr>,
    /// Standby role: take a primary's streams at ADDR and mirror its logs into DIR/logs.
    ///
    /// Byte for byte. Off loopback the listener needs TLS (--tls-cert, --tls-key), or, inside
    /// a private network, --repl-insecure.
    #[arg(long, value_name = "ADDR")]
    pub repl_listen: Option<std::net::SocketAddr>,
    /// Allow --standby / --repl-listen off loopback without TLS (private networks only).
    ///
    /// On the standby it also takes plain-TCP streams from primaries that prove nothing.
    /// Without it a plain stream needs a token (--standby-token-file) or a loopback primary
    /// run by this daemon's user.
    #[arg(long)]
    pub repl_insecure: bool,
    /// This node's name in replication messages and logs.
    #[arg(long, value_name = "NAME", default_value = "stela")]
    pub node: String,
    /// With --standby: ship over TLS, checking the standby's certificate against this CA.
    ///
    /// PEM. Needed off loopback (or --repl-insecure).
    #[arg(long, value_name = "FILE")]
    pub standby_ca: Option<PathBuf>,
    /// With --standby-ca: this primary's client certificate (mutual TLS).
    ///
    /// The standby must name it with --tls-admin-name.
    #[arg(long, value_name = "FILE", requires = "standby_key")]
    pub standby_cert: Option<PathBuf>,
    /// The private key of --standby-cert (PEM).
    #[arg(long, value_name = "FILE", requires = "standby_cert")]
    pub standby_key: Option<PathBuf>,
    /// A token file whose first token proves this primary to its standby.
    ///
    /// One of the standby's --admin-token-file tokens; sent over TLS or plain TCP (where it is
    /// needed unless both run as one user on loopback, or the standby has --repl-insecure).
    #[arg(long, value_name = "FILE")]
    pub standby_token_file: Option<PathBuf>,
    /// With --coordinator tcp://: a token file whose first token proves this node to the witness.
    ///
    /// One of the witness's --token-file tokens, sent in the Hello of each connection (plain
    /// TCP). Without it the witness serves this node only on loopback as the witness's own user.
    #[arg(long, value_name = "FILE", requires = "coordinator")]
    pub coordinator_token_file: Option<PathBuf>,
    /// The name the standby's certificate carries [default: its address].
    #[arg(long, value_name = "NAME")]
    pub standby_name: Option<String>,
    /// With --standby: after the standby is unreachable this long, answer `Unprotected`.
    ///
    /// `replicated` commits are then answered with the error `Unprotected` (never Ok: the
    /// record has `buffered`'s promise, `all` `disk`'s), logged, counted and shown in `stela
    /// status`, until it is back. Default: they wait for it. A bare number is milliseconds.
    #[arg(long, value_name = "DURATION", value_parser = parse_ms)]
    pub degrade_after: Option<Dur>,
    /// With --standby: the most of a log the primary keeps for a standby that lacks it.
    ///
    /// Beyond it, truncation passes the standby's hold, logged; the standby, back, begins its
    /// copy again at the oldest segment left. Default: keep everything the standby needs.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub standby_keep_max: Option<Size>,
    /// Automatic failover: the coordinator, tcp://HOST:PORT (a witness) or etcd://HOST:PORT.
    ///
    /// Needs --peer and --repl-listen; the coordinator then says which node is the primary.
    #[arg(long, value_name = "URL", requires_all = ["peer", "repl_listen"])]
    pub coordinator: Option<String>,
    /// With --coordinator: another node's replication address (its --repl-listen).
    ///
    /// This node ships there while it is the primary. Given once per other node: the cluster
    /// has one node more than --peer flags (two or three nodes, docs/REPLICATION.md).
    #[arg(long, value_name = "ADDR", conflicts_with = "standby")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub peer: Vec<std::net::SocketAddr>,
    /// How many standbys must hold a record before a `replicated` commit is acknowledged (K of
    /// the N − 1 standbys); elections then need N − K nodes' promises. Default 1.
    #[arg(long, value_name = "K", default_value_t = config::REPLICAS)]
    pub replicas: usize,
    /// With --coordinator: the pair's name at the coordinator.
    #[arg(long, value_name = "NAME", default_value = "stela")]
    pub cluster: String,
    /// With --coordinator: a preference, never a grant.
    ///
    /// `primary`: when the coordinator names no primary yet, this node asks it for the first
    /// epoch. A node is primary only once the coordinator grants it an epoch; one that cannot
    /// reach it at start is a standby.
    #[arg(long, value_enum, default_value_t = RoleArg::Standby)]
    pub role: RoleArg,
    /// With --coordinator: how often the primary renews and heartbeats its standby.
    ///
    /// A bare number is milliseconds (`--heartbeat-ms`, the old name, still works).
    #[arg(long = "heartbeat", alias = "heartbeat-ms", value_name = "DURATION", default_value_t = Dur(config::HEARTBEAT), value_parser = parse_ms)]
    #[serde(rename = "heartbeat")]
    pub heartbeat_ms: Dur,
    /// With --coordinator: silence after which a standby asks to be promoted.
    ///
    /// The witness's --lease should match. A bare number is milliseconds
    /// (`--suspect-after-ms`, the old name, still works).
    #[arg(long = "suspect-after", alias = "suspect-after-ms", value_name = "DURATION", default_value_t = Dur(config::SUSPECT_AFTER), value_parser = parse_ms)]
    #[serde(rename = "suspect-after")]
    pub suspect_after_ms: Dur,
    /// With --coordinator: a promoted primary's `replicated` answers until its peer rejoins.
    ///
    /// `unprotected`: at once, with the error `Unprotected` (never Ok: the record is on this
    /// node alone; logged, counted and shown in `stela status`); `block`: wait.
    #[arg(long, value_enum, default_value_t = AfterFailoverArg::Unprotected)]
    pub after_failover: AfterFailoverArg,
}

/// `--role`.
#[derive(
    clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum RoleArg {
    Primary,
    Standby,
}

/// `--after-failover`.
#[derive(
    clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum AfterFailoverArg {
    Unprotected,
    Block,
}

fn octal<S: serde::Serializer>(mode: &u32, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&format!("{mode:o}"))
}

/// The flags a `--config` file stands for, to be placed before the command line's own (which
/// then override them): `key = value` becomes `--key value`, `key = true` `--key`, an array
/// one `--key value` per element.
///
/// Every key is checked against `serve`, `stela serve` as clap sees it (its flags and their
/// parsers: the command line's own `serve` subcommand, built), and every value against its
/// flag's parser, before anything runs: a misspelt key or a bad value is refused naming the
/// file and line (`stela.toml:3: unknown setting `bufers``), at start and on SIGHUP alike.
///
/// # Errors
/// An unreadable file, TOML that is not a table of settings, an unknown key, a bad value.
pub fn config_file_flags(
    path: &std::path::Path,
    serve: &clap::Command,
) -> anyhow::Result<Vec<std::ffi::OsString>> {
    use toml::Spanned;
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the config file {}", path.display()))?;
    let table: std::collections::BTreeMap<Spanned<String>, Spanned<toml::Value>> =
        toml::from_str(&text)
            .with_context(|| format!("{}: not a TOML table of settings", path.display()))?;
    let mut flags = Vec::new();
    for (key, value) in &table {
        let line = text[..key.span().start].matches('\n').count() + 1;
        let at = format!("{}:{line}", path.display());
        let arg = setting_arg(serve, key.get_ref())
            .with_context(|| format!("{at}: {}", unknown_setting(serve, key.get_ref())))?;
        let flag = format!("--{}", arg.get_long().unwrap_or(key.get_ref()));
        let takes_value = arg.get_action().takes_values();
        let items: Vec<&toml::Value> = match value.get_ref() {
            toml::Value::Array(items) => items.iter().collect(),
            one => vec![one],
        };
        for item in items {
            let text_value = match item {
                toml::Value::Boolean(on) if !takes_value => {
                    if *on {
                        flags.push(flag.clone().into());
                    }
                    continue;
                }
                toml::Value::String(s) if takes_value => s.clone(),
                toml::Value::Integer(i) if takes_value => i.to_string(),
                toml::Value::Float(f) if takes_value => f.to_string(),
                other => anyhow::bail!(
                    "{at}: `{}` takes {} (found: {})",
                    key.get_ref(),
                    if takes_value {
                        "a string or a number"
                    } else {
                        "true or false"
                    },
                    other.type_str()
                ),
            };
            check_value(arg, &text_value).map_err(|e| {
                // clap says "error: invalid value 'x' for '<id>': why"; the key and the
                // line say which setting, so only the why is kept.
                let said = e.to_string();
                let first = said.lines().next().unwrap_or_default();
                let why = first.split_once("': ").map_or(first, |(_, why)| why);
                anyhow::anyhow!("{at}: `{}` = {text_value:?}: {why}", key.get_ref())
            })?;
            flags.push(flag.clone().into());
            flags.push(text_value.into());
        }
    }
    Ok(flags)
}

/// Runs `arg`'s own parser on a value, alone (its ties to other flags are checked when the
/// whole command line is parsed).
fn check_value(arg: &clap::Arg, value: &str) -> Result<(), clap::Error> {
    let alone = clap::Arg::new(arg.get_id().clone())
        .action(arg.get_action().clone())
        .value_parser(arg.get_value_parser().clone());
    clap::Command::new("stela-serve-config")
        .no_binary_name(true)
        .disable_help_flag(true)
        .arg(alone)
        .try_get_matches_from([value])
        .map(drop)
}

/// The flag a config key sets: its long name or an alias; never `config` or `print-config`.
fn setting_arg<'a>(serve: &'a clap::Command, key: &str) -> Option<&'a clap::Arg> {
    if matches!(key, "config" | "print-config" | "help") {
        return None;
    }
    serve.get_arguments().find(|arg| {
        arg.get_long() == Some(key)
            || arg
                .get_all_aliases()
                .is_some_and(|aliases| aliases.contains(&key))
    })
}

/// Why a key is not a setting, with the nearest one when it looks like a misspelling.
fn unknown_setting(serve: &clap::Command, key: &str) -> String {
    if matches!(key, "config" | "print-config") {
        return format!("`{key}` cannot be set in a config file");
    }
    let nearest = serve
        .get_arguments()
        .filter_map(clap::Arg::get_long)
        .filter(|long| !matches!(*long, "config" | "print-config" | "help"))
        .min_by_key(|long| edit_distance(key, long));
    match nearest {
        Some(long) if edit_distance(key, long) <= 2 => {
            format!("unknown setting `{key}` (did you mean `{long}`?)")
        }
        _ => format!("unknown setting `{key}` (`stela serve --help` lists them)"),
    }
}

/// Levenshtein distance, for "did you mean".
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (row[j + 1] + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

impl ServeArgs {
    /// These settings as a TOML config file.
    pub fn to_toml(&self) -> anyhow::Result<String> {
        Ok(toml::to_string(self)?)
    }

    /// The daemon's configuration from these flags.
    pub fn config(&self) -> DaemonConfig {
        let mut config = DaemonConfig::new(&self.dir);
        config.socket = self.socket.clone();
        config.socket_mode = self.socket_mode;
        config.socket_group = self.socket_group.clone();
        config.tcp = self.tcp;
        config.metrics = self.metrics;
        config.retain_bytes = self.retain_bytes.map(Size::get);
        config.tcp_insecure = self.tcp_insecure;
        config.tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(stela_server::ServerTlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: self.tls_client_ca.clone(),
            }),
            _ => None,
        };
        config.tls_admin_names = self.tls_admin_name.clone();
        config.token_file = self.token_file.clone();
        config.admin_token_file = self.admin_token_file.clone();
        config.buffers = self.buffers;
        config.buffer_bytes = self.buffer_size.as_usize();
        config.write_threshold = self.write_threshold.as_usize();
        config.flush_interval = self.flush_interval.get().max(Duration::from_millis(1));
        config.power_window = self.power_window.get().max(Duration::from_millis(1));
        config.assume_write_rate = self.assume_write_rate.map(Size::get);
        config.segment_bytes = self.segment_size.get();
        config.flushers = self.flushers;
        config.workers = self.workers;
        config.max_connections = self.max_connections;
        config.admin_connections = self.admin_connections;
        config.handshake_timeout = self.handshake_timeout.get().max(Duration::from_millis(1));
        config.frame_timeout = self.frame_timeout.get().max(Duration::from_millis(1));
        config.idle_timeout = self.idle_timeout.get();
        config.partial_frame_bytes = self.partial_frame_bytes.as_usize();
        config.output_bytes = self.output_bytes.as_usize();
        config.quota = stela_server::quota::Limits {
            logs: self.quota_logs,
            bytes: self.quota_bytes.map(Size::get),
        };
        config.ring_bytes = self.ring_size.as_usize();
        config.spin = self.spin_us.get();
        config.realtime_loop = !self.no_realtime;
        config.standby = self.standby.or(self.peer.first().copied());
        config.more_standbys = self.peer.iter().skip(1).copied().collect();
        config.replicas = self.replicas;
        config.repl_listen = self.repl_listen;
        config.failover = self
            .coordinator
            .clone()
            .map(|coordinator| config::FailoverConfig {
                coordinator,
                cluster: self.cluster.clone(),
                initial_role: match self.role {
                    RoleArg::Primary => config::NodeRole::Primary,
                    RoleArg::Standby => config::NodeRole::Standby,
                },
                heartbeat: self.heartbeat_ms.get().max(Duration::from_millis(1)),
                suspect_after: self.suspect_after_ms.get().max(Duration::from_millis(1)),
                after_failover: match self.after_failover {
                    AfterFailoverArg::Unprotected => config::AfterFailover::Unprotected,
                    AfterFailoverArg::Block => config::AfterFailover::Block,
                },
            });
        config.repl_insecure = self.repl_insecure;
        config.node = self.node.clone();
        config.degrade_after = self.degrade_after.map(Dur::get);
        config.standby_keep_max = self.standby_keep_max.map(Size::get);
        config.standby_tls = self
            .standby_ca
            .clone()
            .map(|ca| stela_server::ClientTlsFiles {
                ca,
                identity: self.standby_cert.clone().zip(self.standby_key.clone()),
            });
        config.standby_token_file = self.standby_token_file.clone();
        config.coordinator_token_file = self.coordinator_token_file.clone();
        config.standby_name = self.standby_name.clone();
        config
    }
}

fn parse_octal(text: &str) -> Result<u32, NotAnOctalMode> {
    u32::from_str_radix(text.trim_start_matches("0o"), 8).map_err(NotAnOctalMode)
}

/// `--socket-mode`'s value is not an octal mode.
#[derive(Debug, thiserror::Error)]
#[error("not an octal mode: {0}")]
pub struct NotAnOctalMode(std::num::ParseIntError);
