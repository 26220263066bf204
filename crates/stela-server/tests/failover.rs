//! Automatic failover between two daemons in this process, on loopback, with a real witness
//! (`stela_coord::witness`): a silent primary is replaced by its standby (a new epoch, a new
//! term at its last received LSN + 1, every `replicated` acknowledgement kept), the standby
//! refuses clients until then, the old primary restarted rejoins as the standby and fetches
//! only what it lacks, a diverged suffix is cut into salvage, and an old primary can no longer
//! collect a `replicated` acknowledgement. A broken link between the two alone (the primary
//! still renewing) causes no failover.

mod common;

use common::{read_back, rec, NoHang, RawClient, Rec};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use stela_proto::{Durability, ErrorCode, RequestBody, ResponseBody};
use stela_server::config::{AfterFailover, FailoverConfig, NodeRole};
use stela_server::{DaemonConfig, Server};
use stela_testkit::free_addr;
use stela_wal::storage::StdStorage;

/// The pair's shape: the coordinator and each node's replication address.
struct Pair {
    coordinator: String,
    repl: [SocketAddr; 2],
    dirs: [PathBuf; 2],
}

impl Pair {
    fn new(root: &Path, witness: SocketAddr) -> Pair {
        Pair::with(root, format!("tcp://{witness}"))
    }

    fn with(root: &Path, coordinator: String) -> Pair {
        Pair {
            coordinator,
            repl: [free_addr(), free_addr()],
            dirs: [root.join("a"), root.join("b")],
        }
    }

    /// Starts node `i` ("a" or "b"), `role` being the one it takes if the witness names no
    /// primary yet.
    fn start(&self, i: usize, role: NodeRole) -> NoHang {
        self.start_with(i, role, |_| {})
    }

    /// [`Pair::start`], with `adjust` changing the node's configuration last.
    fn start_with(
        &self,
        i: usize,
        role: NodeRole,
        adjust: impl FnOnce(&mut DaemonConfig),
    ) -> NoHang {
        let mut config = DaemonConfig::new(&self.dirs[i]);
        config.assume_write_rate = Some(100 << 20);
        config.segment_bytes = 64 << 10;
        config.spin = Duration::ZERO;
        config.node = ["a", "b"][i].into();
        config.repl_listen = Some(self.repl[i]);
        config.standby = Some(self.repl[1 - i]);
        config.failover = Some(FailoverConfig {
            coordinator: self.coordinator.clone(),
            cluster: "test".into(),
            initial_role: role,
            heartbeat: Duration::from_millis(50),
            suspect_after: Duration::from_millis(300),
            after_failover: AfterFailover::Unprotected,
        });
        adjust(&mut config);
        NoHang::new(Server::start(config).expect("a node starts"))
    }
}

fn open(client: &mut RawClient, log: &str) -> Result<(u32, u64), common::Refused> {
    match client.request(RequestBody::Open {
        log: log.into(),
        codec: "msgpack".into(),
        type_tag: common::TYPE_TAG.into(),
        create: true,
        durability: None,
        schema: None,
    })? {
        ResponseBody::Opened { handle, term, .. } => Ok((handle, term)),
        other => panic!("open: {other:?}"),
    }
}

/// Opens `log` on the primary of a pair just started and waits until its stream to the standby
/// is up. A fresh pair's first primary counts as promoted (unprotected) until its standby holds
/// something: a `replicated` commit sent before the stream connects is acknowledged alone
/// (`Unprotected`), which a loaded machine made happen now and then.
fn open_on_fresh_pair(client: &mut RawClient, primary: &NoHang, log: &str) -> (u32, u64) {
    let opened = open(client, log).expect("the primary opens");
    wait_until(
        &format!("{log}'s stream to the standby"),
        Duration::from_secs(10),
        || {
            replication(primary.socket_path())
                .logs
                .iter()
                .any(|l| l.log == log && l.connected)
        },
    );
    opened
}

fn replication(socket: &Path) -> stela_proto::ReplicationStatus {
    let mut client = RawClient::connect(socket);
    match client.request(RequestBody::Status) {
        Ok(ResponseBody::Status(report)) => report.replication.expect("a replication section"),
        other => panic!("status: {other:?}"),
    }
}

