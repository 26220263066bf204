//! `stela-bench power-fail`: how long the emergency flush of a full dirty set takes on this
//! disk, against the budget (half the power window) the daemon promised at start.
//!
//! For each pool size: start a daemon on a directory of the real disk, stall its disk (a gate in
//! the storage layer, so the flusher cannot drain while we fill), append 4 KiB `buffered` records
//! from a client until the pool holds its whole dirty cap and appends start to wait, then open the
//! gate and announce the power failure at once. The flush time runs from the notice until every
//! byte is written and fdatasync'ed, including the write that was stuck at the gate. Each size is
//! repeated; the report gives every run and the worst.
//!
//! With `--warm-up-ms T`, `buffered` appends run for T ms with the disk open first, as a daemon
//! in service writes before the notice comes (its flushes are what a live cap is kept by).
//!
//! With `--disk-load N`, a second daemon on the same disk (its own directory, not gated) takes
//! `disk` commits of 4 KiB records from N clients for the whole run: the measured daemon's
//! start-up measurement, the filling and the emergency flush all share the device with them.

use anyhow::Context;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use stela_client::{Durability, Wal, WalOptions};
use stela_server::{DaemonConfig, Server};
use stela_wal::storage::{GatedStorage, StdStorage, Storage};

#[derive(clap::Args, Debug, Clone)]
pub struct PowerBenchArgs {
    /// Pool sizes to try, as buffer counts (each buffer 512 KiB).
    #[arg(long, value_delimiter = ',', default_value = "6,24,64")]
    pub buffers: Vec<usize>,
    /// Power window in milliseconds (the budget is half of it).
    #[arg(long, default_value_t = 50)]
    pub power_window: u64,
    /// Runs per pool size.
    #[arg(long, default_value_t = 5)]
    pub repeats: usize,
    /// Directory on the disk to measure (default: a temporary folder in the current directory).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// One JSON object per run.
    #[arg(long)]
    pub json: bool,
    /// Milliseconds of `buffered` appends written with the disk open before it is stalled, so
    /// the daemon sees the disk as it is now before the pool fills (0: none).
    #[arg(long, default_value_t = 0)]
    pub warm_up_ms: u64,
    /// Clients committing 4 KiB records at `disk` to a second daemon on the same disk during
    /// every run (0: none).
    #[arg(long, default_value_t = 0)]
    pub disk_load: usize,
}

/// One emergency flush.
#[derive(Debug, Clone)]
pub struct PowerRun {
    pub buffers: usize,
    pub cap_bytes: u64,
    pub flushed_bytes: u64,
    pub micros: u64,
    pub budget_micros: u64,
    pub measured_rate: u64,
}

pub fn run(args: PowerBenchArgs) -> anyhow::Result<Vec<PowerRun>> {
    let base = crate::harness::scratch_dir(args.dir.as_deref())?;
    if !args.json {
        println!(
            "emergency flush of a full dirty set; power window {} ms (budget {} ms)",
            args.power_window,
            args.power_window as f64 / 2.0
        );
        println!(
            "{:>8} {:>12} {:>12} {:>10} {:>10} {:>10} {:>12}",
            "buffers", "cap B", "flushed B", "ms", "budget ms", "fraction", "disk MB/s"
        );
    }
    let load = match args.disk_load {
        0 => None,
        clients => Some(DiskLoad::start(&base.path().join("load"), clients)?),
    };
    let mut runs = Vec::new();
    for &buffers in &args.buffers {
        for repeat in 0..args.repeats {
            let dir = base.path().join(format!("b{buffers}-r{repeat}"));
            let run = one_run(
                &dir,
                buffers,
                Duration::from_millis(args.power_window),
                Duration::from_millis(args.warm_up_ms),
            )?;
            if args.json {
                println!(
                    "{}",
                    serde_json::json!({
                        "buffers": run.buffers, "cap_bytes": run.cap_bytes, "flushed_bytes": run.flushed_bytes,
                        "micros": run.micros, "budget_micros": run.budget_micros, "measured_write_bytes_per_s": run.measured_rate,
                    })
                );
            } else {
                println!(
                    "{:>8} {:>12} {:>12} {:>10.3} {:>10.1} {:>10.2} {:>12.1}",
                    run.buffers,
                    run.cap_bytes,
                    run.flushed_bytes,
                    run.micros as f64 / 1e3,
                    run.budget_micros as f64 / 1e3,
                    run.micros as f64 / run.budget_micros as f64,
                    run.measured_rate as f64 / 1e6
                );
            }
            runs.push(run);
        }
    }
    if let Some(load) = load {
        let commits = load.stop()?;
        if !args.json {
            println!(
                "concurrent load: {} clients committed {commits} records at disk",
                args.disk_load
            );
        }
    }
    if !args.json {
        if let Some(worst) = runs.iter().max_by(|a, b| {
            (a.micros as f64 / a.budget_micros as f64)
                .total_cmp(&(b.micros as f64 / b.budget_micros as f64))
        }) {
            println!(
                "worst: {} buffers, {:.3} ms of a {:.1} ms budget ({:.0} %)",
                worst.buffers,
                worst.micros as f64 / 1e3,
                worst.budget_micros as f64 / 1e3,
                worst.micros as f64 / worst.budget_micros as f64 * 100.0
            );
        }
    }
    Ok(runs)
}

