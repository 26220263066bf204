//! `stela-bench restart`: how long after a crash stela-store takes a first new transaction, by
//! restart mode (instant against classical ARIES) and size of the dirty set.
//!
//! The store: plain keys (`k` and ten digits) with 100-byte values, loaded once, in key order,
//! and closed cleanly, big enough that the largest dirty set asked for is a fraction of it.
//! Each run:
//! 1. A child process (this binary's hidden `restart-child` subcommand) opens the store with a
//!    buffer pool larger than the dirty set, the cleaners off and commits durable on disk
//!    (fdatasync), updates one key on each of `dirty_mb * 128` leaves (8 KiB pages), runs one
//!    step of the log archive (as its thread does every interval; `--no-archive`: none kept),
//!    leaves a transaction running that changed 100 keys (a loser, its records made durable by
//!    a later commit), takes a checkpoint (so analysis is short: the pages stay dirty), says
//!    `ready`, and waits. Instant restart finds the dirty pages' older changes in the archive
//!    and reads them per page when it redoes the page; without the archive it reads them from
//!    the log at open (a read that grows with the dirty set).
//! 2. The parent kills it with SIGKILL, and (unless `--warm`) drops the store's files from the
//!    page cache with `posix_fadvise(DONTNEED)`, as a restarted machine would find them.
//! 3. The parent opens the store in the mode measured and runs a first transaction: read a
//!    key the child updated, write a new one, commit. `first_txn_ms` runs from the start of the
//!    open to the commit's return. `full_recovery_ms`: for instant, from the start of the open
//!    until the background redo and undo have finished; for classical, the open (redo and undo
//!    are done when it returns).
//! 4. The parent closes the store cleanly (every page written), which leaves it ready for the
//!    next run.
//!
//! The modes take turns in every repeat (which one goes first alternates), and the summary gives
//! each one's median.

use anyhow::{bail, Context};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use stela_store::{RestartMode, Store, StoreOptions};
use stela_wal::SyncMode;

/// Keys per load transaction.
const LOAD_BATCH: u64 = 20_000;
/// Updates per transaction of the child.
const DIRTY_BATCH: u64 = 2_000;
const VALUE_BYTES: usize = 100;
/// Keys the loser changes.
const LOSER_KEYS: u64 = 100;
const PAGES_PER_MB: u64 = 1024 * 1024 / stela_store::PAGE_SIZE as u64;

#[derive(clap::Args, Debug, Clone)]
pub struct RestartArgs {
    /// Sizes of the dirty set at the crash, in MiB of 8 KiB pages (comma list).
    #[arg(long = "dirty-mb", value_delimiter = ',', default_value = "16,64,256")]
    pub dirty_mb: Vec<u64>,
    /// Restart modes to run.
    #[arg(long, value_delimiter = ',', default_value = "instant,classical")]
    pub modes: Vec<ModeArg>,
    /// Runs per mode and size; the modes take turns.
    #[arg(long, default_value_t = 3)]
    pub repeats: usize,
    /// Keep the store's files in the page cache across the crash (default: drop them, as a
    /// machine that restarted would have).
    #[arg(long)]
    pub warm: bool,
    /// Directory for the store (default: a temporary folder in the current directory).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Keep the loaded store in this directory and reuse it in later runs of this command
    /// with the same largest size (loading 1 GiB of leaves takes minutes). Exclusive with
    /// `--dir`.
    #[arg(long, conflicts_with = "dir")]
    pub store: Option<PathBuf>,
    /// Run without the log archive: instant restart then reads from the log every change the
    /// dirty pages lack, at open (the comparison for what the archive saves).
    #[arg(long)]
    pub no_archive: bool,
    /// One JSON object per run instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ModeArg {
    Instant,
    Classical,
}

impl From<ModeArg> for RestartMode {
    fn from(mode: ModeArg) -> RestartMode {
        match mode {
            ModeArg::Instant => RestartMode::Instant,
            ModeArg::Classical => RestartMode::Classical,
        }
    }
}

/// Arguments of the hidden `restart-child` subcommand: the process that is killed.
#[derive(clap::Args, Debug, Clone)]
pub struct ChildArgs {
    #[arg(long)]
    pub dir: PathBuf,
    #[arg(long)]
    pub dirty_mb: u64,
    /// Keys in the store.
    #[arg(long)]
    pub keys: u64,
    /// Which run this is: the value written, so the parent can check it reads it back.
    #[arg(long)]
    pub round: u8,
    #[arg(long)]
    pub no_archive: bool,
}