fn wait_until(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn witness(dir: &Path) -> stela_coord::witness::Witness {
    stela_coord::witness::Witness::start(
        "127.0.0.1:0".parse().unwrap(),
        dir,
        Duration::from_millis(300),
    )
    .expect("the witness starts")
}

/// A witness and a pair under `root`: a started as the primary, b as its standby, and a
/// answering as the primary.
/// The nodes' log lines (info and above) go to the test's captured output: a failing test
/// shows what each node did (the threads a test starts inherit its capture).
fn show_node_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("info")
        .with_test_writer()
        .with_thread_names(true)
        .try_init();
}

fn running_pair(root: &Path) -> (stela_coord::witness::Witness, Pair, NoHang, NoHang) {
    running_pair_with(root, |_| {})
}

/// [`running_pair`], with `adjust_b` changing b's configuration last.
fn running_pair_with(
    root: &Path,
    adjust_b: impl FnOnce(&mut DaemonConfig),
) -> (stela_coord::witness::Witness, Pair, NoHang, NoHang) {
    show_node_logs();
    let witness = witness(&root.join("w"));
    let pair = Pair::new(root, witness.addr());
    let a = pair.start(0, NodeRole::Primary);
    let b = pair.start_with(1, NodeRole::Standby, adjust_b);
    wait_until("a to be the primary", Duration::from_secs(15), || {
        replication(a.socket_path()).role == "primary"
    });
    (witness, pair, a, b)
}

/// Stops the primary `a` (it goes silent: no renewal, no heartbeat) and waits until `b` is
/// promoted.
fn stop_until_promoted(a: NoHang, b: &NoHang) {
    a.shutdown().expect("a stops");
    wait_until("b to be promoted", Duration::from_secs(10), || {
        replication(b.socket_path()).role == "primary"
    });
}

/// Reads the promoted `b`'s status (one log) while its standby catches up to `last`, until it
/// says protected again or `within` passes; asserts that no read said protected while the
/// standby was behind, and that `b` is protected with the standby at `last` in the end.
/// Returns how many reads saw the standby connected and behind.
fn protected_only_once_caught_up(b: &NoHang, last: u64, within: Duration) -> usize {
    let (mut catching_up, mut protected_early) = (0, Vec::new());
    let deadline = Instant::now() + within;
    loop {
        // The node's state is read before the logs' (see `Replication::status`), so a node
        // that reads as protected shows the acknowledgement that made it so.
        let status = replication(b.socket_path());
        let log = &status.logs[0];
        if log.connected && log.received_lsn < last {
            catching_up += 1;
        }
        let protected = status.unprotected_since_ms == 0;
        if protected && log.received_lsn < last {
            protected_early.push(log.received_lsn);
        }
        if protected || Instant::now() > deadline {
            break;
        }
    }
    assert_eq!(
        protected_early,
        Vec::<u64>::new(),
        "protected again while the standby held only these LSNs of {last}"
    );
    let status = replication(b.socket_path());
    assert_eq!(status.unprotected_since_ms, 0, "protected again in time");
    assert_eq!(status.logs[0].received_lsn, last);
    catching_up
}

/// On the promoted `b`, with its standby away: appends records 10..266 of "ledger", 16 KiB
/// each (about 4 MiB: 64 KiB segments, so dozens of shipments to catch up), each at
/// `replicated` and answered by whichever policy answers without the standby: never `Ok`,
/// always `Unprotected` (issue 52: an acknowledgement that no standby holds the record is not
/// `replicated`). Returns the client (the log stays open) and the last LSN.
fn append_alone(b: &NoHang) -> (RawClient, u64) {
    let mut client = RawClient::connect(b.socket_path());
    let (handle, _) = open(&mut client, "ledger").unwrap();
    for seq in 10..266 {
        let answer = client.append(handle, Durability::Replicated, &[rec(1, seq, 16 << 10)]);
        match answer {
            Err(refused) if refused.code == ErrorCode::Unprotected => {}
            other => panic!("a replicated append without the standby answered {other:?}"),
        }
    }
    let last = client.positions(handle).last_lsn;
    (client, last)
}

