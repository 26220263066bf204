//! [`Wal<T>`]: the typed log. Records go through the codec chosen at open; everything about
//! durability, ordering and recovery is the untyped [`Log`]'s.

use crate::error::{Error, Result};
use crate::log::{CommitFuture, Log};
use crate::options::WalOptions;
use crate::par_iter::ParIter;
use crate::reader::RawReader;
use crate::recovery::RecoveryReport;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::cell::RefCell;
use std::marker::PhantomData;
use std::path::Path;
use stela_format::{Codec, Lsn};

/// A write-ahead log of records of type `T`.
///
/// ```
/// use serde::{Deserialize, Serialize};
/// use stela_wal::{Wal, WalOptions};
///
/// #[derive(Serialize, Deserialize, Debug, PartialEq)]
/// struct Transfer { from: u32, to: u32, cents: i64 }
///
/// let dir = tempfile::tempdir()?;
/// let wal: Wal<Transfer> = Wal::open(dir.path(), WalOptions::default())?;
/// let lsn = wal.append(&Transfer { from: 1, to: 2, cents: 500 })?;
/// wal.commit(lsn)?; // returns once the record is on stable storage
/// drop(wal);
///
/// let wal: Wal<Transfer> = Wal::open(dir.path(), WalOptions::default())?;
/// let records: Vec<_> = wal.iter()?.collect::<Result<_, _>>()?;
/// assert_eq!(records, vec![(lsn, Transfer { from: 1, to: 2, cents: 500 })]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Wal<T> {
    log: Log,
    codec: Codec,
    field_names: bool,
    _records: PhantomData<fn(T) -> T>,
}

impl<T> Clone for Wal<T> {
    fn clone(&self) -> Self {
        Wal {
            log: self.log.clone(),
            codec: self.codec,
            field_names: self.field_names,
            _records: PhantomData,
        }
    }
}

