//! The processes of the failover run: the witness, the nodes (`stela serve`, node `a`
//! starting as the primary in the "primary" namespace, node `b` as a standby in the "standby"
//! one and, in a run of three, node `c` as a standby in the "standby2" one; each started with
//! every other node as a `--peer`) and the client (`stela-bench failover-client` in the "client" namespace);
//! starting, signalling and restarting them; and asking a node for its status.
//!
//! The clients' and the replication connections run over TLS by default: the daemon serves
//! plain TCP (`--tcp-insecure`) on loopback only, and the nodes here listen on the run's own
//! addresses. One certificate made for the run (naming [`SERVER_NAME`]) serves both nodes'
//! client and replication listeners and is the CA every peer trusts; a client token
//! authenticates the client, an administrator token the primary to its standby. Without
//! [`Security`] the nodes are started with `--tcp-insecure --repl-insecure` instead (for a
//! daemon that accepts plain TCP inside a private network).
//!
//! Status is asked over the node's Unix socket (`DIR/stela.sock`), from this process: a Unix
//! socket belongs to the file system, not to a network namespace, so the run watches the nodes
//! through no link its faults cut, and gets the report `stela status --json` prints. A stopped
//! (SIGSTOP) node would never answer, so every request runs on a helper thread given up after a
//! second.

use super::events::{mono_ms, Event, LOG};
use super::topology::{Host, Topology};
use crate::netns::{wait_within, Killed};
use anyhow::{bail, Context};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use stela_proto::{Positions, ReplicaStatus, RequestBody, ResponseBody, StatusReport};

/// Ports, the same on every host (each has its own address).
pub const CLIENT_PORT: u16 = 7000;
pub const REPL_PORT: u16 = 7601;
pub const WITNESS_PORT: u16 = 7400;
/// etcd's client and peer ports, when etcd stands in the witness's place.
pub const ETCD_PORT: u16 = 2379;
pub const ETCD_PEER_PORT: u16 = 2380;

/// The coordinator the nodes name (`--coordinator`): the built-in witness, or a single-node
/// etcd (Debian's `etcd-server`) run in the witness's namespace, at its address, in its place
/// (the `kill-witness` faults kill and restart it; its data directory survives).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CoordinatorKind {
    #[default]
    Witness,
    Etcd,
}

impl CoordinatorKind {
    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            CoordinatorKind::Witness => "witness",
            CoordinatorKind::Etcd => "etcd",
        }
    }
}

/// The name the run's certificate carries (both nodes present it).
pub const SERVER_NAME: &str = "stela-node";

/// The TLS material of the run.
#[derive(Debug, Clone)]
pub struct Security {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Authenticates the client (the nodes' --token-file).
    pub client_token: PathBuf,
    /// Authenticates a primary to its standby (--admin-token-file, --standby-token-file).
    pub admin_token: PathBuf,
}

impl Security {
    /// Makes a self-signed certificate naming [`SERVER_NAME`], its key and two tokens in `dir`.
    ///
    /// # Errors
    /// The files cannot be written.
    pub fn create(dir: &Path) -> anyhow::Result<Security> {
        std::fs::create_dir_all(dir)?;
        let key = rcgen::KeyPair::generate()?;
        let cert =
            rcgen::CertificateParams::new(vec![SERVER_NAME.to_owned()])?.self_signed(&key)?;
        let security = Security {
            cert: dir.join("node.pem"),
            key: dir.join("node.key"),
            client_token: dir.join("client-token"),
            admin_token: dir.join("admin-token"),
        };
        std::fs::write(&security.cert, cert.pem())?;
        crate::harness::write_secret(&security.key, key.serialize_pem())?;
        crate::harness::write_secret(
            &security.client_token,
            "a-failover-benchmark-client-token\n",
        )?;
        crate::harness::write_secret(&security.admin_token, "a-failover-benchmark-admin-token\n")?;
        Ok(security)
    }
}

/// Settings every node and the witness share.
#[derive(Debug, Clone)]
pub struct Timing {
    pub heartbeat_ms: u64,
    pub suspect_after_ms: u64,
    pub lease_ms: u64,
    /// The nodes' `--replicas` (K: the standbys that must hold a `replicated` record), given
    /// to a run of three nodes only (a two-node daemon has one standby and no such flag).
    pub replicas: usize,
    pub coordinator: CoordinatorKind,
}

/// The names of the nodes of a run of `nodes`, in order.
pub const NODE_NAMES: [&str; 3] = ["a", "b", "c"];

/// The role a node is started in (the coordinator's holder overrides it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Primary,
    Standby,
}

