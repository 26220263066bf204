//! Failover with real processes on loopback: a `stela witness` and two `stela serve` nodes.
//! The primary is SIGKILLed amid `replicated` appends: the standby is promoted, holds every
//! acknowledged record, and takes writes in a new epoch; the killed node, started again, rejoins
//! as its standby. Then the new primary is SIGSTOPped until the other is promoted: resumed, it
//! must not acknowledge anything more, and it steps down by itself (exit 75). Started again it
//! rejoins too; in the end both copies hold every acknowledged record at its LSN, and
//! `stela status` has reported the roles, epochs and the last failover throughout.

mod common;

use common::cluster::{
    append_replicated, check_ledger, check_resolutions, free_addr, nodes, open_ledger, signal,
    status, wait_for, Node, Outcomes, Witness, LEDGER,
};
use common::{stela, text, Daemon};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};
use stela_client::{Address, Connection, Lsn, Resolution};
use stela_proto::{Durability, Payload, RequestBody, ResponseBody};
use stela_wal::Codec;

const TYPE_TAG: &str = "failover_crash::Rec";
type Rec = (u64, String);

fn rec(seq: u64) -> Rec {
    (
        seq,
        format!("record {seq} {}", "x".repeat((seq % 97) as usize)),
    )
}

fn witness(dir: &Path, addr: &str) -> Witness {
    Witness::start(dir, addr, &[])
}

/// The pair a, b, each the other's peer.
fn pair(root: &Path) -> [Node; 2] {
    let nodes = nodes(root, &["a", "b"]);
    nodes
        .try_into()
        .unwrap_or_else(|_| unreachable!("two names"))
}

/// Starts `node` with small segments and `more`.
fn start(node: &Node, witness: &str, role: &str, more: &[&str]) -> Daemon {
    node.start(
        witness,
        role,
        &[&["--segment-size", "256K"][..], more].concat(),
    )
}

fn open(connection: &mut Connection) -> Result<(u32, u64), stela_client::Error> {
    open_ledger(connection, TYPE_TAG)
}

/// Appends records `seqs` at `replicated` one by one, recording each acknowledged one; stops at
/// the first failure (the daemon died).
fn append(
    connection: &mut Connection,
    handle: u32,
    seqs: std::ops::Range<u64>,
    acked: &mut BTreeMap<u64, Rec>,
) -> Result<(), stela_client::Error> {
    append_replicated(connection, handle, seqs.map(rec), acked)
}

fn check(dir: &Path, acked: &BTreeMap<u64, Rec>, whose: &str) -> Vec<Rec> {
    check_ledger(dir, TYPE_TAG, acked, whose, |record| {
        *record == rec(record.0)
    })
}

