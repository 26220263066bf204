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
//! those changes, in LSN order. Instant restart builds it from analysis instead of redoing, and
//! the pool owns it afterwards. Invariants:
//! - a page is either in the pool or pending, never both: the pool removes a page's entry when
//!   it reads the page (and redoes the records before anyone sees the image) or installs a whole
//!   new image of it;
//! - the records of a pending page are every change at or above its analysis `rec_lsn`, so
//!   they bring its stored image up to the state at the crash.

use crate::error::{Error, Result};
use crate::format::{DirtyPage, LogBody, LogRecord};
use crate::page::{self, Node, Page, PageError, PageId};
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
        | LogBody::CheckpointEnd { .. } => return Ok(false),
    }
    page.lsn = lsn;
    Ok(true)
}

fn set_on_leaf(id: PageId, page: &mut Page, key: &[u8], value: Option<&[u8]>) -> Result<()> {
    match &mut page.node {
        Node::Leaf(leaf) => {
            let after = leaf.len_after_set(key, value);
            if after > page::PAGE_SIZE {
                return Err(Error::Corrupt {
                    page: id,
                    source: PageError::TooLarge(after),
                });
            }
            leaf.set(key, value);
            Ok(())
        }
        Node::Internal(_) => Err(Error::Corrupt {
            page: id,
            source: PageError::Malformed("the log writes a key to it, but it is an internal node"),
        }),
    }
}

/// Pages whose redo instant restart left for later, with the records to redo. See the module
/// documentation.
#[derive(Debug, Default)]
pub struct PendingRedo {
    /// By page id, so that the background drain reads the page file in order.
    pages: BTreeMap<PageId, Vec<(Lsn, Arc<LogRecord>)>>,
    records: usize,
}

impl PendingRedo {
    /// Adds the record at `lsn` to page `page`'s list. Records must come in LSN order.
    pub fn push(&mut self, page: PageId, lsn: Lsn, record: Arc<LogRecord>) {
        self.pages.entry(page).or_default().push((lsn, record));
        self.records += 1;
    }

    /// Removes and returns page `page`'s records, if it has any pending.
    pub fn take(&mut self, page: PageId) -> Option<Vec<(Lsn, Arc<LogRecord>)>> {
        let records = self.pages.remove(&page)?;
        self.records -= records.len();
        Some(records)
    }

    /// Puts back records taken by [`PendingRedo::take`] whose redo could not be completed.
    pub fn restore(&mut self, page: PageId, records: Vec<(Lsn, Arc<LogRecord>)>) {
        self.records += records.len();
        self.pages.insert(page, records);
    }

    /// Pages with redo pending.
    pub fn pages(&self) -> usize {
        self.pages.len()
    }

    /// Records of those pages' pending redo.
    pub fn records(&self) -> usize {
        self.records
    }

    /// Up to `n` pending pages, lowest ids first.
    pub fn first_pages(&self, n: usize) -> Vec<PageId> {
        self.pages.keys().take(n).copied().collect()
    }

    /// The pending pages as entries of a dirty-page table: their stored images lack changes
    /// from the first pending record on, unless the decoupled cleaner, whose clean LSN is
    /// `clean_lsn`, has brought them past some (or all) of them.
    pub fn dirty_pages(&self, clean_lsn: Lsn) -> impl Iterator<Item = DirtyPage> + '_ {
        self.pages.iter().filter_map(move |(&page, records)| {
            let (first, _) = records.first()?;
            let (last, _) = records.last()?;
            (*last > clean_lsn).then(|| DirtyPage {
                page,
                rec_lsn: (*first).max(clean_lsn.next()),
                page_lsn: *last,
            })
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
