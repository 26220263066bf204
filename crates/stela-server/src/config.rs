//! Every setting of the daemon and its default, in one place.
//!
//! The `stela serve` flags take their defaults from the constants here, [`DaemonConfig::new`]
//! starts from them, and `docs/DAEMON.md` lists them (a test in stela-cli compares that table
//! with these constants, so the page cannot drift from the code). Change a default here and
//! nowhere else.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use stela_wal::storage::{StdStorage, Storage};

/// Buffers in the pool (RapiLog's six).
pub const BUFFERS: usize = 6;
/// Bytes per buffer (RapiLog's 512 KiB).
pub const BUFFER_BYTES: usize = 512 << 10;
/// A buffer becomes eligible for writing once it holds this many bytes (half a buffer), unless a
/// `disk` waiter, the flush interval or a lack of space makes it so sooner. RapiLog defers a
/// write until at least a disk block is ready; writing in larger pieces while nobody waits for
/// the disk cuts the flushers' writes and syncs per byte (docs/DAEMON.md, "When buffers are
/// written").
pub const WRITE_THRESHOLD: usize = 256 << 10;
/// Every buffer is written at least this often.
pub const FLUSH_INTERVAL: Duration = Duration::from_secs(1);
/// The power supply's hold-up time after a power-failure notice.
pub const POWER_WINDOW: Duration = Duration::from_millis(50);
/// Size of each segment file of a log the daemon creates.
pub const SEGMENT_BYTES: u64 = 64 << 20;
/// Threads that write and sync buffers; two logs are written side by side up to this many.
pub const FLUSHERS: usize = 2;
/// Threads that run the requests that wait for the disk (open, read, truncate, power-fail).
pub const WORKERS: usize = 2;
/// Client connections served at once (lowered at start to what the file limit allows).
pub const MAX_CONNECTIONS: usize = 10_000;
/// Connections kept beyond the limit for administrators (`stela status`, power hooks).
pub const ADMIN_CONNECTIONS: usize = 8;
/// A connection must complete its Hello within this.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// A frame a connection has begun must arrive whole within this; a connection holding part of
/// one for longer (a slow or hostile peer keeping bytes the others need) is closed.
pub const FRAME_TIMEOUT: Duration = Duration::from_secs(10);
/// A connection with no request for this long is closed (zero: never).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(3600);
/// Bytes of partly received frames held for all connections together.
pub const PARTIAL_FRAME_BYTES: usize = 256 << 20;
/// Bytes of answers not yet sent held for all connections together: past it, answers to reads
/// shrink and a connection that already holds more than a small reserve waits for its answers to
/// go out before another request of it is handled.
pub const OUTPUT_BYTES: usize = 256 << 20;
/// Size of the data area of a shared-memory ring.
pub const RING_BYTES: usize = 1 << 20;
/// How long the event loop keeps polling after its last event before it sleeps.
pub const SPIN: Duration = Duration::from_micros(50);
/// Whether the event loop asks for realtime scheduling (granted to root or CAP_SYS_NICE).
pub const REALTIME_LOOP: bool = true;
/// Permission bits of the Unix socket: its owner only (a group with `--socket-group`, 0660).
pub const SOCKET_MODE: u32 = 0o600;

