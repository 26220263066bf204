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

use crate::tpcb::transfer;
use crate::tpcb_schema::{
    account_key, balance, branch_key, history_key, row, teller_key, Kind, Rng, TELLERS_PER_BRANCH,
};
use anyhow::{bail, Context};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use stela_store::{CheckpointKind, CleanerKind, Store, StoreOptions};
use stela_wal::storage::{Call, CrashPlan, FaultStorage, Hooked, Hooks, Storage};
use stela_wal::SyncMode;

/// Sequence numbers of one round start here, so rows of different rounds never collide.
const SEQS_PER_ROUND: u64 = 10_000_000;

#[derive(clap::Args, Debug, Clone)]
pub struct TpcbCrashArgs {
    /// How many times the child is SIGKILLed.
    #[arg(long, default_value_t = 20)]
    pub kills: u32,
    /// Then, how many simulated power cuts: the store runs in this process on the
    /// fault-injecting storage (log, pages and master record), which drops or tears every
    /// write not covered by an fsync, as `--plans` says.
    #[arg(long, default_value_t = 0)]
    pub power_cuts: u32,
    /// What a power cut keeps of the unsynced writes, taken in turn: `lose` (nothing),
    /// `tear` (a prefix, the last write torn), `scramble` (any sectors, in any order).
    #[arg(long, value_delimiter = ',', default_value = "lose,tear,scramble")]
    pub plans: Vec<PlanArg>,
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
    /// Paces the checkpoint thread apart from the cleaner (default: `--interval-ms`). A
    /// short one (1 ms) makes most decoupled checkpoints deltas on a chain, so the faults
    /// land on chains of every length.
    #[arg(long)]
    pub checkpoint_interval_ms: Option<u64>,
    /// Buffer pool pages (8 KiB): small, so dirty pages are stolen before their commit.
    #[arg(long, default_value_t = 48)]
    pub pool_pages: usize,
    /// The kill comes uniformly between 5 ms and this long after the child is ready.
    #[arg(long, default_value_t = 250)]
    pub max_run_ms: u64,
    /// Seed of the kill moments and the transactions (default: from the clock; printed).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Prune the store's log archive behind a page backup once the runs its log truncation
    /// passed hold this many bytes and as many as the page file
    /// (`StoreOptions::archive_prune_after`; default: the store's, 64 MiB; 0: never). A small
    /// value makes the faults land around backups and pruning.
    #[arg(long)]
    pub archive_prune_after: Option<u64>,
    /// Directory for the store (default: a temporary one here, removed after a clean run).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// One JSON line per kill and a summary line.
    #[arg(long)]
    pub json: bool,
}

