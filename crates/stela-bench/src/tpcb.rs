//! `stela-bench tpcb`: TPC-B on stela-store, to compare the persistence services (classical
//! against decoupled checkpoints and page cleaning) at service intervals from very frequent to
//! rare, as in the decoupled-persistence paper's Figure 4.
//!
//! The database: per branch one branch row, 10 tellers and 100,000 accounts (as TPC-B scales
//! them), and a history that each transaction appends to; rows are 100 bytes (an 8-byte
//! balance, then filler). Each client works on a branch of its own, so transactions never
//! conflict and what is measured is the engine and the persistence services, not lock waits.
//! A transaction: add a random delta to a random account, to a random teller and to the branch
//! (each a read and a write), insert the history row, commit.
//!
//! The database is loaded once, closed cleanly (every page written, a checkpoint), and each run
//! starts from a copy of it, so every configuration starts from the same bytes. The buffer pool
//! holds the whole database (the paper's in-memory setting) unless `--pool-mb` says otherwise.
//! After each run the TPC-B invariant is checked: the sum of the account balances, of the
//! teller balances and of the branch balances each equal the sum of the history deltas.
//!
//! Peers, on the same transactions in the same run, each behind a feature: SQLite (`sqlite`,
//! below) and RocksDB's TransactionDB (`rocksdb`, [`crate::tpcb_rocksdb`]); the clients of
//! every system are driven by [`drive_clients`].
//!
//! `--durability disk`: the embedded log fdatasyncs each commit (group commit across clients);
//! `buffered`: the embedded log writes each commit to the OS without fdatasync (it survives the
//! process, not the machine; the daemon's `buffered` level is not used here).

use anyhow::{bail, Context};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use stela_store::{CheckpointKind, CleanerKind, Store, StoreOptions};
use stela_wal::SyncMode;

pub(crate) const TELLERS_PER_BRANCH: u32 = 10;
const ROW_BYTES: usize = 100;
/// Accounts per load transaction.
const LOAD_BATCH: u32 = 2_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    Classical,
    Decoupled,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DurabilityArg {
    Disk,
    Buffered,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SystemArg {
    #[value(name = "stela-store")]
    StelaStore,
    /// SQLite in WAL mode (`synchronous=FULL` for disk, `NORMAL` for buffered), its own
    /// automatic checkpoints; needs the `sqlite` feature.
    Sqlite,
    /// RocksDB's TransactionDB (pessimistic locking; `sync` writes for disk, unsynced for
    /// buffered), its own flushes and compactions; needs the `rocksdb` feature.
    Rocksdb,
}

#[derive(clap::Args, Debug, Clone)]
pub struct TpcbArgs {
    /// Systems to run, on the same transactions. SQLite and RocksDB have their own checkpoints
    /// (flushes) and no cleaner: each runs once per repeat, whatever `--checkpoints`,
    /// `--cleaner` and `--interval-ms` say.
    #[arg(long, value_delimiter = ',', default_value = "stela-store")]
    pub systems: Vec<SystemArg>,
    /// Clients, each on a branch of its own (the number of branches).
    #[arg(long, default_value_t = 2)]
    pub clients: u32,
    /// Seconds per run.
    #[arg(long, default_value_t = 5.0)]
    pub duration: f64,
    /// Checkpoint kinds to run.
    #[arg(long, value_delimiter = ',', default_value = "classical,decoupled")]
    pub checkpoints: Vec<Kind>,
    /// Page cleaners to run.
    #[arg(long, value_delimiter = ',', default_value = "classical,decoupled")]
    pub cleaner: Vec<Kind>,
    /// Intervals between checkpoints, and between cleaning rounds, in milliseconds.
    #[arg(
        long = "interval-ms",
        value_delimiter = ',',
        default_value = "1,10,100,1000,10000"
    )]
    pub interval_ms: Vec<u64>,
    /// Commit durability.
    #[arg(long, default_value = "disk")]
    pub durability: DurabilityArg,
    /// Percent of transactions whose account is at another client's branch (TPC-B's remote
    /// accounts: 15). 0, the default, is the paper's setting: every client on its own branch,
    /// so transactions never wait for each other's locks. With remote accounts, a transaction
    /// that loses a deadlock or a lock wait is rolled back and run again with new values.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub remote: u32,
    /// Accounts per branch (TPC-B: 100,000).
    #[arg(long, default_value_t = 100_000)]
    pub accounts: u32,
    /// Buffer pool size in MiB (default: room for the whole database after the runs).
    #[arg(long)]
    pub pool_mb: Option<usize>,
    /// Directory for the databases (default: a temporary folder in the current directory).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Runs per configuration; the configurations take turns, so a disturbance of the
    /// machine spreads over all of them, and the summary gives each one's median.
    #[arg(long, default_value_t = 1)]
    pub repeats: usize,
    /// One JSON object per run instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Save an SVG chart at PATH: tps by interval, one line per checkpoint kind and cleaner,
    /// the peers flat beside them (the paper's Figure 4).
    #[arg(long, value_name = "PATH")]
    pub chart: Option<PathBuf>,
}

