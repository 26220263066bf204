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

use crate::config::DaemonConfig;
use crate::error::{Error, Result, StartError};
use crate::logs::{LogEntry, Logs};
use crate::measure;
use crate::pool::{Admission, LogId, Pool, PoolConfig, PoolError, PoolRead, Record};
use crate::sync::lock;
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use stela_proto::{
    DirtyCap, EmergencyFlush, LogStatus, Payload, Positions, ResponseBody, StatusReport,
};
use stela_wal::Lsn;

/// Who to tell when a `disk` wait ends: called once, on the flusher thread that completed the
/// write (or at once, if the LSN was already durable), with how it ended.
pub type Waiter = Box<dyn FnOnce(Result<(), PoolError>) + Send>;

/// Called once after a completion released waiters or freed space (`true`): the event loop
/// then answers waiting connections and retries appends that found no space.
pub type ReleaseHook = Box<dyn Fn(bool) + Send + Sync>;

/// A log opened for one more handle.
#[derive(Debug, Clone)]
pub struct Opened {
    pub log: LogId,
    pub name: String,
    pub positions: Positions,
    pub max_record_bytes: usize,
}

/// What the connection layer knows that `stela status` shows.
#[derive(Debug, Clone, Default)]
pub struct NetStats {
    pub connections: u32,
    pub max_connections: u32,
    pub file_limit: u64,
    pub rings: u32,
    pub refused_connections: u64,
    pub partial_frame_bytes: u64,
    pub partial_frame_cap: u64,
}

