//! The primary's own copy of a `replicated` record, with three nodes or more: written to the
//! log's segment file (the OS page cache, not synced) before the commit is acknowledged, so
//! that it survives a crash of the primary's process.
//!
//! Why: an election among three nodes is decided by N - K promises, and a `replicated` record
//! is acknowledged once K standbys hold it; the two sets meet only if the primary counts as a
//! holder too, that is if its copy outlives its process. In RapiLog's buffers alone it does not:
//! `stela-bench failover --nodes 3` lost records acknowledged on one standby's receipt when the
//! primary was killed, that standby was promoted and killed in turn, and the two nodes left (the
//! restarted old primary, whose buffers had died with it, and the other standby) elected one of
//! themselves. With the primary's copy in its files, the restarted old primary holds every such
//! record and the election picks a node that holds them. A power cut of the primary still loses
//! what was not synced (docs/DURABILITY.md); the flushers sync as before.
//!
//! The event loop writes, at the end of the turn that appended the records (after shipping
//! them, so the write overlaps the standbys' round trip), the bytes the pool framed, unchanged,
//! at the offsets the pool chose; the flusher writes the same bytes there again when it syncs.
//!
//! Invariants:
//! - **The same bytes at the same places.** Only bytes copied out of the pool's buffers
//!   ([`Pool::ship`]) are written, at the segment and offset the pool gave them, and only into a
//!   segment file that exists (created, with its header, by a flusher): a segment not created
//!   yet is never made here; a wait on it becomes a `disk` wait, which creates it.
//! - **Never under the flusher's zeros.** Every write goes through the log writer's
//!   [`WrittenAhead`], whose lock the writer's zeros ahead of its data also take: they start
//!   above what was written here, so they never wipe it.
//! - **In order, no hole.** A log's bytes are written strictly in LSN order from where the pool
//!   holds them; `written` is the last LSN of a contiguous prefix and never goes down.
//! - **Nothing written after the log is forgotten or the node stepped down**: the writes and
//!   [`LocalCopy::forget`] / [`LocalCopy::step_down`] take the same lock, so a log closed (and
//!   perhaps cut by a newer primary's stream) is never written into again.
//! - **Every wait answered once**: by the write that covers it, by the flusher's sync (the
//!   `disk` wait it became), or by an error when the log is forgotten or the node steps down.

use super::Waiter;
use crate::pool::{LogId, Pool, PoolError, Ship};
use crate::sync::lock;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use stela_wal::storage::{OpenMode, Storage, StorageFile};
use stela_wal::writer::WrittenAhead;

/// Most bytes copied out of the pool per write.
const WRITE_BYTES: usize = 1 << 20;

/// Every watched log's copy.
pub struct LocalCopy {
    storage: Arc<dyn Storage>,
    logs: Mutex<Logs>,
    /// Called after waiters were answered off the event loop's turn (wakes the loop).
    released: Arc<dyn Fn() + Send + Sync>,
}

#[derive(Default)]
struct Logs {
    each: HashMap<LogId, LogCopy>,
    /// Logs appended to since the last write pass.
    appended: Vec<LogId>,
    stepped_down: Option<String>,
}

struct LogCopy {
    dir: PathBuf,
    /// The log writer's fence for writes ahead of it.
    ahead: Arc<WrittenAhead>,
    /// Where the next bytes go: (segment, offset, next LSN); `None`: from the pool's oldest
    /// buffered record.
    at: Option<(u64, u64, u64)>,
    /// The last LSN of the contiguous prefix written (or synced by a flusher).
    written: u64,
    file: Option<(u64, Box<dyn StorageFile>)>,
    waiters: Vec<(u64, Waiter)>,
    /// The last pass stopped at a segment no flusher has created yet (or at a failed write):
    /// new waits are `disk` waits until a pass gets further.
    blocked: bool,
}

/// What one write pass found for a log.
enum Pass {
    /// Everything buffered is written.
    Done,
    /// The next bytes belong to a segment no flusher has created yet.
    NoSegment,
}

