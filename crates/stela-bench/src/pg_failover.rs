//! `stela-bench pg-failover`: PostgreSQL failover on stela (issue #10, item 3; RemusDB's
//! headline). The whole data directory is on a `stela mount` at `replicated`; a witness and two
//! nodes (`stela serve`, a primary and a standby); the standby node keeps its own copy of the
//! files current (`stela mount-follow`). A client inserts numbered rows, one commit each, and
//! records every acknowledged one. Each fault SIGKILLs the primary node: its daemon, its mount
//! and every PostgreSQL process. The standby's daemon is promoted by the witness; this run then
//! does what the failover driver (`contrib/postgres/stela-pg`) does on the new primary: stops
//! its follower, mounts its backing directory, starts PostgreSQL there (crash recovery makes it
//! consistent). The old primary's node restarts as the standby (reprotection: its daemon is
//! caught up from its own log, its follower from its own backing directory; nothing is copied
//! whole) and the next fault hits the other node.
//!
//! Figures per fault: `downtime_ms`, from the SIGKILL to the first commit acknowledged by the
//! new primary (on a connection opened after the fault); `acked`, rows acknowledged before the
//! fault (since the run began); `lost`, those of them missing from the table on the new
//! primary; and where the time went, each from the fault: `promoted_ms` (the standby's daemon
//! answers as the primary), `rejoined_ms` (the old primary's daemon and follower are started
//! again as the standby: with two nodes the new primary answers no `replicated` commit `Ok`
//! before, and the mount's fsyncs wait for it, so the old node restarts at once, as its service
//! manager would) and `mounted_ms` (its mount is up). Then reprotection:
//! `reprotect_bytes`, the log the new primary shipped the returning old primary until it was
//! caught up (records committed meanwhile included), `reprotect_ms`, and beside them
//! `pgdata_bytes`, the size of the whole data directory's files, which a re-clone would copy.
//!
//! All processes run on this machine on loopback (each node has its own directories, ports,
//! mount point and PostgreSQL socket directory; the client tries both nodes' sockets in turn,
//! as a multi-host connection string does): a FUSE mount made under `ip netns exec` lives in that command's own mount
//! namespace, where neither PostgreSQL nor this run could share it without more machinery.

use crate::failover::cluster::{protected_log, role, shipped_since, status_of, tail};
use crate::netns::{sibling, Killed};
use crate::pg_bench::{as_postgres, chown_postgres, is_mounted, newest_pg_bin};
use crate::pg_wire::PgSession;
use anyhow::{bail, Context};
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug, Clone)]
pub struct PgFailoverArgs {
    /// Faults to inject (each SIGKILLs the node that is the primary then).
    #[arg(long, default_value_t = 20)]
    pub faults: u32,
    /// How long the client commits on a protected primary before each fault.
    #[arg(long, default_value_t = 1500)]
    pub commit_ms: u64,
    /// The daemons' heartbeat.
    #[arg(long, default_value_t = 50)]
    pub heartbeat_ms: u64,
    /// How long a standby hears nothing before it asks to be promoted (the witness's lease is
    /// the same).
    #[arg(long, default_value_t = 300)]
    pub suspect_after_ms: u64,
    /// First of the ports this run uses (witness, each node's client and replication
    /// listeners, PostgreSQL): BASE to BASE+5, on 127.0.0.1.
    #[arg(long, default_value_t = 17400)]
    pub base_port: u16,
    /// PostgreSQL's bin directory (default: the newest under /usr/lib/postgresql).
    #[arg(long, value_name = "DIR")]
    pub pg_bin: Option<PathBuf>,
    /// The `stela` binary (default: next to this one).
    #[arg(long, value_name = "PATH")]
    pub stela: Option<PathBuf>,
    /// Working directory (default: a temporary one, removed afterwards).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// JSON lines: one per fault, then a summary.
    #[arg(long)]
    pub json: bool,
}

