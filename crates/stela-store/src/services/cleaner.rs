//! Page cleaning: bringing stored page images up to date so that restart has little to redo
//! and eviction seldom has to write. Two cleaners, chosen at open:
//!
//! - classical ([`classical_round`]): scans the buffer pool under the engine latch for pages
//!   that need writing and copies them, writes the copies outside the latch (log first, by page
//!   id), syncs, then latches again to mark clean the pages not changed meanwhile. Each cleaned
//!   page is latched to check, to copy and to mark it.
//! - decoupled ([`decoupled_round`]): never touches the buffer pool. It reads the log records
//!   after its clean LSN up to the durable LSN, replays them onto the stored images (read from
//!   the page file, changed by the same redo as restart's, written back), syncs, and only then
//!   publishes the new clean LSN. The pool reads that LSN to prefer, and evict without a write,
//!   pages whose stored image it covers.
//!
//! Invariant of the decoupled cleaner: once `clean_lsn` is `L`, every change at or below `L`
//! is in the synced stored image of its page (or in a newer one). It holds at open (restart
//! sets `L` below the oldest change any stored image may lack) and each round keeps it, because
//! it replays every record between the old and new `L` onto the image it reads, and the page
//! file never lets an image go back in time. Records above the durable LSN are never replayed,
//! so its writes keep the write-ahead rule.
//! Both cleaners report their writes in a `PagesWritten` record after the sync (`pagefile`),
//! and start the writeback of their writes as they make them (`PageFile::write_batched`), so
//! that the sync does not put a whole round on the disk at once, ahead of the log's syncs.
//! With a log archive, the decoupled cleaner takes the records it lags behind the archive by
//! from the archive's runs, page by page in page order (the paper's sequential read of a
//! page-sorted archive), and only the rest from the log; a stored image it finds damaged is
//! rebuilt from its history up to the clean LSN (`repair`) and the round goes on; without an
//! archive that is an error.

use crate::access::btree::Engine;
use crate::access::pagefile::PageFile;
use crate::access::redo::redo;
use crate::error::{Error, Result};
use crate::format::page::{Page, PageId};
use crate::format::LogRecord;
use crate::log::archive::LogArchive;
use crate::log::tail::{LogTail, RecordBuffer};
use crate::log::LogDevice;
use crate::services::image_cache::{ImageCache, Taken};
use crate::sync::AtomicU64;
use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use stela_format::Lsn;

/// What one cleaning round did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CleanReport {
    /// Pages written.
    pub written: u64,
    /// Log records replayed from the log (decoupled).
    pub replayed: u64,
    /// Page changes replayed from the log archive's runs (decoupled).
    pub from_archive: u64,
    /// Stored images read from the page file (decoupled); the others replayed onto came from
    /// the images the cleaner keeps between rounds.
    pub read: u64,
    /// The clean LSN after the round (decoupled; zero for classical).
    pub clean_lsn: Lsn,
}

/// One round of the classical cleaner over the pool in `engine`.
pub(crate) fn classical_round(
    engine: &Mutex<Engine>,
    log: &dyn LogDevice,
    file: &PageFile,
) -> Result<CleanReport> {
    let mut copies = {
        let engine = engine.lock().unwrap_or_else(|p| p.into_inner());
        engine.pool.dirty_copies()
    };
    if copies.is_empty() {
        return Ok(CleanReport::default());
    }
    let newest = copies
        .iter()
        .map(|(_, page)| page.lsn)
        .max()
        .expect("not empty");
    if log.durable_lsn() < newest {
        log.flush(newest)?;
    }
    copies.sort_by_key(|(id, _)| *id);
    let mut report = CleanReport::default();
    for (id, page) in &copies {
        report.written += u64::from(file.write_batched(*id, page)?);
    }
    file.log_writes(log)?;
    let mut engine = engine.lock().unwrap_or_else(|p| p.into_inner());
    for (id, page) in &copies {
        engine.pool.mark_clean(*id, page.lsn);
    }
    Ok(report)
}

