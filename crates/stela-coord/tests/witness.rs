//! The witness as a node sees it: a real `Witness` on loopback, in a temporary directory,
//! spoken to through `WitnessClient`. Its grants follow the rules over the wire, survive a
//! restart (and a restarted witness waits a lease before it grants), a damaged state file stops
//! it, and a witness that accepts but never answers costs a caller no more than its timeout.

use std::net::TcpListener;
use std::time::{Duration, Instant};
use stela_coord::witness::{Witness, WitnessClient};
use stela_coord::{CoordError, Coordinator, Grant, Renewal};

const LEASE: Duration = Duration::from_millis(300);

fn client(witness: &Witness) -> WitnessClient {
    WitnessClient::new(witness.addr(), "test", Duration::from_secs(2))
}

/// The same scenario any coordinator must pass (the etcd backend runs it too, when built).
fn fences(coordinator: &dyn Coordinator) {
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

#[test]
fn the_witness_grants_only_after_a_silent_lease_and_fences_the_old_primary() {
    let dir = tempfile::tempdir().unwrap();
    let witness = Witness::start("127.0.0.1:0".parse().unwrap(), dir.path(), LEASE).unwrap();
    fences(&client(&witness));
}

#[test]
fn a_restarted_witness_keeps_its_epoch_and_waits_a_lease_before_granting() {
    let dir = tempfile::tempdir().unwrap();
    let witness = Witness::start("127.0.0.1:0".parse().unwrap(), dir.path(), LEASE).unwrap();
    let c = client(&witness);
    c.renew("a", 1).unwrap();
    std::thread::sleep(LEASE * 2);
    assert_eq!(c.promote("b", 1).unwrap(), Grant::Granted { epoch: 2 });
    drop(c);
    drop(witness);
    let witness = Witness::start("127.0.0.1:0".parse().unwrap(), dir.path(), LEASE).unwrap();
    let c = client(&witness);
    let holder = c.current().unwrap();
    assert_eq!((holder.epoch, holder.holder.as_deref()), (2, Some("b")));
    // Just restarted, it cannot know whether b renewed a moment ago.
    assert!(matches!(c.promote("a", 2).unwrap(), Grant::Refused { .. }));
    std::thread::sleep(LEASE + LEASE / 2);
    assert_eq!(c.promote("a", 2).unwrap(), Grant::Granted { epoch: 3 });
}

#[test]
fn a_damaged_state_file_stops_the_witness() {
    let dir = tempfile::tempdir().unwrap();
    {
        let witness = Witness::start("127.0.0.1:0".parse().unwrap(), dir.path(), LEASE).unwrap();
        client(&witness).renew("a", 4).unwrap();
    }
    let path = dir.path().join("WITNESS");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[0] ^= 0x40;
    std::fs::write(&path, bytes).unwrap();
    let error = Witness::start("127.0.0.1:0".parse().unwrap(), dir.path(), LEASE)
        .err()
        .expect("a damaged file is refused");
    let text = error.to_string();
    assert!(
        text.contains("WITNESS") && text.contains("damaged"),
        "{text}"
    );
}

#[test]
fn a_silent_witness_costs_a_caller_its_timeout_only() {
    // Accepts connections (the kernel's backlog does), never answers: a stopped process.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = WitnessClient::new(
        silent.local_addr().unwrap(),
        "test",
        Duration::from_millis(150),
    );
    let started = Instant::now();
    let error = c.renew("a", 1).unwrap_err();
    assert!(matches!(error, CoordError::Unreachable(_)), "{error}");
    // Generous: the bound is the timeout, not a performance figure.
    assert!(started.elapsed() < Duration::from_secs(5));
    // Nothing listens at all.
    drop(silent);
    assert!(matches!(c.current(), Err(CoordError::Unreachable(_))));
}

#[test]
fn garbage_closes_one_connection_and_the_witness_serves_on() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let witness = Witness::start("127.0.0.1:0".parse().unwrap(), dir.path(), LEASE).unwrap();
    for garbage in [
        &b"\xff\xff\xff\xff\xff\xff\xff\xff"[..],
        b"GET / HTTP/1.0\r\n\r\n",
        b"\x00",
    ] {
        let mut stream = std::net::TcpStream::connect(witness.addr()).unwrap();
        stream.write_all(garbage).unwrap();
        let _ = stream.shutdown(std::net::Shutdown::Write);
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut rest = Vec::new();
        let _ = stream.read_to_end(&mut rest);
    }
    assert_eq!(
        client(&witness).renew("a", 1).unwrap(),
        Renewal::Renewed { epoch: 1 }
    );
}
