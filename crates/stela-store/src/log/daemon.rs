//! The store on a log kept by a stela daemon: [`DaemonLog`], a [`LogDevice`] over
//! `stela_client::Wal`, so the same store runs at the daemon's levels (`buffered`, `disk`,
//! `replicated`, `replicated-disk`) with its commits acknowledged by the daemon's group commit.
//!
//! What this owns: the two positions the store asks about many times per transaction (the last
//! LSN it appended, the LSN durable at the log's level). Asking the daemon each time would cost
//! a round trip; both are kept here, advanced by this process's own appends and commits, and read
//! from the daemon once at open.
//!
//! Invariants:
//! - A lost daemon connection is never reconnected under the store: the call fails with
//!   [`Error::Daemon`], the store is poisoned, and only a reopen (restart over the log as the
//!   daemon now holds it) continues. After a failover the same holds: reopen on the cluster.
//! - One store per daemon log: the store numbers its page chains by the LSNs the daemon gives
//!   its appends, and reads back every record from its redo point on as its own. Another writer
//!   on the same log would put records the store cannot decode in its way (restart stops with
//!   [`Error::BadLogRecord`], nothing is lost or overwritten).
//! - `durable_lsn` never runs ahead of what the daemon acknowledged at the log's level: it moves
//!   only when an append (at `buffered`, acknowledged once the daemon holds the record) or a
//!   commit (any other level) returned. A lagging value only makes eviction ask `flush` first.
//! - The log's level is the store's commit durability, including what it means for page writes:
//!   at `buffered` a page may reach the page file before the daemon wrote its records, as with the
//!   embedded log at `SyncMode::None` — a crash of the store's process loses nothing, a crash of
//!   the daemon is outside `buffered`'s promise (docs/DURABILITY.md).

use crate::error::{Error, Result};
use crate::format::LogRecord;
use crate::log::device::{LogDevice, RecordIter, TYPE_TAG};
use std::sync::atomic::{AtomicU64, Ordering};
use stela_client::{Durability, Lsn, Wal, WalOptions};

/// A daemon's log as the store's log. See the module documentation.
pub struct DaemonLog {
    wal: Wal<LogRecord>,
    /// Appends are acknowledged at this level already (`buffered`), so they are durable at the
    /// log's level when they return.
    acked_on_append: bool,
    last: AtomicU64,
    durable: AtomicU64,
}

impl DaemonLog {
    /// Opens the log `name` in the daemon at `address` (a socket path, `host:port`, or a
    /// cluster's endpoints: whatever `stela_client::Wal::open` accepts) at `options`' level.
    ///
    /// # Errors
    /// [`Error::Daemon`]: the daemon cannot be reached or refuses the log; `unsafe` durability,
    /// whose appends return no LSN, is refused with [`Error::Unsupported`].
    pub fn open<A>(address: A, name: &str, options: WalOptions) -> Result<DaemonLog>
    where
        A: TryInto<stela_client::Address>,
        stela_client::Error: From<A::Error>,
    {
        let level = options.durability;
        if level == Durability::Unsafe {
            return Err(Error::Unsupported(
                "a store cannot log at `unsafe`: its appends return no LSN to chain pages by",
            ));
        }
        // Never reconnect under the store: records the daemon held only in its buffers die
        // with it (or with a failed-over primary), and a reconnected client would hand out
        // their LSNs again while the store's pages still carry them. A lost connection fails
        // the call, which poisons the store; reopening it runs restart over the log as the
        // daemon (or the new primary) holds it.
        let mut options = options.reconnect_within(std::time::Duration::ZERO);
        if options.type_tag.is_none() {
            options = options.type_tag(TYPE_TAG);
        }
        let wal: Wal<LogRecord> = Wal::open(address, name, options)?;
        let positions = wal.positions()?;
        let acked_on_append = level == Durability::Buffered;
        let durable = if acked_on_append {
            positions.last_lsn
        } else {
            positions.durable_lsn
        };
        Ok(DaemonLog {
            wal,
            acked_on_append,
            last: AtomicU64::new(positions.last_lsn),
            durable: AtomicU64::new(durable),
        })
    }

    /// The client underneath (positions, truncation, the term).
    pub fn wal(&self) -> &Wal<LogRecord> {
        &self.wal
    }
}

impl LogDevice for DaemonLog {
    fn append(&self, record: &LogRecord) -> Result<Lsn> {
        let lsn = self.wal.append(record)?;
        self.last.fetch_max(lsn.get(), Ordering::AcqRel);
        if self.acked_on_append {
            self.durable.fetch_max(lsn.get(), Ordering::AcqRel);
        }
        Ok(lsn)
    }

    fn flush(&self, lsn: Lsn) -> Result<()> {
        if lsn.get() <= self.durable.load(Ordering::Acquire) {
            return Ok(());
        }
        self.wal.commit(lsn)?;
        self.durable.fetch_max(lsn.get(), Ordering::AcqRel);
        Ok(())
    }

    fn durable_lsn(&self) -> Lsn {
        Lsn::new(self.durable.load(Ordering::Acquire))
    }

    fn last_lsn(&self) -> Lsn {
        Lsn::new(self.last.load(Ordering::Acquire))
    }

    fn truncate_before(&self, lsn: Lsn) -> Result<usize> {
        // The daemon releases whole segments below `lsn`. A standby's copy follows, but never
        // past a warm follower's hold (`follow`), so a follower may fall behind without
        // losing its way.
        Ok(self.wal.truncate_before(lsn)?)
    }

    fn read_from(&self, lsn: Lsn) -> Result<RecordIter<'_>> {
        Ok(Box::new(self.wal.iter_from(lsn)?.map(|item| {
            let (lsn, record) = item?;
            record
                .validate()
                .map_err(|source| Error::BadLogRecord { lsn, source })?;
            Ok((lsn, record))
        })))
    }
}