#[test]
fn sigkill_and_sigstop_of_the_primary_fail_over_and_lose_no_replicated_acknowledgement() {
    let root = tempfile::tempdir().unwrap();
    let witness_addr = free_addr();
    let _witness = witness(&root.path().join("w"), &witness_addr);
    let [a, b] = pair(root.path());
    let daemon_a = start(&a, &witness_addr, "primary", &[]);
    let mut daemon_b = start(&b, &witness_addr, "standby", &[]);
    wait_for("a to be the primary", Duration::from_secs(10), || {
        status(&daemon_a.socket()).role == "primary"
    });
    let mut acked = BTreeMap::new();
    let mut client = Connection::connect(&Address::Unix(daemon_a.socket())).unwrap();
    let (handle, term) = open(&mut client).unwrap();
    assert_eq!(term >> 32, 1);
    // Append from a thread while the primary is killed under it.
    let writer = std::thread::spawn(move || {
        let mut acked = BTreeMap::new();
        let _ = append(&mut client, handle, 0..1_000_000, &mut acked);
        acked
    });
    std::thread::sleep(Duration::from_millis(400));
    let killed = Instant::now();
    daemon_a.kill();
    acked.extend(writer.join().unwrap());
    assert!(acked.len() > 10, "only {} acknowledged", acked.len());

    // b is promoted, in epoch 2, with every acknowledged record.
    wait_for("b to be promoted", Duration::from_secs(10), || {
        status(&daemon_b.socket()).role == "primary"
    });
    let promoted_after = killed.elapsed();
    let on_b = status(&daemon_b.socket());
    assert_eq!(on_b.epoch, 2);
    let failover = on_b.last_failover.expect("the failover is reported");
    eprintln!(
        "promoted {} ms after the SIGKILL (the node says {} ms)",
        promoted_after.as_millis(),
        failover.took_ms
    );
    let shown = text(&stela(&[
        "status",
        "--socket",
        daemon_b.socket().to_str().unwrap(),
    ]));
    assert!(
        shown.contains("last failover") && shown.contains("UNPROTECTED"),
        "{shown}"
    );
    let mut client = Connection::connect(&Address::Unix(daemon_b.socket())).unwrap();
    let (handle, term) = open(&mut client).unwrap();
    assert_eq!(term >> 32, 2);
    let max_acked = *acked.keys().last().unwrap();
    let first_new = acked.len() as u64 + 1_000_000;
    // Unprotected, b answers `replicated` with `Unprotected`, never `Ok` (issue 52): each
    // record is appended, on b alone.
    for seq in first_new..first_new + 50 {
        let payload = Codec::MessagePack.encode(&rec(seq)).unwrap();
        let answer = client.request(RequestBody::Append {
            handle,
            durability: Durability::Replicated,
            records: vec![Payload(payload)],
        });
        assert_eq!(
            answer.as_ref().err().and_then(stela_client::Error::code),
            Some(stela_client::ErrorCode::Unprotected),
            "{answer:?}"
        );
    }
    let alone_through = match client.request(RequestBody::Positions { handle }).unwrap() {
        ResponseBody::Positions(positions) => positions.last_lsn,
        other => panic!("positions: {other:?}"),
    };
    // (b may also hold a record a's last commit was waiting for: it received it, and the
    // commit's answer was lost with a.)
    assert!(
        alone_through >= max_acked + 50,
        "{alone_through} {max_acked}"
    );

    // a comes back: the witness names b, so a is b's standby and catches up.
    let daemon_a = start(&a, &witness_addr, "primary", &[]);
    assert_eq!(status(&daemon_a.socket()).role, "standby");
    let last = alone_through;
    wait_for("a to catch up", Duration::from_secs(10), || {
        let on_b = status(&daemon_b.socket());
        on_b.logs
            .iter()
            .any(|l| l.log == "ledger" && l.connected && l.received_lsn == last)
    });
    assert_eq!(status(&daemon_b.socket()).unprotected_since_ms, 0);
    // Protected again: the same commit is now answered `Ok`, and the records are acknowledged.
    match client.request(RequestBody::Commit {
        handle,
        lsn: alone_through,
        durability: Durability::Replicated,
    }) {
        Ok(ResponseBody::Committed { .. }) => {}
        other => panic!("commit once protected: {other:?}"),
    }
    for (i, seq) in (first_new..first_new + 50).enumerate() {
        acked.insert(alone_through - 49 + i as u64, rec(seq));
    }
    drop(client);

    // b (now primary) is stopped: a is promoted; b, resumed, steps down and exits 75.
    signal(&daemon_b, "STOP");
    wait_for("a to be promoted", Duration::from_secs(10), || {
        status(&daemon_a.socket()).role == "primary"
    });
    assert_eq!(status(&daemon_a.socket()).epoch, 3);
    let resumed = Instant::now();
    let exit = daemon_b.signal_and_wait("CONT");
    eprintln!(
        "the old primary stepped down {} ms after it resumed",
        resumed.elapsed().as_millis()
    );
    assert_eq!(exit.code(), Some(75), "{}", daemon_b.output());
    assert!(
        daemon_b.output().contains("stepped down"),
        "{}",
        daemon_b.output()
    );
    // b rejoins as a's standby; once it has acknowledged a record of a's (one appended at
    // `buffered`), a is protected again and `replicated` is acknowledged.
    let daemon_b = start(&b, &witness_addr, "primary", &[]);
    assert_eq!(status(&daemon_b.socket()).role, "standby");
    let mut client = Connection::connect(&Address::Unix(daemon_a.socket())).unwrap();
    let (handle, term) = open(&mut client).unwrap();
    assert_eq!(term >> 32, 3);
    let first_new = first_new + 1_000;
    let payload = Codec::MessagePack.encode(&rec(first_new)).unwrap();
    let ResponseBody::Appended { last_lsn, .. } = client
        .request(RequestBody::Append {
            handle,
            durability: Durability::Buffered,
            records: vec![Payload(payload)],
        })
        .unwrap()
    else {
        panic!("append at buffered")
    };
    wait_for("a to be protected again", Duration::from_secs(10), || {
        status(&daemon_a.socket()).unprotected_since_ms == 0
    });
    acked.insert(last_lsn, rec(first_new));
    append(
        &mut client,
        handle,
        first_new + 1..first_new + 20,
        &mut acked,
    )
    .unwrap();
    drop(client);
    let last = *acked.keys().last().unwrap();
    let caught_up = Instant::now() + Duration::from_secs(10);
    while !status(&daemon_a.socket())
        .logs
        .iter()
        .any(|l| l.log == "ledger" && l.connected && l.received_lsn == last)
    {
        assert!(
            Instant::now() < caught_up,
            "b did not catch up: {:?}\n--- a:\n{}\n--- b:\n{}",
            status(&daemon_a.socket()),
            daemon_a.output(),
            daemon_b.output()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    daemon_a.terminate();
    daemon_b.terminate();
    let (held_a, held_b) = (check(&a.dir, &acked, "a"), check(&b.dir, &acked, "b"));
    assert_eq!(held_a, held_b, "the two copies differ");
    // Nothing was salvaged that mattered, and the tool says what was.
    let listing = text(&stela(&["wal", "salvage", a.dir.to_str().unwrap()]));
    assert!(
        listing.contains("nothing salvaged") || listing.contains("cut at"),
        "{listing}"
    );
}

/// Files the answer to a `replicated` commit appended at (`term`, `lsn`). One answered
/// `Unprotected` (on the promoted node with its old primary stopped: on it alone, and said so,
/// issue 52, never a plain `Ok`) names that very commit.
fn file(
    outcomes: &mut Outcomes<Rec>,
    answer: Result<(), stela_client::Error>,
    term: u64,
    lsn: Lsn,
    record: Rec,
) {
    if let Err(stela_client::Error::Unprotected {
        term: t,
        lsn: Some(l),
        ..
    }) = &answer
    {
        assert_eq!((*t, *l), (term, lsn));
    }
    outcomes.file(answer, term, lsn.get(), record);
}

/// What a client reported after the failover: its last term, its commits, and each commit in
/// doubt settled against the new primary (LSN, record, resolution).
struct Reported {
    last_term: u64,
    outcomes: Outcomes<Rec>,
    settled: Vec<(u64, Rec, Resolution)>,
}

/// The pair a (primary) and b, each with a TCP listener, and `client` on a thread of its own:
/// it opens the ledger through both endpoints (`tcp://A,tcp://B`), sends its first term on
/// `opened`, commits at `replicated` until `stop`, then settles what was in doubt. a is stopped
/// under it until b is promoted; resumed, a must step down (exit 75), and b's copy must agree
/// with every answer the client got.
fn through_a_stopped_primary<C>(client: C) -> Reported
where
    C: FnOnce(String, Arc<AtomicBool>, mpsc::Sender<u64>) -> Reported + Send + 'static,
{
    let root = tempfile::tempdir().unwrap();
    let witness_addr = free_addr();
    let _witness = witness(&root.path().join("w"), &witness_addr);
    let (tcp_a, tcp_b) = (free_addr(), free_addr());
    let [a, b] = pair(root.path());
    let mut daemon_a = start(
        &a,
        &witness_addr,
        "primary",
        &["--tcp", &tcp_a, "--tcp-insecure"],
    );
    let daemon_b = start(
        &b,
        &witness_addr,
        "standby",
        &["--tcp", &tcp_b, "--tcp-insecure"],
    );
    wait_for("a to be the primary", Duration::from_secs(10), || {
        status(&daemon_a.socket()).role == "primary"
    });
    let endpoints = format!("tcp://{tcp_a},tcp://{tcp_b}");
    let stop = Arc::new(AtomicBool::new(false));
    let (opened, opened_rx) = mpsc::channel();
    let client = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || client(endpoints, stop, opened))
    };
    let first_term = opened_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the client opened the log");
    assert_eq!(first_term >> 32, 1);
    std::thread::sleep(Duration::from_millis(300));
    signal(&daemon_a, "STOP");
    wait_for("b to be promoted", Duration::from_secs(10), || {
        status(&daemon_b.socket()).role == "primary"
    });
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::SeqCst);
    let reported = client.join().unwrap();
    assert_eq!(
        reported.last_term >> 32,
        2,
        "the client follows to the new epoch"
    );
    // b has no standby (a is stopped): nothing of epoch 2 is acknowledged `replicated`, every
    // commit there is answered `Unprotected` (on b alone, and said so: issue 52).
    let outcomes = &reported.outcomes;
    assert!(
        outcomes.acked.iter().all(|(t, _, _)| t >> 32 == 1),
        "an epoch-2 commit acknowledged with no standby"
    );
    assert!(
        outcomes.alone.iter().any(|(t, _, _)| t >> 32 == 2),
        "commits in the new epoch"
    );
    // The old primary, resumed, steps down.
    let exit = daemon_a.signal_and_wait("CONT");
    assert_eq!(exit.code(), Some(75), "{}", daemon_a.output());
    daemon_b.terminate();
    let held = check(&b.dir, &outcomes.acked_by_lsn(), "b");
    check_resolutions(&held, &reported.settled);
    eprintln!(
        "{} acknowledged, {} in doubt (resolved against the log)",
        outcomes.acked.len(),
        reported.settled.len()
    );
    reported
}

