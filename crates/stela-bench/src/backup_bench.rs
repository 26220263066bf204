//! `stela-bench backup`: time and bytes of `stela backup` of a daemon under load, and what the
//! backup costs the clients committing meanwhile.
//!
//! A daemon runs in this process on a fresh directory; one client fills a log with `--fill`
//! of 4 KiB records (buffered, then one `disk` commit), then `--clients` clients commit
//! `--record-bytes` records at `disk` to a second log until the end. Each repeat takes a backup
//! (`stela::backup::backup`, the code `stela backup` runs) into a new directory, checks it as
//! `stela restore --check` does, and measures a window of the same length without a backup;
//! which comes first alternates. Reported per repeat: seconds, bytes read and written (the
//! copies' holes excluded), the backup directory's blocks on disk, and the clients' commits/s
//! and p99 commit latency inside and outside the backup. Medians at the end.

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
}

/// One commit: when it returned and how long it took.
type Samples = Arc<Mutex<Vec<(Instant, Duration)>>>;

struct Row {
    seconds: f64,
    read: u64,
    written: u64,
    on_disk: u64,
    during: Window,
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
    let server = stela_server::Server::start(config).context("start the daemon")?;
    let socket = server.socket_path().to_owned();
    fill(&socket, args.fill_mib)?;
    let stop = Arc::new(AtomicBool::new(false));
    let samples = Samples::default();
    let clients: Vec<_> = (0..args.clients)
        .map(|_| commit_loop(&socket, args.record_bytes, stop.clone(), samples.clone()))
        .collect();
    std::thread::sleep(Duration::from_secs(1));
    let (mut rows, mut last) = (Vec::new(), Duration::from_secs(2));
    for repeat in 0..args.repeats {
        let backup_first = repeat % 2 == 0;
        let quiet = |length: Duration| {
            let start = Instant::now();
            std::thread::sleep(length);
            (start, Instant::now())
        };
        let outside = if backup_first {
            None
        } else {
            Some(quiet(last))
        };
        let to = base.path().join(format!("backup-{repeat}"));
        let start = Instant::now();
        let report = stela::backup::backup(&dir, &Address::Unix(socket.clone()), &to)?;
        let during = (start, Instant::now());
        stela::backup::check(&to).context("the backup just taken does not check")?;
        let on_disk = blocks_bytes(&to)?;
        std::fs::remove_dir_all(&to)?;
        last = report.elapsed;
        let outside = outside.unwrap_or_else(|| quiet(last));
        let samples = samples.lock().unwrap().clone();
        rows.push(Row {
            seconds: report.elapsed.as_secs_f64(),
            read: report.read,
            written: report.written,
            on_disk,
            during: window(&samples, during),
            outside: window(&samples, outside),
        });
    }
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.join().expect("a client thread panicked")?;
    }
    server.shutdown().context("stop the daemon")?;
    print_rows(args, &rows, out)
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
    writeln!(
        out,
        "stela-bench backup: {} clients committing {} B records at disk, a {} MiB log filled first",
        args.clients, args.record_bytes, args.fill_mib
    )?;
    writeln!(
        out,
        "{:>6} {:>8} {:>12} {:>12} {:>12} {:>9} {:>13} {:>13} {:>11} {:>11}",
        "repeat",
        "seconds",
        "read B",
        "written B",
        "on disk B",
        "MiB/s",
        "commits/s in",
        "commits/s out",
        "p99 us in",
        "p99 us out"
    )?;
    for (repeat, row) in rows.iter().enumerate() {
        writeln!(
            out,
            "{:>6} {:>8.2} {:>12} {:>12} {:>12} {:>9.0} {:>13.0} {:>13.0} {:>11} {:>11}",
            repeat,
            row.seconds,
            row.read,
            row.written,
            row.on_disk,
            row.read as f64 / (1 << 20) as f64 / row.seconds.max(1e-9),
            row.during.commits_per_s,
            row.outside.commits_per_s,
            row.during.p99_us,
            row.outside.p99_us
        )?;
    }
    let of = |f: fn(&Row) -> f64| median(rows.iter().map(f).collect());
    writeln!(
        out,
        "median: {:.2} s, {:.0} B written, commits/s {:.0} during a backup and {:.0} outside, p99 {:.0} us during and {:.0} us outside",
        of(|r| r.seconds),
        of(|r| r.written as f64),
        of(|r| r.during.commits_per_s),
        of(|r| r.outside.commits_per_s),
        of(|r| r.during.p99_us as f64),
        of(|r| r.outside.p99_us as f64)
    )?;
    Ok(())
}
