//! The etcd backend against a real etcd (Debian's `etcd-server`, started here on free loopback
//! ports in a temporary directory): the same fencing scenario the witness passes, so the two
//! grant and fence alike; an etcd that is gone costs a caller its timeout and says
//! `Unreachable` (failover unavailable), and two coordinators racing for one grant never both
//! get it. Without the `etcd` binary the test fails saying what to install.

use std::time::{Duration, Instant};
use stela_coord::etcd::EtcdCoordinator;
use stela_coord::{CoordError, Coordinator, Grant, Renewal};

mod common;
use common::{fences, hands_over, LEASE};

/// A real etcd, answering.
fn etcd() -> stela_testkit::Etcd {
    let etcd = stela_testkit::Etcd::start();
    let probe = EtcdCoordinator::new(&etcd.client_url, "probe", LEASE).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while probe.current().is_err() {
        assert!(Instant::now() < deadline, "etcd did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    etcd
}

#[test]
fn etcd_grants_and_fences_as_the_witness_does() {
    let etcd = etcd();
    let coordinator = EtcdCoordinator::new(&etcd.client_url, "pair", LEASE).unwrap();
    fences(&coordinator, LEASE + LEASE / 2);
    // Through the URL the daemon is given.
    let by_url = stela_coord::connect(&etcd.coordinator_url(), "pair", LEASE, None).unwrap();
    assert_eq!(by_url.current().unwrap().epoch, 2);
    assert!(by_url.describe().contains("etcd"));
}

#[test]
fn etcd_hands_an_epoch_over_as_the_witness_does() {
    let etcd = etcd();
    let coordinator = EtcdCoordinator::new(&etcd.client_url, "handover", LEASE).unwrap();
    hands_over(&coordinator);
    // Another coordinator instance (the new primary's own) sees the handover at once.
    let other = EtcdCoordinator::new(&etcd.client_url, "handover", LEASE).unwrap();
    assert_eq!(other.promote("b", 1).unwrap(), Grant::Granted { epoch: 2 });
}

#[test]
fn two_standbys_racing_for_one_grant_never_both_get_it() {
    let etcd = etcd();
    let primary = EtcdCoordinator::new(&etcd.client_url, "race", LEASE).unwrap();
    assert_eq!(
        primary.renew("a", 1).unwrap(),
        Renewal::Renewed { epoch: 1 }
    );
    let (b, c) = (
        EtcdCoordinator::new(&etcd.client_url, "race", LEASE).unwrap(),
        EtcdCoordinator::new(&etcd.client_url, "race", LEASE).unwrap(),
    );
    // Both start watching, then wait out the lease with the primary silent.
    let _ = (b.current(), c.current());
    std::thread::sleep(LEASE * 2);
    let (granted_b, granted_c) = std::thread::scope(|s| {
        let b = s.spawn(|| b.promote("b", 1).unwrap());
        let c = s.spawn(|| c.promote("c", 1).unwrap());
        (b.join().unwrap(), c.join().unwrap())
    });
    let granted: Vec<_> = [granted_b, granted_c]
        .into_iter()
        .filter(|g| matches!(g, Grant::Granted { .. }))
        .collect();
    assert_eq!(granted.len(), 1, "exactly one grant: {granted:?}");
    assert_eq!(granted[0], Grant::Granted { epoch: 2 });
}

#[test]
fn a_lost_etcd_is_unreachable_not_a_step_down() {
    let etcd = etcd();
    let coordinator = EtcdCoordinator::new(&etcd.client_url, "gone", LEASE).unwrap();
    assert_eq!(
        coordinator.renew("a", 1).unwrap(),
        Renewal::Renewed { epoch: 1 }
    );
    drop(etcd);
    let started = Instant::now();
    let error = coordinator.renew("a", 1).unwrap_err();
    assert!(matches!(error, CoordError::Unreachable(_)), "{error}");
    assert!(started.elapsed() < Duration::from_secs(10));
}