/// How to run a daemon. [`DaemonConfig::new`] gives the defaults above.
#[derive(Clone, Debug)]
pub struct DaemonConfig {
    /// The daemon's directory; logs live in `dir/logs/NAME`.
    pub dir: PathBuf,
    /// Unix socket path (default `dir/stela.sock`).
    pub socket: Option<PathBuf>,
    /// Permission bits of the socket.
    pub socket_mode: u32,
    /// The group the Unix socket is given (a name or a number; default: the daemon's own).
    pub socket_group: Option<String>,
    /// Also listen on TCP here. Needs `tls`, or `tcp_insecure` on a loopback address.
    pub tcp: Option<SocketAddr>,
    /// Serve Prometheus metrics over HTTP at `http://ADDR/metrics` (port 0: any free port).
    pub metrics: Option<SocketAddr>,
    /// Retention: keep about this many bytes of each open log's newest segments and remove
    /// older whole segments (checked every second). `None`: keep everything until a client
    /// truncates.
    pub retain_bytes: Option<u64>,
    /// Serve TCP without TLS. Refused unless `tcp` is a loopback address.
    pub tcp_insecure: bool,
    /// TLS on the TCP listener: the daemon's certificate and key, and the CA of client
    /// certificates (mutual TLS).
    pub tls: Option<stela_net::tls::ServerTlsFiles>,
    /// Tokens that authenticate TCP clients as clients (one per line).
    pub token_file: Option<PathBuf>,
    /// Tokens that authenticate TCP clients as administrators (one per line).
    pub admin_token_file: Option<PathBuf>,
    /// A verified client certificate naming one of these (DNS subject alternative name) is an
    /// administrator's.
    pub tls_admin_names: Vec<String>,
    pub buffers: usize,
    pub buffer_bytes: usize,
    pub write_threshold: usize,
    pub flush_interval: Duration,
    pub power_window: Duration,
    /// Skip the start-up measurement and assume this rate (bytes/s).
    pub assume_write_rate: Option<u64>,
    pub segment_bytes: u64,
    pub flushers: usize,
    pub workers: usize,
    pub max_connections: usize,
    pub admin_connections: usize,
    pub handshake_timeout: Duration,
    /// A frame begun must arrive whole within this.
    pub frame_timeout: Duration,
    /// Zero: never.
    pub idle_timeout: Duration,
    pub partial_frame_bytes: usize,
    pub output_bytes: usize,
    /// What each non-administrative credential may create and hold (`--quota-logs`,
    /// `--quota-bytes`; see [`crate::quota`]). Default: unlimited.
    pub quota: QuotaLimits,
    pub ring_bytes: usize,
    /// How long the event loop polls before sleeping; zero: never poll.
    pub spin: Duration,
    /// Ask for realtime scheduling of the event loop (it runs normally where not permitted).
    pub realtime_loop: bool,
    pub storage: Arc<dyn Storage>,
    /// React to SIGPWR (emergency flush) and SIGTERM/SIGINT (flush and stop). Only one daemon
    /// per process may.
    pub handle_signals: bool,
    /// Primary role: ship every open log to the standby listening here, and serve `replicated`
    /// and `all`. Loopback only until the replication stream runs over TLS.
    pub standby: Option<std::net::SocketAddr>,
    /// More standbys beyond `standby` (`--peer` given several times): the primary ships to each
    /// of them as to `standby`. The cluster has `1 + standbys().len()` nodes.
    pub more_standbys: Vec<std::net::SocketAddr>,
    /// How many standbys must hold a record before `replicated` is acknowledged (`--replicas`,
    /// K of the N − 1 standbys; default 1). Elections then need N − K promises.
    pub replicas: usize,
    /// Standby role: take the primary's streams here and mirror them into `dir/logs`.
    /// Loopback only until the replication stream runs over TLS.
    pub repl_listen: Option<std::net::SocketAddr>,
    /// Allow `standby` / `repl_listen` on addresses other than loopback although the stream has
    /// no TLS yet: only inside a private network the operator controls (the benchmark's own
    /// network namespaces).
    pub repl_insecure: bool,
    /// This node's name in replication messages and logs.
    pub node: String,
    /// With `standby`: TLS to it (the CA its certificate must chain to, and this primary's
    /// client certificate for mutual TLS), the name its certificate carries (default: its
    /// address), and a token file whose first token proves this primary to it (one of the
    /// standby's administrator tokens). Without TLS the stream runs on loopback only (or
    /// `repl_insecure`).
    pub standby_tls: Option<stela_net::tls::ClientTlsFiles>,
    pub standby_name: Option<String>,
    pub standby_token_file: Option<PathBuf>,
    /// With `failover` on a witness: a token file whose first token proves this node to the
    /// witness (one of its `--token-file`); without it the witness serves this node only on
    /// loopback, running as the witness's own user.
    pub coordinator_token_file: Option<PathBuf>,
    /// With a standby: once it has been unreachable this long, `replicated` and `all` commits are
    /// acknowledged without it (as `buffered` / `disk`), logged and counted, until it is back.
    /// `None`: they wait for it (the default).
    pub degrade_after: Option<Duration>,
    /// With a standby: the most bytes of a log the hold kept for the standby may keep (the
    /// segments from the one the standby needs next to the newest). A hold that would keep more
    /// is passed over by truncation, logged; the standby, when it comes back, begins its copy
    /// again at the oldest segment left (`Reseed`). `None`: the hold keeps everything it needs
    /// (the default), as PostgreSQL's `max_slot_wal_keep_size = -1`.
    pub standby_keep_max: Option<u64>,
    /// Automatic failover between this node and its peer (`--coordinator`); `None`: roles are
    /// fixed by `standby` / `repl_listen`.
    pub failover: Option<FailoverConfig>,
    /// How the process's allocator gives memory it holds free back to the system, called (on
    /// a worker) once closed connections have freed enough of it (see `net/trim.rs`): the
    /// binary sets it for its global allocator (`stela serve`: mimalloc's). `None`: glibc's
    /// `malloc_trim`.
    pub release_memory: Option<fn()>,
}