/// One run's result.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TpcbRun {
    pub system: String,
    pub checkpoints: String,
    pub cleaner: String,
    pub interval_ms: u64,
    pub clients: u32,
    pub durability: String,
    /// Which of the `--repeats` runs of this configuration (from 1).
    pub repeat: usize,
    pub tps: f64,
    pub p50_us: u64,
    pub p99_us: u64,
    /// CPU time of the whole process (clients and services) during the run.
    pub cpu_s: f64,
}

pub(crate) fn branch_key(b: u32) -> Vec<u8> {
    format!("b{b:04}").into_bytes()
}

pub(crate) fn teller_key(b: u32, t: u32) -> Vec<u8> {
    format!("t{b:04}{t:02}").into_bytes()
}

pub(crate) fn account_key(b: u32, a: u32) -> Vec<u8> {
    format!("a{b:04}{a:06}").into_bytes()
}

pub(crate) fn history_key(b: u32, seq: u64) -> Vec<u8> {
    format!("h{b:04}{seq:012}").into_bytes()
}

/// A row: the balance, then filler to `ROW_BYTES`.
pub(crate) fn row(balance: i64) -> Vec<u8> {
    let mut row = vec![b' '; ROW_BYTES];
    row[..8].copy_from_slice(&balance.to_le_bytes());
    row
}

pub(crate) fn balance(row: &[u8]) -> anyhow::Result<i64> {
    let bytes: [u8; 8] = row
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .context("a row shorter than its balance")?;
    Ok(i64::from_le_bytes(bytes))
}

fn store_options(args: &TpcbArgs, checkpoints: Kind, cleaner: Kind, interval: u64) -> StoreOptions {
    let sync = match args.durability {
        DurabilityArg::Disk => SyncMode::Data,
        DurabilityArg::Buffered => SyncMode::None,
    };
    // Accounts take about 125 bytes each in the leaves; history rows as many per transaction.
    let pool_mb = args.pool_mb.unwrap_or_else(|| {
        let accounts_mb = (args.clients as usize * args.accounts as usize * 125) >> 20;
        accounts_mb * 2 + 64
    });
    let defaults = StoreOptions::default();
    let wal = defaults.wal.clone().sync(sync);
    defaults
        .wal(wal)
        .pool_pages(pool_mb * 1024 * 1024 / stela_store::PAGE_SIZE)
        .checkpoints(match checkpoints {
            Kind::Classical => CheckpointKind::Classical,
            Kind::Decoupled => CheckpointKind::Decoupled,
        })
        .cleaner(match cleaner {
            Kind::Classical => CleanerKind::Classical,
            Kind::Decoupled => CleanerKind::Decoupled,
        })
        .checkpoint_interval(Some(Duration::from_millis(interval)))
        .clean_interval(Some(Duration::from_millis(interval)))
}

/// Loads branches, tellers and accounts (all balances zero) and closes the store cleanly.
fn load(dir: &Path, args: &TpcbArgs) -> anyhow::Result<()> {
    let options = StoreOptions::default();
    let wal = options.wal.clone().sync(SyncMode::None);
    let store = Store::open(
        dir,
        store_options(args, Kind::Decoupled, Kind::Decoupled, 0)
            .wal(wal)
            .checkpoint_interval(None)
            .clean_interval(None),
    )?;
    for b in 0..args.clients {
        let mut txn = store.begin();
        txn.put(&branch_key(b), &row(0))?;
        for t in 0..TELLERS_PER_BRANCH {
            txn.put(&teller_key(b, t), &row(0))?;
        }
        txn.commit()?;
        let mut a = 0;
        while a < args.accounts {
            let mut txn = store.begin();
            for a in a..(a + LOAD_BATCH).min(args.accounts) {
                txn.put(&account_key(b, a), &row(0))?;
            }
            txn.commit()?;
            a += LOAD_BATCH;
        }
    }
    store.close()?;
    Ok(())
}