/// One fault's figures.
#[derive(Clone, Debug, serde::Serialize)]
pub struct FaultRow {
    pub fault: u32,
    pub downtime_ms: f64,
    pub acked: u64,
    pub lost: u64,
    /// From the fault to the standby's daemon answering as the primary.
    pub promoted_ms: f64,
    /// From the fault to the old primary's daemon and follower being started again as the
    /// standby (with two nodes, nothing is protected before).
    pub rejoined_ms: f64,
    /// From the fault to the new primary's mount being up (its follower stopped first).
    pub mounted_ms: f64,
    /// Bytes of log the new primary shipped the returning old primary until it was caught up
    /// (reprotection), records committed meanwhile included.
    pub reprotect_bytes: u64,
    /// From the old primary's daemon starting as the standby to it being caught up.
    pub reprotect_ms: f64,
    /// Bytes of the whole data directory's files on the new primary then: what a re-clone
    /// would copy.
    pub pgdata_bytes: u64,
}

/// The run's summary.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Summary {
    pub summary: bool,
    pub faults: u32,
    pub p50_ms: f64,
    pub max_ms: f64,
    pub lost: u64,
    /// The largest `reprotect_bytes / pgdata_bytes` of any fault.
    pub reprotect_of_pgdata_max: f64,
}

const LOG: &str = "pgdata";

/// The client's acknowledged rows: each row's number, when its commit was acknowledged and
/// the connection (counted from 1) it was committed on.
#[derive(Default)]
struct Acks {
    rows: Vec<u64>,
    /// (acknowledged at, connection opened at) of each row, in `rows`' order.
    times: Vec<(Instant, Instant)>,
}

/// A node: its daemon, and while it is the primary its mount and PostgreSQL, while it is the
/// standby its follower.
struct Node {
    name: &'static str,
    dir: PathBuf,
    backing: PathBuf,
    mountpoint: PathBuf,
    args: Vec<String>,
    daemon: Option<Killed>,
    mount: Option<Child>,
    follower: Option<Child>,
    postgres: Option<Child>,
    /// PostgreSQL's socket directory on this node (one per node, as on two machines).
    sockets: PathBuf,
    base: PathBuf,
}

fn spawn_logged(program: &Path, args: &[String], log: &Path) -> anyhow::Result<Child> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| {
            format!(
                "opening {} for {}'s output",
                log.display(),
                program.display()
            )
        })?;
    let stdout = file
        .try_clone()
        .with_context(|| format!("sharing {} between stdout and stderr", log.display()))?;
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(file)
        .spawn()
        .with_context(|| format!("starting {}", program.display()))
}

fn signal(child: &Child, signal: rustix::process::Signal) {
    if let Some(pid) = rustix::process::Pid::from_raw(child.id() as i32) {
        let _ = rustix::process::kill_process(pid, signal);
    }
}