/// Writes `n` records at `replicated` from `seq` on a promoted primary whose old primary has
/// not rejoined: each is appended and answered `Unprotected`, never `Ok` (issue 52). Returns
/// them: on this node alone until its standby is back.
fn write_alone(client: &mut RawClient, handle: u32, seq: u64, n: u64) -> Vec<Rec> {
    let records: Vec<Rec> = (seq..seq + n).map(|s| rec(1, s, 40)).collect();
    for record in &records {
        match client.append(handle, Durability::Replicated, std::slice::from_ref(record)) {
            Err(refused) if refused.code == ErrorCode::Unprotected => {}
            other => panic!("a replicated append without a standby answered {other:?}"),
        }
    }
    records
}

/// Writes `n` records at `replicated` from `seq`; returns them.
fn write(client: &mut RawClient, handle: u32, seq: u64, n: u64) -> Vec<Rec> {
    let records: Vec<Rec> = (seq..seq + n).map(|s| rec(1, s, 40)).collect();
    for record in &records {
        client
            .append(handle, Durability::Replicated, std::slice::from_ref(record))
            .expect("a replicated append");
    }
    records
}

#[test]
fn a_silent_primary_is_replaced_and_rejoins_as_the_standby_fetching_only_what_it_lacks() {
    let root = tempfile::tempdir().unwrap();
    let (_witness, pair, a, b) = running_pair(root.path());
    // The standby refuses clients.
    let refused = open(&mut RawClient::connect(b.socket_path()), "ledger").unwrap_err();
    assert_eq!(refused.code, ErrorCode::NotPrimary, "{refused:?}");

    let mut client = RawClient::connect(a.socket_path());
    let (handle, term) = open_on_fresh_pair(&mut client, &a, "ledger");
    assert_eq!(
        term >> 32,
        1,
        "the first primary's term is in epoch 1: {term:#x}"
    );
    let mut acked = write(&mut client, handle, 0, 200);
    drop(client);

    // The primary goes silent (it stops: no renewal, no heartbeat).
    let stopped = Instant::now();
    stop_until_promoted(a, &b);
    let status = replication(b.socket_path());
    assert_eq!(status.epoch, 2);
    let failover = status.last_failover.expect("the promotion is reported");
    assert!(failover.took_ms > 0 && failover.reason.contains("epoch 2"));
    eprintln!(
        "promoted {} ms after the primary stopped (took_ms {})",
        stopped.elapsed().as_millis(),
        failover.took_ms
    );

    // The new primary has every acknowledged record and starts a new term after them.
    let mut client = RawClient::connect(b.socket_path());
    let (handle, term) = open(&mut client, "ledger").expect("the new primary opens");
    assert_eq!(term >> 32, 2, "a new term in epoch 2: {term:#x}");
    assert_eq!(client.positions(handle).last_lsn, 200);
    // Unprotected until the old primary rejoins: replicated is answered `Unprotected`,
    // and counted.
    acked.extend(write_alone(&mut client, handle, 200, 50));
    let status = replication(b.socket_path());
    assert!(status.unprotected_since_ms > 0);
    assert!(status.logs[0].unprotected_acks >= 50, "{:?}", status.logs);
    let history = match client.request(RequestBody::History { handle }) {
        Ok(ResponseBody::History {
            entries,
            last_lsn,
            log_end,
        }) => (entries, last_lsn, log_end),
        other => panic!("history: {other:?}"),
    };
    // The history's `last_lsn` is what a second node holds (issue 52: `Kept` means protected):
    // the 50 records on b alone are not counted yet, so they resolve `NotYet`, not `Kept`; the
    // log's end says they are there (so not `Lost` either).
    assert_eq!(history.1, 200);
    assert_eq!(history.2, Some(250));
    assert_eq!(history.0.last(), Some(&(term, 201)));
    // The new primary keeps its copy for the old one from where its term began (what the old
    // primary can lack at most); the old primary's copy still has the hold it kept as primary.
    let standby_holds = |i: usize| {
        let holds = stela_wal::holds::list(&StdStorage, &pair.dirs[i].join("logs/ledger"));
        let holds = holds.unwrap().into_iter().filter(|h| h.is_standby());
        holds
            .map(|h| (h.holder.unwrap(), h.lsn.get()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        standby_holds(1),
        [(format!("standby at {}", pair.repl[0]), 201)]
    );
    assert_eq!(standby_holds(0).len(), 1, "{:?}", standby_holds(0));

    // The old primary comes back: the witness names b, so it is b's standby.
    let a = pair.start(0, NodeRole::Primary);
    assert_eq!(replication(a.socket_path()).role, "standby");
    wait_until("a to catch up", Duration::from_secs(10), || {
        let status = replication(b.socket_path());
        status.logs[0].connected && status.logs[0].received_lsn == 250
    });
    let status = replication(b.socket_path());
    assert_eq!(status.unprotected_since_ms, 0, "protected again");
    match client.request(RequestBody::History { handle }) {
        Ok(ResponseBody::History { last_lsn, .. }) => assert_eq!(last_lsn, 250),
        other => panic!("history: {other:?}"),
    }
    // Now a standby, the old primary dropped the hold it kept as a primary.
    assert_eq!(standby_holds(0), []);
    // Only the 50 records it lacked were shipped (plus at most a segment header).
    let shipped = status.logs[0].shipped_bytes;
    assert!(
        shipped < 50 * 200 + 4096,
        "reprotection shipped {shipped} bytes for 50 records"
    );
    acked.extend(write(&mut client, handle, 250, 10));
    drop(client);
    b.shutdown().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    a.shutdown().unwrap();
    for dir in &pair.dirs {
        let log = read_back(&dir.join("logs/ledger"), std::sync::Arc::new(StdStorage));
        assert_eq!(
            log,
            acked,
            "{}: every acknowledged record, in order",
            dir.display()
        );
    }
}

/// A promoted primary is protected again only once its rejoined standby holds every record
/// it acknowledged at `replicated` without one, not at the standby's first acknowledgement:
/// "protected" must mean that losing this node now loses no acknowledged record. The records
/// acknowledged alone span many segments, so the standby catches up over many shipments and
/// acknowledgements; every status read while it does must say unprotected.
#[test]
fn a_rejoined_standby_ends_unprotected_mode_only_once_it_holds_what_was_acknowledged_alone() {
    let root = tempfile::tempdir().unwrap();
    let (_witness, pair, a, b) = running_pair(root.path());
    let mut client = RawClient::connect(a.socket_path());
    let (handle, _) = open_on_fresh_pair(&mut client, &a, "ledger");
    write(&mut client, handle, 0, 10);
    drop(client);
    stop_until_promoted(a, &b);

    // About 4 MiB acknowledged by b alone.
    let (_client, last) = append_alone(&b);
    assert_eq!(replication(b.socket_path()).logs[0].unprotected_acks, 256);

    let _a = pair.start(0, NodeRole::Primary);
    let catching_up = protected_only_once_caught_up(&b, last, Duration::from_secs(20));
    eprintln!("status read {catching_up} times while the standby caught up");
}

/// `--degrade-after` on a promoted primary that is not protected again yet: once its standby
/// has been unreachable that long, `replicated` commits are answered by the degrade policy
/// (checked before the unprotected one), and what it answers is owed to the standby too. Here
/// the old primary stays down until b has degraded and acknowledged about 4 MiB that way; b
/// may say protected only once the old primary, back, holds all of it.
#[test]
fn commits_a_degraded_unprotected_primary_acknowledges_are_caught_up_before_protected() {
    let root = tempfile::tempdir().unwrap();
    let (_witness, pair, a, b) = running_pair_with(root.path(), |config| {
        config.degrade_after = Some(Duration::from_millis(200));
    });
    let mut client = RawClient::connect(a.socket_path());
    let (handle, _) = open_on_fresh_pair(&mut client, &a, "ledger");
    write(&mut client, handle, 0, 10);
    drop(client);
    stop_until_promoted(a, &b);
    wait_until("b to degrade", Duration::from_secs(10), || {
        replication(b.socket_path())
            .logs
            .first()
            .is_some_and(|log| log.degraded)
    });

    let (_client, last) = append_alone(&b);
    let status = replication(b.socket_path());
    assert!(status.unprotected_since_ms > 0, "b is not protected yet");
    // Answered by the degrade policy, not the unprotected one: this is the path under test.
    assert_eq!(status.logs[0].degraded_acks, 256);
    assert_eq!(status.logs[0].unprotected_acks, 0);

    let _a = pair.start(0, NodeRole::Primary);
    let catching_up = protected_only_once_caught_up(&b, last, Duration::from_secs(30));
    eprintln!("status read {catching_up} times while the old primary caught up");
    assert!(catching_up > 0, "the catch-up was never seen");
}

/// A promoted primary owes its standby every record it held when a log was opened on it, not
/// only what it acknowledged alone since: the old primary acknowledged those at `replicated`
/// once this node held them, but it may come back without them (a power cut took what it had
/// not synced, or its disk was restored from an older copy). Here the new primary acknowledges
/// nothing alone; the old primary comes back lacking the newest three quarters of the log (its
/// newest segment files removed while it was down). Every status read while it catches up must
/// say unprotected.
#[test]
fn an_old_primary_back_without_its_newest_records_is_caught_up_before_protected() {
    let root = tempfile::tempdir().unwrap();
    let (_witness, pair, a, b) = running_pair(root.path());
    let mut client = RawClient::connect(a.socket_path());
    let (handle, _) = open_on_fresh_pair(&mut client, &a, "ledger");
    for seq in (0..512).step_by(8) {
        let batch: Vec<Rec> = (seq..seq + 8).map(|s| rec(1, s, 16 << 10)).collect();
        client
            .append(handle, Durability::Replicated, &batch)
            .expect("a replicated append");
    }
    let last = client.positions(handle).last_lsn;
    drop(client);
    stop_until_promoted(a, &b);
    // The new primary opens the log for shipping itself (no client opens it) and appends
    // nothing.
    wait_until("b to ship ledger", Duration::from_secs(10), || {
        replication(b.socket_path()).logs.len() == 1
    });

    // The old primary loses the newest three quarters of its copy while it is down.
    let copy = pair.dirs[0].join("logs/ledger");
    let mut segments: Vec<PathBuf> = std::fs::read_dir(&copy)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "wal"))
        .collect();
    segments.sort();
    let keep = segments.len() / 4;
    assert!(keep >= 2, "{} segments", segments.len());
    for segment in &segments[keep..] {
        std::fs::remove_file(segment).unwrap();
    }

    let _a = pair.start(0, NodeRole::Primary);
    let catching_up = protected_only_once_caught_up(&b, last, Duration::from_secs(30));
    eprintln!("status read {catching_up} times while the old primary caught up");
    // Else the test proved nothing: ~6 MiB take many shipments to catch up.
    assert!(catching_up > 0, "the catch-up was never seen");
}

