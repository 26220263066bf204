//! [`ImageCache`]: the page images the decoupled cleaner (and the standby's follower) keep
//! between rounds, so that a page changed again is replayed onto the image in memory instead of
//! being read back from the page file.
//!
//! It holds at most its capacity. When a round leaves it fuller, it drops the images it can best
//! do without: first those no round has touched for the longest, and among those touched as
//! recently, those wanted again fewest times. A page counts as wanted again when a round takes
//! it back from the cache, or reads it back from the file soon after the cache dropped it (the
//! ids of the last images dropped are remembered, as 2Q's "A1out" list does). So a page changed
//! in round after round (a branch, a teller, an index node) stays, and a page written once and
//! never again (a new history leaf) goes first. Dropping the whole cache when full, as an
//! earlier version did, made every round after it read all its pages back from the file.
//!
//! Invariant (kept by its callers, not checked here): every image in the cache holds every
//! change of its page up to the clean LSN of the round that put it there; an image is taken out
//! for a round and put back after it, so none is used by two rounds at once.

use crate::format::page::{Page, PageId};
use std::collections::{HashMap, VecDeque};

/// Most images kept (8 KiB each): 64 MiB.
pub(crate) const DEFAULT_CAPACITY: usize = 8192;

struct Cached {
    page: Page,
    /// The round that last put it back.
    round: u64,
    /// How many rounds wanted it again (saturating).
    reuses: u32,
}

/// An image taken for a round, with what the cache knew of it.
pub(crate) struct Taken {
    pub page: Page,
    reuses: Option<u32>,
}

impl Taken {
    /// An image read from the page file (or rebuilt): the cache did not have it.
    pub(crate) fn read(page: Page) -> Taken {
        Taken { page, reuses: None }
    }
}

/// See the module documentation.
pub struct ImageCache {
    images: HashMap<PageId, Cached>,
    capacity: usize,
    /// Rounds that have put images back (the age of an image is counted in them).
    round: u64,
    /// The pages whose images were dropped last (at most `capacity`), each with the count of
    /// drops when it was, oldest first in `dropped_order`; an entry there whose count differs
    /// from the map's was dropped again later and is skipped.
    dropped: HashMap<PageId, u64>,
    dropped_order: VecDeque<(PageId, u64)>,
    drops: u64,
}

impl Default for ImageCache {
    fn default() -> ImageCache {
        ImageCache::with_capacity(DEFAULT_CAPACITY)
    }
}

impl ImageCache {
    pub(crate) fn with_capacity(capacity: usize) -> ImageCache {
        ImageCache {
            images: HashMap::new(),
            capacity,
            round: 0,
            dropped: HashMap::new(),
            dropped_order: VecDeque::new(),
            drops: 0,
        }
    }

    /// Takes page `id`'s image out for a round, if the cache has it.
    pub(crate) fn take(&mut self, id: PageId) -> Option<Taken> {
        self.images.remove(&id).map(|cached| Taken {
            page: cached.page,
            reuses: Some(cached.reuses),
        })
    }

    /// Puts back a round's images (each now holding every change up to the round's clean
    /// LSN), then drops images down to the capacity.
    pub(crate) fn put_round(&mut self, images: impl IntoIterator<Item = (PageId, Taken)>) {
        self.round += 1;
        let round = self.round;
        for (id, taken) in images {
            let reuses = match taken.reuses {
                Some(reuses) => reuses.saturating_add(1),
                // Read back from the file: wanted again if the cache had dropped it lately.
                None => u32::from(self.dropped.remove(&id).is_some()),
            };
            self.images.insert(
                id,
                Cached {
                    page: taken.page,
                    round,
                    reuses,
                },
            );
        }
        self.shrink();
    }

    /// Drops the images that rank lowest by (last round, reuses) until the capacity is kept.
    /// Costs a pass over the cache, and only when it is over capacity.
    fn shrink(&mut self) {
        let excess = self.images.len().saturating_sub(self.capacity);
        if excess == 0 {
            return;
        }
        let mut ranks: Vec<(u64, u32, PageId)> = self
            .images
            .iter()
            .map(|(&id, cached)| (cached.round, cached.reuses, id))
            .collect();
        ranks.select_nth_unstable(excess - 1);
        for &(_, _, id) in &ranks[..excess] {
            self.images.remove(&id);
            self.remember_dropped(id);
        }
    }

    fn remember_dropped(&mut self, id: PageId) {
        self.drops += 1;
        self.dropped.insert(id, self.drops);
        self.dropped_order.push_back((id, self.drops));
        while self.dropped.len() > self.capacity
            || self.dropped_order.len() > 2 * self.capacity.max(1)
        {
            let Some((oldest, when)) = self.dropped_order.pop_front() else {
                break;
            };
            if self.dropped.get(&oldest) == Some(&when) {
                self.dropped.remove(&oldest);
            }
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.images.len()
    }

    #[cfg(test)]
    fn contains(&self, id: PageId) -> bool {
        self.images.contains_key(&id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stela_format::Lsn;

    fn image(id: PageId) -> Page {
        let mut page = Page::empty();
        page.lsn = Lsn::new(id + 1);
        page
    }

    /// Runs a round that touches `pages`: takes each from the cache (or "reads" it), puts all
    /// back.
    fn round(cache: &mut ImageCache, pages: impl IntoIterator<Item = PageId>) -> usize {
        let mut read = 0;
        let taken: Vec<(PageId, Taken)> = pages
            .into_iter()
            .map(|id| {
                let taken = cache.take(id).unwrap_or_else(|| {
                    read += 1;
                    Taken::read(image(id))
                });
                (id, taken)
            })
            .collect();
        cache.put_round(taken);
        read
    }

    #[test]
    fn pages_changed_every_round_stay_when_one_off_pages_overflow_the_cache() {
        let mut cache = ImageCache::with_capacity(100);
        // Pages 0..50 change every round; each round also writes 80 new pages once.
        let mut next_new = 1_000;
        for _ in 0..20 {
            let new: Vec<PageId> = (next_new..next_new + 80).collect();
            next_new += 80;
            round(&mut cache, (0..50).chain(new));
            assert!(cache.len() <= 100);
        }
        // The hot pages were all kept: the next round reads none of them back.
        assert_eq!(round(&mut cache, 0..50), 0);
        // And the cache keeps the newest of the one-off pages with what room is left.
        assert!(cache.contains(next_new - 1));
        assert!(!cache.contains(1_000));
    }

    #[test]
    fn a_round_larger_than_the_cache_keeps_the_cache_full_not_empty() {
        let mut cache = ImageCache::with_capacity(64);
        round(&mut cache, 0..200);
        assert_eq!(cache.len(), 64);
        // Images are handed back as they were put: the content survives the round trip.
        let kept = (0..200).find(|&id| cache.contains(id)).expect("some kept");
        let taken = cache.take(kept).expect("kept");
        assert_eq!(taken.page.lsn, Lsn::new(kept + 1));
    }

    #[test]
    fn older_rounds_go_before_newer_ones() {
        let mut cache = ImageCache::with_capacity(10);
        round(&mut cache, 0..10);
        round(&mut cache, 10..15);
        // Five of the first round's pages made room for the second's.
        assert!((10..15).all(|id| cache.contains(id)));
        assert_eq!((0..10).filter(|&id| cache.contains(id)).count(), 5);
    }
}