fn copy_dir(from: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
            // Synced now, so that writing the copy back does not compete with the run's
            // commits for the disk.
            std::fs::File::open(&target)?.sync_all()?;
        }
    }
    Ok(())
}

/// CPU time (user + system) of this process so far, from `/proc/self/stat`, whose fields 14
/// and 15 count clock ticks of `USER_HZ`, which is 100 on every Linux architecture we run on.
fn process_cpu_seconds() -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    // The command name (field 2) is in parentheses and may hold spaces: count after it.
    let after = stat.rsplit_once(')').context("/proc/self/stat")?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| -> anyhow::Result<f64> {
        Ok(fields.get(i).context("/proc/self/stat")?.parse::<u64>()? as f64)
    };
    // After the name, field 3 is at index 0: utime (14) at 11, stime (15) at 12.
    Ok((ticks(11)? + ticks(12)?) / 100.0)
}

/// A small, fast generator (xorshift64*), seeded per client: the benchmark needs no more.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn below(&mut self, n: u32) -> u32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        ((self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) % u64::from(n)) as u32
    }
}

/// A transaction's delta and account (branch, index within it) for the client of branch `b`:
/// the account is at another branch for `--remote` percent of the transactions.
pub(crate) fn delta_and_account(args: &TpcbArgs, b: u32, rng: &mut Rng) -> (i64, u32, u32) {
    let delta = i64::from(rng.below(1_999_999)) - 999_999;
    let branch = if args.clients > 1 && rng.below(100) < args.remote {
        (b + 1 + rng.below(args.clients - 1)) % args.clients
    } else {
        b
    };
    (delta, branch, rng.below(args.accounts))
}

/// One TPC-B transaction on branch `b`; returns the delta it applied.
fn transaction(
    store: &Store,
    args: &TpcbArgs,
    b: u32,
    seq: u64,
    rng: &mut Rng,
) -> stela_store::Result<i64> {
    let (delta, account_branch, a) = delta_and_account(args, b, rng);
    let account = account_key(account_branch, a);
    let teller = teller_key(b, rng.below(TELLERS_PER_BRANCH));
    let mut txn = store.begin();
    for key in [&account, &teller, &branch_key(b)] {
        let old = txn.get(key)?.map_or(0, |r| balance(&r).unwrap_or(0));
        txn.put(key, &row(old + delta))?;
    }
    txn.put(&history_key(b, seq), &row(delta))?;
    txn.commit()?;
    Ok(delta)
}

fn run_one(
    template: &Path,
    base: &Path,
    args: &TpcbArgs,
    checkpoints: Kind,
    cleaner: Kind,
    interval: u64,
    repeat: usize,
) -> anyhow::Result<TpcbRun> {
    let dir = base.join(format!(
        "run-{checkpoints:?}-{cleaner:?}-{interval}-{repeat}"
    ));
    copy_dir(template, &dir)?;
    let store = Store::open(&dir, store_options(args, checkpoints, cleaner, interval))?;
    let driven = drive_clients(
        args,
        |_| Ok(0u64),
        |seq, b, rng| loop {
            match transaction(&store, args, b, *seq, rng) {
                // Dropping the victim rolled it back: run a new transaction.
                Err(stela_store::Error::Deadlock { .. }) => continue,
                result => {
                    let delta = result.with_context(|| format!("client {b}, transaction {seq}"))?;
                    *seq += 1;
                    return Ok(delta);
                }
            }
        },
    )?;
    check_invariant(&store, args, driven.deltas)?;
    drop(store);
    std::fs::remove_dir_all(&dir)?;
    Ok(driven.into_run(
        "stela-store",
        &format!("{checkpoints:?}").to_lowercase(),
        &format!("{cleaner:?}").to_lowercase(),
        interval,
        args,
        repeat,
    ))
}