/// Automatic failover: both nodes run with `standby` (the peer's replication address) and
/// `repl_listen` (their own); the coordinator decides which is primary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailoverConfig {
    /// `tcp://HOST:PORT` (a `stela witness`) or `etcd://HOST:PORT`.
    pub coordinator: String,
    /// The pair's name at the coordinator (etcd keys live under it).
    pub cluster: String,
    /// The role this node takes when the coordinator has no holder yet or cannot be reached
    /// at start.
    pub initial_role: NodeRole,
    /// How often the primary renews with the coordinator and sends heartbeats to its standby.
    pub heartbeat: Duration,
    /// How long a standby hears nothing from its primary before it asks to be promoted (the
    /// coordinator's lease should be the same).
    pub suspect_after: Duration,
    /// How a promoted primary answers `replicated` commits until its old primary rejoins as
    /// its standby.
    pub after_failover: AfterFailover,
}

/// A node's part in a pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeRole {
    Primary,
    Standby,
}

/// What a promoted primary does with `replicated` commits while it has no standby.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterFailover {
    /// Acknowledge them from its own memory (RemusDB's unprotected primary), loudly: logged,
    /// counted, shown in `stela status`, until the old primary has rejoined.
    Unprotected,
    /// Wait for a standby, as a primary whose standby is down does.
    Block,
}

/// Default `--replicas`: one standby holds each `replicated` record.
pub const REPLICAS: usize = 1;

/// Default heartbeat and suspicion (docs/DAEMON.md).
pub const HEARTBEAT: Duration = Duration::from_millis(50);
pub const SUSPECT_AFTER: Duration = Duration::from_millis(300);

/// Settings the daemon cannot run with, each naming the setting ([`DaemonConfig::check`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("need at least one buffer of at least 4096 bytes")]
    NoBuffers,
    #[error("need at least one flusher and one worker thread")]
    NoThreads,
    #[error("max-connections must be at least 1")]
    NoConnections,
    #[error("ring size must be a power of two between 4 KiB and 64 MiB")]
    RingSize,
    /// `--standby` or `--repl-listen` off loopback without TLS or `--repl-insecure`.
    #[error("{flag} {addr}: off loopback the replication stream needs TLS ({needs}), or, inside a private network, --repl-insecure")]
    ReplicationWithoutTls {
        flag: &'static str,
        addr: std::net::SocketAddr,
        needs: &'static str,
    },
    #[error("--peer {0}: off loopback the replication stream needs TLS (--standby-ca), or, inside a private network, --repl-insecure")]
    PeerWithoutTls(std::net::SocketAddr),
    #[error("--replicas {0}: one standby can hold a record, so K must be 1")]
    OneStandby(usize),
    #[error("--replicas {replicas} must be between 1 and the number of --peer ({standbys})")]
    ReplicasOutOfRange { replicas: usize, standbys: usize },
    #[error("--coordinator needs --peer (the other node's replication address) and --repl-listen (this node's): either node may become the primary")]
    FailoverNeedsPeers,
    #[error("--suspect-after-ms ({suspect_ms} ms) must be at least twice --heartbeat-ms ({heartbeat_ms} ms)")]
    SuspectTooSoon {
        suspect_ms: u128,
        heartbeat_ms: u128,
    },
    #[error("--repl-listen with TLS must authenticate the primary: --admin-token-file (the primary sends one with --standby-token-file), or --tls-client-ca with --tls-admin-name (the primary's certificate)")]
    ReplListenUnauthenticated,
    #[error(
        "TLS settings and token files need --tcp or --repl-listen; --tcp-insecure needs --tcp"
    )]
    NoListenerForTls,
    #[error("--tcp-insecure and --tls-cert exclude each other")]
    InsecureAndTls,
    #[error("--tcp {0} needs TLS (--tls-cert and --tls-key, with --tls-client-ca or --token-file) or, on a loopback address, --tcp-insecure")]
    TcpWithoutTls(std::net::SocketAddr),
    #[error("--tcp-insecure serves TCP without TLS, so only on a loopback address, not {0}")]
    InsecureOffLoopback(std::net::SocketAddr),
    #[error("TLS on --tcp needs a way to authenticate clients: --tls-client-ca, --token-file or --admin-token-file")]
    NoClientAuthentication,
    #[error("--tls-admin-name needs --tls-client-ca")]
    AdminNameWithoutCa,
}

