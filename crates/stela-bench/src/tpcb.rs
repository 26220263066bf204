//! `stela-bench tpcb`: TPC-B on stela-store, to compare the persistence services (classical
//! against decoupled checkpoints and page cleaning) at service intervals from very frequent to
//! rare, as in the decoupled-persistence paper's Figure 4.
//!
//! The database: per branch one branch row, 10 tellers and 100,000 accounts (as TPC-B scales
//! them), and a history that each transaction appends to; rows are 100 bytes (an 8-byte
//! balance, then filler). Each client works on a branch of its own, so transactions never
//! conflict and what is measured is the engine and the persistence services, not lock waits.
//! A transaction: add a random delta to a random account, to a random teller and to the branch
//! (each a read and a write: stela-store's `Transaction::update`, RocksDB's `get_for_update`
//! then `put`, SQLite's `UPDATE ... SET balance = balance + ?`, each locking the row for
//! writing from the read on), insert the history row, commit.
//!
//! The database is loaded once, closed cleanly (every page written, a checkpoint), and each run
//! starts from a copy of it, so every configuration starts from the same bytes. The buffer pool
//! holds the whole database (the paper's in-memory setting) unless `--pool-mb` says otherwise;
//! a run whose pool had to evict says so on stderr.
//!
//! `--interval-ms` paces checkpoints and cleaning rounds together, or with `--vary` one of them
//! while the other runs every `--fixed-interval-ms`: the paper's Figure 4 varies checkpoints
//! only, and a 1 ms cleaner costs far more than a 1 ms checkpoint, so varying both at once
//! reads the cleaner's cost into the checkpoint lines. A run at an interval longer than
//! `--duration` runs that service once at most: give runs several times the longest interval
//! (a 12 s run at 10 s cleans once, late, and reads as if the cleaner cost nothing). After the
//! medians come the lines' readings (`tpcb_chart::readings`): each line's spread across the
//! intervals, and decoupled against classical at the shortest interval.
//! After each run the TPC-B invariant is checked: the sum of the account balances, of the
//! teller balances and of the branch balances each equal the sum of the history deltas.
//!
//! Peers, on the same transactions in the same run, each behind a feature: SQLite (`sqlite`,
//! below) and RocksDB's TransactionDB (`rocksdb`, [`crate::tpcb_rocksdb`]), each with a cache
//! as large as the store's pool (SQLite's page cache, RocksDB's block cache); the clients of
//! every system are driven by [`drive_clients`].
//!
//! `--durability disk`: the embedded log fdatasyncs each commit (group commit across clients);
//! `buffered`: the embedded log writes each commit to the OS without fdatasync (it survives the
//! process, not the machine; the daemon's `buffered` level is not used here).

use anyhow::{bail, Context};
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};
use stela_store::{CheckpointKind, CleanerKind, Store, StoreOptions};
use stela_wal::SyncMode;

use crate::neighbour::{Neighbour, NeighbourKind};
use crate::tpcb_schema::pool_mb;
use crate::tpcb_schema::{
    account_key, balance, branch_key, delta_and_account, drive_clients, history_key, row,
    teller_key, Rng, TELLERS_PER_BRANCH,
};
pub use crate::tpcb_schema::{DurabilityArg, Kind, SystemArg, TpcbArgs, TpcbRun, Varied};

/// Accounts per load transaction.
const LOAD_BATCH: u32 = 2_000;

fn store_options(args: &TpcbArgs, checkpoints: Kind, cleaner: Kind, interval: u64) -> StoreOptions {
    let sync = match args.durability {
        DurabilityArg::Disk => SyncMode::Data,
        DurabilityArg::Buffered => SyncMode::None,
    };
    let pool_mb = pool_mb(args);
    let (checkpoint_ms, clean_ms) = args.vary.intervals(interval, args.fixed_interval_ms);
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
        .checkpoint_interval(Some(Duration::from_millis(checkpoint_ms)))
        .clean_interval(Some(Duration::from_millis(clean_ms)))
        // The TPC-B lines measure the services they name, without the log archive (off by
        // default until the archive became a default; its cost is tpcb-crash's to measure).
        .archive(false)
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
            copy_file_by_pages(&entry.path(), &target)?;
        }
    }
    Ok(())
}

