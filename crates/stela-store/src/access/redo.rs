//! Redo of log records onto page images, and the index of redo that instant restart leaves
//! pending. Pure: no I/O, no latches.
//!
//! [`redo`] is the one way a logged change is applied to a page after the fact: by restart's
//! redo pass (classical), by the buffer pool when it reads a page that still has redo pending
//! (instant), and by the decoupled cleaner onto stored images. It is idempotent: a record at or
//! below the page's LSN is skipped, so applying a page's history to any image of that page,
//! in LSN order, yields the newest image whatever the starting one was.
//!
//! [`PendingRedo`] maps each page whose stored image may lack logged changes to the records of
//! those changes, in LSN order, or, for the older ones, to the stretch of the log archive that
//! holds them. Instant restart builds it from analysis instead of redoing, and the pool owns it
//! afterwards. Invariants:
//! - a page is either in the pool or pending, never both: the pool removes a page's entry when
//!   it reads the page (and redoes the records before anyone sees the image) or installs a whole
//!   new image of it;
//! - the records of a pending page, with its archived stretch `rec_lsn..archived_below` if it
//!   has one, are every change at or above its analysis `rec_lsn`, so they bring its stored
//!   image up to the state at the crash. The archive keeps that stretch: it covers the log
//!   from its page backup's LSN (LSN 1 without one) without a gap, and the store takes no
//!   backup, so prunes nothing, while any page is pending.

use crate::error::{Error, Result};
use crate::format::page::{Node, Page, PageError, PageId};
use crate::format::{DirtyPage, LogBody, LogRecord};
use std::collections::BTreeMap;
use std::sync::Arc;
use stela_format::Lsn;

/// Redoes `record` (at `lsn`) on page `id`, whose current state is `page`, if the page does not
/// have it yet (its LSN is below `lsn`). Returns whether it applied.
///
/// # Errors
/// [`Error::Corrupt`] when the record cannot apply to that page (a write to an internal node).
pub fn redo(id: PageId, page: &mut Page, lsn: Lsn, record: &LogRecord) -> Result<bool> {
    if page.lsn >= lsn {
        return Ok(false);
    }
    match &record.body {
        LogBody::Write { key, after, .. } => set_on_leaf(id, page, key, after.as_deref())?,
        LogBody::Compensate { key, value, .. } => set_on_leaf(id, page, key, value.as_deref())?,
        LogBody::Structure { pages } => {
            if let Some(image) = pages.iter().find(|image| image.page == id) {
                page.node = image.node.clone();
            }
        }
        LogBody::Commit
        | LogBody::Aborted
        | LogBody::PagesWritten { .. }
        | LogBody::CheckpointBegin
        | LogBody::CheckpointEnd { .. }
        | LogBody::CheckpointDelta { .. } => return Ok(false),
    }
    page.lsn = lsn;
    Ok(true)
}

fn set_on_leaf(id: PageId, page: &mut Page, key: &[u8], value: Option<&[u8]>) -> Result<()> {
    match &mut page.node {
        Node::Leaf(leaf) => leaf
            .set_within_page(key, value)
            .map_err(|after| Error::Corrupt {
                page: id,
                source: PageError::TooLarge(after),
            }),
        Node::Internal(_) => Err(Error::Corrupt {
            page: id,
            source: PageError::Malformed("the log writes a key to it, but it is an internal node"),
        }),
    }
}

/// One page's pending redo: the changes its stored image may lack, from `rec_lsn` on. Those
/// below `archived_below` are in the log archive and are read from it when the page is redone
/// (restart did not read them from the log: that read would grow with the dirty set); the rest
/// are held here.
#[derive(Debug)]
pub struct PendingPage {
    /// The first change the stored image may lack.
    pub rec_lsn: Lsn,
    /// The page's newest change.
    pub page_lsn: Lsn,
    /// Changes in `rec_lsn..archived_below` are to be read from the archive (`Lsn::ZERO`:
    /// none; all are in `records`).
    pub archived_below: Lsn,
    /// The changes at or above `archived_below` (and `rec_lsn`), in LSN order.
    pub records: Vec<(Lsn, Arc<LogRecord>)>,
}

/// Pages whose redo instant restart left for later, with the records to redo or where in the
/// archive to find them. See the module documentation.
#[derive(Debug, Default)]
pub struct PendingRedo {
    /// By page id, so that the background drain reads the page file in order.
    pages: BTreeMap<PageId, PendingPage>,
    records: usize,
    from_archive: usize,
}

impl PendingRedo {
    /// Notes that page `page`'s changes in `rec_lsn..below` (its newest at `page_lsn`) are to
    /// be read from the log archive. Call before pushing any of its records.
    pub fn push_archived(&mut self, page: PageId, rec_lsn: Lsn, below: Lsn, page_lsn: Lsn) {
        debug_assert!(!self.pages.contains_key(&page));
        self.pages.insert(
            page,
            PendingPage {
                rec_lsn,
                page_lsn,
                archived_below: below,
                records: Vec::new(),
            },
        );
        self.from_archive += 1;
    }

