//! A planned switchover on the primary (`stela cluster switchover`): the primary stops taking
//! appends, waits until the standby it hands over to holds every record it appended, hands the
//! next epoch to that node through the coordinator ([`stela_coord::rules::hand_over`]), and
//! steps down; the node handed the epoch promotes itself as soon as its primary goes quiet
//! ([`crate::cluster::Node`], `take_handover`), without waiting out a suspicion period. With
//! more than two nodes the other standbys follow the new primary's streams as after a failover;
//! one of them down or behind does not hold the switchover up.
//!
//! Invariants:
//! - **Nothing acknowledged is left behind.** The epoch is handed over only once the node
//!   taking it (known by the name its streams' `Position` carries) has acknowledged receiving
//!   every LSN this primary appended (it appends nothing more from the moment it starts), so
//!   the new primary's logs hold every record any client was answered for, at any level,
//!   whichever K standbys acknowledged it: a standby that takes the epoch writes and syncs what
//!   it received before it takes a client, as at a failover. Every other standby's copy is a
//!   prefix of the new primary's (both came from this primary's one stream of each log), so it
//!   continues from the new primary without a cut. (A first version waited for the standbys'
//!   durable acknowledgements; at load 25 that wait took ~400 ms of one switchover, as a
//!   standby syncs on its own schedule. A second one waited for every standby: one down made
//!   every switchover of three nodes time out.)
//! - **A switchover that cannot finish changes nothing**: appends are admitted again and the
//!   primary keeps its epoch if the standbys do not catch up in time or the coordinator
//!   refuses; once the coordinator has recorded the handover, the primary steps down whatever
//!   happens next.

use super::Engine;
use crate::error::{Error, Result};
use std::time::{Duration, Instant};
use stela_coord::{CoordError, Coordinator, Grant};

/// How often the standbys' acknowledgements are looked at while waiting.
const POLL: Duration = Duration::from_millis(1);
/// How long an unreachable coordinator is asked again: a handover whose answer was lost is
/// granted again (the rule is idempotent), so a retry never hands over twice.
const COORDINATOR_RETRIES: Duration = Duration::from_secs(2);

/// Asks `coordinator` to hand `epoch` from `from` to `to`, again while it is unreachable (a
/// witness slow to answer on a loaded machine), for at most [`COORDINATOR_RETRIES`].
fn hand_over(coordinator: &dyn Coordinator, from: &str, epoch: u64, to: &str) -> Result<u64> {
    let deadline = Instant::now() + COORDINATOR_RETRIES;
    loop {
        match coordinator.hand_over(from, epoch, to) {
            Ok(Grant::Granted { epoch }) => return Ok(epoch),
            Ok(Grant::Refused { reason, .. }) => {
                return Err(Error::Switchover(format!(
                    "the coordinator refused: {reason}"
                )))
            }
            Err(CoordError::Unreachable(why)) if Instant::now() < deadline => {
                tracing::warn!(
                    why,
                    "switchover: the coordinator did not answer; asking again"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(error) => return Err(Error::Switchover(error.to_string())),
        }
    }
}

impl Engine {
    /// Hands this primary's epoch to the node named `to` (see the module's comment); returns
    /// the epoch handed over. Blocking (up to `within` for the standbys, then the coordinator).
    ///
    /// # Errors
    /// [`Error::NotPrimary`] on a node that is not the primary; [`Error::Switchover`] when this
    /// daemon has no coordinator or standby, the standbys do not catch up within `within`, or
    /// the coordinator refuses or cannot be reached.
    pub fn switchover(&self, to: &str, within: Duration) -> Result<u64> {
        let node = &self.ha.node;
        let refused = |why: String| Error::Switchover(why);
        let failover = self.config.failover.as_ref().ok_or_else(|| {
            refused("this daemon has no --coordinator: it is not a node of a failover pair".into())
        })?;
        let replication = self
            .ha
            .replication
            .as_ref()
            .ok_or_else(|| refused("this daemon has no standby to hand its epoch to".into()))?;
        if !node.is_primary() {
            return Err(Error::NotPrimary(format!(
                "{} is the {}",
                node.name,
                node.role_name()
            )));
        }
        if to == node.name {
            return Err(refused(format!("{to} is this primary: name a standby")));
        }
        let epoch = node.epoch();
        if !self.pool.hand_over(true) {
            return Err(refused(
                "appends are already refused (power failure, shutdown or another switchover)"
                    .into(),
            ));
        }
        tracing::warn!(
            to,
            epoch,
            "switchover: appends refused; waiting for the standby to hold every record"
        );
        let outcome = self
            .wait_standby_holds_everything(replication, to, within)
            .and_then(|()| {
                // The node's credential for the witness (`--coordinator-token-file`), as at
                // start.
                let token = self
                    .config
                    .coordinator_token_file
                    .as_deref()
                    .map(stela_net::tls::read_client_token)
                    .transpose()
                    .map_err(|e| refused(format!("--coordinator-token-file: {e}")))?;
                let coordinator = stela_coord::connect(
                    &failover.coordinator,
                    &failover.cluster,
                    failover.suspect_after,
                    token,
                )
                .map_err(|e| refused(e.to_string()))?;
                hand_over(coordinator.as_ref(), &node.name, epoch, to)
            });
        match outcome {
            Ok(handed) => {
                debug_assert!(handed > epoch);
                node.step_down(format!("switchover: epoch {handed} handed to {to}"));
                Ok(handed)
            }
            Err(error) => {
                self.pool.hand_over(false);
                tracing::warn!(%error, "switchover abandoned: appends admitted again");
                Err(error)
            }
        }
    }

    /// Waits until the standby named `to` has acknowledged receiving every shipped log up to
    /// the log's last appended LSN.
    fn wait_standby_holds_everything(
        &self,
        replication: &crate::replication::Replicas,
        to: &str,
        within: Duration,
    ) -> Result<()> {
        let deadline = Instant::now() + within;
        loop {
            let behind = match replication.holder_named(to) {
                None => vec![format!(
                    "no standby named {to} has opened a stream on this primary"
                )],
                Some(holder) => self.logs_not_held_by(replication, &holder),
            };
            if behind.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(Error::Switchover(format!(
                    "{to} did not hold every record within {} ms: {}",
                    within.as_millis(),
                    behind.join(", ")
                )));
            }
            std::thread::sleep(POLL);
        }
    }

    /// The logs whose last appended record the standby holding `holder` has not acknowledged
    /// receiving, each with its last LSN.
    fn logs_not_held_by(
        &self,
        replication: &crate::replication::Replicas,
        holder: &str,
    ) -> Vec<String> {
        self.logs
            .all()
            .iter()
            .filter_map(|entry| {
                let (next, _) = self.pool.positions_if_present(entry.id)?;
                if next <= 1 {
                    return None; // an empty log: nothing to hold
                }
                let held = replication
                    .standby_received(holder, entry.id)
                    .is_some_and(|first_missing| first_missing >= next);
                (!held).then(|| format!("{} (LSN {})", entry.name, next - 1))
            })
            .collect()
    }
}
