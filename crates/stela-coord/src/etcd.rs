//! The coordinator on etcd (`--coordinator etcd://HOST:PORT`), for sites that run etcd already.
//! It follows the witness's rules ([`crate::rules`]) exactly; etcd only keeps the state and
//! makes each change atomic.
//!
//! It speaks to etcd through etcd's JSON gateway (the v3 API as HTTP/1.1 POSTs of JSON under
//! `/v3/`, served on the client port by every etcd since 3.4) with a small blocking HTTP
//! client ([`gateway`]), not through gRPC: the gRPC client needs `protoc` and a whole async
//! stack at build time, and the four calls used here (range, lease grant, transaction with
//! puts) are one request and one answer each.
//!
//! Keys under `/stela/<cluster>/`:
//! - `holder`: the epoch and its holder (JSON), changed only by a transaction that compares its
//!   mod revision with the one the decision was made on, so two nodes can never both change it
//!   from the same state (one holder per epoch); a planned switchover
//!   ([`rules::hand_over`]) is one such transaction;
//! - `renew`: written by every renewal of the holder, in a transaction that also checks
//!   `holder` is unchanged, and attached to an etcd lease (a few seconds, re-granted as it
//!   goes) so that a pair gone for good leaves no renewal behind. Every change of holder (a
//!   grant, a handover, an election won) writes it too, in the same transaction: a new holder
//!   starts its lease then, as at the witness, rather than inheriting its predecessor's
//!   silence;
//! - `ballot`: the election by promises open now (clusters of more than two nodes,
//!   [`rules::ask`], [`rules::promise`]): its epoch, the promises a grant needs and each
//!   promising node's report (JSON). The open epoch itself is `holder` with no holder. Every
//!   promise is one transaction comparing the mod revisions of both `holder` and `ballot` with
//!   those it was decided on, writing the ballot with the promise counted (and `holder` and
//!   `renew` if it decides the election); one that lost a race decides again on fresh state,
//!   so a promise is never lost nor counted twice (promises are keyed by node), and two
//!   coordinator instances can never grant one epoch twice, or to two nodes.
//!
//! Invariants:
//! - **Liveness by revisions, on this process's clock.** etcd leases count whole seconds; a
//!   failover in well under a second cannot wait for one. A promotion reads `renew`'s mod
//!   revision and grants only once it has seen that same revision for a whole lease of its own
//!   monotonic time (a coordinator instance that just saw a new revision, or has just started,
//!   waits); the grant's transaction compares `renew`'s revision too, so a renewal racing the
//!   grant makes it fail.
//!   Opening an election ([`rules::ask`]) is judged the same way and its transaction compares
//!   `renew`'s revision as well.
//!   An ask refused only because that silence is at most a quarter lease short waits out the
//!   rest inside the call and decides again (`nearly_silent`): this process sees a renewal
//!   up to one poll late, and a standby told "alive" waits a whole suspicion period more.
//! - **Bounded calls.** Every etcd request gives up after the timeout with
//!   [`CoordError::Unreachable`]: failover unavailable, never a reason to step down; a call
//!   that keeps losing races decides again at most [`ROUNDS`] times, then says so
//!   ([`CoordError::Other`]) and changes nothing; an ask waits at most a quarter lease more.

mod gateway;

use crate::coordinator::{
    CoordError, Coordinator, Election, Grant, Holder, LogPosition, Renewal, Report,
};
use crate::rules::{self, Ballot, Claim};
use gateway::{Compare, Gateway, GatewayError, Put};
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long an etcd call may take before etcd counts as unreachable.
const TIMEOUT: Duration = Duration::from_millis(500);
/// The etcd lease on `renew` (seconds), and how often a fresh one is taken.
const LEASE_TTL_SECONDS: i64 = 5;
const LEASE_REFRESH: Duration = Duration::from_secs(2);
/// How many times a call decides again after its transaction lost a race.
pub const ROUNDS: usize = 4;

/// A coordinator on an etcd cluster.
pub struct EtcdCoordinator {
    gateway: Gateway,
    cluster: String,
    lease: Duration,
    state: Mutex<State>,
}

