//! `stela-bench warm-standby`: how long after a promotion a store takes its first new
//! transaction, on a warm follower's directory against a cold one (issue 11, item 6).
//!
//! Each repeat, in this process on loopback: a witness and two daemons (`stela_server`), `a`
//! the primary and `b` its standby, with automatic failover. A store on `a` logs at
//! `replicated` with decoupled checkpoints (every second) and cleaning (every 200 ms). On `b`,
//! a `stela_store::Follower` replays the standby's mirrored log into the warm directory; the
//! cold directory is a follower's that applied nothing (an empty directory a store may open on
//! a log it did not write). TPC-B-ish transactions (an account, a teller and a branch updated,
//! a history row inserted) run until the log has shipped `log_mb` MiB, then one transaction is
//! left running (a loser) and the primary dies: its store is dropped (a crash), its daemon
//! stopped. Once `b` answers as the primary (the promotion, observed by polling its status):
//! - warm: the follower is told to stop (it first applies what it lagged behind by), a store
//!   opens the warm directory on `b`, and runs a first transaction (read an account, update it,
//!   commit). `first_txn_ms` runs from the promotion to that commit's return;
//! - cold: the same on the cold directory (after the warm store is dropped), from the start of
//!   its open.
//!
//! The page cache is not dropped (both directories and the log were just written), so the
//! figures are the restart's work, not the disk's. Medians over the repeats per size.

use anyhow::{bail, Context};
use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use stela_client::{Address, Connection, Durability, WalOptions};
use stela_proto::{RequestBody, ResponseBody};
use stela_server::config::{AfterFailover, FailoverConfig, NodeRole};
use stela_server::{DaemonConfig, Server};
use stela_store::{Agreement, Follower, Store, StoreOptions};

const LOG: &str = "tpcb";
const BRANCHES: u64 = 10;
const TELLERS: u64 = 100;
const ACCOUNTS: u64 = 20_000;

