//! `stela-bench backup`: time and bytes of `stela backup` of a daemon under load, and what the
//! backup costs the clients committing meanwhile.
//!
//! A daemon runs in this process on a fresh directory; one client fills a log with `--fill`
//! of 4 KiB records (buffered, then one `disk` commit), then `--clients` clients commit
//! `--record-bytes` records at `disk` to a second log until the end. Each repeat takes a backup
//! (`stela::backup::backup`, the code `stela backup` runs) without a rate limit and one at
//! `--max-rate`, each into a new directory and checked as `stela restore --check` does, and
//! measures a window without a backup as long as the unlimited one; the three take turns
//! (their order rotates each repeat). Reported per repeat: seconds, bytes read and written (the
//! copies' holes excluded), the backup directory's blocks on disk, and the clients' commits/s
//! and p99 commit latency during each backup and outside. Medians at the end. With `--from`,
//! the limited backup is replaced by an unlimited one taken as `stela backup --from` takes it
//! (`stela::backup::backup_remote`, the daemon sending its files over its socket; with `--tls`,
//! over TCP on loopback under TLS, authenticated with an administrator's token).

use anyhow::Context;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use stela_client::{Address, Durability, Wal, WalOptions};

#[derive(clap::Args, Debug, Clone)]
pub struct BackupBenchArgs {
    /// Clients committing at `disk` throughout.
    #[arg(long, default_value_t = 4)]
    pub clients: usize,
    /// Bytes of each client record.
    #[arg(long, default_value_t = 256)]
    pub record_bytes: usize,
    /// MiB written into the filled log before the first backup.
    #[arg(long, default_value_t = 256)]
    pub fill_mib: u64,
    /// Backups taken (each beside a window without one).
    #[arg(long, default_value_t = 3)]
    pub repeats: usize,
    /// Where the daemon's directory and the backups go [default: a temporary directory].
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// The rate limit of the limited backups (`stela backup --max-rate`).
    #[arg(long, default_value = "32MiB", value_parser = stela::units::parse_rate)]
    pub max_rate: stela::units::Size,
    /// Instead of the limited backup, take one the way `stela backup --from` does (the daemon
    /// sends its files' bytes in 1 MiB requests), without a limit, over the daemon's Unix
    /// socket: the protocol's cost beside the local copy's (no TCP, no TLS).
    #[arg(long)]
    pub from: bool,
    /// With --from: over TCP on loopback under TLS, authenticated with an administrator's
    /// token (the daemon also listens there), not over the Unix socket.
    #[arg(long, requires = "from")]
    pub tls: bool,
}

/// One commit: when it returned and how long it took.
type Samples = Arc<Mutex<Vec<(Instant, Duration)>>>;

/// One backup: its totals and what the clients did meanwhile.
struct Taken {
    seconds: f64,
    read: u64,
    written: u64,
    on_disk: u64,
    during: Window,
}

struct Row {
    unlimited: Taken,
    limited: Taken,
    outside: Window,
}

#[derive(Clone, Copy)]
struct Window {
    commits_per_s: f64,
    p99_us: u64,
}