/// Sum of accounts = sum of tellers = sum of branches = sum of history deltas.
fn check_invariant(store: &Store, args: &TpcbArgs, deltas: i64) -> anyhow::Result<()> {
    let mut txn = store.begin();
    let sum = |txn: &mut stela_store::Transaction, prefix: &[u8]| -> anyhow::Result<i64> {
        let mut end = prefix.to_vec();
        *end.last_mut().expect("a prefix") += 1;
        let rows = txn.scan(
            std::ops::Bound::Included(prefix),
            std::ops::Bound::Excluded(&end[..]),
        )?;
        rows.iter().map(|(_, v)| balance(v)).sum()
    };
    let sums = [
        sum(&mut txn, b"a")?,
        sum(&mut txn, b"t")?,
        sum(&mut txn, b"b")?,
        sum(&mut txn, b"h")?,
    ];
    txn.commit()?;
    if sums.iter().any(|&s| s != deltas) {
        bail!(
            "TPC-B invariant broken with {} clients: accounts, tellers, branches, history sum to \
             {sums:?}, the clients applied {deltas}",
            args.clients
        );
    }
    Ok(())
}

pub fn run(args: &TpcbArgs, out: &mut impl Write) -> anyhow::Result<Vec<TpcbRun>> {
    if args.clients == 0 || args.accounts == 0 {
        bail!("--clients and --accounts must be at least 1");
    }
    let base = match &args.dir {
        Some(dir) => {
            std::fs::create_dir_all(dir)?;
            tempfile::tempdir_in(dir)?
        }
        None => tempfile::tempdir_in(".")
            .context("creating a scratch folder in the current directory")?,
    };
    let template = base.path().join("loaded");
    let loading = Instant::now();
    load(&template, args)?;
    if !args.json {
        writeln!(
            out,
            "TPC-B on stela-store: {} branches x {} accounts loaded in {:.1} s; {} s per run, \
             durability {:?}, {} % remote accounts",
            args.clients,
            args.accounts,
            loading.elapsed().as_secs_f64(),
            args.duration,
            args.durability,
            args.remote
        )?;
        writeln!(
            out,
            "{:<12} {:<18} {:<10} {:>8} {:>10} {:>8} {:>8} {:>7}",
            "system", "checkpts", "cleaner", "interval", "tps", "p50 us", "p99 us", "cpu s"
        )?;
    }
    let mut configs = Vec::new();
    for &checkpoints in &args.checkpoints {
        for &cleaner in &args.cleaner {
            for &interval in &args.interval_ms {
                configs.push((checkpoints, cleaner, interval));
            }
        }
    }
    let mut runs = Vec::new();
    for repeat in 1..=args.repeats.max(1) {
        for (system, peer_run) in [
            (SystemArg::Sqlite, sqlite_run as PeerRun),
            (SystemArg::Rocksdb, crate::tpcb_rocksdb::run as PeerRun),
        ] {
            if !args.systems.contains(&system) {
                continue;
            }
            let run = peer_run(base.path(), args, repeat)?;
            if args.json {
                writeln!(out, "{}", serde_json::to_string(&run)?)?;
            } else {
                write_row(out, &run)?;
            }
            out.flush()?;
            runs.push(run);
        }
        if !args.systems.contains(&SystemArg::StelaStore) {
            continue;
        }
        for &(checkpoints, cleaner, interval) in &configs {
            let run = run_one(
                &template,
                base.path(),
                args,
                checkpoints,
                cleaner,
                interval,
                repeat,
            )?;
            if args.json {
                writeln!(out, "{}", serde_json::to_string(&run)?)?;
            } else {
                write_row(out, &run)?;
            }
            out.flush()?;
            runs.push(run);
        }
    }
    if !args.json && args.repeats > 1 {
        writeln!(out, "median of {} runs per configuration:", args.repeats)?;
        let mut seen: Vec<(String, String, String, u64)> = Vec::new();
        for run in &runs {
            let config = (
                run.system.clone(),
                run.checkpoints.clone(),
                run.cleaner.clone(),
                run.interval_ms,
            );
            if seen.contains(&config) {
                continue;
            }
            let mut mine: Vec<&TpcbRun> = runs
                .iter()
                .filter(|r| {
                    (&r.system, &r.checkpoints, &r.cleaner, r.interval_ms)
                        == (&config.0, &config.1, &config.2, config.3)
                })
                .collect();
            mine.sort_by(|a, b| a.tps.total_cmp(&b.tps));
            write_row(out, mine[mine.len() / 2])?;
            seen.push(config);
        }
    }
    if let Some(path) = &args.chart {
        crate::tpcb_chart::save_tpcb_chart(&runs, path)?;
        if !args.json {
            writeln!(out, "chart: {}", path.display())?;
        }
    }
    Ok(runs)
}