#[derive(clap::Args, Debug, Clone)]
pub struct WarmStandbyArgs {
    /// MiB of log shipped before the primary dies (comma list).
    #[arg(long = "log-mb", value_delimiter = ',', default_value = "8,32")]
    pub log_mb: Vec<u64>,
    /// Failovers per size.
    #[arg(long, default_value_t = 3)]
    pub repeats: usize,
    /// Directory for the daemons and stores (default: a temporary folder in the current
    /// directory).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// One JSON object per run instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// One directory's figures after one failover.
#[derive(Debug, Clone, serde::Serialize)]
pub struct WarmRun {
    /// `warm` or `cold`.
    pub standby: &'static str,
    pub log_mb: u64,
    pub repeat: usize,
    /// From the promotion (warm) or the start of the open (cold) to the first commit.
    pub first_txn_ms: f64,
    /// Of which the follower's last rounds (warm; 0 for cold).
    pub catch_up_ms: f64,
    /// Records restart analysed, and (record, page) pairs it left to redo.
    pub analysed: u64,
    pub redo_records: u64,
    /// Records the follower applied after the promotion (warm).
    pub follower_lag: u64,
}

fn free_port() -> anyhow::Result<SocketAddr> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

fn role(socket: &Path) -> Option<(String, u64)> {
    let mut connection = Connection::connect_admin(&Address::from(socket)).ok()?;
    match connection.request(RequestBody::Status).ok()? {
        ResponseBody::Status(report) => {
            let replication = report.replication?;
            let shipped = replication.logs.iter().map(|l| l.shipped_bytes).sum();
            Some((replication.role, shipped))
        }
        _ => None,
    }
}

fn wait_for(what: &str, within: Duration, mut done: impl FnMut() -> bool) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    while !done() {
        if Instant::now() > deadline {
            bail!("timed out waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

fn key(kind: &str, i: u64) -> Vec<u8> {
    format!("{kind}{i:08}").into_bytes()
}

fn row(balance: i64) -> Vec<u8> {
    let mut bytes = format!("{balance}|").into_bytes();
    bytes.resize(100, b' ');
    bytes
}

fn balance(bytes: &[u8]) -> i64 {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|text| text.split('|').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

fn seed(store: &Store) -> anyhow::Result<()> {
    let all = (0..BRANCHES)
        .map(|i| key("b", i))
        .chain((0..TELLERS).map(|i| key("t", i)))
        .chain((0..ACCOUNTS).map(|i| key("a", i)))
        .collect::<Vec<_>>();
    for chunk in all.chunks(2000) {
        let mut txn = store.begin();
        for k in chunk {
            txn.put(k, &row(0))?;
        }
        txn.commit()?;
    }
    Ok(())
}

/// One TPC-B transaction.
fn tpcb(store: &Store, n: u64, rng: &mut u64) -> anyhow::Result<()> {
    *rng ^= *rng << 13;
    *rng ^= *rng >> 7;
    *rng ^= *rng << 17;
    let account = *rng % ACCOUNTS;
    let teller = (*rng >> 20) % TELLERS;
    let branch = teller % BRANCHES;
    let delta = (*rng >> 40) as i64 % 1000 - 500;
    let mut txn = store.begin();
    for k in [key("a", account), key("t", teller), key("b", branch)] {
        let now = balance(&txn.get(&k)?.unwrap_or_default());
        txn.put(&k, &row(now + delta))?;
    }
    txn.put(&key("h", n), &row(delta))?;
    txn.commit()?;
    Ok(())
}

/// The first transaction on the promoted store.
fn first_transaction(store: &Store) -> anyhow::Result<()> {
    let mut txn = store.begin();
    let k = key("a", ACCOUNTS - 1);
    let now = balance(&txn.get(&k)?.context("the account exists")?);
    txn.put(&k, &row(now + 1))?;
    txn.commit()?;
    Ok(())
}

fn store_options() -> StoreOptions {
    StoreOptions::default()
        .checkpoint_interval(Some(Duration::from_secs(1)))
        .clean_interval(Some(Duration::from_millis(200)))
        // As measured before the log archive became a default.
        .archive(false)
}

fn wal() -> WalOptions {
    WalOptions::default().durability(Durability::Replicated)
}

/// The store on the promoted node, whose old primary is gone for the run: no standby can hold
/// a commit, so `replicated` would be answered `Unprotected`, never `Ok` (issue 52); the store
/// there commits at `disk`, chosen explicitly (before issue 52 it was acknowledged unprotected,
/// from the daemon's memory, under the name `replicated`).
fn wal_alone() -> WalOptions {
    WalOptions::default().durability(Durability::Disk)
}

/// One failover at `log_mb`: the warm and the cold directory's runs.
fn failover(root: &Path, log_mb: u64, repeat: usize) -> anyhow::Result<[WarmRun; 2]> {
    let witness = stela_coord::witness::Witness::start(
        "127.0.0.1:0".parse()?,
        &root.join("witness"),
        Duration::from_millis(300),
    )?;
    let repl = [free_port()?, free_port()?];
    let dirs = [root.join("a"), root.join("b")];
    let node = |i: usize, role: NodeRole| -> anyhow::Result<Server> {
        let mut config = DaemonConfig::new(&dirs[i]);
        config.node = ["a", "b"][i].into();
        config.repl_listen = Some(repl[i]);
        config.standby = Some(repl[1 - i]);
        config.failover = Some(FailoverConfig {
            coordinator: format!("tcp://{}", witness.addr()),
            cluster: "warm-standby".into(),
            initial_role: role,
            heartbeat: Duration::from_millis(50),
            suspect_after: Duration::from_millis(300),
            after_failover: AfterFailover::Unprotected,
        });
        Server::start(config).map_err(|e| anyhow::anyhow!("daemon {}: {e}", ["a", "b"][i]))
    };
    let a = node(0, NodeRole::Primary)?;
    let b = node(1, NodeRole::Standby)?;
    wait_for("a to be the primary", Duration::from_secs(10), || {
        role(a.socket_path()).is_some_and(|(role, _)| role == "primary")
    })?;
    let store = Store::open_on_daemon(
        root.join("store-a"),
        a.socket_path(),
        LOG,
        wal(),
        store_options(),
    )?;
    seed(&store)?;
    let (warm, cold) = (root.join("warm"), root.join("cold"));
    let mirrored = dirs[1].join("logs").join(LOG);
    drop(Follower::open(&cold, &mirrored, Agreement::WholeLog)?);
    let stop = Arc::new(AtomicBool::new(false));
    let applied = Arc::new(AtomicU64::new(0));
    let follower = {
        let (stop, applied, warm, mirrored) = (
            Arc::clone(&stop),
            Arc::clone(&applied),
            warm.clone(),
            mirrored.clone(),
        );
        let agreement = Agreement::StandbyDaemon(Address::from(b.socket_path()));
        std::thread::spawn(move || -> stela_store::Result<()> {
            let mut follower = Follower::open(&warm, &mirrored, agreement)?;
            follower.run(&stop, Duration::from_millis(20), &mut |report| {
                applied.store(report.applied.get(), Ordering::Release)
            })
        })
    };
    let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ repeat as u64;
    let mut n = 0;
    loop {
        for _ in 0..500 {
            tpcb(&store, n, &mut rng)?;
            n += 1;
        }
        let (_, shipped) = role(a.socket_path()).context("the primary's status")?;
        if shipped >= log_mb << 20 {
            break;
        }
    }
    // A loser: running when the primary dies, its records durable through a later commit.
    let mut loser = store.begin();
    loser.put(&key("a", 0), &row(-1))?;
    std::mem::forget(loser);
    tpcb(&store, n, &mut rng)?;
    drop(store);
    a.shutdown()
        .map_err(|e| anyhow::anyhow!("stopping a: {e}"))?;
    wait_for("b to be promoted", Duration::from_secs(20), || {
        role(b.socket_path()).is_some_and(|(role, _)| role == "primary")
    })?;
    let promoted = Instant::now();
    let before = applied.load(Ordering::Acquire);
    stop.store(true, Ordering::Release);
    follower
        .join()
        .map_err(|_| anyhow::anyhow!("the follower panicked"))??;
    let catch_up = promoted.elapsed();
    let after = applied.load(Ordering::Acquire);
    let store = Store::open_on_daemon(&warm, b.socket_path(), LOG, wal_alone(), store_options())?;
    first_transaction(&store)?;
    let warm_ms = promoted.elapsed();
    let warm_report = store.restart_report().clone();
    drop(store);

    let started = Instant::now();
    let store = Store::open_on_daemon(&cold, b.socket_path(), LOG, wal_alone(), store_options())?;
    first_transaction(&store)?;
    let cold_ms = started.elapsed();
    let cold_report = store.restart_report().clone();
    drop(store);
    b.shutdown()
        .map_err(|e| anyhow::anyhow!("stopping b: {e}"))?;
    drop(witness);
    Ok([
        WarmRun {
            standby: "warm",
            log_mb,
            repeat,
            first_txn_ms: warm_ms.as_secs_f64() * 1e3,
            catch_up_ms: catch_up.as_secs_f64() * 1e3,
            analysed: warm_report.records_analyzed,
            redo_records: warm_report.pending_records,
            follower_lag: after.saturating_sub(before),
        },
        WarmRun {
            standby: "cold",
            log_mb,
            repeat,
            first_txn_ms: cold_ms.as_secs_f64() * 1e3,
            catch_up_ms: 0.0,
            analysed: cold_report.records_analyzed,
            redo_records: cold_report.pending_records,
            follower_lag: 0,
        },
    ])
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

pub fn run(args: &WarmStandbyArgs, out: &mut impl Write) -> anyhow::Result<Vec<WarmRun>> {
    if args.log_mb.is_empty() || args.log_mb.contains(&0) {
        bail!("--log-mb needs sizes above 0");
    }
    let base = crate::harness::scratch_dir(args.dir.as_deref())?;
    if !args.json {
        writeln!(
            out,
            "{:<6} {:>6} {:>6} {:>12} {:>11} {:>9} {:>9} {:>12}",
            "dir",
            "log_mb",
            "repeat",
            "first_txn_ms",
            "catch_up_ms",
            "analysed",
            "redo",
            "follower_lag"
        )?;
    }
    let mut runs = Vec::new();
    for &log_mb in &args.log_mb {
        for repeat in 1..=args.repeats.max(1) {
            let root = base.path().join(format!("{log_mb}-{repeat}"));
            std::fs::create_dir_all(&root)?;
            for run in failover(&root, log_mb, repeat)? {
                if args.json {
                    writeln!(out, "{}", serde_json::to_string(&run)?)?;
                } else {
                    writeln!(
                        out,
                        "{:<6} {:>6} {:>6} {:>12.1} {:>11.1} {:>9} {:>9} {:>12}",
                        run.standby,
                        run.log_mb,
                        run.repeat,
                        run.first_txn_ms,
                        run.catch_up_ms,
                        run.analysed,
                        run.redo_records,
                        run.follower_lag
                    )?;
                }
                runs.push(run);
            }
            std::fs::remove_dir_all(&root).ok();
        }
    }
    if !args.json {
        writeln!(out, "medians:")?;
        for &log_mb in &args.log_mb {
            for standby in ["warm", "cold"] {
                let mut first: Vec<f64> = runs
                    .iter()
                    .filter(|r| r.log_mb == log_mb && r.standby == standby)
                    .map(|r| r.first_txn_ms)
                    .collect();
                writeln!(
                    out,
                    "  {standby:<4} log_mb {log_mb:>4}: first_txn_ms {:.1} over {} runs",
                    median(&mut first),
                    first.len()
                )?;
            }
        }
    }
    Ok(runs)
}