/// A `stela serve` node.
pub struct Node {
    pub name: &'static str,
    pub host: Host,
    /// Its replication address, as the other nodes' `--peer` (and a primary's status) name it.
    pub repl: String,
    pub dir: PathBuf,
    log: PathBuf,
    args: Vec<String>,
    process: Option<Killed>,
    /// SIGSTOPped: not asked for its status.
    stopped: bool,
}

impl Node {
    fn new(
        name: &'static str,
        host: Host,
        peers: &[Host],
        topology: &Topology,
        base: &Path,
        timing: &Timing,
        security: Option<&Security>,
    ) -> Node {
        let dir = base.join(name);
        let own = topology.address(host);
        let mut args: Vec<String> = vec![
            "serve".into(),
            "--dir".into(),
            dir.display().to_string(),
            "--tcp".into(),
            format!("{own}:{CLIENT_PORT}"),
            "--node".into(),
            name.into(),
            "--repl-listen".into(),
            format!("{own}:{REPL_PORT}"),
        ];
        debug_assert!(!peers.is_empty() && !peers.contains(&host));
        for &peer in peers {
            args.extend([
                "--peer".into(),
                format!("{}:{REPL_PORT}", topology.address(peer)),
            ]);
        }
        if peers.len() >= 2 {
            args.extend(["--replicas".into(), timing.replicas.to_string()]);
        }
        let coordinator = topology.address(Host::Witness);
        match timing.coordinator {
            CoordinatorKind::Witness => args.extend([
                "--coordinator".into(),
                format!("tcp://{coordinator}:{WITNESS_PORT}"),
                // The witness is on another (namespaced) address: nodes prove themselves.
                "--coordinator-token-file".into(),
                witness_token_file(base).display().to_string(),
            ]),
            // etcd takes no credentials from a node here (plain HTTP on the run's network).
            CoordinatorKind::Etcd => args.extend([
                "--coordinator".into(),
                format!("etcd://{coordinator}:{ETCD_PORT}"),
            ]),
        }
        args.extend([
            "--heartbeat-ms".into(),
            timing.heartbeat_ms.to_string(),
            "--suspect-after-ms".into(),
            timing.suspect_after_ms.to_string(),
            // Skips the start-up disk measurement, so that a restart rejoins at once.
            "--assume-write-rate".into(),
            "500000000".into(),
        ]);
        match security {
            Some(security) => {
                let path = |p: &PathBuf| p.display().to_string();
                args.extend([
                    "--tls-cert".into(),
                    path(&security.cert),
                    "--tls-key".into(),
                    path(&security.key),
                    "--token-file".into(),
                    path(&security.client_token),
                    "--admin-token-file".into(),
                    path(&security.admin_token),
                    "--standby-ca".into(),
                    path(&security.cert),
                    "--standby-name".into(),
                    SERVER_NAME.into(),
                    "--standby-token-file".into(),
                    path(&security.admin_token),
                ]);
            }
            // Plain TCP: what the daemon allows off loopback only for replication
            // (--repl-insecure); it refuses --tcp-insecure on these addresses today.
            None => args.extend(["--tcp-insecure".into(), "--repl-insecure".into()]),
        }
        Node {
            name,
            host,
            repl: format!("{own}:{REPL_PORT}"),
            log: base.join(format!("{name}.log")),
            dir,
            args,
            process: None,
            stopped: false,
        }
    }

