//! The coordinator's rules, pure: given what it holds (the epoch and its holder) and how long
//! the holder has been silent, the answer to a renewal or a promotion request and what it must
//! hold afterwards. The witness and the etcd backend both follow them, so they fence alike.
//!
//! Invariants (checked by the property tests below):
//! - the epoch never goes down, and a change of holder always raises it: one holder per epoch;
//! - a renewal of an older epoch, or of the current one by another node, is `Superseded`;
//! - a promotion is granted only to a node that has seen the current epoch, once the holder has
//!   been silent for a whole lease *as this coordinator saw it* (after a restart it waits a lease
//!   first: it cannot know whether the holder renewed just before);
//! - a grant names an epoch the asking node has not seen yet (its `seen` is below it): a node
//!   that recorded an epoch, as its holder or as another's standby, is never handed that epoch
//!   again, so it can never be a second primary of it.
//!
//! Elections by promises (clusters of more than two nodes, [`ask`], [`promise`]):
//! - an election for epoch E is open while the claim is E with no holder; it is opened only
//!   once the holder has been silent a whole lease (or holds nothing), and the old holder's
//!   renewals are `Superseded` from then on;
//! - E is granted only once `needed` (N − K) nodes have promised it, to one of them whose
//!   report covers every other promise's (each log's last term, then last LSN, at least as
//!   high); the preference breaks a tie, and only a tie. If no promising node covers the
//!   others, nothing is granted yet;
//! - a promotion by [`promote`] (the two-node rule) is refused while an election is open.
//!
//! Planned switchover ([`hand_over`]):
//! - only the holder of the current epoch, naming that epoch, may hand the next epoch to
//!   another node, and never while an election is open; the claim becomes (epoch + 1, that
//!   node), so the old holder's renewals are `Superseded` from then on (it steps down), and the
//!   new holder takes the epoch with [`promote`] at once (an epoch recorded for it that it has
//!   not seen is its own), without waiting out a lease: the holder gave the epoch up itself.
//!   The holder hands over only once it has seen the node hold every record it acknowledged;
//!   the coordinator cannot check that, as it cannot check a promotion's either.

use crate::coordinator::{Election, Grant, Holder, Renewal, Report};
use std::collections::BTreeMap;
use std::time::Duration;

/// What the coordinator holds durably.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Claim {
    pub epoch: u64,
    pub holder: Option<String>,
}

impl From<&Claim> for Holder {
    fn from(claim: &Claim) -> Holder {
        Holder {
            epoch: claim.epoch,
            holder: claim.holder.clone(),
        }
    }
}

/// A renewal no coordinator answers: it names no epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("epoch 0 is not an epoch a primary can hold")]
pub struct EpochZero;

/// The answer to `renew(node, epoch)`, and the claim to record first if it changes.
pub fn renew(claim: &Claim, node: &str, epoch: u64) -> Result<(Renewal, Option<Claim>), EpochZero> {
    if epoch == 0 {
        return Err(EpochZero);
    }
    let holds = claim.holder.as_deref() == Some(node);
    if epoch == claim.epoch && holds {
        return Ok((Renewal::Renewed { epoch }, None));
    }
    if epoch > claim.epoch {
        // Nothing held yet, or this coordinator lost (or never saw) a newer epoch: the node's
        // is the newest there is.
        let adopted = Claim {
            epoch,
            holder: Some(node.to_owned()),
        };
        return Ok((Renewal::Renewed { epoch }, Some(adopted)));
    }
    Ok((
        Renewal::Superseded {
            epoch: claim.epoch,
            holder: claim.holder.clone().unwrap_or_default(),
        },
        None,
    ))
}

