//! Start-up and shutdown of a daemon: the engine, the socket(s), the event loop thread, the
//! signal thread.
//!
//! Invariants: the socket appears at its path only once its group and mode are set (it is
//! bound under a temporary name, chown'ed to `--socket-group`, chmod'ed, then renamed); TCP
//! starts only with TLS and client authentication, or as an explicit insecure loopback
//! listener ([`DaemonConfig::check`]); a second daemon on the same socket refuses to start
//! rather than steal it; shutdown (SIGTERM, SIGINT, [`Server::shutdown`]) stops admitting,
//! writes and syncs every buffer while the event loop still delivers the answers that releases,
//! then stops the loop and closes the logs, so it loses nothing acknowledged.

use crate::config::DaemonConfig;
use crate::engine::Engine;
use crate::error::{ShutdownError, StartError};
use crate::net::{self, LoopHandle};
use crate::replication::standby::Standby;
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::thread::JoinHandle;
use stela_proto::{EmergencyFlush, StatusReport};

/// A running daemon. Dropping it without [`Server::shutdown`] also flushes and stops.
pub struct Server {
    engine: Arc<Engine>,
    net: LoopHandle,
    socket_path: PathBuf,
    tcp_addr: Option<SocketAddr>,
    metrics_addr: Option<SocketAddr>,
    reloadable: Arc<Reloadable>,
    event_loop: Option<JoinHandle<()>>,
    stop_requested: Arc<(Mutex<bool>, Condvar)>,
    signals: Option<(signal_hook::iterator::Handle, JoinHandle<()>)>,
    /// The standby role's listener for the primary's streams (`--repl-listen`).
    standby: Option<Arc<Standby>>,
    /// Set when this node stepped down (a newer epoch exists): why.
    stepped_down: Arc<OnceLock<String>>,
    /// The thread a promotion starts to open every log for shipping: joined at shutdown, so
    /// that no log is still being opened (and locked) once `shutdown` returns.
    ship_all: Arc<Mutex<Option<JoinHandle<()>>>>,
}

impl Server {
    /// Starts a daemon: measures the disk, binds the socket(s), starts the flushers, workers and
    /// the event loop. Returns once clients can connect.
    pub fn start(config: DaemonConfig) -> Result<Server, StartError> {
        config.check()?;
        // Credentials and the socket's group are checked before the engine touches the disk.
        let auth = Arc::new(net::auth::Auth::load(&config)?);
        let socket_group = config
            .socket_group
            .as_deref()
            .map(resolve_group)
            .transpose()?;
        let engine = Engine::start(&config)?;
        // With a failover coordinator the role is its to say, before anything is served.
        let coordinator = connect_coordinator(&config, &engine)?;
        let standby = start_standby(&config, &engine, &auth)?;
        let socket_path = config.socket_path();
        let unix = bind_unix(&socket_path, config.socket_mode, socket_group)?;
        let tcp = bind_tcp(&config, &auth)?;
        let tcp_addr = tcp.as_ref().and_then(|l| l.local_addr().ok());
        let (event_loop, net) =
            net::create(&config, Arc::clone(&engine), unix, tcp, Arc::clone(&auth))?;
        let event_loop = spawn("stela-loop", move || {
            crate::engine::abort_on_panic("the event loop", || event_loop.run())
        })?;
        let metrics_addr = match config.metrics {
            Some(addr) => Some(start_metrics(addr, &engine, &net)?),
            None => None,
        };
        let reloadable = Arc::new(Reloadable {
            retain_bytes: AtomicU64::new(config.retain_bytes.unwrap_or(0)),
            counters: Arc::clone(&net.counters),
            auth: Arc::clone(&auth),
            hook: OnceLock::new(),
            running: config.clone(),
        });
        spawn_retention(&engine, &reloadable)?;
        let failover = Failover {
            stop_requested: Arc::new((Mutex::new(false), Condvar::new())),
            stepped_down: Arc::new(OnceLock::new()),
            ship_all: Arc::default(),
        };
        if let (Some(coordinator), Some(settings)) = (coordinator, config.failover.clone()) {
            failover.wire(&config, &engine, standby.as_ref(), coordinator, settings)?;
        }
        let signals = if config.handle_signals {
            Some(watch_signals(
                Arc::clone(&engine),
                Arc::clone(&failover.stop_requested),
                Arc::clone(&reloadable),
            )?)
        } else {
            None
        };
        if engine.replication().is_some() && engine.node().is_primary() {
            let engine = Arc::clone(&engine);
            spawn("stela-ship-all", move || engine.ship_every_log())?;
        }
        Ok(Server {
            engine,
            net,
            socket_path,
            tcp_addr,
            metrics_addr,
            reloadable,
            event_loop: Some(event_loop),
            stop_requested: failover.stop_requested,
            signals,
            standby,
            stepped_down: failover.stepped_down,
            ship_all: failover.ship_all,
        })
    }

