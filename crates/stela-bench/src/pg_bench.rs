//! `stela-bench pgbench`: an unmodified PostgreSQL committing through `stela mount`, against
//! the same PostgreSQL on the local disk with synchronous_commit on and off.
//!
//! Each mode is its own cluster, initialised once (`initdb`, `pgbench -i`) and running for the
//! whole benchmark; the repeats go round the modes in turn, so noise on this machine falls on
//! every mode alike, and each figure is the median of the repeats. Modes:
//! - `native-sync`, `native-async`: one cluster on the local disk; the second runs pgbench
//!   with `synchronous_commit=off` (the same data, the same server).
//! - `stela-wal-buffered`, `stela-wal-disk`: pg_wal on a `stela mount` at that level
//!   (RapiLog's setting: only the log device is stela's).
//! - `stela-pgdata-buffered`: the whole data directory on a mount at `buffered`.
//! - `stela-pgdata-replicated`: the whole data directory on a mount at `replicated`, against a
//!   daemon of its own that ships to a standby daemon (both on loopback, this machine).
//! - `fuse-floor`, `bindfs-floor` (the floor of any FUSE front): pg_wal through a plain FUSE
//!   passthrough over tmpfs, where fdatasync costs nothing and nothing is logged, so what they
//!   lose against `native-async` is what FUSE itself costs. `fuse-floor` is the fastest
//!   passthrough fuser allows here (`stela-bench fuse-passthrough`: writeback cache, 1 MiB
//!   writes, 4 threads on cloned devices; the classic `/dev/fuse` read/write transport, since
//!   neither fuser 0.18 nor Debian's libfuse 3.14 has FUSE over io_uring); `bindfs-floor` is
//!   bindfs (libfuse's high-level API, no writeback cache), the floor measured before.
//!
//! Every stela mode runs with synchronous_commit=on and wal_init_zero=off. The daemon and the
//! mounts are the real `stela serve` and `stela mount` processes (found next to this binary);
//! PostgreSQL runs as the `postgres` user from Debian's packages.

use crate::netns::{sibling, Killed};
use anyhow::{bail, Context};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct PgBenchArgs {
    /// Modes, comma-separated: native-sync, native-async, fuse-floor, bindfs-floor (needs
    /// bindfs), stela-wal-buffered, stela-wal-disk, stela-pgdata-buffered, stela-run-buffered,
    /// stela-run-disk (pg_wal durable through `stela run`, no FUSE), stela-pgdata-replicated
    /// (not in the default list: it starts a standby daemon too).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "native-sync,native-async,fuse-floor,stela-wal-buffered,stela-wal-disk,stela-pgdata-buffered,stela-run-buffered,stela-run-disk"
    )]
    pub modes: Vec<String>,
    #[command(flatten)]
    pub run: PgRunArgs,
    /// JSON lines instead of the table: mode, clients, tps, latency_ms.
    #[arg(long)]
    pub json: bool,
    /// Extra flags for every `stela mount`, e.g. "--writeback-cache --threads 8".
    #[arg(
        long,
        value_name = "FLAGS",
        allow_hyphen_values = true,
        default_value = ""
    )]
    pub mount_flags: String,
}

/// What every PostgreSQL benchmark here takes: pgbench's client counts, scale, length and
/// repeats, where PostgreSQL and the run's files are, and flags for the daemons
/// (`stela-bench pgbench`, `stela-bench pg-standby`).
#[derive(clap::Args, Debug, Clone)]
pub struct PgRunArgs {
    /// pgbench client counts.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    pub clients: Vec<u32>,
    /// pgbench scale factor (100,000 accounts each).
    #[arg(long, default_value_t = 10)]
    pub scale: u32,
    /// Seconds per pgbench run.
    #[arg(long, default_value_t = 10)]
    pub duration: u32,
    /// Runs per (mode, clients); the median is reported.
    #[arg(long, default_value_t = 3)]
    pub repeats: u32,
    /// PostgreSQL's bin directory (default: the newest under /usr/lib/postgresql).
    #[arg(long, value_name = "DIR")]
    pub pg_bin: Option<PathBuf>,
    /// Working directory (default: a temporary one, removed afterwards).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Extra flags for `stela serve`, e.g. "--spin-us 0".
    #[arg(
        long,
        value_name = "FLAGS",
        allow_hyphen_values = true,
        default_value = ""
    )]
    pub daemon_flags: String,
}