    /// Starts the node in `role`; returns once its socket answers a status request.
    pub fn start(&mut self, stela: &Path, topology: &Topology, role: Role) -> anyhow::Result<()> {
        let mut args = self.args.clone();
        args.push("--role".into());
        args.push(match role {
            Role::Primary => "primary".into(),
            Role::Standby => "standby".into(),
        });
        let child = topology
            .namespace(self.host)
            .spawn(stela, &args, &self.log)?;
        self.process = Some(Killed(child));
        self.stopped = false;
        let what = format!(
            "node {} to answer on {}",
            self.name,
            self.socket().display()
        );
        let mut exited = None;
        let ready = wait_within(&what, Duration::from_secs(30), || {
            if let Some(status) = self.try_exit() {
                exited = Some(status);
                return true;
            }
            self.status().is_some()
        });
        if let Some(status) = exited {
            bail!(
                "node {} exited at start ({status}); its log ends:\n{}",
                self.name,
                tail(&self.log, 15)
            );
        }
        ready.with_context(|| format!("node {}'s log ends:\n{}", self.name, tail(&self.log, 15)))
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.join("stela.sock")
    }

    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(Killed::id)
    }

    pub fn running(&self) -> bool {
        self.process.is_some()
    }

    /// Its exit status if it has exited (the process is then forgotten).
    pub fn try_exit(&mut self) -> Option<std::process::ExitStatus> {
        let status = self.process.as_mut()?.0.try_wait().ok()??;
        self.process = None;
        Some(status)
    }

    /// Waits up to `within` for the node to exit by itself; its exit code (None: still running
    /// or killed by a signal).
    pub fn wait_exit(&mut self, within: Duration) -> anyhow::Result<Option<i32>> {
        let mut code = None;
        let exited = wait_within("the node to exit", within, || match self.try_exit() {
            Some(status) => {
                code = status.code();
                true
            }
            None => !self.running(),
        });
        Ok(if exited.is_ok() { code } else { None })
    }

    /// SIGKILL, and reaped.
    pub fn kill(&mut self) {
        self.process = None;
        self.stopped = false;
    }

    pub fn signal(&mut self, signal: rustix::process::Signal) -> anyhow::Result<()> {
        let pid = self.pid().context("the node is not running")?;
        let pid = rustix::process::Pid::from_raw(pid as i32).context("pid 0")?;
        rustix::process::kill_process(pid, signal)
            .with_context(|| format!("signal node {}", self.name))?;
        if signal == rustix::process::Signal::STOP {
            self.stopped = true;
        } else if signal == rustix::process::Signal::CONT {
            self.stopped = false;
        }
        Ok(())
    }

    /// SIGTERM (the node writes and syncs everything), then waits up to 10 s; SIGKILL after.
    pub fn stop(&mut self) -> anyhow::Result<()> {
        if self.process.is_none() {
            return Ok(());
        }
        if self.stopped {
            self.signal(rustix::process::Signal::CONT)?;
        }
        self.signal(rustix::process::Signal::TERM)?;
        if self.wait_exit(Duration::from_secs(10))?.is_none() && self.running() {
            self.kill();
            bail!("node {} did not stop within 10 s of SIGTERM", self.name);
        }
        Ok(())
    }

    /// The node's status, or None if it is not running, stopped or does not answer in a second.
    pub fn status(&self) -> Option<StatusReport> {
        if self.process.is_none() || self.stopped {
            return None;
        }
        status_of(&self.socket(), Duration::from_secs(1))
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }
}

/// Asks the daemon at `socket` for its status, giving up after `within`.
pub fn status_of(socket: &Path, within: Duration) -> Option<StatusReport> {
    let (tx, rx) = std::sync::mpsc::channel();
    let address = stela_client::Address::Unix(socket.to_owned());
    std::thread::spawn(move || {
        let report = stela_client::Connection::connect_admin(&address)
            .and_then(|mut c| c.request(RequestBody::Status))
            .ok()
            .and_then(|answer| match answer {
                ResponseBody::Status(report) => Some(*report),
                _ => None,
            });
        let _ = tx.send(report);
    });
    rx.recv_timeout(within).ok().flatten()
}

/// Where the client's log stands on a node (appended, written, durable).
pub fn log_positions(report: &StatusReport) -> Option<&Positions> {
    report
        .logs
        .iter()
        .find(|l| l.name == LOG)
        .map(|l| &l.positions)
}

/// The replication state of the client's log on a node.
pub fn log_replica(report: &StatusReport) -> Option<&ReplicaStatus> {
    report
        .replication
        .as_ref()?
        .logs
        .iter()
        .find(|l| l.log == LOG)
}

pub fn role(report: &StatusReport) -> &str {
    report.replication.as_ref().map_or("", |r| r.role.as_str())
}

pub fn epoch(report: &StatusReport) -> u64 {
    report.replication.as_ref().map_or(0, |r| r.epoch)
}

/// Bytes of log the node shipped between two of its reports, to every standby. A log's
/// counter starts again at 0 with each shipping term (the primary begins a new term for a log
/// when a standby connects anew): a log whose term changed, or that `before` did not list,
/// counts all of `after`'s.
pub fn shipped_since(before: &StatusReport, after: &StatusReport) -> u64 {
    shipped_to(before, after, None)
}

