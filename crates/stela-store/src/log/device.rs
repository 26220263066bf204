//! The [`LogDevice`] trait, and its implementation on the embedded `stela_wal::Wal`: see the
//! module documentation of `log` for what the store needs from a log.

use crate::error::{Error, Result};
use crate::format::LogRecord;
use stela_format::Lsn;

/// The type tag of the store's log records, the same embedded and in a daemon, so a log moves
/// between the two (a daemon's log directory is an embedded log's).
pub const TYPE_TAG: &str = "stela-store";

/// A log the store writes its records to. See the module documentation.
pub trait LogDevice: Send + Sync {
    /// Appends a record; it is durable only once [`LogDevice::flush`] covers its LSN.
    fn append(&self, record: &LogRecord) -> Result<Lsn>;
    /// As [`LogDevice::append`], for a record the caller keeps too: a log that holds records in
    /// memory (the decoupled services' tail) shares it instead of copying it.
    fn append_shared(&self, record: &std::sync::Arc<LogRecord>) -> Result<Lsn> {
        self.append(record)
    }
    /// `record` encoded as this device stores it, for [`LogDevice::append_encoded`], or
    /// `None` from a device that encodes only in `append` (the default). It lets a caller that
    /// appends under a lock of its own (the log tail) encode a large record (a checkpoint's
    /// tables) before taking it.
    ///
    /// # Errors
    /// The record cannot be encoded.
    fn encode(&self, record: &LogRecord) -> Result<Option<Vec<u8>>> {
        let _ = record;
        Ok(None)
    }

    /// Appends `record`, given as `encoded` by [`LogDevice::encode`] of this device. The
    /// default appends `record` itself.
    fn append_encoded(&self, record: &LogRecord, encoded: &[u8]) -> Result<Lsn> {
        let _ = encoded;
        self.append(record)
    }

    /// Returns once every record up to `lsn` is durable at the log's level.
    fn flush(&self, lsn: Lsn) -> Result<()>;
    /// Every record up to this LSN is durable.
    fn durable_lsn(&self) -> Lsn;
    /// The LSN of the last record appended (durable or not).
    fn last_lsn(&self) -> Lsn;
    /// Records from `lsn` on, in LSN order, each validated.
    fn read_from(&self, lsn: Lsn) -> Result<RecordIter<'_>>;
    /// May drop records below `lsn` (only whole files, say); returns how many files went. The
    /// default keeps everything.
    fn truncate_before(&self, lsn: Lsn) -> Result<usize> {
        let _ = lsn;
        Ok(0)
    }
}

/// Records in LSN order; stops after the first error.
pub type RecordIter<'a> = Box<dyn Iterator<Item = Result<(Lsn, LogRecord)>> + 'a>;

impl LogDevice for stela_wal::Wal<LogRecord> {
    fn append(&self, record: &LogRecord) -> Result<Lsn> {
        Ok(stela_wal::Wal::append(self, record)?)
    }

    fn encode(&self, record: &LogRecord) -> Result<Option<Vec<u8>>> {
        let mut encoded = Vec::new();
        stela_wal::Wal::encode(self, record, &mut encoded)?;
        Ok(Some(encoded))
    }

    fn append_encoded(&self, _record: &LogRecord, encoded: &[u8]) -> Result<Lsn> {
        Ok(self.log().append(encoded)?)
    }

    fn flush(&self, lsn: Lsn) -> Result<()> {
        Ok(self.commit(lsn)?)
    }

    fn durable_lsn(&self) -> Lsn {
        // "Durable" is what `flush` promises: with `SyncMode::None` that is written to the OS,
        // which the log counts as written, not as synced.
        if self.log().options().sync == stela_wal::SyncMode::None {
            self.log().written_lsn()
        } else {
            stela_wal::Wal::durable_lsn(self)
        }
    }

    fn last_lsn(&self) -> Lsn {
        stela_wal::Wal::last_lsn(self)
    }

    fn truncate_before(&self, lsn: Lsn) -> Result<usize> {
        Ok(stela_wal::Wal::truncate_before(self, lsn)?)
    }

    fn read_from(&self, lsn: Lsn) -> Result<RecordIter<'_>> {
        let records = self.iter_from(lsn)?;
        Ok(Box::new(records.map(|item| {
            let (lsn, record) = item?;
            record
                .validate()
                .map_err(|source| Error::BadLogRecord { lsn, source })?;
            Ok((lsn, record))
        })))
    }
}

/// Reads the one record at `lsn`.
///
/// # Errors
/// [`Error::BadLogRecord`] when the log has no record there (a broken chain).
pub fn read_one(log: &dyn LogDevice, lsn: Lsn) -> Result<LogRecord> {
    match log.read_from(lsn)?.next() {
        Some(Ok((found, record))) if found == lsn => Ok(record),
        Some(Err(e)) => Err(e),
        _ => Err(Error::BadLogRecord {
            lsn,
            source: crate::format::RecordError::Invalid("a chain points at a record the log lacks"),
        }),
    }
}
