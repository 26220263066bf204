//! `stela cluster list` and `stela cluster switchover` with real processes on loopback: a
//! `stela witness` and two `stela serve` nodes, a client committing at `replicated` to both
//! endpoints throughout. The switchover hands epoch 2 to the standby, which takes it through
//! the handover (not a suspicion period: the nodes suspect only after 5 s), the old primary
//! exits 75 and, started again, rejoins as the standby; no commit is left in doubt, and the new
//! primary's log holds every record acknowledged before, during and after, at its LSN.
//!
//! With three nodes (K = 1) the same, with one standby SIGKILLed just before the switchover:
//! it is handed to the standby that is up (no `--to`: the one that answers holding the most),
//! without waiting for the one that is down; both others, started again, follow the new
//! primary, and every acknowledged record is on all three.

mod common;

use common::cluster::{check_ledger, free_addr, nodes, status, Node, Outcomes, Witness};
use common::{exit_within, stela, text, Daemon};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use stela_client::Durability;

const TYPE_TAG: &str = "switchover::Rec";
type Rec = (u64, String);

fn rec(seq: u64) -> Rec {
    (
        seq,
        format!("record {seq} {}", "y".repeat((seq % 61) as usize)),
    )
}

/// A node of these tests: the cluster's [`Node`] and its client address (`--tcp`).
struct Member {
    node: Node,
    tcp: String,
}

impl Member {
    /// Starts the node on the coordinator at `coordinator` (a URL). It suspects its primary
    /// only after 5 s, so that the epoch moves by the handover, not by a suspicion.
    fn start(&self, coordinator: &str, role: &str) -> Daemon {
        let mut more = vec![
            "--tcp",
            &self.tcp,
            "--tcp-insecure",
            "--suspect-after-ms",
            "5000",
        ];
        if self.node.peers.len() > 1 {
            more.extend_from_slice(&["--replicas", "1"]);
        }
        self.node.start_on(coordinator, role, &more)
    }
}

/// Members named `names`, each with every other one as a `--peer`.
fn members(root: &Path, names: &[&'static str]) -> Vec<Member> {
    nodes(root, names)
        .into_iter()
        .map(|node| Member {
            node,
            tcp: free_addr(),
        })
        .collect()
}

fn role(socket: &Path) -> (String, u64) {
    let replication = status(socket);
    (replication.role, replication.epoch)
}

/// Whether the primary at `socket` has `standbys` standbys connected, with a log open.
fn standbys_connected(socket: &Path, standbys: usize) -> bool {
    let shown = status(socket);
    shown.standbys.len() == standbys
        && shown
            .standbys
            .iter()
            .all(|s| s.connected && !s.logs.is_empty())
}

/// Whether the primary at `socket` has `standbys` standbys connected, each holding every
/// record of every log.
fn standbys_caught_up(socket: &Path, standbys: usize) -> bool {
    let shown = status(socket);
    shown.standbys.len() == standbys
        && shown
            .standbys
            .iter()
            .all(|s| s.connected && s.logs.iter().all(|l| l.lag_records == 0))
}

/// Commits `rec(1)`, `rec(2)`, ... at `replicated` through `endpoints` until `stop`; what each
/// commit got. An append refused while the epoch is handed over is never placed.
fn committer(endpoints: String, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Outcomes<Rec>> {
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
        let mut outcomes = Outcomes::default();
        let mut seq = 0u64;
        while !stop.load(Ordering::SeqCst) {
            seq += 1;
            let record = rec(seq);
            let Ok(lsn) = wal.append(&record) else {
                continue;
            };
            let term = wal.term();
            let answer = wal.commit_at(lsn, Durability::Replicated);
            outcomes.file(answer, term, lsn.get(), record);
        }
        outcomes
    })
}

/// `stela cluster switchover` of `nodes` hands epoch 2 to b by the handover, and the old
/// primary a steps down (exit 75).
fn switch_over_to_b(nodes: &[&str], daemon_a: &mut Daemon, daemon_b: &Daemon) {
    let started = Instant::now();
    let switched = stela(&[&["cluster", "switchover"][..], nodes].concat());
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
}