    /// Adds the record at `lsn` to page `page`'s list. Records must come in LSN order, and
    /// above the page's archived part, if it has one.
    pub fn push(&mut self, page: PageId, lsn: Lsn, record: Arc<LogRecord>) {
        let entry = self.pages.entry(page).or_insert_with(|| PendingPage {
            rec_lsn: lsn,
            page_lsn: lsn,
            archived_below: Lsn::ZERO,
            records: Vec::new(),
        });
        debug_assert!(lsn >= entry.archived_below);
        entry.page_lsn = entry.page_lsn.max(lsn);
        entry.records.push((lsn, record));
        self.records += 1;
    }

    /// Removes and returns page `page`'s pending redo, if it has any.
    pub fn take(&mut self, page: PageId) -> Option<PendingPage> {
        let pending = self.pages.remove(&page)?;
        self.records -= pending.records.len();
        self.from_archive -= usize::from(pending.archived_below != Lsn::ZERO);
        Some(pending)
    }

    /// Puts back what [`PendingRedo::take`] returned when the redo could not be completed.
    pub fn restore(&mut self, page: PageId, pending: PendingPage) {
        self.records += pending.records.len();
        self.from_archive += usize::from(pending.archived_below != Lsn::ZERO);
        self.pages.insert(page, pending);
    }

    /// The archive window `pages`' pending redo has left to read: the oldest `rec_lsn` and
    /// the highest `archived_below` among those with an archived stretch.
    pub fn archived_window(&self, pages: &[PageId]) -> Option<(Lsn, Lsn)> {
        pages
            .iter()
            .filter_map(|page| self.pages.get(page))
            .filter(|pending| pending.archived_below != Lsn::ZERO)
            .map(|pending| (pending.rec_lsn, pending.archived_below))
            .reduce(|(from, below), (f, b)| (from.min(f), below.max(b)))
    }

    /// Replaces page `page`'s archived stretch by the records `history` holds: the page's
    /// changes the archive had in `window` (from..below) when it had archived up to
    /// `archived`. Does nothing unless the page is pending with an archived stretch inside
    /// `window` that the archive covered then.
    pub fn supply_archived(
        &mut self,
        page: PageId,
        (from, below): (Lsn, Lsn),
        archived: Lsn,
        history: Vec<(Lsn, LogRecord)>,
    ) {
        let Some(pending) = self.pages.get_mut(&page) else {
            return;
        };
        let stretch = pending.rec_lsn..pending.archived_below;
        let covered = pending.archived_below != Lsn::ZERO
            && from <= stretch.start
            && stretch.end <= below
            && Lsn::new(stretch.end.get() - 1) <= archived;
        if !covered {
            return;
        }
        let mut records: Vec<(Lsn, Arc<LogRecord>)> = history
            .into_iter()
            .filter(|(lsn, _)| stretch.contains(lsn))
            .map(|(lsn, record)| (lsn, Arc::new(record)))
            .collect();
        self.records += records.len();
        self.from_archive -= 1;
        records.append(&mut pending.records);
        pending.records = records;
        pending.archived_below = Lsn::ZERO;
    }

    /// Pages with redo pending.
    pub fn pages(&self) -> usize {
        self.pages.len()
    }

    /// Records held for those pages' pending redo (not counting those left in the archive).
    pub fn records(&self) -> usize {
        self.records
    }

    /// Pending pages whose redo starts in the archive.
    pub fn pages_from_archive(&self) -> usize {
        self.from_archive
    }

    /// Up to `n` pending pages, lowest ids first.
    pub fn first_pages(&self, n: usize) -> Vec<PageId> {
        self.pages.keys().take(n).copied().collect()
    }

    /// The pending pages as entries of a dirty-page table: their stored images lack changes
    /// from the first pending one on, unless the decoupled cleaner, whose clean LSN is
    /// `clean_lsn`, has brought them past some (or all) of them.
    pub fn dirty_pages(&self, clean_lsn: Lsn) -> impl Iterator<Item = DirtyPage> + '_ {
        self.pages
            .iter()
            .filter(move |(_, pending)| pending.page_lsn > clean_lsn)
            .map(move |(&page, pending)| DirtyPage {
                page,
                rec_lsn: pending.rec_lsn.max(clean_lsn.next()),
                page_lsn: pending.page_lsn,
            })
    }
}

/// Applies `records` (in LSN order) to `page`, the image of page `id` just read. Returns the
/// LSN of the first record that changed it (`None`: the image had them all).
///
/// # Errors
/// As [`redo`].
pub fn redo_all(
    id: PageId,
    page: &mut Page,
    records: &[(Lsn, Arc<LogRecord>)],
) -> Result<Option<Lsn>> {
    let mut first = None;
    for (lsn, record) in records {
        if redo(id, page, *lsn, record)? {
            first.get_or_insert(*lsn);
        }
    }
    Ok(first)
}