/// [`shipped_since`], to the standby at `peer` only (its replication address, as the primary
/// names it) where given.
pub fn shipped_to(before: &StatusReport, after: &StatusReport, peer: Option<&str>) -> u64 {
    let earlier = standby_streams(before);
    standby_streams(after)
        .into_iter()
        .filter(|(to, _)| peer.is_none_or(|peer| peer == *to))
        .flat_map(|(to, logs)| {
            let then_logs = earlier
                .iter()
                .find(|(from, _)| *from == to)
                .map_or(&[][..], |(_, logs)| *logs);
            logs.iter().map(move |now| {
                let then = then_logs
                    .iter()
                    .find(|l| l.log == now.log && l.term == now.term);
                now.shipped_bytes - then.map_or(0, |then| then.shipped_bytes.min(now.shipped_bytes))
            })
        })
        .sum()
}

/// Each standby a primary reports, by its address, with its streams: `standbys` where the
/// daemon lists them, else (one standby) `peer` and `logs`.
fn standby_streams(report: &StatusReport) -> Vec<(&str, &[ReplicaStatus])> {
    let Some(replication) = &report.replication else {
        return Vec::new();
    };
    if replication.standbys.is_empty() {
        vec![(replication.peer.as_str(), &replication.logs[..])]
    } else {
        replication
            .standbys
            .iter()
            .map(|s| (s.peer.as_str(), &s.logs[..]))
            .collect()
    }
}

/// Whether a primary is protected again: it names a coordinator it reaches, acknowledges
/// nothing unprotected, and its standby is connected with the client's log caught up (at most
/// a few records behind: the client never stops committing).
pub fn protected(report: &StatusReport) -> bool {
    protected_log(report, LOG)
}

/// The client log's streams a primary reports, one per standby it ships to.
pub fn log_streams(report: &StatusReport) -> Vec<&ReplicaStatus> {
    standby_streams(report)
        .into_iter()
        .filter_map(|(_, logs)| logs.iter().find(|l| l.log == LOG))
        .collect()
}

/// How many standbys hold the client's log caught up on this primary: stream connected, not
/// stopped, at most a few records behind.
pub fn caught_up_standbys(report: &StatusReport) -> usize {
    log_streams(report)
        .into_iter()
        .filter(|l| l.connected && l.stopped.is_none() && l.lag_records <= 64)
        .count()
}

/// [`protected`], with every one of `standbys` standbys caught up (a whole cluster again, so
/// that the next fault starts from the same place as the first).
pub fn fully_protected(report: &StatusReport, standbys: usize) -> bool {
    protected(report) && caught_up_standbys(report) >= standbys
}

/// Whether every standby the primary ships the client's log to holds all of it (no record
/// behind), and it ships to `standbys` of them.
pub fn every_standby_holds_all(report: &StatusReport, standbys: usize) -> bool {
    let streams = log_streams(report);
    streams.len() >= standbys && streams.iter().all(|l| l.connected && l.lag_records == 0)
}

/// [`protected`], for the log named `log` (`stela-bench pg-failover`'s mount log).
pub fn protected_log(report: &StatusReport, log: &str) -> bool {
    let Some(replication) = &report.replication else {
        return false;
    };
    replication.role == "primary"
        && replication.unprotected_since_ms == 0
        && replication
            .coordinator
            .as_ref()
            .is_some_and(|c| c.reachable)
        && replication
            .logs
            .iter()
            .find(|l| l.log == log)
            .is_some_and(|l| l.connected && l.stopped.is_none() && l.lag_records <= 64)
}

/// The token file the witness takes its nodes' tokens from, and each node sends the first of.
fn witness_token_file(base: &Path) -> PathBuf {
    base.join("witness.token")
}

/// Writes [`witness_token_file`]: one token, the owner's alone (the witness and the nodes
/// refuse a token file others may read).
fn write_witness_token(base: &Path) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let token = format!("stela-bench-witness-{nanos:x}-{:x}", std::process::id());
    let path = witness_token_file(base);
    let _ = std::fs::remove_file(&path);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)?
        .write_all(format!("{token}\n").as_bytes())
}

