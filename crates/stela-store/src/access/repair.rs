//! Single-page recovery, and the write elision it makes possible.
//!
//! A page image read from the page file may be unusable (it fails its checksum or layout
//! checks) or stale (older than the page the pool evicted without writing). Either way the
//! page is rebuilt from its history: start from the image if it is usable, else from the
//! archive's base image (the page in its page backup, or the empty page every page is before
//! its first record), and redo the page's records after that image's LSN, first from the log
//! archive, then from the log after the archive's end. Every page's history is there: the
//! archive covers the log from its backup's LSN (LSN 1 without one), and the log is truncated
//! only behind the archive (`retention`). A page rebuilt because its image was damaged is written
//! back (log first) so the next read finds it intact.
//!
//! Write elision: when the pool must evict a dirty page whose records are all durable in the
//! log, [`PageRepair`] lets it drop the page without writing it and remembers the page's LSN;
//! the next read of the page finds the stored image older than that and rebuilds it in memory,
//! and the pool holds it dirty again (no write: that write is what elision saves). Meanwhile the
//! page stays in the pool's dirty-page table (a classical checkpoint copies it), and a clean
//! close writes it.
//!
//! This module owns the set of elided pages. Invariant: a page is in it from its elision until
//! it is read back and rebuilt, or written at close; while in it, its stored image may lack the
//! changes from its `rec_lsn` on, and all of them are durable in the log or the archive.

use crate::access::pagefile::PageFile;
use crate::error::{Error, Result};
use crate::format::page::{Page, PageError, PageId};
use crate::format::DirtyPage;
use crate::log::archive::LogArchive;
use crate::log::LogDevice;
use std::collections::BTreeMap;
use std::sync::Arc;
use stela_format::Lsn;

/// How many times a rebuild rereads when the archive moved on and the log was truncated
/// between its two reads.
const ATTEMPTS: usize = 3;

/// The buffer pool's single-page recovery and write elision. See the module documentation.
pub struct PageRepair {
    archive: Arc<LogArchive>,
    elide: bool,
    /// Pages evicted dirty without a write: their `rec_lsn` and page LSN.
    elided: BTreeMap<PageId, (Lsn, Lsn)>,
    /// Pages rebuilt so far.
    pub repaired: u64,
}

/// A page as single-page recovery hands it to the pool.
pub struct Checked {
    pub page: Page,
    /// `Some(rec_lsn)` when the stored image still lacks the page's changes from `rec_lsn` on
    /// (an elided page, rebuilt in memory only): the pool holds it dirty since then.
    pub dirty_since: Option<Lsn>,
}

impl PageRepair {
    /// Repairs pages from `archive` and the log; evicts dirty pages without writing them when
    /// `elide` is set.
    pub fn new(archive: Arc<LogArchive>, elide: bool) -> PageRepair {
        PageRepair {
            archive,
            elide,
            elided: BTreeMap::new(),
            repaired: 0,
        }
    }

    /// The log archive pages are rebuilt from.
    pub fn archive(&self) -> &Arc<LogArchive> {
        &self.archive
    }

    /// The current page `id`, given its stored image as read (`stored`): the image itself when
    /// it is intact and not older than the page last evicted; else the page rebuilt, and
    /// written back if the image was damaged.
    ///
    /// # Errors
    /// [`Error::Corrupt`] when the history cannot bring the page to the LSN it was evicted at;
    /// archive, log and I/O errors.
    pub fn check(
        &mut self,
        id: PageId,
        stored: std::result::Result<Page, PageError>,
        file: &PageFile,
        log: &dyn LogDevice,
    ) -> Result<Checked> {
        let evicted = self.elided.remove(&id);
        let (base, damaged) = match stored {
            Ok(page) if evicted.is_none_or(|(_, lsn)| page.lsn >= lsn) => {
                return Ok(Checked {
                    page,
                    dirty_since: None,
                })
            }
            Ok(page) => (page, false),
            Err(damage) => {
                tracing::warn!(page = id, %damage, "rebuilding a damaged page from its history");
                (self.archive.base_image(id)?, true)
            }
        };
        let page = rebuild(id, base, Lsn::new(u64::MAX), &self.archive, log)?;
        self.repaired += 1;
        if evicted.is_some_and(|(_, lsn)| page.lsn < lsn) {
            return Err(Error::Corrupt {
                page: id,
                source: PageError::Malformed(
                    "its history in the archive and the log ends before the LSN it was evicted at",
                ),
            });
        }
        if damaged {
            write_back(id, &page, file, log)?;
            return Ok(Checked {
                page,
                dirty_since: None,
            });
        }
        Ok(Checked {
            page,
            dirty_since: evicted.map(|(rec_lsn, _)| rec_lsn),
        })
    }