/// `stela cluster list` of `nodes`, as text.
fn cluster_list(nodes: &[&str]) -> String {
    text(&stela(&[&["cluster", "list"][..], nodes].concat()))
}

/// Whether the `stela cluster list` output `listing` shows `name` with each of `words`.
fn shows(listing: &str, name: &str, words: &[&str]) -> bool {
    listing
        .lines()
        .any(|l| l.starts_with(&format!("{name} ")) && words.iter().all(|w| l.contains(w)))
}

/// No commit was left in doubt by the switchover, and commits were acknowledged in epoch 1
/// (before it) and in epoch 2 (after it).
fn none_in_doubt_and_both_epochs(outcomes: &Outcomes<Rec>) {
    let doubtful = &outcomes.doubtful;
    assert!(
        doubtful.is_empty(),
        "commits left in doubt by a switchover: {doubtful:?}"
    );
    for epoch in [1, 2] {
        assert!(
            outcomes.acked.iter().any(|(t, _, _)| t >> 32 == epoch),
            "nothing acknowledged in epoch {epoch}"
        );
    }
}

/// Every record a copy holds was sent.
fn sent(record: &Rec) -> bool {
    *record == rec(record.0)
}

#[test]
fn a_switchover_hands_the_epoch_to_the_standby_and_loses_no_acknowledged_commit() {
    let root = tempfile::tempdir().unwrap();
    let witness_addr = free_addr();
    let _witness = Witness::start(&root.path().join("w"), &witness_addr, &[]);
    pair_switches_over(root.path(), &format!("tcp://{witness_addr}"));
}

/// The same switchover with etcd as the coordinator: the handover is an etcd transaction.
#[test]
fn a_switchover_through_etcd_loses_no_acknowledged_commit() {
    let root = tempfile::tempdir().unwrap();
    let etcd = stela_testkit::Etcd::start();
    let url = etcd.coordinator_url();
    let probe = stela_coord::connect(&url, "probe", Duration::from_secs(1), None).unwrap();
    stela_testkit::eventually("etcd to answer", Duration::from_secs(30), || {
        probe.current().is_ok()
    });
    pair_switches_over(root.path(), &url);
}

/// A pair a (primary) and b under `replicated` commits on the coordinator at `coordinator`:
/// switched over to b, a restarted as b's standby, nothing in doubt, every acknowledged record
/// in b's log.
fn pair_switches_over(root: &Path, coordinator: &str) {
    let [a, b]: [Member; 2] = members(root, &["a", "b"]).try_into().ok().unwrap();
    let mut daemon_a = a.start(coordinator, "primary");
    let daemon_b = b.start(coordinator, "standby");
    stela_testkit::eventually("a primary, b its standby", Duration::from_secs(20), || {
        role(&daemon_a.socket()).0 == "primary" && role(&daemon_b.socket()).0 == "standby"
    });
    let dir_a = a.node.dir.display().to_string();
    let dir_b = b.node.dir.display().to_string();
    let nodes = ["--node", dir_a.as_str(), "--node", dir_b.as_str()];
    let stop = Arc::new(AtomicBool::new(false));
    let client = committer(format!("tcp://{},tcp://{}", a.tcp, b.tcp), stop.clone());
    std::thread::sleep(Duration::from_millis(500));

    let listed = stela(&[&["cluster", "list"][..], &nodes].concat());
    assert_eq!(listed.status.code(), Some(0), "{}", text(&listed));
    let list = text(&listed);
    assert!(shows(&list, "a", &["primary", " ok"]), "{list}");
    assert!(shows(&list, "b", &["standby"]), "{list}");

    switch_over_to_b(&nodes, &mut daemon_a, &daemon_b);
    drop(daemon_a);
    let daemon_a = a.start(coordinator, "primary");
    stela_testkit::eventually("a back as b's standby", Duration::from_secs(30), || {
        role(&daemon_a.socket()) == ("standby".to_owned(), 2)
    });
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::SeqCst);
    let outcomes = client.join().unwrap();
    let relisted = cluster_list(&nodes);
    assert!(shows(&relisted, "b", &["primary"]), "{relisted}");
    assert!(shows(&relisted, "a", &["standby"]), "{relisted}");

    none_in_doubt_and_both_epochs(&outcomes);
    daemon_a.terminate();
    daemon_b.terminate();
    let acked = outcomes.acked_by_lsn();
    check_ledger(&b.node.dir, TYPE_TAG, &acked, "the new primary b", sent);
    eprintln!(
        "{} acknowledged, {} on one node alone, none in doubt",
        acked.len(),
        outcomes.alone.len()
    );
}