/// Copies the file `from` to the new file `to` in writes of one page each, and syncs it, so
/// that writing the copy back does not compete with the run's commits for the disk.
///
/// Why page by page: the copy's pages stay in the OS's cache for the run, and should sit there
/// as the store's own 8 KiB writes would have left them. After `std::fs::copy`, the kernel's
/// `ext4_block_write_begin` (which walks every block of the large folio a write lands in) took
/// 12 % of the decoupled cleaner's thread at 1 ms rounds, and dropping the copy's cache before
/// the run made it vanish from the profile (perf, ext4 on Linux 6.18). An 8 KiB write into a
/// file written in one 12 MiB write took 3.6-3.8 us, into one written 8 KiB at a time 1.2 us.
/// A cost of how the benchmark copied its files, not of the store.
fn copy_file_by_pages(from: &Path, to: &Path) -> anyhow::Result<()> {
    use std::io::Read;
    let mut source = std::fs::File::open(from)?;
    let mut copy = std::fs::File::create_new(to)?;
    let mut page = vec![0u8; stela_store::PAGE_SIZE];
    loop {
        let mut filled = 0;
        while filled < page.len() {
            match source.read(&mut page[filled..])? {
                0 => break,
                read => filled += read,
            }
        }
        if filled == 0 {
            break;
        }
        copy.write_all(&page[..filled])?;
    }
    copy.sync_all()?;
    Ok(())
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
    transfer(store, b, seq, delta, &account, &teller)?;
    Ok(delta)
}

/// The body of a TPC-B transaction on stela-store, its choices made (the crash test runs the
/// same): `delta` added to the account, the teller and branch `b`, history row `seq`, commit.
pub(crate) fn transfer(
    store: &Store,
    b: u32,
    seq: u64,
    delta: i64,
    account: &[u8],
    teller: &[u8],
) -> stela_store::Result<()> {
    let mut txn = store.begin();
    for key in [account, teller, &branch_key(b)] {
        txn.update(key, |old| {
            Some(row(old.map_or(0, |r| balance(r).unwrap_or(0)) + delta))
        })?;
    }
    txn.put(&history_key(b, seq), &row(delta))?;
    txn.commit()
}