/// One run's result.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RestartRun {
    pub restart: ModeArg,
    pub dirty_mb: u64,
    /// Dirty pages at the crash, as the child's last checkpoint recorded them.
    pub dirty_pages: usize,
    pub repeat: usize,
    pub open_ms: f64,
    pub first_txn_ms: f64,
    pub full_recovery_ms: f64,
    /// Instant: pages left for redo after open. Classical: pages redone by open.
    pub pages_redone_later: u64,
    pub redo_applied_at_open: u64,
    /// Instant: records open read from the log for the pending redo.
    pub pending_records: u64,
    /// Instant: pending pages whose older changes open left in the log archive.
    pub pending_from_archive: u64,
    pub archive: bool,
}

fn key(i: u64) -> Vec<u8> {
    format!("k{i:010}").into_bytes()
}

/// Frames for a dirty set of `dirty_mb`, with room for the internal pages and the reads; the
/// log archive kept unless `no_archive`, its steps run on request only.
fn options(dirty_mb: u64, mode: RestartMode, no_archive: bool) -> StoreOptions {
    let defaults = StoreOptions::default();
    let wal = defaults.wal.clone().sync(SyncMode::Data);
    defaults
        .wal(wal)
        .pool_pages(((dirty_mb * 5 / 4 + 64) * PAGES_PER_MB) as usize)
        .checkpoint_interval(None)
        .clean_interval(None)
        .archive(!no_archive)
        .archive_interval(None)
        .restart(mode)
}

/// Loads `keys` keys in order and closes the store; returns the number of leaves (pages of
/// the file, less a few internal ones).
fn load(dir: &Path, keys: u64, no_archive: bool) -> anyhow::Result<u64> {
    let options = options(64, RestartMode::Classical, no_archive);
    let wal = options.wal.clone().sync(SyncMode::None);
    let store = Store::open(dir, options.wal(wal))?;
    let mut i = 0;
    while i < keys {
        let mut txn = store.begin();
        for k in i..(i + LOAD_BATCH).min(keys) {
            txn.put(&key(k), &[0; VALUE_BYTES])?;
        }
        txn.commit()?;
        i += LOAD_BATCH;
    }
    store.archive()?;
    store.close()?;
    Ok(std::fs::metadata(dir.join("pages"))?.len() / stela_store::PAGE_SIZE as u64)
}

/// The child: dirty `dirty_mb` of pages, archive, leave a loser, checkpoint, say `ready`,
/// wait to be killed.
pub fn child(args: &ChildArgs) -> anyhow::Result<()> {
    let options = options(args.dirty_mb, RestartMode::Classical, args.no_archive);
    let store = Store::open(&args.dir, options)?;
    let pages = args.dirty_mb * PAGES_PER_MB;
    // Keys in order, a leaf's worth apart: one update per leaf.
    let stride = (args.keys / pages).max(1);
    let value = [args.round; VALUE_BYTES];
    let mut updated = 0;
    while updated < pages {
        let mut txn = store.begin();
        for n in updated..(updated + DIRTY_BATCH).min(pages) {
            txn.put(&key((n * stride) % args.keys), &value)?;
        }
        txn.commit()?;
        updated += DIRTY_BATCH;
    }
    // One archiving step, as the archive's thread takes every interval: the crash comes after
    // the archive caught up with the dirtying (what it had not archived, restart reads from
    // the log). No-op without an archive.
    store.archive()?;
    let mut loser = store.begin();
    for n in 0..LOSER_KEYS {
        loser.put(&key(n * stride + 1), b"never committed")?;
    }
    let mut txn = store.begin();
    txn.put(b"last", &[args.round])?;
    txn.commit()?;
    let checkpoint = store.checkpoint()?;
    println!("ready {}", checkpoint.tables.dirty_pages.len());
    std::io::stdout().flush()?;
    std::mem::forget(loser);
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// Drops the store's files from the page cache (they are clean: synced by the child's commits
/// and the last close).
fn drop_from_cache(dir: &Path) -> anyhow::Result<()> {
    for entry in walk(dir)? {
        let file = std::fs::File::open(&entry)?;
        rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::DontNeed)
            .with_context(|| format!("fadvise {}", entry.display()))?;
    }
    Ok(())
}

