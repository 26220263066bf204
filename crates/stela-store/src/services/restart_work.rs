//! Instant restart's remaining work on the shared state: rolling back the losers (by the
//! background restart thread, or by a transaction about to wait for one of their locks) and
//! redoing the pages still pending, a batch per hold of the engine latch.

use crate::access::lock::LockMode;
use crate::error::Result;
use crate::format::TxnId;
use crate::recovery::restart::{self, RecoveryPending};
use crate::services::shared::{Shared, DRAIN_BATCH};
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl Shared {
    pub(crate) fn recovery_pending(&self) -> RecoveryPending {
        RecoveryPending {
            pages: self.engine().map_or(0, |e| e.pool.pending_pages()),
            losers: self.losers_left.load(Ordering::Acquire),
        }
    }

    /// One step of an instant restart's remaining work: roll back the newest loser left, or
    /// else redo a batch of pending pages. Losers first, because new transactions may be
    /// waiting for their locks. Returns whether there was anything to do.
    pub(crate) fn recovery_step(&self) -> Result<bool> {
        let newest = self
            .losers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .next_back()
            .copied();
        if let Some(txn) = newest {
            self.undo_loser(txn)?;
            return Ok(true);
        }
        // The batch and the archive window its redo still has to read, under one latch hold.
        let (pages, window) = {
            let engine = self.engine()?;
            let pages = engine.pool.pending_first(DRAIN_BATCH);
            let window = engine.pool.pending_archived_window(&pages);
            (pages, window)
        };
        if pages.is_empty() {
            return Ok(false);
        }
        // The disk reads outside the engine latch, so that under it the pool finds the pages
        // in the OS's cache and new transactions wait for the latch as little as possible.
        // A failed read here is the pool's to report, when it reads the page for real.
        for &page in &pages {
            let _ = self.file.warm(page);
        }
        // Likewise the changes the pages' redo left in the archive: one read per run for the
        // batch (neighbouring pages in a page-sorted run), outside the latch. A failed read
        // here is left to the pool too, which then reads the archive itself.
        let supply = window
            .zip(self.archive.as_ref())
            .and_then(|(window, archive)| {
                let (histories, archived) =
                    archive.histories_of(&pages, window.0, window.1).ok()?;
                Some((window, histories, archived))
            });
        let mut engine = self.engine()?;
        if let Some((window, histories, archived)) = supply {
            engine
                .pool
                .supply_archived(&pages, window, histories, archived);
        }
        let log = Arc::clone(&engine.log);
        let redone = engine.pool.redo_pending(&pages, log.as_ref());
        self.check(redone)?;
        Ok(true)
    }

    /// Rolls back loser `txn` if no other thread has taken it, then releases its locks.
    pub(crate) fn undo_loser(&self, txn: TxnId) -> Result<()> {
        let Some(loser) = self
            .losers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&txn)
        else {
            return Ok(());
        };
        // As for the drain: the pages it will read, read first outside the latch.
        for page in loser.pages() {
            let _ = self.file.warm(page);
        }
        let result = self.engine().and_then(|mut engine| {
            let mut compensations = 0;
            restart::undo_loser(&mut engine, &loser, &mut compensations)?;
            // With its end record: see the transaction table's rule.
            self.txns
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&txn);
            Ok(())
        });
        match result {
            Ok(()) => {
                self.losers_left.fetch_sub(1, Ordering::AcqRel);
                self.locks.release_all(txn);
                Ok(())
            }
            Err(error) => {
                // Its locks stay held, so its writes stay invisible; another step may retry
                // (unless the store is now poisoned, and the next open rolls it back).
                self.losers
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(txn, loser);
                self.check(Err(error))
            }
        }
    }

    /// Takes `txn` its lock on `key`, rolling back first any loser of an instant restart that
    /// holds it (rather than waiting for the background thread to come to it).
    pub(crate) fn lock(&self, txn: TxnId, key: &[u8], mode: LockMode) -> Result<()> {
        if self.losers_left.load(Ordering::Acquire) > 0 {
            for blocker in self.locks.blockers(txn, key, mode) {
                let is_loser = self
                    .losers
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .contains_key(&blocker);
                if is_loser {
                    self.undo_loser(blocker)?;
                }
            }
        }
        self.locks.acquire(txn, key, mode)
    }
}
