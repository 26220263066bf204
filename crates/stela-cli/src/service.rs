//! The daemon's commands: `stela serve`, and the tools that talk to a running daemon
//! (`stela status`, `stela power-fail`, `stela power-restore`).
//!
//! Which socket a tool talks to: `--socket PATH`, else `--dir DIR` (its `DIR/stela.sock`), else
//! `$STELA_SOCKET`, else `/run/stela/stela.sock` (where the shipped systemd unit puts it). With
//! `--tcp HOST:PORT` a tool talks TLS to a TCP daemon instead (`--tls-ca`, and `--token-file` or
//! `--tls-cert`/`--tls-key` to authenticate; docs/DAEMON.md, "Security").

use anyhow::Context;
use clap::Args;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use stela_client::{Address, Connection};
use stela_proto::{RequestBody, ResponseBody, StatusReport};
use stela_server::{config, DaemonConfig, Server};

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
    /// A connection holding part of a frame for longer is closed.
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
/// Every key is checked against `stela serve`'s flags, and every value against its flag's
/// parser, before anything runs: a misspelt key or a bad value is refused naming the file and
/// line (`stela.toml:3: unknown setting `bufers``), at start and on SIGHUP alike.
///
/// # Errors
/// An unreadable file, TOML that is not a table of settings, an unknown key, a bad value.
pub fn config_file_flags(path: &std::path::Path) -> anyhow::Result<Vec<std::ffi::OsString>> {
    use toml::Spanned;
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the config file {}", path.display()))?;
    let table: std::collections::BTreeMap<Spanned<String>, Spanned<toml::Value>> =
        toml::from_str(&text)
            .with_context(|| format!("{}: not a TOML table of settings", path.display()))?;
    let serve = serve_command();
    let mut flags = Vec::new();
    for (key, value) in &table {
        let line = text[..key.span().start].matches('\n').count() + 1;
        let at = format!("{}:{line}", path.display());
        let arg = setting_arg(&serve, key.get_ref())
            .with_context(|| format!("{at}: {}", unknown_setting(&serve, key.get_ref())))?;
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

/// `stela serve` as clap sees it: the flags a config file may set, and their parsers.
fn serve_command() -> clap::Command {
    use clap::CommandFactory;
    let mut cli = crate::Cli::command();
    cli.build();
    cli.find_subcommand("serve")
        .cloned()
        .expect("`stela serve` is a subcommand")
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
        config.standby_name = self.standby_name.clone();
        config
    }
}

/// Which daemon a tool talks to.
#[derive(Args, Debug, Clone)]
pub struct TargetArgs {
    /// The daemon's Unix socket.
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// The daemon's directory (its socket is DIR/stela.sock).
    #[arg(long, conflicts_with = "socket")]
    pub dir: Option<PathBuf>,
    /// A daemon's TCP address, HOST:PORT, spoken to over TLS.
    ///
    /// Also tls://HOST:PORT. With --tcp-insecure, plain TCP to a loopback daemon.
    #[arg(long, value_name = "ADDR", conflicts_with_all = ["socket", "dir"])]
    pub tcp: Option<String>,
    /// Speak plain TCP to a --tcp-insecure daemon (no TLS, no authentication)
    #[arg(long, requires = "tcp", conflicts_with_all = ["tls_ca", "token_file", "tls_cert"])]
    pub tcp_insecure: bool,
    /// The CA the daemon's certificate chains to (PEM); needed with --tcp.
    #[arg(long, value_name = "FILE", requires = "tcp")]
    pub tls_ca: Option<PathBuf>,
    /// A client certificate (PEM) for a daemon with --tls-client-ca.
    #[arg(long, value_name = "FILE", requires_all = ["tcp", "tls_key"])]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// A file whose (first) token is sent to authenticate.
    #[arg(long, value_name = "FILE", requires = "tcp")]
    pub token_file: Option<PathBuf>,
    /// The name the daemon's certificate carries [default: the host of --tcp]
    #[arg(long, value_name = "NAME", requires = "tls_ca")]
    pub tls_server_name: Option<String>,
}

impl TargetArgs {
    pub fn address(&self) -> anyhow::Result<Address> {
        if let Some(tcp) = &self.tcp {
            return self.tcp_address(tcp);
        }
        if let Some(socket) = &self.socket {
            return Ok(Address::Unix(socket.clone()));
        }
        if let Some(dir) = &self.dir {
            return Ok(Address::Unix(dir.join("stela.sock")));
        }
        Ok(match std::env::var_os("STELA_SOCKET") {
            Some(path) => Address::Unix(path.into()),
            None => Address::Unix("/run/stela/stela.sock".into()),
        })
    }

    fn tcp_address(&self, tcp: &str) -> anyhow::Result<Address> {
        if self.tcp_insecure {
            use std::net::ToSocketAddrs;
            let bare = tcp.strip_prefix("tcp://").unwrap_or(tcp);
            let addr = bare
                .to_socket_addrs()
                .with_context(|| format!("--tcp {tcp}"))?
                .next()
                .with_context(|| format!("--tcp {tcp}: no address"))?;
            return Ok(Address::Tcp(addr));
        }
        let Some(ca) = &self.tls_ca else {
            anyhow::bail!(
                "--tcp {tcp} needs --tls-ca FILE (the CA of the daemon's certificate), or \
                 --tcp-insecure for a daemon serving plain TCP on loopback"
            );
        };
        let mut target = stela_client::TlsTarget::new(tcp, ca)?;
        if let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) {
            target = target.client_cert(cert, key);
        }
        if let Some(file) = &self.token_file {
            target = target.token_file(file);
        }
        if let Some(name) = &self.tls_server_name {
            target = target.server_name(name);
        }
        Ok(Address::Tls(Box::new(target)))
    }
}