    /// Why this node stepped down, once it has (a newer epoch exists): `run_until_stopped`
    /// then returns after flushing, and the process should exit and be started again to
    /// rejoin as the standby.
    pub fn stepped_down(&self) -> Arc<OnceLock<String>> {
        Arc::clone(&self.stepped_down)
    }

    /// Where the standby role takes its primary's streams (`--repl-listen`; port 0 resolved).
    pub fn repl_addr(&self) -> Option<SocketAddr> {
        self.standby.as_ref().map(|s| s.addr())
    }

    /// The engine (status, replication state).
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    pub fn socket_path(&self) -> &Path {
        &self.socket_path
    }

    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.tcp_addr
    }

    /// Installs what SIGHUP calls to read the configuration again (the CLI re-reads its
    /// `--config` file and flags); [`Server::reload`] applies what it returns.
    pub fn on_reload(&self, hook: ReloadHook) {
        let _ = self.reloadable.hook.set(hook);
    }

    /// Applies what can change while running (SIGHUP): the idle timeout, the retention, the
    /// token files' contents, the TLS certificate, key and client CA, and the connection
    /// limits. Every other setting needs a restart: a change to one is reported, not applied.
    /// A configuration [`DaemonConfig::check`] refuses is not applied at all. Returns what was
    /// applied and what was not, one line each.
    pub fn reload(&self, new: &DaemonConfig) -> Vec<String> {
        self.reloadable.apply(new)
    }

    /// Where `/metrics` is served, if it is.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// TCP peers refused for failing authentication since the start (TLS handshake or token).
    pub fn refused_logins(&self) -> u64 {
        self.net
            .counters
            .refused_logins
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn status(&self) -> StatusReport {
        self.engine.status(&self.net.counters.snapshot())
    }

    pub fn power_fail(&self) -> EmergencyFlush {
        self.engine.power_fail()
    }

    pub fn power_restore(&self) {
        self.engine.power_restore()
    }

    /// Blocks until a stop is requested (SIGTERM, SIGINT), then shuts down.
    pub fn run_until_stopped(self) -> Result<(), ShutdownError> {
        {
            let (flag, condvar) = &*self.stop_requested;
            let mut stop = flag.lock().unwrap_or_else(|e| e.into_inner());
            while !*stop {
                stop = condvar.wait(stop).unwrap_or_else(|e| e.into_inner());
            }
        }
        self.shutdown()
    }

    /// Stops admitting, writes and syncs every buffer, closes connections and logs.
    pub fn shutdown(mut self) -> Result<(), ShutdownError> {
        self.stop_all()
    }

    fn stop_all(&mut self) -> Result<(), ShutdownError> {
        let Some(event_loop) = self.event_loop.take() else {
            return Ok(());
        };
        self.engine.node().stop();
        // A promotion's opening of every log stops between logs once the node stops.
        let ship_all = crate::sync::lock(&*self.ship_all).take();
        if let Some(thread) = ship_all {
            let _ = thread.join();
        }
        // Drain while the loop still runs, so `disk` waiters released by the drain are answered.
        let drained = self.engine.shutdown();
        // Whatever was shipped by now is the standby's; its streams end here.
        if let Some(replication) = self.engine.replication() {
            replication.stop_all();
        }
        self.net.stop();
        if event_loop.join().is_err() {
            tracing::error!("the event loop panicked");
        }
        if let Some((handle, thread)) = self.signals.take() {
            handle.close();
            let _ = thread.join();
        }
        let _ = std::fs::remove_file(&self.socket_path);
        drained
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.stop_all();
    }
}

