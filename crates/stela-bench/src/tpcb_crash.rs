//! `stela-bench tpcb-crash`: TPC-B on stela-store in a child process SIGKILLed at a random
//! moment, over and over, with the store's invariants checked after every kill.
//!
//! Each round starts a child (`stela-bench tpcb-crash-child`, hidden) that opens the store —
//! running restart over what the previous kill left — prints `ready`, then runs one client
//! thread per branch. A client prints `c BRANCH SEQ DELTA` on stdout after each commit
//! returned, so every line the parent reads is an acknowledged transaction (the line is in the
//! pipe before the child can be killed past it). The parent kills the child at a random moment,
//! opens the store itself (restart again) and checks:
//! - **nothing acknowledged lost**: every acknowledged history row is there, with its delta;
//! - **nothing uncommitted visible**: accounts, tellers and branches each sum to the sum of the
//!   history rows present (a transaction half there breaks one of the sums), and the rows
//!   beyond the acknowledged ones are at most one per client, each the one its client had in
//!   flight (its next sequence number);
//!
//! then drops the store without closing it (a second crash, at rest) for the next round.
//! Rounds use small pools so dirty pages are stolen (written before commit) and restart has
//! losers to undo. Kill moments come from `--seed` (printed), so a failing round replays.
//! Results: bench/results/tpcb-crash.txt.

use crate::tpcb_schema::{
    account_key, balance, branch_key, history_key, row, teller_key, Kind, Rng, TELLERS_PER_BRANCH,
};
use anyhow::{bail, Context};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use stela_store::{CheckpointKind, CleanerKind, Store, StoreOptions};
use stela_wal::SyncMode;

/// Sequence numbers of one round start here, so rows of different rounds never collide.
const SEQS_PER_ROUND: u64 = 10_000_000;

#[derive(clap::Args, Debug, Clone)]
pub struct TpcbCrashArgs {
    /// How many times the child is SIGKILLed.
    #[arg(long, default_value_t = 20)]
    pub kills: u32,
    /// Client threads in the child, one per branch.
    #[arg(long, default_value_t = 4)]
    pub clients: u32,
    /// Accounts per branch.
    #[arg(long, default_value_t = 1_000)]
    pub accounts: u32,
    #[arg(long, default_value = "decoupled")]
    pub checkpoints: Kind,
    #[arg(long, default_value = "decoupled")]
    pub cleaner: Kind,
    /// Interval of the checkpoint and cleaner threads.
    #[arg(long, default_value_t = 50)]
    pub interval_ms: u64,
    /// Buffer pool pages (8 KiB): small, so dirty pages are stolen before their commit.
    #[arg(long, default_value_t = 48)]
    pub pool_pages: usize,
    /// The kill comes uniformly between 5 ms and this long after the child is ready.
    #[arg(long, default_value_t = 250)]
    pub max_run_ms: u64,
    /// Seed of the kill moments and the transactions (default: from the clock; printed).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Directory for the store (default: a temporary one here, removed after a clean run).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// One JSON line per kill and a summary line.
    #[arg(long)]
    pub json: bool,
}

/// The hidden child's arguments.
#[derive(clap::Args, Debug, Clone)]
pub struct TpcbCrashChildArgs {
    #[arg(long)]
    pub dir: PathBuf,
    #[arg(long)]
    pub clients: u32,
    #[arg(long)]
    pub accounts: u32,
    #[arg(long)]
    pub checkpoints: Kind,
    #[arg(long)]
    pub cleaner: Kind,
    #[arg(long)]
    pub interval_ms: u64,
    #[arg(long)]
    pub pool_pages: usize,
    #[arg(long)]
    pub round: u64,
    #[arg(long)]
    pub seed: u64,
}

#[derive(Debug, serde::Serialize)]
struct Kill {
    kill: u32,
    ran_ms: u64,
    acknowledged: u64,
    in_flight_visible: u64,
    losers_rolled_back: u64,
    restart_ms: f64,
}

#[derive(Debug, serde::Serialize)]
struct Summary {
    summary: bool,
    kills: u32,
    acknowledged: u64,
    lost: u64,
    uncommitted_visible: u64,
    losers_rolled_back: u64,
    restart_p50_ms: f64,
    restart_max_ms: f64,
    seed: u64,
}

