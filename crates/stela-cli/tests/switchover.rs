//! `stela cluster list` and `stela cluster switchover` with real processes on loopback: a
//! `stela witness` and two `stela serve` nodes, a client committing at `replicated` to both
//! endpoints throughout. The switchover hands epoch 2 to the standby, which takes it through
//! the handover (not a suspicion period: the nodes suspect only after 5 s), the old primary
//! exits 75 and, started again, rejoins as the standby; no commit is left in doubt, and the new
//! primary's log holds every record acknowledged before, during and after, at its LSN.

mod common;

use common::cluster::{check_ledger, free_addr, nodes, status, Node, Outcomes, Witness, LEDGER};
use common::{exit_within, stela, text, Daemon};
use std::collections::BTreeMap;
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

/// A node of the pair and the address of its TCP listener (the client's endpoint).
struct Member {
    node: Node,
    tcp: String,
}

impl Member {
    /// Starts the node with its TCP listener; the nodes suspect only after 5 s, so that a
    /// promotion here is the handover's.
    fn start(&self, witness: &str, role: &str) -> Daemon {
        let more = [
            "--tcp",
            &self.tcp,
            "--tcp-insecure",
            "--suspect-after-ms",
            "5000",
        ];
        self.node.start(witness, role, &more)
    }
}

fn role(socket: &Path) -> (String, u64) {
    let shown = status(socket);
    (shown.role, shown.epoch)
}

fn committer(endpoints: String, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Outcomes<Rec>> {
    std::thread::spawn(move || {
        let wal: stela_client::Wal<Rec> = stela_client::Wal::open(
            endpoints.as_str(),
            LEDGER,
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
                continue; // refused while the epoch is handed over: never placed
            };
            let term = wal.term();
            let answer = wal.commit_at(lsn, Durability::Replicated);
            outcomes.file(answer, term, lsn.get(), record);
        }
        outcomes
    })
}

#[test]
fn a_switchover_hands_the_epoch_to_the_standby_and_loses_no_acknowledged_commit() {
    let root = tempfile::tempdir().unwrap();
    let witness_addr = free_addr();
    let _witness = Witness::start(&root.path().join("w"), &witness_addr, &[]);
    let [a, b] = <[Node; 2]>::try_from(nodes(root.path(), &["a", "b"]))
        .unwrap_or_else(|_| unreachable!("two names"))
        .map(|node| Member {
            node,
            tcp: free_addr(),
        });
    let mut daemon_a = a.start(&witness_addr, "primary");
    let daemon_b = b.start(&witness_addr, "standby");
    stela_testkit::eventually("a primary, b its standby", Duration::from_secs(20), || {
        role(&daemon_a.socket()).0 == "primary" && role(&daemon_b.socket()).0 == "standby"
    });
    let (dir_a, dir_b) = (a.node.dir.display(), b.node.dir.display());
    let (dir_a, dir_b) = (dir_a.to_string(), dir_b.to_string());
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
    let Outcomes {
        acked,
        doubtful,
        alone,
    } = client.join().unwrap();
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
    let acked: BTreeMap<u64, Rec> = acked.into_iter().map(|(_, l, r)| (l, r)).collect();
    check_ledger(
        &b.node.dir,
        TYPE_TAG,
        &acked,
        "b, the new primary",
        |record| *record == rec(record.0),
    );
    eprintln!(
        "{} acknowledged, {} on one node alone, none in doubt",
        acked.len(),
        alone.len()
    );
}