fn parse_octal(text: &str) -> Result<u32, String> {
    u32::from_str_radix(text.trim_start_matches("0o"), 8)
        .map_err(|e| format!("not an octal mode: {e}"))
}

pub fn serve(
    args: ServeArgs,
    reload: Option<stela_server::server::ReloadHook>,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    if args.print_config {
        write!(out, "{}", args.to_toml()?)?;
        return Ok(());
    }
    let mut config = args.config();
    config.handle_signals = true;
    let server = Server::start(config).context("starting the daemon")?;
    if let Some(reload) = reload {
        server.on_reload(reload);
    }
    let status = server.status();
    writeln!(
        out,
        "stela serve: listening on {}",
        server.socket_path().display()
    )?;
    if let Some(addr) = server.tcp_addr() {
        writeln!(out, "stela serve: listening on tcp://{addr}")?;
    }
    if let Some(addr) = server.metrics_addr() {
        writeln!(out, "stela serve: metrics on http://{addr}/metrics")?;
    }
    // systemd's Type=notify: ready once the socket listens (a no-op without $NOTIFY_SOCKET).
    notify_systemd(&format!("READY=1\nMAINPID={}", std::process::id()));
    if let Some(interval) = watchdog_interval() {
        start_watchdog(server.socket_path().to_owned(), interval);
    }
    writeln!(out, "stela serve: {}", status.dirty_cap.derivation)?;
    writeln!(
        out,
        "stela serve: pid {}; SIGPWR flushes for a power failure, SIGTERM flushes and exits",
        status.pid
    )?;
    out.flush()?;
    let stepped_down = server.stepped_down();
    let stopped = server.run_until_stopped();
    notify_systemd("STOPPING=1");
    stopped.map_err(|failures| anyhow::anyhow!("stopped with failures: {failures}"))?;
    if let Some(why) = stepped_down.get() {
        writeln!(
            out,
            "stela serve: stepped down ({why}); every buffer written and synced; start again to rejoin as the standby"
        )?;
        out.flush()?;
        // EX_TEMPFAIL: a supervisor restarts it, and it comes back as the standby.
        std::process::exit(75);
    }
    writeln!(out, "stela serve: every buffer written and synced; stopped")?;
    Ok(())
}

fn connect(target: &TargetArgs) -> anyhow::Result<Connection> {
    let address = target.address()?;
    Connection::connect_admin(&address)
        .with_context(|| format!("is `stela serve` running at {address}?"))
}

/// systemd's `WatchdogSec=`: how often to ping (a third of `$WATCHDOG_USEC`), if the
/// watchdog is on for this process (`$WATCHDOG_PID`, when set, names it).
fn watchdog_interval() -> Option<Duration> {
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    if let Ok(pid) = std::env::var("WATCHDOG_PID") {
        if pid.parse::<u32>().ok() != Some(std::process::id()) {
            return None;
        }
    }
    (usec > 0).then(|| Duration::from_micros(usec / 3))
}

