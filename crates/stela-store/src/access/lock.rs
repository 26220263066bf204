//! Key locks for strict two-phase locking, with deadlock detection on a waits-for graph.
//!
//! This module owns the lock table. Invariants: a key is held either in exclusive mode by one
//! transaction or in shared mode by any number; a transaction's locks are released only all at
//! once, at its end (strict 2PL: nothing it wrote is seen, and nothing it read changes, before
//! it commits or aborts). Before a transaction starts to wait, the graph of who waits for whom
//! is searched for a cycle through it; if there is one, that transaction (the one that closed
//! the cycle) is the victim and gets [`Error::Deadlock`] instead of waiting. Every cycle is found
//! this way, because a cycle can only be closed by a transaction starting to wait. A wait that
//! lasts past the manager's timeout ends in [`Error::LockTimeout`], with the waiter again waiting
//! for nothing (a holder that never ends, a lock cycle through something other than locks).

use crate::error::{Error, Result};
use crate::format::TxnId;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Bound;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockMode {
    Shared,
    Exclusive,
}

/// Who holds one key. A short list rather than a map: a key has one holder, or a few readers,
/// and a lock is made and dropped with every transaction that touches a key nobody else holds,
/// so what it costs to build counts more than lookups in it.
#[derive(Default)]
struct KeyLock {
    holders: Vec<(TxnId, LockMode)>,
}

impl KeyLock {
    /// Whether `txn` may hold the key in `mode` given the other holders.
    fn grantable(&self, txn: TxnId, mode: LockMode) -> bool {
        self.holders.iter().all(|&(holder, held)| {
            holder == txn || (mode == LockMode::Shared && held == LockMode::Shared)
        })
    }

    /// Whether `txn` holds the key, in either mode.
    fn held_by(&self, txn: TxnId) -> bool {
        self.holders.iter().any(|&(holder, _)| holder == txn)
    }

    /// Records that `txn` holds the key in `mode`, or in the mode it held if that is stronger
    /// (exclusive is never weakened). `true`: `txn` did not hold the key before.
    fn grant(&mut self, txn: TxnId, mode: LockMode) -> bool {
        match self.holders.iter_mut().find(|(holder, _)| *holder == txn) {
            Some((_, held)) => {
                if *held != LockMode::Exclusive {
                    *held = mode;
                }
                false
            }
            None => {
                self.holders.push((txn, mode));
                true
            }
        }
    }

    /// The table's rule for one key: one exclusive holder alone, or shared holders only, each
    /// holder once.
    fn consistent(&self) -> bool {
        let exclusive = self
            .holders
            .iter()
            .filter(|(_, mode)| *mode == LockMode::Exclusive)
            .count();
        let distinct = self
            .holders
            .iter()
            .enumerate()
            .all(|(i, (txn, _))| self.holders[..i].iter().all(|(other, _)| other != txn));
        distinct && (exclusive == 0 || self.holders.len() == 1)
    }

    /// The holders `txn` would wait for.
    fn blockers(&self, txn: TxnId, mode: LockMode) -> impl Iterator<Item = TxnId> + '_ {
        self.holders.iter().filter_map(move |&(holder, held)| {
            let conflicts =
                holder != txn && (mode == LockMode::Exclusive || held == LockMode::Exclusive);
            conflicts.then_some(holder)
        })
    }
}

#[derive(Default)]
struct LockTable {
    keys: BTreeMap<Vec<u8>, KeyLock>,
    /// What each waiting transaction waits for: the edges of the waits-for graph.
    waiting: HashMap<TxnId, (Vec<u8>, LockMode)>,
    /// The keys each transaction holds, to release them at its end.
    held: HashMap<TxnId, Vec<Vec<u8>>>,
}

impl LockTable {
    /// Whether the waits-for graph, with `start`'s pending request in it, has a cycle through
    /// `start`.
    fn cycle_through(&self, start: TxnId) -> bool {
        let mut stack = vec![start];
        let mut seen = HashSet::new();
        while let Some(txn) = stack.pop() {
            let Some((key, mode)) = self.waiting.get(&txn) else {
                continue;
            };
            let Some(lock) = self.keys.get(key) else {
                continue;
            };
            for blocker in lock.blockers(txn, *mode) {
                if blocker == start {
                    return true;
                }
                if seen.insert(blocker) {
                    stack.push(blocker);
                }
            }
        }
        false
    }
}