/// The witness (`stela witness`), or etcd in its place.
pub struct Witness {
    /// etcd's binary; none: `stela witness`.
    etcd: Option<PathBuf>,
    args: Vec<String>,
    log: PathBuf,
    process: Option<Killed>,
}

impl Witness {
    fn new(topology: &Topology, base: &Path, timing: &Timing) -> Witness {
        if timing.coordinator == CoordinatorKind::Etcd {
            return Witness::etcd(topology, base);
        }
        Witness {
            etcd: None,
            args: vec![
                "witness".into(),
                "--listen".into(),
                format!("{}:{WITNESS_PORT}", topology.address(Host::Witness)),
                "--dir".into(),
                base.join("witness").display().to_string(),
                "--lease-ms".into(),
                timing.lease_ms.to_string(),
                "--token-file".into(),
                witness_token_file(base).display().to_string(),
            ],
            log: base.join("witness.log"),
            process: None,
        }
    }

    /// A single-node etcd on the witness's address, its data in `base/etcd`.
    fn etcd(topology: &Topology, base: &Path) -> Witness {
        let binary = ["/usr/bin/etcd", "/usr/local/bin/etcd"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.exists())
            .unwrap_or_else(|| PathBuf::from("etcd"));
        let address = topology.address(Host::Witness);
        let client = format!("http://{address}:{ETCD_PORT}");
        let peer = format!("http://{address}:{ETCD_PEER_PORT}");
        let args = [
            ("--name", "coordinator".to_owned()),
            ("--data-dir", base.join("etcd").display().to_string()),
            ("--listen-client-urls", client.clone()),
            ("--advertise-client-urls", client),
            ("--listen-peer-urls", peer.clone()),
            ("--initial-advertise-peer-urls", peer.clone()),
            ("--initial-cluster", format!("coordinator={peer}")),
        ];
        Witness {
            etcd: Some(binary),
            args: args
                .into_iter()
                .flat_map(|(flag, value)| [flag.to_owned(), value])
                .collect(),
            log: base.join("etcd.log"),
            process: None,
        }
    }

    pub fn start(&mut self, stela: &Path, topology: &Topology) -> anyhow::Result<()> {
        let tokens = Path::new(&self.args[self.args.len() - 1]);
        if self.etcd.is_none() && !tokens.exists() {
            let base = tokens.parent().unwrap_or(Path::new("."));
            write_witness_token(base)?;
        }
        let program = self.etcd.as_deref().unwrap_or(stela);
        let child = topology
            .namespace(Host::Witness)
            .spawn(program, &self.args, &self.log)?;
        let mut process = Killed(child);
        // The witness cannot be asked from here (its port is in its namespace); the nodes say
        // whether they reach it. A witness that exits at once is an error now.
        std::thread::sleep(Duration::from_millis(100));
        if let Some(status) = process.0.try_wait()? {
            bail!(
                "the coordinator ({}) exited at start ({status}); its log ends:\n{}",
                program.display(),
                tail(&self.log, 15)
            );
        }
        self.process = Some(process);
        Ok(())
    }

    pub fn kill(&mut self) {
        self.process = None;
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }
}

/// The witness and every node.
pub struct Cluster {
    pub stela: PathBuf,
    pub witness: Witness,
    /// `a`, `b` (and `c`), in the hosts of [`Host::nodes`].
    pub nodes: Vec<Node>,
}

impl Cluster {
    /// The witness and a node on each of `topology`'s node hosts, each with the others as its
    /// peers.
    pub fn new(
        stela: PathBuf,
        topology: &Topology,
        base: &Path,
        timing: &Timing,
        security: Option<&Security>,
    ) -> Cluster {
        let hosts = Host::nodes(topology.nodes());
        let nodes = hosts
            .iter()
            .zip(NODE_NAMES)
            .map(|(&host, name)| {
                let peers: Vec<Host> = hosts.iter().copied().filter(|&h| h != host).collect();
                Node::new(name, host, &peers, topology, base, timing, security)
            })
            .collect();
        Cluster {
            stela,
            witness: Witness::new(topology, base, timing),
            nodes,
        }
    }

    /// Every node but `i`.
    pub fn others(&self, i: usize) -> impl Iterator<Item = usize> + '_ {
        (0..self.nodes.len()).filter(move |&j| j != i)
    }

    /// The index of the node that reports itself primary in the highest epoch, with its status.
    pub fn primary(&self) -> Option<(usize, StatusReport)> {
        self.nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| n.status().map(|s| (i, s)))
            .filter(|(_, s)| role(s) == "primary")
            .max_by_key(|(_, s)| epoch(s))
    }
}

