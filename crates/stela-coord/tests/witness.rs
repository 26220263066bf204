//! The witness as a node sees it: a real `Witness` on loopback, in a temporary directory,
//! spoken to through `WitnessClient`. Its grants follow the rules over the wire, survive a
//! restart (and a restarted witness waits a lease before it grants), a damaged state file stops
//! it, and a witness that accepts but never answers costs a caller no more than its timeout.

use std::net::TcpListener;
use std::time::{Duration, Instant};
use stela_coord::witness::{Witness, WitnessClient};
use stela_coord::{CoordError, Coordinator, Grant, Renewal};

mod common;
use common::{fences, hands_over, LEASE};

fn client(witness: &Witness) -> WitnessClient {
    WitnessClient::new(witness.addr(), "test", Duration::from_secs(2))
}

#[test]
fn the_witness_grants_only_after_a_silent_lease_and_fences_the_old_primary() {
    let dir = tempfile::tempdir().unwrap();
    let witness = Witness::start("127.0.0.1:0".parse().unwrap(), dir.path(), LEASE).unwrap();
    fences(&client(&witness), Duration::ZERO);
}

#[test]
fn the_witness_hands_an_epoch_over_only_from_its_holder() {
    let dir = tempfile::tempdir().unwrap();
    let witness = Witness::start("127.0.0.1:0".parse().unwrap(), dir.path(), LEASE).unwrap();
    hands_over(&client(&witness));
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

const NODE_TOKEN: &str = "witness-node-token-7d2a9c41e0b5";

/// A witness that serves only nodes with a token of its file (no trusted local user: the
/// tests run as the witness's own user).
fn guarded_witness(dir: &std::path::Path) -> Witness {
    let file = dir.join("tokens");
    stela_testkit::write_secret(&file, format!("{NODE_TOKEN}\n"));
    let auth = stela_coord::witness::WitnessAuth {
        tokens: Some(stela_coord::witness::Tokens::load(&file).unwrap()),
        trust_local_user: false,
        ..Default::default()
    };
    Witness::start_with(
        "127.0.0.1:0".parse().unwrap(),
        &dir.join("state"),
        LEASE,
        auth,
    )
    .unwrap()
}

fn node(witness: &Witness, token: Option<&str>) -> WitnessClient {
    WitnessClient::new(witness.addr(), "test", Duration::from_secs(2))
        .with_token(token.map(str::to_owned))
}

/// Sends `bytes` on a fresh connection and reads until the witness closes it (or 5 s).
fn exchange(witness: &Witness, bytes: &[u8]) -> (Vec<u8>, Duration) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(witness.addr()).unwrap();
    stream.write_all(bytes).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let started = Instant::now();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    (answer, started.elapsed())
}

#[test]
fn an_unauthenticated_peer_is_refused_before_anything_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let witness = guarded_witness(dir.path());
    for (token, why) in [
        (None, "no token"),
        (Some("witness-node-token-7d2a9c41e0b6"), "wrong token"),
    ] {
        let error = node(&witness, token).renew("a", 1).unwrap_err();
        assert!(
            matches!(&error, CoordError::Unreachable(m) if m.contains(why)),
            "{error}"
        );
    }
    // A node of the old protocol (a request without a Hello) is told to upgrade, and nothing
    // it asked is done: the epoch is still unheld.
    let mut renew = Vec::new();
    stela_proto::frame::encode(
        &stela_proto::witness::WitnessRequest::Renew {
            cluster: "test".into(),
            node: "intruder".into(),
            epoch: 1 << 40,
        },
        &mut renew,
    )
    .unwrap();
    let (answer, _) = exchange(&witness, &renew);
    assert!(
        String::from_utf8_lossy(&answer).contains("must be a Hello"),
        "{answer:?}"
    );
    // A header announcing a large first frame is refused at once, before its body is awaited.
    let mut big = Vec::new();
    stela_proto::frame::encode(
        &stela_proto::witness::WitnessRequest::Hello {
            version: stela_proto::witness::WITNESS_VERSION,
            token: Some("x".repeat(4096)),
        },
        &mut big,
    )
    .unwrap();
    let (_, waited) = exchange(&witness, &big[..stela_proto::FRAME_HEADER_BYTES]);
    assert!(
        waited < Duration::from_secs(1),
        "waited {waited:?} for a body it must not read"
    );
    let holder = node(&witness, Some(NODE_TOKEN)).current().unwrap();
    assert_eq!(
        (holder.epoch, holder.holder),
        (0, None),
        "an unauthenticated request was served"
    );
    assert_eq!(
        node(&witness, Some(NODE_TOKEN)).renew("a", 1).unwrap(),
        Renewal::Renewed { epoch: 1 }
    );
}