fn walk(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            files.extend(walk(&entry.path())?);
        } else {
            files.push(entry.path());
        }
    }
    Ok(files)
}

/// Runs the child on `dir` until it is ready, then kills it. Returns the dirty pages it
/// reported.
fn crash_child(
    dir: &Path,
    dirty_mb: u64,
    keys: u64,
    round: u8,
    no_archive: bool,
) -> anyhow::Result<usize> {
    let exe = std::env::current_exe().context("the path of this binary")?;
    let mut child = Command::new(exe)
        .arg("restart-child")
        .arg("--dir")
        .arg(dir)
        .args(["--dirty-mb", &dirty_mb.to_string()])
        .args(["--keys", &keys.to_string()])
        .args(["--round", &round.to_string()])
        .args(no_archive.then_some("--no-archive"))
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the child")?;
    let mut line = String::new();
    let stdout = child.stdout.take().context("the child's stdout")?;
    std::io::BufReader::new(stdout).read_line(&mut line)?;
    // Child::kill is SIGKILL.
    child.kill()?;
    child.wait()?;
    match line.trim().strip_prefix("ready ") {
        Some(pages) => Ok(pages.parse()?),
        None => bail!("the child did not get ready (said {line:?})"),
    }
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}

/// Restarts the crashed store in `mode`, runs the first transaction, waits for the recovery to
/// finish, closes the store. Returns the times and the restart's report.
fn restart(
    dir: &Path,
    mode: ModeArg,
    dirty_mb: u64,
    round: u8,
    no_archive: bool,
) -> anyhow::Result<(f64, f64, f64, stela_store::RestartReport)> {
    let started = Instant::now();
    let store = Store::open(dir, options(dirty_mb, mode.into(), no_archive))?;
    let open_ms = ms(started);
    let mut txn = store.begin();
    let read = txn.get(&key(0))?;
    txn.put(b"first", &[round])?;
    txn.commit()?;
    let first_txn_ms = ms(started);
    if read.as_deref() != Some(&[round; VALUE_BYTES][..]) {
        bail!("{mode:?} restart: the first transaction read {read:?}, not the committed value");
    }
    while !store.recovery_pending().is_done() {
        std::thread::sleep(Duration::from_micros(200));
    }
    let full_recovery_ms = match mode {
        ModeArg::Instant => ms(started),
        ModeArg::Classical => open_ms,
    };
    let report = store.restart_report().clone();
    if report.losers.len() != 1 {
        bail!("{mode:?} restart: losers {:?}, expected one", report.losers);
    }
    store.close()?;
    Ok((open_ms, first_txn_ms, full_recovery_ms, report))
}

/// The store the runs crash.
struct CrashStore {
    dir: PathBuf,
    /// The scratch folder holding it, removed when dropped (none with `--store`).
    _scratch: Option<tempfile::TempDir>,
    /// Pages loaded and the seconds the load took (`None`: a kept store reused).
    loaded: Option<(u64, f64)>,
}

/// The store to crash, loaded with `keys` keys: in `--store` when it already holds that many
/// (a file beside it says how many it was loaded with), else loaded now.
fn store_for(args: &RestartArgs, keys: u64) -> anyhow::Result<CrashStore> {
    let (dir, scratch) = match &args.store {
        Some(kept) => (kept.clone(), None),
        None => {
            let base = crate::harness::scratch_dir(args.dir.as_deref())?;
            (base.path().join("store"), Some(base))
        }
    };
    let marker = dir.with_extension("loaded");
    let wanted = format!("{keys} keys, archive {}\n", !args.no_archive);
    if args.store.is_some() && std::fs::read_to_string(&marker).ok().as_deref() == Some(&wanted) {
        return Ok(CrashStore {
            dir,
            _scratch: scratch,
            loaded: None,
        });
    }
    if args.store.is_some() {
        let _ = std::fs::remove_file(&marker);
        if dir.exists() {
            std::fs::remove_dir_all(&dir).with_context(|| format!("clearing {}", dir.display()))?;
        }
    }
    let loading = Instant::now();
    let leaves = load(&dir, keys, args.no_archive)?;
    let took = loading.elapsed().as_secs_f64();
    if args.store.is_some() {
        std::fs::write(&marker, wanted)?;
    }
    Ok(CrashStore {
        dir,
        _scratch: scratch,
        loaded: Some((leaves, took)),
    })
}