thread_local! {
    /// Per-thread encode buffer, so appends do not allocate.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl<T: Serialize + DeserializeOwned> Wal<T> {
    /// Opens or creates the log in `dir`. The record type is recorded in the log (as
    /// `options.type_tag`, by default [`stela_format::default_type_tag`]: the type name without
    /// module paths), and so is the codec: opening with another of either is an error, never a
    /// stream of garbage records.
    ///
    /// # Errors
    /// See [`Log::open`].
    pub fn open(dir: impl AsRef<Path>, options: WalOptions) -> Result<Wal<T>> {
        let tag = options
            .type_tag
            .clone()
            .unwrap_or_else(stela_format::default_type_tag::<T>);
        let (codec, field_names) = (options.codec, options.field_names);
        let storage = std::sync::Arc::clone(&options.storage);
        let log = Log::open(dir, options, &tag)?;
        // Compact MessagePack records carry no field names: keep them once, for dumps.
        if codec == Codec::MessagePack && !field_names {
            if let Some(schema) = crate::schema::Schema::of::<T>() {
                if let Err(error) =
                    crate::schema::store(storage.as_ref(), log.dir(), &schema.to_json())
                {
                    tracing::warn!(%error, "the record schema was not stored; dumps show arrays");
                }
            }
        }
        Ok(Wal {
            log,
            codec,
            field_names,
            _records: PhantomData,
        })
    }

    /// Appends a record to the buffer; not durable until [`Wal::commit`].
    pub fn append(&self, record: &T) -> Result<Lsn> {
        SCRATCH.with_borrow_mut(|scratch| {
            scratch.clear();
            self.encode(record, scratch)?;
            self.log.append(scratch)
        })
    }

    /// Appends records with consecutive LSNs; returns the LSN of the last.
    pub fn append_batch(&self, records: &[T]) -> Result<Lsn> {
        SCRATCH.with_borrow_mut(|scratch| {
            scratch.clear();
            let mut ends = Vec::with_capacity(records.len());
            for record in records {
                self.encode(record, scratch)?;
                ends.push(scratch.len());
            }
            let starts = std::iter::once(0).chain(ends.iter().copied());
            let scratch = &scratch[..];
            self.log
                .append_all(starts.zip(ends.iter()).map(|(s, &e)| &scratch[s..e]))
        })
    }

    /// Appends a record and returns once it is durable.
    pub fn append_durable(&self, record: &T) -> Result<Lsn> {
        let lsn = self.append(record)?;
        self.log.commit(lsn)?;
        Ok(lsn)
    }

    /// Blocks until every record up to `lsn` is durable; concurrent committers share a sync.
    pub fn commit(&self, lsn: Lsn) -> Result<()> {
        self.log.commit(lsn)
    }

    /// Waits without blocking a thread until `lsn` is durable.
    pub fn commit_async(&self, lsn: Lsn) -> CommitFuture {
        self.log.commit_async(lsn)
    }

    pub fn durable_lsn(&self) -> Lsn {
        self.log.durable_lsn()
    }

    /// Records the synced end now (see [`Log::mark_synced`]).
    pub fn mark_synced(&self) -> Result<()> {
        self.log.mark_synced()
    }

    pub fn last_lsn(&self) -> Lsn {
        self.log.last_lsn()
    }

    /// All records, oldest first, decoded lazily.
    pub fn iter(&self) -> Result<Iter<T>> {
        self.iter_from(Lsn::FIRST)
    }

    /// Records from `lsn` on (from the first present, if `lsn` was truncated away).
    pub fn iter_from(&self, lsn: Lsn) -> Result<Iter<T>> {
        Ok(Iter {
            reader: self.log.read_from(lsn)?,
            codec: self.codec,
            failed: false,
            _records: PhantomData,
        })
    }

    /// Records from `lsn` on, like [`Wal::iter_from`], but decoded by `threads` worker threads
    /// while another thread reads and checks the frames: replay at several times the speed of
    /// one core when the codec is the bottleneck. Order, and stopping at the first error, are
    /// the same as for [`Wal::iter_from`]. See [`crate::par_iter`].
    pub fn par_iter_from(&self, lsn: Lsn, threads: usize) -> Result<ParIter<T>>
    where
        T: Send + 'static,
    {
        ParIter::start(self.log.read_from(lsn)?, self.codec, threads)
    }

    /// Releases whole segments below `lsn`; see [`Log::truncate_before`].
    pub fn truncate_before(&self, lsn: Lsn) -> Result<usize> {
        self.log.truncate_before(lsn)
    }

    pub fn recovery_report(&self) -> &RecoveryReport {
        self.log.recovery_report()
    }

    /// The untyped log underneath.
    pub fn log(&self) -> &Log {
        &self.log
    }

    /// Commits everything appended and closes the log.
    pub fn close(self) -> Result<()> {
        self.log.close()
    }

    /// Encodes `record` as [`Wal::append`] does, onto the end of `out`: a caller that must
    /// append under a lock of its own can encode first and hand the bytes to
    /// [`Log::append`] (through [`Wal::log`]) under the lock.
    ///
    /// # Errors
    /// [`Error::Codec`] when the record cannot be encoded.
    pub fn encode(&self, record: &T, out: &mut Vec<u8>) -> Result<()> {
        self.codec
            .encode_into_named(record, out, self.field_names)
            .map_err(|source| Error::Codec { lsn: None, source })
    }
}

/// Records of a [`Wal<T>`] in LSN order. Yields an error at damage and then stops.
pub struct Iter<T> {
    reader: RawReader,
    codec: Codec,
    failed: bool,
    _records: PhantomData<fn() -> T>,
}

impl<T: DeserializeOwned> Iterator for Iter<T> {
    type Item = Result<(Lsn, T)>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let item = match self.reader.next_record()? {
            Ok((lsn, payload)) => self
                .codec
                .decode(payload)
                .map(|record| (lsn, record))
                .map_err(|source| Error::Codec {
                    lsn: Some(lsn),
                    source,
                }),
            Err(error) => Err(error),
        };
        self.failed = item.is_err();
        Some(item)
    }
}