/// Pings systemd's watchdog (`WATCHDOG=1`) each `interval`, but only after the daemon's event
/// loop has answered a status request on its own socket: a loop that hangs stops the pings,
/// and systemd restarts the daemon. A process merely alive is not enough.
fn start_watchdog(socket: PathBuf, interval: Duration) {
    let spawned = std::thread::Builder::new()
        .name("stela-watchdog".into())
        .spawn(move || loop {
            let answered = Connection::connect_admin(&Address::Unix(socket.clone()))
                .and_then(|mut connection| connection.request(RequestBody::Status));
            match answered {
                Ok(ResponseBody::Status(_)) => notify_systemd("WATCHDOG=1"),
                Ok(other) => tracing::warn!(?other, "watchdog: unexpected answer; no ping"),
                Err(error) => {
                    tracing::warn!(%error, "watchdog: the daemon did not answer; no ping")
                }
            }
            std::thread::sleep(interval);
        });
    if let Err(error) = spawned {
        tracing::warn!(%error, "could not start the watchdog thread");
    }
}

/// Tells systemd (`Type=notify`) about the daemon's state: `state` is sent as one datagram to
/// `$NOTIFY_SOCKET` (a path, or `@name` in the abstract namespace). Without the variable, or if
/// sending fails, nothing happens but a warning: readiness is a courtesy to the supervisor.
fn notify_systemd(state: &str) {
    let Some(target) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let sent = (|| -> std::io::Result<()> {
        let socket = std::os::unix::net::UnixDatagram::unbound()?;
        let target = target.to_string_lossy();
        if let Some(name) = target.strip_prefix('@') {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
            socket.send_to_addr(state.as_bytes(), &addr)?;
        } else {
            socket.send_to(state.as_bytes(), target.as_ref())?;
        }
        Ok(())
    })();
    if let Err(error) = sent {
        tracing::warn!(%error, "could not notify systemd");
    }
}

/// The exit code of `stela status` when the daemon answers but is not healthy: power is
/// failing (writes refused), or a log has stopped or waits for disk space.
pub const EXIT_UNHEALTHY: u8 = crate::exit::UNHEALTHY;

/// Prints a running daemon's status; returns its problems (empty when healthy), so that
/// `stela status` can serve as a health check.
pub fn status(target: TargetArgs, json: bool, out: &mut dyn Write) -> anyhow::Result<Vec<String>> {
    let answer = connect(&target)?.request(RequestBody::Status)?;
    let ResponseBody::Status(report) = answer else {
        anyhow::bail!("unexpected answer to Status: {answer:?}");
    };
    let mut problems = health_problems(&report);
    problems.extend(standby_unreachable(&report));
    if json {
        let mut value = status_json(&report);
        value["healthy"] = serde_json::json!(problems.is_empty());
        value["problems"] = serde_json::json!(problems);
        writeln!(out, "{}", serde_json::to_string_pretty(&value)?)?;
    } else {
        print_status(&report, out)?;
        match problems.as_slice() {
            [] => writeln!(out, "health: ok")?,
            _ => writeln!(out, "health: UNHEALTHY: {}", problems.join("; "))?,
        }
    }
    Ok(problems)
}

/// A primary with no log open ships nothing, so no log says whether its standby is there: a
/// TCP connection to the standby's replication address (closed at once) does. A standby that
/// does not exist would otherwise show only at the first `replicated` commit, which waits.
pub(crate) fn standby_unreachable(report: &StatusReport) -> Option<String> {
    let replication = report.replication.as_ref()?;
    if replication.role != "primary" || !replication.logs.is_empty() {
        return None;
    }
    let addr: SocketAddr = replication.peer.parse().ok()?;
    match std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
        Ok(_) => None,
        Err(error) => Some(format!(
            "the standby at {addr} does not answer ({error}); no log is open, so nothing ships \
             yet, and replicated commits will wait for it"
        )),
    }
}

/// What `stela status --json` prints when it gets no report: the verdict a monitor reads, and
/// why. `reachable` is false when no daemon answers at the address (exit 6).
pub fn status_failure_json(error: &anyhow::Error) -> serde_json::Value {
    let code = crate::exit::code_number(error);
    serde_json::json!({
        "healthy": false,
        "reachable": code != crate::exit::DAEMON_UNREACHABLE,
        "problems": [crate::exit::render(error)],
        "exit_code": code,
    })
}