fn run_one(
    template: &Path,
    base: &Path,
    args: &TpcbArgs,
    (checkpoints, cleaner, interval): (Kind, Kind, u64),
    repeat: usize,
    on_daemon: bool,
    neighbour_kind: Option<NeighbourKind>,
) -> anyhow::Result<TpcbRun> {
    // Short: the daemon's socket goes in it, and a Unix socket's path has room for about a
    // hundred bytes (a test's temporary directory in a deep checkout came within six).
    let kind = |kind: Kind| match kind {
        Kind::Classical => 'c',
        Kind::Decoupled => 'd',
    };
    let beside = match neighbour_kind {
        None => "",
        Some(NeighbourKind::Memory) => "-m",
        Some(NeighbourKind::Compute) => "-c",
    };
    let dir = base.join(format!(
        "run-{}{}-{interval}-{repeat}{beside}",
        kind(checkpoints),
        kind(cleaner)
    ));
    copy_dir(template, &dir)?;
    let options = store_options(args, checkpoints, cleaner, interval);
    // On the daemon: the loaded log becomes the daemon's log `store` (the same files: a
    // daemon's log directory is an embedded log's).
    let daemon = if on_daemon {
        std::fs::create_dir_all(dir.join("daemon").join("logs"))?;
        std::fs::rename(
            dir.join("log"),
            dir.join("daemon").join("logs").join("store"),
        )?;
        let mut config = stela_server::DaemonConfig::new(dir.join("daemon"));
        config.assume_write_rate = Some(500 << 20);
        Some(stela_server::Server::start(config).context("starting the daemon")?)
    } else {
        None
    };
    let store = match &daemon {
        Some(daemon) => Store::open_on_daemon(
            &dir,
            daemon.socket_path(),
            "store",
            stela_client::WalOptions::default().durability(match args.durability {
                DurabilityArg::Disk => stela_client::Durability::Disk,
                DurabilityArg::Buffered => stela_client::Durability::Buffered,
            }),
            options,
        )?,
        None => Store::open(&dir, options)?,
    };
    // Beside the clients only, not the store's opening and closing.
    let neighbour = neighbour_kind
        .map(|kind| Neighbour::start(kind, args.neighbour_busy_percent))
        .transpose()?;
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
    drop(neighbour);
    check_invariant(&store, args, driven.deltas)?;
    let evictions = store.pool_stats().evictions;
    if evictions > 0 {
        // The paper's setting is a pool that holds the whole database: say when a run left it,
        // since eviction on the transactions' path is then part of what was measured.
        eprintln!(
            "stela-bench tpcb: the buffer pool evicted {evictions} pages in run {repeat} of \
             {checkpoints:?}/{cleaner:?} at {interval} ms: the database outgrew it (--pool-mb)"
        );
    }
    drop(store);
    if let Some(daemon) = daemon {
        daemon
            .shutdown()
            .map_err(|e| anyhow::anyhow!("stopping the daemon: {e}"))?;
    }
    std::fs::remove_dir_all(&dir)?;
    let system = if on_daemon {
        "stela-store-daemon"
    } else {
        "stela-store"
    };
    let system = match neighbour_kind {
        Some(kind) => format!("{system}+{}", kind.label()),
        None => system.to_string(),
    };
    Ok(driven.into_run(
        &system,
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
        let rows = txn
            .scan(
                std::ops::Bound::Included(prefix),
                std::ops::Bound::Excluded(&end[..]),
            )
            .collect::<stela_store::Result<Vec<_>>>()?;
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
    if args.pin_clients {
        crate::tpcb_schema::ClientCpus::of_process()?.keep_others_off(args.clients)?;
    }
    let base = crate::harness::scratch_dir(args.dir.as_deref())?;
    let template = base.path().join("loaded");
    let loading = Instant::now();
    load(&template, args)?;
    if !args.json {
        writeln!(
            out,
            "TPC-B on stela-store: {} branches x {} accounts loaded in {:.1} s; {} s per run, \
             durability {:?}, {} % remote accounts, buffer pool (and peers' caches) {} MiB; interval: the {}",
            args.clients,
            args.accounts,
            loading.elapsed().as_secs_f64(),
            args.duration,
            args.durability,
            args.remote,
            pool_mb(args),
            args.vary.pacing(args.fixed_interval_ms)
        )?;
        if args.pin_clients {
            writeln!(
                out,
                "--pin-clients: each client on a CPU of its own, every other thread on the rest \
                 (a diagnostic: the must-reach lines run unpinned)"
            )?;
        }
        if let Some(kind) = args.neighbour {
            writeln!(
                out,
                "--neighbour {}: each configuration also runs beside a thread that shares \
                 nothing with the store, busy {} % of each 10 ms (a diagnostic)",
                kind.label(),
                args.neighbour_busy_percent
            )?;
        }
        writeln!(
            out,
            "{:<18} {:<10} {:<10} {:>8} {:>10} {:>8} {:>8} {:>7}",
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
    let mut report = |run: TpcbRun| -> anyhow::Result<()> {
        if args.json {
            writeln!(out, "{}", serde_json::to_string(&run)?)?;
        } else {
            write_row(out, &run)?;
        }
        out.flush()?;
        runs.push(run);
        Ok(())
    };
    for repeat in 1..=args.repeats.max(1) {
        for (system, peer_run) in [
            (SystemArg::Sqlite, sqlite_run as PeerRun),
            (SystemArg::Rocksdb, crate::tpcb_rocksdb::run as PeerRun),
        ] {
            if !args.systems.contains(&system) {
                continue;
            }
            report(peer_run(base.path(), args, repeat)?)?;
        }
        for (system, on_daemon) in [
            (SystemArg::StelaStore, false),
            (SystemArg::StelaStoreDaemon, true),
        ] {
            if !args.systems.contains(&system) {
                continue;
            }
            // Every other repeat runs the configurations in reverse (A B C, C B A, ...), so a
            // drift of the machine over a repeat (minutes at long durations) falls on every
            // interval alike instead of always favouring the ones that run first.
            let mut order: Vec<_> = configs.clone();
            if repeat % 2 == 0 {
                order.reverse();
            }
            for &config in &order {
                // With a neighbour, each configuration runs beside it and alone, the two
                // taking turns (which goes first alternates with the repeats).
                let mut beside = vec![None];
                if let Some(kind) = args.neighbour {
                    beside.insert(repeat % 2, Some(kind));
                }
                for neighbour in beside {
                    report(run_one(
                        &template,
                        base.path(),
                        args,
                        config,
                        repeat,
                        on_daemon,
                        neighbour,
                    )?)?;
                }
            }
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
    if !args.json {
        for reading in crate::tpcb_chart::readings(&runs) {
            writeln!(out, "{reading}")?;
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
        "{:<18} {:<10} {:<10} {:>8} {:>10.0} {:>8} {:>8} {:>7.2}",
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

/// A peer's run: the same TPC-B transactions on another engine, loaded afresh.
type PeerRun = fn(&Path, &TpcbArgs, usize) -> anyhow::Result<TpcbRun>;

#[cfg(not(feature = "sqlite"))]
fn sqlite_run(_base: &Path, _args: &TpcbArgs, _repeat: usize) -> anyhow::Result<TpcbRun> {
    bail!("this stela-bench was built without SQLite: build it with `--features sqlite`")
}

/// The same transactions on SQLite: one connection per client, `BEGIN IMMEDIATE` (SQLite takes
/// one writer at a time; immediate avoids upgrade deadlocks), WAL mode, its automatic
/// checkpoints. Loaded afresh for each run.
#[cfg(feature = "sqlite")]
fn sqlite_run(base: &Path, args: &TpcbArgs, repeat: usize) -> anyhow::Result<TpcbRun> {
    use crate::tpcb_schema::ROW_BYTES;
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
        // Negative: KiB. SQLite's default is 2 MiB; the store's pool holds the database.
        connection.pragma_update(None, "cache_size", -((pool_mb(args) as i64) << 10))?;
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
            // SQLite's busy handler is not fair: under 16 writers one connection can wait
            // out its whole timeout for the write lock (a 30 s run failed so). Nothing is
            // done before the lock is held, so wait on: a retry, as an application would.
            let txn = loop {
                match connection.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                {
                    Err(rusqlite::Error::SqliteFailure(error, _))
                        if error.code == rusqlite::ErrorCode::DatabaseBusy => {}
                    begun => break begun?,
                }
            };
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tpcb_schema::HISTORY_ROOM_TPS;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        tpcb: TpcbArgs,
    }

    fn args(extra: &[&str]) -> TpcbArgs {
        Cli::parse_from(std::iter::once("tpcb").chain(extra.iter().copied())).tpcb
    }

    fn intervals(options: &StoreOptions) -> (Option<Duration>, Option<Duration>) {
        (options.checkpoint_interval, options.clean_interval)
    }

    #[test]
    fn the_interval_paces_the_service_vary_names_and_the_other_keeps_the_fixed_one() {
        let ms = |n| Some(Duration::from_millis(n));
        let run = |extra: &[&str]| {
            let args = args(extra);
            intervals(&store_options(&args, Kind::Decoupled, Kind::Decoupled, 7))
        };
        assert_eq!(run(&[]), (ms(7), ms(7)));
        assert_eq!(run(&["--vary", "checkpoints"]), (ms(7), ms(1000)));
        assert_eq!(
            run(&["--vary", "cleaner", "--fixed-interval-ms", "50"]),
            (ms(50), ms(7))
        );
    }

    #[test]
    fn the_default_pool_has_room_for_the_history_a_longer_run_appends() {
        let pages = |extra: &[&str]| {
            let args = args(extra);
            store_options(&args, Kind::Decoupled, Kind::Decoupled, 1).pool_pages
        };
        let (short, long) = (pages(&["--duration", "3"]), pages(&["--duration", "12"]));
        // 9 s more at 150,000 transactions/s, about 125 bytes of history row each.
        let history_pages = (9.0 * HISTORY_ROOM_TPS * 125.0) as usize / stela_store::PAGE_SIZE;
        assert!(long - short >= history_pages - 128, "{short} -> {long}");
        assert_eq!(
            pages(&["--pool-mb", "64"]),
            64 * 1024 * 1024 / stela_store::PAGE_SIZE
        );
    }

    #[test]
    fn pinned_clients_run_alone_on_their_cpus_and_other_threads_elsewhere() {
        use rustix::thread::{sched_getaffinity, CpuSet};
        let args = args(&["--clients", "1", "--pin-clients", "--duration", "0.05"]);
        let cpus = crate::tpcb_schema::ClientCpus::of_process().unwrap();
        // Fails (with the reason) on a one-CPU machine: there is nothing to pin apart there.
        cpus.keep_others_off(1).unwrap();
        let others = sched_getaffinity(None).unwrap();
        let seen: std::sync::Mutex<Option<CpuSet>> = std::sync::Mutex::new(None);
        crate::tpcb_schema::drive_clients(
            &args,
            |_| {
                *seen.lock().unwrap() = Some(sched_getaffinity(None)?);
                Ok(())
            },
            |_, _, _| Ok(0),
        )
        .unwrap();
        let client = seen.into_inner().unwrap().expect("the client ran");
        assert_eq!(client.count(), 1, "the client may run on one CPU only");
        let cpu = (0..CpuSet::MAX_CPU).find(|&c| client.is_set(c)).unwrap();
        assert!(
            !others.is_set(cpu),
            "no other thread may use the client's CPU {cpu}"
        );
        assert!(others.count() >= 1);
    }
}