/// With several logs, a promoted primary is protected again only once the standby of *each*
/// log holds what that log acknowledged alone: one log's standby catching up says nothing of
/// another's. "audit" acknowledges a few small records alone and catches up at once, "ledger"
/// about 8 MiB over many segments; every status read while ledger's standby is behind must say
/// unprotected, however far audit's is.
#[test]
fn with_several_logs_the_node_is_protected_again_only_once_every_logs_standby_caught_up() {
    let root = tempfile::tempdir().unwrap();
    let (_witness, pair, a, b) = running_pair(root.path());
    let mut client = RawClient::connect(a.socket_path());
    for log in ["ledger", "audit"] {
        let (handle, _) = open_on_fresh_pair(&mut client, &a, log);
        write(&mut client, handle, 0, 5);
    }
    drop(client);
    stop_until_promoted(a, &b);

    let mut client = RawClient::connect(b.socket_path());
    let (ledger, _) = open(&mut client, "ledger").unwrap();
    for seq in (5..517).step_by(8) {
        let batch: Vec<Rec> = (seq..seq + 8).map(|s| rec(1, s, 16 << 10)).collect();
        let answer = client.append(ledger, Durability::Replicated, &batch);
        assert!(
            matches!(&answer, Err(r) if r.code == ErrorCode::Unprotected),
            "{answer:?}"
        );
    }
    let (audit, _) = open(&mut client, "audit").unwrap();
    write_alone(&mut client, audit, 5, 3);
    let last = |client: &mut RawClient, handle| client.positions(handle).last_lsn;
    let (ledger_last, audit_last) = (last(&mut client, ledger), last(&mut client, audit));
    assert!(replication(b.socket_path()).unprotected_since_ms > 0);

    let _a = pair.start(0, NodeRole::Primary);
    let (mut audit_ahead, mut protected_early) = (0, Vec::new());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        // The node's state is read before the logs' (see `Replication::status`).
        let status = replication(b.socket_path());
        let received = |name: &str| {
            let log = status.logs.iter().find(|log| log.log == name);
            log.map_or(0, |log| log.received_lsn)
        };
        let (ledger_at, audit_at) = (received("ledger"), received("audit"));
        if audit_at >= audit_last && ledger_at < ledger_last {
            audit_ahead += 1;
        }
        let protected = status.unprotected_since_ms == 0;
        if protected && (ledger_at < ledger_last || audit_at < audit_last) {
            protected_early.push((ledger_at, audit_at));
        }
        if protected || Instant::now() > deadline {
            break;
        }
    }
    eprintln!(
        "status read {audit_ahead} times while audit's standby had caught up and ledger's had not"
    );
    // Else the test proved nothing: ledger's 8 MiB take seconds to ship, audit's 3 records one
    // chunk, and both streams open within a retry (100 ms) of each other.
    assert!(
        audit_ahead > 0,
        "audit's standby never caught up before ledger's"
    );
    assert_eq!(
        protected_early,
        Vec::<(u64, u64)>::new(),
        "protected again while the standby held only these (ledger, audit) LSNs of ({ledger_last}, {audit_last})"
    );
    let status = replication(b.socket_path());
    assert_eq!(status.unprotected_since_ms, 0, "protected again in time");
}

