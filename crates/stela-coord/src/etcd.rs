//! The coordinator on etcd (`--coordinator etcd://HOST:PORT`), for sites that run etcd already.
//! It follows the witness's rules ([`crate::rules`]) exactly; etcd only keeps the state and
//! makes each change atomic.
//!
//! Keys under `/stela/<cluster>/`:
//! - `holder`: the epoch and its holder (JSON), changed only by a transaction that compares its
//!   mod revision with the one the decision was made on, so two nodes can never both change it
//!   from the same state (one holder per epoch);
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

use crate::rules::{self, Claim};
use crate::{CoordError, Coordinator, Grant, Holder, Renewal};
use etcd_client::{Client, Compare, CompareOp, ConnectOptions, PutOptions, Txn, TxnOp};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long an etcd call may take before etcd counts as unreachable.
const TIMEOUT: Duration = Duration::from_millis(500);
/// The etcd lease on `renew` (seconds), and how often a fresh one is taken.
const LEASE_TTL_SECONDS: i64 = 5;
const LEASE_REFRESH: Duration = Duration::from_secs(2);

/// A coordinator on an etcd cluster.
pub struct EtcdCoordinator {
    endpoint: String,
    cluster: String,
    lease: Duration,
    runtime: tokio::runtime::Runtime,
    state: Mutex<State>,
}

struct State {
    client: Option<Client>,
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
    /// The private runtime cannot be built.
    pub fn new(endpoint: &str, cluster: &str, lease: Duration) -> Result<Self, CoordError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| CoordError::Other(format!("starting the etcd client's runtime: {e}")))?;
        Ok(EtcdCoordinator {
            endpoint: endpoint.to_owned(),
            cluster: cluster.to_owned(),
            lease,
            runtime,
            state: Mutex::new(State {
                client: None,
                seen_renewal: None,
                etcd_lease: None,
            }),
        })
    }

    fn key(&self, name: &str) -> String {
        format!("/stela/{}/{name}", self.cluster)
    }

    /// Runs `work` with a connected client, bounded by the timeout; a failure drops the client
    /// so that the next call connects again.
    fn with_client<R>(
        &self,
        work: impl AsyncFnOnce(&mut Client, &mut State) -> Result<R, etcd_client::Error>,
    ) -> Result<R, CoordError> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let unreachable =
            |why: String| CoordError::Unreachable(format!("etcd {}: {why}", self.endpoint));
        let result = self.runtime.block_on(async {
            tokio::time::timeout(TIMEOUT, async {
                let mut client = match state.client.take() {
                    Some(client) => client,
                    None => {
                        Client::connect(
                            [self.endpoint.as_str()],
                            Some(
                                ConnectOptions::new()
                                    .with_connect_timeout(TIMEOUT)
                                    .with_timeout(TIMEOUT),
                            ),
                        )
                        .await?
                    }
                };
                let result = work(&mut client, &mut state).await;
                if result.is_ok() {
                    state.client = Some(client);
                }
                result
            })
            .await
        });
        match result {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => Err(unreachable(error.to_string())),
            Err(_) => Err(unreachable(format!("no answer within {TIMEOUT:?}"))),
        }
    }
}

/// The claim in `holder` and its mod revision (0: no such key).
async fn read_claim(client: &mut Client, key: &str) -> Result<(Claim, i64), etcd_client::Error> {
    let response = client.get(key, None).await?;
    let Some(kv) = response.kvs().first() else {
        return Ok((Claim::default(), 0));
    };
    let stored: StoredClaim = serde_json::from_slice(kv.value()).unwrap_or(StoredClaim {
        epoch: 0,
        holder: None,
    });
    Ok((
        Claim {
            epoch: stored.epoch,
            holder: stored.holder,
        },
        kv.mod_revision(),
    ))
}

/// `key` is as it was at `revision` (0: absent).
fn unchanged(key: &str, revision: i64) -> Compare {
    if revision == 0 {
        Compare::version(key, CompareOp::Equal, 0)
    } else {
        Compare::mod_revision(key, CompareOp::Equal, revision)
    }
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
        let outcome = self.with_client(async |client, state| {
            // At most two rounds: a transaction that lost a race decides again on fresh state.
            for _ in 0..2 {
                let (claim, revision) = read_claim(client, &holder_key).await?;
                let (answer, new) = match rules::renew(&claim, node, epoch) {
                    Ok(decided) => decided,
                    Err(why) => return Ok(Err(CoordError::Other(why))),
                };
                if matches!(answer, Renewal::Superseded { .. }) {
                    return Ok(Ok(answer));
                }
                let lease = match state.etcd_lease {
                    Some((id, at)) if at.elapsed() < LEASE_REFRESH => id,
                    _ => {
                        let id = client.lease_grant(LEASE_TTL_SECONDS, None).await?.id();
                        state.etcd_lease = Some((id, Instant::now()));
                        id
                    }
                };
                let mut writes = vec![TxnOp::put(
                    renew_key.as_str(),
                    format!("{epoch} {node}"),
                    Some(PutOptions::new().with_lease(lease)),
                )];
                if let Some(new) = &new {
                    writes.push(TxnOp::put(holder_key.as_str(), encode(new), None));
                }
                let txn = Txn::new()
                    .when([unchanged(&holder_key, revision)])
                    .and_then(writes);
                if client.txn(txn).await?.succeeded() {
                    return Ok(Ok(answer));
                }
            }
            Ok(Err(CoordError::Other(
                "the holder key kept changing during the renewal".into(),
            )))
        })?;
        outcome
    }

    fn promote(&self, node: &str, seen_epoch: u64) -> Result<Grant, CoordError> {
        let (holder_key, renew_key) = (self.key("holder"), self.key("renew"));
        let lease = self.lease;
        self.with_client(async |client, state| {
            let (claim, revision) = read_claim(client, &holder_key).await?;
            let renewed = client
                .get(renew_key.as_str(), None)
                .await?
                .kvs()
                .first()
                .map_or(0, |kv| kv.mod_revision());
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
            let txn = Txn::new()
                .when([unchanged(&holder_key, revision), unchanged(&renew_key, renewed)])
                .and_then([TxnOp::put(holder_key.as_str(), encode(&new), None)]);
            if client.txn(txn).await?.succeeded() {
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

    fn current(&self) -> Result<Holder, CoordError> {
        let (holder_key, renew_key) = (self.key("holder"), self.key("renew"));
        let (claim, _) = self.with_client(async |client, state| {
            // A healthy standby asks now and then: watching `renew` from here on lets a later
            // promotion judge the primary's silence without first waiting a whole lease.
            let renewed = client
                .get(renew_key.as_str(), None)
                .await?
                .kvs()
                .first()
                .map_or(0, |kv| kv.mod_revision());
            if state.seen_renewal.is_none_or(|(seen, _)| seen != renewed) {
                state.seen_renewal = Some((renewed, Instant::now()));
            }
            read_claim(client, &holder_key).await
        })?;
        Ok(Holder::from(&claim))
    }

    fn describe(&self) -> String {
        format!("etcd {} (cluster {})", self.endpoint, self.cluster)
    }
}