struct State {
    /// `renew`'s mod revision as last seen, and since when (this process's clock).
    seen_renewal: Option<(i64, Instant)>,
    /// The etcd lease `renew` is attached to, and when it was granted.
    etcd_lease: Option<(i64, Instant)>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct StoredClaim {
    epoch: u64,
    holder: Option<String>,
}

/// [`Ballot`] as `ballot` holds it.
#[derive(serde::Serialize, serde::Deserialize, Default)]
struct StoredBallot {
    epoch: u64,
    needed: u32,
    promises: BTreeMap<String, StoredReport>,
}

/// [`Report`] as `ballot` holds it: each log as (name, term, last LSN).
#[derive(serde::Serialize, serde::Deserialize)]
struct StoredReport {
    positions: Vec<(String, u64, u64)>,
    prefers_primary: bool,
}

/// The keys of one cluster.
struct Keys {
    holder: String,
    renew: String,
    ballot: String,
}

impl EtcdCoordinator {
    /// A coordinator for the pair `cluster` on the etcd at `endpoint` (`http://HOST:PORT`).
    /// Connects lazily: an unreachable etcd is an error of each call, not of construction.
    ///
    /// # Errors
    /// `endpoint` is not an `http://HOST:PORT` URL.
    pub fn new(endpoint: &str, cluster: &str, lease: Duration) -> Result<Self, CoordError> {
        let gateway = Gateway::new(endpoint, TIMEOUT)
            .map_err(|e| CoordError::Other(format!("etcd endpoint {endpoint:?}: {e}")))?;
        Ok(EtcdCoordinator {
            gateway,
            cluster: cluster.to_owned(),
            lease,
            state: Mutex::new(State {
                seen_renewal: None,
                etcd_lease: None,
            }),
        })
    }

    fn keys(&self) -> Keys {
        let key = |name: &str| format!("/stela/{}/{name}", self.cluster);
        Keys {
            holder: key("holder"),
            renew: key("renew"),
            ballot: key("ballot"),
        }
    }

    /// Runs `work` on this coordinator's state; a failed etcd call is `Unreachable`.
    fn with_state<R>(
        &self,
        work: impl FnOnce(&Gateway, &mut State) -> Result<R, GatewayError>,
    ) -> Result<R, CoordError> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        work(&self.gateway, &mut state).map_err(|error| {
            CoordError::Unreachable(format!("etcd {}: {error}", self.gateway.endpoint()))
        })
    }

    /// The etcd lease to attach `renew` to: the current one while it is fresh, else a new one.
    fn lease_for_renewal(gateway: &Gateway, state: &mut State) -> Result<i64, GatewayError> {
        match state.etcd_lease {
            Some((id, at)) if at.elapsed() < LEASE_REFRESH => Ok(id),
            _ => {
                let id = gateway.lease_grant(LEASE_TTL_SECONDS)?;
                state.etcd_lease = Some((id, Instant::now()));
                Ok(id)
            }
        }
    }

    /// The writes that make `new` the claim: `holder`, and `renew` when the holder changes
    /// (so that the new holder's lease starts now, as at the witness).
    fn claim_writes<'k>(
        gateway: &Gateway,
        state: &mut State,
        keys: &'k Keys,
        old: &Claim,
        new: &Claim,
    ) -> Result<Vec<Put<'k>>, GatewayError> {
        let mut writes = vec![Put {
            key: &keys.holder,
            value: encode(new),
            lease: 0,
        }];
        if let Some(holder) = new.holder.as_deref().filter(|_| new.holder != old.holder) {
            writes.push(Put {
                key: &keys.renew,
                value: format!("{} {holder} granted", new.epoch).into_bytes(),
                lease: Self::lease_for_renewal(gateway, state)?,
            });
        }
        Ok(writes)
    }
}