#[test]
fn a_diverged_suffix_of_the_old_primary_is_cut_into_salvage() {
    let root = tempfile::tempdir().unwrap();
    let (_witness, pair, a, b) = running_pair(root.path());
    let mut client = RawClient::connect(a.socket_path());
    let (handle, _) = open_on_fresh_pair(&mut client, &a, "ledger");
    let mut acked = write(&mut client, handle, 0, 100);
    // The standby goes away; the primary takes five more at `disk`, which only it holds.
    b.shutdown().unwrap();
    let only_a: Vec<Rec> = (100..105).map(|s| rec(1, s, 40)).collect();
    client
        .append(handle, Durability::Disk, &only_a)
        .expect("disk needs no standby");
    drop(client);
    a.shutdown().unwrap();
    // The standby comes back alone; the primary is silent: it is promoted.
    let b = pair.start(1, NodeRole::Standby);
    wait_until("b to be promoted", Duration::from_secs(10), || {
        replication(b.socket_path()).role == "primary"
    });
    let mut client = RawClient::connect(b.socket_path());
    let (handle, _) = open(&mut client, "ledger").unwrap();
    assert_eq!(client.positions(handle).last_lsn, 100);
    acked.extend(write_alone(&mut client, handle, 1000, 20));
    // The old primary rejoins: its records 101..105 are not the new primary's; they go to
    // salvage and it takes 101..120 from b.
    let a = pair.start(0, NodeRole::Primary);
    wait_until("a to catch up", Duration::from_secs(10), || {
        let status = replication(b.socket_path());
        status.logs[0].connected && status.logs[0].received_lsn == 120
    });
    drop(client);
    b.shutdown().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    a.shutdown().unwrap();
    let storage = std::sync::Arc::new(StdStorage);
    assert_eq!(
        read_back(&pair.dirs[0].join("logs/ledger"), storage.clone()),
        acked
    );
    assert_eq!(
        read_back(&pair.dirs[1].join("logs/ledger"), storage.clone()),
        acked
    );
    let salvaged: Vec<_> = stela_wal::salvage::list(&StdStorage, &pair.dirs[0].join("salvage"))
        .expect("the salvage folder reads")
        .into_iter()
        .filter_map(|entry| entry.manifest)
        .collect();
    assert_eq!(salvaged.len(), 1, "{salvaged:?}");
    let kept = &salvaged[0];
    assert_eq!(
        (kept.cut_from_lsn, kept.last_lsn, kept.records),
        (101, 105, 5)
    );
}