/// A client given both nodes (`tcp://A,tcp://B`) keeps committing at `replicated` while its
/// primary is stopped: the commit in flight is reported in doubt with its term and LSN, the
/// next ones go to the promoted node in the new epoch, and `Wal::resolve` settles the doubtful
/// one against the new primary's history, which agrees with its log.
#[test]
fn a_client_with_both_endpoints_follows_a_failover_and_resolves_what_was_in_doubt() {
    use stela_client::{Wal, WalOptions as ClientOptions};
    through_a_stopped_primary(|endpoints, stop, opened| {
        let wal: Wal<Rec> = Wal::open(
            endpoints.as_str(),
            LEDGER,
            ClientOptions::default()
                .type_tag(TYPE_TAG)
                .durability(Durability::Replicated),
        )
        .expect("opens on the primary");
        opened.send(wal.term()).unwrap();
        let mut outcomes = Outcomes::default();
        let mut seq = 0u64;
        while !stop.load(Ordering::SeqCst) {
            seq += 1;
            let record = rec(seq);
            let Ok(lsn) = wal.append(&record) else {
                continue; // lost with its primary before it was placed
            };
            let term = wal.term();
            let answer = wal.commit_at(lsn, Durability::Replicated);
            file(&mut outcomes, answer, term, lsn, record);
        }
        let settled = outcomes
            .doubtful
            .iter()
            .map(|(term, lsn, record)| {
                let outcome = wal.resolve(*term, Lsn::new(*lsn)).expect("resolve");
                (*lsn, record.clone(), outcome)
            })
            .collect();
        Reported {
            last_term: wal.term(),
            outcomes,
            settled,
        }
    });
}