impl DaemonConfig {
    pub fn new(dir: impl Into<PathBuf>) -> DaemonConfig {
        DaemonConfig {
            dir: dir.into(),
            socket: None,
            socket_mode: SOCKET_MODE,
            socket_group: None,
            tcp: None,
            metrics: None,
            retain_bytes: None,
            tcp_insecure: false,
            tls: None,
            token_file: None,
            admin_token_file: None,
            tls_admin_names: Vec::new(),
            buffers: BUFFERS,
            buffer_bytes: BUFFER_BYTES,
            write_threshold: WRITE_THRESHOLD,
            flush_interval: FLUSH_INTERVAL,
            power_window: POWER_WINDOW,
            assume_write_rate: None,
            segment_bytes: SEGMENT_BYTES,
            flushers: FLUSHERS,
            workers: WORKERS,
            max_connections: MAX_CONNECTIONS,
            admin_connections: ADMIN_CONNECTIONS,
            handshake_timeout: HANDSHAKE_TIMEOUT,
            frame_timeout: FRAME_TIMEOUT,
            idle_timeout: IDLE_TIMEOUT,
            partial_frame_bytes: PARTIAL_FRAME_BYTES,
            output_bytes: OUTPUT_BYTES,
            quota: QuotaLimits::default(),
            ring_bytes: RING_BYTES,
            spin: SPIN,
            realtime_loop: REALTIME_LOOP,
            storage: Arc::new(StdStorage),
            handle_signals: false,
            standby: None,
            more_standbys: Vec::new(),
            replicas: REPLICAS,
            repl_listen: None,
            repl_insecure: false,
            node: "stela".to_owned(),
            degrade_after: None,
            standby_keep_max: None,
            standby_tls: None,
            standby_name: None,
            release_memory: None,
            standby_token_file: None,
            coordinator_token_file: None,
            failover: None,
        }
    }

    pub fn socket_path(&self) -> PathBuf {
        self.socket
            .clone()
            .unwrap_or_else(|| self.dir.join("stela.sock"))
    }

    /// Refuses settings the daemon cannot run with, naming the setting.
    pub fn check(&self) -> Result<(), ConfigError> {
        if self.buffers == 0 || self.buffer_bytes < 4096 {
            return Err(ConfigError::NoBuffers);
        }
        if self.flushers == 0 || self.workers == 0 {
            return Err(ConfigError::NoThreads);
        }
        if self.max_connections == 0 {
            return Err(ConfigError::NoConnections);
        }
        if !self.ring_bytes.is_power_of_two() || !(4096..=64 << 20).contains(&self.ring_bytes) {
            return Err(ConfigError::RingSize);
        }
        // The replication stream runs over TLS when the primary has --standby-ca and the
        // standby its --tls-cert; without, on loopback only (or a private network, said so).
        let tls = [
            (
                "--standby",
                self.standby,
                self.standby_tls.is_some(),
                "--standby-ca",
            ),
            (
                "--repl-listen",
                self.repl_listen,
                self.tls.is_some(),
                "--tls-cert and --tls-key",
            ),
        ];
        for (flag, addr, tls, needs) in tls {
            if let Some(addr) =
                addr.filter(|a| !a.ip().is_loopback() && !tls && !self.repl_insecure)
            {
                return Err(ConfigError::ReplicationWithoutTls { flag, addr, needs });
            }
        }
        self.check_replicas()?;
        if let Some(failover) = &self.failover {
            if self.standby.is_none() || self.repl_listen.is_none() {
                return Err(ConfigError::FailoverNeedsPeers);
            }
            if failover.heartbeat.is_zero() || failover.suspect_after < failover.heartbeat * 2 {
                return Err(ConfigError::SuspectTooSoon {
                    suspect_ms: failover.suspect_after.as_millis(),
                    heartbeat_ms: failover.heartbeat.as_millis(),
                });
            }
        }
        if self.repl_listen.is_some()
            && self.tls.is_some()
            && self.admin_token_file.is_none()
            && (self.tls_admin_names.is_empty()
                || self.tls.as_ref().is_some_and(|t| t.client_ca.is_none()))
        {
            return Err(ConfigError::ReplListenUnauthenticated);
        }
        self.check_tcp()
    }

    /// Every standby this primary ships to: `standby`, then `more_standbys`.
    pub fn standbys(&self) -> Vec<std::net::SocketAddr> {
        self.standby
            .iter()
            .chain(self.more_standbys.iter())
            .copied()
            .collect()
    }