fn options(checkpoints: Kind, cleaner: Kind, interval_ms: u64, pool_pages: usize) -> StoreOptions {
    let defaults = StoreOptions::default();
    let wal = defaults.wal.clone().sync(SyncMode::Data);
    let interval = Some(Duration::from_millis(interval_ms.max(1)));
    defaults
        .wal(wal)
        .pool_pages(pool_pages)
        .checkpoints(match checkpoints {
            Kind::Classical => CheckpointKind::Classical,
            Kind::Decoupled => CheckpointKind::Decoupled,
        })
        .cleaner(match cleaner {
            Kind::Classical => CleanerKind::Classical,
            Kind::Decoupled => CleanerKind::Decoupled,
        })
        .checkpoint_interval(interval)
        .clean_interval(interval)
}

/// The child: open (restart), say `ready`, run TPC-B until killed.
pub fn child(args: &TpcbCrashChildArgs) -> anyhow::Result<()> {
    let store = Store::open(
        &args.dir,
        options(
            args.checkpoints,
            args.cleaner,
            args.interval_ms,
            args.pool_pages,
        ),
    )?;
    let stdout = std::sync::Mutex::new(std::io::stdout());
    writeln!(stdout.lock().unwrap(), "ready")?;
    std::thread::scope(|scope| -> anyhow::Result<()> {
        let clients: Vec<_> = (0..args.clients)
            .map(|b| {
                let (store, stdout) = (&store, &stdout);
                scope.spawn(move || -> anyhow::Result<()> {
                    let mut rng = Rng::new(args.seed ^ ((u64::from(b) + 1) * 0x9e37_79b9));
                    let mut seq = args.round * SEQS_PER_ROUND;
                    loop {
                        let delta = i64::from(rng.below(1_999_999)) - 999_999;
                        let account = account_key(b, rng.below(args.accounts));
                        let teller = teller_key(b, rng.below(TELLERS_PER_BRANCH));
                        match transfer(store, b, seq, delta, &account, &teller) {
                            Ok(()) => {
                                // Only now, after the commit returned, is it acknowledged.
                                let mut out = stdout.lock().unwrap();
                                writeln!(out, "c {b} {seq} {delta}")?;
                                out.flush()?;
                                seq += 1;
                            }
                            // The victim was rolled back; the next try uses the same seq.
                            Err(stela_store::Error::Deadlock { .. }) => {}
                            Err(e) => return Err(e.into()),
                        }
                    }
                })
            })
            .collect();
        for client in clients {
            client.join().expect("a client panicked")?;
        }
        Ok(())
    })
}

fn transfer(
    store: &Store,
    b: u32,
    seq: u64,
    delta: i64,
    account: &[u8],
    teller: &[u8],
) -> stela_store::Result<()> {
    let mut txn = store.begin();
    for key in [account, teller, &branch_key(b)] {
        let old = txn.get(key)?.map_or(0, |r| balance(&r).unwrap_or(0));
        txn.put(key, &row(old + delta))?;
    }
    txn.put(&history_key(b, seq), &row(delta))?;
    txn.commit()
}

fn load(dir: &Path, args: &TpcbCrashArgs) -> anyhow::Result<()> {
    let store = Store::open(
        dir,
        options(args.checkpoints, args.cleaner, 0, 1024)
            .checkpoint_interval(None)
            .clean_interval(None),
    )?;
    for b in 0..args.clients {
        let mut txn = store.begin();
        txn.put(&branch_key(b), &row(0))?;
        for t in 0..TELLERS_PER_BRANCH {
            txn.put(&teller_key(b, t), &row(0))?;
        }
        for a in 0..args.accounts {
            txn.put(&account_key(b, a), &row(0))?;
        }
        txn.commit()?;
    }
    store.close()?;
    Ok(())
}

/// History rows (or any rows): key and balance.
type Rows = Vec<(Vec<u8>, i64)>;

/// The rows under `prefix`, each with its balance.
fn sum_of(txn: &mut stela_store::Transaction, prefix: &[u8]) -> anyhow::Result<Rows> {
    let mut end = prefix.to_vec();
    *end.last_mut().expect("a prefix") += 1;
    let rows = txn.scan(
        std::ops::Bound::Included(prefix),
        std::ops::Bound::Excluded(&end[..]),
    )?;
    rows.into_iter()
        .map(|(k, v)| Ok((k, balance(&v)?)))
        .collect()
}

