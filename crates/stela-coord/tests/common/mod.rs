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
