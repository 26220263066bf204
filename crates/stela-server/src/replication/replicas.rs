//! The primary's shipping to every standby of the cluster (`--peer` given once per other node),
//! and K of N: a [`Replication`] per standby ships each open log to it on a stream of its own,
//! and a `replicated` commit is acknowledged once `--replicas` K of them hold the record
//! ([`super::tally`]). With one standby this is exactly that standby's [`Replication`].
//!
//! Invariants:
//! - **One term per log open, for every standby.** A log's term is begun once
//!   ([`Replication::begin_term`]) and every standby's stream ships it in that term.
//! - **`Ok` only with K.** A commit's waiter is called `Ok` only once K standbys acknowledged
//!   holding its LSN; a standby that is down or stalled adds nothing and blocks nothing while K
//!   others hold it. The waiter is called exactly once (the tally decides once).
//! - **Every standby knows every log**: a log is watched, unwatched, fenced and stepped down on
//!   every standby's [`Replication`] together.

use super::tally::Tally;
use super::{Holds, LogInfo, Replication, SessionEnd, Waiter};
use crate::pool::{LogId, Pool, PoolError};
use crate::sync::lock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Every standby's shipping, and how many must hold a record.
pub struct Replicas {
    peers: Vec<Arc<Replication>>,
    /// K: standbys that must hold a record before `replicated` is acknowledged.
    needed: usize,
    /// Serialises the opening of a log's streams (its term is begun once).
    watching: Mutex<()>,
}

/// A commit waiting on several standbys: the tally, and the waiter until it is called (or, while
/// the waits are being registered, the decision the caller returns itself).
struct Pending {
    tally: Tally,
    /// Set once decided: the waits still registered with other standbys are then dropped
    /// uncalled when their lists are pruned.
    decided: Arc<AtomicBool>,
    waiter: Option<Waiter>,
    registering: bool,
    decided_now: Option<Result<(), PoolError>>,
}

impl Replicas {
    /// Ships to each of `peers` (at least one); `needed` (K) of them must hold a record.
    pub fn new(peers: Vec<Arc<Replication>>, needed: usize) -> Replicas {
        assert!(!peers.is_empty(), "a primary's shipping needs a standby");
        assert!((1..=peers.len()).contains(&needed));
        Replicas {
            peers,
            needed,
            watching: Mutex::new(()),
        }
    }

    /// K.
    pub fn needed(&self) -> usize {
        self.needed
    }

    fn first(&self) -> &Replication {
        &self.peers[0]
    }