/// Opens the store (restart), checks it against what was acknowledged; returns the history
/// rows visible that were in flight at the kill (committed, not yet printed), the losers
/// restart rolled back, and the restart's time.
fn check(
    dir: &Path,
    args: &TpcbCrashArgs,
    acknowledged: &HashMap<Vec<u8>, i64>,
    next_seq: &HashMap<u32, u64>,
    round: u64,
) -> anyhow::Result<(Rows, u64, f64)> {
    let opening = Instant::now();
    let store = Store::open(
        dir,
        options(
            args.checkpoints,
            args.cleaner,
            args.interval_ms,
            args.pool_pages,
        )
        .checkpoint_interval(None)
        .clean_interval(None),
    )?;
    let restart_ms = opening.elapsed().as_secs_f64() * 1e3;
    let losers = store.restart_report().losers.len() as u64;
    let mut txn = store.begin();
    let history = sum_of(&mut txn, b"h")?;
    let sums = [
        sum_of(&mut txn, b"a")?.iter().map(|r| r.1).sum::<i64>(),
        sum_of(&mut txn, b"t")?.iter().map(|r| r.1).sum::<i64>(),
        sum_of(&mut txn, b"b")?.iter().map(|r| r.1).sum::<i64>(),
    ];
    txn.commit()?;
    let history_sum: i64 = history.iter().map(|r| r.1).sum();
    if sums.iter().any(|&s| s != history_sum) {
        bail!(
            "uncommitted or partial transactions visible: accounts, tellers, branches sum to \
             {sums:?}, the history rows to {history_sum}"
        );
    }
    let present: HashMap<&[u8], i64> = history.iter().map(|(k, d)| (&k[..], *d)).collect();
    let mut lost: Vec<String> = acknowledged
        .iter()
        .filter(|(k, d)| present.get(&k[..]) != Some(d))
        .map(|(k, _)| String::from_utf8_lossy(k).into_owned())
        .collect();
    if !lost.is_empty() {
        lost.sort();
        bail!(
            "{} acknowledged transactions lost or changed, first {}",
            lost.len(),
            lost[0]
        );
    }
    // Rows nobody was told about: only each client's one transaction in flight.
    let mut in_flight = Vec::new();
    for (key, delta) in &history {
        if acknowledged.contains_key(key) {
            continue;
        }
        let allowed = (0..args.clients).any(|b| {
            let next = next_seq.get(&b).copied().unwrap_or(round * SEQS_PER_ROUND);
            *key == history_key(b, next)
        });
        if !allowed {
            bail!(
                "history row {} is visible but was neither acknowledged nor in flight",
                String::from_utf8_lossy(key)
            );
        }
        in_flight.push((key.clone(), *delta));
    }
    drop(store); // a crash at rest: the next child restarts again
    Ok((in_flight, losers, restart_ms))
}