fn write_row(out: &mut impl Write, run: &TpcbRun) -> anyhow::Result<()> {
    writeln!(
        out,
        "{:<12} {:<18} {:<10} {:>8} {:>10.0} {:>8} {:>8} {:>7.2}",
        run.system,
        run.checkpoints,
        run.cleaner,
        run.interval_ms,
        run.tps,
        run.p50_us,
        run.p99_us,
        run.cpu_s
    )?;
    Ok(())
}

/// Latencies in microseconds, sorted, to the run's percentiles.
fn percentiles(latencies: &mut [u32]) -> (u64, u64) {
    latencies.sort_unstable();
    let at = |p: f64| -> u64 {
        if latencies.is_empty() {
            return 0;
        }
        u64::from(latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)])
    };
    (at(0.50), at(0.99))
}

/// A peer's run: the same TPC-B transactions on another engine, loaded afresh.
type PeerRun = fn(&Path, &TpcbArgs, usize) -> anyhow::Result<TpcbRun>;

/// What the clients of one run did.
pub(crate) struct Driven {
    latencies: Vec<u32>,
    /// The sum of the deltas of every committed transaction: what the invariant checks.
    pub deltas: i64,
    elapsed: f64,
    cpu_s: f64,
}

impl Driven {
    pub(crate) fn into_run(
        mut self,
        system: &str,
        checkpoints: &str,
        cleaner: &str,
        interval_ms: u64,
        args: &TpcbArgs,
        repeat: usize,
    ) -> TpcbRun {
        let (p50_us, p99_us) = percentiles(&mut self.latencies);
        TpcbRun {
            system: system.into(),
            checkpoints: checkpoints.into(),
            cleaner: cleaner.into(),
            interval_ms,
            clients: args.clients,
            durability: format!("{:?}", args.durability).to_lowercase(),
            repeat,
            tps: self.latencies.len() as f64 / self.elapsed,
            p50_us,
            p99_us,
            cpu_s: self.cpu_s,
        }
    }
}

/// Runs one client thread per branch for `--duration` seconds: each opens its connection with
/// `open(branch)` and repeats `transaction(connection, branch, rng)`, which commits one TPC-B
/// transaction and returns its delta. A client's error ends the run with that error.
pub(crate) fn drive_clients<C>(
    args: &TpcbArgs,
    open: impl Fn(u32) -> anyhow::Result<C> + Sync,
    transaction: impl Fn(&mut C, u32, &mut Rng) -> anyhow::Result<i64> + Sync,
) -> anyhow::Result<Driven> {
    let stop = AtomicBool::new(false);
    let started = Instant::now();
    let cpu_before = process_cpu_seconds()?;
    let results: Vec<anyhow::Result<(Vec<u32>, i64)>> = std::thread::scope(|scope| {
        let clients: Vec<_> = (0..args.clients)
            .map(|b| {
                let (stop, open, transaction) = (&stop, &open, &transaction);
                scope.spawn(move || -> anyhow::Result<(Vec<u32>, i64)> {
                    let mut connection = open(b)?;
                    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ ((u64::from(b) + 1) * 7919));
                    let (mut latencies, mut deltas) = (Vec::with_capacity(1 << 16), 0i64);
                    while !stop.load(Ordering::Relaxed) {
                        let at = Instant::now();
                        deltas += transaction(&mut connection, b, &mut rng)?;
                        latencies.push(at.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
                    }
                    Ok((latencies, deltas))
                })
            })
            .collect();
        std::thread::sleep(Duration::from_secs_f64(args.duration));
        stop.store(true, Ordering::Relaxed);
        clients
            .into_iter()
            .map(|c| c.join().unwrap_or_else(|_| bail!("a client panicked")))
            .collect()
    });
    let elapsed = started.elapsed().as_secs_f64();
    let cpu_s = process_cpu_seconds()? - cpu_before;
    let (mut latencies, mut deltas) = (Vec::new(), 0i64);
    for result in results {
        let (l, d) = result?;
        latencies.extend(l);
        deltas += d;
    }
    Ok(Driven {
        latencies,
        deltas,
        elapsed,
        cpu_s,
    })
}

#[cfg(not(feature = "sqlite"))]
fn sqlite_run(_base: &Path, _args: &TpcbArgs, _repeat: usize) -> anyhow::Result<TpcbRun> {
    bail!("this stela-bench was built without SQLite: build it with `--features sqlite`")
}

