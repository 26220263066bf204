//! The engine's requests that change no acknowledged record: opening and closing logs, where a
//! log stands, reading records back, truncation, and `stela status`. Apart from the
//! acknowledgement path ([`super`]), so that the durability-critical core stays small.

use super::{Engine, Waiter};
use crate::config::DaemonConfig;
use crate::error::{Error, Result};
use crate::logs::LogEntry;
use crate::pool::PoolError;
use crate::pool::{Admission, LogId, PoolRead};
use crate::sync::lock;
use std::sync::{Arc, Condvar, Mutex};
use stela_proto::DirtyCap;
use stela_proto::{
    HoldListing, LogListing, LogStatus, Payload, Positions, ResponseBody, StatusReport,
};
use stela_wal::Lsn;

/// What the connection layer knows that `stela status` shows.
/// What `resolve` is answered from: a log's term history, (term, first LSN) pairs oldest
/// first; the last LSN a second node holds; the last LSN the log holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogHistory {
    pub entries: Vec<(u64, u64)>,
    pub protected: u64,
    pub end: u64,
}

#[derive(Debug, Clone, Default)]
pub struct NetStats {
    pub connections: u32,
    pub max_connections: u32,
    pub file_limit: u64,
    pub rings: u32,
    pub refused_connections: u64,
    pub partial_frame_bytes: u64,
    pub partial_frame_cap: u64,
    pub output_bytes: u64,
    pub output_cap: u64,
    pub realtime_loop: bool,
    pub loop_spins: bool,
}

/// How opens are kept apart, and which logs a primary holds open for shipping.
#[derive(Default)]
pub struct Opens {
    /// Logs a primary with a standby keeps open (one handle each beyond its clients') so that
    /// they go on shipping, and reprotect a returning standby, when no client has them open.
    held: Mutex<std::collections::HashSet<LogId>>,
    /// Serializes opens: a first open fetches from the standby and recovers the files, which
    /// two opens of one log (a client's and the shipping of every log at start) must not do at
    /// once.
    lock: Mutex<()>,
}

/// A log opened for one more handle.
#[derive(Debug, Clone)]
pub struct Opened {
    pub log: LogId,
    pub name: String,
    pub positions: Positions,
    pub max_record_bytes: usize,
    /// The term records appended now get (0 without replication).
    pub term: u64,
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
    /// A pool refusal, told in the terms of the log it concerns.
    pub fn log_error(&self, log: LogId, error: PoolError) -> Error {
        self.pool_error(log, error)
    }

    pub fn config(&self) -> &DaemonConfig {
        &self.config
    }

