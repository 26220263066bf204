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

use crate::{Grant, Holder, Renewal};
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

/// The answer to `renew(node, epoch)`, and the claim to record first if it changes.
pub fn renew(claim: &Claim, node: &str, epoch: u64) -> Result<(Renewal, Option<Claim>), String> {
    if epoch == 0 {
        return Err("epoch 0 is not an epoch a primary can hold".into());
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
        assert!(renew(&Claim::default(), "a", 0).is_err());
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
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (0u8..3, 0u64..6).prop_map(|(n, e)| Step::Renew(n, e)),
            (0u8..3, 0u64..6, 0u64..600).prop_map(|(n, s, ms)| Step::Promote(n, s, ms)),
        ]
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
}