/// The same transactions on SQLite: one connection per client, `BEGIN IMMEDIATE` (SQLite takes
/// one writer at a time; immediate avoids upgrade deadlocks), WAL mode, its automatic
/// checkpoints. Loaded afresh for each run.
#[cfg(feature = "sqlite")]
fn sqlite_run(base: &Path, args: &TpcbArgs, repeat: usize) -> anyhow::Result<TpcbRun> {
    use rusqlite::{params, Connection};
    let path = base.join(format!("sqlite-{repeat}.db"));
    let synchronous = match args.durability {
        DurabilityArg::Disk => "FULL",
        DurabilityArg::Buffered => "NORMAL",
    };
    let open = || -> anyhow::Result<Connection> {
        let connection = Connection::open(&path)?;
        connection.busy_timeout(Duration::from_secs(10))?;
        connection.pragma_update(None, "journal_mode", "WAL")?;
        connection.pragma_update(None, "synchronous", synchronous)?;
        Ok(connection)
    };
    {
        let mut connection = open()?;
        connection.execute_batch(
            "CREATE TABLE branches (bid INTEGER PRIMARY KEY, balance INTEGER, filler TEXT);
             CREATE TABLE tellers (tid INTEGER PRIMARY KEY, bid INTEGER, balance INTEGER, filler TEXT);
             CREATE TABLE accounts (aid INTEGER PRIMARY KEY, bid INTEGER, balance INTEGER, filler TEXT);
             CREATE TABLE history (hid INTEGER PRIMARY KEY, tid INTEGER, bid INTEGER, aid INTEGER,
                                   delta INTEGER, filler TEXT);",
        )?;
        let filler = " ".repeat(ROW_BYTES - 8);
        let load = connection.transaction()?;
        for b in 0..args.clients {
            load.execute(
                "INSERT INTO branches VALUES (?1, 0, ?2)",
                params![b, filler],
            )?;
            for t in 0..TELLERS_PER_BRANCH {
                let tid = b * TELLERS_PER_BRANCH + t;
                load.execute(
                    "INSERT INTO tellers VALUES (?1, ?2, 0, ?3)",
                    params![tid, b, filler],
                )?;
            }
            let mut insert = load.prepare("INSERT INTO accounts VALUES (?1, ?2, 0, ?3)")?;
            for a in 0..args.accounts {
                let aid = u64::from(b) * u64::from(args.accounts) + u64::from(a);
                insert.execute(params![aid, b, filler])?;
            }
        }
        load.commit()?;
    }
    let filler = " ".repeat(ROW_BYTES - 8);
    let driven = drive_clients(
        args,
        |_| open(),
        |connection, b, rng| {
            let (delta, account_branch, a) = delta_and_account(args, b, rng);
            let aid = u64::from(account_branch) * u64::from(args.accounts) + u64::from(a);
            let tid = b * TELLERS_PER_BRANCH + rng.below(TELLERS_PER_BRANCH);
            let txn =
                connection.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            txn.prepare_cached("UPDATE accounts SET balance = balance + ?1 WHERE aid = ?2")?
                .execute(params![delta, aid])?;
            let _balance: i64 = txn
                .prepare_cached("SELECT balance FROM accounts WHERE aid = ?1")?
                .query_row(params![aid], |row| row.get(0))?;
            txn.prepare_cached("UPDATE tellers SET balance = balance + ?1 WHERE tid = ?2")?
                .execute(params![delta, tid])?;
            txn.prepare_cached("UPDATE branches SET balance = balance + ?1 WHERE bid = ?2")?
                .execute(params![delta, b])?;
            txn.prepare_cached(
                "INSERT INTO history (tid, bid, aid, delta, filler) VALUES (?1, ?2, ?3, ?4, ?5)",
            )?
            .execute(params![tid, b, aid, delta, filler])?;
            txn.commit()?;
            Ok(delta)
        },
    )?;
    let deltas = driven.deltas;
    let connection = open()?;
    for table in ["accounts", "tellers", "branches"] {
        let sum: i64 = connection.query_row(
            &format!("SELECT COALESCE(SUM(balance), 0) FROM {table}"),
            [],
            |row| row.get(0),
        )?;
        if sum != deltas {
            bail!("SQLite: TPC-B invariant broken: {table} sum to {sum}, the clients applied {deltas}");
        }
    }
    let history: i64 =
        connection.query_row("SELECT COALESCE(SUM(delta), 0) FROM history", [], |row| {
            row.get(0)
        })?;
    if history != deltas {
        bail!("SQLite: history sums to {history}, the clients applied {deltas}");
    }
    drop(connection);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    Ok(driven.into_run("sqlite", "wal-autocheckpoint", "none", 0, args, repeat))
}
