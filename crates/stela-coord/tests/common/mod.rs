//! The scenario every coordinator must pass, so that the witness and etcd fence alike.
#![allow(dead_code)]

use std::time::Duration;
use stela_coord::{Coordinator, Grant, Renewal};

pub const LEASE: Duration = Duration::from_millis(300);

/// The same scenario any coordinator must pass: the witness and etcd run it.
/// `extra`: how much longer than a lease the backend may need to judge the holder silent
/// (etcd watches from the first time it looks).
pub fn fences(coordinator: &dyn Coordinator, extra: Duration) {
    // Bootstrap: the first primary claims epoch 1 by renewing.
    assert_eq!(
        coordinator.renew("a", 1).unwrap(),
        Renewal::Renewed { epoch: 1 }
    );
    let holder = coordinator.current().unwrap();
    assert_eq!((holder.epoch, holder.holder.as_deref()), (1, Some("a")));
    // While a renews, b is refused.
    for _ in 0..6 {
        assert_eq!(
            coordinator.renew("a", 1).unwrap(),
            Renewal::Renewed { epoch: 1 }
        );
        match coordinator.promote("b", 1).unwrap() {
            Grant::Refused { holder, reason, .. } => {
                assert_eq!(holder.as_deref(), Some("a"));
                assert!(reason.contains("alive"), "{reason}");
            }
            other => panic!("granted while the primary renews: {other:?}"),
        }
        std::thread::sleep(LEASE / 6);
    }
    // a stops renewing: after a lease, b gets epoch 2; a stale standby does not.
    std::thread::sleep(LEASE + LEASE / 2);
    // A backend that watches from its first look needs that look, then a lease.
    if !extra.is_zero() {
        let _ = coordinator.promote("b", 1);
        std::thread::sleep(extra);
    }
    assert!(matches!(
        coordinator.promote("c", 0).unwrap(),
        Grant::Refused { .. }
    ));
    assert_eq!(
        coordinator.promote("b", 1).unwrap(),
        Grant::Granted { epoch: 2 }
    );
    // Asked again (the answer was lost): the same epoch.
    assert_eq!(
        coordinator.promote("b", 1).unwrap(),
        Grant::Granted { epoch: 2 }
    );
    // The old primary comes back: superseded, whatever epoch it says.
    for epoch in [1, 2] {
        assert_eq!(
            coordinator.renew("a", epoch).unwrap(),
            Renewal::Superseded {
                epoch: 2,
                holder: "b".into()
            }
        );
    }
    assert_eq!(
        coordinator.renew("b", 2).unwrap(),
        Renewal::Renewed { epoch: 2 }
    );
}

/// A planned switchover ([`stela_coord::rules::hand_over`]): only the holder of the current
/// epoch hands the next one to another node; the handover is granted again if asked again
/// (its answer was lost), the old holder is superseded from then on, and the new holder's
/// promotion is granted at once, without a lease of silence; the node taking it is then alive.
pub fn hands_over(coordinator: &dyn Coordinator) {
    assert_eq!(
        coordinator.renew("a", 1).unwrap(),
        Renewal::Renewed { epoch: 1 }
    );
    for (from, epoch, to) in [("b", 1, "c"), ("a", 2, "b"), ("a", 0, "b"), ("a", 1, "a")] {
        assert!(
            matches!(
                coordinator.hand_over(from, epoch, to).unwrap(),
                Grant::Refused { .. }
            ),
            "{from} handed epoch {epoch} to {to}"
        );
    }
    for _ in 0..2 {
        assert_eq!(
            coordinator.hand_over("a", 1, "b").unwrap(),
            Grant::Granted { epoch: 2 }
        );
    }
    assert_eq!(
        coordinator.renew("a", 1).unwrap(),
        Renewal::Superseded {
            epoch: 2,
            holder: "b".into()
        }
    );
    assert_eq!(
        coordinator.promote("b", 1).unwrap(),
        Grant::Granted { epoch: 2 }
    );
    assert_eq!(
        coordinator.renew("b", 2).unwrap(),
        Renewal::Renewed { epoch: 2 }
    );
    let holder = coordinator.current().unwrap();
    assert_eq!((holder.epoch, holder.holder.as_deref()), (2, Some("b")));
    // The old holder cannot hand over again, nor can the new one hand over an epoch it
    // does not hold.
    assert!(matches!(
        coordinator.hand_over("a", 1, "c").unwrap(),
        Grant::Refused { .. }
    ));
    assert!(matches!(
        coordinator.hand_over("b", 1, "c").unwrap(),
        Grant::Refused { .. }
    ));
    assert!(matches!(
        coordinator.promote("c", 2).unwrap(),
        Grant::Refused { .. }
    ));
}