    pub fn dirty_cap(&self) -> &DirtyCap {
        &self.cap
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

    /// Opens (or with `create`, creates) a log for one more handle. Blocking: recovery reads
    /// the log's files.
    /// A log it creates belongs to `owner` and counts against its quota (`None`: an
    /// administrator's, no quota).
    pub fn open(
        &self,
        name: &str,
        codec: &str,
        type_tag: &str,
        create: bool,
        owner: Option<&crate::quota::Credential>,
    ) -> Result<Opened> {
        if let Some(why) = self.ha.node.refusal() {
            return Err(Error::NotPrimary(why));
        }
        let _opening = lock(&self.ha.opens.lock);
        if let Some(replication) = self
            .ha
            .replication
            .as_ref()
            .filter(|_| !self.logs.is_open(name))
        {
            self.catch_up(replication, name, codec, type_tag);
        }
        let entry = self
            .logs
            .open(&self.pool, name, codec, type_tag, create, owner)?;
        let term = match self.ship(&entry, codec, type_tag) {
            Ok(term) => term,
            Err(error) => {
                self.release(entry.id);
                return Err(error);
            }
        };
        Ok(Opened {
            log: entry.id,
            name: entry.name.clone(),
            positions: self.positions(entry.id),
            max_record_bytes: self.pool.max_record_bytes(entry.id),
            term,
        })
    }

    /// With a standby: holds `entry` open for shipping (once) and starts its shipper; returns
    /// the term its records get (0 without a standby).
    fn ship(&self, entry: &LogEntry, codec: &str, type_tag: &str) -> Result<u64> {
        let Some(replication) = &self.ha.replication else {
            return Ok(0);
        };
        if lock(&self.ha.opens.held).insert(entry.id) {
            if let Err(error) =
                self.logs
                    .open(&self.pool, &entry.name, codec, type_tag, false, None)
            {
                lock(&self.ha.opens.held).remove(&entry.id);
                return Err(error);
            }
        }
        if let Some(local) = &self.ha.local_copy {
            let ahead = lock(&entry.writer).written_ahead();
            local.watch(entry.id, entry.segments.dir().to_path_buf(), ahead);
        }
        replication
            .watch(
                &self.pool,
                crate::replication::LogInfo {
                    id: entry.id,
                    name: entry.name.clone(),
                    codec: entry.codec,
                    type_tag: entry.type_tag.clone(),
                    segments: Arc::clone(&entry.segments),
                    dir: entry.segments.dir().to_path_buf(),
                },
                Arc::clone(&self.config.storage),
            )
            .map_err(|why| Error::NotPrimary(format!("log {}: {why}", entry.name)))
    }

    /// A primary with a standby opens every log of its directory for shipping, so that a
    /// standby that was away (a returning old primary) is brought up to date on all of them,
    /// not only those clients open. Blocking (recovery reads each log); run at start and after
    /// a promotion. A log that cannot be opened is logged and skipped.
    pub fn ship_every_log(&self) {
        if self.ha.replication.is_none() || self.ha.node.refusal().is_some() {
            return;
        }
        let names = match self.logs.on_disk() {
            Ok(listed) => listed.into_iter().map(|log| log.name),
            Err(error) => {
                tracing::warn!(%error, "cannot list the logs to ship them");
                return;
            }
        };
        for name in names.collect::<Vec<_>>() {
            if self.ha.node.stopping() {
                return;
            }
            if self.logs.is_open(&name) {
                continue;
            }
            let Some((codec, type_tag)) = self.log_header(&name) else {
                continue;
            };
            match self.open(&name, codec.name(), &type_tag, false, None) {
                // The client handle `open` took is given back; the hold stays.
                Ok(opened) => self.release(opened.log),
                Err(error) => {
                    tracing::warn!(log = name, %error, "cannot open the log to ship it")
                }
            }
        }
    }

    /// The codec and record type a log's newest segment names.
    fn log_header(&self, name: &str) -> Option<(stela_format::Codec, String)> {
        let dir = self.logs.dir().join(name);
        let newest = self
            .config
            .storage
            .list(&dir)
            .ok()?
            .into_iter()
            .filter_map(|file| {
                stela_format::segment_name::parse_segment_file_name(&file).map(|lsn| (lsn, file))
            })
            .max()?;
        let path = dir.join(newest.1);
        let mut bytes = [0u8; stela_format::header::HEADER_BYTES];
        self.config
            .storage
            .open(&path, stela_wal::storage::OpenMode::Read)
            .and_then(|file| file.read_exact_at(&mut bytes, 0))
            .ok()?;
        let header = stela_format::SegmentHeader::decode(&bytes).ok()?;
        if header.type_tag.shown.len() < header.type_tag.len as usize {
            tracing::warn!(
                log = name,
                "the record type's name is longer than a header keeps; not shipped until a client opens it"
            );
            return None;
        }
        Some((header.codec, header.type_tag.shown))
    }

    /// The term history of `log` and its last LSN (`History`): empty without replication.
    ///
    /// Answered only by the primary of the newest epoch this node knows of
    /// ([`crate::cluster::Node::resolution_refusal`]; `NotPrimary` otherwise), and the last LSN
    /// given is the last one protected (`Replication::protected_through`): a record a client
    /// resolves `Kept` from this answer is in this primary's history and held by a second node,
    /// and one it resolves `Lost` was replaced by a newer primary's.
    /// The log's term history, the last LSN a second node holds, and the last it holds at all.
    pub fn history(&self, log: LogId) -> Result<LogHistory> {
        if let Some(why) = self.node().resolution_refusal() {
            return Err(Error::NotPrimary(why));
        }
        let last = self.pool.positions(log).0 - 1;
        let Some(replication) = self.ha.replication.as_ref() else {
            return Ok(LogHistory {
                entries: Vec::new(),
                protected: last,
                end: last,
            });
        };
        let entries = replication
            .history(log)
            .map(|(_, history)| history.entries().iter().map(|&(t, f)| (t.0, f)).collect())
            .unwrap_or_default();
        let promoted = self.node().promoted_here();
        Ok(LogHistory {
            entries,
            protected: last.min(replication.protected_through(log, promoted)),
            end: last,
        })
    }

    /// This node's role and epoch.
    pub fn node(&self) -> &Arc<crate::cluster::Node> {
        &self.ha.node
    }

    /// Keeps the record schema a client sent with its open (`stela_format::schema`) in the log's
    /// directory, for dumps. A schema that does not parse, or cannot be written, is logged and
    /// dropped: it never fails the open.
    pub fn keep_schema(&self, opened: &Opened, schema: &str) {
        if stela_format::schema::Schema::from_json(schema).is_none() {
            tracing::warn!(log = %opened.name, "a client sent a record schema that does not parse; not kept");
            return;
        }
        let dir = self.logs.dir().join(&opened.name);
        if let Err(error) = stela_wal::schema::store(self.config.storage.as_ref(), &dir, schema) {
            tracing::warn!(log = %opened.name, %error, "the record schema was not stored; dumps show arrays");
        }
    }

    /// Brings back from the standby what a crash took from this primary's copy of `name`.
    fn catch_up(
        &self,
        replication: &crate::replication::Replicas,
        name: &str,
        codec: &str,
        type_tag: &str,
    ) {
        let (Some(codec), true) = (
            stela_format::Codec::from_name(codec),
            crate::logs::valid_name(name),
        ) else {
            return; // the open itself says what is wrong
        };
        let options = stela_wal::WalOptions::default()
            .codec(codec)
            .segment_bytes(self.config.segment_bytes)
            .storage(Arc::clone(&self.config.storage))
            .create_if_missing(false);
        let dir = self.logs.dir().join(name);
        if let Err(why) = replication.catch_up(name, &dir, type_tag, options) {
            tracing::warn!(
                log = name,
                why = %why,
                "could not fetch from the standby what this primary may lack"
            );
        }
    }

    /// Gives back one handle of `log`; the last one closes the log. Blocking.
    pub fn release(&self, log: LogId) {
        self.logs
            .release(&self.pool, log, |last| self.wait_durable(log, last));
        if let Some(replication) = self
            .ha
            .replication
            .as_ref()
            .filter(|_| self.logs.get(log).is_none())
        {
            replication.unwatch(log);
            if let Some(local) = &self.ha.local_copy {
                local.forget(log);
            }
        }
    }

    /// Blocks until every record of `log` up to `lsn` is durable (closing a log).
    fn wait_durable(&self, log: LogId, lsn: u64) -> Result<(), PoolError> {
        let done = Arc::new((Mutex::new(None), Condvar::new()));
        let signal = Arc::clone(&done);
        let waiter: Waiter = Box::new(move |outcome| {
            *lock(&signal.0) = Some(outcome);
            signal.1.notify_all();
        });
        match self.pool.when_durable(log, lsn, waiter) {
            Ok(Some(_)) => Ok(()),
            Err((_, error)) => Err(error),
            Ok(None) => {
                let mut outcome = lock(&done.0);
                loop {
                    if let Some(outcome) = outcome.take() {
                        return outcome;
                    }
                    outcome = done.1.wait(outcome).unwrap_or_else(|e| e.into_inner());
                }
            }
        }
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
        let mut bytes = 0;
        // From the files up to the durable LSN, then on into the buffers; a flusher may make
        // what was buffered durable (and free it) meanwhile, so read the files again from there.
        loop {
            let at = records.last().map_or(from, |&(last, _)| last + 1);
            let (want, room) = (max_records - records.len(), max_bytes.saturating_sub(bytes));
            if want == 0 || room == 0 {
                break;
            }
            match self.pool.read(log, at, want, room) {
                PoolRead::Buffered(found) => {
                    records.extend(found.into_iter().map(|(l, p)| (l, Payload(p))));
                    break;
                }
                PoolRead::OnDisk if !may_block => return Ok(None),
                PoolRead::OnDisk => {
                    let entry = self.entry(log)?;
                    let (_, durable) = self.pool.positions(log);
                    let before = records.len();
                    let mut full = false;
                    // A reader following the tail starts where the last one stopped; if that
                    // point no longer holds (the frame there fails its checks), read again from
                    // the segment's beginning, as without it.
                    let (from_lsn, end_lsn) = (Lsn::new(at), Lsn::new(durable + 1));
                    let mut reader = entry.segments.tail_reader(from_lsn, end_lsn);
                    let mut hinted = true;
                    // Where the reader stood before the record that did not fit, if one did not.
                    let mut stop_point = None;
                    loop {
                        let point_before = reader.read_point();
                        let Some(item) = reader.next_record() else {
                            break;
                        };
                        let (lsn, payload) = match item {
                            Ok((lsn, payload)) => (lsn, payload),
                            Err(_) if hinted && records.len() == before => {
                                entry.segments.remember_read_point(None);
                                reader = entry.segments.reader(from_lsn, end_lsn);
                                hinted = false;
                                continue;
                            }
                            Err(source) => {
                                return Err(Error::Files {
                                    log: entry.name.clone(),
                                    source,
                                })
                            }
                        };
                        if records.len() >= max_records
                            || (!records.is_empty() && bytes + payload.len() > max_bytes)
                        {
                            full = true;
                            stop_point = Some(point_before);
                            break;
                        }
                        bytes += payload.len();
                        records.push((lsn.get(), Payload(payload.to_vec())));
                    }
                    entry
                        .segments
                        .remember_read_point(stop_point.unwrap_or_else(|| reader.read_point()));
                    if full {
                        break;
                    }
                    if records.len() == before {
                        // Nothing on disk at `at` (below the first segment): what is buffered.
                        if let PoolRead::Buffered(found) =
                            self.pool.read(log, durable + 1, want, room)
                        {
                            records.extend(found.into_iter().map(|(l, p)| (l, Payload(p))));
                        }
                        break;
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
    /// Every log in the directory: open ones with their last LSN and state.
    pub fn list_logs(&self) -> Result<Vec<LogListing>> {
        let open: std::collections::HashMap<String, Arc<LogEntry>> = self
            .logs
            .all()
            .into_iter()
            .map(|entry| (entry.name.clone(), entry))
            .collect();
        let listed = self.logs.on_disk()?;
        Ok(listed
            .into_iter()
            .map(|disk| {
                let crate::logs::OnDisk {
                    name,
                    handles,
                    segments,
                    bytes: bytes_on_disk,
                    first_lsn,
                } = disk;
                let entry = open.get(&name);
                // The handle a primary holds for shipping is not a client's.
                let handles = handles
                    - u32::from(entry.is_some_and(|e| lock(&self.ha.opens.held).contains(&e.id)));
                let positions = entry.and_then(|e| self.pool.positions_if_present(e.id));
                let last_lsn = positions.map(|(next, _)| next - 1);
                let durable_lsn = positions.map(|(_, durable)| durable);
                let state = match entry.and_then(|e| self.pool.log_failure(e.id)) {
                    Some(error @ PoolError::DiskFull(_)) => format!(
                        "waiting for space: {}",
                        self.pool_error(entry.map_or(0, |e| e.id), error)
                    ),
                    Some(error) => format!(
                        "stopped: {}",
                        self.pool_error(entry.map_or(0, |e| e.id), error)
                    ),
                    None if handles > 0 => "open".to_owned(),
                    None => "closed".to_owned(),
                };
                let holds = self.holds_on(&name);
                LogListing {
                    name,
                    handles,
                    segments,
                    bytes_on_disk,
                    first_lsn,
                    last_lsn,
                    durable_lsn,
                    state,
                    holds,
                }
            })
            .collect())
    }

    /// The holds on this node's copy of `log`: warm followers' on a standby, the standby's on a
    /// primary (`replication::hold`). Holds that cannot be listed are shown as one unreadable
    /// hold, which keeps everything, as truncation counts it.
    fn holds_on(&self, log: &str) -> Vec<HoldListing> {
        let storage = self.config.storage.as_ref();
        match stela_wal::holds::list(storage, &self.logs.dir().join(log)) {
            Ok(holds) => holds
                .into_iter()
                .map(|hold| HoldListing {
                    lsn: hold.lsn.get(),
                    holder: hold.holder.unwrap_or_else(|| {
                        let name = hold.file.file_name().unwrap_or_default();
                        name.to_string_lossy().into_owned()
                    }),
                    unreadable: hold.unreadable,
                })
                .collect(),
            Err(why) => vec![HoldListing {
                lsn: 1,
                holder: String::new(),
                unreadable: Some(why.to_string()),
            }],
        }
    }

    /// Releases a warm follower's or a standby's hold on this node's copy of `log` (`stela logs
    /// release-hold`); returns the LSN it held from.
    pub fn release_hold(&self, log: &str, holder: &str) -> Result<u64> {
        if !crate::logs::valid_name(log) {
            return Err(Error::BadLogName(log.to_owned()));
        }
        let storage = self.config.storage.as_ref();
        let log_dir = self.logs.dir().join(log);
        let released =
            stela_wal::holds::release(storage, &log_dir, holder).map_err(|source| Error::Io {
                what: format!("releasing the hold of {holder} on log {log}"),
                source,
            })?;
        match released {
            Some(hold) => {
                tracing::info!(log, holder, lsn = hold.lsn.get(), "released a hold");
                Ok(hold.lsn.get())
            }
            None => {
                let held_by: Vec<String> =
                    self.holds_on(log).into_iter().map(|h| h.holder).collect();
                Err(Error::BadRequest(format!(
                    "no hold of {holder:?} on log {log:?} (its holds: {held_by:?})"
                )))
            }
        }
    }

    /// Deletes a log no client has open (its files, durably).
    pub fn delete_log(&self, name: &str) -> Result<(u32, u64)> {
        // The shipping hold goes first when it is the only handle left.
        let held = self.logs.all().into_iter().find(|e| e.name == name);
        if let Some(entry) = held {
            if self.logs.handles(entry.id) == 1 && lock(&self.ha.opens.held).remove(&entry.id) {
                self.release(entry.id);
            }
        }
        let deleted = self.logs.delete(name)?;
        if let Some(replication) = &self.ha.replication {
            replication.forget(name);
        }
        Ok(deleted)
    }

    /// Whether the daemon has begun to shut down.
    pub fn is_shut_down(&self) -> bool {
        self.pool.admission() == Admission::ShuttingDown
    }

    /// Applies `--retain-bytes`: for each open log, removes the oldest whole segments beyond
    /// the newest ones that hold at least `keep` bytes. Only sealed segments go (the newest is
    /// never removed), and a sealed segment was synced before its successor was created, so
    /// nothing not yet durable is ever removed. Returns the segments removed.
    pub fn apply_retention(&self, keep: u64) -> usize {
        let mut removed = 0;
        for entry in self.logs.all() {
            let segments = entry.segments.list();
            let mut kept_bytes = 0;
            let mut first_kept = segments.len();
            for (index, segment) in segments.iter().enumerate().rev() {
                if kept_bytes >= keep {
                    break;
                }
                kept_bytes += self.file_bytes(&segment.path);
                first_kept = index;
            }
            if first_kept == 0 || first_kept >= segments.len() {
                continue;
            }
            let before = self.held_back(&entry, segments[first_kept].start.get());
            match self.truncate_segments(&entry, before) {
                Ok(0) => {}
                Ok(count) => {
                    removed += count;
                    tracing::info!(log = %entry.name, segments = count, before,
                        "retention: removed the oldest segments");
                }
                Err(error) => tracing::warn!(log = %entry.name, %error, "retention failed"),
            }
        }
        removed
    }

    /// A client's truncation of `log` below `before`: whole segments only, and none that a
    /// hold still needs (see [`Engine::held_back`]). Returns the segments removed.
    pub fn truncate(&self, log: LogId, before: u64) -> Result<u64> {
        let entry = self.entry(log)?;
        let before = self.held_back(&entry, before);
        let removed = self
            .truncate_segments(&entry, before)
            .map_err(|source| Error::Files {
                log: entry.name.clone(),
                source,
            })?;
        Ok(removed as u64)
    }

    /// Removes `entry`'s whole segments below `before`; with quotas, their bytes are given
    /// back to the log's owner.
    fn truncate_segments(
        &self,
        entry: &LogEntry,
        before: u64,
    ) -> std::result::Result<usize, stela_wal::Error> {
        let quotas = self.logs.quotas();
        let storage = self.config.storage.as_ref();
        let dir = entry.segments.dir();
        let counted = quotas.limits().any();
        let bytes_before = counted.then(|| crate::quota::files_bytes(storage, dir));
        let removed = entry.segments.truncate_before(Lsn::new(before))?;
        if let (Some(bytes_before), true) = (bytes_before, removed > 0) {
            let freed = bytes_before.saturating_sub(crate::quota::files_bytes(storage, dir));
            quotas.released(&entry.name, freed);
        }
        Ok(removed)
    }

    /// `before`, lowered to the lowest hold on `entry`'s copy: a standby's, which its primary
    /// records from the first LSN the standby has not stored (`replication`), or a warm
    /// follower's. A lagging or absent standby then finds every record it lacks when it comes
    /// back, as PostgreSQL's replication slots keep WAL. A hold that cannot be read keeps
    /// everything, and is reported.
    fn held_back(&self, entry: &LogEntry, before: u64) -> u64 {
        let storage = self.config.storage.as_ref();
        let holds = match stela_wal::holds::list(storage, entry.segments.dir()) {
            Ok(holds) => holds,
            Err(why) => {
                tracing::warn!(log = %entry.name, why = %why, "the log's holds cannot be listed; it keeps everything");
                return 1;
            }
        };
        let replication = self.ha.replication.as_ref();
        let ours = replication.map_or_else(Vec::new, |r| r.standby_holders());
        let mut lowest = before;
        for hold in &holds {
            if let Some(why) = &hold.unreadable {
                tracing::warn!(log = %entry.name, hold = %hold.file.display(), why, "a hold cannot be read; the log keeps everything from LSN 1");
            }
            let mut lsn = hold.lsn.get();
            if hold.is_standby() {
                // Only this primary's standby's hold counts: one left for another address, or
                // on a daemon that now has no standby, stands for no one (that standby, if it
                // ever comes back, begins its copy again).
                let Some(holder) = hold.holder.as_ref().filter(|h| ours.contains(h)) else {
                    tracing::debug!(log = %entry.name, holder = ?hold.holder, "a hold left for a standby this daemon does not ship to: not counted");
                    continue;
                };
                // The standby's hold as its acknowledgements stand now, not as its file last
                // said.
                let stored = replication.and_then(|r| r.standby_stored(holder, entry.id));
                lsn = lsn.max(stored.unwrap_or(0));
                if let Some(max) = self.config.standby_keep_max.filter(|_| lsn < lowest) {
                    let kept = self.bytes_from(entry, lsn);
                    if kept > max {
                        tracing::warn!(log = %entry.name, holder = ?hold.holder, held = lsn, kept, max,
                            "the standby's hold would keep more than --standby-keep-max: passed over; the standby will begin its copy again at the oldest segment left");
                        continue;
                    }
                }
            }
            if lsn < lowest {
                tracing::debug!(log = %entry.name, before, held = lsn, holder = ?hold.holder, "truncation kept back by a hold");
                lowest = lsn;
            }
        }
        lowest
    }

    /// The bytes of `entry`'s segments that hold `lsn` or anything after it.
    fn bytes_from(&self, entry: &LogEntry, lsn: u64) -> u64 {
        let segments = entry.segments.list();
        let first = segments
            .iter()
            .rposition(|s| s.start.get() <= lsn)
            .unwrap_or(0);
        segments[first..]
            .iter()
            .map(|s| self.file_bytes(&s.path))
            .sum()
    }

    /// The size of the file at `path` through the daemon's storage; 0 if it cannot be read.
    fn file_bytes(&self, path: &std::path::Path) -> u64 {
        let storage = self.config.storage.as_ref();
        storage
            .open(path, stela_wal::storage::OpenMode::Read)
            .and_then(|file| file.len())
            .unwrap_or(0)
    }

    pub fn status(&self, net: &NetStats) -> StatusReport {
        let stats = self.pool.stats();
        let logs = self
            .logs
            .all()
            .iter()
            .filter_map(|entry| self.log_status(entry))
            .collect();
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
                Admission::HandingOver => "handing over: appends refused during a switchover",
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
            output_bytes: net.output_bytes,
            output_cap: net.output_cap,
            live_dirty_cap: self.cap_keeper.status(),
            node: self
                .ha
                .node
                .clustered_node()
                .then(|| self.ha.node.name.clone()),
            realtime_loop: net.realtime_loop,
            loop_spins: net.loop_spins,
            threads: thread_count(),
            appends_waited: stats.appends_waited,
            bytes_written: stats.bytes_written,
            crash_semantics: self.crash_semantics(stats.dirty_bytes),
            replication: self.replication_status(|log| {
                let last = self
                    .pool
                    .positions_if_present(log)
                    .map_or(0, |(next, _)| next - 1);
                (last, self.pool.append_place(log))
            }),
        }
    }

    /// One log's line of `stela status`; `None` for a log whose last handle is being closed
    /// (it may have left the pool already).
    fn log_status(&self, entry: &LogEntry) -> Option<LogStatus> {
        let (next, durable) = self.pool.positions_if_present(entry.id)?;
        let mut status = LogStatus {
            name: entry.name.clone(),
            codec: entry.codec.name().to_owned(),
            positions: Positions {
                first_lsn: entry.segments.first_lsn().get(),
                last_lsn: next - 1,
                written_lsn: durable,
                durable_lsn: durable,
            },
            dirty_bytes: self.pool.log_dirty_bytes(entry.id) as u64,
            failure: None,
            waiting_for_space: None,
        };
        match self.pool.log_failure(entry.id) {
            Some(error @ PoolError::DiskFull(_)) => {
                status.waiting_for_space = Some(self.pool_error(entry.id, error).to_string());
            }
            Some(error) => status.failure = Some(self.pool_error(entry.id, error).to_string()),
            None => {}
        }
        Some(status)
    }

    /// What each kind of crash loses with this daemon's settings, one line each (with
    /// `dirty_bytes` buffered records not yet written now).
    fn crash_semantics(&self, dirty_bytes: usize) -> Vec<String> {
        let budget_ms = self.config.power_window.as_secs_f64() * 1000.0 / 2.0;
        vec![
            "client crash: loses nothing acknowledged (buffered or disk)".into(),
            "daemon SIGTERM/SIGINT: writes and syncs every buffer, then exits: loses nothing acknowledged".into(),
            format!(
                "daemon SIGKILL or crash: loses buffered records not yet written (now {} B); never disk records{}",
                dirty_bytes,
                if self.ha.replication.is_some() {
                    "; replicated and all records are on the standby, and fetched back when a log is opened after the restart"
                } else {
                    ""
                }
            ),
            "OS crash: same as daemon crash (the flushers sync every write, so written = synced)".into(),
            format!(
                "power loss with notice (SIGPWR, stela power-fail, UPS hook): flushes at most {} B in about {:.1} ms, within {budget_ms:.0} ms: loses nothing acknowledged",
                self.cap.bytes,
                self.cap.bytes as f64 / self.cap.measured_write_bytes_per_s.max(1) as f64 * 1000.0
            ),
            "power loss without notice: like a daemon crash".into(),
            if self.ha.replication.is_some() {
                "machine or disk loss: replicated and all records are on the standby; buffered and disk ones only here".into()
            } else {
                "machine or disk loss: loses everything (no standby: replicated and all are refused)".into()
            },
        ]
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
