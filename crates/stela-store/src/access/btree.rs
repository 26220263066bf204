//! The B+tree over the buffer pool, and the engine state every tree operation needs (pool, log,
//! page allocation), held under the store's one engine latch.
//!
//! Invariants kept here:
//! - Log first: every change to a page is appended to the log before it is applied, and the page
//!   is stamped with that record's LSN; a record names the page's previous LSN (its chain). If
//!   the append fails, no page has changed.
//! - A split is one `Structure` record holding the new image of every page it touched, so after
//!   a crash the tree is either split or not, never half.
//! - The root is page 0 and never moves; a root split moves its entries into two new pages.
//! - Keys under `children[i]` of an internal node are `>= keys[i-1]` and `< keys[i]`.
//! - Deletes remove entries and never merge: an empty leaf stays in the tree and routes
//!   correctly (space is not reclaimed; see the crate documentation).

use crate::access::pool::BufferPool;
use crate::error::{Error, Result};
use crate::format::page::{self, Internal, Node, Page, PageError, PageId, ROOT};
use crate::format::{LogBody, LogRecord, PageImage, SYSTEM_TXN};
use crate::log::LogDevice;
use std::ops::Bound;
use std::sync::Arc;
use stela_format::Lsn;

/// Deeper than any tree of 8 KiB pages can be; a longer path means a cycle in corrupt pages.
const MAX_DEPTH: usize = 48;

/// What [`Engine::read_for_write`] found: the key's value and the pages from the root to its
/// leaf.
pub(crate) struct Read {
    pub value: Option<Vec<u8>>,
    path: Vec<PageId>,
}

pub(crate) struct Engine {
    pub pool: BufferPool,
    pub log: Arc<dyn LogDevice>,
    /// The next page id a split allocates; above every page id in the file or the log.
    pub next_page: PageId,
}

impl Engine {
    /// The pages from the root to the leaf whose key range holds `key`.
    fn path_to(&mut self, key: &[u8]) -> Result<Vec<PageId>> {
        let mut path = vec![ROOT];
        loop {
            let id = *path.last().expect("the root is on every path");
            let child = match &self.pool.page(id, self.log.as_ref())?.node {
                Node::Leaf(_) => return Ok(path),
                Node::Internal(internal) => internal.children[internal.child_index(key)],
            };
            if path.len() >= MAX_DEPTH {
                return Err(Error::Corrupt {
                    page: id,
                    source: PageError::Malformed("the tree is deeper than possible (a cycle)"),
                });
            }
            path.push(child);
        }
    }