/// Starts a named thread; a failure to start it fails the start.
fn spawn<T: Send + 'static>(
    name: &str,
    body: impl FnOnce() -> T + Send + 'static,
) -> Result<JoinHandle<T>, StartError> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(body)
        .map_err(|source| StartError::Thread {
            name: name.into(),
            source,
        })
}

/// Connects to the failover coordinator (`--coordinator`), if there is one, and lets it decide
/// this node's role before anything is served.
fn connect_coordinator(
    config: &DaemonConfig,
    engine: &Arc<Engine>,
) -> Result<Option<Box<dyn stela_coord::Coordinator>>, StartError> {
    let Some(failover) = &config.failover else {
        return Ok(None);
    };
    let token = config
        .coordinator_token_file
        .as_deref()
        .map(stela_net::tls::read_client_token)
        .transpose()
        .map_err(|e| StartError::Config(format!("--coordinator-token-file: {e}")))?;
    let coordinator = stela_coord::connect(
        &failover.coordinator,
        &failover.cluster,
        failover.suspect_after,
        token,
    )
    .map_err(|e| StartError::Config(format!("--coordinator: {e}")))?;
    engine.node().decide_role(coordinator.as_ref());
    tracing::info!(
        role = engine.node().role_name(),
        epoch = engine.node().epoch(),
        coordinator = coordinator.describe(),
        "failover pair"
    );
    Ok(Some(coordinator))
}

/// Starts the standby role's listener for a primary's streams (`--repl-listen`), if asked, and
/// lets the engine's status report it.
fn start_standby(
    config: &DaemonConfig,
    engine: &Arc<Engine>,
    auth: &Arc<net::auth::Auth>,
) -> Result<Option<Arc<Standby>>, StartError> {
    let Some(addr) = config.repl_listen else {
        return Ok(None);
    };
    // Replication is given what it needs of the daemon's credentials, rather than reaching up
    // into the client listeners' authentication for it.
    let tls = auth.server_tls().map(|tls| {
        let source: crate::replication::standby::TlsSource = Arc::new(move || tls.current());
        source
    });
    let admins = Arc::clone(auth);
    let security = crate::replication::standby::Security {
        tls,
        is_admin: Arc::new(move |certificates, token| {
            admins.identify_certificates(certificates, token) == Ok(net::auth::Identity::Admin)
        }),
        trust_network: config.repl_insecure,
    };
    let standby = Standby::start(
        addr,
        &config.dir,
        Arc::clone(&config.storage),
        config.segment_bytes,
        security,
        Arc::clone(engine.node()),
    )
    .map_err(|source| StartError::Bind {
        what: format!("the replication listener {addr}"),
        source,
    })?;
    let standby = Arc::new(standby);
    engine.on_standby_status(standby.status_source());
    Ok(Some(standby))
}

/// Binds the TCP listener (`--tcp`), if asked, and says whether it speaks TLS.
fn bind_tcp(
    config: &DaemonConfig,
    auth: &net::auth::Auth,
) -> Result<Option<TcpListener>, StartError> {
    let Some(addr) = config.tcp else {
        return Ok(None);
    };
    let listener = TcpListener::bind(addr).map_err(|source| StartError::Bind {
        what: addr.to_string(),
        source,
    })?;
    if let Ok(addr) = listener.local_addr() {
        if auth.tls().is_some() {
            tracing::info!(%addr, "listening on TCP with TLS");
        } else {
            tracing::warn!(%addr, "listening on TCP WITHOUT TLS (--tcp-insecure, loopback only)");
        }
    }
    Ok(Some(listener))
}