/// Tasks committing on the one `AsyncWal`. With four, every task was sometimes between its
/// commit and its next append's answer when the primary stopped (3 of 10 runs reported nothing
/// in doubt once `replicated` commits got faster, 2026-12-07); with sixteen a commit is in flight.
const COMMITTERS: u64 = 16;

/// Appends and commits at `replicated` records numbered `task`, `task + COMMITTERS`, ... until
/// `stop`.
async fn commit_until(
    wal: stela_client::AsyncWal<Rec>,
    stop: Arc<AtomicBool>,
    task: u64,
) -> Outcomes<Rec> {
    let mut outcomes = Outcomes::default();
    let mut seq = task;
    while !stop.load(Ordering::SeqCst) {
        seq += COMMITTERS;
        let record = rec(seq);
        let Ok(lsn) = wal.append(&record).await else {
            continue; // lost with its primary before it was placed
        };
        let term = wal.term();
        let answer = wal.commit_at(lsn, Durability::Replicated).await;
        file(&mut outcomes, answer, term, lsn, record);
    }
    outcomes
}

/// The same with `AsyncWal` (issue 55): given both nodes, it keeps committing at `replicated`
/// while its primary is stopped; the commit in flight is reported in doubt with its term and
/// LSN, the next ones go to the promoted node in the new epoch, and `AsyncWal::resolve`
/// settles each doubtful one against the new primary's history, which agrees with its log.
#[test]
fn an_async_client_with_both_endpoints_follows_a_failover_and_resolves_what_was_in_doubt() {
    use stela_client::{AsyncWal, WalOptions as ClientOptions};
    // The client runs on its own thread and runtime: committing until told to stop, then
    // resolving what was in doubt, while the test's thread stops and watches the nodes.
    // The scenario again (at most three times in all) when no commit was in flight as the
    // primary stopped: nothing was in doubt then, so nothing was resolved (seen in 1 of 10 runs
    // at 5241860; every check of `through_a_stopped_primary` holds in each attempt). Why: a
    // `replicated` commit is often answered at once (another task's commit already brought the
    // standby past it), so a task spends most of its time in its append's round trip, and an
    // append cut by the stop has no LSN to be in doubt about. Six runs at 05e45bc, counting the
    // answers by kind: 1, 7, 8, 8, 10 and 15 of the sixteen tasks were in a commit.
    let mut attempts = 0;
    let reported = loop {
        attempts += 1;
        let reported = through_a_stopped_primary(|endpoints, stop, opened| {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let wal: AsyncWal<Rec> = AsyncWal::open(
                    endpoints.as_str(),
                    LEDGER,
                    ClientOptions::default()
                        .type_tag(TYPE_TAG)
                        .durability(Durability::Replicated),
                )
                .await
                .expect("opens on the primary");
                opened.send(wal.term()).unwrap();
                // COMMITTERS committers on the one connection, so that a commit is in flight when the
                // primary stops.
                let committers: Vec<_> = (0..COMMITTERS)
                    .map(|task| tokio::spawn(commit_until(wal.clone(), Arc::clone(&stop), task)))
                    .collect();
                let mut outcomes = Outcomes::default();
                for committer in committers {
                    outcomes.extend(committer.await.unwrap());
                }
                let mut settled = Vec::new();
                for (term, lsn, record) in &outcomes.doubtful {
                    let outcome = wal.resolve(*term, Lsn::new(*lsn)).await.expect("resolve");
                    settled.push((*lsn, record.clone(), outcome));
                }
                Reported {
                    last_term: wal.term(),
                    outcomes,
                    settled,
                }
            })
        });
        if !reported.settled.is_empty() || attempts == 3 {
            break reported;
        }
        eprintln!("nothing was in doubt when the primary stopped: the scenario again");
    };
    assert!(
        !reported.settled.is_empty(),
        "the commit waiting on the stopped primary was not reported in doubt ({attempts} attempts)"
    );
}