    /// Starts shipping `log` to every standby (once per open log) and returns the term its
    /// records get from now on (begun durably before the log takes an append).
    ///
    /// # Errors
    /// The log's TERMS file cannot be read or written.
    pub fn watch<W: Send + 'static>(
        &self,
        pool: &Arc<Pool<W>>,
        log: LogInfo,
        storage: Arc<dyn stela_wal::storage::Storage>,
    ) -> Result<u64, SessionEnd> {
        let _one_at_a_time = lock(&self.watching);
        if let Some(term) = self.first().watching(log.id) {
            return Ok(term);
        }
        let begun = self.first().begin_term(pool, &log, Arc::clone(&storage))?;
        let term = begun.0;
        for peer in &self.peers {
            peer.watch_in(pool, log.clone(), Arc::clone(&storage), begun.clone());
        }
        Ok(term)
    }

    /// The term history and last term of `log`, as this primary began it (`History`).
    pub fn history(&self, log: LogId) -> Option<(u64, stela_format::term::TermHistory)> {
        self.first().history(log)
    }

    /// The last LSN of `log` that K standbys hold, as far as this primary knows (the K-th
    /// highest of what each acknowledged; see [`Replication::protected_through`]).
    pub fn protected_through(&self, log: LogId, promoted: bool) -> u64 {
        let mut each: Vec<u64> = self
            .peers
            .iter()
            .map(|p| p.protected_through(log, promoted))
            .collect();
        each.sort_unstable_by(|a, b| b.cmp(a));
        each[self.needed - 1]
    }

    /// The holder names of the holds this primary keeps, one per standby.
    pub fn standby_holders(&self) -> Vec<String> {
        self.peers.iter().map(|p| p.standby_holder()).collect()
    }

    /// The holder name ([`Replicas::standby_holders`]) of the standby whose streams say it is
    /// the node `name` (`None`: no stream of that node has opened on this primary).
    pub fn holder_named(&self, name: &str) -> Option<String> {
        self.peers
            .iter()
            .find(|p| p.standby_name().as_deref() == Some(name))
            .map(|p| p.standby_holder())
    }

    /// The first LSN of `log` the standby holding `holder` has not stored, as its
    /// acknowledgements stand now ([`Replication::standby_stored`]).
    pub fn standby_stored(&self, holder: &str, log: LogId) -> Option<u64> {
        self.peers
            .iter()
            .find(|p| p.standby_holder() == holder)
            .and_then(|p| p.standby_stored(log))
    }

    /// The first LSN of `log` the standby holding `holder` has not acknowledged receiving
    /// ([`Replication::standby_received`]).
    pub fn standby_received(&self, holder: &str, log: LogId) -> Option<u64> {
        self.peers
            .iter()
            .find(|p| p.standby_holder() == holder)
            .and_then(|p| p.standby_received(log))
    }

    pub fn unwatch(&self, log: LogId) {
        for peer in &self.peers {
            peer.unwatch(log);
        }
    }

    pub fn forget(&self, name: &str) {
        for peer in &self.peers {
            peer.forget(name);
        }
    }

    pub fn step_down(&self, why: &str) {
        for peer in &self.peers {
            peer.step_down(why);
        }
    }

    pub fn stop_all(&self) {
        for peer in &self.peers {
            peer.stop_all();
        }
    }

    pub fn appended(&self, log: LogId) {
        for peer in &self.peers {
            peer.appended(log);
        }
    }

    pub fn ship_unsent<W>(&self, pool: &Pool<W>) {
        for peer in &self.peers {
            peer.ship_unsent(pool);
        }
    }

    /// `true`: commits still wait for a standby.
    pub fn take_acks(&self, loop_spins: bool) -> bool {
        let mut waiting = false;
        for peer in &self.peers {
            waiting |= peer.take_acks(loop_spins);
        }
        waiting
    }

    pub fn loop_sleeps(&self) {
        for peer in &self.peers {
            peer.loop_sleeps();
        }
    }

    /// Before `log` is opened: fetches from each standby in turn the records this primary lost
    /// that it holds ([`Replication::catch_up`]). Returns how many came back.
    ///
    /// # Errors
    /// A standby refused, or the copy could not be written.
    pub fn catch_up(
        &self,
        log: &str,
        dir: &std::path::Path,
        type_tag: &str,
        options: stela_wal::WalOptions,
    ) -> Result<u64, SessionEnd> {
        let mut fetched = 0;
        for peer in &self.peers {
            fetched += peer.catch_up(log, dir, type_tag, options.clone())?;
        }
        Ok(fetched)
    }

    /// Calls `waiter` once K standbys hold `lsn` of `log` as `holds` asks (in memory for
    /// `replicated`, synced for `all`). `Ok(true)`: they already do (the waiter is dropped
    /// uncalled). An error: the wait is decided without K of them (a policy answered for the
    /// others, or a fence: in doubt; the waiter is dropped uncalled).
    pub fn when_received(
        &self,
        log: LogId,
        lsn: u64,
        holds: Holds,
        waiter: Waiter,
    ) -> Result<bool, PoolError> {
        let pending = Arc::new(Mutex::new(Pending {
            tally: Tally::new(self.needed, self.peers.len()),
            decided: Arc::new(AtomicBool::new(false)),
            waiter: Some(waiter),
            registering: true,
            decided_now: None,
        }));
        for peer in &self.peers {
            if lock(&*pending).tally.decided() {
                // Decided already (K answered at once): the others need not hold a waiter.
                break;
            }
            let answer: Waiter = {
                let pending = Arc::clone(&pending);
                Box::new(move |outcome| settle(&pending, outcome))
            };
            // With one standby nothing is ever pruned: its wait is the only one.
            let decided = (self.peers.len() > 1).then(|| Arc::clone(&lock(&*pending).decided));
            match peer.when_received(log, lsn, holds, answer, decided) {
                Ok(false) => {}
                Ok(true) => settle(&pending, Ok(())),
                Err(error) => settle(&pending, Err(error)),
            }
        }
        let mut pending = lock(&*pending);
        pending.registering = false;
        match pending.decided_now.take() {
            Some(Ok(())) => Ok(true),
            Some(Err(error)) => Err(error),
            None => Ok(false),
        }
    }

    /// Where each standby stands, for `stela status`: the first standby's view (the fields a
    /// two-node cluster has always shown), with every standby listed and K.
    pub fn status(
        &self,
        end: impl Fn(LogId) -> (u64, Option<(u64, u64, u64)>),
    ) -> stela_proto::ReplicationStatus {
        let mut views: Vec<stela_proto::ReplicationStatus> =
            self.peers.iter().map(|p| p.status(&end)).collect();
        let standbys = views
            .iter()
            .map(|view| stela_proto::StandbyStatus {
                peer: view.peer.clone(),
                connected: !view.logs.is_empty() && view.logs.iter().all(|l| l.connected),
                stalled: view.logs.iter().any(|l| l.stalled),
                logs: view.logs.clone(),
            })
            .collect();
        let mut session_ends = std::collections::BTreeMap::new();
        for view in &views {
            super::ends::add_counts(&mut session_ends, &view.session_ends);
        }
        let mut status = views.swap_remove(0);
        status.standbys = standbys;
        status.session_ends = session_ends;
        status.replicas = self.needed as u32;
        status
    }
}

/// One standby's answer to a commit waiting on several.
fn settle(pending: &Mutex<Pending>, outcome: Result<(), PoolError>) {
    let mut pending = lock(pending);
    let Some(decision) = pending.tally.add(outcome) else {
        return;
    };
    pending.decided.store(true, Ordering::Release);
    if pending.registering {
        pending.decided_now = Some(decision);
        return;
    }
    let waiter = pending.waiter.take();
    drop(pending);
    if let Some(waiter) = waiter {
        waiter(decision);
    }
}
