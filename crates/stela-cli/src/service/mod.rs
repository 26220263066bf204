//! The daemon's commands: `stela serve`, and the tools that talk to a running daemon
//! (`stela status`, `stela power-fail`, `stela power-restore`).
//!
//! Which socket a tool talks to: `--socket PATH`, else `--dir DIR` (its `DIR/stela.sock`), else
//! `$STELA_SOCKET`, else `/run/stela/stela.sock` (where the shipped systemd unit puts it). With
//! `--tcp HOST:PORT` a tool talks TLS to a TCP daemon instead (`--tls-ca`, and `--token-file` or
//! `--tls-cert`/`--tls-key` to authenticate; docs/DAEMON.md, "Security").
//!
//! Files: [`args`] `stela serve`'s flags and config file; [`status`] `stela status` and the
//! health check; this one the daemon's run (systemd readiness and watchdog), the choice of
//! daemon a tool talks to, and `power-fail` / `power-restore`.

mod args;
mod status;

pub use args::{config_file_flags, AfterFailoverArg, RoleArg, ServeArgs};
pub(crate) use status::{health_problems, standby_unreachable};
pub use status::{status, status_failure_json, EXIT_UNHEALTHY};

use anyhow::Context;
use clap::Args;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;
use stela_client::{Address, Connection};
use stela_proto::{RequestBody, ResponseBody};
use stela_server::Server;

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
    crate::alloc::give_freed_memory_back();
    config.release_memory = Some(crate::alloc::release_freed_memory);
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