    /// The value of `key`.
    pub fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.read_for_write(key).map(|read| read.value)
    }

    /// The value of `key`, with where it was found, for a write of the same key that follows
    /// under the same hold of the engine latch ([`Engine::set_from`]): a read-modify-write
    /// then walks the tree and searches the leaf once, not twice.
    pub fn read_for_write(&mut self, key: &[u8]) -> Result<Read> {
        let path = self.path_to(key)?;
        let leaf = *path.last().expect("a path ends at a leaf");
        match &self.pool.page(leaf, self.log.as_ref())?.node {
            Node::Leaf(leaf) => Ok(Read {
                value: leaf.get(key).map(<[u8]>::to_vec),
                path,
            }),
            Node::Internal(_) => unreachable!("path_to ends at a leaf"),
        }
    }

    /// The first `limit` entries with keys in the range, in key order.
    pub fn scan(
        &mut self,
        range: (Bound<&[u8]>, Bound<&[u8]>),
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut out: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        // Depth-first, children in key order; each stack entry is a page and its depth.
        let mut stack = vec![(ROOT, 0usize)];
        while let Some((id, depth)) = stack.pop() {
            if depth >= MAX_DEPTH {
                return Err(Error::Corrupt {
                    page: id,
                    source: PageError::Malformed("the tree is deeper than possible (a cycle)"),
                });
            }
            match &self.pool.page(id, self.log.as_ref())?.node {
                Node::Leaf(leaf) => {
                    let (room, before) = (limit - out.len(), out.len());
                    out.extend(
                        leaf.entries
                            .iter()
                            .filter(|(k, _)| range_contains(range, k))
                            .take(room)
                            .cloned(),
                    );
                    debug_assert!(
                        out[before.saturating_sub(1)..]
                            .windows(2)
                            .all(|w| w[0].0 < w[1].0),
                        "a scan returns keys in ascending order"
                    );
                    if out.len() == limit {
                        break;
                    }
                }
                Node::Internal(internal) => {
                    // Child i holds keys in [keys[i-1], keys[i]); visit those meeting the range,
                    // pushed in reverse so the smallest is popped first.
                    for i in (0..internal.children.len()).rev() {
                        let low = i.checked_sub(1).map(|j| internal.keys[j].as_slice());
                        let high = internal.keys.get(i).map(Vec::as_slice);
                        if child_meets_range(low, high, range) {
                            stack.push((internal.children[i], depth + 1));
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// Sets `key` to `value` (`None` removes it) on its leaf, logging the change with the record
    /// `make_record` builds from the leaf's id, its page LSN and the value before. Splits first
    /// if the leaf has no room. Returns the record and its LSN.
    pub fn set(
        &mut self,
        key: &[u8],
        value: Option<&[u8]>,
        make_record: impl Fn(PageId, Lsn, Option<Vec<u8>>) -> LogRecord,
    ) -> Result<(Lsn, Arc<LogRecord>)> {
        self.set_from(None, key, value, make_record)
    }

    /// [`Engine::set`]; with `read`, of the key it was read for, with nothing done to the tree
    /// between (the caller held the engine latch throughout): starts from the path the read
    /// found and logs the value it read as the value before, instead of finding both again.
    pub fn set_from(
        &mut self,
        mut read: Option<Read>,
        key: &[u8],
        value: Option<&[u8]>,
        make_record: impl Fn(PageId, Lsn, Option<Vec<u8>>) -> LogRecord,
    ) -> Result<(Lsn, Arc<LogRecord>)> {
        // What a read found holds until the tree changes: a split sends the loop round again
        // with the path found anew, and the value, which no split changes.
        let mut known_before: Option<Option<Vec<u8>>> = None;
        loop {
            let path = match read.take() {
                Some(read) => {
                    known_before = Some(read.value);
                    read.path
                }
                None => self.path_to(key)?,
            };
            let leaf_id = *path.last().expect("a path ends at a leaf");
            let page = self.pool.page(leaf_id, self.log.as_ref())?;
            let Node::Leaf(leaf) = &page.node else {
                unreachable!("path_to ends at a leaf")
            };
            if leaf.overflow_after_set(key, value).is_some() && leaf.entries.len() >= 2 {
                self.split(&path, key)?;
                continue;
            }
            let before = match known_before.take() {
                Some(before) => {
                    debug_assert_eq!(before.as_deref(), leaf.get(key), "the read is stale");
                    before
                }
                None => leaf.get(key).map(<[u8]>::to_vec),
            };
            // Shared with the log's in-memory tail and the transaction's undo list: no copies.
            let record = Arc::new(make_record(leaf_id, page.lsn, before));
            let lsn = self.log.append_shared(&record)?;
            self.pool.modify(leaf_id, lsn, self.log.as_ref(), |page| {
                if let Node::Leaf(leaf) = &mut page.node {
                    leaf.set(key, value);
                }
            })?;
            return Ok((lsn, record));
        }
    }

    /// Splits the last page of `path` (a leaf with no room for `key`), and its ancestors as far
    /// up as the separators do not fit, as one logged structure change.
    ///
    /// A leaf is split in half by bytes, except when `key` goes after every key it holds: then
    /// the leaf keeps all its entries and `key` starts a new, empty right page. Keys that
    /// arrive in ascending order (a history, a log, a counter) then fill each leaf before
    /// moving on, instead of leaving a trail of half-empty leaves, so they cost about half the
    /// splits and half the pages.
    fn split(&mut self, path: &[PageId], key: &[u8]) -> Result<()> {
        let log = Arc::clone(&self.log);
        // Nothing else changes the path's pages meanwhile (the engine is borrowed mutably). A
        // node is copied only when the split reaches its level (most splits end at the leaf's
        // parent), with the LSN it had: the prior LSN of its new image.
        let mut copied: Vec<(PageId, Lsn)> = Vec::with_capacity(path.len());
        let mut copy = |pool: &mut BufferPool, id: PageId| -> Result<Node> {
            let page = pool.page(id, log.as_ref())?;
            copied.push((id, page.lsn));
            Ok(page.node.clone())
        };
        let mut images: Vec<(PageId, Node)> = Vec::new();
        let mut level = path.len() - 1;
        let mut overfull = copy(&mut self.pool, path[level])?;
        loop {
            let (left, separator, right) = match overfull {
                Node::Leaf(leaf)
                    if leaf
                        .entries
                        .last()
                        .is_some_and(|(last, _)| last.as_slice() < key) =>
                {
                    (
                        Node::Leaf(leaf),
                        key.to_vec(),
                        Node::Leaf(page::Leaf::default()),
                    )
                }
                node => page::split(node),
            };
            if level == 0 {
                // The root keeps its page: its halves move to two new pages under it.
                let (left_id, right_id) = (self.allocate(), self.allocate());
                images.push((left_id, left));
                images.push((right_id, right));
                images.push((
                    ROOT,
                    Node::Internal(Internal {
                        keys: vec![separator],
                        children: vec![left_id, right_id],
                    }),
                ));
                break;
            }
            let right_id = self.allocate();
            images.push((path[level], left));
            images.push((right_id, right));
            let Node::Internal(mut parent) = copy(&mut self.pool, path[level - 1])? else {
                unreachable!("a path's inner pages are internal nodes")
            };
            let at = parent
                .children
                .iter()
                .position(|&c| c == path[level])
                .expect("a page on the path is a child of the page above it");
            parent.keys.insert(at, separator);
            parent.children.insert(at + 1, right_id);
            level -= 1;
            let parent = Node::Internal(parent);
            if parent.fits() {
                images.push((path[level], parent));
                break;
            }
            overfull = parent;
        }
        let pages: Vec<PageImage> = images
            .into_iter()
            .map(|(page, node)| PageImage {
                page,
                prev_page_lsn: copied
                    .iter()
                    .find(|&&(copied, _)| copied == page)
                    .map_or(Lsn::ZERO, |&(_, lsn)| lsn),
                node,
            })
            .collect();
        let record = LogRecord {
            txn: SYSTEM_TXN,
            prev_txn_lsn: Lsn::ZERO,
            body: LogBody::Structure { pages },
        };
        let lsn = log.append(&record)?;
        let LogBody::Structure { pages } = record.body else {
            unreachable!()
        };
        for image in pages {
            self.pool.install(
                image.page,
                Page {
                    lsn,
                    node: image.node,
                },
                log.as_ref(),
            )?;
        }
        Ok(())
    }

    fn allocate(&mut self) -> PageId {
        let id = self.next_page;
        self.next_page += 1;
        id
    }
}

fn range_contains(range: (Bound<&[u8]>, Bound<&[u8]>), key: &[u8]) -> bool {
    let above_start = match range.0 {
        Bound::Included(start) => key >= start,
        Bound::Excluded(start) => key > start,
        Bound::Unbounded => true,
    };
    let below_end = match range.1 {
        Bound::Included(end) => key <= end,
        Bound::Excluded(end) => key < end,
        Bound::Unbounded => true,
    };
    above_start && below_end
}

/// Whether the key interval `[low, high)` (open where `None`) meets `range`.
fn child_meets_range(
    low: Option<&[u8]>,
    high: Option<&[u8]>,
    range: (Bound<&[u8]>, Bound<&[u8]>),
) -> bool {
    let starts_before_high = match (range.0, high) {
        (_, None) | (Bound::Unbounded, _) => true,
        (Bound::Included(start) | Bound::Excluded(start), Some(high)) => start < high,
    };
    let ends_after_low = match (range.1, low) {
        (_, None) | (Bound::Unbounded, _) => true,
        (Bound::Included(end), Some(low)) => end >= low,
        (Bound::Excluded(end), Some(low)) => end > low,
    };
    starts_before_high && ends_after_low
}