/// Starts the thread that applies `--retain-bytes` once a second (the value SIGHUP may change);
/// it ends with the daemon, once shutdown has begun.
fn spawn_retention(engine: &Arc<Engine>, reloadable: &Arc<Reloadable>) -> Result<(), StartError> {
    let (engine, reloadable) = (Arc::clone(engine), Arc::clone(reloadable));
    spawn("stela-retention", move || {
        while !engine.is_shut_down() {
            std::thread::sleep(std::time::Duration::from_secs(1));
            match reloadable.retain_bytes.load(Ordering::Relaxed) {
                0 => {}
                keep => {
                    engine.apply_retention(keep);
                }
            }
        }
    })?;
    Ok(())
}

/// What the failover hooks share with the [`Server`]: the stop a step-down requests, why it
/// stepped down, and the thread a promotion starts to open every log for shipping.
struct Failover {
    stop_requested: Arc<(Mutex<bool>, Condvar)>,
    stepped_down: Arc<OnceLock<String>>,
    ship_all: Arc<Mutex<Option<JoinHandle<()>>>>,
}

impl Failover {
    /// Installs the node's promise, promote and step-down hooks, then starts the thread that
    /// follows the coordinator. The hooks hold the engine and the standby weakly: they must not
    /// keep a stopped daemon alive.
    fn wire(
        &self,
        config: &DaemonConfig,
        engine: &Arc<Engine>,
        standby: Option<&Arc<Standby>>,
        coordinator: Box<dyn stela_coord::Coordinator>,
        settings: crate::config::FailoverConfig,
    ) -> Result<(), StartError> {
        let node = Arc::clone(engine.node());
        node.on_promise(promise_hook(config, standby));
        node.on_promote(self.promote_hook(engine, standby));
        node.on_step_down(self.step_down_hook(engine));
        spawn("stela-cluster", move || {
            node.run(coordinator.as_ref(), &settings)
        })?;
        Ok(())
    }

    /// On promotion: end the streams this node took as a standby, then open every log for
    /// shipping once serving, so the old primary is reprotected on all of them when it returns.
    fn promote_hook(
        &self,
        engine: &Arc<Engine>,
        standby: Option<&Arc<Standby>>,
    ) -> crate::cluster::PromoteHook {
        let (standby, engine, ship_all) = (
            standby.map(Arc::downgrade),
            Arc::downgrade(engine),
            Arc::clone(&self.ship_all),
        );
        Box::new(move |_epoch| {
            if let Some(standby) = standby.as_ref().and_then(Weak::upgrade) {
                standby.end_streams();
            }
            let engine = engine.clone();
            let spawned = std::thread::Builder::new()
                .name("stela-ship-all".into())
                .spawn(move || ship_every_log_once_serving(engine));
            match spawned {
                Ok(thread) => *crate::sync::lock(&*ship_all) = Some(thread),
                Err(error) => {
                    tracing::error!(%error, "could not start the thread that opens every log for shipping; each is shipped when a client opens it")
                }
            }
        })
    }

    /// On stepping down (a newer epoch exists): fence replication, record why, request the stop.
    fn step_down_hook(&self, engine: &Arc<Engine>) -> crate::cluster::StepDownHook {
        let (engine, stop, stepped_down) = (
            Arc::downgrade(engine),
            Arc::clone(&self.stop_requested),
            Arc::clone(&self.stepped_down),
        );
        Box::new(move |why| {
            if let Some(engine) = engine.upgrade() {
                engine.step_down_shipping(&why);
            }
            let _ = stepped_down.set(why);
            let (flag, condvar) = &*stop;
            *flag.lock().unwrap_or_else(|e| e.into_inner()) = true;
            condvar.notify_all();
        })
    }
}

/// On a promise to a candidate: end the streams this node takes as a standby, then report
/// every log's position.
fn promise_hook(
    config: &DaemonConfig,
    standby: Option<&Arc<Standby>>,
) -> crate::cluster::PromiseHook {
    let standby = standby.map(Arc::downgrade);
    let (dir, storage) = (config.dir.join("logs"), Arc::clone(&config.storage));
    Box::new(move || {
        let started = std::time::Instant::now();
        let standby = standby.as_ref().and_then(Weak::upgrade);
        if let Some(standby) = &standby {
            standby.end_streams();
        }
        let ended = started.elapsed();
        let positions = match &standby {
            Some(standby) => standby.positions(),
            None => crate::replication::standby::log_positions(
                &dir,
                &storage,
                &std::collections::HashMap::new(),
            ),
        }
        .map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>);
        tracing::info!(
            end_streams_ms = ended.as_millis() as u64,
            read_positions_ms = (started.elapsed() - ended).as_millis() as u64,
            "promise: the streams ended and the positions read"
        );
        positions
    })
}