impl LocalCopy {
    pub fn new(storage: Arc<dyn Storage>, released: Arc<dyn Fn() + Send + Sync>) -> LocalCopy {
        LocalCopy {
            storage,
            logs: Mutex::new(Logs::default()),
            released,
        }
    }

    /// Starts keeping the copy of `log`, whose segments are in `dir` and whose writer's fence
    /// is `ahead` (once per open).
    pub fn watch(&self, log: LogId, dir: PathBuf, ahead: Arc<WrittenAhead>) {
        lock(&self.logs).each.entry(log).or_insert(LogCopy {
            dir,
            ahead,
            at: None,
            written: 0,
            file: None,
            waiters: Vec::new(),
            blocked: false,
        });
    }

    /// The log was closed: nothing more is written into it; its waits end `Closed`.
    pub fn forget(&self, log: LogId) {
        let removed = lock(&self.logs).each.remove(&log);
        if let Some(copy) = removed {
            answer_all(copy.waiters, &PoolError::Closed);
        }
    }

    /// The node stepped down: nothing more is written; every wait ends in doubt.
    pub fn step_down(&self, why: &str) {
        let waiters: Vec<_> = {
            let mut logs = lock(&self.logs);
            logs.stepped_down = Some(why.to_owned());
            logs.each
                .values_mut()
                .flat_map(|copy| std::mem::take(&mut copy.waiters))
                .collect()
        };
        answer_all(
            waiters,
            &PoolError::InDoubt(format!("the primary stepped down: {why}")),
        );
    }

    /// Records of `log` were appended this turn.
    pub fn appended(&self, log: LogId) {
        let mut logs = lock(&self.logs);
        if logs.each.contains_key(&log) && !logs.appended.contains(&log) {
            logs.appended.push(log);
        }
    }

    /// Calls `waiter` once this node's copy of `log` holds `lsn` (written, or synced). Hands
    /// it back at once (`Ok(Some)`) if the copy already does, keeps it (`Ok(None)`), or hands it
    /// back with the reason it cannot wait (the node stepped down, the log is closed): as
    /// [`Pool::when_durable`].
    pub fn when_written(
        &self,
        pool: &Pool<Waiter>,
        log: LogId,
        lsn: u64,
        waiter: Waiter,
    ) -> Result<Option<Waiter>, (Waiter, PoolError)> {
        let mut logs = lock(&self.logs);
        if let Some(why) = &logs.stepped_down {
            let why = format!("the primary stepped down: {why}");
            return Err((waiter, PoolError::InDoubt(why)));
        }
        let Some(copy) = logs.each.get_mut(&log) else {
            return Err((waiter, PoolError::Closed));
        };
        let durable = pool
            .positions_if_present(log)
            .map_or(0, |(_, durable)| durable);
        if lsn <= copy.written.max(durable) {
            return Ok(Some(waiter));
        }
        if copy.blocked {
            drop(logs);
            return pool.when_durable(log, lsn, waiter);
        }
        copy.waiters.push((lsn, waiter));
        // Written at the end of the event loop's next turn (the standby's acknowledgement that
        // brought this wait here woke it).
        if !logs.appended.contains(&log) {
            logs.appended.push(log);
        }
        Ok(None)
    }

    /// The event loop's turn is over: writes what it appended, answers the waits now covered,
    /// and turns those waiting on a segment not created yet into `disk` waits.
    pub fn write_appended(&self, pool: &Pool<Waiter>) {
        let (answered, to_disk) = {
            let mut logs = lock(&self.logs);
            if logs.stepped_down.is_some() || logs.appended.is_empty() {
                return;
            }
            let appended = std::mem::take(&mut logs.appended);
            let mut answered = Vec::new();
            let mut to_disk = Vec::new();
            for log in appended {
                let Some(copy) = logs.each.get_mut(&log) else {
                    continue;
                };
                let pass = self.write_log(pool, log, copy).unwrap_or_else(|error| {
                    // The flusher meets the same file and stops the log (fail stop); the waits
                    // become `disk` waits, which it answers with its failure.
                    tracing::warn!(log, %error, "could not write the primary's copy of replicated records; their commits wait for the flusher's sync instead");
                    copy.file = None;
                    copy.at = None;
                    Pass::NoSegment
                });
                let (now, later) = split_covered(std::mem::take(&mut copy.waiters), copy.written);
                answered.extend(now);
                copy.blocked = matches!(pass, Pass::NoSegment);
                match pass {
                    Pass::Done => copy.waiters = later,
                    Pass::NoSegment => {
                        to_disk.extend(later.into_iter().map(|(lsn, w)| (log, lsn, w)))
                    }
                }
            }
            (answered, to_disk)
        };
        let any = !answered.is_empty();
        for waiter in answered {
            waiter(Ok(()));
        }
        for (log, lsn, waiter) in to_disk {
            match pool.when_durable(log, lsn, waiter) {
                Ok(Some(waiter)) => waiter(Ok(())),
                Ok(None) => {}
                Err((waiter, error)) => waiter(Err(error)),
            }
        }
        if any {
            (self.released)();
        }
    }