/// The answer to `promote(node, seen)`. `silent` is how long the holder has not renewed as
/// this coordinator saw it (since its own start if it has seen no renewal), `lease` how long
/// that must be.
pub fn promote(
    claim: &Claim,
    node: &str,
    seen: u64,
    silent: Duration,
    lease: Duration,
) -> (Grant, Option<Claim>) {
    let refuse = |reason: String| {
        (
            Grant::Refused {
                epoch: claim.epoch,
                holder: claim.holder.clone(),
                reason,
            },
            None,
        )
    };
    if claim.holder.as_deref() == Some(node) && seen < claim.epoch {
        // The answer to an earlier grant was lost (the node has not recorded it): it is still
        // this node's.
        return (Grant::Granted { epoch: claim.epoch }, None);
    }
    if claim.holder.is_none() && claim.epoch > 0 {
        return refuse(format!(
            "an election by promises is open for epoch {}: {node} must promise it",
            claim.epoch
        ));
    }
    if claim.holder.as_deref() == Some(node) {
        // The holder asks again having seen its epoch: it is not acting as its primary (it
        // restarted without the coordinator, or followed another node's stream in that epoch
        // under a coordinator that lost its state). It gets a new epoch, which no node has
        // seen, rather than one it might share.
        let epoch = claim.epoch.max(seen) + 1;
        let granted = Claim {
            epoch,
            holder: Some(node.to_owned()),
        };
        return (Grant::Granted { epoch }, Some(granted));
    }
    if seen < claim.epoch {
        return refuse(format!(
            "{node} has seen epoch {seen} only; epoch {} is held by {}: a standby that missed an epoch may lack its records",
            claim.epoch,
            claim.holder.as_deref().unwrap_or("nobody")
        ));
    }
    if claim.holder.is_some() && silent < lease {
        return refuse(format!(
            "the primary {} renewed {} ms ago (lease {} ms): it is alive",
            claim.holder.as_deref().unwrap_or_default(),
            silent.as_millis(),
            lease.as_millis()
        ));
    }
    let epoch = claim.epoch.max(seen) + 1;
    let granted = Claim {
        epoch,
        holder: Some(node.to_owned()),
    };
    (Grant::Granted { epoch }, Some(granted))
}

/// The answer to `hand_over(from, epoch, to)` (a planned switchover, see the module's
/// comment), and the claim to record first if it changes. A repeat of a handover already
/// recorded (its answer was lost) is granted again without a change.
pub fn hand_over(claim: &Claim, from: &str, epoch: u64, to: &str) -> (Grant, Option<Claim>) {
    let refuse = |reason: String| {
        (
            Grant::Refused {
                epoch: claim.epoch,
                holder: claim.holder.clone(),
                reason,
            },
            None,
        )
    };
    let handed = Claim {
        epoch: epoch.saturating_add(1),
        holder: Some(to.to_owned()),
    };
    if *claim == handed && from != to && epoch > 0 {
        return (
            Grant::Granted {
                epoch: handed.epoch,
            },
            None,
        );
    }
    if from == to || to.is_empty() {
        return refuse(format!("{from} cannot hand epoch {epoch} over to {to:?}"));
    }
    if claim.holder.as_deref() != Some(from) || claim.epoch != epoch || epoch == 0 {
        return refuse(format!(
            "{from} does not hold epoch {epoch}: the coordinator is at epoch {} held by {}",
            claim.epoch,
            claim
                .holder
                .as_deref()
                .unwrap_or("nobody (an election is open)")
        ));
    }
    debug_assert!(handed.epoch > claim.epoch && handed.holder != claim.holder);
    (
        Grant::Granted {
            epoch: handed.epoch,
        },
        Some(handed),
    )
}

/// An election by promises in progress. The witness keeps it in memory only: the open epoch
/// itself is in the claim (durable), and after a restart the nodes promise again.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ballot {
    pub epoch: u64,
    /// The most promises any node said a grant needs (N − K).
    pub needed: u32,
    pub promises: BTreeMap<String, Report>,
}

/// The answer to `ask(node, seen, needed)`: a standby that has heard nothing from its primary
/// asks for an election; the claim to record first if one is opened.
pub fn ask(
    claim: &Claim,
    node: &str,
    seen: u64,
    silent: Duration,
    lease: Duration,
) -> (Election, Option<Claim>) {
    if claim.holder.as_deref() == Some(node) && seen < claim.epoch {
        // Granted to it; the answer was lost.
        return (Election::Granted { epoch: claim.epoch }, None);
    }
    if claim.holder.is_none() && claim.epoch > 0 && seen <= claim.epoch {
        // An election is open (a node that has seen a newer epoch than this coordinator
        // knows of gets a newer one below: this one would be below what it has seen).
        return (Election::Prepare { epoch: claim.epoch }, None);
    }
    if let Some(holder) = claim.holder.as_deref().filter(|&h| h != node) {
        if silent < lease {
            return (
                Election::Refused {
                    epoch: claim.epoch,
                    holder: Some(holder.to_owned()),
                    reason: format!(
                        "the primary {holder} renewed {} ms ago (lease {} ms): it is alive",
                        silent.as_millis(),
                        lease.as_millis()
                    ),
                },
                None,
            );
        }
    }
    // The holder is silent, holds nothing, or is this node having seen its own epoch (it
    // restarted and is not acting as its primary): a new epoch no node has seen.
    let epoch = claim.epoch.max(seen) + 1;
    (
        Election::Prepare { epoch },
        Some(Claim {
            epoch,
            holder: None,
        }),
    )
}