/// Records `--degrade-after` acknowledged without the standby that it does not hold yet: they
/// are on this node alone.
fn degraded_not_on_standby(log: &stela_proto::ReplicaStatus) -> bool {
    log.degraded_through > log.received_lsn
}

/// What keeps the daemon from taking writes: a power-fail notice in force, a stopped log, a
/// log waiting for space. (Shutting down is not a problem of health: the daemon is leaving.)
pub(crate) fn health_problems(report: &StatusReport) -> Vec<String> {
    let mut problems = Vec::new();
    if report.power != "normal" && !report.power.starts_with("shutting down") {
        problems.push(format!("power {}", report.power));
    }
    for log in &report.logs {
        if let Some(failure) = &log.failure {
            problems.push(format!("log {} stopped: {failure}", log.name));
        }
        if let Some(reason) = &log.waiting_for_space {
            problems.push(format!("log {} waits for disk space: {reason}", log.name));
        }
    }
    if let Some(replication) = &report.replication {
        if replication.role == "stepped down" {
            problems.push("this node stepped down: a newer primary exists".to_owned());
        }
        if replication
            .coordinator
            .as_ref()
            .is_some_and(|c| !c.reachable)
        {
            problems.push(
                "the failover coordinator is unreachable: failover is unavailable".to_owned(),
            );
        }
        if replication.unprotected_since_ms > 0 {
            problems.push(
                "unprotected: records acknowledged at replicated since the failover are on this node alone until a rejoined standby holds them"
                    .to_owned(),
            );
        }
    }
    // The first standby's streams are `logs` (below); the others' are listed here.
    for standby in report
        .replication
        .iter()
        .flat_map(|r| r.standbys.iter().skip(1))
    {
        if !standby.connected {
            problems.push(format!("standby {} is not connected", standby.peer));
        } else if standby.stalled {
            problems.push(format!(
                "standby {} has acknowledged nothing past the link's deadline",
                standby.peer
            ));
        }
    }
    for log in report.replication.iter().flat_map(|r| &r.logs) {
        if let Some(why) = &log.stopped {
            problems.push(format!(
                "log {} stopped shipping to the standby: {why}",
                log.log
            ));
        } else if !log.connected {
            problems.push(format!(
                "log {}: the standby is not connected (replicated commits wait)",
                log.log
            ));
        } else if log.stalled {
            problems.push(format!(
                "log {}: the standby has acknowledged nothing for {} ms, past the link's deadline                  (a black-holed or one-way link, or a stopped standby): the stream is being opened                  again; replicated commits wait",
                log.log, log.last_ack_ms
            ));
        } else if degraded_not_on_standby(log) {
            problems.push(format!(
                "log {}: records acknowledged without the standby (--degrade-after, through LSN {}) \
                 are on this node alone until it holds them (it holds {})",
                log.log, log.degraded_through, log.received_lsn
            ));
        }
    }
    problems
}

/// `[#####...............]  25 %`: how full the dirty-byte cap is, in plain text.
fn fill_bar(used: u64, cap: u64) -> String {
    const WIDTH: u64 = 20;
    let filled = if cap == 0 {
        WIDTH
    } else {
        (used.min(cap) * WIDTH).div_ceil(cap)
    };
    let percent = (used * 100).checked_div(cap).unwrap_or(100);
    format!(
        "[{}{}] {percent:>3} %",
        "#".repeat(filled as usize),
        ".".repeat((WIDTH - filled) as usize)
    )
}

pub fn power_fail(target: TargetArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let answer = connect(&target)?.request(RequestBody::PowerFail)?;
    let ResponseBody::PowerFailed(flush) = answer else {
        anyhow::bail!("unexpected answer to PowerFail: {answer:?}");
    };
    writeln!(
        out,
        "power-fail: wrote and synced {} bytes in {:.3} ms (budget {:.1} ms); writes refused until power-restore",
        flush.bytes,
        flush.micros as f64 / 1e3,
        flush.budget_micros as f64 / 1e3
    )?;
    for failure in &flush.failures {
        writeln!(out, "power-fail: NOT FLUSHED: {failure}")?;
    }
    if !flush.failures.is_empty() {
        anyhow::bail!("{} log(s) could not be flushed", flush.failures.len());
    }
    Ok(())
}

pub fn power_restore(target: TargetArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    match connect(&target)?.request(RequestBody::PowerRestore)? {
        ResponseBody::PowerRestored => {
            writeln!(out, "power-restore: writes admitted again")?;
            Ok(())
        }
        other => anyhow::bail!("unexpected answer to PowerRestore: {other:?}"),
    }
}