#[test]
fn a_broken_link_between_primary_and_standby_alone_causes_no_failover() {
    let root = tempfile::tempdir().unwrap();
    let witness = witness(&root.path().join("w"));
    let mut pair = Pair::new(root.path(), witness.addr());
    // The primary ships to an address where nothing listens: the standby hears nothing, but
    // the primary keeps renewing with the witness.
    let real_b = pair.repl[1];
    pair.repl[1] = free_addr();
    let a = pair.start(0, NodeRole::Primary);
    pair.repl[1] = real_b;
    let b = pair.start(1, NodeRole::Standby);
    let mut client = RawClient::connect(a.socket_path());
    let (handle, _) = open(&mut client, "ledger").unwrap();
    client
        .append(handle, Durability::Buffered, &[rec(1, 1, 10)])
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(replication(b.socket_path()).role, "standby", "no failover");
    assert_eq!(replication(a.socket_path()).role, "primary");
    let status = replication(b.socket_path());
    let coordinator = status.coordinator.expect("the witness is shown");
    assert!(coordinator.reachable);
    assert_eq!(coordinator.holder.as_deref(), Some("a"));
    drop(client);
    a.shutdown().unwrap();
    b.shutdown().unwrap();
}

/// An old primary that comes back while the new primary is silent is no candidate: it missed
/// the new primary's epoch, so its copy lacks what was acknowledged in it. It stays the
/// standby until the new primary's stream reaches it, and only then may it take over. (Before,
/// it adopted the epoch from the coordinator at start and was promoted over a new primary that
/// was only slow to renew; the new primary's epoch went to salvage.)
#[test]
fn an_old_primary_that_missed_an_epoch_is_promoted_only_after_following_it() {
    let root = tempfile::tempdir().unwrap();
    let (_witness, pair, a, b) = running_pair(root.path());
    let mut client = RawClient::connect(a.socket_path());
    let (handle, _) = open_on_fresh_pair(&mut client, &a, "ledger");
    let mut acked = write(&mut client, handle, 0, 20);
    drop(client);
    a.shutdown().unwrap();
    wait_until("b to be promoted", Duration::from_secs(10), || {
        replication(b.socket_path()).role == "primary"
    });
    // Acknowledged by b alone (unprotected), in epoch 2.
    let mut client = RawClient::connect(b.socket_path());
    let (handle, _) = open(&mut client, "ledger").unwrap();
    acked.extend(write_alone(&mut client, handle, 100, 10));
    drop(client);
    // b goes silent; a comes back, named b's standby, and hears nothing from it.
    b.shutdown().unwrap();
    let a = pair.start(0, NodeRole::Primary);
    std::thread::sleep(Duration::from_millis(2000));
    let status = replication(a.socket_path());
    assert_eq!(status.role, "standby", "not promoted over epoch 2");
    assert_eq!(status.epoch, 1, "it has followed no primary of epoch 2 yet");
    let coordinator = status.coordinator.expect("the witness is shown");
    assert_eq!(
        (coordinator.epoch, coordinator.holder.as_deref()),
        (2, Some("b"))
    );
    // b comes back as the primary and, once the log is opened, ships to a, which takes
    // epoch 2 up from its stream, and both of b's terms a missed (the one b began at its
    // promotion and the one at its restart: entering the older after the stream's own was
    // refused, and a never caught up).
    let b = pair.start(1, NodeRole::Standby);
    wait_until("b to be the primary", Duration::from_secs(5), || {
        replication(b.socket_path()).role == "primary"
    });
    let mut client = RawClient::connect(b.socket_path());
    open(&mut client, "ledger").unwrap();
    wait_until("a to follow b", Duration::from_secs(10), || {
        let status = replication(b.socket_path());
        status.role == "primary"
            && status
                .logs
                .first()
                .is_some_and(|l| l.connected && l.received_lsn == 30)
    });
    assert_eq!(replication(a.socket_path()).epoch, 2);
    // Now b's silence makes a the primary, with every acknowledged record.
    drop(client);
    b.shutdown().unwrap();
    wait_until("a to be promoted", Duration::from_secs(10), || {
        replication(a.socket_path()).role == "primary"
    });
    assert_eq!(replication(a.socket_path()).epoch, 3);
    // Shut down at once: the thread a's promotion started to open every log for shipping is
    // joined by the shutdown, so no log is still being opened (and locked) when it returns
    // (it was not joined, and `read_back` below failed now and then on the lock).
    a.shutdown().unwrap();
    let log = read_back(
        &pair.dirs[0].join("logs/ledger"),
        std::sync::Arc::new(StdStorage),
    );
    assert_eq!(log, acked, "every acknowledged record, in order");
}