/// The answer to `promise(node, epoch, needed, report)`, with the ballot updated, and the
/// claim to record first if the epoch is granted.
pub fn promise(
    claim: &Claim,
    ballot: &mut Ballot,
    node: &str,
    epoch: u64,
    needed: u32,
    report: &Report,
) -> (Election, Option<Claim>) {
    let refused = |reason: String| Election::Refused {
        epoch: claim.epoch,
        holder: claim.holder.clone(),
        reason,
    };
    if epoch != claim.epoch {
        return (
            refused(format!(
                "no election for epoch {epoch} is open (the coordinator is at epoch {})",
                claim.epoch
            )),
            None,
        );
    }
    match claim.holder.as_deref() {
        Some(holder) if holder == node => return (Election::Granted { epoch }, None),
        Some(holder) => {
            return (
                refused(format!(
                    "epoch {epoch} went to {holder}, at least as up to date"
                )),
                None,
            )
        }
        None => {}
    }
    if ballot.epoch != epoch {
        *ballot = Ballot {
            epoch,
            ..Ballot::default()
        };
    }
    ballot.needed = ballot.needed.max(needed).max(1);
    ballot.promises.insert(node.to_owned(), report.clone());
    let heard = ballot.promises.len() as u32;
    let waiting = |reason: String| Election::Waiting {
        epoch,
        heard,
        needed: ballot.needed,
        reason,
    };
    if heard < ballot.needed {
        return (
            waiting(format!("{heard} of {} promises", ballot.needed)),
            None,
        );
    }
    match elect(&ballot.promises) {
        Err(why) => (waiting(why.to_string()), None),
        Ok(winner) => {
            debug_assert!(ballot
                .promises
                .values()
                .all(|other| covers(&ballot.promises[&winner], other)));
            let granted = Claim {
                epoch,
                holder: Some(winner.clone()),
            };
            let answer = if winner == node {
                Election::Granted { epoch }
            } else {
                Election::Refused {
                    epoch,
                    holder: Some(winner.clone()),
                    reason: format!("epoch {epoch} went to {winner}, at least as up to date"),
                }
            };
            (answer, Some(granted))
        }
    }
}

/// The node to grant to among `promises`: one whose report covers every other's; among such
/// (equally up to date) the one that prefers to be primary, then the first by name.
///
/// # Errors
/// No promising node covers every other (each is ahead on a different log).
pub fn elect(promises: &BTreeMap<String, Report>) -> Result<String, NoneCoversAll> {
    promises
        .iter()
        .filter(|(_, report)| promises.values().all(|other| covers(report, other)))
        .max_by_key(|&(name, report)| (report.prefers_primary, std::cmp::Reverse(name)))
        .map(|(name, _)| name.clone())
        .ok_or(NoneCoversAll {
            promising: promises.len(),
        })
}

/// No promising node holds every log as far as each other does: each is ahead on a different
/// log, so the election waits for another node's promise.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("none of the {promising} promising nodes holds every log as far as each other does; waiting for another node's promise")]
pub struct NoneCoversAll {
    /// How many nodes had promised.
    pub promising: usize,
}

