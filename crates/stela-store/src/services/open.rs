//! Opening a store: the page file, the log tail and the archive, restart, the shared state,
//! the losers' locks, then the background threads ([`Services`]) that run the persistence
//! services at their intervals and instant restart's remaining work.
//!
//! Invariant: no transaction can begin before the losers of an instant restart hold their
//! locks and sit in the transaction table (asserted: the lock table is empty when they take
//! them, so none of those acquisitions waits).

use crate::access::btree::Engine;
use crate::access::lock::{LockManager, LockMode};
use crate::access::pagefile::PageFile;
use crate::access::pool::BufferPool;
use crate::access::repair::PageRepair;
use crate::error::{Error, Result};
use crate::format::CheckpointKind;
use crate::log::archive::LogArchive;
use crate::log::tail::{Consumer, LogTail};
use crate::log::LogDevice;
use crate::options::{CleanerKind, StoreOptions};
use crate::recovery::analysis::Analysis;
use crate::recovery::master::{Master, MasterSlots};
use crate::recovery::restart::{self, Loser, RestartReport};
use crate::services::checkpoint::{Checkpointer, Decoupled};
use crate::services::shared::{Shared, ANALYSIS_STEP, TAIL_CAP};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use stela_format::Lsn;

/// The background threads of an open store, and the flag that stops them.
pub(crate) struct Services {
    /// Set to stop the threads; they wait on the condition variable.
    stop: Arc<(Mutex<bool>, Condvar)>,
    threads: Vec<JoinHandle<()>>,
}