pub struct Engine {
    config: DaemonConfig,
    cap: DirtyCap,
    pool: Arc<Pool<Waiter>>,
    logs: Arc<Logs>,
    last_emergency_flush: Mutex<Option<EmergencyFlush>>,
    started: Instant,
    release_hook: Arc<OnceLock<ReleaseHook>>,
    flushers: Mutex<Vec<JoinHandle<()>>>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("dir", &self.config.dir)
            .field("cap", &self.cap.bytes)
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// Measures the disk (unless told its rate), sizes the pool under the power window, and
    /// starts the flushers.
    pub fn start(config: &DaemonConfig) -> Result<Arc<Engine>, StartError> {
        config.check().map_err(StartError::Config)?;
        config
            .storage
            .create_dir_all(&config.dir.join("logs"))
            .map_err(|source| StartError::Dir {
                path: config.dir.clone(),
                source,
            })?;
        let pool_bytes = (config.buffers * config.buffer_bytes) as u64;
        let rate = match config.assume_write_rate {
            Some(rate) => rate,
            None => measure::measure_write_rate_with(
                &config.storage,
                &config.dir,
                measure::measure_bytes_for(pool_bytes),
            )
            .map_err(|source| StartError::Measure {
                path: config.dir.clone(),
                source,
            })?,
        };
        let cap = measure::dirty_cap(pool_bytes, rate, config.power_window);
        tracing::info!(derivation = %cap.derivation, "dirty-byte cap");
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
        ));
        let release_hook: Arc<OnceLock<ReleaseHook>> = Arc::new(OnceLock::new());
        let mut flushers = Vec::new();
        for index in 0..config.flushers {
            let (pool, logs, hook) = (
                Arc::clone(&pool),
                Arc::clone(&logs),
                Arc::clone(&release_hook),
            );
            let name = format!("stela-flusher-{index}");
            let thread = std::thread::Builder::new()
                .name(name.clone())
                .spawn(move || {
                    abort_on_panic("a flusher", || {
                        crate::flusher::run(&pool, &logs, &|released| {
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
            pool,
            logs,
            last_emergency_flush: Mutex::new(None),
            started: Instant::now(),
            release_hook,
            flushers: Mutex::new(flushers),
        }))
    }

    pub fn config(&self) -> &DaemonConfig {
        &self.config
    }

    pub fn dirty_cap(&self) -> &DirtyCap {
        &self.cap
    }

    /// Installs what a completion calls after releasing waiters (the event loop's wake-up).
    pub fn on_release(&self, hook: ReleaseHook) {
        let _ = self.release_hook.set(hook);
    }

    fn entry(&self, log: LogId) -> Result<Arc<LogEntry>> {
        self.logs.get(log).ok_or(Error::ShuttingDown)
    }

    /// The name of an open log (empty once it is closed).
    pub fn log_name(&self, log: LogId) -> String {
        self.logs
            .get(log)
            .map_or_else(String::new, |e| e.name.clone())
    }

    fn pool_error(&self, log: LogId, error: PoolError) -> Error {
        match error {
            PoolError::NoSpace => Error::NoSpace,
            other => Error::from_pool(&self.log_name(log), other),
        }
    }

    /// Opens (or with `create`, creates) a log for one more handle. Blocking: recovery reads
    /// the log's files.
    pub fn open(&self, name: &str, codec: &str, type_tag: &str, create: bool) -> Result<Opened> {
        let entry = self.logs.open(&self.pool, name, codec, type_tag, create)?;
        Ok(Opened {
            log: entry.id,
            name: entry.name.clone(),
            positions: self.positions(entry.id),
            max_record_bytes: self.pool.max_record_bytes(entry.id),
        })
    }

    /// Gives back one handle of `log`; the last one closes the log. Blocking.
    pub fn release(&self, log: LogId) {
        self.logs.release(&self.pool, log);
    }

    /// Places `records` as one run of LSNs; returns (first, last). `Error::NoSpace`: nothing was
    /// placed, retry after the release hook reports freed space.
    pub fn append(&self, log: LogId, records: &[Record<'_>]) -> Result<(u64, u64)> {
        self.pool
            .try_append(log, records)
            .map_err(|e| self.pool_error(log, e))
    }

    /// Calls `waiter` once every record of `log` up to `lsn` is durable: returns it back at once
    /// if that is already so, or refuses with the reason.
    pub fn when_durable(
        &self,
        log: LogId,
        lsn: u64,
        waiter: Waiter,
    ) -> Result<Option<Waiter>, (Waiter, Error)> {
        self.pool
            .when_durable(log, lsn, waiter)
            .map_err(|(w, e)| (w, self.pool_error(log, e)))
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

    pub fn positions(&self, log: LogId) -> Positions {
        let (next, durable) = self.pool.positions(log);
        let first = self
            .logs
            .get(log)
            .map_or(1, |entry| entry.segments.first_lsn().get());
        Positions {
            first_lsn: first,
            last_lsn: next - 1,
            written_lsn: durable,
            durable_lsn: durable,
        }
    }

    /// Reads records from `from` on. From the buffers only, unless `may_block`: `Ok(None)` then
    /// means the read needs the files and must be run where blocking is allowed.
    pub fn read(
        &self,
        log: LogId,
        from: u64,
        max_records: usize,
        max_bytes: usize,
        may_block: bool,
    ) -> Result<Option<ResponseBody>> {
        let from = from.max(1);
        let (next, _) = self.pool.positions(log);
        let mut records: Vec<(u64, Payload)> = Vec::new();
        match self.pool.read(log, from, max_records, max_bytes) {
            PoolRead::Buffered(found) => {
                records.extend(found.into_iter().map(|(l, p)| (l, Payload(p))));
            }
            PoolRead::OnDisk if !may_block => return Ok(None),
            PoolRead::OnDisk => {
                let entry = self.entry(log)?;
                let (_, durable) = self.pool.positions(log);
                let files_error = |source| Error::Files {
                    log: entry.name.clone(),
                    source,
                };
                let mut bytes = 0;
                let reader = entry.segments.reader(Lsn::new(from), Lsn::new(durable + 1));
                for item in reader {
                    let (lsn, payload) = item.map_err(files_error)?;
                    if records.len() >= max_records
                        || (!records.is_empty() && bytes + payload.len() > max_bytes)
                    {
                        break;
                    }
                    bytes += payload.len();
                    records.push((lsn.get(), Payload(payload)));
                }
                // Go on into the buffers, so one read is not cut short at the durable LSN (and
                // a `from` below the first segment still finds what is buffered).
                let resume = records.last().map_or(durable + 1, |&(last, _)| last + 1);
                if records.len() < max_records && bytes < max_bytes {
                    if let PoolRead::Buffered(more) =
                        self.pool
                            .read(log, resume, max_records - records.len(), max_bytes - bytes)
                    {
                        records.extend(more.into_iter().map(|(l, p)| (l, Payload(p))));
                    }
                }
            }
        }
        let next_lsn = records.last().map_or(from, |(lsn, _)| lsn + 1);
        Ok(Some(ResponseBody::Records {
            at_end: next_lsn >= next,
            next: next_lsn,
            records,
        }))
    }

    /// Releases whole segments below `before`. Blocking.
    pub fn truncate(&self, log: LogId, before: u64) -> Result<u64> {
        let entry = self.entry(log)?;
        let removed = entry
            .segments
            .truncate_before(Lsn::new(before))
            .map_err(|source| Error::Files {
                log: entry.name.clone(),
                source,
            })?;
        Ok(removed as u64)
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
        let failures = self.failures();
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

    /// One line per log that cannot take writes.
    fn failures(&self) -> Vec<String> {
        self.logs
            .all()
            .iter()
            .filter_map(|entry| {
                self.pool
                    .log_failure(entry.id)
                    .map(|f| format!("{}: {}", entry.name, self.pool_error(entry.id, f)))
            })
            .collect()
    }

    pub fn status(&self, net: &NetStats) -> StatusReport {
        let stats = self.pool.stats();
        let logs = self
            .logs
            .all()
            .iter()
            .filter_map(|entry| {
                // A log whose last handle is being closed may have left the pool already.
                let (next, durable) = self.pool.positions_if_present(entry.id)?;
                Some(LogStatus {
                    name: entry.name.clone(),
                    codec: entry.codec.name().to_owned(),
                    positions: Positions {
                        first_lsn: entry.segments.first_lsn().get(),
                        last_lsn: next - 1,
                        written_lsn: durable,
                        durable_lsn: durable,
                    },
                    dirty_bytes: self.pool.log_dirty_bytes(entry.id) as u64,
                    failure: self
                        .pool
                        .log_failure(entry.id)
                        .map(|f| self.pool_error(entry.id, f).to_string()),
                })
            })
            .collect();
        let budget_ms = self.config.power_window.as_secs_f64() * 1000.0 / 2.0;
        StatusReport {
            server: format!("stela {}", env!("CARGO_PKG_VERSION")),
            pid: std::process::id(),
            dir: self.config.dir.display().to_string(),
            uptime_ms: self.started.elapsed().as_millis() as u64,
            buffers: self.config.buffers as u32,
            buffer_bytes: self.config.buffer_bytes as u64,
            flush_interval_ms: self.config.flush_interval.as_millis() as u64,
            dirty_cap: self.cap.clone(),
            dirty_bytes: stats.dirty_bytes as u64,
            free_buffers: stats.free_buffers as u32,
            power: match self.pool.admission() {
                Admission::Open => "normal",
                Admission::PowerFailing => "failed: writes refused until power-restore",
                Admission::ShuttingDown => "shutting down",
            }
            .to_owned(),
            last_emergency_flush: lock(&self.last_emergency_flush).clone(),
            logs,
            connections: net.connections,
            max_connections: net.max_connections,
            file_limit: net.file_limit,
            rings: net.rings,
            refused_connections: net.refused_connections,
            partial_frame_bytes: net.partial_frame_bytes,
            partial_frame_cap: net.partial_frame_cap,
            threads: thread_count(),
            appends_waited: stats.appends_waited,
            bytes_written: stats.bytes_written,
            crash_semantics: vec![
                "client crash: loses nothing acknowledged (buffered or disk)".into(),
                "daemon SIGTERM/SIGINT: writes and syncs every buffer, then exits: loses nothing acknowledged".into(),
                format!(
                    "daemon SIGKILL or crash: loses buffered records not yet written (now {} B); never disk records",
                    stats.dirty_bytes
                ),
                "OS crash: same as daemon crash (the flushers sync every write, so written = synced)".into(),
                format!(
                    "power loss with notice (SIGPWR, stela power-fail, UPS hook): flushes at most {} B in about {:.1} ms, within {budget_ms:.0} ms: loses nothing acknowledged",
                    self.cap.bytes,
                    self.cap.bytes as f64 / self.cap.measured_write_bytes_per_s.max(1) as f64 * 1000.0
                ),
                "power loss without notice: like a daemon crash".into(),
                "machine or disk loss: loses everything (no standby yet; replicated and all are refused)".into(),
            ],
        }
    }

    /// Stops admitting, writes and syncs every buffer, stops the flushers and closes the logs.
    /// Returns what could not be written or closed.
    pub fn shutdown(&self) -> Result<(), String> {
        let started = Instant::now();
        let bytes = self.pool.begin_drain(Admission::ShuttingDown);
        self.pool.wait_drained();
        let mut failures = self.failures();
        for flusher in lock(&self.flushers).drain(..) {
            if flusher.join().is_err() {
                failures.push("a flusher thread panicked".into());
            }
        }
        tracing::info!(
            bytes,
            micros = started.elapsed().as_micros() as u64,
            "flushed every buffer for shutdown"
        );
        drop(self.logs.take_all());
        if failures.is_empty() {
            Ok(())
        } else {
            Err(failures.join("; "))
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

/// Threads of this process (`/proc/self/status`), for `stela status`; 0 where unknown.
fn thread_count() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("Threads:"))
                .and_then(|n| n.trim().parse().ok())
        })
        .unwrap_or(0)
}
