//! The daemon's table of named logs: each one an ordinary stela-wal directory under
//! `DIR/logs/NAME`, opened once and shared by every connection that names it.
//!
//! Invariants: a log is opened at most once per daemon (the table is the only opener, and
//! stela-wal's directory lock keeps a second process out); a name is a plain file name, so no
//! request can reach outside `DIR/logs`; a log's codec and record type never change while open:
//! a client that asks for others gets an error, as an embedded open of the same files would.

use crate::pool::{LogId, Pool};
use crate::sync::lock;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use stela_wal::storage::Storage;
use stela_wal::{Codec, Log, WalOptions};

pub struct LogEntry {
    pub name: String,
    pub codec: Codec,
    pub type_tag: String,
    pub log: Log,
}

impl std::fmt::Debug for LogEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogEntry")
            .field("name", &self.name)
            .field("codec", &self.codec)
            .field("type_tag", &self.type_tag)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("log name {0:?} is not allowed: use 1-100 of [A-Za-z0-9._-], not starting with '.'")]
    BadName(String),
    #[error("unknown codec {0:?} (expected json, msgpack or postcard)")]
    UnknownCodec(String),
    #[error("log {name:?} is open with codec {open} and record type {open_type:?}, not {asked} / {asked_type:?}")]
    Mismatch {
        name: String,
        open: Codec,
        open_type: String,
        asked: Codec,
        asked_type: String,
    },
    #[error("log {name:?} does not exist (open it with create to make it)")]
    Missing { name: String },
    #[error("opening log {name:?}: {source}")]
    Wal {
        name: String,
        #[source]
        source: stela_wal::Error,
    },
}

#[derive(Debug)]
pub struct Logs {
    dir: PathBuf,
    storage: Arc<dyn Storage>,
    segment_bytes: u64,
    table: Mutex<Table>,
}

#[derive(Debug, Default)]
struct Table {
    entries: Vec<Arc<LogEntry>>,
    by_name: HashMap<String, LogId>,
}

pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 100
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

impl Logs {
    pub fn new(dir: &Path, storage: Arc<dyn Storage>, segment_bytes: u64) -> Logs {
        Logs {
            dir: dir.join("logs"),
            storage,
            segment_bytes,
            table: Mutex::new(Table::default()),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Opens `name` (once per daemon), registering it with the pool.
    pub fn open(
        &self,
        pool: &Pool,
        name: &str,
        codec_name: &str,
        type_tag: &str,
        create: bool,
    ) -> Result<(LogId, Arc<LogEntry>), OpenError> {
        if !valid_name(name) {
            return Err(OpenError::BadName(name.to_owned()));
        }
        let codec = Codec::from_name(codec_name)
            .ok_or_else(|| OpenError::UnknownCodec(codec_name.to_owned()))?;
        // Held across the open so two connections opening the same new log cannot race.
        let mut table = lock(&self.table);
        if let Some(&id) = table.by_name.get(name) {
            let entry = Arc::clone(&table.entries[id]);
            if entry.codec != codec || entry.type_tag != type_tag {
                return Err(OpenError::Mismatch {
                    name: name.to_owned(),
                    open: entry.codec,
                    open_type: entry.type_tag.clone(),
                    asked: codec,
                    asked_type: type_tag.to_owned(),
                });
            }
            return Ok((id, entry));
        }
        let dir = self.dir.join(name);
        let exists = self.storage.list(&dir).is_ok_and(|names| !names.is_empty());
        if !exists && !create {
            return Err(OpenError::Missing {
                name: name.to_owned(),
            });
        }
        let options = WalOptions::default()
            .codec(codec)
            .segment_bytes(self.segment_bytes)
            .storage(Arc::clone(&self.storage))
            .create_if_missing(create);
        let log = Log::open(&dir, options, type_tag).map_err(|source| OpenError::Wal {
            name: name.to_owned(),
            source,
        })?;
        let id = pool.add_log(log.last_lsn().get());
        let entry = Arc::new(LogEntry {
            name: name.to_owned(),
            codec,
            type_tag: type_tag.to_owned(),
            log,
        });
        debug_assert_eq!(id, table.entries.len());
        table.entries.push(Arc::clone(&entry));
        table.by_name.insert(name.to_owned(), id);
        Ok((id, entry))
    }

    /// The log with this id; `None` only after shutdown emptied the table.
    pub fn get(&self, id: LogId) -> Option<Arc<LogEntry>> {
        lock(&self.table).entries.get(id).cloned()
    }

    /// Empties the table (at shutdown), handing back every entry in id order.
    pub fn take_all(&self) -> Vec<Arc<LogEntry>> {
        let mut table = lock(&self.table);
        table.by_name.clear();
        std::mem::take(&mut table.entries)
    }

    pub fn all(&self) -> Vec<Arc<LogEntry>> {
        lock(&self.table).entries.clone()
    }
}