    /// Whether the pool may evict dirty page `id` (dirty since `rec_lsn`, at `page_lsn`)
    /// without writing it; if so, it is remembered as elided.
    pub fn may_elide(
        &mut self,
        id: PageId,
        rec_lsn: Lsn,
        page_lsn: Lsn,
        log: &dyn LogDevice,
    ) -> bool {
        // Only durable records can rebuild it: a crash may lose the others, and the image too.
        if !self.elide || page_lsn > log.durable_lsn() {
            return false;
        }
        let entry = self.elided.entry(id).or_insert((rec_lsn, page_lsn));
        entry.0 = entry.0.min(rec_lsn);
        entry.1 = entry.1.max(page_lsn);
        true
    }

    /// The elided pages whose stored image may still lack changes (those above `clean_lsn`,
    /// the decoupled cleaner's, which writes the others): entries of the pool's dirty-page
    /// table.
    pub fn elided_dirty(&self, clean_lsn: Lsn) -> impl Iterator<Item = DirtyPage> + '_ {
        self.elided
            .iter()
            .filter(move |(_, &(_, page_lsn))| page_lsn > clean_lsn)
            .map(move |(&page, &(rec_lsn, page_lsn))| DirtyPage {
                page,
                rec_lsn: rec_lsn.max(clean_lsn.next()),
                page_lsn,
            })
    }

    /// Rebuilds and writes every elided page whose stored image is older than it was (a clean
    /// close: afterwards no stored image lacks a change).
    ///
    /// # Errors
    /// As [`PageRepair::check`].
    pub fn write_elided(&mut self, file: &PageFile, log: &dyn LogDevice) -> Result<()> {
        let ids: Vec<PageId> = self.elided.keys().copied().collect();
        for id in ids {
            let stored = file.read(id)?;
            let checked = self.check(id, stored, file, log)?;
            if checked.dirty_since.is_some() {
                write_back(id, &checked.page, file, log)?;
            }
        }
        Ok(())
    }
}

/// Page `id`, whose stored image is unusable, rebuilt up to `upto` from its whole history: the
/// archive's base image ([`LogArchive::base_image`]: its page backup's image, or the empty page),
/// then [`rebuild`]. What the decoupled cleaner and a page backup do with a damaged image.
///
/// # Errors
/// As [`rebuild`], and [`LogArchive::base_image`]'s.
pub fn rebuild_damaged(
    id: PageId,
    upto: Lsn,
    archive: &LogArchive,
    log: &dyn LogDevice,
) -> Result<Page> {
    rebuild(id, archive.base_image(id)?, upto, archive, log)
}

/// Page `id` brought up to `upto` from `base` (its last usable state) by redoing its history
/// in `base.lsn+1..=upto`: from the archive, then from the log after the archive's end.
///
/// # Errors
/// [`Error::Archive`] for a damaged run or when the log no longer holds what follows the
/// archive; log errors; [`Error::Corrupt`] for a record that cannot apply to the page.
pub fn rebuild(
    id: PageId,
    base: Page,
    upto: Lsn,
    archive: &LogArchive,
    log: &dyn LogDevice,
) -> Result<Page> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let mut page = base.clone();
        let (history, archived) = archive.page_history(id, page.lsn)?;
        for (lsn, record) in history.iter().take_while(|(lsn, _)| *lsn <= upto) {
            crate::access::redo::redo(id, &mut page, *lsn, record)?;
        }
        let from = archived.max(page.lsn).next();
        let mut first_seen = None;
        for item in log.read_from(from)? {
            let (lsn, record) = item?;
            if lsn > upto {
                break;
            }
            first_seen.get_or_insert(lsn);
            if record.pages().any(|(p, _)| p == id) {
                crate::access::redo::redo(id, &mut page, lsn, &record)?;
            }
        }
        // The log starts after `from` only if it was truncated behind an archive that grew
        // after it was read: read both again.
        match first_seen {
            Some(first) if first > from => {
                if attempt >= ATTEMPTS {
                    return Err(Error::Archive {
                        path: archive.dir().to_path_buf(),
                        source: crate::format::RunError::Gap {
                            archived,
                            next: first,
                        },
                    });
                }
            }
            _ => return Ok(page),
        }
    }
}

/// Writes a rebuilt page over its stored image, after making its records durable (the
/// write-ahead rule; they usually are, having been read back).
fn write_back(id: PageId, page: &Page, file: &PageFile, log: &dyn LogDevice) -> Result<()> {
    if log.durable_lsn() < page.lsn {
        log.flush(page.lsn)?;
    }
    file.write_repaired(id, page)?;
    Ok(())
}