pub fn run(args: &TpcbCrashArgs, out: &mut impl Write) -> anyhow::Result<()> {
    if args.clients == 0 || args.accounts == 0 || args.kills == 0 {
        bail!("--clients, --accounts and --kills must be at least 1");
    }
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let base = crate::harness::scratch_dir(args.dir.as_deref())?;
    let dir = base.path().join("store");
    load(&dir, args)?;
    if !args.json {
        writeln!(
            out,
            "tpcb-crash: {} kills of a child running TPC-B ({} clients x {} accounts, {:?} \
             checkpoints, {:?} cleaner every {} ms, {} pool pages); seed {seed}",
            args.kills,
            args.clients,
            args.accounts,
            args.checkpoints,
            args.cleaner,
            args.interval_ms,
            args.pool_pages
        )?;
    }
    let exe = std::env::current_exe().context("finding this executable")?;
    let mut rng = Rng::new(seed);
    let mut acknowledged: HashMap<Vec<u8>, i64> = HashMap::new();
    let mut restarts = Vec::new();
    let (mut total_in_flight, mut total_losers) = (0u64, 0u64);
    for kill in 1..=args.kills {
        let round = u64::from(kill);
        let mut child = Command::new(&exe)
            .arg("tpcb-crash-child")
            .arg("--dir")
            .arg(&dir)
            .args(["--clients", &args.clients.to_string()])
            .args(["--accounts", &args.accounts.to_string()])
            .args([
                "--checkpoints",
                &format!("{:?}", args.checkpoints).to_lowercase(),
            ])
            .args(["--cleaner", &format!("{:?}", args.cleaner).to_lowercase()])
            .args(["--interval-ms", &args.interval_ms.to_string()])
            .args(["--pool-pages", &args.pool_pages.to_string()])
            .args(["--round", &round.to_string()])
            .args(["--seed", &(seed ^ round).to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting the child")?;
        let stdout = child.stdout.take().expect("piped");
        let (ready_tx, ready_rx) = mpsc::channel();
        let reader = std::thread::spawn(move || -> Vec<String> {
            let mut lines = Vec::new();
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if line == "ready" {
                    let _ = ready_tx.send(());
                } else {
                    lines.push(line);
                }
            }
            lines
        });
        if ready_rx.recv_timeout(Duration::from_secs(120)).is_err() {
            let _ = child.kill();
            let output = child.wait_with_output()?;
            bail!(
                "kill {kill}: the child did not get ready (restart failed?): {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        let ran_ms = 5 + u64::from(rng.below(args.max_run_ms.saturating_sub(5).max(1) as u32));
        std::thread::sleep(Duration::from_millis(ran_ms));
        if let Ok(Some(status)) = child.try_wait() {
            let mut stderr = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut stderr);
            }
            bail!("kill {kill}: the child exited by itself ({status}): {stderr}");
        }
        child.kill().context("SIGKILL of the child")?;
        child.wait()?;
        let lines = reader.join().expect("the reader thread");
        let mut next_seq: HashMap<u32, u64> = HashMap::new();
        let acked_this_round = lines.len() as u64;
        for line in &lines {
            let parts: Vec<&str> = line.split(' ').collect();
            let [_, b, seq, delta] = parts[..] else {
                bail!("kill {kill}: the child printed {line:?}");
            };
            let (b, seq, delta): (u32, u64, i64) = (b.parse()?, seq.parse()?, delta.parse()?);
            acknowledged.insert(history_key(b, seq), delta);
            next_seq.insert(b, seq + 1);
        }
        let (in_flight, losers, restart_ms) = check(&dir, args, &acknowledged, &next_seq, round)
            .with_context(|| {
                format!(
                    "kill {kill} (seed {seed}); the store is kept in {}",
                    dir.display()
                )
            })?;
        // A transaction in flight at the kill whose commit record reached the disk is
        // committed: later rounds must keep it like an acknowledged one.
        let in_flight_visible = in_flight.len() as u64;
        total_in_flight += in_flight_visible;
        acknowledged.extend(in_flight);
        total_losers += losers;
        restarts.push(restart_ms);
        if args.json {
            writeln!(
                out,
                "{}",
                serde_json::to_string(&Kill {
                    kill,
                    ran_ms,
                    acknowledged: acked_this_round,
                    in_flight_visible,
                    losers_rolled_back: losers,
                    restart_ms,
                })?
            )?;
        } else if kill % 50 == 0 || kill == args.kills {
            writeln!(
                out,
                "  {kill} kills: {} acknowledged, 0 lost, 0 uncommitted visible, {total_losers} \
                 losers rolled back",
                acknowledged.len()
            )?;
        }
        out.flush()?;
    }
    restarts.sort_by(f64::total_cmp);
    let summary = Summary {
        summary: true,
        kills: args.kills,
        acknowledged: acknowledged.len() as u64,
        lost: 0,
        uncommitted_visible: 0,
        losers_rolled_back: total_losers,
        restart_p50_ms: restarts[restarts.len() / 2],
        restart_max_ms: restarts.last().copied().unwrap_or(0.0),
        seed,
    };
    if args.json {
        writeln!(out, "{}", serde_json::to_string(&summary)?)?;
    } else {
        writeln!(
            out,
            "{} kills, {} transactions acknowledged: 0 lost, 0 uncommitted visible; {} in flight \
             at a kill kept (committed before the kill, not yet printed); restart p50 {:.1} ms, \
             max {:.1} ms",
            summary.kills,
            summary.acknowledged,
            total_in_flight,
            summary.restart_p50_ms,
            summary.restart_max_ms
        )?;
    }
    Ok(())
}