const MODES: [&str; 10] = [
    "native-sync",
    "native-async",
    "fuse-floor",
    "bindfs-floor",
    "stela-wal-buffered",
    "stela-wal-disk",
    "stela-pgdata-buffered",
    "stela-pgdata-replicated",
    "stela-run-buffered",
    "stela-run-disk",
];

/// How a cluster's server is started: by pg_ctl alone, or under `stela run` with its WAL
/// directory durable through the daemon.
pub(crate) struct UnderRun<'a> {
    pub(crate) stela: &'a Path,
    pub(crate) socket: &'a Path,
    pub(crate) waldir: &'a Path,
    pub(crate) level: &'a str,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct PgRow {
    pub mode: String,
    pub clients: u32,
    pub tps: f64,
    pub latency_ms: f64,
}

pub(crate) fn pg_bin(args: &PgRunArgs) -> anyhow::Result<PathBuf> {
    if let Some(bin) = &args.pg_bin {
        return Ok(bin.clone());
    }
    newest_pg_bin()
}

/// The bin directory of the newest PostgreSQL under /usr/lib/postgresql (Debian's layout).
pub(crate) fn newest_pg_bin() -> anyhow::Result<PathBuf> {
    let mut versions: Vec<u32> = std::fs::read_dir("/usr/lib/postgresql")
        .context(
            "PostgreSQL is not installed (/usr/lib/postgresql missing; apt-get install postgresql)",
        )?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    versions.sort_unstable();
    let Some(newest) = versions.last() else {
        bail!("no PostgreSQL version under /usr/lib/postgresql");
    };
    Ok(PathBuf::from(format!("/usr/lib/postgresql/{newest}/bin")))
}