/// How long `renew` has stood still at `renewed` as this process saw it (zero when it has
/// just changed, or was never looked at before).
fn silence(state: &mut State, renewed: i64) -> Duration {
    match state.seen_renewal {
        Some((seen, since)) if seen == renewed => since.elapsed(),
        _ => {
            state.seen_renewal = Some((renewed, Instant::now()));
            Duration::ZERO
        }
    }
}

/// How much longer `renew` must stand still before an election may open, if `answer` refuses
/// one only because the holder's silence, as this process saw it, is a little short of a
/// lease (at most a quarter of it left). This process sees a renewal up to one poll after it
/// was made, so a standby that suspects its primary a lease after the primary's last
/// stream heartbeat is often just short here; told "alive", it would wait a whole suspicion
/// period more (`stela-bench failover --coordinator etcd` measured about 100 ms more at p50
/// and 300 ms more at p99 than the witness, before this). Waiting the rest keeps the
/// invariant: an election opens only once `renew` has stood still a whole lease of this
/// process's time.
fn nearly_silent(answer: &Election, silent: Duration, lease: Duration) -> Option<Duration> {
    let refused_as_alive = matches!(
        answer,
        Election::Refused {
            holder: Some(_),
            ..
        }
    );
    let left = lease.checked_sub(silent).filter(|left| !left.is_zero())?;
    (refused_as_alive && left <= lease / 4).then_some(left)
}

/// The claim in `holder` and its mod revision (0: no such key). A value that is not a claim
/// reads as no claim, as an absent key does.
fn read_claim(gateway: &Gateway, key: &str) -> Result<(Claim, i64), GatewayError> {
    let Some((value, revision)) = gateway.get(key)? else {
        return Ok((Claim::default(), 0));
    };
    let stored: StoredClaim = serde_json::from_slice(&value).unwrap_or(StoredClaim {
        epoch: 0,
        holder: None,
    });
    Ok((
        Claim {
            epoch: stored.epoch,
            holder: stored.holder,
        },
        revision,
    ))
}

/// The ballot in `ballot` and its mod revision (0: no such key). A value that is not a ballot
/// reads as an empty one: its promises are heard again, as every node promises again each
/// heartbeat while an election is open.
fn read_ballot(gateway: &Gateway, key: &str) -> Result<(Ballot, i64), GatewayError> {
    let Some((value, revision)) = gateway.get(key)? else {
        return Ok((Ballot::default(), 0));
    };
    let stored: StoredBallot = serde_json::from_slice(&value).unwrap_or_default();
    let promises = stored
        .promises
        .into_iter()
        .map(|(node, report)| {
            let positions = report
                .positions
                .into_iter()
                .map(|(log, term, lsn)| LogPosition { log, term, lsn })
                .collect();
            let prefers_primary = report.prefers_primary;
            (
                node,
                Report {
                    positions,
                    prefers_primary,
                },
            )
        })
        .collect();
    let ballot = Ballot {
        epoch: stored.epoch,
        needed: stored.needed,
        promises,
    };
    Ok((ballot, revision))
}

/// `renew`'s mod revision (0: absent).
fn renewal_revision(gateway: &Gateway, key: &str) -> Result<i64, GatewayError> {
    Ok(gateway.get(key)?.map_or(0, |(_, revision)| revision))
}

fn encode(claim: &Claim) -> Vec<u8> {
    serde_json::to_vec(&StoredClaim {
        epoch: claim.epoch,
        holder: claim.holder.clone(),
    })
    .unwrap_or_default()
}

fn encode_ballot(ballot: &Ballot) -> Vec<u8> {
    let promises = ballot
        .promises
        .iter()
        .map(|(node, report)| {
            let positions = report
                .positions
                .iter()
                .map(|p| (p.log.clone(), p.term, p.lsn))
                .collect();
            let prefers_primary = report.prefers_primary;
            let stored = StoredReport {
                positions,
                prefers_primary,
            };
            (node.clone(), stored)
        })
        .collect();
    serde_json::to_vec(&StoredBallot {
        epoch: ballot.epoch,
        needed: ballot.needed,
        promises,
    })
    .unwrap_or_default()
}