/// Waits (up to about a second) for the node to serve as the primary, then opens every log
/// for shipping; gives up when the node stops or the engine is gone.
fn ship_every_log_once_serving(engine: Weak<Engine>) {
    let Some(engine) = engine.upgrade() else {
        return;
    };
    for _ in 0..1000 {
        if engine.node().stopping() {
            return;
        }
        if engine.node().is_primary() {
            engine.ship_every_log();
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Starts the `/metrics` endpoint; each scrape reads the engine's and the loop's statistics.
fn start_metrics(
    addr: SocketAddr,
    engine: &Arc<Engine>,
    net: &LoopHandle,
) -> Result<SocketAddr, StartError> {
    let (engine, counters) = (Arc::clone(engine), Arc::clone(&net.counters));
    let render = move || {
        let status = engine.status(&counters.snapshot());
        let snapshot = crate::metrics::Snapshot {
            dirty_bytes: status.dirty_bytes,
            dirty_cap_bytes: status.dirty_cap.bytes,
            buffered_bytes: (status.buffers as u64 - status.free_buffers as u64)
                * status.buffer_bytes,
            bytes_written: status.bytes_written,
            connections: u64::from(status.connections),
            refused_connections: status.refused_connections,
            refused_logins: counters
                .refused_logins
                .load(std::sync::atomic::Ordering::Relaxed),
            power_failing: status.power != "normal",
            stopped_logs: status
                .logs
                .iter()
                .filter(|l| l.failure.is_some() || l.waiting_for_space.is_some())
                .count() as u64,
            replication: status.replication.clone(),
        };
        engine.metrics.render_openmetrics(&snapshot)
    };
    crate::metrics::start(addr, render).map_err(|source| StartError::Bind {
        what: format!("the metrics endpoint {addr}"),
        source,
    })
}

/// What SIGHUP calls for the configuration to apply; its error (the caller's own type) says
/// why there is none, and the running configuration stays.
pub type ReloadHook =
    Box<dyn Fn() -> Result<DaemonConfig, Box<dyn std::error::Error + Send + Sync>> + Send + Sync>;

/// The settings a running daemon can change (SIGHUP), and the configuration it runs with.
struct Reloadable {
    /// `--retain-bytes`, 0 for none.
    retain_bytes: AtomicU64,
    counters: Arc<net::NetCounters>,
    auth: Arc<net::auth::Auth>,
    hook: OnceLock<ReloadHook>,
    running: DaemonConfig,
}

impl Reloadable {
    fn apply(&self, new: &DaemonConfig) -> Vec<String> {
        if let Err(why) = new.check() {
            return vec![format!(
                "NOT applied: {why}; the running configuration stays"
            )];
        }
        let mut said = Vec::new();
        self.counters
            .idle_timeout_ms
            .store(new.idle_timeout.as_millis() as u64, Ordering::Relaxed);
        said.push(format!(
            "idle-timeout = {} s (applied)",
            new.idle_timeout.as_secs()
        ));
        self.retain_bytes
            .store(new.retain_bytes.unwrap_or(0), Ordering::Relaxed);
        said.push(match new.retain_bytes {
            Some(bytes) => format!("retain-bytes = {bytes} (applied)"),
            None => "retain-bytes unset: keep everything (applied)".to_owned(),
        });
        said.push(match self.auth.reload_tokens(new) {
            Ok(what) => format!("tokens: {what} (applied)"),
            Err(why) => format!("tokens: NOT applied: {why}"),
        });
        said.push(match self.auth.reload_tls(new) {
            Ok(what) => format!("TLS: {what} (applied)"),
            Err(why) => format!("TLS: NOT applied: {why}"),
        });
        // The connection limits, under the file limit found at start; lowering them drops no
        // connection, it only refuses new ones.
        let file_limit = self.counters.file_limit.load(Ordering::Relaxed);
        let limits = net::limits::limits(file_limit, new.max_connections, new.admin_connections);
        self.counters.set_limits(&limits);
        said.push(format!(
            "max-connections = {} (of {} asked; file limit {file_limit}), admin-connections = {} (applied)",
            limits.clients, new.max_connections, limits.admins
        ));
        let old = &self.running;
        let restart_needed = [
            ("dir", old.dir != new.dir),
            ("socket", old.socket != new.socket),
            ("tcp", old.tcp != new.tcp),
            ("metrics", old.metrics != new.metrics),
            ("buffers", old.buffers != new.buffers),
            ("buffer-size", old.buffer_bytes != new.buffer_bytes),
            ("segment-size", old.segment_bytes != new.segment_bytes),
            ("power-window", old.power_window != new.power_window),
            ("flushers", old.flushers != new.flushers),
            ("workers", old.workers != new.workers),
            (
                "write-threshold",
                old.write_threshold != new.write_threshold,
            ),
            ("flush-interval", old.flush_interval != new.flush_interval),
            ("socket-mode", old.socket_mode != new.socket_mode),
            ("socket-group", old.socket_group != new.socket_group),
            ("tcp-insecure", old.tcp_insecure != new.tcp_insecure),
            ("tls-admin-name", old.tls_admin_names != new.tls_admin_names),
            (
                "handshake-timeout",
                old.handshake_timeout != new.handshake_timeout,
            ),
            ("frame-timeout", old.frame_timeout != new.frame_timeout),
            (
                "partial-frame-bytes",
                old.partial_frame_bytes != new.partial_frame_bytes,
            ),
            ("output-bytes", old.output_bytes != new.output_bytes),
            ("quota-logs, quota-bytes", old.quota != new.quota),
            ("ring-size", old.ring_bytes != new.ring_bytes),
            ("spin-us", old.spin != new.spin),
            ("no-realtime", old.realtime_loop != new.realtime_loop),
            ("standby", old.standby != new.standby),
            ("repl-listen", old.repl_listen != new.repl_listen),
            ("repl-insecure", old.repl_insecure != new.repl_insecure),
            ("node", old.node != new.node),
            (
                "standby-ca, standby-cert, standby-key",
                old.standby_tls != new.standby_tls,
            ),
            ("standby-name", old.standby_name != new.standby_name),
            (
                "coordinator-token-file",
                old.coordinator_token_file != new.coordinator_token_file,
            ),
            (
                "standby-token-file",
                old.standby_token_file != new.standby_token_file,
            ),
            ("degrade-after", old.degrade_after != new.degrade_after),
        ];
        for (key, changed) in restart_needed {
            if changed {
                said.push(format!("{key} changed: NOT applied, needs a restart"));
            }
        }
        said
    }

    fn reload_from_hook(&self) {
        let Some(hook) = self.hook.get() else {
            tracing::warn!("SIGHUP: no configuration to reload (started without --config)");
            return;
        };
        match hook() {
            Ok(new) => {
                for line in self.apply(&new) {
                    tracing::warn!("SIGHUP reload: {line}");
                }
            }
            Err(error) => {
                tracing::error!(%error, "SIGHUP reload refused; the running configuration stays")
            }
        }
    }
}

/// SIGPWR runs the emergency flush on the signal thread; SIGTERM and SIGINT ask
/// [`Server::run_until_stopped`] to shut down; SIGHUP reloads what can change.
fn watch_signals(
    engine: Arc<Engine>,
    stop: Arc<(Mutex<bool>, Condvar)>,
    reloadable: Arc<Reloadable>,
) -> Result<(signal_hook::iterator::Handle, JoinHandle<()>), StartError> {
    use libc::{SIGHUP, SIGINT, SIGPWR, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGPWR, SIGTERM, SIGINT, SIGHUP])
        .map_err(StartError::Signals)?;
    let handle = signals.handle();
    let thread = std::thread::Builder::new()
        .name("stela-signals".into())
        .spawn(move || {
            for signal in signals.forever() {
                if signal == SIGPWR {
                    tracing::warn!("SIGPWR: power is failing");
                    engine.power_fail();
                } else if signal == SIGHUP {
                    reloadable.reload_from_hook();
                } else {
                    tracing::info!(signal, "stopping: flushing every buffer first");
                    let (flag, condvar) = &*stop;
                    *flag.lock().unwrap_or_else(|e| e.into_inner()) = true;
                    condvar.notify_all();
                }
            }
        })
        .map_err(|source| StartError::Thread {
            name: "stela-signals".into(),
            source,
        })?;
    Ok((handle, thread))
}

/// The group id of `name` (a group name, or a number).
fn resolve_group(name: &str) -> Result<u32, StartError> {
    if let Ok(gid) = name.parse::<u32>() {
        return Ok(gid);
    }
    let error = |message: String| StartError::SocketGroup {
        name: name.to_owned(),
        message,
    };
    let c_name = std::ffi::CString::new(name).map_err(|_| error("contains a NUL byte".into()))?;
    let mut buffer = vec![0u8; 16 << 10];
    loop {
        // SAFETY: `group` and `found` are plain out-parameters; `buffer` is a writable area of
        // the length passed, which getgrnam_r fills with the strings `group` points into. We
        // read only `gr_gid` (a plain integer) before the buffer goes away.
        let mut group: libc::group = unsafe { std::mem::zeroed() };
        let mut found: *mut libc::group = std::ptr::null_mut();
        let code = unsafe {
            libc::getgrnam_r(
                c_name.as_ptr(),
                &mut group,
                buffer.as_mut_ptr().cast(),
                buffer.len(),
                &mut found,
            )
        };
        match code {
            0 if found.is_null() => return Err(error("no such group".into())),
            0 => return Ok(group.gr_gid),
            libc::ERANGE if buffer.len() < 1 << 20 => buffer.resize(buffer.len() * 4, 0),
            code => return Err(error(io::Error::from_raw_os_error(code).to_string())),
        }
    }
}

/// Makes the socket's directory (0700, as every directory the daemon makes) and lets through it
/// whom the socket's mode lets in: a socket 0660 in a directory only its owner may search
/// would let nobody else connect. Only the search bit is added, only for those classes, and
/// only on a directory the daemon's user owns (DIR itself, by default); nobody gains the right
/// to list the directory or to read the logs below it, which stay 0700.
fn socket_dir_reachable(dir: &Path, socket_mode: u32) -> io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(stela_wal::storage::DIR_MODE)
        .create(dir)?;
    let search = (if socket_mode & 0o060 != 0 { 0o010 } else { 0 })
        | (if socket_mode & 0o006 != 0 { 0o001 } else { 0 });
    let meta = std::fs::metadata(dir)?;
    let missing = search & !meta.mode();
    // SAFETY: geteuid has no arguments and cannot fail.
    if missing != 0 && meta.uid() == unsafe { libc::geteuid() } {
        let mode = (meta.mode() & 0o7777) | missing;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))?;
        tracing::info!(dir = %dir.display(), mode = format!("{mode:o}"), "socket directory made searchable for those the socket mode admits");
    }
    Ok(())
}

fn bind_unix(path: &Path, mode: u32, group: Option<u32>) -> Result<UnixListener, StartError> {
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
        socket_dir_reachable(parent, mode).map_err(bind_err)?;
    }
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temp = path.with_file_name(format!(".{file_name}.{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&temp);
    let listener = UnixListener::bind(&temp).map_err(bind_err)?;
    if let Some(gid) = group {
        std::os::unix::fs::chown(&temp, None, Some(gid)).map_err(bind_err)?;
    }
    std::fs::set_permissions(&temp, std::fs::Permissions::from_mode(mode)).map_err(bind_err)?;
    std::fs::rename(&temp, path).map_err(bind_err)?;
    Ok(listener)
}
