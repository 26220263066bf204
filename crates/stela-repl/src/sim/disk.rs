//! A node's disk, as the fault model has it: writes sit in a cache until a sync makes them
//! durable; a crash keeps what was synced, a random prefix of what was not, and may tear the
//! last record it kept; a bit flip damages a synced record. The log file, the synced mark
//! (written with each sync) and the newest term seen (written at once) are the node's state.

use super::rng::Rng;
use crate::log::{Lsn, Record, Term};
use crate::node::DiskImage;

#[derive(Clone, Debug, Default)]
pub struct Disk {
    /// What is in the file: durable up to `synced`, possibly more after a crash kept it.
    file: Vec<(Record, bool)>,
    synced: Lsn,
    promised: Term,
    /// Written, not yet synced.
    cache: Vec<Record>,
    pub salvage: Vec<Record>,
}

impl Disk {
    pub fn write(&mut self, records: &[Record]) {
        self.cache.extend_from_slice(records);
    }

    fn apply(file: &mut Vec<(Record, bool)>, record: Record) {
        file.truncate(usize::try_from(record.lsn - 1).unwrap_or(usize::MAX));
        file.push((record, true));
    }

    pub fn sync(&mut self) {
        for record in std::mem::take(&mut self.cache) {
            Self::apply(&mut self.file, record);
        }
        self.synced = self.file.len() as Lsn;
    }

    pub fn cut(&mut self, keep: Lsn, salvage: &[Record]) {
        self.sync();
        self.file
            .truncate(usize::try_from(keep).unwrap_or(usize::MAX));
        self.synced = self.file.len() as Lsn;
        self.salvage.extend_from_slice(salvage);
    }

    pub fn persist_term(&mut self, term: Term) {
        debug_assert!(term >= self.promised);
        self.promised = term;
    }

    /// A power cut: a prefix of the cache reaches the file, its last record perhaps torn.
    pub fn crash(&mut self, rng: &mut Rng) {
        let cache = std::mem::take(&mut self.cache);
        let kept = rng.below(cache.len() as u64 + 1) as usize;
        for &record in &cache[..kept] {
            Self::apply(&mut self.file, record);
        }
        if kept > 0 && rng.chance(300) {
            if let Some(last) = self.file.last_mut() {
                debug_assert!(last.0.lsn > self.synced, "only unsynced writes tear");
                last.1 = false;
            }
        }
    }

    /// Drops what recovery did not take (a torn record and what follows it, never synced):
    /// recovery truncates the file there, so a later sync cannot mark that debris synced.
    pub fn drop_after(&mut self, keep: Lsn) {
        debug_assert!(keep >= self.synced, "recovery never drops a synced record");
        self.file
            .truncate(usize::try_from(keep).unwrap_or(usize::MAX));
    }

    /// Damages a synced record, if there is one; returns its LSN.
    pub fn flip(&mut self, rng: &mut Rng) -> Option<Lsn> {
        if self.synced == 0 {
            return None;
        }
        let index = rng.below(self.synced) as usize;
        self.file[index].1 = false;
        Some(self.file[index].0.lsn)
    }

    pub fn image(&self) -> DiskImage {
        DiskImage {
            records: self.file.clone(),
            synced: self.synced,
            promised: self.promised,
        }
    }
}