#[derive(Default)]
pub struct LockManager {
    table: Mutex<LockTable>,
    released: Condvar,
    /// The longest a transaction waits for one lock (`None`: until it is granted).
    timeout: Option<Duration>,
}

impl LockManager {
    /// A lock manager whose waits end in [`Error::LockTimeout`] after `timeout`.
    pub fn with_timeout(timeout: Option<Duration>) -> LockManager {
        LockManager {
            timeout,
            ..LockManager::default()
        }
    }

    /// Blocks until `txn` holds `key` in `mode` (or stronger).
    ///
    /// # Errors
    /// [`Error::Deadlock`] if waiting would close a cycle, [`Error::LockTimeout`] if the wait
    /// lasts past the timeout; `txn` then waits for nothing and holds what it held before.
    pub fn acquire(&self, txn: TxnId, key: &[u8], mode: LockMode) -> Result<()> {
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        let mut started: Option<Instant> = None;
        loop {
            // The key is copied only when its lock is made.
            let lock = match table.keys.get_mut(key) {
                Some(lock) => lock,
                None => table.keys.entry(key.to_vec()).or_default(),
            };
            if lock.grantable(txn, mode) {
                let new = lock.grant(txn, mode);
                debug_assert!(lock.consistent(), "key lock holders: {:?}", lock.holders);
                if new {
                    table.held.entry(txn).or_default().push(key.to_vec());
                }
                table.waiting.remove(&txn);
                return Ok(());
            }
            table.waiting.insert(txn, (key.to_vec(), mode));
            if table.cycle_through(txn) {
                table.waiting.remove(&txn);
                tracing::debug!(txn, "deadlock: victim");
                return Err(Error::Deadlock { txn });
            }
            let Some(timeout) = self.timeout else {
                table = self.released.wait(table).unwrap_or_else(|p| p.into_inner());
                continue;
            };
            let since = *started.get_or_insert_with(Instant::now);
            let waited = since.elapsed();
            if waited >= timeout {
                table.waiting.remove(&txn);
                tracing::debug!(txn, ?waited, "lock wait timed out");
                return Err(Error::LockTimeout { txn, waited });
            }
            table = self
                .released
                .wait_timeout(table, timeout - waited)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// The transactions `txn` would wait for to hold `key` in `mode` now (none: it would not
    /// wait).
    pub fn blockers(&self, txn: TxnId, key: &[u8], mode: LockMode) -> Vec<TxnId> {
        let table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        table
            .keys
            .get(key)
            .map(|lock| lock.blockers(txn, mode).collect())
            .unwrap_or_default()
    }

    /// Keys in the range that a transaction other than `txn` holds exclusively: the keys whose
    /// committed state a scan cannot see yet (inserted, changed or deleted by a running
    /// transaction), which the scan must lock, and so wait for, to read them.
    pub fn exclusive_keys_in(
        &self,
        txn: TxnId,
        range: (Bound<&[u8]>, Bound<&[u8]>),
    ) -> Vec<Vec<u8>> {
        let table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        table
            .keys
            .range::<[u8], _>(range)
            .filter(|(_, lock)| {
                lock.holders
                    .iter()
                    .any(|&(holder, mode)| holder != txn && mode == LockMode::Exclusive)
            })
            .map(|(key, _)| key.clone())
            .collect()
    }

    /// A copy of the exclusive locks, by holder (the classical checkpoint's lock table).
    pub fn exclusive_by_txn(&self) -> HashMap<TxnId, Vec<Vec<u8>>> {
        let table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        let mut by_txn: HashMap<TxnId, Vec<Vec<u8>>> = HashMap::new();
        for (key, lock) in &table.keys {
            for &(holder, mode) in &lock.holders {
                if mode == LockMode::Exclusive {
                    by_txn.entry(holder).or_default().push(key.clone());
                }
            }
        }
        by_txn
    }

    /// Whether `txn` holds `key` in some mode.
    pub fn holds(&self, txn: TxnId, key: &[u8]) -> bool {
        let table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        table.keys.get(key).is_some_and(|lock| lock.held_by(txn))
    }

    /// Releases every lock of `txn` (its end) and wakes the waiters.
    pub fn release_all(&self, txn: TxnId) {
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        table.waiting.remove(&txn);
        for key in table.held.remove(&txn).unwrap_or_default() {
            if let Some(lock) = table.keys.get_mut(&key) {
                lock.holders.retain(|&(holder, _)| holder != txn);
                if lock.holders.is_empty() {
                    table.keys.remove(&key);
                }
            }
        }
        // Waiters register in `waiting` under the table's mutex before they sleep on the
        // condition variable (which releases it atomically), so with nobody in it there is
        // nobody to wake, and every commit is spared a futex call.
        let anyone_waits = !table.waiting.is_empty();
        drop(table);
        if anyone_waits {
            self.released.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_locks_share_and_exclusive_ones_exclude() {
        let locks = LockManager::default();
        locks.acquire(1, b"k", LockMode::Shared).unwrap();
        locks.acquire(2, b"k", LockMode::Shared).unwrap();
        let table = locks.table.lock().unwrap();
        assert!(!table.keys[&b"k"[..]].grantable(3, LockMode::Exclusive));
        assert!(!table.keys[&b"k"[..]].grantable(1, LockMode::Exclusive));
        drop(table);
        locks.release_all(2);
        // The only holder may upgrade.
        locks.acquire(1, b"k", LockMode::Exclusive).unwrap();
        assert_eq!(
            locks.exclusive_keys_in(2, (Bound::Unbounded, Bound::Unbounded)),
            vec![b"k".to_vec()]
        );
        assert!(locks
            .exclusive_keys_in(1, (Bound::Unbounded, Bound::Unbounded))
            .is_empty());
        locks.release_all(1);
        assert!(locks.table.lock().unwrap().keys.is_empty());
    }

    /// `txn` acquires `key` on a thread of its own; the answer comes back on the receiver. A
    /// test waits for it with a bound (a lost wake-up would otherwise hang it, not fail it).
    fn acquire_aside(
        locks: &std::sync::Arc<LockManager>,
        txn: TxnId,
        key: &'static [u8],
        mode: LockMode,
    ) -> std::sync::mpsc::Receiver<Result<()>> {
        let (answer, answered) = std::sync::mpsc::channel();
        let aside = std::sync::Arc::clone(locks);
        std::thread::spawn(move || answer.send(aside.acquire(txn, key, mode)));
        // Until it waits, what the test does next could come first, and test nothing.
        while !locks_waiting(locks, txn) {
            std::thread::yield_now();
        }
        answered
    }

    /// A lock table in which each `(txn, key, mode)` was granted, in order.
    fn holding(grants: &[(TxnId, &[u8], LockMode)]) -> std::sync::Arc<LockManager> {
        let locks = std::sync::Arc::new(LockManager::default());
        for &(txn, key, mode) in grants {
            locks.acquire(txn, key, mode).unwrap();
        }
        locks
    }

    fn locks_waiting(locks: &LockManager, txn: TxnId) -> bool {
        locks.table.lock().unwrap().waiting.contains_key(&txn)
    }

    fn granted(answered: &std::sync::mpsc::Receiver<Result<()>>) -> Result<()> {
        answered
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("the waiter was never woken")
    }

    #[test]
    fn a_waiter_is_woken_when_the_holder_ends() {
        let locks = holding(&[(1, b"k", LockMode::Exclusive)]);
        let waiter = acquire_aside(&locks, 2, b"k", LockMode::Shared);
        locks.release_all(1);
        granted(&waiter).unwrap();
        assert!(locks.holds(2, b"k"));
        assert!(!locks.holds(1, b"k"));
    }

    #[test]
    fn the_transaction_that_closes_a_cycle_is_the_victim() {
        let locks = holding(&[
            (1, b"a", LockMode::Exclusive),
            (2, b"b", LockMode::Exclusive),
        ]);
        let first = acquire_aside(&locks, 1, b"b", LockMode::Exclusive);
        assert!(matches!(
            locks.acquire(2, b"a", LockMode::Shared),
            Err(Error::Deadlock { txn: 2 })
        ));
        // The victim still holds what it held; once it ends, the other proceeds.
        assert!(locks.holds(2, b"b"));
        locks.release_all(2);
        granted(&first).unwrap();
        assert!(locks.holds(1, b"a") && locks.holds(1, b"b"));
    }

    #[test]
    fn an_upgrade_waits_for_the_other_readers() {
        let locks = holding(&[(1, b"k", LockMode::Shared), (2, b"k", LockMode::Shared)]);
        let upgrade = acquire_aside(&locks, 1, b"k", LockMode::Exclusive);
        locks.release_all(2);
        granted(&upgrade).unwrap();
        assert_eq!(
            locks.exclusive_keys_in(2, (Bound::Unbounded, Bound::Unbounded)),
            vec![b"k".to_vec()]
        );
        assert_eq!(locks.table.lock().unwrap().keys[&b"k"[..]].holders.len(), 1);
    }
}
