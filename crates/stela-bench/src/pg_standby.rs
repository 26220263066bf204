//! `stela-bench pg-standby`: the anchor PostgreSQL on stela at `replicated` must beat (issue
//! 53): native PostgreSQL with a synchronous streaming standby (`synchronous_commit =
//! remote_write` and `on`), beside PostgreSQL under `stela run --level replicated` whose daemon
//! ships to a stela standby. Both standbys run in one network namespace this command creates
//! (root), across the same veth link, so both pay the same round trip.
//!
//! What each side is:
//! - `native-remote-write` / `native-on`: one primary cluster (`synchronous_standby_names =
//!   '*'`) and a standby made from it by `pg_basebackup -R`, started inside the namespace; a
//!   commit returns once the standby wrote (`remote_write`: handed to its OS) or flushed (`on`)
//!   the commit's WAL. The mode only changes the session's `synchronous_commit`.
//! - `stela-run-replicated`: a cluster whose `pg_wal` is durable through `stela run`; its fsyncs
//!   return once the daemon's standby (plain TCP, `--repl-insecure` as PostgreSQL's own
//!   replication connection here) holds the WAL in memory.
//!
//! Figures per (mode, clients): pgbench's tps, its average latency, and the median of the
//! per-transaction latencies pgbench logs (`-l`): the must-reach asks for the p50. Modes take
//! turns within each repeat; the median of the repeats is reported.
//!
//! Invariants: nothing outside the run's directory and namespace is touched; every server and
//! daemon started is stopped when the run ends (guards dropped in reverse order), on an error or
//! SIGINT too.

use crate::netns::{sibling, wait_for, Killed};
use crate::pg_bench::{
    as_postgres, chown_postgres, median, parse_pgbench, pg_bin, start_daemon, Cluster, PgRunArgs,
    UnderRun,
};
use crate::repl_bench::Network;
use anyhow::{bail, Context};
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

const MODES: [&str; 3] = ["native-remote-write", "native-on", "stela-run-replicated"];
/// The stela standby's replication listener, on the namespace's address.
const REPL_PORT: u16 = 7611;

#[derive(clap::Args, Debug, Clone)]
pub struct PgStandbyArgs {
    /// Modes, comma-separated: native-remote-write, native-on (PostgreSQL's synchronous
    /// streaming standby), stela-run-replicated (pg_wal through `stela run` at `replicated`).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "native-remote-write,native-on,stela-run-replicated"
    )]
    pub modes: Vec<String>,
    #[command(flatten)]
    pub run: PgRunArgs,
}

/// One (mode, clients) line: medians over the repeats.
#[derive(Clone, Debug)]
pub struct StandbyRow {
    pub mode: String,
    pub clients: u32,
    pub tps: f64,
    pub latency_avg_ms: f64,
    pub latency_p50_ms: f64,
    /// Each repeat's tps, in the order the repeats ran (the modes took turns within each).
    pub tps_runs: Vec<f64>,
}

/// A standby PostgreSQL running inside the namespace; stopped (immediate) when dropped.
struct NativeStandby {
    bin: PathBuf,
    data: PathBuf,
}

impl Drop for NativeStandby {
    fn drop(&mut self) {
        let data = self.data.display().to_string();
        let _ = as_postgres(
            &self.bin.join("pg_ctl"),
            &["-D", &data, "-m", "immediate", "stop"],
            &[],
        );
    }
}

fn append(path: &Path, text: &str) -> anyhow::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .with_context(|| format!("open {}", path.display()))?;
    writeln!(file, "\n# stela-bench pg-standby\n{text}")?;
    Ok(())
}