/// The client process and the events it has written so far.
pub struct Client {
    process: Option<Killed>,
    stdin: Option<ChildStdin>,
    events: Arc<Mutex<Vec<Event>>>,
    reader: Option<std::thread::JoinHandle<()>>,
    log: PathBuf,
}

impl Client {
    /// Starts `stela-bench failover-client` in the client's namespace; its events are kept in
    /// memory and, as written, in `base/client-events.jsonl`.
    pub fn start(
        me: &Path,
        topology: &Topology,
        base: &Path,
        args: &[String],
    ) -> anyhow::Result<Client> {
        let log = base.join("client.log");
        let stderr = std::fs::File::create(&log)?;
        let mut child = topology
            .namespace(Host::Client)
            .command(me, args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr))
            .spawn()
            .context("start the failover client")?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().context("the client's stdout")?;
        let events = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&events);
        let mut raw =
            std::io::BufWriter::new(std::fs::File::create(base.join("client-events.jsonl"))?);
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let _ = writeln!(raw, "{line}");
                match serde_json::from_str::<Event>(&line) {
                    Ok(event) => sink.lock().expect("events").push(event),
                    Err(error) => {
                        eprintln!("failover: a client line that is no event ({error}): {line}")
                    }
                }
            }
            let _ = raw.flush();
        });
        Ok(Client {
            process: Some(Killed(child)),
            stdin,
            events,
            reader: Some(reader),
            log,
        })
    }

    /// The events so far (a copy).
    pub fn events(&self) -> Vec<Event> {
        self.events.lock().expect("events").clone()
    }

    /// Whether a commit begun after `t_ms` has been acknowledged.
    pub fn acked_since(&self, t_ms: f64) -> bool {
        self.events
            .lock()
            .expect("events")
            .iter()
            .rev()
            .take_while(|e| e.t_ms() >= t_ms)
            .any(|e| matches!(e, Event::Ack { t_ms: t, wait_ms, .. } if t - wait_ms >= t_ms))
    }

    /// Waits up to `within` for an acknowledgement of a commit begun after now.
    pub fn wait_for_ack(&mut self, within: Duration) -> anyhow::Result<()> {
        let since = mono_ms();
        wait_within("an acknowledged commit", within, || {
            self.acked_since(since) || self.exited()
        })?;
        if self.exited() {
            bail!(
                "the client exited; its stderr ends:\n{}",
                tail(&self.log, 15)
            );
        }
        Ok(())
    }

    fn exited(&mut self) -> bool {
        self.process
            .as_mut()
            .is_none_or(|p| p.0.try_wait().ok().flatten().is_some())
    }

    /// Closes its standard input (it settles what is in doubt and exits), waits up to 15 s for
    /// it, and returns every event.
    pub fn stop(&mut self) -> anyhow::Result<Vec<Event>> {
        self.stdin = None;
        let exited = wait_within("the client to exit", Duration::from_secs(15), || {
            self.exited()
        });
        self.process = None;
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        exited.with_context(|| format!("the client's stderr ends:\n{}", tail(&self.log, 15)))?;
        Ok(self.events())
    }
}