pub fn run(args: &BackupBenchArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let base = match &args.dir {
        Some(dir) => tempfile::tempdir_in(dir),
        None => tempfile::tempdir(),
    }
    .context("a directory for the daemon and its backups")?;
    let dir = base.path().join("daemon");
    let mut config = stela_server::DaemonConfig::new(&dir);
    config.assume_write_rate = Some(500_000_000);
    let tls = args.tls.then(|| tls_files(base.path())).transpose()?;
    if let Some((files, token)) = &tls {
        config.tcp = Some("127.0.0.1:0".parse()?);
        config.tls = Some(files.clone());
        config.admin_token_file = Some(token.clone());
    }
    let server = stela_server::Server::start(config).context("start the daemon")?;
    let socket = server.socket_path().to_owned();
    let remote = match (&tls, server.tcp_addr()) {
        (Some((files, token)), Some(tcp)) => {
            let target = stela_client::TlsTarget::new(&format!("tls://{tcp}"), &files.cert)?;
            Address::Tls(Box::new(target.token_file(token)))
        }
        _ => Address::Unix(socket.clone()),
    };
    fill(&socket, args.fill_mib)?;
    let stop = Arc::new(AtomicBool::new(false));
    let samples = Samples::default();
    let clients: Vec<_> = (0..args.clients)
        .map(|_| commit_loop(&socket, args.record_bytes, stop.clone(), samples.clone()))
        .collect();
    std::thread::sleep(Duration::from_secs(1));
    let address = Address::Unix(socket.clone());
    let mut rows = Vec::new();
    let mut quiet_length = Duration::from_secs(2);
    for repeat in 0..args.repeats {
        let (mut unlimited, mut limited, mut outside) = (None, None, None);
        // Each repeat starts its rotation one place further: every side comes first once in
        // three repeats.
        for turn in 0..3 {
            match (repeat + turn) % 3 {
                0 => {
                    let to = base.path().join("b");
                    let taken = take_backup((dir.as_path(), &address), None, &to, None, &samples)?;
                    quiet_length = Duration::from_secs_f64(taken.seconds);
                    unlimited = Some(taken);
                }
                1 => {
                    let rate = (!args.from).then(|| args.max_rate.get());
                    let to = base.path().join("b");
                    let remote = args.from.then_some(&remote);
                    let local = (dir.as_path(), &address);
                    limited = Some(take_backup(local, remote, &to, rate, &samples)?);
                }
                _ => {
                    let start = Instant::now();
                    std::thread::sleep(quiet_length);
                    let samples = samples.lock().unwrap().clone();
                    outside = Some(window(&samples, (start, Instant::now())));
                }
            }
        }
        rows.push(Row {
            unlimited: unlimited.expect("taken in the rotation"),
            limited: limited.expect("taken in the rotation"),
            outside: outside.expect("measured in the rotation"),
        });
    }
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.join().expect("a client thread panicked")?;
    }
    server.shutdown().context("stop the daemon")?;
    print_rows(args, &rows, out)
}

/// A self-signed certificate for 127.0.0.1 and an administrator's token, written under `base`:
/// the daemon's TLS files (its certificate is also the CA a client trusts) and the token file.
fn tls_files(base: &Path) -> anyhow::Result<(stela_server::ServerTlsFiles, PathBuf)> {
    let key = rcgen::KeyPair::generate()?;
    let names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
    let cert = rcgen::CertificateParams::new(names)?.self_signed(&key)?;
    let (cert_path, key_path, token) = (
        base.join("daemon.pem"),
        base.join("daemon.key"),
        base.join("admin-token"),
    );
    std::fs::write(&cert_path, cert.pem())?;
    crate::harness::write_secret(&key_path, key.serialize_pem())?;
    crate::harness::write_secret(&token, "a-backup-benchmark-admin-token\n")?;
    let files = stela_server::ServerTlsFiles {
        cert: cert_path,
        key: key_path,
        client_ca: None,
    };
    Ok((files, token))
}

/// One backup into `to` at `max_rate` (of the daemon's directory, or with `remote` over its
/// socket as `stela backup --from` takes it), checked and removed: its totals and the clients'
/// window during it.
fn take_backup(
    (dir, address): (&Path, &Address),
    remote: Option<&Address>,
    to: &Path,
    max_rate: Option<u64>,
    samples: &Samples,
) -> anyhow::Result<Taken> {
    let start = Instant::now();
    let report = match remote {
        Some(remote) => stela::backup::backup_remote(remote, to, max_rate)?,
        None => stela::backup::backup(dir, address, to, max_rate)?,
    };
    let end = Instant::now();
    stela::backup::check(to).context("the backup just taken does not check")?;
    let on_disk = blocks_bytes(to)?;
    std::fs::remove_dir_all(to)?;
    let samples = samples.lock().unwrap().clone();
    Ok(Taken {
        seconds: report.elapsed.as_secs_f64(),
        read: report.read,
        written: report.written,
        on_disk,
        during: window(&samples, (start, end)),
    })
}

/// One client writes `mib` MiB of 4 KiB records into the log `filled`, then commits at `disk`.
fn fill(socket: &Path, mib: u64) -> anyhow::Result<()> {
    let options = WalOptions::default().durability(Durability::Disk);
    let wal: Wal<Vec<u8>> = Wal::open(socket, "filled", options)?;
    let record = vec![7u8; 4096];
    let mut last = stela_wal::Lsn::new(0);
    for _ in 0..mib * 256 {
        last = wal.append(&record)?;
    }
    if last.get() > 0 {
        wal.commit(last)?;
    }
    wal.close()?;
    Ok(())
}