/// Whether `a` holds each log at least as far as `b` (the term of its last record, then its
/// last LSN); a log `a` lacks counts as empty.
pub fn covers(a: &Report, b: &Report) -> bool {
    b.positions.iter().all(|theirs| {
        let ours = a
            .positions
            .iter()
            .find(|p| p.log == theirs.log)
            .map_or((0, 0), |p| (p.term, p.lsn));
        ours >= (theirs.term, theirs.lsn)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const LEASE: Duration = Duration::from_millis(300);

    fn held(epoch: u64, holder: &str) -> Claim {
        Claim {
            epoch,
            holder: Some(holder.into()),
        }
    }

    #[test]
    fn the_first_renewal_claims_and_the_holder_keeps_renewing() {
        let (answer, new) = renew(&Claim::default(), "a", 1).unwrap();
        assert_eq!(answer, Renewal::Renewed { epoch: 1 });
        assert_eq!(new, Some(held(1, "a")));
        assert_eq!(
            renew(&held(1, "a"), "a", 1).unwrap(),
            (Renewal::Renewed { epoch: 1 }, None)
        );
        assert_eq!(renew(&Claim::default(), "a", 0), Err(EpochZero));
    }

    #[test]
    fn an_old_or_foreign_renewal_is_superseded() {
        let superseded = Renewal::Superseded {
            epoch: 2,
            holder: "b".into(),
        };
        assert_eq!(
            renew(&held(2, "b"), "a", 1).unwrap(),
            (superseded.clone(), None)
        );
        assert_eq!(renew(&held(2, "b"), "a", 2).unwrap(), (superseded, None));
    }

    #[test]
    fn a_promotion_waits_for_a_silent_lease_and_a_current_standby() {
        let claim = held(1, "a");
        assert!(matches!(
            promote(&claim, "b", 1, LEASE / 2, LEASE),
            (Grant::Refused { .. }, None)
        ));
        assert!(matches!(
            promote(&claim, "b", 0, LEASE * 2, LEASE),
            (Grant::Refused { .. }, None)
        ));
        assert_eq!(
            promote(&claim, "b", 1, LEASE, LEASE),
            (Grant::Granted { epoch: 2 }, Some(held(2, "b")))
        );
        // Asked again after the grant (the answer was lost): the same epoch.
        assert_eq!(
            promote(&held(2, "b"), "b", 1, Duration::ZERO, LEASE),
            (Grant::Granted { epoch: 2 }, None)
        );
        // Asked again by the holder once it has seen its epoch (restarted as a standby): a
        // new epoch, never one it has seen.
        assert_eq!(
            promote(&held(2, "b"), "b", 2, Duration::ZERO, LEASE),
            (Grant::Granted { epoch: 3 }, Some(held(3, "b")))
        );
        // Nothing held: the first promotion bootstraps epoch 1.
        assert_eq!(
            promote(&Claim::default(), "b", 0, Duration::ZERO, LEASE),
            (Grant::Granted { epoch: 1 }, Some(held(1, "b")))
        );
    }

    #[derive(Debug, Clone)]
    enum Step {
        Renew(u8, u64),
        Promote(u8, u64, u64),
        HandOver(u8, u64, u8),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (0u8..3, 0u64..6).prop_map(|(n, e)| Step::Renew(n, e)),
            (0u8..3, 0u64..6, 0u64..600).prop_map(|(n, s, ms)| Step::Promote(n, s, ms)),
            (0u8..3, 0u64..6, 0u8..3).prop_map(|(f, e, t)| Step::HandOver(f, e, t)),
        ]
    }

    #[test]
    fn a_handover_goes_from_the_holder_to_another_node_at_the_next_epoch() {
        let claim = held(3, "a");
        assert_eq!(
            hand_over(&claim, "a", 3, "b"),
            (Grant::Granted { epoch: 4 }, Some(held(4, "b")))
        );
        // The answer was lost: asked again, granted again, nothing changes.
        assert_eq!(
            hand_over(&held(4, "b"), "a", 3, "b"),
            (Grant::Granted { epoch: 4 }, None)
        );
        // The old holder is superseded; the new one takes its epoch at once, lease or not.
        assert!(matches!(
            renew(&held(4, "b"), "a", 3),
            Ok((Renewal::Superseded { epoch: 4, .. }, None))
        ));
        assert_eq!(
            promote(&held(4, "b"), "b", 3, Duration::ZERO, LEASE),
            (Grant::Granted { epoch: 4 }, None)
        );
        for (from, epoch, to) in [("b", 3, "c"), ("a", 2, "b"), ("a", 3, "a"), ("a", 3, "")] {
            assert!(
                matches!(
                    hand_over(&claim, from, epoch, to),
                    (Grant::Refused { .. }, None)
                ),
                "{from} at {epoch} to {to:?}"
            );
        }
        let open = Claim {
            epoch: 4,
            holder: None,
        };
        assert!(matches!(
            hand_over(&open, "a", 4, "b"),
            (Grant::Refused { .. }, None)
        ));
    }

    proptest! {
        /// Over any run of requests: the epoch never goes down, a change of holder raises it,
        /// a grant is always above every earlier epoch, and no two nodes are ever answered as
        /// holders of the same epoch.
        #[test]
        fn one_holder_per_epoch(steps in proptest::collection::vec(step(), 1..40)) {
            let mut claim = Claim::default();
            let mut holders: std::collections::HashMap<u64, String> = Default::default();
            for step in steps {
                let before = claim.clone();
                let (answered, new) = match &step {
                    Step::Renew(n, e) => match renew(&claim, &format!("n{n}"), *e) {
                        Err(_) => continue,
                        Ok((Renewal::Renewed { epoch }, new)) => (Some((epoch, format!("n{n}"))), new),
                        Ok((Renewal::Superseded { epoch, .. }, new)) => {
                            let node = format!("n{n}");
                            let other_holder = before.holder.as_deref() != Some(node.as_str());
                            prop_assert!(*e < epoch || (*e == epoch && other_holder));
                            (None, new)
                        }
                    },
                    Step::HandOver(f, e, t) => {
                        let (from, to) = (format!("n{f}"), format!("n{t}"));
                        match hand_over(&claim, &from, *e, &to) {
                            (Grant::Granted { epoch }, new) => {
                                prop_assert_ne!(&from, &to);
                                prop_assert_eq!(epoch, *e + 1);
                                if new.is_some() {
                                    prop_assert_eq!(before.holder.as_deref(), Some(from.as_str()));
                                    prop_assert_eq!(before.epoch, *e);
                                }
                                (Some((epoch, to)), new)
                            }
                            (Grant::Refused { .. }, new) => { prop_assert!(new.is_none()); (None, new) }
                        }
                    }
                    Step::Promote(n, s, ms) => {
                        match promote(&claim, &format!("n{n}"), *s, Duration::from_millis(*ms), LEASE) {
                            (Grant::Granted { epoch }, new) => {
                                prop_assert!(epoch >= before.epoch);
                                prop_assert!(epoch > *s, "granted epoch {} to a node that has seen {}", epoch, s);
                                if new.is_some() { prop_assert!(epoch > before.epoch); }
                                (Some((epoch, format!("n{n}"))), new)
                            }
                            (Grant::Refused { .. }, new) => { prop_assert!(new.is_none()); (None, new) }
                        }
                    }
                };
                if let Some(new) = new {
                    prop_assert!(new.epoch > before.epoch || (new.epoch == before.epoch && before.holder.is_none()));
                    claim = new;
                }
                prop_assert!(claim.epoch >= before.epoch);
                if let Some((epoch, node)) = answered {
                    let previous = holders.entry(epoch).or_insert_with(|| node.clone());
                    prop_assert_eq!(&*previous, &node, "two holders of epoch {}", epoch);
                }
            }
        }
    }

    fn report(logs: &[(&str, u64, u64)], prefers: bool) -> Report {
        Report {
            positions: logs
                .iter()
                .map(|&(log, term, lsn)| crate::coordinator::LogPosition {
                    log: log.into(),
                    term,
                    lsn,
                })
                .collect(),
            prefers_primary: prefers,
        }
    }

    #[test]
    fn an_election_waits_for_enough_promises_and_picks_the_most_up_to_date() {
        let claim = held(1, "a");
        // The primary is alive: no election.
        assert!(matches!(
            ask(&claim, "b", 1, LEASE / 2, LEASE),
            (Election::Refused { .. }, None)
        ));
        let (answer, opened) = ask(&claim, "c", 1, LEASE, LEASE);
        assert_eq!(answer, Election::Prepare { epoch: 2 });
        let claim = opened.unwrap();
        assert_eq!(
            claim,
            Claim {
                epoch: 2,
                holder: None
            }
        );
        // An old-style promotion is refused while it is open.
        assert!(matches!(
            promote(&claim, "c", 2, LEASE, LEASE),
            (Grant::Refused { .. }, None)
        ));
        // The behind standby promises first, preferring to be primary: not enough promises.
        let mut ballot = Ballot::default();
        let behind = report(&[("x", 1 << 32 | 1, 90)], true);
        let ahead = report(&[("x", 1 << 32 | 1, 100)], false);
        assert!(matches!(
            promise(&claim, &mut ballot, "c", 2, 2, &behind),
            (
                Election::Waiting {
                    heard: 1,
                    needed: 2,
                    ..
                },
                None
            )
        ));
        // The up-to-date one promises: granted to it, not to the one that asked first.
        let (answer, granted) = promise(&claim, &mut ballot, "b", 2, 2, &ahead);
        assert_eq!(answer, Election::Granted { epoch: 2 });
        let claim = granted.unwrap();
        assert_eq!(claim, held(2, "b"));
        assert!(matches!(
            promise(&claim, &mut ballot, "c", 2, 2, &behind),
            (Election::Refused { holder: Some(ref h), .. }, None) if h == "b"
        ));
        // Nobody covers the other (ahead on different logs): no grant yet.
        let mut ballot = Ballot::default();
        let open = Claim {
            epoch: 3,
            holder: None,
        };
        let one = report(&[("x", 5, 10), ("y", 5, 3)], false);
        let two = report(&[("x", 5, 8), ("y", 5, 4)], false);
        promise(&open, &mut ballot, "b", 3, 2, &one);
        assert!(matches!(
            promise(&open, &mut ballot, "c", 3, 2, &two),
            (Election::Waiting { .. }, None)
        ));
        // A tie goes to the preferred node.
        let mut ballot = Ballot::default();
        promise(
            &open,
            &mut ballot,
            "b",
            3,
            2,
            &report(&[("x", 5, 10)], false),
        );
        let (answer, _) = promise(
            &open,
            &mut ballot,
            "c",
            3,
            2,
            &report(&[("x", 5, 10)], true),
        );
        assert_eq!(answer, Election::Granted { epoch: 3 });
    }

    #[derive(Debug, Clone)]
    enum Vote {
        Ask(u8, u64, u64),
        Promise(u8, u64, u64, u64),
        Renew(u8, u64),
    }

    fn vote() -> impl Strategy<Value = Vote> {
        prop_oneof![
            (0u8..3, 0u64..5, 0u64..600).prop_map(|(n, s, ms)| Vote::Ask(n, s, ms)),
            (0u8..3, 0u64..5, 0u64..4, 0u64..20).prop_map(|(n, e, t, l)| Vote::Promise(n, e, t, l)),
            (0u8..3, 0u64..5).prop_map(|(n, e)| Vote::Renew(n, e)),
        ]
    }

    proptest! {
        /// Over any run of asks, promises and renewals: one holder per epoch; an epoch is
        /// granted only to a node that promised it, once `needed` promised, and the winner's
        /// report covers every promise counted for that epoch.
        #[test]
        fn elections_grant_once_to_a_covering_promiser(votes in proptest::collection::vec(vote(), 1..60)) {
            const NEEDED: u32 = 2;
            let mut claim = Claim::default();
            let mut ballot = Ballot::default();
            let mut promised: BTreeMap<u64, BTreeMap<String, Report>> = BTreeMap::new();
            let mut holders: BTreeMap<u64, String> = BTreeMap::new();
            for vote in votes {
                let before = claim.clone();
                let (granted_to, new) = match &vote {
                    Vote::Ask(n, seen, ms) => {
                        let (answer, new) = ask(&claim, &format!("n{n}"), *seen, Duration::from_millis(*ms), LEASE);
                        if let Election::Prepare { epoch } = answer {
                            prop_assert!(epoch >= *seen && epoch > 0, "prepared epoch {} below seen {}", epoch, seen);
                        }
                        let to = matches!(answer, Election::Granted { .. }).then(|| format!("n{n}"));
                        (to, new)
                    }
                    Vote::Promise(n, epoch, term, lsn) => {
                        let node = format!("n{n}");
                        let r = report(&[("x", *term, *lsn)], *n == 0);
                        let (answer, new) = promise(&claim, &mut ballot, &node, *epoch, NEEDED, &r);
                        if *epoch == before.epoch && before.holder.is_none() {
                            promised.entry(*epoch).or_default().insert(node.clone(), r);
                        }
                        let to = matches!(answer, Election::Granted { .. }).then_some(node);
                        (to, new)
                    }
                    Vote::Renew(n, e) => match renew(&claim, &format!("n{n}"), *e) {
                        Ok((_, new)) => (None, new),
                        Err(_) => (None, None),
                    },
                };
                if let Some(new) = new {
                    prop_assert!(new.epoch > before.epoch || (new.epoch == before.epoch && before.holder.is_none()));
                    if let (Some(winner), Vote::Promise(..)) = (&new.holder, &vote) {
                        let counted = &promised[&new.epoch];
                        prop_assert!(counted.len() as u32 >= NEEDED);
                        prop_assert!(counted.contains_key(winner), "granted to {} which did not promise", winner);
                        for other in counted.values() {
                            prop_assert!(covers(&counted[winner], other));
                        }
                    }
                    claim = new;
                }
                prop_assert!(claim.epoch >= before.epoch);
                if let Some(holder) = &claim.holder {
                    let first = holders.entry(claim.epoch).or_insert_with(|| holder.clone());
                    prop_assert_eq!(&*first, holder, "two holders of epoch {}", claim.epoch);
                }
                if let Some(node) = granted_to {
                    prop_assert_eq!(claim.holder.as_deref(), Some(node.as_str()));
                }
            }
        }
    }
}