fn one_run(
    dir: &Path,
    buffers: usize,
    window: Duration,
    warm_up: Duration,
) -> anyhow::Result<PowerRun> {
    std::fs::create_dir_all(dir)?;
    let gate = GatedStorage::new(Arc::new(StdStorage));
    let storage: Arc<dyn Storage> = Arc::new(gate.clone());
    let mut config = DaemonConfig::new(dir);
    config.buffers = buffers;
    config.power_window = window;
    config.storage = storage;
    // Whole buffers only, and no timed flush: otherwise the run the stalled flusher holds is a
    // small one pinning a whole buffer, and the pool cannot reach its cap.
    config.write_threshold = config.buffer_bytes;
    config.flush_interval = Duration::from_secs(600);
    let server = Server::start(config).context("starting the daemon")?;
    let cap = server.status().dirty_cap;
    let wal: Wal<Vec<u8>> = Wal::open(
        server.socket_path(),
        "power",
        WalOptions::default().durability(Durability::Buffered),
    )?;
    // One record first, so the log exists before the gate closes (creating it writes a header).
    wal.append_durable(&vec![0u8; 16])?;
    wal.commit_at(wal.last_lsn()?, Durability::Disk)?;
    let record = vec![0xa5u8; 4000];
    let warm_until = Instant::now() + warm_up;
    while Instant::now() < warm_until {
        wal.append(&record)?;
    }
    wal.commit_at(wal.last_lsn()?, Durability::Disk)?;
    // The warm-up may have waited for space already: the pool is full once appends wait anew.
    let waited_before = server.status().appends_waited;
    gate.stall();
    let filler = std::thread::spawn(move || {
        // Appends until the daemon refuses (power failing) or the connection ends.
        while wal.append(&record).is_ok() {}
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = server.status();
        if status.appends_waited > waited_before {
            break;
        }
        if Instant::now() > deadline {
            gate.release();
            let _ = server.power_fail();
            anyhow::bail!(
                "the pool did not fill in 30 s: {} of {} B",
                status.dirty_bytes,
                status.dirty_cap.bytes
            );
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    // The cap in force when the pool filled: the live one, which flushes may have lowered.
    let live_cap = server.status().live_dirty_cap.bytes;
    gate.release();
    let flush = server.power_fail();
    filler
        .join()
        .map_err(|_| anyhow::anyhow!("the filler thread panicked"))?;
    anyhow::ensure!(
        flush.failures.is_empty(),
        "flush failures: {:?}",
        flush.failures
    );
    server.shutdown().map_err(|e| anyhow::anyhow!(e))?;
    let _ = std::fs::remove_dir_all(dir);
    Ok(PowerRun {
        buffers,
        cap_bytes: if live_cap > 0 { live_cap } else { cap.bytes },
        flushed_bytes: flush.bytes,
        micros: flush.micros,
        budget_micros: flush.budget_micros,
        measured_rate: cap.measured_write_bytes_per_s,
    })
}

/// The concurrent `disk` load: a second daemon in `dir` and its committing clients.
struct DiskLoad {
    server: Server,
    stop: Arc<std::sync::atomic::AtomicBool>,
    clients: Vec<std::thread::JoinHandle<anyhow::Result<u64>>>,
}

impl DiskLoad {
    fn start(dir: &Path, clients: usize) -> anyhow::Result<DiskLoad> {
        std::fs::create_dir_all(dir)?;
        let mut config = DaemonConfig::new(dir);
        // The load's own cap does not matter here: no measuring flush for it.
        config.assume_write_rate = Some(500 << 20);
        let server = Server::start(config).context("starting the load daemon")?;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let clients = (0..clients)
            .map(|index| {
                let socket = server.socket_path().to_path_buf();
                let stop = Arc::clone(&stop);
                std::thread::spawn(move || -> anyhow::Result<u64> {
                    let wal: Wal<Vec<u8>> = Wal::open(
                        socket.as_path(),
                        &format!("load-{index}"),
                        WalOptions::default().durability(Durability::Disk),
                    )?;
                    let record = vec![0x3cu8; 4000];
                    let mut commits = 0;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        wal.append_durable(&record)?;
                        commits += 1;
                    }
                    Ok(commits)
                })
            })
            .collect();
        Ok(DiskLoad {
            server,
            stop,
            clients,
        })
    }

    /// Stops the clients and the daemon; returns how many records they committed.
    fn stop(self) -> anyhow::Result<u64> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut commits = 0;
        for client in self.clients {
            commits += client
                .join()
                .map_err(|_| anyhow::anyhow!("a load client panicked"))??;
        }
        self.server.shutdown().map_err(|e| anyhow::anyhow!(e))?;
        Ok(commits)
    }
}