pub fn run(args: &RestartArgs, out: &mut impl Write) -> anyhow::Result<Vec<RestartRun>> {
    let largest = args.dirty_mb.iter().copied().max().unwrap_or(0);
    if largest == 0 || args.modes.is_empty() {
        bail!("--dirty-mb needs a size above 0, and --modes at least one mode");
    }
    // Leaves loaded in key order are about half full: 35 keys of 111 bytes each. Twice as
    // many leaves as the largest dirty set.
    let keys = largest * PAGES_PER_MB * 2 * 35;
    // Dropped at the end, removing a scratch store.
    let store = store_for(args, keys)?;
    let dir = store.dir.clone();
    if !args.json {
        let loaded = match store.loaded {
            Some((leaves, took)) => format!("{leaves} pages, loaded in {took:.1} s"),
            None => format!("reused from {}", dir.display()),
        };
        writeln!(
            out,
            "restart: {keys} keys ({loaded}); disk durability; log archive {}; page cache {}",
            if args.no_archive { "off" } else { "on" },
            if args.warm { "kept" } else { "dropped" }
        )?;
        writeln!(
            out,
            "{:<10} {:>8} {:>11} {:>6} {:>9} {:>12} {:>16} {:>10} {:>12} {:>12}",
            "restart",
            "dirty_mb",
            "dirty_pages",
            "repeat",
            "open_ms",
            "first_txn_ms",
            "full_recovery_ms",
            "redo_later",
            "log_records",
            "from_archive"
        )?;
    }
    let mut runs = Vec::new();
    let mut round = 0u8;
    for repeat in 1..=args.repeats.max(1) {
        for &dirty_mb in &args.dirty_mb {
            let mut modes = args.modes.clone();
            if repeat % 2 == 0 {
                modes.reverse();
            }
            for mode in modes {
                round = round.wrapping_add(1).max(1);
                let dirty_pages = crash_child(&dir, dirty_mb, keys, round, args.no_archive)?;
                if !args.warm {
                    drop_from_cache(&dir)?;
                }
                let (open_ms, first_txn_ms, full_recovery_ms, report) =
                    restart(&dir, mode, dirty_mb, round, args.no_archive)?;
                let run = RestartRun {
                    restart: mode,
                    dirty_mb,
                    dirty_pages,
                    repeat,
                    open_ms,
                    first_txn_ms,
                    full_recovery_ms,
                    pages_redone_later: report.pending_pages,
                    redo_applied_at_open: report.redo_applied,
                    pending_records: report.pending_records,
                    pending_from_archive: report.pending_from_archive,
                    archive: !args.no_archive,
                };
                if args.json {
                    writeln!(out, "{}", serde_json::to_string(&run)?)?;
                } else {
                    writeln!(
                        out,
                        "{:<10} {:>8} {:>11} {:>6} {:>9.1} {:>12.1} {:>16.1} {:>10} {:>12} {:>12}",
                        format!("{mode:?}").to_lowercase(),
                        dirty_mb,
                        dirty_pages,
                        repeat,
                        open_ms,
                        first_txn_ms,
                        full_recovery_ms,
                        run.pages_redone_later,
                        run.pending_records,
                        run.pending_from_archive
                    )?;
                }
                out.flush()?;
                runs.push(run);
            }
        }
    }
    if !args.json && args.repeats > 1 {
        writeln!(out, "median of {} runs:", args.repeats)?;
        for &dirty_mb in &args.dirty_mb {
            for &mode in &args.modes {
                let mine: Vec<&RestartRun> = runs
                    .iter()
                    .filter(|r| r.restart == mode && r.dirty_mb == dirty_mb)
                    .collect();
                let median = |f: fn(&RestartRun) -> f64| {
                    let mut values: Vec<f64> = mine.iter().map(|r| f(r)).collect();
                    values.sort_by(f64::total_cmp);
                    values[values.len() / 2]
                };
                writeln!(
                    out,
                    "{:<10} {:>8} first_txn_ms {:>9.1} full_recovery_ms {:>9.1}",
                    format!("{mode:?}").to_lowercase(),
                    dirty_mb,
                    median(|r| r.first_txn_ms),
                    median(|r| r.full_recovery_ms)
                )?;
            }
        }
    }
    Ok(runs)
}
