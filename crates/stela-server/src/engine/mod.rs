//! The daemon's state and the one way to change it: the buffer pool, the table of open logs,
//! the flusher threads and the power state, behind `append`, `commit`, `read`, `status` and the
//! power-failure flush. The connection code (`net`) frames and dispatches requests to this
//! module and imports nothing that imports it; this module knows nothing of sockets or rings.
//!
//! Invariants: an append is acknowledged (its call returns `Ok`) only once its records are
//! framed in the pool, so a `buffered` acknowledgement survives the client; a `disk` waiter is
//! released only by the completion of the write that made its LSN durable, all the waiters of
//! one round by that one completion; the emergency flush stops admission before it measures what
//! it must write, so nothing is acknowledged that it does not then write.

mod backup;
mod levels;
mod local_copy;
mod queries;
mod switchover;

pub use queries::{NetStats, Opened};

use crate::config::DaemonConfig;
use crate::error::{Error, Result, ShutdownError, StartError};
use crate::logs::Logs;
use crate::measure;
use crate::pool::{Admission, LogId, Pool, PoolConfig, PoolError, Record};
use crate::sync::lock;
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use stela_proto::{DirtyCap, EmergencyFlush};

/// Who to tell when a `disk` wait ends: called once, on the flusher thread that completed the
/// write (or at once, if the LSN was already durable), with how it ended.
pub type Waiter = Box<dyn FnOnce(Result<(), PoolError>) + Send>;

/// Called once after a completion released waiters or freed space (`true`): the event loop
/// then answers waiting connections and retries appends that found no space.
pub type ReleaseHook = Box<dyn Fn(bool) + Send + Sync>;

pub struct Engine {
    config: DaemonConfig,
    cap: DirtyCap,
    /// The live cap below `cap`, kept by the flushes ([`crate::cap`]).
    cap_keeper: Arc<crate::cap::Keeper>,
    pool: Arc<Pool<Waiter>>,
    logs: Arc<Logs>,
    last_emergency_flush: Mutex<Option<EmergencyFlush>>,
    started: Instant,
    release_hook: Arc<OnceLock<ReleaseHook>>,
    flushers: Mutex<Vec<JoinHandle<()>>>,
    pub metrics: Arc<crate::metrics::Metrics>,
    /// The node's role, its shipping to the standby, the standby's view ([`levels::Availability`]).
    ha: levels::Availability,
}