    /// Writes `log`'s buffered bytes after `copy.written`, in order.
    fn write_log(
        &self,
        pool: &Pool<Waiter>,
        log: LogId,
        copy: &mut LogCopy,
    ) -> std::io::Result<Pass> {
        let mut restarted = false;
        loop {
            let Some((_, durable)) = pool.positions_if_present(log) else {
                return Ok(Pass::Done);
            };
            if copy.written < durable {
                // The flusher synced past this copy: nothing below needs writing.
                copy.written = durable;
                copy.at = None;
            }
            let at = match copy.at {
                Some(at) => at,
                None => match pool.oldest_buffered(log) {
                    Some(place) => place,
                    None => return Ok(Pass::Done),
                },
            };
            let (segment, offset, bytes, next_lsn) = match pool.ship(log, at, WRITE_BYTES) {
                Ship::Bytes {
                    segment,
                    offset,
                    bytes,
                    next_lsn,
                    ..
                } => (segment, offset, bytes, next_lsn),
                Ship::Nothing => return Ok(Pass::Done),
                // Synced meanwhile, or the position is no longer buffered: start again from
                // the pool's oldest buffered record, once.
                Ship::OnDisk if !restarted => {
                    restarted = true;
                    copy.at = None;
                    continue;
                }
                Ship::OnDisk => return Ok(Pass::Done),
            };
            debug_assert!(
                next_lsn > copy.written,
                "the copy's written LSN never goes down"
            );
            let end = offset + bytes.len() as u64;
            let ahead = Arc::clone(&copy.ahead);
            let Some(file) = self.segment_file(copy, segment)? else {
                return Ok(Pass::NoSegment);
            };
            ahead.write(segment, end, || file.write_all_at(&bytes, offset))?;
            copy.at = Some((segment, offset + bytes.len() as u64, next_lsn));
            copy.written = copy.written.max(next_lsn - 1);
        }
    }

    /// The open file of `segment`, if a flusher has created it.
    fn segment_file<'a>(
        &self,
        copy: &'a mut LogCopy,
        segment: u64,
    ) -> std::io::Result<Option<&'a dyn StorageFile>> {
        if copy.file.as_ref().is_none_or(|(open, _)| *open != segment) {
            copy.file = None;
            let name =
                stela_format::segment_name::segment_file_name(stela_format::Lsn::new(segment));
            match self.storage.open(&copy.dir.join(name), OpenMode::ReadWrite) {
                Ok(file) => copy.file = Some((segment, file)),
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(error) => return Err(error),
            }
        }
        Ok(copy.file.as_ref().map(|(_, file)| file.as_ref()))
    }
}

/// The waits `written` covers, and the rest.
fn split_covered(waiters: Vec<(u64, Waiter)>, written: u64) -> (Vec<Waiter>, Vec<(u64, Waiter)>) {
    let (now, later): (Vec<_>, Vec<_>) = waiters.into_iter().partition(|(lsn, _)| *lsn <= written);
    (now.into_iter().map(|(_, w)| w).collect(), later)
}

fn answer_all(waiters: Vec<(u64, Waiter)>, error: &PoolError) {
    for (_, waiter) in waiters {
        waiter(Err(error.clone()));
    }
}