/// The last `lines` lines of a file, for error messages (a daemon's per-connection lines left
/// out).
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| format!("({e})"));
    // A daemon logs every connection (and every client's authentication); those of the
    // harness's and the followers' status polls, and the client's reconnections (one every few
    // tens of milliseconds), would fill any tail.
    let all: Vec<&str> = text
        .lines()
        .filter(|line| {
            !line.contains("stela_server::net: connection accepted")
                && !line.contains("stela_server::net: connection closed")
                && !line.contains("stela_server::net: TCP client authenticated")
        })
        .collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use stela_proto::{CoordinatorStatus, ReplicationStatus};

    fn replica(connected: bool, lag_records: u64) -> ReplicaStatus {
        ReplicaStatus {
            log: LOG.into(),
            connected,
            term: 2 << 32 | 1,
            received_lsn: 100,
            durable_lsn: 90,
            lag_records,
            lag_ms: 0,
            lag_bytes: 0,
            stopped: None,
            shipped_bytes: 4000,
            wire_bytes: 1000,
            degraded: false,
            degraded_acks: 0,
            degraded_through: 0,
            unprotected_acks: 0,
            stalled: false,
            last_ack_ms: 0,
            last_end: None,
        }
    }

    fn report(role: &str, unprotected_since_ms: u64, logs: Vec<ReplicaStatus>) -> StatusReport {
        StatusReport {
            replication: Some(ReplicationStatus {
                role: role.into(),
                peer: "10.231.1.2:7601".into(),
                logs,
                epoch: 2,
                coordinator: Some(CoordinatorStatus {
                    describe: "witness tcp://10.231.1.3:7400".into(),
                    reachable: true,
                    last_answer_ms: 10,
                    epoch: 2,
                    holder: Some("b".into()),
                }),
                last_failover: None,
                unprotected_since_ms,
                standbys: Vec::new(),
                replicas: 1,
                session_ends: Default::default(),
                ended_streams: Vec::new(),
            }),
            ..StatusReport::default()
        }
    }

    #[test]
    fn protected_means_a_primary_with_its_standby_connected_and_caught_up() {
        assert!(protected(&report("primary", 0, vec![replica(true, 3)])));
        // Shipped between two reports: the difference within a term, all of a new term's, and
        // all of a log the first report did not list.
        let mut later = replica(true, 3);
        later.shipped_bytes = 6500;
        let before = report("primary", 0, vec![replica(true, 3)]);
        assert_eq!(
            shipped_since(&before, &report("primary", 0, vec![later.clone()])),
            2500
        );
        later.term += 1;
        later.shipped_bytes = 300;
        assert_eq!(
            shipped_since(&before, &report("primary", 0, vec![later])),
            300
        );
        assert_eq!(shipped_since(&StatusReport::default(), &before), 4000);
        // Unprotected since a promotion, the standby away or far behind, no log, a standby.
        assert!(!protected(&report("primary", 1, vec![replica(true, 0)])));
        assert!(!protected(&report("primary", 0, vec![replica(false, 0)])));
        assert!(!protected(&report("primary", 0, vec![replica(true, 5000)])));
        assert!(!protected(&report("primary", 0, vec![])));
        assert!(!protected(&report("standby", 0, vec![replica(true, 0)])));
        assert!(!protected(&StatusReport::default()));
        let mut away = report("primary", 0, vec![replica(true, 0)]);
        if let Some(c) = away
            .replication
            .as_mut()
            .and_then(|r| r.coordinator.as_mut())
        {
            c.reachable = false;
        }
        assert!(!protected(&away));
        assert_eq!((role(&away), epoch(&away)), ("primary", 2));
    }

    #[test]
    fn a_primary_of_three_nodes_is_read_per_standby() {
        let standby = |peer: &str, replica: ReplicaStatus| stela_proto::StandbyStatus {
            peer: peer.into(),
            connected: replica.connected,
            stalled: false,
            logs: vec![replica],
        };
        let mut three = report("primary", 0, vec![replica(true, 3)]);
        let mut far = replica(true, 5000);
        far.shipped_bytes = 100;
        if let Some(r) = three.replication.as_mut() {
            r.standbys = vec![standby("b:7601", replica(true, 3)), standby("c:7601", far)];
        }
        // Both streams are seen, not only the first (which `logs` repeats).
        assert_eq!(log_streams(&three).len(), 2);
        assert_eq!(caught_up_standbys(&three), 1);
        assert!(fully_protected(&three, 1));
        assert!(!fully_protected(&three, 2));
        assert!(!every_standby_holds_all(&three, 2));
        // Shipped to each standby, or to both.
        let before = StatusReport::default();
        assert_eq!(shipped_to(&before, &three, Some("b:7601")), 4000);
        assert_eq!(shipped_to(&before, &three, Some("c:7601")), 100);
        assert_eq!(shipped_since(&before, &three), 4100);
        assert_eq!(shipped_to(&three, &three, None), 0);
        // A daemon listing no standbys: its one standby from `logs`.
        let pair = report("primary", 0, vec![replica(true, 0)]);
        assert_eq!(log_streams(&pair).len(), 1);
        assert!(every_standby_holds_all(&pair, 1));
        assert_eq!(shipped_to(&before, &pair, Some("10.231.1.2:7601")), 4000);
        assert_eq!(shipped_to(&before, &pair, Some("elsewhere:7601")), 0);
    }
}