/// One round of the decoupled cleaner: replays the durable log after `clean_lsn` onto the
/// stored images and publishes the new clean LSN. `cache` holds images from earlier rounds,
/// each with every change of its page up to the clean LSN, so a page changed again is not read
/// back from the file (it may be older there, if the pool wrote a newer image meanwhile: the
/// page file refuses writes that would go back in time, and the replay makes it current anyway).
/// `records` is the round's buffer for its reads of the log tail, kept between rounds.
pub(crate) fn decoupled_round(
    log: &LogTail,
    file: &PageFile,
    clean_lsn: &AtomicU64,
    cache: &mut ImageCache,
    records: &mut RecordBuffer,
    archive: Option<&LogArchive>,
) -> Result<CleanReport> {
    let started = std::time::Instant::now();
    let from = Lsn::new(clean_lsn.load(Ordering::Acquire) + 1);
    let target = log.durable_lsn();
    if target < from {
        return Ok(CleanReport {
            clean_lsn: Lsn::new(from.get() - 1),
            ..CleanReport::default()
        });
    }
    let mut replay = Replay::new(
        file,
        Lsn::new(from.get() - 1),
        cache,
        archive.map(|a| (a, log)),
    );
    // What the archive holds of the records to replay, page by page. Each page's changes are
    // applied in LSN order, the archived ones before the logged ones, which is all redo needs:
    // pages do not depend on each other.
    let mut log_from = from;
    if let Some(archive) = archive {
        let archived = archive.archived_lsn().min(target);
        if archived >= from {
            for (id, changes) in archive.changes_between(from, archived)? {
                replay.apply_to_page(id, &changes)?;
            }
            log_from = archived.next();
        }
    }
    for item in log.records_reusing(log_from, records)? {
        let (lsn, record) = item?;
        if lsn > target {
            break;
        }
        replay.apply(lsn, &record)?;
    }
    let replayed = started.elapsed();
    let mut report = replay.write()?;
    let written = started.elapsed();
    // Synced before the clean LSN is published: the pool may drop a dirty page as soon as it
    // sees the new LSN. `log_writes` syncs when it has writes to report; when another thread
    // took ours to report, it may not have synced yet, so sync here.
    if file.log_writes(log)?.is_none() {
        file.sync()?;
    }
    clean_lsn.store(target.get(), Ordering::Release);
    report.clean_lsn = target;
    tracing::debug!(
        pages = report.written,
        records = report.replayed,
        from_archive = report.from_archive,
        replay_ms = replayed.as_secs_f64() * 1e3,
        write_ms = (written - replayed).as_secs_f64() * 1e3,
        sync_ms = (started.elapsed() - written).as_secs_f64() * 1e3,
        "decoupled cleaning round"
    );
    Ok(report)
}

/// [`decoupled_round`] without an archive, for the loom model (`tests/loom_cleaner.rs`), which
/// runs the store's own round against the pool's own page fixes and evictions. Only under
/// `--cfg stela_store_loom`; the store calls [`decoupled_round`] itself.
#[cfg(stela_store_loom)]
pub fn decoupled_round_for_model(
    log: &LogTail,
    file: &PageFile,
    clean_lsn: &AtomicU64,
    cache: &mut ImageCache,
) -> Result<CleanReport> {
    decoupled_round(log, file, clean_lsn, cache, &mut RecordBuffer::new(), None)
}

/// Log records replayed onto stored page images, the one way the decoupled cleaner and the
/// standby follower (`follow`) bring images forward. It starts from images holding every
/// change up to `clean` (the cache's, else the page file's), applies records with [`redo`]
/// (in LSN order per page), and [`Replay::write`] writes the changed images, unsynced: the
/// caller syncs, then publishes how far the images now go.
pub(crate) struct Replay<'a> {
    file: &'a PageFile,
    clean: Lsn,
    cache: &'a mut ImageCache,
    /// With an archive, damaged images are rebuilt from it (and the log) up to `clean`.
    archive: Option<(&'a LogArchive, &'a LogTail)>,
    /// The round's images, each with whether the round changed it.
    images: BTreeMap<PageId, (Taken, bool)>,
    repaired: BTreeSet<PageId>,
    report: CleanReport,
}