/// Runs a command as the postgres user (as root: through runuser).
pub(crate) fn as_postgres(
    program: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> anyhow::Result<String> {
    let mut command = Command::new("runuser");
    command
        .args(["-u", "postgres", "--"])
        .arg(program)
        .args(args);
    for (key, value) in env {
        command.env(key, value);
    }
    let out = command
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {} as postgres", program.display()))?;
    if !out.status.success() {
        bail!(
            "{} {} failed: {}{}",
            program.display(),
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

pub(crate) fn chown_postgres(path: &Path) -> anyhow::Result<()> {
    let status = Command::new("chown")
        .args(["-R", "postgres:postgres"])
        .arg(path)
        .status()?;
    if !status.success() {
        bail!(
            "chown postgres {} failed (is there a postgres user?)",
            path.display()
        );
    }
    Ok(())
}

pub(crate) fn is_mounted(point: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let wanted = point.to_string_lossy();
    mounts
        .lines()
        .any(|line| line.split(' ').nth(1) == Some(wanted.as_ref()))
}

/// A `stela mount` process; unmounted when dropped.
struct MountProcess {
    process: Option<Killed>,
    point: PathBuf,
}

impl MountProcess {
    fn start(
        stela: &Path,
        socket: &Path,
        point: &Path,
        log: &str,
        level: &str,
        base: &Path,
        flags: &str,
    ) -> anyhow::Result<MountProcess> {
        std::fs::create_dir_all(point)?;
        let backing = base.join(format!("backing-{log}"));
        let logfile = std::fs::File::create(base.join(format!("mount-{log}.log")))?;
        let child = Command::new(stela)
            .arg("mount")
            .arg(point)
            .args(["--log", log, "--level", level, "--allow-other", "--backing"])
            .arg(&backing)
            .arg("--socket")
            .arg(socket)
            .args(flags.split_whitespace())
            .stdin(Stdio::null())
            .stdout(logfile.try_clone()?)
            .stderr(logfile)
            .spawn()
            .context("starting stela mount")?;
        let mut mount = MountProcess {
            process: Some(Killed(child)),
            point: point.to_owned(),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !is_mounted(point) {
            if let Some(status) = mount.process.as_mut().unwrap().0.try_wait()? {
                bail!(
                    "stela mount exited with {status}; see {}",
                    base.join(format!("mount-{log}.log")).display()
                );
            }
            if Instant::now() > deadline {
                bail!("stela mount did not mount {} within 20 s", point.display());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        chown_postgres(point)?;
        Ok(mount)
    }
}

impl Drop for MountProcess {
    fn drop(&mut self) {
        if let Some(mut process) = self.process.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &process.id().to_string()])
                .status();
            let _ = process.0.wait();
            std::mem::forget(process);
        }
        if is_mounted(&self.point) {
            let _ = Command::new("fusermount3")
                .arg("-uz")
                .arg(&self.point)
                .status();
        }
    }
}

/// A FUSE passthrough over a tmpfs of its own (`fuse-floor`, `bindfs-floor`); unmounted, and
/// the tmpfs with it, when dropped.
struct FloorMount {
    process: Option<Killed>,
    point: PathBuf,
    tmpfs: PathBuf,
}

impl FloorMount {
    fn start(mode: &str, base: &Path) -> anyhow::Result<FloorMount> {
        let tmpfs = base.join(format!("tmpfs-{mode}"));
        let point = base.join(format!("mnt-{mode}"));
        std::fs::create_dir_all(&tmpfs)?;
        std::fs::create_dir_all(&point)?;
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=2g", "tmpfs"])
            .arg(&tmpfs)
            .status()?;
        if !status.success() {
            bail!(
                "mounting a tmpfs on {} failed (needs root)",
                tmpfs.display()
            );
        }
        let mut floor = FloorMount {
            process: None,
            point: point.clone(),
            tmpfs: tmpfs.clone(),
        };
        let logfile = std::fs::File::create(base.join(format!("{mode}.log")))?;
        let mut command = if mode == "bindfs-floor" {
            let mut command = Command::new("bindfs");
            command
                .args(["-f", "-o", "allow_other"])
                .arg(&tmpfs)
                .arg(&point);
            command
        } else {
            let mut command = Command::new(std::env::current_exe()?);
            command
                .args(["fuse-passthrough", "--source"])
                .arg(&tmpfs)
                .arg("--mountpoint")
                .arg(&point);
            command
        };
        let child = command
            .stdin(Stdio::null())
            .stdout(logfile.try_clone()?)
            .stderr(logfile)
            .spawn()
            .with_context(|| match mode {
                "bindfs-floor" => "starting bindfs (apt-get install bindfs)",
                _ => "starting stela-bench fuse-passthrough",
            })?;
        floor.process = Some(Killed(child));
        let deadline = Instant::now() + Duration::from_secs(20);
        while !is_mounted(&point) {
            if let Some(status) = floor.process.as_mut().unwrap().0.try_wait()? {
                bail!("{mode}'s file system exited with {status} before mounting");
            }
            if Instant::now() > deadline {
                bail!("{mode}'s file system did not mount within 20 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        chown_postgres(&point)?;
        Ok(floor)
    }
}

impl Drop for FloorMount {
    fn drop(&mut self) {
        let _ = Command::new("fusermount3")
            .arg("-uz")
            .arg(&self.point)
            .status();
        if let Some(mut process) = self.process.take() {
            let _ = process.0.wait();
            std::mem::forget(process);
        }
        let _ = Command::new("umount").arg("-l").arg(&self.tmpfs).status();
    }
}

/// A PostgreSQL cluster started with pg_ctl (under `stela run`, if `run` is set); stopped
/// when dropped.
pub(crate) struct Cluster {
    bin: PathBuf,
    pub(crate) data: PathBuf,
    pub(crate) port: u16,
    sockets: PathBuf,
    /// The `stela run` process the server runs under (it exits after the server).
    run: Option<std::process::Child>,
}

impl Cluster {
    pub(crate) fn create(
        bin: &Path,
        data: &Path,
        waldir: Option<&Path>,
        port: u16,
        sockets: &Path,
        under_run: Option<UnderRun<'_>>,
    ) -> anyhow::Result<Cluster> {
        let mut args = vec![
            "-D".to_owned(),
            data.display().to_string(),
            "-A".into(),
            "trust".into(),
            "-U".into(),
            "postgres".into(),
        ];
        if let Some(waldir) = waldir {
            args.push(format!("--waldir={}", waldir.display()));
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        as_postgres(&bin.join("initdb"), &args, &[])?;
        let mut conf = std::fs::OpenOptions::new()
            .append(true)
            .open(data.join("postgresql.conf"))?;
        writeln!(
            conf,
            "\n# stela-bench pgbench\nport = {port}\nlisten_addresses = ''\nunix_socket_directories = '{}'\n\
             wal_init_zero = off\nsynchronous_commit = on\nshared_buffers = 128MB\nmax_connections = 100",
            sockets.display()
        )?;
        let mut cluster = Cluster {
            bin: bin.to_owned(),
            data: data.to_owned(),
            port,
            sockets: sockets.to_owned(),
            run: None,
        };
        let log = data.with_extension("log");
        if let Some(under) = under_run {
            cluster.start_under_run(&under, &log)?;
            return Ok(cluster);
        }
        as_postgres(
            &bin.join("pg_ctl"),
            &[
                "-D",
                &data.display().to_string(),
                "-l",
                &log.display().to_string(),
                "-w",
                "start",
            ],
            &[],
        )?;
        Ok(cluster)
    }

    /// `stela run --durable WALDIR --level L -- runuser -u postgres -- pg_ctl start -w`:
    /// returns once pg_ctl has (the server stays, under `stela run`).
    fn start_under_run(&mut self, under: &UnderRun<'_>, log: &Path) -> anyhow::Result<()> {
        let output = std::fs::File::create(log.with_extension("run.log"))?;
        let mut child = Command::new(under.stela)
            .arg("run")
            .arg("--socket")
            .arg(under.socket)
            .arg("--durable")
            .arg(under.waldir)
            .args([
                "--level",
                under.level,
                "--",
                "runuser",
                "-u",
                "postgres",
                "--",
            ])
            .arg(self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(&self.data)
            .arg("-l")
            .arg(log)
            .args(["-w", "start"])
            .stdin(Stdio::null())
            .stdout(output.try_clone()?)
            .stderr(output)
            .spawn()
            .context("starting stela run")?;
        let deadline = Instant::now() + Duration::from_secs(60);
        let ready = || {
            as_postgres(
                &self.bin.join("pg_isready"),
                &[
                    "-h",
                    &self.sockets.display().to_string(),
                    "-p",
                    &self.port.to_string(),
                ],
                &[],
            )
            .is_ok()
        };
        while !ready() {
            if let Some(status) = child.try_wait()? {
                bail!(
                    "stela run exited with {status} before PostgreSQL answered; see {}",
                    log.with_extension("run.log").display()
                );
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                bail!("PostgreSQL under stela run did not answer within 60 s");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.run = Some(child);
        Ok(())
    }

    /// `psql -Atc SQL` on this cluster's socket: the result's rows, one a line.
    pub(crate) fn psql(&self, sql: &str) -> anyhow::Result<String> {
        let sockets = self.sockets.display().to_string();
        let port = self.port.to_string();
        as_postgres(
            &self.bin.join("psql"),
            &["-h", &sockets, "-p", &port, "-Atc", sql, "postgres"],
            &[],
        )
    }

    pub(crate) fn pgbench(&self, args: &[String], env: &[(&str, &str)]) -> anyhow::Result<String> {
        let mut all = vec![
            "-h".to_owned(),
            self.sockets.display().to_string(),
            "-p".to_owned(),
            self.port.to_string(),
        ];
        all.extend(args.iter().cloned());
        all.push("postgres".to_owned());
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        as_postgres(&self.bin.join("pgbench"), &all, env)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = as_postgres(
            &self.bin.join("pg_ctl"),
            &[
                "-D",
                &self.data.display().to_string(),
                "-m",
                "immediate",
                "stop",
            ],
            &[],
        );
        // `stela run` exits once the server's last process has; its last sync included.
        if let Some(mut run) = self.run.take() {
            let _ = run.wait();
        }
    }
}

/// tps and average latency from pgbench's report.
pub(crate) fn parse_pgbench(report: &str) -> anyhow::Result<(f64, f64)> {
    let field = |prefix: &str| {
        report.lines().find_map(|line| {
            let rest = line.trim().strip_prefix(prefix)?;
            rest.split_whitespace().next()?.parse::<f64>().ok()
        })
    };
    match (field("tps = "), field("latency average = ")) {
        (Some(tps), Some(latency)) => Ok((tps, latency)),
        _ => bail!("pgbench report without tps and latency: {report}"),
    }
}

/// The standby's replication listener of `stela-pgdata-replicated` (loopback).
const REPL_PORT: u16 = 17_611;

/// Starts `stela serve --dir DIR` with `flags` and `extra`; returns once its socket answers.
pub(crate) fn start_daemon(
    stela: &Path,
    dir: &Path,
    flags: &str,
    extra: &[&str],
    base: &Path,
) -> anyhow::Result<Killed> {
    std::fs::create_dir_all(dir)?;
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let log_path = base.join(format!("{name}.log"));
    let log = std::fs::File::create(&log_path)?;
    let daemon = Killed(
        Command::new(stela)
            .args(["serve", "--dir"])
            .arg(dir)
            .args(flags.split_whitespace())
            .args(extra)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting stela serve")?,
    );
    let socket = dir.join("stela.sock");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        if Instant::now() > deadline {
            bail!(
                "stela serve did not listen within 10 s; see {}",
                log_path.display()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(daemon)
}

pub(crate) fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

pub fn run(args: &PgBenchArgs, out: &mut dyn Write) -> anyhow::Result<Vec<PgRow>> {
    for mode in &args.modes {
        if !MODES.contains(&mode.as_str()) {
            bail!("unknown mode {mode:?} (modes: {})", MODES.join(", "));
        }
    }
    let bin = pg_bin(&args.run)?;
    let stela = sibling("stela")?;
    // SIGINT or SIGTERM ends the run at the next pgbench run (at most --duration away), and the
    // guards below stop PostgreSQL, unmount and stop the daemons on the way out; the signals'
    // default action would leave them all running.
    crate::netns::stop_on_signals()?;
    let temp = tempfile::tempdir()?;
    let base = args
        .run
        .dir
        .clone()
        .unwrap_or_else(|| temp.path().to_owned());
    std::fs::create_dir_all(&base)?;
    if std::fs::read_dir(&base)?.next().is_some() {
        bail!(
            "{} is not empty: give --dir a new or empty directory",
            base.display()
        );
    }
    // PostgreSQL (as postgres) must reach its directories through the path.
    Command::new("chmod").arg("755").arg(&base).status()?;
    let sockets = base.join("sockets");
    std::fs::create_dir_all(&sockets)?;
    chown_postgres(&sockets)?;
    let wants = |mode: &str| args.modes.iter().any(|m| m == mode);

    // Declared in this order so they drop in reverse: clusters, then mounts, then the daemon.
    let daemon_dir = base.join("daemon");
    // Under `stela run` PostgreSQL's own processes (the postgres user) reach the daemon.
    let run_modes = wants("stela-run-buffered") || wants("stela-run-disk");
    let open_socket: &[&str] = if run_modes {
        &["--socket-mode", "666"]
    } else {
        &[]
    };
    let _daemon = start_daemon(
        &stela,
        &daemon_dir,
        &args.run.daemon_flags,
        open_socket,
        &base,
    )?;
    let socket = daemon_dir.join("stela.sock");
    // `stela-pgdata-replicated` gets a pair of its own (a daemon with a standby ships every log
    // it holds): the standby on loopback, declared first so that it outlives its primary.
    let replicated = wants("stela-pgdata-replicated");
    let standby_addr = format!("127.0.0.1:{REPL_PORT}");
    let _standby = match replicated {
        true => Some(start_daemon(
            &stela,
            &base.join("standby"),
            &args.run.daemon_flags,
            &["--repl-listen", &standby_addr],
            &base,
        )?),
        false => None,
    };
    let _replicated_primary = match replicated {
        true => Some(start_daemon(
            &stela,
            &base.join("daemon-replicated"),
            &args.run.daemon_flags,
            &["--standby", &standby_addr],
            &base,
        )?),
        false => None,
    };
    let mut mounts = Vec::new();
    let mut floors = Vec::new();
    let mut clusters: Vec<(&str, Cluster)> = Vec::new();
    let mut port = 55_432;
    let mut next_port = || {
        port += 1;
        port
    };
    if wants("native-sync") || wants("native-async") {
        let data = base.join("native");
        std::fs::create_dir_all(&data)?;
        chown_postgres(&data)?;
        clusters.push((
            "native",
            Cluster::create(&bin, &data.join("data"), None, next_port(), &sockets, None)?,
        ));
    }
    for mode in ["fuse-floor", "bindfs-floor"] {
        if !wants(mode) {
            continue;
        }
        let floor = FloorMount::start(mode, &base)?;
        let data = base.join(mode);
        std::fs::create_dir_all(&data)?;
        chown_postgres(&data)?;
        let cluster = Cluster::create(
            &bin,
            &data.join("data"),
            Some(&floor.point.join("pg_wal")),
            next_port(),
            &sockets,
            None,
        )?;
        floors.push(floor);
        clusters.push((mode, cluster));
    }
    for (mode, level) in [
        ("stela-run-buffered", "buffered"),
        ("stela-run-disk", "disk"),
    ] {
        if !wants(mode) {
            continue;
        }
        let data = base.join(mode);
        std::fs::create_dir_all(&data)?;
        chown_postgres(&data)?;
        let waldir = data.join("pg_wal");
        let under = UnderRun {
            stela: &stela,
            socket: &socket,
            waldir: &waldir,
            level,
        };
        let cluster = Cluster::create(
            &bin,
            &data.join("data"),
            Some(&waldir),
            next_port(),
            &sockets,
            Some(under),
        )?;
        clusters.push((mode, cluster));
    }
    for (mode, level) in [
        ("stela-wal-buffered", "buffered"),
        ("stela-wal-disk", "disk"),
    ] {
        if !wants(mode) {
            continue;
        }
        let point = base.join(format!("mnt-{mode}"));
        let mount = MountProcess::start(
            &stela,
            &socket,
            &point,
            mode,
            level,
            &base,
            &args.mount_flags,
        )?;
        let data = base.join(mode);
        std::fs::create_dir_all(&data)?;
        chown_postgres(&data)?;
        let cluster = Cluster::create(
            &bin,
            &data.join("data"),
            Some(&point.join("pg_wal")),
            next_port(),
            &sockets,
            None,
        )?;
        mounts.push(mount);
        clusters.push((mode, cluster));
    }
    for (mode, level, daemon) in [
        ("stela-pgdata-buffered", "buffered", daemon_dir.clone()),
        (
            "stela-pgdata-replicated",
            "replicated",
            base.join("daemon-replicated"),
        ),
    ] {
        if !wants(mode) {
            continue;
        }
        let point = base.join(format!("mnt-{mode}"));
        let daemon_socket = daemon.join("stela.sock");
        let mount = MountProcess::start(
            &stela,
            &daemon_socket,
            &point,
            mode,
            level,
            &base,
            &args.mount_flags,
        )?;
        let cluster =
            Cluster::create(&bin, &point.join("data"), None, next_port(), &sockets, None)?;
        mounts.push(mount);
        clusters.push((mode, cluster));
    }
    let cluster_of = |mode: &str| {
        let name = if mode.starts_with("native") {
            "native"
        } else {
            mode
        };
        &clusters
            .iter()
            .find(|(n, _)| *n == name)
            .expect("set up above")
            .1
    };
    for (name, cluster) in &clusters {
        crate::netns::check_interrupted()?;
        eprintln!(
            "stela-bench pgbench: pgbench -i -s {} on {name}",
            args.run.scale
        );
        cluster.pgbench(
            &[
                "-i".into(),
                "-q".into(),
                "-s".into(),
                args.run.scale.to_string(),
            ],
            &[],
        )?;
    }

    let mut samples: Vec<(String, u32, Vec<f64>, Vec<f64>)> = Vec::new();
    for &clients in &args.run.clients {
        for repeat in 0..args.run.repeats {
            for mode in &args.modes {
                crate::netns::check_interrupted()?;
                let env: Vec<(&str, &str)> = if mode == "native-async" {
                    vec![("PGOPTIONS", "-c synchronous_commit=off")]
                } else {
                    Vec::new()
                };
                let threads = clients.min(2);
                let report = cluster_of(mode).pgbench(
                    &[
                        "-c".into(),
                        clients.to_string(),
                        "-j".into(),
                        threads.to_string(),
                        "-T".into(),
                        args.run.duration.to_string(),
                    ],
                    &env,
                )?;
                let (tps, latency) = parse_pgbench(&report)?;
                eprintln!("  {mode:<22} clients {clients:>3} repeat {repeat}: {tps:>9.1} tps, {latency:.3} ms");
                match samples
                    .iter_mut()
                    .find(|(m, c, _, _)| m == mode && *c == clients)
                {
                    Some((_, _, t, l)) => {
                        t.push(tps);
                        l.push(latency);
                    }
                    None => samples.push((mode.clone(), clients, vec![tps], vec![latency])),
                }
            }
        }
    }
    let rows: Vec<PgRow> = samples
        .into_iter()
        .map(|(mode, clients, mut tps, mut latency)| PgRow {
            mode,
            clients,
            tps: median(&mut tps),
            latency_ms: median(&mut latency),
        })
        .collect();
    print_rows(args, &rows, out)?;
    drop(clusters);
    drop(mounts);
    drop(floors);
    Ok(rows)
}

fn print_rows(args: &PgBenchArgs, rows: &[PgRow], out: &mut dyn Write) -> anyhow::Result<()> {
    if args.json {
        for row in rows {
            writeln!(out, "{}", serde_json::to_string(row)?)?;
        }
        return Ok(());
    }
    writeln!(
        out,
        "pgbench (TPC-B-like), scale {}, {} s per run, median of {} runs, modes taking turns",
        args.run.scale, args.run.duration, args.run.repeats
    )?;
    writeln!(
        out,
        "{:<24} {:>7} {:>10} {:>11}",
        "mode", "clients", "tps", "latency ms"
    )?;
    for row in rows {
        writeln!(
            out,
            "{:<24} {:>7} {:>10.1} {:>11.3}",
            row.mode, row.clients, row.tps, row.latency_ms
        )?;
    }
    let tps = |mode: &str, clients: u32| {
        rows.iter()
            .find(|r| r.mode == mode && r.clients == clients)
            .map(|r| r.tps)
    };
    writeln!(out)?;
    // (mode, target ratio, against which native mode); no target: no verdict.
    for (mode, target, against) in [
        ("fuse-floor", 0.0, "native-async"),
        ("bindfs-floor", 0.0, "native-async"),
        ("stela-wal-buffered", 0.95, "native-async"),
        ("stela-wal-disk", 0.9, "native-sync"),
        ("stela-pgdata-buffered", 0.9, "native-async"),
        ("stela-run-buffered", 0.95, "native-async"),
        ("stela-run-disk", 0.9, "native-sync"),
    ] {
        for &clients in &args.run.clients {
            let (Some(stela), Some(off), Some(on)) = (
                tps(mode, clients),
                tps("native-async", clients),
                tps("native-sync", clients),
            ) else {
                continue;
            };
            let ratio = if against == "native-sync" {
                stela / on
            } else {
                stela / off
            };
            let verdict = match target > 0.0 {
                true => format!(
                    " (target >= {target:.2} x {against}: {})",
                    if ratio >= target { "met" } else { "NOT met" }
                ),
                false => String::new(),
            };
            writeln!(
                out,
                "  {mode} / native-async at {clients:>2} clients: {:.2}; / native-sync: {:.2}{verdict}",
                stela / off,
                stela / on
            )?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pgbench_reports_are_read_and_a_report_without_figures_is_an_error() {
        let report = "number of failed transactions: 0 (0.000%)\nlatency average = 1.124 ms\n\
                      initial connection time = 3.1 ms\ntps = 889.418359 (without initial connection time)\n";
        assert_eq!(parse_pgbench(report).unwrap(), (889.418359, 1.124));
        assert!(parse_pgbench("FATAL: no such database").is_err());
    }
}
