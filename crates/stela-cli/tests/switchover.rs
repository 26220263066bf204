//! `stela cluster list` and `stela cluster switchover` with real processes on loopback: a
//! `stela witness` and two `stela serve` nodes, a client committing at `replicated` to both
//! endpoints throughout. The switchover hands epoch 2 to the standby, which takes it through
//! the handover (not a suspicion period: the nodes suspect only after 5 s), the old primary
//! exits 75 and, started again, rejoins as the standby; no commit is left in doubt, and the new
//! primary's log holds every record acknowledged before, during and after, at its LSN.

mod common;

use common::{exit_within, stela, text, Daemon};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use stela_client::{Address, Connection, Durability};
use stela_proto::{RequestBody, ResponseBody};
use stela_wal::{Codec, Wal, WalOptions};

const TYPE_TAG: &str = "switchover::Rec";
type Rec = (u64, String);

fn rec(seq: u64) -> Rec {
    (
        seq,
        format!("record {seq} {}", "y".repeat((seq % 61) as usize)),
    )
}

struct Witness(Child);

impl Drop for Witness {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn witness(dir: &Path, addr: &str) -> Witness {
    let child = Command::new(env!("CARGO_BIN_EXE_stela"))
        .args(["witness", "--listen", addr, "--dir"])
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the witness");
    stela_testkit::eventually("the witness", Duration::from_secs(20), || {
        std::net::TcpStream::connect(addr).is_ok()
    });
    Witness(child)
}

struct Node {
    dir: PathBuf,
    name: &'static str,
    repl: String,
    peer: String,
    tcp: String,
}

impl Node {
    fn start(&self, witness: &str, role: &str) -> Daemon {
        let coordinator = format!("tcp://{witness}");
        let args = [
            "--node",
            self.name,
            "--repl-listen",
            &self.repl,
            "--peer",
            &self.peer,
            "--coordinator",
            &coordinator,
            "--role",
            role,
            "--tcp",
            &self.tcp,
            "--tcp-insecure",
            "--suspect-after-ms",
            "5000",
        ];
        Daemon::start(&self.dir, &args)
    }
}

fn role(socket: &Path) -> (String, u64) {
    let mut connection =
        Connection::connect_admin(&Address::Unix(socket.to_owned())).expect("connect for status");
    match connection.request(RequestBody::Status) {
        Ok(ResponseBody::Status(report)) => {
            let replication = report.replication.expect("a replication section");
            (replication.role, replication.epoch)
        }
        other => panic!("status: {other:?}"),
    }
}

/// What the committer got: acknowledged (term, LSN, record), in doubt, on one node alone.
type Outcomes = (
    Vec<(u64, u64, Rec)>,
    Vec<(u64, u64, Rec)>,
    Vec<(u64, u64, Rec)>,
);

fn committer(endpoints: String, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Outcomes> {
    std::thread::spawn(move || {
        let wal: stela_client::Wal<Rec> = stela_client::Wal::open(
            endpoints.as_str(),
            "ledger",
            stela_client::WalOptions::default()
                .type_tag(TYPE_TAG)
                .durability(Durability::Replicated)
                .reconnect_within(Duration::from_secs(30)),
        )
        .expect("opens on the primary");
        let (mut acked, mut doubtful, mut alone) = (Vec::new(), Vec::new(), Vec::new());
        let mut seq = 0u64;
        while !stop.load(Ordering::SeqCst) {
            seq += 1;
            let record = rec(seq);
            let Ok(lsn) = wal.append(&record) else {
                continue; // refused while the epoch is handed over: never placed
            };
            let term = wal.term();
            match wal.commit_at(lsn, Durability::Replicated) {
                Ok(()) => acked.push((term, lsn.get(), record)),
                Err(stela_client::Error::InDoubt {
                    term,
                    lsn: Some(lsn),
                    ..
                }) => doubtful.push((term, lsn.get(), record)),
                Err(stela_client::Error::Unprotected {
                    term,
                    lsn: Some(lsn),
                    ..
                }) => alone.push((term, lsn.get(), record)),
                Err(error) => panic!("a commit failed other than in doubt or alone: {error}"),
            }
        }
        (acked, doubtful, alone)
    })
}

fn held(dir: &Path) -> Vec<Rec> {
    let wal: Wal<Rec> = Wal::open(
        dir.join("logs").join("ledger"),
        WalOptions::default()
            .codec(Codec::MessagePack)
            .type_tag(TYPE_TAG)
            .create_if_missing(false),
    )
    .expect("the new primary's copy opens");
    wal.iter()
        .unwrap()
        .map(|item| item.expect("a record of the new primary's copy").1)
        .collect()
}

#[test]
fn a_switchover_hands_the_epoch_to_the_standby_and_loses_no_acknowledged_commit() {
    let root = tempfile::tempdir().unwrap();
    let witness_addr = stela_testkit::free_addr().to_string();
    let _witness = witness(&root.path().join("w"), &witness_addr);
    let addr = || stela_testkit::free_addr().to_string();
    let (repl_a, repl_b) = (addr(), addr());
    let a = Node {
        dir: root.path().join("a"),
        name: "a",
        repl: repl_a.clone(),
        peer: repl_b.clone(),
        tcp: addr(),
    };
    let b = Node {
        dir: root.path().join("b"),
        name: "b",
        repl: repl_b,
        peer: repl_a,
        tcp: addr(),
    };
    let mut daemon_a = a.start(&witness_addr, "primary");
    let daemon_b = b.start(&witness_addr, "standby");
    stela_testkit::eventually("a primary, b its standby", Duration::from_secs(20), || {
        role(&daemon_a.socket()).0 == "primary" && role(&daemon_b.socket()).0 == "standby"
    });
    let (dir_a, dir_b) = (a.dir.display().to_string(), b.dir.display().to_string());
    let nodes = ["--node", dir_a.as_str(), "--node", dir_b.as_str()];
    let stop = Arc::new(AtomicBool::new(false));
    let client = committer(format!("tcp://{},tcp://{}", a.tcp, b.tcp), stop.clone());
    std::thread::sleep(Duration::from_millis(500));

    let listed = stela(&[&["cluster", "list"][..], &nodes].concat());
    assert_eq!(listed.status.code(), Some(0), "{}", text(&listed));
    let list = text(&listed);
    assert!(
        list.lines()
            .any(|l| l.starts_with("a ") && l.contains("primary") && l.contains(" ok")),
        "{list}"
    );
    assert!(
        list.lines()
            .any(|l| l.starts_with("b ") && l.contains("standby")),
        "{list}"
    );

    let started = Instant::now();
    let switched = stela(&[&["cluster", "switchover"][..], &nodes].concat());
    assert_eq!(switched.status.code(), Some(0), "{}", text(&switched));
    assert!(
        text(&switched).contains("switched over: b is the primary of epoch 2"),
        "{}",
        text(&switched)
    );
    eprintln!("switchover: {} ms", started.elapsed().as_millis());
    let exit = exit_within(&mut daemon_a.child, Duration::from_secs(20))
        .unwrap_or_else(|| panic!("a did not step down:\n{}", daemon_a.output()));
    assert_eq!(exit.code(), Some(75), "{}", daemon_a.output());
    assert!(
        daemon_b
            .output()
            .contains("handed this node the next epoch"),
        "b was promoted otherwise than by the handover:\n{}",
        daemon_b.output()
    );
    drop(daemon_a);
    let daemon_a = a.start(&witness_addr, "primary");
    stela_testkit::eventually("a back as b's standby", Duration::from_secs(30), || {
        role(&daemon_a.socket()) == ("standby".to_owned(), 2)
    });
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::SeqCst);
    let (acked, doubtful, alone) = client.join().unwrap();
    let relisted = text(&stela(&[&["cluster", "list"][..], &nodes].concat()));
    assert!(
        relisted
            .lines()
            .any(|l| l.starts_with("b ") && l.contains("primary")),
        "{relisted}"
    );
    assert!(
        relisted
            .lines()
            .any(|l| l.starts_with("a ") && l.contains("standby")),
        "{relisted}"
    );

    assert!(
        doubtful.is_empty(),
        "commits left in doubt by a switchover: {doubtful:?}"
    );
    assert!(
        acked.iter().any(|(t, _, _)| t >> 32 == 1),
        "nothing acknowledged in epoch 1"
    );
    assert!(
        acked.iter().any(|(t, _, _)| t >> 32 == 2),
        "nothing acknowledged in epoch 2"
    );
    daemon_a.terminate();
    daemon_b.terminate();
    let copy = held(&b.dir);
    let acked: BTreeMap<u64, Rec> = acked.into_iter().map(|(_, l, r)| (l, r)).collect();
    for (lsn, record) in &acked {
        assert_eq!(
            copy.get(*lsn as usize - 1),
            Some(record),
            "LSN {lsn} was acknowledged at replicated and is not in the new primary's log"
        );
    }
    eprintln!(
        "{} acknowledged, {} on one node alone, none in doubt",
        acked.len(),
        alone.len()
    );
}