#[test]
fn losing_the_witness_leaves_a_healthy_pair_running() {
    let root = tempfile::tempdir().unwrap();
    let (witness, _pair, a, b) = running_pair(root.path());
    let mut client = RawClient::connect(a.socket_path());
    let (handle, _) = open_on_fresh_pair(&mut client, &a, "ledger");
    write(&mut client, handle, 0, 10);
    drop(witness);
    std::thread::sleep(Duration::from_millis(1000));
    // Still primary and standby, replicated commits still acknowledged.
    write(&mut client, handle, 10, 10);
    assert_eq!(replication(a.socket_path()).role, "primary");
    let status = replication(b.socket_path());
    assert_eq!(status.role, "standby");
    assert!(!status.coordinator.expect("shown").reachable);
    drop(client);
    a.shutdown().unwrap();
    b.shutdown().unwrap();
}

/// The same failover with etcd as the coordinator: promotion in a new epoch, every
/// acknowledged record kept, the old primary back as the standby.
#[test]
fn the_pair_fails_over_the_same_way_with_etcd() {
    let etcd = stela_testkit::Etcd::start();
    let root = tempfile::tempdir().unwrap();
    let pair = Pair::with(root.path(), etcd.coordinator_url());
    // etcd answers once it is up; the nodes start meanwhile with their configured roles.
    let probe = stela_coord::connect(
        &etcd.coordinator_url(),
        "probe",
        Duration::from_millis(300),
        None,
    )
    .unwrap();
    wait_until("etcd", Duration::from_secs(30), || probe.current().is_ok());
    let a = pair.start(0, NodeRole::Primary);
    let b = pair.start(1, NodeRole::Standby);
    wait_until("a to be the primary", Duration::from_secs(15), || {
        replication(a.socket_path()).role == "primary"
    });
    let mut client = RawClient::connect(a.socket_path());
    let (handle, term) = open(&mut client, "ledger").unwrap();
    assert_eq!(term >> 32, 1);
    let mut acked = write(&mut client, handle, 0, 100);
    drop(client);
    a.shutdown().unwrap();
    wait_until("b to be promoted", Duration::from_secs(10), || {
        replication(b.socket_path()).role == "primary"
    });
    let status = replication(b.socket_path());
    assert_eq!(status.epoch, 2);
    assert!(status.coordinator.expect("shown").describe.contains("etcd"));
    let mut client = RawClient::connect(b.socket_path());
    let (handle, term) = open(&mut client, "ledger").unwrap();
    assert_eq!(term >> 32, 2);
    assert_eq!(client.positions(handle).last_lsn, 100);
    acked.extend(write_alone(&mut client, handle, 100, 10));
    let a = pair.start(0, NodeRole::Primary);
    assert_eq!(replication(a.socket_path()).role, "standby");
    wait_until("a to catch up", Duration::from_secs(10), || {
        let status = replication(b.socket_path());
        status
            .logs
            .iter()
            .any(|l| l.connected && l.received_lsn == 110)
    });
    drop(client);
    b.shutdown().unwrap();
    a.shutdown().unwrap();
    for dir in &pair.dirs {
        let log = read_back(&dir.join("logs/ledger"), std::sync::Arc::new(StdStorage));
        assert_eq!(log, acked, "{}", dir.display());
    }
}