/// A call whose transactions lost [`ROUNDS`] races in a row: nothing was changed.
fn contended(what: &str) -> CoordError {
    CoordError::Other(format!(
        "{what} kept changing at etcd ({ROUNDS} transactions lost a race): nothing was changed"
    ))
}

impl Coordinator for EtcdCoordinator {
    fn renew(&self, node: &str, epoch: u64) -> Result<Renewal, CoordError> {
        let keys = self.keys();
        self.with_state(|gateway, state| {
            // A transaction that lost a race decides again on fresh state.
            for _ in 0..ROUNDS {
                let (claim, revision) = read_claim(gateway, &keys.holder)?;
                let (answer, new) = match rules::renew(&claim, node, epoch) {
                    Ok(decided) => decided,
                    Err(why) => return Ok(Err(CoordError::Other(why.to_string()))),
                };
                if matches!(answer, Renewal::Superseded { .. }) {
                    return Ok(Ok(answer));
                }
                let lease = Self::lease_for_renewal(gateway, state)?;
                let mut writes = vec![Put {
                    key: &keys.renew,
                    value: format!("{epoch} {node}").into_bytes(),
                    lease,
                }];
                if let Some(new) = &new {
                    writes.push(Put {
                        key: &keys.holder,
                        value: encode(new),
                        lease: 0,
                    });
                }
                if gateway.txn(&[Compare::unchanged(&keys.holder, revision)], &writes)? {
                    return Ok(Ok(answer));
                }
            }
            Ok(Err(contended("the holder key")))
        })?
    }

    fn promote(&self, node: &str, seen_epoch: u64) -> Result<Grant, CoordError> {
        let keys = self.keys();
        let lease = self.lease;
        self.with_state(|gateway, state| {
            let (claim, revision) = read_claim(gateway, &keys.holder)?;
            let renewed = renewal_revision(gateway, &keys.renew)?;
            let silent = silence(state, renewed);
            let (answer, new) = rules::promote(&claim, node, seen_epoch, silent, lease);
            let Some(new) = new else {
                return Ok(answer);
            };
            let compares = [
                Compare::unchanged(&keys.holder, revision),
                Compare::unchanged(&keys.renew, renewed),
            ];
            let writes = Self::claim_writes(gateway, state, &keys, &claim, &new)?;
            if gateway.txn(&compares, &writes)? {
                Ok(answer)
            } else {
                Ok(Grant::Refused {
                    epoch: claim.epoch,
                    holder: claim.holder,
                    reason: "the primary renewed (or another node was granted) while this grant was being made".into(),
                })
            }
        })
    }

    fn hand_over(&self, node: &str, epoch: u64, to: &str) -> Result<Grant, CoordError> {
        let keys = self.keys();
        self.with_state(|gateway, state| {
            let (claim, revision) = read_claim(gateway, &keys.holder)?;
            let (answer, new) = rules::hand_over(&claim, node, epoch, to);
            let Some(new) = new else {
                return Ok(answer);
            };
            let writes = Self::claim_writes(gateway, state, &keys, &claim, &new)?;
            // Decided on `revision`: a renewal that adopted a newer epoch, a grant or another
            // handover in between makes the transaction fail, and nothing is handed over.
            if gateway.txn(&[Compare::unchanged(&keys.holder, revision)], &writes)? {
                Ok(answer)
            } else {
                Ok(Grant::Refused {
                    epoch: claim.epoch,
                    holder: claim.holder,
                    reason: "the epoch's holder changed while the handover was being recorded"
                        .into(),
                })
            }
        })
    }

    fn current(&self) -> Result<Holder, CoordError> {
        let keys = self.keys();
        let (claim, _) = self.with_state(|gateway, state| {
            // A healthy standby asks now and then: watching `renew` from here on lets a later
            // promotion judge the primary's silence without first waiting a whole lease.
            let renewed = renewal_revision(gateway, &keys.renew)?;
            if state.seen_renewal.is_none_or(|(seen, _)| seen != renewed) {
                state.seen_renewal = Some((renewed, Instant::now()));
            }
            read_claim(gateway, &keys.holder)
        })?;
        Ok(Holder::from(&claim))
    }