impl Engine {
    /// Measures the disk (unless told its rate), sizes the pool under the power window, and
    /// starts the flushers.
    pub fn start(config: &DaemonConfig) -> Result<Arc<Engine>, StartError> {
        config.check()?;
        let logs_dir = config.dir.join("logs");
        if std::fs::symlink_metadata(&logs_dir).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(StartError::Symlink(logs_dir));
        }
        stela_wal::storage::create_dir_durably(config.storage.as_ref(), &logs_dir).map_err(
            |source| StartError::Dir {
                path: config.dir.clone(),
                source,
            },
        )?;
        let cap = measure::cap_for(config)?;
        let pool: Arc<Pool<Waiter>> = Arc::new(Pool::new(PoolConfig {
            buffers: config.buffers,
            buffer_bytes: config.buffer_bytes,
            dirty_cap: cap.bytes.max(4096) as usize,
            write_threshold: config.write_threshold.max(1),
            flush_interval: config.flush_interval,
        }));
        let logs = Arc::new(Logs::new(
            &config.dir,
            Arc::clone(&config.storage),
            config.segment_bytes,
            config.quota,
        ));
        let release_hook: Arc<OnceLock<ReleaseHook>> = Arc::new(OnceLock::new());
        let cap_keeper = Arc::new(crate::cap::Keeper::new(crate::cap::Governor::for_pool(
            cap.bytes.max(4096),
            config.buffer_bytes as u64,
            config.write_threshold.max(1) as u64,
            (config.power_window / 2).mul_f64(measure::RATE_SAFETY),
        )));
        let metrics = Arc::new(crate::metrics::Metrics::new());
        let mut flushers = Vec::new();
        for index in 0..config.flushers {
            let (pool, logs, hook, metrics, keeper) = (
                Arc::clone(&pool),
                Arc::clone(&logs),
                Arc::clone(&release_hook),
                Arc::clone(&metrics),
                Arc::clone(&cap_keeper),
            );
            let observe = move |pool: &Pool<Waiter>, bytes, elapsed| {
                if let Some(cap) = keeper.observe(bytes, elapsed) {
                    pool.set_live_cap(cap as usize);
                }
            };
            let name = format!("stela-flusher-{index}");
            let thread = std::thread::Builder::new()
                .name(name.clone())
                .spawn(move || {
                    abort_on_panic("a flusher", || {
                        let observe = |bytes, elapsed| observe(&pool, bytes, elapsed);
                        crate::flusher::run(&pool, &logs, &metrics, &observe, &|released| {
                            for (waiter, outcome) in released.waiters {
                                waiter(outcome);
                            }
                            if let Some(hook) = hook.get() {
                                hook(released.space_freed);
                            }
                        })
                    })
                })
                .map_err(|source| StartError::Thread { name, source })?;
            flushers.push(thread);
        }
        Ok(Arc::new(Engine {
            config: config.clone(),
            cap,
            cap_keeper,
            pool,
            logs,
            last_emergency_flush: Mutex::new(None),
            started: Instant::now(),
            ha: levels::availability(config, &release_hook)?,
            release_hook,
            flushers: Mutex::new(flushers),
            metrics,
        }))
    }

    /// Installs what a completion calls after releasing waiters (the event loop's wake-up).
    pub fn on_release(&self, hook: ReleaseHook) {
        let _ = self.release_hook.set(hook);
    }

    fn pool_error(&self, log: LogId, error: PoolError) -> Error {
        match error {
            PoolError::NoSpace => Error::NoSpace,
            other => Error::from_pool(&self.log_name(log), other),
        }
    }

    /// Places `records` as one run of LSNs; returns (first, last). `Error::NoSpace`: nothing was
    /// placed, retry after the release hook reports freed space. With a standby the records are
    /// shipped when the caller ends its turn ([`Engine::end_turn`]), or by the shipper thread
    /// within a heartbeat if it never does.
    ///
    /// The records are charged to the log's owner first (`Error::QuotaExceeded`: nothing was
    /// placed), and the charge given back if they are not placed.
    pub fn append(&self, log: LogId, records: &[Record<'_>]) -> Result<(u64, u64)> {
        let quotas = self.logs.quotas();
        let bytes = if quotas.limits().any() {
            let bytes = records
                .iter()
                .map(|r| crate::quota::record_bytes(r.payload.len()))
                .sum();
            quotas.charge(log, bytes)?;
            bytes
        } else {
            0
        };
        let placed = self.pool.try_append(log, records);
        if placed.is_err() {
            quotas.refund(log, bytes);
        }
        self.shipper_has_work(log);
        placed.map_err(|e| self.pool_error(log, e))
    }

    /// Calls `waiter` once every record of `log` up to `lsn` is durable. `Ok(true)`: that is
    /// already so, and `waiter` is dropped uncalled; `Ok(false)`: it will be called.
    pub fn when_durable(&self, log: LogId, lsn: u64, waiter: Waiter) -> Result<bool> {
        match self.pool.when_durable(log, lsn, waiter) {
            Ok(already) => Ok(already.is_some()),
            Err((_, error)) => Err(self.pool_error(log, error)),
        }
    }

    /// A `buffered` commit: every LSN appended is already acknowledged at `buffered`.
    pub fn check_appended(&self, log: LogId, lsn: u64) -> Result<()> {
        let (next, _) = self.pool.positions(log);
        if lsn >= next {
            return Err(Error::NotAppended {
                log: self.log_name(log),
                lsn,
                next,
            });
        }
        if let Some(failure) = self.pool.log_failure(log) {
            return Err(self.pool_error(log, failure));
        }
        Ok(())
    }

    /// The emergency flush: stop admitting, write and sync everything, report how long it took.
    /// Blocking (it waits for the flushers).
    pub fn power_fail(&self) -> EmergencyFlush {
        let at_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let started = Instant::now();
        let bytes = self.pool.begin_drain(Admission::PowerFailing);
        self.pool.wait_drained();
        let micros = started.elapsed().as_micros() as u64;
        let failures = self.stopped_logs().iter().map(Error::to_string).collect();
        let budget_micros = (self.config.power_window / 2).as_micros() as u64;
        let report = EmergencyFlush {
            bytes: bytes as u64,
            micros,
            budget_micros,
            at_unix_ms,
            failures,
        };
        if micros <= budget_micros && report.failures.is_empty() {
            tracing::warn!(bytes, micros, budget_micros, "power failure: every buffer written and synced; writes refused until power-restore");
        } else {
            tracing::error!(bytes, micros, budget_micros, failures = ?report.failures, "power failure: flush over budget or incomplete");
        }
        *lock(&self.last_emergency_flush) = Some(report.clone());
        report
    }

    /// Admits writes again after a power failure.
    pub fn power_restore(&self) {
        if self.pool.reopen() {
            tracing::info!("power restored: admitting writes again");
        }
    }

    /// Why each log that cannot take writes cannot ([`Error::LogStopped`], [`Error::DiskFull`]).
    fn stopped_logs(&self) -> Vec<Error> {
        self.logs
            .all()
            .iter()
            .filter_map(|entry| Some(self.pool_error(entry.id, self.pool.log_failure(entry.id)?)))
            .collect()
    }

    /// Stops admitting, writes and syncs every buffer, stops the flushers and closes the logs.
    /// Returns what could not be written.
    pub fn shutdown(&self) -> Result<(), ShutdownError> {
        let started = Instant::now();
        let bytes = self.pool.begin_drain(Admission::ShuttingDown);
        self.pool.wait_drained();
        let logs = self.stopped_logs();
        let mut panicked_flushers = 0;
        for flusher in lock(&self.flushers).drain(..) {
            panicked_flushers += usize::from(flusher.join().is_err());
        }
        tracing::info!(
            bytes,
            micros = started.elapsed().as_micros() as u64,
            "flushed every buffer for shutdown"
        );
        drop(self.logs.take_all());
        match (logs.is_empty(), panicked_flushers) {
            (true, 0) => Ok(()),
            _ => Err(ShutdownError {
                logs,
                panicked_flushers,
            }),
        }
    }
}

/// Runs `body`; if it panics (a bug: the daemon never panics on input), stops the whole process
/// at once. A daemon with a dead flusher or event loop would keep acknowledging what it can no
/// longer write, or hang every client; dying is the fail-stop answer, with the same guarantees as
/// a SIGKILL (`docs/DURABILITY.md`).
pub(crate) fn abort_on_panic(what: &str, body: impl FnOnce()) {
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)).is_err() {
        tracing::error!("{what} panicked; stopping the daemon");
        eprintln!("stela: {what} panicked; stopping the daemon");
        std::process::abort();
    }
}