impl Services {
    /// Stops every thread and waits for each to end (a round under way finishes first).
    pub(crate) fn stop(&mut self) {
        let (stopped, wake) = &*self.stop;
        *stopped.lock().unwrap_or_else(|p| p.into_inner()) = true;
        wake.notify_all();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// An open store's parts, for `Store` to hold.
pub(crate) struct Opened {
    pub(crate) shared: Arc<Shared>,
    pub(crate) restart: RestartReport,
    pub(crate) services: Services,
}

/// Opens the store in `dir` on `log`: see the module documentation for the order.
pub(crate) fn open(dir: &Path, log: Arc<dyn LogDevice>, options: StoreOptions) -> Result<Opened> {
    let storage = Arc::clone(&options.wal.storage);
    storage.create_dir_all(dir)?;
    let file = crate::access::pagefile::open_in(storage.as_ref(), dir)?;
    let file = Arc::new(PageFile::new(file, options.sync_pages));
    let log = Arc::new(LogTail::new(log, &tail_consumers(&options), TAIL_CAP));
    let clean_lsn = Arc::new(crate::sync::AtomicU64::new(0));
    let mut engine = Engine {
        pool: BufferPool::new(
            Arc::clone(&file),
            options.pool_pages,
            Arc::clone(&clean_lsn),
        ),
        log: Arc::clone(&log) as Arc<dyn LogDevice>,
        next_page: file.pages()?.max(1),
    };
    let archive = open_archive(dir, &options)?;
    if let Some(archive) = &archive {
        // Before restart: its redo may read a damaged page too.
        engine
            .pool
            .attach_repair(PageRepair::new(Arc::clone(archive), options.elide_writes));
    }
    let (master_slots, master) = MasterSlots::open(storage.as_ref(), dir)?;
    let followed_to = match followed_to(storage.as_ref(), dir, master, log.as_ref())? {
        // An empty page file without a checkpoint, on a log that has records: the log's
        // `PagesWritten` records are about another page file (a directory new to an
        // existing log), and trusting them would skip redo this file needs. It holds every
        // change up to LSN 0, like a follower that applied nothing.
        None if master.is_none() && file.pages()? == 0 && log.last_lsn() > Lsn::ZERO => {
            Some(Lsn::ZERO)
        }
        followed => followed,
    };
    let restarted = restart::restart(&mut engine, master, followed_to, options.restart)?;
    let (restart, analysis) = (restarted.report, restarted.analysis);
    tracing::debug!(?restart, "store restarted");
    release_restarted(&log, &clean_lsn, &restart, &analysis, &options);
    let shared = Arc::new(Shared {
        next_txn: AtomicU64::new(restart.max_txn + 1),
        engine: Mutex::new(engine),
        locks: LockManager::with_timeout(options.lock_timeout),
        txns: Mutex::new(BTreeMap::new()),
        poisoned: AtomicBool::new(false),
        log,
        file,
        clean_lsn,
        options: options.clone(),
        checkpointer: Mutex::new(Checkpointer {
            master: master_slots,
            decoupled: Decoupled {
                analysis,
                last: None,
                records: Vec::new(),
            },
        }),
        cleaning: Mutex::new(Default::default()),
        archive,
        losers_left: AtomicUsize::new(restarted.losers.len()),
        losers: Mutex::new(BTreeMap::new()),
    });
    seat_losers(&shared, restarted.losers)?;
    let services = spawn_services(&shared, &options)?;
    Ok(Opened {
        shared,
        restart,
        services,
    })
}

/// The decoupled services the log tail keeps records for: only one that runs on its own thread.
/// A service called only on request may not be called for a long time, and would make the tail
/// hold records up to its cap; on request, it reads the log files instead.
fn tail_consumers(options: &StoreOptions) -> Vec<Consumer> {
    let mut consumers = Vec::new();
    if options.checkpoints == CheckpointKind::Decoupled && options.checkpoint_interval.is_some() {
        consumers.push(Consumer::Checkpoint);
    }
    if options.cleaner == CleanerKind::Decoupled && options.clean_interval.is_some() {
        consumers.push(Consumer::Cleaner);
    }
    consumers
}

fn open_archive(dir: &Path, options: &StoreOptions) -> Result<Option<Arc<LogArchive>>> {
    if !options.archive {
        return Ok(None);
    }
    let opening = Instant::now();
    let archive = LogArchive::open(
        Arc::clone(&options.wal.storage),
        dir.join("archive"),
        options.sync_pages,
    )?;
    tracing::debug!(elapsed = ?opening.elapsed(), "archive opened");
    Ok(Some(Arc::new(archive)))
}

/// After restart: the decoupled cleaner's clean LSN, and the tail's records that restart's
/// analysis and the stored images already cover.
fn release_restarted(
    log: &LogTail,
    clean_lsn: &crate::sync::AtomicU64,
    restart: &RestartReport,
    analysis: &Analysis,
    options: &StoreOptions,
) {
    if options.cleaner == CleanerKind::Decoupled {
        // Every change below redo's start is in the stored images (analysis found no page
        // that lacks one); without anything to redo, every change analysed is.
        let clean = restart
            .redo_start
            .map_or(analysis.applied_to, |lsn| Lsn::new(lsn.get() - 1));
        clean_lsn.store(clean.get(), Ordering::Release);
        log.release(Consumer::Cleaner, clean.next());
    }
    log.release(Consumer::Checkpoint, analysis.applied_to.next());
}

/// Before any transaction can begin: the losers' locks and transaction-table entries.
fn seat_losers(shared: &Shared, losers: Vec<Loser>) -> Result<()> {
    let mut txns = shared.txns.lock().unwrap_or_else(|p| p.into_inner());
    let mut seated = shared.losers.lock().unwrap_or_else(|p| p.into_inner());
    debug_assert!(
        txns.is_empty() && seated.is_empty(),
        "losers seated before any transaction"
    );
    for loser in losers {
        for key in &loser.keys {
            // The lock table holds only losers' locks, each key a different loser's: no wait.
            debug_assert!(shared
                .locks
                .blockers(loser.txn, key, LockMode::Exclusive)
                .is_empty());
            shared.locks.acquire(loser.txn, key, LockMode::Exclusive)?;
        }
        // Its first record is not known here (the chain may reach before the
        // checkpoint): keep the whole log until it is rolled back, which is soon.
        txns.insert(loser.txn, (Lsn::FIRST, loser.last_lsn));
        seated.insert(loser.txn, loser);
    }
    Ok(())
}

/// Starts the background threads the options ask for.
fn spawn_services(shared: &Arc<Shared>, options: &StoreOptions) -> Result<Services> {
    let stop = Arc::new((Mutex::new(false), Condvar::new()));
    let mut threads = Vec::new();
    if let Some(interval) = options.checkpoint_interval {
        // Decoupled checkpoints keep their analysis up with the log between checkpoints
        // (every `ANALYSIS_STEP`), so the tail does not hold a whole interval of records.
        let decoupled = options.checkpoints == CheckpointKind::Decoupled;
        let step = if decoupled {
            interval.min(ANALYSIS_STEP)
        } else {
            interval
        };
        let mut due = Instant::now() + interval;
        let round = move |s: &Shared| {
            let now = Instant::now();
            if decoupled && now < due {
                return s.analyse_ahead();
            }
            due = now + interval;
            s.checkpoint_unreported()
        };
        threads.push(spawn_service(
            "stela-store-checkpoint",
            shared,
            &stop,
            step,
            round,
        )?);
    }
    if let Some(interval) = options.clean_interval {
        let round = |s: &Shared| s.clean().map(|_| ());
        threads.push(spawn_service(
            "stela-store-cleaner",
            shared,
            &stop,
            interval,
            round,
        )?);
    }
    if let Some(interval) = options.archive_interval.filter(|_| options.archive) {
        let round = |s: &Shared| s.archive().map(|_| ());
        threads.push(spawn_service(
            "stela-store-archiver",
            shared,
            &stop,
            interval,
            round,
        )?);
    }
    if options.recover_in_background && !shared.recovery_pending().is_done() {
        threads.push(spawn_restart_worker(shared, &stop)?);
    }
    Ok(Services { stop, threads })
}

/// A standby follower's progress in `dir` (`follow`), while it still speaks for the directory:
/// until the store has completed a checkpoint of its own there (the master record then names
/// a begin record past the progress, and restart needs nothing else).
///
/// # Errors
/// [`Error::Follow`] when the pages hold changes the log does not (the log ends below the
/// progress: not the log the follower followed, or one that lost its end).
fn followed_to(
    storage: &dyn stela_wal::storage::Storage,
    dir: &Path,
    master: Option<Master>,
    log: &dyn LogDevice,
) -> Result<Option<Lsn>> {
    let Some(followed) = crate::services::follow::read_progress(storage, dir)? else {
        return Ok(None);
    };
    if master.is_some_and(|master| master.begin > followed) {
        return Ok(None);
    }
    if followed > log.last_lsn() {
        return Err(Error::Follow(format!(
            "{}: the page images hold every change up to {followed}, but the log ends at {}",
            dir.display(),
            log.last_lsn()
        )));
    }
    Ok(Some(followed))
}

/// Runs `work` every `interval` on a thread of its own until the store stops. Errors are
/// logged (and have poisoned the store where they must), not fatal to the thread.
fn spawn_service(
    name: &str,
    shared: &Arc<Shared>,
    stop: &Arc<(Mutex<bool>, Condvar)>,
    interval: Duration,
    mut work: impl FnMut(&Shared) -> Result<()> + Send + 'static,
) -> Result<JoinHandle<()>> {
    let stop = Arc::clone(stop);
    let name_for_log = name.to_owned();
    spawn_background(name, shared, move |shared| loop {
        {
            let (stopped, wake) = &*stop;
            let guard = stopped.lock().unwrap_or_else(|p| p.into_inner());
            let (guard, _) = wake
                .wait_timeout_while(guard, interval, |stopped| !*stopped)
                .unwrap_or_else(|p| p.into_inner());
            if *guard {
                return;
            }
        }
        if let Err(error) = work(shared) {
            if matches!(error, Error::Poisoned) {
                return;
            }
            tracing::warn!(service = %name_for_log, %error, "persistence service failed");
        }
    })
}

/// The background thread of an instant restart: rolls back the losers, then redoes the pending
/// pages, a step at a time, until nothing is left or the store stops. A failure poisons the
/// store where it must (and is logged); the work left is then the next restart's.
fn spawn_restart_worker(
    shared: &Arc<Shared>,
    stop: &Arc<(Mutex<bool>, Condvar)>,
) -> Result<JoinHandle<()>> {
    let stop = Arc::clone(stop);
    spawn_background("stela-store-restart", shared, move |shared| loop {
        if *stop.0.lock().unwrap_or_else(|p| p.into_inner()) {
            return;
        }
        match shared.recovery_step() {
            Ok(true) => {}
            Ok(false) => return,
            Err(error) => {
                tracing::warn!(%error, "background restart failed");
                return;
            }
        }
    })
}

/// Starts one of the store's background threads, named `name`, running `body`; under
/// `SCHED_BATCH` when the store's options ask for it (see `background`).
fn spawn_background(
    name: &str,
    shared: &Arc<Shared>,
    body: impl FnOnce(&Shared) + Send + 'static,
) -> Result<JoinHandle<()>> {
    let shared = Arc::clone(shared);
    let thread_name = name.to_owned();
    Ok(std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            if shared.options.batch_services {
                crate::services::background::yield_to_transactions(&thread_name);
            }
            body(&shared)
        })?)
}