    fn describe(&self) -> String {
        format!(
            "etcd {} (cluster {})",
            self.gateway.endpoint(),
            self.cluster
        )
    }

    /// Opens an election for the next epoch once the holder has been silent a whole lease (as
    /// this process saw `renew`), in a transaction that compares `holder` and `renew` with
    /// the revisions it decided on: a renewal or another node's opening in between makes it
    /// fail, and it decides again (then finding the election open, or the primary alive).
    fn ask(&self, node: &str, seen_epoch: u64, needed: u32) -> Result<Election, CoordError> {
        // `needed` is counted with the node's promise, as at the witness.
        let _ = needed;
        let keys = self.keys();
        let lease = self.lease;
        self.with_state(|gateway, state| {
            for _ in 0..ROUNDS {
                let (claim, revision) = read_claim(gateway, &keys.holder)?;
                let renewed = renewal_revision(gateway, &keys.renew)?;
                let silent = silence(state, renewed);
                let (answer, new) = rules::ask(&claim, node, seen_epoch, silent, lease);
                let Some(new) = new else {
                    if let Some(left) = nearly_silent(&answer, silent, lease) {
                        // Seen unchanged for most of a lease: wait out the rest here and
                        // decide again on what etcd holds then.
                        std::thread::sleep(left);
                        continue;
                    }
                    return Ok(Ok(answer));
                };
                debug_assert!(new.holder.is_none() && new.epoch > claim.epoch);
                let compares = [
                    Compare::unchanged(&keys.holder, revision),
                    Compare::unchanged(&keys.renew, renewed),
                ];
                let open = Put {
                    key: &keys.holder,
                    value: encode(&new),
                    lease: 0,
                };
                if gateway.txn(&compares, &[open])? {
                    tracing::warn!(
                        node,
                        epoch = new.epoch,
                        silent_ms = silent.as_millis() as u64,
                        "etcd: the primary is silent; an election by promises is open"
                    );
                    return Ok(Ok(answer));
                }
            }
            Ok(Err(contended("the holder key")))
        })?
    }

    /// Counts `node`'s promise in the ballot and grants the epoch if it decides the election,
    /// in one transaction comparing `holder` and `ballot` with the revisions it decided on; a
    /// race lost decides again on fresh state. A promise that changes nothing (a repeat, or
    /// refused) writes nothing.
    fn promise(
        &self,
        node: &str,
        epoch: u64,
        needed: u32,
        report: &Report,
    ) -> Result<Election, CoordError> {
        let keys = self.keys();
        self.with_state(|gateway, state| {
            for _ in 0..ROUNDS {
                let (claim, claim_revision) = read_claim(gateway, &keys.holder)?;
                let (mut ballot, ballot_revision) = read_ballot(gateway, &keys.ballot)?;
                let before = ballot.clone();
                let (answer, new) =
                    rules::promise(&claim, &mut ballot, node, epoch, needed, report);
                if new.is_none() && ballot == before {
                    return Ok(Ok(answer));
                }
                let mut writes = vec![Put {
                    key: &keys.ballot,
                    value: encode_ballot(&ballot),
                    lease: 0,
                }];
                if let Some(new) = &new {
                    debug_assert!(new.epoch == claim.epoch && claim.holder.is_none());
                    writes.extend(Self::claim_writes(gateway, state, &keys, &claim, new)?);
                }
                let compares = [
                    Compare::unchanged(&keys.holder, claim_revision),
                    Compare::unchanged(&keys.ballot, ballot_revision),
                ];
                if gateway.txn(&compares, &writes)? {
                    if let Some(new) = &new {
                        tracing::warn!(epoch, holder = ?new.holder, promises = ballot.promises.len(),
                            "etcd: granting the epoch to the most up-to-date node that promised it (failover)");
                    }
                    return Ok(Ok(answer));
                }
            }
            Ok(Err(contended("the election")))
        })?
    }
}