impl TpcbCrashArgs {
    /// The checkpoint thread's interval: `--checkpoint-interval-ms`, else `--interval-ms`.
    fn checkpoint_interval_ms(&self) -> u64 {
        self.checkpoint_interval_ms.unwrap_or(self.interval_ms)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PlanArg {
    Lose,
    Tear,
    Scramble,
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
    pub checkpoint_interval_ms: u64,
    #[arg(long)]
    pub pool_pages: usize,
    #[arg(long)]
    pub archive_prune_after: Option<u64>,
    #[arg(long)]
    pub round: u64,
    #[arg(long)]
    pub seed: u64,
}

/// One fault's line of `--json`.
#[derive(Debug, serde::Serialize)]
struct Fault {
    /// `sigkill`, or `power-cut:` and the plan.
    fault: String,
    n: u32,
    ran_ms: u64,
    /// Transactions acknowledged before this fault.
    acknowledged: u64,
    #[serde(flatten)]
    restarted: Restarted,
}

/// What the check after a fault found, and what its restart did.
#[derive(Debug, serde::Serialize)]
struct Restarted {
    /// Transactions in flight at the fault that restart kept (their commit record had
    /// reached the disk; the client had not been told).
    in_flight_visible: u64,
    losers_rolled_back: u64,
    restart_ms: f64,
    /// The archive's page backup after the check's archiving step (its LSN; 0: none yet),
    /// and whether that step took a new one.
    archive_floor: u64,
    backup_taken: bool,
    /// What the restart read: records analysed, where redo started (0: no page was dirty)
    /// and the (record, page) pairs it left pending (instant restart).
    analyzed: u64,
    redo_start: u64,
    pending_records: u64,
}

/// The last line of `--json`. `lost` and `uncommitted_visible` are counted by the checks
/// after each fault; any other value than 0 ends the run with an error naming the fault.
#[derive(Debug, serde::Serialize)]
struct Summary {
    summary: bool,
    kills: u32,
    power_cuts: u32,
    acknowledged: u64,
    lost: u64,
    uncommitted_visible: u64,
    losers_rolled_back: u64,
    /// Page backups the archive took (the archive pruned behind each), counted at the checks.
    backups: u64,
    restart_p50_ms: f64,
    restart_max_ms: f64,
    seed: u64,
}

fn options(
    storage: &Arc<dyn Storage>,
    checkpoints: Kind,
    cleaner: Kind,
    interval_ms: u64,
    checkpoint_interval_ms: u64,
    pool_pages: usize,
    archive_prune_after: Option<u64>,
) -> StoreOptions {
    let defaults = StoreOptions::default();
    let prune_after = match archive_prune_after {
        None => defaults.archive_prune_after,
        Some(0) => None,
        Some(bytes) => Some(bytes),
    };
    let wal = defaults
        .wal
        .clone()
        .sync(SyncMode::Data)
        .storage(Arc::clone(storage));
    let interval = Some(Duration::from_millis(interval_ms.max(1)));
    let checkpoint_interval = Some(Duration::from_millis(checkpoint_interval_ms.max(1)));
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
        .checkpoint_interval(checkpoint_interval)
        .clean_interval(interval)
        // The archive (its page backup, then its runs) holds every page's history, so a page
        // torn by a power cut is rebuilt; the log is truncated behind it.
        .archive(true)
        .archive_prune_after(prune_after)
        .archive_interval(interval.map(|i| i * 4))
}

fn real_disk() -> Arc<dyn Storage> {
    Arc::new(stela_wal::storage::StdStorage)
}

/// The child: open (restart), say `ready`, run TPC-B until killed.
pub fn child(args: &TpcbCrashChildArgs) -> anyhow::Result<()> {
    let store = Store::open(
        &args.dir,
        options(
            &real_disk(),
            args.checkpoints,
            args.cleaner,
            args.interval_ms,
            args.checkpoint_interval_ms,
            args.pool_pages,
            args.archive_prune_after,
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

fn load(dir: &Path, args: &TpcbCrashArgs, storage: &Arc<dyn Storage>) -> anyhow::Result<()> {
    let store = Store::open(
        dir,
        options(
            storage,
            args.checkpoints,
            args.cleaner,
            0,
            0,
            1024,
            args.archive_prune_after,
        )
        .checkpoint_interval(None)
        .clean_interval(None)
        .archive_interval(None),
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
    let rows = txn
        .scan(
            std::ops::Bound::Included(prefix),
            std::ops::Bound::Excluded(&end[..]),
        )
        .collect::<stela_store::Result<Vec<_>>>()?;
    rows.into_iter()
        .map(|(k, v)| Ok((k, balance(&v)?)))
        .collect()
}

/// What the runs so far were told, and what the checks found.
struct Tally {
    /// Every history row acknowledged (or kept by a restart after a fault), with its delta.
    acknowledged: HashMap<Vec<u8>, i64>,
    restarts_ms: Vec<f64>,
    losers: u64,
    in_flight_kept: u64,
    backups: u64,
}

impl Tally {
    /// Takes in what was acknowledged before the fault of `round`, opens the store (restart)
    /// and checks it: every acknowledged row there with its delta; accounts, tellers and
    /// branches each summing to the history rows present (a transaction half there breaks a
    /// sum); beyond the acknowledged rows only each client's one transaction in flight (its
    /// next sequence number). Rows in flight that restart kept are committed from now on.
    fn check_after_fault(
        &mut self,
        dir: &Path,
        args: &TpcbCrashArgs,
        storage: &Arc<dyn Storage>,
        round: u64,
        acknowledged_now: &[(u32, u64, i64)],
    ) -> anyhow::Result<Restarted> {
        let mut next_seq: HashMap<u32, u64> = HashMap::new();
        for &(b, seq, delta) in acknowledged_now {
            self.acknowledged.insert(history_key(b, seq), delta);
            next_seq.insert(b, seq + 1);
        }
        let opening = Instant::now();
        let store = Store::open(
            dir,
            options(
                storage,
                args.checkpoints,
                args.cleaner,
                args.interval_ms,
                args.checkpoint_interval_ms(),
                args.pool_pages,
                args.archive_prune_after,
            )
            .checkpoint_interval(None)
            .clean_interval(None)
            .archive_interval(None),
        )
        .context("restart after the fault")?;
        let restart_ms = opening.elapsed().as_secs_f64() * 1e3;
        let report = store.restart_report();
        let losers = report.losers.len() as u64;
        let (analyzed, redo_start, pending_records) = (
            report.records_analyzed,
            report.redo_start.map_or(0, |lsn| lsn.get()),
            report.pending_records,
        );
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
                "uncommitted or partial transactions visible: accounts, tellers, branches sum \
                 to {sums:?}, the history rows to {history_sum}"
            );
        }
        let present: HashMap<&[u8], i64> = history.iter().map(|(k, d)| (&k[..], *d)).collect();
        let mut lost: Vec<String> = self
            .acknowledged
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
        let mut in_flight = 0;
        for (key, delta) in &history {
            if self.acknowledged.contains_key(key) {
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
            self.acknowledged.insert(key.clone(), *delta);
            in_flight += 1;
        }
        // Between rounds the store does, at rest, what its background services do in a run
        // longer than one round (5..max_run_ms is shorter than the archive's interval): clean,
        // checkpoint, archive and truncate the log behind them. Without this the log grows
        // round after round, and a page torn by the next power cut is rebuilt by reading all of
        // it (single-page recovery reads the log after the archive's end): restarts grow with
        // the round number, which a store that runs for more than a few milliseconds never sees.
        store
            .finish_recovery()
            .context("finishing recovery after the check")?;
        store.clean().context("cleaning after the check")?;
        store.checkpoint().context("checkpoint after the check")?;
        let archived = store.archive().context("archiving after the check")?;
        let archive_floor = store.log_archive().map_or(0, |a| a.floor().get());
        drop(store); // a crash at rest: the next round restarts again
        self.backups += u64::from(archived.backup.is_some());
        self.restarts_ms.push(restart_ms);
        self.losers += losers;
        self.in_flight_kept += in_flight;
        Ok(Restarted {
            in_flight_visible: in_flight,
            losers_rolled_back: losers,
            restart_ms,
            archive_floor,
            backup_taken: archived.backup.is_some(),
            analyzed,
            redo_start,
            pending_records,
        })
    }
}

pub fn run(args: &TpcbCrashArgs, out: &mut impl Write) -> anyhow::Result<()> {
    if args.clients == 0 || args.accounts == 0 || args.kills + args.power_cuts == 0 {
        bail!("--clients, --accounts and --kills + --power-cuts must be at least 1");
    }
    if args.power_cuts > 0 && args.plans.is_empty() {
        bail!("--plans names no power-cut plan");
    }
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    if !args.json {
        writeln!(
            out,
            "tpcb-crash: {} SIGKILLs of a child, then {} power cuts ({:?}), under TPC-B ({} \
             clients x {} accounts, {:?} checkpoints every {} ms, {:?} cleaner every {} ms, {} \
             pool pages); seed {seed}",
            args.kills,
            args.power_cuts,
            args.plans,
            args.clients,
            args.accounts,
            args.checkpoints,
            args.checkpoint_interval_ms(),
            args.cleaner,
            args.interval_ms,
            args.pool_pages
        )?;
    }
    let mut rng = Rng::new(seed);
    let report = |fault: Fault, tally: &Tally, out: &mut dyn Write| -> anyhow::Result<()> {
        if args.json {
            writeln!(out, "{}", serde_json::to_string(&fault)?)?;
        } else if fault.n.is_multiple_of(50) {
            writeln!(
                out,
                "  {} {}: {} acknowledged so far, 0 lost, 0 uncommitted visible, {} losers \
                 rolled back",
                fault.n,
                fault.fault,
                tally.acknowledged.len(),
                tally.losers
            )?;
        }
        out.flush()?;
        Ok(())
    };
    let base = crate::harness::scratch_dir(args.dir.as_deref())?;
    let mut tally = Tally {
        acknowledged: HashMap::new(),
        restarts_ms: Vec::new(),
        losers: 0,
        in_flight_kept: 0,
        backups: 0,
    };

    // SIGKILLs of a child process on the real disk.
    if args.kills > 0 {
        let disk = real_disk();
        let dir = base.path().join("store");
        load(&dir, args, &disk)?;
        let exe = std::env::current_exe().context("finding this executable")?;
        for kill in 1..=args.kills {
            let round = u64::from(kill);
            let ran_ms = 5 + u64::from(rng.below(args.max_run_ms.saturating_sub(5).max(1) as u32));
            let acknowledged_now = kill_child_once(&exe, &dir, args, round, seed ^ round, ran_ms)
                .with_context(|| format!("kill {kill} (seed {seed})"))?;
            let restarted = tally
                .check_after_fault(&dir, args, &disk, round, &acknowledged_now)
                .with_context(|| {
                    format!(
                        "kill {kill} (seed {seed}); the store is kept in {}",
                        dir.display()
                    )
                })?;
            let fault = Fault {
                fault: "sigkill".into(),
                n: kill,
                ran_ms,
                acknowledged: acknowledged_now.len() as u64,
                restarted,
            };
            report(fault, &tally, out)?;
        }
    }

    // Power cuts: the store in this process on the fault-injecting storage.
    if args.power_cuts > 0 {
        let fault_storage = FaultStorage::new();
        let storage: Arc<dyn Storage> = Arc::new(fault_storage.clone());
        let dir = PathBuf::from("/tpcb-crash/store");
        load(&dir, args, &storage)?;
        tally.acknowledged.clear();
        for cut in 1..=args.power_cuts {
            let round = u64::from(args.kills + cut);
            let plan = match args.plans[(cut as usize - 1) % args.plans.len()] {
                PlanArg::Lose => CrashPlan::LoseUnsynced,
                PlanArg::Tear => CrashPlan::TearUnsynced { seed: seed ^ round },
                PlanArg::Scramble => CrashPlan::ScrambleSectors { seed: seed ^ round },
            };
            let ran_ms = 5 + u64::from(rng.below(args.max_run_ms.saturating_sub(5).max(1) as u32));
            let acknowledged_now = cut_power_once(
                &dir,
                args,
                (&storage, &fault_storage),
                Cut {
                    plan,
                    round,
                    seed,
                    ran_ms,
                },
            )
            .with_context(|| format!("power cut {cut} ({plan:?}, seed {seed})"))?;
            let restarted = tally
                .check_after_fault(&dir, args, &storage, round, &acknowledged_now)
                .with_context(|| format!("power cut {cut} ({plan:?}, seed {seed})"))?;
            let name = format!("{:?}", args.plans[(cut as usize - 1) % args.plans.len()]);
            let fault = Fault {
                fault: format!("power-cut:{}", name.to_lowercase()),
                n: cut,
                ran_ms,
                acknowledged: acknowledged_now.len() as u64,
                restarted,
            };
            report(fault, &tally, out)?;
        }
    }

    tally.restarts_ms.sort_by(f64::total_cmp);
    let summary = Summary {
        summary: true,
        kills: args.kills,
        power_cuts: args.power_cuts,
        acknowledged: tally.acknowledged.len() as u64,
        lost: 0,
        uncommitted_visible: 0,
        losers_rolled_back: tally.losers,
        backups: tally.backups,
        restart_p50_ms: tally.restarts_ms[tally.restarts_ms.len() / 2],
        restart_max_ms: tally.restarts_ms.last().copied().unwrap_or(0.0),
        seed,
    };
    if args.json {
        writeln!(out, "{}", serde_json::to_string(&summary)?)?;
    } else {
        writeln!(
            out,
            "{} SIGKILLs and {} power cuts: 0 acknowledged transactions lost, 0 uncommitted \
             visible, TPC-B sums equal after every fault; {} in flight at a fault kept (their \
             commit record was durable); {} losers rolled back; {} page backups taken (the \
             archive pruned behind each); restart p50 {:.1} ms, max {:.1} ms",
            summary.kills,
            summary.power_cuts,
            tally.in_flight_kept,
            tally.losers,
            summary.backups,
            summary.restart_p50_ms,
            summary.restart_max_ms
        )?;
    }
    Ok(())
}

/// Starts the child on `dir`, SIGKILLs it `ran_ms` after it is ready; returns the
/// transactions it acknowledged (branch, seq, delta).
fn kill_child_once(
    exe: &Path,
    dir: &Path,
    args: &TpcbCrashArgs,
    round: u64,
    seed: u64,
    ran_ms: u64,
) -> anyhow::Result<Vec<(u32, u64, i64)>> {
    let mut child = Command::new(exe)
        .arg("tpcb-crash-child")
        .arg("--dir")
        .arg(dir)
        .args(["--clients", &args.clients.to_string()])
        .args(["--accounts", &args.accounts.to_string()])
        .args([
            "--checkpoints",
            &format!("{:?}", args.checkpoints).to_lowercase(),
        ])
        .args(["--cleaner", &format!("{:?}", args.cleaner).to_lowercase()])
        .args(["--interval-ms", &args.interval_ms.to_string()])
        .args([
            "--checkpoint-interval-ms",
            &args.checkpoint_interval_ms().to_string(),
        ])
        .args(["--pool-pages", &args.pool_pages.to_string()])
        .args(
            args.archive_prune_after
                .map(|bytes| ["--archive-prune-after".to_string(), bytes.to_string()])
                .into_iter()
                .flatten(),
        )
        .args(["--round", &round.to_string()])
        .args(["--seed", &seed.to_string()])
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
            "the child did not get ready (restart failed?): {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    std::thread::sleep(Duration::from_millis(ran_ms));
    if let Ok(Some(status)) = child.try_wait() {
        let mut stderr = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut stderr);
        }
        bail!("the child exited by itself ({status}): {stderr}");
    }
    child.kill().context("SIGKILL of the child")?;
    child.wait()?;
    let lines = reader.join().expect("the reader thread");
    lines
        .iter()
        .map(|line| {
            let parts: Vec<&str> = line.split(' ').collect();
            let [_, b, seq, delta] = parts[..] else {
                bail!("the child printed {line:?}");
            };
            Ok((b.parse()?, seq.parse()?, delta.parse()?))
        })
        .collect()
}

/// The power supply of one run on the fault-injecting storage: every call of the store
/// (storage-level or on an open file) goes through it, and [`PowerSwitch::cut`] makes every
/// later call fail. A real power cut stops the machine; the simulated one leaves the old
/// store's threads running, and without this a checkpoint thread of the dead store could, say,
/// rename a master record into the state that survived the cut.
#[derive(Debug, Default)]
struct PowerSwitch {
    state: Mutex<Power>,
    idle: Condvar,
}

#[derive(Debug, Default)]
struct Power {
    off: bool,
    calls_running: u64,
}

impl Hooks for PowerSwitch {
    fn before(&self, _call: &Call<'_>) -> std::io::Result<()> {
        let mut power = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if power.off {
            return Err(std::io::Error::other("the power is off"));
        }
        power.calls_running += 1;
        Ok(())
    }

    fn after(&self, _call: &Call<'_>, _outcome: Result<(), &std::io::Error>) {
        let mut power = self.state.lock().unwrap_or_else(|p| p.into_inner());
        power.calls_running -= 1;
        if power.calls_running == 0 {
            self.idle.notify_all();
        }
    }
}

impl PowerSwitch {
    /// Turns the power off and returns once no call is running: from then on nothing the
    /// old store does reaches the storage.
    fn switch_off(&self) {
        let mut power = self.state.lock().unwrap_or_else(|p| p.into_inner());
        power.off = true;
        while power.calls_running > 0 {
            power = self.idle.wait(power).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// One power cut: what it keeps, the round's sequence numbers and seed, when it comes.
struct Cut {
    plan: CrashPlan,
    round: u64,
    seed: u64,
    ran_ms: u64,
}

/// Runs the clients on a store over the fault-injecting storage, cuts the power `ran_ms`
/// later, stops the clients and drops the store; returns the transactions acknowledged
/// before the cut (branch, seq, delta). A commit that returns after the cut returned on the
/// lost state and is not counted.
fn cut_power_once(
    dir: &Path,
    args: &TpcbCrashArgs,
    (storage, fault_storage): (&Arc<dyn Storage>, &FaultStorage),
    Cut {
        plan,
        round,
        seed,
        ran_ms,
    }: Cut,
) -> anyhow::Result<Vec<(u32, u64, i64)>> {
    let power = Hooked::wrap(Arc::clone(storage), PowerSwitch::default());
    let powered: Arc<dyn Storage> = Arc::new(power.clone());
    let store = Store::open(
        dir,
        options(
            &powered,
            args.checkpoints,
            args.cleaner,
            args.interval_ms,
            args.checkpoint_interval_ms(),
            args.pool_pages,
            args.archive_prune_after,
        ),
    )
    .context("opening the store")?;
    let acknowledged: Mutex<Vec<(u32, u64, i64)>> = Mutex::new(Vec::new());
    let stop = AtomicBool::new(false);
    let before_cut = std::thread::scope(|scope| -> anyhow::Result<Vec<(u32, u64, i64)>> {
        for b in 0..args.clients {
            let (store, acknowledged, stop) = (&store, &acknowledged, &stop);
            scope.spawn(move || {
                let mut rng = Rng::new(seed ^ round ^ ((u64::from(b) + 1) * 0x9e37_79b9));
                let mut seq = round * SEQS_PER_ROUND;
                while !stop.load(Ordering::Acquire) {
                    let delta = i64::from(rng.below(1_999_999)) - 999_999;
                    let account = account_key(b, rng.below(args.accounts));
                    let teller = teller_key(b, rng.below(TELLERS_PER_BRANCH));
                    match transfer(store, b, seq, delta, &account, &teller) {
                        Ok(()) => {
                            acknowledged.lock().unwrap().push((b, seq, delta));
                            seq += 1;
                        }
                        Err(stela_store::Error::Deadlock { .. }) => {}
                        // After the cut the store may fail in any way: the run is over.
                        Err(_) => return,
                    }
                }
            });
        }
        std::thread::sleep(Duration::from_millis(ran_ms));
        let before_cut = {
            let acknowledged = acknowledged.lock().unwrap();
            power.hooks().switch_off();
            fault_storage.crash(plan);
            acknowledged.clone()
        };
        stop.store(true, Ordering::Release);
        Ok(before_cut)
    })?;
    drop(store); // without power it fails at everything; the next open sees what survived
    Ok(before_cut)
}