#[test]
fn with_three_nodes_a_switchover_goes_to_the_standby_that_is_up_and_the_others_follow_it() {
    let root = tempfile::tempdir().unwrap();
    let witness_addr = free_addr();
    let _witness = Witness::start(&root.path().join("w"), &witness_addr, &[]);
    let coordinator = format!("tcp://{witness_addr}");
    let [a, b, c]: [Member; 3] = members(root.path(), &["a", "b", "c"])
        .try_into()
        .ok()
        .unwrap();
    let mut daemon_a = a.start(&coordinator, "primary");
    let daemon_b = b.start(&coordinator, "standby");
    let mut daemon_c = c.start(&coordinator, "standby");
    stela_testkit::eventually("a primary", Duration::from_secs(30), || {
        role(&daemon_a.socket()).0 == "primary"
    });
    let dirs = [&a, &b, &c].map(|m| m.node.dir.display().to_string());
    let nodes: Vec<&str> = dirs.iter().flat_map(|d| ["--node", d.as_str()]).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let endpoints = format!("tcp://{},tcp://{},tcp://{}", a.tcp, b.tcp, c.tcp);
    let client = committer(endpoints, stop.clone());
    stela_testkit::eventually("a's two standbys", Duration::from_secs(30), || {
        standbys_connected(&daemon_a.socket(), 2)
    });
    std::thread::sleep(Duration::from_millis(500));

    // c goes down amid the commits: b alone acknowledges them from here (K = 1).
    daemon_c.child.kill().unwrap();
    daemon_c.child.wait().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    switch_over_to_b(&nodes, &mut daemon_a, &daemon_b);

    // The old primary and the node that was down both come back as b's standbys.
    drop(daemon_a);
    drop(daemon_c);
    let daemon_a = a.start(&coordinator, "primary");
    let daemon_c = c.start(&coordinator, "standby");
    stela_testkit::eventually(
        "a and c back as b's standbys",
        Duration::from_secs(30),
        || {
            role(&daemon_a.socket()) == ("standby".to_owned(), 2)
                && role(&daemon_c.socket()) == ("standby".to_owned(), 2)
        },
    );
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::SeqCst);
    let outcomes = client.join().unwrap();
    stela_testkit::eventually("b's standbys caught up", Duration::from_secs(30), || {
        standbys_caught_up(&daemon_b.socket(), 2)
    });
    let listed = cluster_list(&nodes);
    for (name, role) in [("a", "standby"), ("b", "primary"), ("c", "standby")] {
        assert!(shows(&listed, name, &[role]), "{listed}");
    }

    none_in_doubt_and_both_epochs(&outcomes);
    let alone = &outcomes.alone;
    assert!(
        alone.is_empty(),
        "acknowledged on one node alone: {alone:?}"
    );
    for daemon in [daemon_a, daemon_b, daemon_c] {
        daemon.terminate();
    }
    let acked = outcomes.acked_by_lsn();
    for member in [&a, &b, &c] {
        let node = &member.node;
        check_ledger(&node.dir, TYPE_TAG, &acked, node.name, sent);
    }
    eprintln!("{} acknowledged, none in doubt", acked.len());
}