/// Issue 52, failure 2: the old primary `a`, having followed `b`'s stream in epoch 2, is
/// killed and started again while the witness is down. It used to take its configured role
/// (`--role primary`) in the epoch it had followed, so two nodes were primaries of epoch 2.
/// A node is primary only by a grant: `a` starts as a standby, refuses writes, goes back to
/// following `b`, and stays `b`'s standby once the witness is back.
#[test]
fn a_node_restarted_while_the_witness_is_down_is_a_standby_never_a_second_primary() {
    let root = tempfile::tempdir().unwrap();
    let witness_addr = free_addr();
    let witness_dir = root.path().join("w");
    let the_witness = witness(&witness_dir, &witness_addr);
    let [a, b] = pair(root.path());
    let daemon_a = start(&a, &witness_addr, "primary", &[]);
    let daemon_b = start(&b, &witness_addr, "standby", &[]);
    wait_for("a to be the primary", Duration::from_secs(10), || {
        status(&daemon_a.socket()).role == "primary"
    });
    let mut acked = BTreeMap::new();
    let mut client = Connection::connect(&Address::Unix(daemon_a.socket())).unwrap();
    let (handle, _) = open(&mut client).unwrap();
    append(&mut client, handle, 0..20, &mut acked).unwrap();
    drop(client);
    daemon_a.kill();
    wait_for("b to be promoted", Duration::from_secs(10), || {
        status(&daemon_b.socket()).role == "primary"
    });
    assert_eq!(status(&daemon_b.socket()).epoch, 2);

    // a comes back as b's standby and takes up epoch 2 from b's stream.
    let daemon_a = start(&a, &witness_addr, "primary", &[]);
    wait_for("a to follow b in epoch 2", Duration::from_secs(10), || {
        let on_a = status(&daemon_a.socket());
        on_a.role == "standby" && on_a.epoch == 2 && on_a.logs.iter().any(|l| l.connected)
    });
    // b is protected again once a acknowledges a record of b's (one at `buffered`).
    let mut client = Connection::connect(&Address::Unix(daemon_b.socket())).unwrap();
    let (handle, term) = open(&mut client).unwrap();
    assert_eq!(term >> 32, 2);
    let payload = Codec::MessagePack.encode(&rec(500)).unwrap();
    let Ok(ResponseBody::Appended { last_lsn, .. }) = client.request(RequestBody::Append {
        handle,
        durability: Durability::Buffered,
        records: vec![Payload(payload)],
    }) else {
        panic!("append at buffered")
    };
    acked.insert(last_lsn, rec(500));
    wait_for("b to be protected again", Duration::from_secs(10), || {
        status(&daemon_b.socket()).unprotected_since_ms == 0
    });

    // The witness goes down; a is killed and started again with --role primary.
    drop(the_witness);
    daemon_a.kill();
    let daemon_a = start(&a, &witness_addr, "primary", &[]);
    let on_a = status(&daemon_a.socket());
    assert_eq!(
        (on_a.role.as_str(), on_a.epoch),
        ("standby", 2),
        "{}",
        daemon_a.output()
    );
    let mut on_a_client = Connection::connect(&Address::Unix(daemon_a.socket())).unwrap();
    let refused = open(&mut on_a_client).expect_err("a standby refuses to open a log for writing");
    assert_eq!(
        refused.code(),
        Some(stela_client::ErrorCode::NotPrimary),
        "{refused}"
    );
    drop(on_a_client);
    // For several suspicion periods, with b's stream coming back: a stays b's standby.
    let until = Instant::now() + Duration::from_millis(1500);
    let mut seq = 1_000;
    while Instant::now() < until {
        let on_a = status(&daemon_a.socket());
        assert_eq!(on_a.role, "standby", "{}", daemon_a.output());
        assert_eq!(status(&daemon_b.socket()).role, "primary");
        append(&mut client, handle, seq..seq + 5, &mut acked).unwrap();
        seq += 5;
    }
    let _witness = witness(&witness_dir, &witness_addr);
    std::thread::sleep(Duration::from_millis(1000));
    append(&mut client, handle, seq..seq + 5, &mut acked).unwrap();
    let (on_a, on_b) = (status(&daemon_a.socket()), status(&daemon_b.socket()));
    assert_eq!((on_a.role.as_str(), on_a.epoch), ("standby", 2));
    assert_eq!((on_b.role.as_str(), on_b.epoch), ("primary", 2));
    let last = *acked.keys().last().unwrap();
    wait_for(
        "a to hold every acknowledged record",
        Duration::from_secs(10),
        || {
            status(&daemon_b.socket())
                .logs
                .iter()
                .any(|l| l.log == "ledger" && l.connected && l.received_lsn == last)
        },
    );
    drop(client);
    daemon_a.terminate();
    daemon_b.terminate();
    let (held_a, held_b) = (check(&a.dir, &acked, "a"), check(&b.dir, &acked, "b"));
    assert_eq!(held_a, held_b, "the two copies differ");
}