fn commit_loop(
    socket: &Path,
    bytes: usize,
    stop: Arc<AtomicBool>,
    samples: Samples,
) -> std::thread::JoinHandle<anyhow::Result<()>> {
    let socket = socket.to_owned();
    std::thread::spawn(move || {
        let options = WalOptions::default().durability(Durability::Disk);
        let wal: Wal<Vec<u8>> = Wal::open(socket.as_path(), "orders", options)?;
        let record = vec![1u8; bytes];
        while !stop.load(Ordering::Relaxed) {
            let start = Instant::now();
            wal.append_durable(&record)?;
            let done = Instant::now();
            samples.lock().unwrap().push((done, done - start));
        }
        Ok(())
    })
}

fn window(samples: &[(Instant, Duration)], (start, end): (Instant, Instant)) -> Window {
    let mut latencies: Vec<Duration> = samples
        .iter()
        .filter(|(at, _)| *at >= start && *at < end)
        .map(|(_, latency)| *latency)
        .collect();
    latencies.sort();
    let p99 = latencies
        .get((latencies.len() * 99 / 100).min(latencies.len().saturating_sub(1)))
        .copied()
        .unwrap_or_default();
    Window {
        commits_per_s: latencies.len() as f64 / (end - start).as_secs_f64().max(1e-9),
        p99_us: p99.as_micros() as u64,
    }
}

/// Bytes of the blocks the files under `dir` take (holes excluded).
fn blocks_bytes(dir: &Path) -> std::io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let metadata = entry.metadata()?;
        total += if metadata.is_dir() {
            blocks_bytes(&entry.path())?
        } else {
            metadata.blocks() * 512
        };
    }
    Ok(total)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

fn print_rows(args: &BackupBenchArgs, rows: &[Row], out: &mut dyn Write) -> anyhow::Result<()> {
    let second = if args.from {
        let over = if args.tls {
            "TCP on loopback under TLS with an admin token"
        } else {
            "the daemon's Unix socket"
        };
        format!("`from` backups as `stela backup --from` takes them, over {over}, no limit (holes go as lengths)")
    } else {
        format!("limited backups at {} B/s", args.max_rate.get())
    };
    writeln!(
        out,
        "stela-bench backup: {} clients committing {} B records at disk, a {} MiB log filled first; {second}",
        args.clients, args.record_bytes, args.fill_mib
    )?;
    writeln!(
        out,
        "{:>6} {:>9} {:>8} {:>12} {:>12} {:>12} {:>9} {:>13} {:>11}",
        "repeat",
        "backup",
        "seconds",
        "read B",
        "written B",
        "on disk B",
        "MiB/s",
        "commits/s",
        "p99 us"
    )?;
    for (repeat, row) in rows.iter().enumerate() {
        let second = if args.from { "from" } else { "limited" };
        for (side, taken) in [("unlimited", &row.unlimited), (second, &row.limited)] {
            writeln!(
                out,
                "{:>6} {:>9} {:>8.2} {:>12} {:>12} {:>12} {:>9.0} {:>13.0} {:>11}",
                repeat,
                side,
                taken.seconds,
                taken.read,
                taken.written,
                taken.on_disk,
                taken.read as f64 / (1 << 20) as f64 / taken.seconds.max(1e-9),
                taken.during.commits_per_s,
                taken.during.p99_us
            )?;
        }
        writeln!(
            out,
            "{:>6} {:>9} {:>8} {:>12} {:>12} {:>12} {:>9} {:>13.0} {:>11}",
            repeat, "none", "-", "-", "-", "-", "-", row.outside.commits_per_s, row.outside.p99_us
        )?;
    }
    let of = |f: fn(&Row) -> f64| median(rows.iter().map(f).collect());
    writeln!(
        out,
        "median: unlimited {:.2} s at {:.0} commits/s (p99 {:.0} us); {} {:.2} s at {:.0} commits/s (p99 {:.0} us); no backup {:.0} commits/s (p99 {:.0} us)",
        of(|r| r.unlimited.seconds),
        of(|r| r.unlimited.during.commits_per_s),
        of(|r| r.unlimited.during.p99_us as f64),
        match (args.from, args.tls) {
            (true, true) => "from (TLS on loopback)",
            (true, false) => "from (over the socket)",
            _ => "limited",
        },
        of(|r| r.limited.seconds),
        of(|r| r.limited.during.commits_per_s),
        of(|r| r.limited.during.p99_us as f64),
        of(|r| r.outside.commits_per_s),
        of(|r| r.outside.p99_us as f64)
    )?;
    Ok(())
}