fn print_status(report: &StatusReport, out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(
        out,
        "{} (pid {}), dir {}, up {:.1} s, {} thread(s), event loop {}, {}",
        report.server,
        report.pid,
        report.dir,
        report.uptime_ms as f64 / 1e3,
        report.threads,
        if report.realtime_loop {
            "realtime (SCHED_FIFO 1)"
        } else {
            "normal scheduling"
        },
        if report.loop_spins {
            "spinning after work"
        } else {
            "sleeping after work"
        }
    )?;
    writeln!(
        out,
        "connections: {} of at most {} (file limit {}), {} with a shared-memory ring, {} refused since start",
        report.connections,
        report.max_connections,
        report.file_limit,
        report.rings,
        report.refused_connections
    )?;
    writeln!(
        out,
        "partly received frames: {} B of a cap of {} B",
        report.partial_frame_bytes, report.partial_frame_cap
    )?;
    writeln!(
        out,
        "answers not yet sent: {} B of a cap of {} B",
        report.output_bytes, report.output_cap
    )?;
    writeln!(out, "power: {}", report.power)?;
    writeln!(
        out,
        "buffers: {} x {} B, {} free; flush interval {} ms",
        report.buffers, report.buffer_bytes, report.free_buffers, report.flush_interval_ms
    )?;
    writeln!(
        out,
        "dirty: {} {} B of a cap of {} B",
        fill_bar(report.dirty_bytes, report.dirty_cap.bytes),
        report.dirty_bytes,
        report.dirty_cap.bytes
    )?;
    writeln!(out, "  {}", report.dirty_cap.derivation)?;
    if report.live_dirty_cap.bytes > 0 {
        writeln!(
            out,
            "  live cap now {} ({} changes since start)",
            report.live_dirty_cap.reason, report.live_dirty_cap.changes
        )?;
    }
    writeln!(
        out,
        "appends that waited for space: {}; bytes written: {}",
        report.appends_waited, report.bytes_written
    )?;
    if let Some(flush) = &report.last_emergency_flush {
        writeln!(
            out,
            "last emergency flush: {} B in {:.3} ms (budget {:.1} ms){}",
            flush.bytes,
            flush.micros as f64 / 1e3,
            flush.budget_micros as f64 / 1e3,
            if flush.failures.is_empty() {
                String::new()
            } else {
                format!("; FAILED: {}", flush.failures.join("; "))
            }
        )?;
    }
    writeln!(out, "logs:")?;
    for log in &report.logs {
        let p = log.positions;
        writeln!(
            out,
            "  {:<20} {:<8} LSN {}..={}, durable {}, dirty {} B{}",
            log.name,
            log.codec,
            p.first_lsn,
            p.last_lsn,
            p.durable_lsn,
            log.dirty_bytes,
            match (&log.failure, &log.waiting_for_space) {
                (Some(failure), _) => format!(", STOPPED: {failure}"),
                (None, Some(reason)) =>
                    format!(", WAITING FOR SPACE (retried each second): {reason}"),
                (None, None) => String::new(),
            }
        )?;
    }
    if let Some(replication) = &report.replication {
        writeln!(
            out,
            "replication: {} ({} {})",
            replication.role.to_uppercase(),
            if replication.role == "primary" {
                "shipping to"
            } else {
                "taking streams on"
            },
            replication.peer
        )?;
        if let Some(coordinator) = &replication.coordinator {
            writeln!(
                out,
                "  epoch {}; coordinator {}: {}, names {} the primary of epoch {}",
                replication.epoch,
                coordinator.describe,
                if coordinator.reachable {
                    format!("reachable (answered {} ms ago)", coordinator.last_answer_ms)
                } else {
                    "UNREACHABLE: the pair runs on, but failover is unavailable".to_owned()
                },
                coordinator.holder.as_deref().unwrap_or("nobody"),
                coordinator.epoch
            )?;
        }
        if replication.standbys.len() > 1 {
            writeln!(
                out,
                "  {} standbys; replicated waits for {} of them",
                replication.standbys.len(),
                replication.replicas
            )?;
            for standby in &replication.standbys {
                let acked: Vec<String> = standby
                    .logs
                    .iter()
                    .map(|l| format!("{} up to LSN {}", l.log, l.received_lsn))
                    .collect();
                writeln!(
                    out,
                    "  standby {}: {}{}; holds {}",
                    standby.peer,
                    if standby.connected {
                        "connected"
                    } else {
                        "NOT CONNECTED"
                    },
                    if standby.stalled { ", STALLED" } else { "" },
                    if acked.is_empty() {
                        "nothing yet".to_owned()
                    } else {
                        acked.join(", ")
                    }
                )?;
            }
        }
        if let Some(failover) = &replication.last_failover {
            writeln!(
                out,
                "  last failover: promoted to epoch {} at {} (unix ms), {} ms from the primary's last message to serving: {}",
                failover.epoch, failover.at_unix_ms, failover.took_ms, failover.reason
            )?;
        }
        if replication.unprotected_since_ms > 0 {
            writeln!(
                out,
                "  UNPROTECTED since {} (unix ms): while no standby is connected, replicated commits are answered Unprotected (appended, never Ok); they are on this node alone until a rejoined standby has caught up to them",
                replication.unprotected_since_ms
            )?;
        }
        for log in &replication.logs {
            writeln!(
                out,
                "  {:<20} term {}, {}, standby holds up to LSN {} (durable {}){}{}",
                log.log,
                log.term,
                if log.stalled {
                    "STALLED (no acknowledgement within the link's deadline)"
                } else if log.connected {
                    "connected"
                } else {
                    "NOT CONNECTED"
                },
                log.received_lsn,
                log.durable_lsn,
                if log.lag_records > 0 {
                    format!(
                        ", behind by {} record(s), {} byte(s), for {} ms",
                        log.lag_records, log.lag_bytes, log.lag_ms
                    )
                } else {
                    String::new()
                },
                match &log.stopped {
                    Some(why) => format!(", STOPPED: {why}"),
                    None => String::new(),
                }
            )?;
            if log.shipped_bytes > 0 {
                writeln!(
                    out,
                    "  {:<20} shipped {} B of log as {} B on the wire (lz4 where it pays)",
                    "", log.shipped_bytes, log.wire_bytes
                )?;
            }
            if log.degraded || log.degraded_acks > 0 {
                writeln!(
                    out,
                    "  {:<20} {}{} replicated commit(s) answered Unprotected without the standby since start, the last at LSN {}{}",
                    "",
                    if log.degraded {
                        "DEGRADED (--degrade-after): replicated commits answered Unprotected (as buffered, never Ok) now; "
                    } else {
                        ""
                    },
                    log.degraded_acks,
                    log.degraded_through,
                    if degraded_not_on_standby(log) {
                        " (not on the standby yet)"
                    } else {
                        ""
                    }
                )?;
            }
        }
    }
    writeln!(out, "what an acknowledgement survives:")?;
    for line in &report.crash_semantics {
        writeln!(out, "  - {line}")?;
    }
    Ok(())
}