impl<'a> Replay<'a> {
    pub(crate) fn new(
        file: &'a PageFile,
        clean: Lsn,
        cache: &'a mut ImageCache,
        archive: Option<(&'a LogArchive, &'a LogTail)>,
    ) -> Replay<'a> {
        Replay {
            file,
            clean,
            cache,
            archive,
            images: BTreeMap::new(),
            repaired: BTreeSet::new(),
            report: CleanReport {
                clean_lsn: clean,
                ..CleanReport::default()
            },
        }
    }

    /// The image of page `id` being replayed onto, read (or taken from the cache) on first use,
    /// and whether the round changed it.
    fn image(&mut self, id: PageId) -> Result<(&mut Page, &mut bool)> {
        let (taken, changed) = match self.images.entry(id) {
            Entry::Occupied(entry) => entry.into_mut(),
            Entry::Vacant(entry) => {
                let taken = match self.cache.take(id) {
                    Some(taken) => taken,
                    None => {
                        let (image, rebuilt) =
                            stored_image(id, self.file, self.clean, self.archive)?;
                        self.report.read += 1;
                        if rebuilt {
                            self.repaired.insert(id);
                        }
                        Taken::read(image)
                    }
                };
                entry.insert((taken, false))
            }
        };
        Ok((&mut taken.page, changed))
    }

    /// Replays the log record at `lsn` onto every page it changes.
    pub(crate) fn apply(&mut self, lsn: Lsn, record: &LogRecord) -> Result<()> {
        self.report.replayed += 1;
        for (id, _) in record.pages() {
            let (image, changed) = self.image(id)?;
            *changed |= redo(id, image, lsn, record)?;
        }
        Ok(())
    }

    /// Replays one page's changes from the archive, in LSN order.
    fn apply_to_page(&mut self, id: PageId, changes: &[(Lsn, LogRecord)]) -> Result<()> {
        self.report.from_archive += changes.len() as u64;
        let (image, changed) = self.image(id)?;
        for (lsn, record) in changes {
            *changed |= redo(id, image, *lsn, record)?;
        }
        Ok(())
    }

    /// Writes the changed images (not synced) and keeps them all in the cache for the next
    /// round. The report's `clean_lsn` is still the starting one.
    pub(crate) fn write(self) -> Result<CleanReport> {
        let mut report = self.report;
        for (id, (taken, changed)) in &self.images {
            let image = &taken.page;
            if self.repaired.contains(id) {
                // Over the damaged image, even one of the same LSN.
                report.written += u64::from(self.file.write_repaired(*id, image)?);
            } else if *changed {
                report.written += u64::from(self.file.write_batched(*id, image)?);
            } else if image.lsn > Lsn::ZERO {
                // The stored image had every change replayed: say so (after the caller's
                // sync), so that analysis drops the page from its dirty-page table.
                self.file.confirm(*id, image.lsn);
            }
        }
        self.cache
            .put_round(self.images.into_iter().map(|(id, (taken, _))| (id, taken)));
        Ok(report)
    }
}

/// The stored image of page `id`, as the cleaner's invariant says it is (every change up to
/// `clean`). A damaged one is rebuilt to exactly `clean` from the archive, if there is one;
/// the flag says it was.
fn stored_image(
    id: PageId,
    file: &PageFile,
    clean: Lsn,
    archive: Option<(&LogArchive, &LogTail)>,
) -> Result<(Page, bool)> {
    match (file.read(id)?, archive) {
        (Ok(image), _) => Ok((image, false)),
        (Err(damage), Some((archive, log))) => {
            tracing::warn!(page = id, %damage, "the cleaner rebuilds a damaged page");
            let image = crate::access::repair::rebuild_damaged(id, clean, archive, log)?;
            Ok((image, true))
        }
        (Err(source), None) => Err(Error::Corrupt { page: id, source }),
    }
}
