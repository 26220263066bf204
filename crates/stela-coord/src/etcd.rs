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
//!   goes) so that a pair gone for good leaves no renewal behind.
//!
//! Invariants:
//! - **Liveness by revisions, on this process's clock.** etcd leases count whole seconds; a
//!   failover in well under a second cannot wait for one. A promotion reads `renew`'s mod
//!   revision and grants only once it has seen that same revision for a whole lease of its own
//!   monotonic time (a coordinator instance that just saw a new revision, or has just started,
//!   waits); the grant's transaction compares `renew`'s revision too, so a renewal racing the
//!   grant makes it fail.
//! - **Bounded calls.** Every call gives up after the timeout with
//!   [`CoordError::Unreachable`]: failover unavailable, never a reason to step down.

mod gateway;

use crate::coordinator::{CoordError, Coordinator, Grant, Holder, Renewal};
use crate::rules::{self, Claim};
use gateway::{Compare, Gateway, GatewayError, Put};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long an etcd call may take before etcd counts as unreachable.
const TIMEOUT: Duration = Duration::from_millis(500);
/// The etcd lease on `renew` (seconds), and how often a fresh one is taken.
const LEASE_TTL_SECONDS: i64 = 5;
const LEASE_REFRESH: Duration = Duration::from_secs(2);

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

    fn key(&self, name: &str) -> String {
        format!("/stela/{}/{name}", self.cluster)
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

impl Coordinator for EtcdCoordinator {
    fn renew(&self, node: &str, epoch: u64) -> Result<Renewal, CoordError> {
        let (holder_key, renew_key) = (self.key("holder"), self.key("renew"));
        self.with_state(|gateway, state| {
            // At most two rounds: a transaction that lost a race decides again on fresh state.
            for _ in 0..2 {
                let (claim, revision) = read_claim(gateway, &holder_key)?;
                let (answer, new) = match rules::renew(&claim, node, epoch) {
                    Ok(decided) => decided,
                    Err(why) => return Ok(Err(CoordError::Other(why.to_string()))),
                };
                if matches!(answer, Renewal::Superseded { .. }) {
                    return Ok(Ok(answer));
                }
                let lease = Self::lease_for_renewal(gateway, state)?;
                let mut writes = vec![Put {
                    key: &renew_key,
                    value: format!("{epoch} {node}").into_bytes(),
                    lease,
                }];
                if let Some(new) = &new {
                    writes.push(Put {
                        key: &holder_key,
                        value: encode(new),
                        lease: 0,
                    });
                }
                if gateway.txn(&[Compare::unchanged(&holder_key, revision)], &writes)? {
                    return Ok(Ok(answer));
                }
            }
            Ok(Err(CoordError::Other(
                "the holder key kept changing during the renewal".into(),
            )))
        })?
    }

    fn promote(&self, node: &str, seen_epoch: u64) -> Result<Grant, CoordError> {
        let (holder_key, renew_key) = (self.key("holder"), self.key("renew"));
        let lease = self.lease;
        self.with_state(|gateway, state| {
            let (claim, revision) = read_claim(gateway, &holder_key)?;
            let renewed = renewal_revision(gateway, &renew_key)?;
            // How long `renew` has stood still, as this process saw it.
            let silent = match state.seen_renewal {
                Some((seen, since)) if seen == renewed => since.elapsed(),
                _ => {
                    state.seen_renewal = Some((renewed, Instant::now()));
                    Duration::ZERO
                }
            };
            let (answer, new) = rules::promote(&claim, node, seen_epoch, silent, lease);
            let Some(new) = new else {
                return Ok(answer);
            };
            let compares = [
                Compare::unchanged(&holder_key, revision),
                Compare::unchanged(&renew_key, renewed),
            ];
            let write = Put {
                key: &holder_key,
                value: encode(&new),
                lease: 0,
            };
            if gateway.txn(&compares, &[write])? {
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
        let holder_key = self.key("holder");
        self.with_state(|gateway, _| {
            let (claim, revision) = read_claim(gateway, &holder_key)?;
            let (answer, new) = rules::hand_over(&claim, node, epoch, to);
            let Some(new) = new else {
                return Ok(answer);
            };
            let write = Put {
                key: &holder_key,
                value: encode(&new),
                lease: 0,
            };
            // Decided on `revision`: a renewal that adopted a newer epoch, a grant or another
            // handover in between makes the transaction fail, and nothing is handed over.
            if gateway.txn(&[Compare::unchanged(&holder_key, revision)], &[write])? {
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
        let (holder_key, renew_key) = (self.key("holder"), self.key("renew"));
        let (claim, _) = self.with_state(|gateway, state| {
            // A healthy standby asks now and then: watching `renew` from here on lets a later
            // promotion judge the primary's silence without first waiting a whole lease.
            let renewed = renewal_revision(gateway, &renew_key)?;
            if state.seen_renewal.is_none_or(|(seen, _)| seen != renewed) {
                state.seen_renewal = Some((renewed, Instant::now()));
            }
            read_claim(gateway, &holder_key)
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
}