fn status_json(report: &StatusReport) -> serde_json::Value {
    serde_json::json!({
        "server": report.server, "pid": report.pid, "dir": report.dir, "uptime_ms": report.uptime_ms,
        "connections": report.connections, "max_connections": report.max_connections,
        "file_limit": report.file_limit, "rings": report.rings,
        "refused_connections": report.refused_connections, "threads": report.threads,
        "realtime_loop": report.realtime_loop, "loop_spins": report.loop_spins,
        "partial_frame_bytes": report.partial_frame_bytes, "partial_frame_cap": report.partial_frame_cap,
        "output_bytes": report.output_bytes, "output_cap": report.output_cap,
        "power": report.power,
        "buffers": report.buffers, "buffer_bytes": report.buffer_bytes, "free_buffers": report.free_buffers,
        "flush_interval_ms": report.flush_interval_ms,
        "dirty_bytes": report.dirty_bytes,
        "dirty_cap": {
            "bytes": report.dirty_cap.bytes, "power_window_ms": report.dirty_cap.power_window_ms,
            "measured_write_bytes_per_s": report.dirty_cap.measured_write_bytes_per_s,
            "window_bytes": report.dirty_cap.window_bytes, "pool_bytes": report.dirty_cap.pool_bytes,
            "derivation": report.dirty_cap.derivation,
        },
        "live_dirty_cap": {
            "bytes": report.live_dirty_cap.bytes, "reason": report.live_dirty_cap.reason,
            "changes": report.live_dirty_cap.changes,
        },
        "appends_waited": report.appends_waited, "bytes_written": report.bytes_written,
        "last_emergency_flush": report.last_emergency_flush.as_ref().map(|f| serde_json::json!({
            "bytes": f.bytes, "micros": f.micros, "budget_micros": f.budget_micros,
            "at_unix_ms": f.at_unix_ms, "failures": f.failures,
        })),
        "logs": report.logs.iter().map(|l| serde_json::json!({
            "name": l.name, "codec": l.codec, "first_lsn": l.positions.first_lsn,
            "last_lsn": l.positions.last_lsn, "durable_lsn": l.positions.durable_lsn,
            "dirty_bytes": l.dirty_bytes, "failure": l.failure, "waiting_for_space": l.waiting_for_space,
        })).collect::<Vec<_>>(),
        "crash_semantics": report.crash_semantics,
        // Every field of the replication section, by its name in the protocol.
        "replication": report.replication.as_ref().and_then(|r| serde_json::to_value(r).ok()),
    })
}