fn wait_until(what: &str, within: Duration, mut done: impl FnMut() -> bool) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    while !done() {
        if Instant::now() > deadline {
            bail!("{what} did not happen within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

impl Node {
    fn socket(&self) -> PathBuf {
        self.dir.join("stela.sock")
    }

    fn log(&self, what: &str) -> PathBuf {
        self.base.join(format!("{}-{what}.log", self.name))
    }

    fn start_daemon(&mut self, stela: &Path, role: &str) -> anyhow::Result<()> {
        let mut args = self.args.clone();
        args.extend(["--role".into(), role.into()]);
        let log = self.log("daemon");
        let mut child = Killed(spawn_logged(stela, &args, &log)?);
        let socket = self.socket();
        let mut exited = None;
        wait_until(
            &format!("node {} answering", self.name),
            Duration::from_secs(30),
            || {
                if let Ok(Some(status)) = child.0.try_wait() {
                    exited = Some(status);
                    return true;
                }
                status_of(&socket, Duration::from_secs(1)).is_some()
            },
        )
        .with_context(|| tail(&log, 15))?;
        if let Some(status) = exited {
            bail!(
                "node {} exited at start ({status}):\n{}",
                self.name,
                tail(&log, 15)
            );
        }
        self.daemon = Some(child);
        Ok(())
    }

    fn role(&self) -> Option<String> {
        status_of(&self.socket(), Duration::from_secs(1)).map(|r| role(&r).to_owned())
    }

    fn start_follower(&mut self, stela: &Path) -> anyhow::Result<()> {
        let args = vec![
            "mount-follow".to_owned(),
            "--log-dir".into(),
            self.dir.join("logs").join(LOG).display().to_string(),
            "--backing".into(),
            self.backing.display().to_string(),
            "--socket".into(),
            self.socket().display().to_string(),
        ];
        self.follower = Some(spawn_logged(stela, &args, &self.log("follow"))?);
        Ok(())
    }

    /// Stops the follower (it applies what it can read, writes its snapshot and exits).
    fn stop_follower(&mut self) -> anyhow::Result<()> {
        if let Some(mut follower) = self.follower.take() {
            signal(&follower, rustix::process::Signal::TERM);
            let status = follower.wait()?;
            if !status.success() {
                bail!(
                    "the follower on node {} failed ({status}):\n{}",
                    self.name,
                    tail(&self.log("follow"), 15)
                );
            }
        }
        Ok(())
    }

    fn start_mount(&mut self, stela: &Path) -> anyhow::Result<()> {
        std::fs::create_dir_all(&self.mountpoint)
            .with_context(|| format!("creating {}", self.mountpoint.display()))?;
        let args = vec![
            "mount".to_owned(),
            self.mountpoint.display().to_string(),
            "--log".into(),
            LOG.into(),
            "--level".into(),
            "replicated".into(),
            "--allow-other".into(),
            "--backing".into(),
            self.backing.display().to_string(),
            "--socket".into(),
            self.socket().display().to_string(),
        ];
        let log = self.log("mount");
        let mut child = spawn_logged(stela, &args, &log)?;
        let point = self.mountpoint.clone();
        let mut exited = None;
        wait_until("the mount", Duration::from_secs(30), || {
            if let Ok(Some(status)) = child.try_wait() {
                exited = Some(status);
                return true;
            }
            is_mounted(&point)
        })?;
        if let Some(status) = exited {
            bail!(
                "stela mount on node {} exited ({status}):\n{}",
                self.name,
                tail(&log, 15)
            );
        }
        self.mount = Some(child);
        Ok(())
    }

    fn start_postgres(&mut self, bin: &Path, port: u16) -> anyhow::Result<()> {
        let sockets = &self.sockets;
        let data = self.mountpoint.join("pgdata");
        // The dead primary's lock file names a PID of another node (which may be in use here):
        // the old primary is fenced (its daemon is dead or stepped down, so nothing it writes
        // is kept), so the lock file is removed, as the failover driver does.
        // So is this node's own socket lock from its last PostgreSQL, killed a fault ago: that
        // postmaster may still be a zombie (init reaps it within about 2 s, and the next fault
        // can come sooner), and PostgreSQL refuses to start while the PID in the lock exists.
        let socket_lock = sockets.join(format!(".s.PGSQL.{port}.lock"));
        for (stale, what) in [
            (
                data.join("postmaster.pid"),
                "the dead primary's postmaster.pid",
            ),
            (socket_lock, "this node's last postmaster's socket lock"),
        ] {
            match std::fs::remove_file(&stale) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e).with_context(|| format!("removing {what}")),
            }
        }
        let log = self.log("postgres");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .with_context(|| format!("opening {}", log.display()))?;
        // Its own process group, so that a fault kills the postmaster and every backend at
        // once, as a crash of the node would.
        let child = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(bin.join("postgres"))
            .arg("-D")
            .arg(&data)
            .args(["-p", &port.to_string(), "-k"])
            .arg(sockets)
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .process_group(0)
            .spawn()
            .context("starting postgres")?;
        self.postgres = Some(child);
        Ok(())
    }

    /// The fault: SIGKILL of PostgreSQL (its whole process group), the mount and the daemon,
    /// all at once, as a node dies. Nothing is waited for: the standby node shares nothing
    /// with the dead one but this machine (see [`Node::reap`]).
    fn kill_node(&mut self) {
        if let Some(postgres) = &self.postgres {
            if let Some(group) = rustix::process::Pid::from_raw(postgres.id() as i32) {
                let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
            }
        }
        if let Some(mount) = &self.mount {
            signal(mount, rustix::process::Signal::KILL);
        }
        if let Some(daemon) = &self.daemon {
            signal(&daemon.0, rustix::process::Signal::KILL);
        }
    }

    /// Reaps the killed node's processes (this run's children). The PostgreSQL processes the
    /// postmaster started are reaped by init (here that took 1.2-1.9 s); nothing waits for
    /// them: each node has its own socket directory, and the new primary removes the dead
    /// one's postmaster.pid.
    fn reap(&mut self) {
        if let Some(mut postgres) = self.postgres.take() {
            let _ = postgres.wait();
        }
        if let Some(mut mount) = self.mount.take() {
            let _ = mount.wait();
        }
        self.daemon = None; // Killed: SIGKILL (again, harmless) and wait
    }

    /// After the fault: the dead mount's mount point is detached so the node can serve again.
    fn detach_mount(&self) {
        if is_mounted(&self.mountpoint) {
            let _ = Command::new("fusermount3")
                .arg("-uz")
                .arg(&self.mountpoint)
                .status();
        }
    }

    fn shutdown(&mut self) {
        self.kill_node();
        self.reap();
        if let Some(mut follower) = self.follower.take() {
            let _ = follower.kill();
            let _ = follower.wait();
        }
        self.detach_mount();
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The client: inserts rows 1, 2, ... one commit each, reconnecting (to each node's socket in
/// turn, every 10 ms) whenever its connection fails; a row whose commit failed is in doubt and never counted, and the next
/// row gets the next number.
fn client(
    sockets: Vec<PathBuf>,
    port: u16,
    acks: Arc<Mutex<Acks>>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut next = 1u64;
        let mut attempt = 0usize;
        while !stop.load(Ordering::Acquire) {
            attempt += 1;
            let Ok(mut session) = PgSession::connect(
                &sockets[attempt % sockets.len()],
                port,
                "postgres",
                "postgres",
                Duration::from_secs(5),
            ) else {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            };
            let opened = Instant::now();
            while !stop.load(Ordering::Acquire) {
                let row = next;
                next += 1;
                match session.query(&format!("INSERT INTO acked_rows VALUES ({row})")) {
                    Ok(_) => {
                        let mut acks = acks.lock().unwrap();
                        acks.rows.push(row);
                        acks.times.push((Instant::now(), opened));
                    }
                    Err(_) => break,
                }
            }
        }
    })
}

/// Bytes of every file under `dir` (sizes as listed: what copying the directory would copy).
/// The directory is a live node's backing directory, whose mount applies logged unlinks and
/// renames in the background while this walks it: a file or directory gone between its
/// listing and its reading is skipped (it is not there to copy), any other error is one.
fn dir_bytes(dir: &Path) -> anyhow::Result<u64> {
    let gone = |e: &std::io::Error| e.kind() == std::io::ErrorKind::NotFound;
    let mut total = 0;
    for entry in std::fs::read_dir(dir).with_context(|| dir.display().to_string())? {
        let entry = entry?;
        let path = entry.path();
        let kind = match entry.file_type() {
            Ok(kind) => kind,
            Err(e) if gone(&e) => continue,
            Err(e) => return Err(e).with_context(|| path.display().to_string()),
        };
        if kind.is_dir() {
            match dir_bytes(&path) {
                Ok(bytes) => total += bytes,
                Err(e) if e.downcast_ref::<std::io::Error>().is_some_and(gone) => {}
                Err(e) => return Err(e),
            }
        } else if kind.is_file() {
            match entry.metadata() {
                Ok(metadata) => total += metadata.len(),
                Err(e) if gone(&e) => {}
                Err(e) => return Err(e).with_context(|| path.display().to_string()),
            }
        }
    }
    Ok(total)
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Waits up to 60 s until `nodes[primary]` says the mount's log is protected (its standby
/// connected and caught up) and returns that status; otherwise fails with `what` and `when`,
/// the primary's last status and both daemons' logs.
fn wait_protected(
    nodes: &[Node; 2],
    primary: usize,
    what: &str,
    when: &str,
) -> anyhow::Result<stela_proto::StatusReport> {
    let mut last = None;
    wait_until(what, Duration::from_secs(60), || {
        last = status_of(&nodes[primary].socket(), Duration::from_secs(1));
        last.as_ref().is_some_and(|r| protected_log(r, LOG))
    })
    .with_context(|| {
        format!(
            "{when}; the primary's last status: {}\n{}\n{}",
            serde_json::to_string(&last).unwrap_or_default(),
            tail(&nodes[primary].log("daemon"), 20),
            tail(&nodes[1 - primary].log("daemon"), 20)
        )
    })?;
    Ok(last.expect("waited for above"))
}

/// Runs the benchmark; prints a table (or JSON lines) and returns the rows and summary.
pub fn run(args: &PgFailoverArgs, out: &mut dyn Write) -> anyhow::Result<(Vec<FaultRow>, Summary)> {
    if !Path::new("/dev/fuse").exists() {
        bail!("/dev/fuse is missing: the data directory's mount cannot be made");
    }
    // SIGINT or SIGTERM ends the run before its next fault; the nodes' guards then stop
    // PostgreSQL, unmount and stop the daemons and the witness.
    crate::netns::stop_on_signals()?;
    let stela = match &args.stela {
        Some(path) => path.clone(),
        None => sibling("stela")?,
    };
    let bin = match &args.pg_bin {
        Some(bin) => bin.clone(),
        None => newest_pg_bin()?,
    };
    let temp;
    let base = match &args.dir {
        Some(dir) => {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            dir.clone()
        }
        None => {
            temp = tempfile::Builder::new()
                .prefix("stela-pg-failover")
                .tempdir()?;
            temp.path().to_owned()
        }
    };
    // PostgreSQL (its own user) must reach the mount points and its socket directory.
    std::fs::set_permissions(&base, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .with_context(|| format!("opening {} to PostgreSQL's user", base.display()))?;
    let port = |n: u16| args.base_port + n;
    let witness_addr = format!("127.0.0.1:{}", port(0));
    let pg_port = port(5);
    let mut witness = Killed(spawn_logged(
        &stela,
        &[
            "witness".into(),
            "--listen".into(),
            witness_addr.clone(),
            "--dir".into(),
            base.join("witness").display().to_string(),
            "--lease-ms".into(),
            args.suspect_after_ms.to_string(),
        ],
        &base.join("witness.log"),
    )?);
    std::thread::sleep(Duration::from_millis(100));
    if let Some(status) = witness.0.try_wait()? {
        bail!(
            "the witness exited ({status}):\n{}",
            tail(&base.join("witness.log"), 15)
        );
    }
    let node = |name: &'static str, own: u16, peer: u16| {
        let dir = base.join(name);
        Node {
            name,
            backing: base.join(format!("{name}-backing")),
            mountpoint: base.join(format!("{name}-mnt")),
            args: vec![
                "serve".into(),
                "--dir".into(),
                dir.display().to_string(),
                "--tcp".into(),
                format!("127.0.0.1:{}", port(own)),
                "--tcp-insecure".into(),
                "--node".into(),
                name.into(),
                "--repl-listen".into(),
                format!("127.0.0.1:{}", port(own + 1)),
                "--peer".into(),
                format!("127.0.0.1:{}", port(peer + 1)),
                "--coordinator".into(),
                format!("tcp://{witness_addr}"),
                "--heartbeat-ms".into(),
                args.heartbeat_ms.to_string(),
                "--suspect-after-ms".into(),
                args.suspect_after_ms.to_string(),
                // Skips the start-up disk measurement, so that a restart rejoins at once.
                "--assume-write-rate".into(),
                "500000000".into(),
            ],
            dir,
            daemon: None,
            mount: None,
            follower: None,
            postgres: None,
            sockets: base.join(format!("{name}-sockets")),
            base: base.clone(),
        }
    };
    let mut nodes = [node("a", 1, 3), node("b", 3, 1)];
    for node in &nodes {
        std::fs::create_dir_all(&node.sockets)
            .with_context(|| format!("creating {}", node.sockets.display()))?;
        chown_postgres(&node.sockets)?;
    }
    let sockets: Vec<PathBuf> = nodes.iter().map(|n| n.sockets.clone()).collect();
    nodes[0].start_daemon(&stela, "primary")?;
    wait_until("node a to be the primary", Duration::from_secs(10), || {
        nodes[0].role().as_deref() == Some("primary")
    })?;
    nodes[1].start_daemon(&stela, "standby")?;
    nodes[1].start_follower(&stela)?;
    nodes[0].start_mount(&stela)?;
    chown_postgres(&nodes[0].mountpoint)?;
    let data = nodes[0].mountpoint.join("pgdata");
    as_postgres(
        &bin.join("initdb"),
        &[
            "-D",
            &data.display().to_string(),
            "-A",
            "trust",
            "-U",
            "postgres",
            "--no-sync",
        ],
        &[],
    )?;
    {
        let mut conf = std::fs::OpenOptions::new()
            .append(true)
            .open(data.join("postgresql.conf"))
            .with_context(|| format!("opening {}/postgresql.conf", data.display()))?;
        writeln!(
            conf,
            "\n# stela-bench pg-failover\nlisten_addresses = ''\nwal_init_zero = off\n\
             synchronous_commit = on\nfsync = on\nshared_buffers = 32MB\nmax_connections = 20"
        )?;
    }
    // initdb ran with --no-sync: one sync of the mount makes everything it wrote durable
    // (replicated) before the cluster starts.
    let status = Command::new("sync").arg("-f").arg(&data).status()?;
    if !status.success() {
        bail!("sync -f of the data directory failed");
    }
    nodes[0].start_postgres(&bin, pg_port)?;
    let connect = |node: &Node| {
        PgSession::connect(
            &node.sockets,
            pg_port,
            "postgres",
            "postgres",
            Duration::from_secs(5),
        )
    };
    wait_until(
        "PostgreSQL to accept connections",
        Duration::from_secs(30),
        || connect(&nodes[0]).is_ok(),
    )
    .with_context(|| tail(&nodes[0].log("postgres"), 15))?;
    connect(&nodes[0])?.query("CREATE TABLE acked_rows (n bigint PRIMARY KEY)")?;

    let acks = Arc::new(Mutex::new(Acks::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let client = client(
        sockets.clone(),
        pg_port,
        Arc::clone(&acks),
        Arc::clone(&stop),
    );
    let mut rows = Vec::new();
    let mut primary = 0usize;
    if !args.json {
        writeln!(
            out,
            "fault  downtime_ms  promoted_ms  rejoined_ms  mounted_ms  acked  lost  reprotect_B   pgdata_B"
        )?;
    }
    let result = (|| -> anyhow::Result<()> {
        for fault in 1..=args.faults {
            crate::netns::check_interrupted()?;
            let standby = 1 - primary;
            // The primary must be protected (its standby caught up) before it is killed:
            // otherwise a `replicated` commit waits and nothing is acknowledged unprotected.
            wait_protected(
                &nodes,
                primary,
                "the standby to catch up",
                &format!("before fault {fault}"),
            )?;
            std::thread::sleep(Duration::from_millis(args.commit_ms));
            let acked_before = acks.lock().unwrap().rows.len();
            if acked_before == 0 {
                bail!("the client committed nothing before fault {fault}");
            }
            let fault_at = Instant::now();
            nodes[primary].kill_node();
            let killed_at = Instant::now();
            let acked: Vec<u64> = acks.lock().unwrap().rows.clone();
            // Failover on the standby node: wait for its promotion, stop its follower,
            // mount, start PostgreSQL (crash recovery).
            wait_until("the standby's promotion", Duration::from_secs(30), || {
                nodes[standby].role().as_deref() == Some("primary")
            })?;
            let promoted = fault_at.elapsed();
            // The old primary's node comes back as the standby at once (as its service
            // manager restarts it): with two nodes the new primary protects no commit until it
            // is back (`replicated` is never answered `Ok` by a primary alone, and the mount
            // waits for it), so its return is part of the downtime. Then reprotection: it is
            // caught up with what the new primary ships it, against the data directory's size.
            let before = status_of(&nodes[standby].socket(), Duration::from_secs(1));
            nodes[primary].reap();
            nodes[primary].detach_mount();
            let rejoined_at = Instant::now();
            nodes[primary].start_daemon(&stela, "standby")?;
            nodes[primary].start_follower(&stela)?;
            let rejoined = fault_at.elapsed();
            nodes[standby].stop_follower()?;
            nodes[standby].start_mount(&stela)?;
            let mounted = fault_at.elapsed();
            nodes[standby].start_postgres(&bin, pg_port)?;
            let acks_ref = &acks;
            wait_until(
                "a commit on the new primary",
                Duration::from_secs(60),
                || {
                    acks_ref
                        .lock()
                        .unwrap()
                        .times
                        .iter()
                        .rev()
                        .take(4)
                        .any(|(_, opened)| *opened > killed_at)
                },
            )
            .with_context(|| tail(&nodes[standby].log("postgres"), 15))?;
            let downtime = {
                let acks = acks.lock().unwrap();
                let first = acks
                    .times
                    .iter()
                    .find(|(_, opened)| *opened > killed_at)
                    .map(|(at, _)| *at)
                    .expect("waited for above");
                first.duration_since(fault_at)
            };
            // Every row acknowledged before the fault must be on the new primary.
            let present: std::collections::HashSet<u64> = connect(&nodes[standby])?
                .query("SELECT n FROM acked_rows")?
                .into_iter()
                .filter_map(|row| row.first()?.as_ref()?.parse().ok())
                .collect();
            let lost = acked.iter().filter(|n| !present.contains(n)).count() as u64;
            let after = wait_protected(
                &nodes,
                standby,
                "the old primary to catch up",
                &format!("after fault {fault}"),
            )?;
            let reprotect_ms = rejoined_at.elapsed().as_secs_f64() * 1e3;
            let reprotect_bytes = shipped_since(&before.unwrap_or_default(), &after);
            let row = FaultRow {
                fault,
                downtime_ms: downtime.as_secs_f64() * 1e3,
                acked: acked.len() as u64,
                lost,
                promoted_ms: promoted.as_secs_f64() * 1e3,
                rejoined_ms: rejoined.as_secs_f64() * 1e3,
                mounted_ms: mounted.as_secs_f64() * 1e3,
                reprotect_bytes,
                reprotect_ms,
                pgdata_bytes: dir_bytes(&nodes[standby].backing)?,
            };
            if args.json {
                writeln!(out, "{}", serde_json::to_string(&row)?)?;
            } else {
                writeln!(
                    out,
                    "{:>5}  {:>11.0}  {:>11.0}  {:>11.0}  {:>10.0}  {:>5}  {:>4}  {:>12}  {:>12}",
                    row.fault,
                    row.downtime_ms,
                    row.promoted_ms,
                    row.rejoined_ms,
                    row.mounted_ms,
                    row.acked,
                    row.lost,
                    row.reprotect_bytes,
                    row.pgdata_bytes
                )?;
            }
            out.flush()?;
            rows.push(row);
            primary = standby;
        }
        Ok(())
    })();
    stop.store(true, Ordering::Release);
    let _ = client.join();
    for node in &mut nodes {
        node.shutdown();
    }
    drop(witness);
    result?;
    let mut downtimes: Vec<f64> = rows.iter().map(|r| r.downtime_ms).collect();
    let summary = Summary {
        summary: true,
        faults: rows.len() as u32,
        p50_ms: if downtimes.is_empty() {
            0.0
        } else {
            median(&mut downtimes)
        },
        max_ms: downtimes.iter().copied().fold(0.0, f64::max),
        lost: rows.iter().map(|r| r.lost).max().unwrap_or(0),
        reprotect_of_pgdata_max: rows
            .iter()
            .map(|r| r.reprotect_bytes as f64 / r.pgdata_bytes.max(1) as f64)
            .fold(0.0, f64::max),
    };
    if args.json {
        writeln!(out, "{}", serde_json::to_string(&summary)?)?;
    } else {
        writeln!(
            out,
            "faults {}  p50 {:.0} ms  max {:.0} ms  lost {}  reprotection at most {:.3}x the data directory",
            summary.faults,
            summary.p50_ms,
            summary.max_ms,
            summary.lost,
            summary.reprotect_of_pgdata_max
        )?;
    }
    Ok((rows, summary))
}