/// Issue 54 finding 5, at the witness: connections that send nothing, or half a Hello, fill
/// no more than the handshake table, never hold a thread, and do not keep real nodes out.
#[test]
fn a_flood_of_handshakes_while_real_nodes_renew() {
    use std::io::Write;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let witness = guarded_witness(dir.path());
    let threads_before = threads();
    let stop = Arc::new(AtomicBool::new(false));
    let flooded = Arc::new(AtomicUsize::new(0));
    let addr = witness.addr();
    let flooders: Vec<_> = (0..3)
        .map(|kind| {
            let (stop, flooded) = (Arc::clone(&stop), Arc::clone(&flooded));
            std::thread::spawn(move || {
                let mut held = std::collections::VecDeque::new();
                while !stop.load(Ordering::Relaxed) {
                    let Ok(mut stream) = std::net::TcpStream::connect(addr) else {
                        continue;
                    };
                    // Silent; half a header; a header announcing a Hello, and half of it.
                    let _ = match kind {
                        0 => Ok(()),
                        1 => stream.write_all(&[0x53, 0x54]),
                        _ => stream.write_all(&[0u8; 20]),
                    };
                    flooded.fetch_add(1, Ordering::Relaxed);
                    held.push_back(stream);
                    if held.len() > 300 {
                        held.pop_front();
                    }
                }
            })
        })
        .collect();
    let renewing = node(&witness, Some(NODE_TOKEN));
    let started = Instant::now();
    let (mut renewals, mut logins, mut first_try) = (0, 0, 0);
    while started.elapsed() < Duration::from_secs(4) {
        assert_eq!(
            renewing.renew("a", 1).unwrap(),
            Renewal::Renewed { epoch: 1 },
            "a renewal failed during the flood"
        );
        renewals += 1;
        if renewals % 10 == 0 {
            // A node that connects anew (a restarted one) gets through too. Its Hello is
            // read as it is accepted when it came with the connect; one late by a moment (its
            // thread not scheduled yet, on a loaded machine) may be evicted by the flood from
            // its own address, which no witness can tell from it before it speaks, and the
            // node connects again at its next heartbeat (20 ms here): it must get through
            // within half a second.
            let fresh = node(&witness, Some(NODE_TOKEN));
            let attempts = (1..=25)
                .find(|&attempt| {
                    if attempt > 1 {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    fresh
                        .current()
                        .is_ok_and(|h| h.holder.as_deref() == Some("a"))
                })
                .expect("a fresh node got through in none of 25 attempts over half a second");
            logins += 1;
            first_try += u32::from(attempts == 1);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let during = threads();
    stop.store(true, Ordering::Relaxed);
    for flooder in flooders {
        flooder.join().unwrap();
    }
    let flooded = flooded.load(Ordering::Relaxed);
    eprintln!(
        "{flooded} flood connections; {renewals} renewals and {logins} fresh logins served \
         ({first_try} at the first attempt); threads {threads_before} -> {during}"
    );
    assert!(
        flooded > 300,
        "the flood was too small to mean anything: {flooded}"
    );
    // The flood's own 3 threads, the fresh logins' sessions (ended or ending); never a thread
    // per flood connection.
    assert!(
        during < threads_before + 20,
        "threads {threads_before} -> {during} under a flood of {flooded}"
    );
}

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}