    /// `--replicas K` must be between 1 and the number of standbys, and every standby follows
    /// the same transport rules as the first. (More than one standby elects by promises, which
    /// the witness and etcd both hold.)
    fn check_replicas(&self) -> Result<(), ConfigError> {
        let standbys = self.standbys();
        if self.more_standbys.is_empty() {
            return if self.replicas == 1 {
                Ok(())
            } else {
                Err(ConfigError::OneStandby(self.replicas))
            };
        }
        if self.replicas == 0 || self.replicas > standbys.len() {
            return Err(ConfigError::ReplicasOutOfRange {
                replicas: self.replicas,
                standbys: standbys.len(),
            });
        }
        if let Some(addr) = self
            .more_standbys
            .iter()
            .find(|a| !a.ip().is_loopback() && self.standby_tls.is_none() && !self.repl_insecure)
        {
            return Err(ConfigError::PeerWithoutTls(*addr));
        }
        Ok(())
    }

    /// TCP is never open without authentication by accident: it needs TLS with a way for
    /// clients to prove who they are, or an explicit `tcp_insecure` on a loopback address.
    fn check_tcp(&self) -> Result<(), ConfigError> {
        let client_auth = self.tls.as_ref().is_some_and(|t| t.client_ca.is_some())
            || self.token_file.is_some()
            || self.admin_token_file.is_some();
        let Some(addr) = self.tcp else {
            // TLS settings and token files serve the replication listener too.
            let for_tls =
                self.tls.is_some() || self.token_file.is_some() || self.admin_token_file.is_some();
            if (for_tls && self.repl_listen.is_none()) || self.tcp_insecure {
                return Err(ConfigError::NoListenerForTls);
            }
            return Ok(());
        };
        match (&self.tls, self.tcp_insecure) {
            (Some(_), true) => Err(ConfigError::InsecureAndTls),
            (None, false) => Err(ConfigError::TcpWithoutTls(addr)),
            (None, true) if !addr.ip().is_loopback() => Err(ConfigError::InsecureOffLoopback(addr)),
            (Some(_), false) if !client_auth => Err(ConfigError::NoClientAuthentication),
            _ if !self.tls_admin_names.is_empty()
                && self.tls.as_ref().is_none_or(|t| t.client_ca.is_none()) =>
            {
                Err(ConfigError::AdminNameWithoutCa)
            }
            _ => Ok(()),
        }
    }
}

/// The limits every credential gets (`--quota-logs`, `--quota-bytes`; see [`crate::quota`]);
/// `None`: unlimited.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QuotaLimits {
    pub logs: Option<u64>,
    pub bytes: Option<u64>,
}

impl QuotaLimits {
    pub fn any(&self) -> bool {
        self.logs.is_some() || self.bytes.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn three_nodes(coordinator: &str, replicas: usize) -> DaemonConfig {
        let mut config = DaemonConfig::new("/tmp/stela-config-test");
        config.standby = Some("127.0.0.1:7601".parse().unwrap());
        config.more_standbys = vec!["127.0.0.1:7602".parse().unwrap()];
        config.repl_listen = Some("127.0.0.1:7600".parse().unwrap());
        config.replicas = replicas;
        config.failover = Some(FailoverConfig {
            coordinator: coordinator.into(),
            cluster: "test".into(),
            initial_role: NodeRole::Standby,
            heartbeat: HEARTBEAT,
            suspect_after: SUSPECT_AFTER,
            after_failover: AfterFailover::Unprotected,
        });
        config
    }

    /// More than two nodes elect by promises, which the witness and etcd both hold; K must be
    /// between 1 and the number of standbys.
    #[test]
    fn three_nodes_take_either_coordinator_and_a_k_they_can_meet() {
        assert_eq!(three_nodes("tcp://127.0.0.1:7400", 1).check(), Ok(()));
        assert_eq!(three_nodes("tcp://127.0.0.1:7400", 2).check(), Ok(()));
        assert_eq!(three_nodes("etcd://127.0.0.1:2379", 1).check(), Ok(()));
        assert_eq!(three_nodes("etcd://127.0.0.1:2379", 2).check(), Ok(()));
        assert!(three_nodes("etcd://127.0.0.1:2379", 3).check().is_err());
        assert!(three_nodes("tcp://127.0.0.1:7400", 3).check().is_err());
        assert!(three_nodes("tcp://127.0.0.1:7400", 0).check().is_err());
        let mut pair = three_nodes("etcd://127.0.0.1:2379", 1);
        pair.more_standbys.clear();
        assert_eq!(pair.check(), Ok(()));
        pair.replicas = 2;
        assert!(pair.check().is_err());
    }
}