#[cfg(test)]
mod health_tests {
    use super::*;
    use stela_proto::LogStatus;

    fn report(power: &str, logs: Vec<LogStatus>) -> StatusReport {
        StatusReport {
            power: power.to_owned(),
            logs,
            ..StatusReport::default()
        }
    }

    fn log(name: &str, failure: Option<&str>, waiting: Option<&str>) -> LogStatus {
        LogStatus {
            name: name.to_owned(),
            failure: failure.map(str::to_owned),
            waiting_for_space: waiting.map(str::to_owned),
            ..LogStatus::default()
        }
    }

    #[test]
    fn health_names_every_problem_and_nothing_else() {
        assert!(health_problems(&report("normal", vec![log("a", None, None)])).is_empty());
        assert!(health_problems(&report("shutting down", vec![])).is_empty());
        let problems = health_problems(&report(
            "failed: writes refused until power-restore",
            vec![
                log("a", Some("fdatasync failed"), None),
                log("b", None, Some("no space for the next segment")),
                log("c", None, None),
            ],
        ));
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems[0].starts_with("power failed"), "{problems:?}");
        assert!(problems[1].contains("log a stopped"), "{problems:?}");
        assert!(
            problems[2].contains("log b waits for disk space"),
            "{problems:?}"
        );
    }

    /// A standby back after a `--degrade-after` spell: healthy only once it holds what was
    /// acknowledged without it.
    #[test]
    fn records_acknowledged_without_the_standby_are_a_problem_until_it_holds_them() {
        let with_standby_at = |received_lsn: u64| {
            let mut report = report("normal", vec![]);
            report.replication = Some(stela_proto::ReplicationStatus {
                role: "primary".into(),
                peer: "127.0.0.1:7000".into(),
                logs: vec![stela_proto::ReplicaStatus {
                    log: "orders".into(),
                    connected: true,
                    term: 1,
                    received_lsn,
                    durable_lsn: received_lsn,
                    lag_records: 0,
                    lag_ms: 0,
                    lag_bytes: 0,
                    stopped: None,
                    shipped_bytes: 0,
                    wire_bytes: 0,
                    degraded: false,
                    degraded_acks: 40,
                    degraded_through: 120,
                    unprotected_acks: 0,
                    stalled: false,
                    last_ack_ms: 0,
                }],
                epoch: 0,
                coordinator: None,
                last_failover: None,
                unprotected_since_ms: 0,
                standbys: Vec::new(),
                replicas: 1,
            });
            health_problems(&report)
        };
        let behind = with_standby_at(119);
        assert_eq!(behind.len(), 1, "{behind:?}");
        assert!(
            behind[0].contains("log orders") && behind[0].contains("through LSN 120"),
            "{behind:?}"
        );
        assert!(with_standby_at(120).is_empty());
    }

    #[test]
    fn the_fill_bar_is_plain_and_bounded() {
        assert_eq!(fill_bar(0, 100), "[....................]   0 %");
        assert_eq!(fill_bar(50, 100), "[##########..........]  50 %");
        assert_eq!(fill_bar(1, 100), "[#...................]   1 %");
        assert_eq!(fill_bar(100, 100), "[####################] 100 %");
        assert_eq!(fill_bar(7, 0), "[####################] 100 %");
        // Over the cap (it can be lowered at a restart): the bar stays full, the figure says so.
        assert_eq!(fill_bar(150, 100), "[####################] 150 %");
    }
}