/// Opens `primary` to replication from the link's addresses, makes a standby of it with
/// `pg_basebackup -R` and starts that standby inside the namespace; returns once the primary
/// counts it as its synchronous standby.
fn native_standby(
    bin: &Path,
    primary: &Cluster,
    net: &Network,
    base: &Path,
    port: u16,
) -> anyhow::Result<NativeStandby> {
    append(
        &primary.data.join("postgresql.conf"),
        &format!(
            "listen_addresses = '{}'\nsynchronous_standby_names = '*'",
            net.here
        ),
    )?;
    append(
        &primary.data.join("pg_hba.conf"),
        &format!(
            "host replication postgres {0}/32 trust\nhost replication postgres {1}/32 trust",
            net.here, net.there
        ),
    )?;
    let data = primary.data.display().to_string();
    let log = primary.data.with_extension("log").display().to_string();
    as_postgres(
        &bin.join("pg_ctl"),
        &["-D", &data, "-l", &log, "-w", "restart"],
        &[],
    )?;
    let standby_data = base.join("native-standby");
    let standby = standby_data.display().to_string();
    as_postgres(
        &bin.join("pg_basebackup"),
        &[
            "-h",
            &net.here,
            "-p",
            &primary.port.to_string(),
            "-U",
            "postgres",
            "-D",
            &standby,
            "-R",
            "-X",
            "stream",
            "-c",
            "fast",
        ],
        &[],
    )?;
    append(
        &standby_data.join("postgresql.conf"),
        &format!("listen_addresses = ''\nport = {port}"),
    )?;
    let guard = NativeStandby {
        bin: bin.to_owned(),
        data: standby_data.clone(),
    };
    let status = net
        .namespace
        .command(
            Path::new("runuser"),
            &[
                "-u".into(),
                "postgres".into(),
                "--".into(),
                bin.join("pg_ctl").display().to_string(),
                "-D".into(),
                standby.clone(),
                "-l".into(),
                standby_data.with_extension("log").display().to_string(),
                "-w".into(),
                "start".into(),
            ],
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .context("starting the standby in the namespace")?;
    if !status.success() {
        bail!(
            "the standby did not start ({status}); see {}",
            standby_data.with_extension("log").display()
        );
    }
    let sync_state = || {
        primary
            .psql("select sync_state from pg_stat_replication")
            .map(|out| out.trim() == "sync")
            .unwrap_or(false)
    };
    wait_for("PostgreSQL's standby to stream synchronously", sync_state)?;
    Ok(guard)
}

/// The stela pair: a standby daemon in the namespace, a primary here shipping to it.
fn stela_pair(
    stela: &Path,
    net: &Network,
    base: &Path,
    flags: &str,
) -> anyhow::Result<(Killed, Killed)> {
    let repl: SocketAddr = format!("{}:{REPL_PORT}", net.there).parse()?;
    let mut standby_args: Vec<String> = vec![
        "serve".into(),
        "--dir".into(),
        base.join("stela-standby").display().to_string(),
        "--repl-listen".into(),
        repl.to_string(),
        "--repl-insecure".into(),
    ];
    standby_args.extend(flags.split_whitespace().map(str::to_owned));
    let standby = Killed(net.spawn(stela, &standby_args, &base.join("stela-standby.log"))?);
    wait_for("the stela standby", || {
        TcpStream::connect_timeout(&repl, Duration::from_millis(100)).is_ok()
    })?;
    let primary = start_daemon(
        stela,
        &base.join("stela-primary"),
        flags,
        &[
            "--standby",
            &repl.to_string(),
            "--repl-insecure",
            "--socket-mode",
            "666",
        ],
        base,
    )?;
    Ok((standby, primary))
}

/// The median of the per-transaction latencies (ms) in the logs pgbench wrote under `prefix`
/// (`-l --log-prefix`: one file per process or thread), which are removed after reading.
fn p50_from_logs(prefix: &Path) -> anyhow::Result<f64> {
    let dir = prefix.parent().context("a log prefix has a directory")?;
    let stem = prefix
        .file_name()
        .and_then(|n| n.to_str())
        .context("a log prefix has a name")?;
    let mut latencies_us: Vec<f64> = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let matches = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(&format!("{stem}.")));
        if !matches {
            continue;
        }
        // Each line: client, transaction, latency (us), script, epoch seconds, microseconds.
        for line in std::fs::read_to_string(&path)?.lines() {
            if let Some(us) = line.split_whitespace().nth(2).and_then(|f| f.parse().ok()) {
                latencies_us.push(us);
            }
        }
        std::fs::remove_file(&path)?;
    }
    if latencies_us.is_empty() {
        bail!("pgbench logged no transaction under {}", prefix.display());
    }
    Ok(median(&mut latencies_us) / 1000.0)
}