/// Issue 52, failure 3: a record the primary holds alone (its standby is stopped) used to
/// resolve `Kept` from the primary's own history, although a failover then would lose it.
/// `Kept` means protected: until the standby holds it, it resolves `NotYet`; once the standby
/// is back and has it, `Kept`, and the log holds it.
#[test]
fn a_record_no_standby_holds_resolves_not_yet_and_kept_only_once_protected() {
    use stela_client::{Resolution, Wal, WalOptions as ClientOptions};
    let root = tempfile::tempdir().unwrap();
    let witness_addr = free_addr();
    let _witness = witness(&root.path().join("w"), &witness_addr);
    let (tcp_a, tcp_b) = (free_addr(), free_addr());
    let [a, b] = pair(root.path());
    // A long suspicion, so that b stopped for a while is not replaced meanwhile.
    let slow = ["--tcp-insecure", "--suspect-after-ms", "5000"];
    let daemon_a = start(
        &a,
        &witness_addr,
        "primary",
        &[&["--tcp", tcp_a.as_str()][..], &slow[..]].concat(),
    );
    let mut daemon_b = start(
        &b,
        &witness_addr,
        "standby",
        &[&["--tcp", tcp_b.as_str()][..], &slow[..]].concat(),
    );
    wait_for("a to be the primary", Duration::from_secs(10), || {
        status(&daemon_a.socket()).role == "primary"
    });
    let endpoints = format!("tcp://{tcp_a},tcp://{tcp_b}");
    let wal: Wal<Rec> = Wal::open(
        endpoints.as_str(),
        "ledger",
        ClientOptions::default()
            .type_tag(TYPE_TAG)
            .durability(Durability::Replicated),
    )
    .expect("opens on the primary");
    for seq in 0..5 {
        let lsn = wal.append(&rec(seq)).unwrap();
        wal.commit(lsn).expect("replicated with the standby up");
    }
    signal(&daemon_b, "STOP");
    // SIGSTOP takes effect asynchronously: wait until every thread of b is stopped.
    wait_for("b to be stopped", Duration::from_secs(10), || {
        let tasks = std::fs::read_dir(format!("/proc/{}/task", daemon_b.pid())).unwrap();
        tasks.flatten().all(|task| {
            let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
            // The state follows the command name's closing parenthesis.
            stat.rsplit_once(") ")
                .is_some_and(|(_, rest)| rest.starts_with('T'))
        })
    });
    let lsn = wal.append(&rec(99)).expect("appended at buffered");
    let term = wal.term();
    assert_eq!(
        wal.resolve(term, lsn).unwrap(),
        Resolution::NotYet,
        "a record on the primary alone resolved as kept"
    );
    signal(&daemon_b, "CONT");
    wait_for(
        "the record to be protected",
        Duration::from_secs(10),
        || wal.resolve(term, lsn).unwrap() == Resolution::Kept,
    );
    drop(wal);
    daemon_a.terminate();
    let _ = daemon_b.signal_and_wait("TERM");
    let held = check(&b.dir, &BTreeMap::new(), "b");
    assert_eq!(held.get(lsn.get() as usize - 1), Some(&rec(99)));
}