/// One pgbench run of `mode`: (tps, average latency ms, p50 latency ms).
fn measure(
    cluster: &Cluster,
    mode: &str,
    clients: u32,
    args: &PgStandbyArgs,
    logs: &Path,
) -> anyhow::Result<(f64, f64, f64)> {
    let env: Vec<(&str, &str)> = match mode {
        "native-remote-write" => vec![("PGOPTIONS", "-c synchronous_commit=remote_write")],
        "native-on" => vec![("PGOPTIONS", "-c synchronous_commit=on")],
        _ => Vec::new(),
    };
    let prefix = logs.join(format!("{mode}-{clients}"));
    let report = cluster.pgbench(
        &[
            "-c".into(),
            clients.to_string(),
            "-j".into(),
            clients.min(2).to_string(),
            "-T".into(),
            args.run.duration.to_string(),
            "-l".into(),
            format!("--log-prefix={}", prefix.display()),
        ],
        &env,
    )?;
    let (tps, average) = parse_pgbench(&report)?;
    Ok((tps, average, p50_from_logs(&prefix)?))
}

/// Every server this run started, dropped in reverse order of starting.
struct Servers {
    clusters: Vec<(&'static str, Cluster)>,
    _native_standby: Option<NativeStandby>,
    _stela: Option<(Killed, Killed)>,
}

fn start_servers(
    args: &PgStandbyArgs,
    bin: &Path,
    net: &Network,
    base: &Path,
) -> anyhow::Result<Servers> {
    let wants = |mode: &str| args.modes.iter().any(|m| m == mode);
    let sockets = base.join("sockets");
    std::fs::create_dir_all(&sockets)?;
    chown_postgres(&sockets)?;
    let stela = sibling("stela")?;
    // Declared before the clusters they serve, so that they outlive them.
    let stela_pair = match wants("stela-run-replicated") {
        true => Some(stela_pair(&stela, net, base, &args.run.daemon_flags)?),
        false => None,
    };
    let mut servers = Servers {
        clusters: Vec::new(),
        _native_standby: None,
        _stela: None,
    };
    if wants("native-remote-write") || wants("native-on") {
        let data = base.join("native");
        std::fs::create_dir_all(&data)?;
        chown_postgres(&data)?;
        let primary = Cluster::create(bin, &data.join("data"), None, 55_501, &sockets, None)?;
        let standby = native_standby(bin, &primary, net, &data, 55_502)?;
        servers.clusters.push(("native", primary));
        servers._native_standby = Some(standby);
    }
    if stela_pair.is_some() {
        let data = base.join("stela-run-replicated");
        std::fs::create_dir_all(&data)?;
        chown_postgres(&data)?;
        let waldir = data.join("pg_wal");
        let socket = base.join("stela-primary").join("stela.sock");
        let under = UnderRun {
            stela: &stela,
            socket: &socket,
            waldir: &waldir,
            level: "replicated",
        };
        let cluster = Cluster::create(
            bin,
            &data.join("data"),
            Some(&waldir),
            55_503,
            &sockets,
            Some(under),
        )?;
        servers.clusters.push(("stela-run-replicated", cluster));
    }
    servers._stela = stela_pair;
    Ok(servers)
}

/// Runs the benchmark and prints its table; the rows are returned too.
///
/// # Errors
/// Not root, PostgreSQL missing, a server that does not start, a pgbench that fails.
pub fn run(args: &PgStandbyArgs, out: &mut dyn Write) -> anyhow::Result<Vec<StandbyRow>> {
    for mode in &args.modes {
        if !MODES.contains(&mode.as_str()) {
            bail!("unknown mode {mode:?} (modes: {})", MODES.join(", "));
        }
    }
    let bin = pg_bin(&args.run)?;
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
    std::process::Command::new("chmod")
        .arg("755")
        .arg(&base)
        .status()?;
    let logs = base.join("pgbench-logs");
    std::fs::create_dir_all(&logs)?;
    chown_postgres(&logs)?;
    let net = Network::create()?;
    let servers = start_servers(args, &bin, &net, &base)?;
    let cluster_of = |mode: &str| {
        let name = if mode.starts_with("native") {
            "native"
        } else {
            "stela-run-replicated"
        };
        &servers
            .clusters
            .iter()
            .find(|(n, _)| *n == name)
            .expect("started above")
            .1
    };
    for (name, cluster) in &servers.clusters {
        eprintln!(
            "stela-bench pg-standby: pgbench -i -s {} on {name}",
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
    let started = Instant::now();
    let mut samples: Vec<(String, u32, Vec<[f64; 3]>)> = Vec::new();
    for &clients in &args.run.clients {
        for repeat in 0..args.run.repeats {
            for mode in &args.modes {
                crate::netns::check_interrupted()?;
                let (tps, average, p50) = measure(cluster_of(mode), mode, clients, args, &logs)?;
                eprintln!(
                    "  {mode:<21} clients {clients:>3} repeat {repeat}: {tps:>9.1} tps, {average:.3} ms average, {p50:.3} ms p50"
                );
                match samples
                    .iter_mut()
                    .find(|(m, c, _)| m == mode && *c == clients)
                {
                    Some((_, _, runs)) => runs.push([tps, average, p50]),
                    None => samples.push((mode.clone(), clients, vec![[tps, average, p50]])),
                }
            }
        }
    }
    let rows: Vec<StandbyRow> = samples
        .into_iter()
        .map(|(mode, clients, runs)| {
            let column = |i: usize| median(&mut runs.iter().map(|r| r[i]).collect::<Vec<_>>());
            StandbyRow {
                mode,
                clients,
                tps: column(0),
                latency_avg_ms: column(1),
                latency_p50_ms: column(2),
                tps_runs: runs.iter().map(|r| r[0]).collect(),
            }
        })
        .collect();
    print_rows(args, &rows, started.elapsed(), out)?;
    drop(servers);
    Ok(rows)
}

fn print_rows(
    args: &PgStandbyArgs,
    rows: &[StandbyRow],
    took: Duration,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    writeln!(
        out,
        "pgbench (TPC-B-like), scale {}, {} s per run, median of {} runs, modes taking turns ({:.0} s); standbys across one veth link in a namespace",
        args.run.scale, args.run.duration, args.run.repeats, took.as_secs_f64()
    )?;
    writeln!(
        out,
        "{:<22} {:>7} {:>10} {:>12} {:>12}",
        "mode", "clients", "tps", "avg ms", "p50 ms"
    )?;
    for row in rows {
        writeln!(
            out,
            "{:<22} {:>7} {:>10.1} {:>12.3} {:>12.3}",
            row.mode, row.clients, row.tps, row.latency_avg_ms, row.latency_p50_ms
        )?;
    }
    let find =
        |mode: &str, clients: u32| rows.iter().find(|r| r.mode == mode && r.clients == clients);
    for &clients in &args.run.clients {
        let (Some(stela), Some(native)) = (
            find("stela-run-replicated", clients),
            find("native-remote-write", clients),
        ) else {
            continue;
        };
        // The ratio of the two sides within each repeat (they ran minutes apart at most), then
        // the median of those: steadier on a noisy machine than the ratio of the two medians.
        let mut paired: Vec<f64> = stela
            .tps_runs
            .iter()
            .zip(&native.tps_runs)
            .map(|(s, n)| s / n)
            .collect();
        let ratio = median(&mut paired);
        let met = ratio >= 1.0 && stela.latency_p50_ms <= native.latency_p50_ms;
        writeln!(
            out,
            "  {clients:>2} clients: stela-run-replicated / native-remote-write tps {:.2} (median of the repeats' ratios; of the medians {:.2}), p50 {:.3} against {:.3} ms (target tps >= 1.00 and p50 no higher: {})",
            ratio,
            stela.tps / native.tps,
            stela.latency_p50_ms,
            native.latency_p50_ms,
            if met { "met" } else { "NOT met" }
        )?;
    }
    Ok(())
}
