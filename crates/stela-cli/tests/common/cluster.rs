//! Clusters of real processes on loopback, for the failover tests (failover_crash.rs,
//! three_nodes.rs, switchover.rs, replication_crash.rs): a `stela witness`, nodes that name it
//! as their coordinator and each other as peers, their replication status, and the ledger those
//! tests write at `replicated` and then read back from every node's copy. The record type and its
//! type tag are each test's own; everything here takes them as parameters.

use super::Daemon;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use stela_client::{Address, Connection, Resolution};
use stela_proto::{Durability, Payload, ReplicationStatus, RequestBody, ResponseBody};
use stela_wal::{Codec, Wal, WalOptions};

/// The log every failover test writes.
pub const LEDGER: &str = "ledger";

/// A free loopback address, as the text the processes' command lines take.
pub fn free_addr() -> String {
    stela_testkit::free_addr().to_string()
}

/// A `stela witness` process, killed when dropped.
pub struct Witness(Child);

impl Witness {
    /// Starts a witness on `addr` keeping its state in `dir` (`more`: its other flags, such as
    /// `--lease-ms`), and waits until it listens.
    pub fn start(dir: &Path, addr: &str, more: &[&str]) -> Witness {
        let child = Command::new(env!("CARGO_BIN_EXE_stela"))
            .args(["witness", "--listen", addr, "--dir"])
            .arg(dir)
            .args(more)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the witness");
        let witness = Witness(child);
        wait_for("the witness to listen", Duration::from_secs(20), || {
            std::net::TcpStream::connect(addr).is_ok()
        });
        witness
    }
}

impl Drop for Witness {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One node's settings: directory, name, own replication address, the others'.
pub struct Node {
    pub dir: PathBuf,
    pub name: &'static str,
    pub repl: String,
    pub peers: Vec<String>,
}

/// Nodes named `names` under `root`, each given the others as peers in the order of `names`.
pub fn nodes(root: &Path, names: &[&'static str]) -> Vec<Node> {
    let repl: Vec<String> = names.iter().map(|_| free_addr()).collect();
    names
        .iter()
        .enumerate()
        .map(|(i, &name)| Node {
            dir: root.join(name),
            name,
            repl: repl[i].clone(),
            peers: (0..names.len())
                .filter(|&j| j != i)
                .map(|j| repl[j].clone())
                .collect(),
        })
        .collect()
}

impl Node {
    /// Starts `stela serve` for this node with the witness at `witness` as its coordinator,
    /// in `role`, with `more` flags after the cluster's own.
    pub fn start(&self, witness: &str, role: &str, more: &[&str]) -> Daemon {
        self.start_on(&format!("tcp://{witness}"), role, more)
    }

    /// As [`Node::start`], on the coordinator at the URL `coordinator` (`tcp://` for a
    /// witness, `etcd://` for etcd).
    pub fn start_on(&self, coordinator: &str, role: &str, more: &[&str]) -> Daemon {
        let mut args = vec![
            "--node",
            self.name,
            "--repl-listen",
            &self.repl,
            "--coordinator",
            coordinator,
            "--role",
            role,
        ];
        for peer in &self.peers {
            args.extend_from_slice(&["--peer", peer]);
        }
        args.extend_from_slice(more);
        Daemon::start(&self.dir, &args)
    }
}

/// The replication section of the status of the daemon at `socket`.
pub fn status(socket: &Path) -> ReplicationStatus {
    let mut connection =
        Connection::connect_admin(&Address::Unix(socket.to_owned())).expect("connect for status");
    match connection.request(RequestBody::Status) {
        Ok(ResponseBody::Status(report)) => report.replication.expect("a replication section"),
        other => panic!("status: {other:?}"),
    }
}

/// Polls `done` every 10 ms; fails the test after `within`.
pub fn wait_for(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Sends `signal` (STOP, CONT, ...) to the daemon with `kill`, without waiting for it.
pub fn signal(daemon: &Daemon, signal: &str) {
    let sent = Command::new("kill")
        .args([&format!("-{signal}"), &daemon.pid()])
        .status()
        .unwrap();
    assert!(sent.success(), "kill -{signal}");
}

/// Opens the ledger (records of `type_tag`) on the daemon `connection` speaks to: the handle
/// and its term.
pub fn open_ledger(
    connection: &mut Connection,
    type_tag: &str,
) -> Result<(u32, u64), stela_client::Error> {
    match connection.request(RequestBody::Open {
        log: LEDGER.into(),
        codec: "msgpack".into(),
        type_tag: type_tag.into(),
        create: true,
        durability: None,
        schema: None,
    })? {
        ResponseBody::Opened { handle, term, .. } => Ok((handle, term)),
        other => panic!("open: {other:?}"),
    }
}

/// Appends `records` at `replicated` one by one, entering each acknowledged one at its LSN in
/// `acked`; stops at the first failure (the daemon died).
pub fn append_replicated<R: Serialize>(
    connection: &mut Connection,
    handle: u32,
    records: impl IntoIterator<Item = R>,
    acked: &mut BTreeMap<u64, R>,
) -> Result<(), stela_client::Error> {
    for record in records {
        let payload = Codec::MessagePack.encode(&record).unwrap();
        match connection.request(RequestBody::Append {
            handle,
            durability: Durability::Replicated,
            records: vec![Payload(payload)],
        })? {
            ResponseBody::Appended { last_lsn, .. } => {
                acked.insert(last_lsn, record);
            }
            other => panic!("append: {other:?}"),
        }
    }
    Ok(())
}

/// The records of the ledger copy under `dir` (its daemon stopped), in LSN order. Checked:
/// LSNs contiguous from 1, every record one that was sent (`sent`), and every acknowledged
/// record of `acked` there at its LSN.
pub fn check_ledger<R>(
    dir: &Path,
    type_tag: &str,
    acked: &BTreeMap<u64, R>,
    whose: &str,
    sent: impl Fn(&R) -> bool,
) -> Vec<R>
where
    R: Serialize + DeserializeOwned + Send + Sync + PartialEq + Debug + 'static,
{
    let wal: Wal<R> = Wal::open(
        dir.join("logs").join(LEDGER),
        WalOptions::default()
            .codec(Codec::MessagePack)
            .type_tag(type_tag)
            .create_if_missing(false),
    )
    .unwrap_or_else(|e| panic!("{whose}'s copy does not open as a log: {e}"));
    let mut held = Vec::new();
    for item in wal.iter().unwrap() {
        let (lsn, record) = item.unwrap_or_else(|e| panic!("{whose}'s copy: {e}"));
        assert_eq!(
            lsn.get(),
            held.len() as u64 + 1,
            "{whose}: LSNs contiguous from 1"
        );
        assert!(sent(&record), "{whose}: a record never sent: {record:?}");
        held.push(record);
    }
    for (lsn, record) in acked {
        assert_eq!(
            held.get(*lsn as usize - 1),
            Some(record),
            "{whose}: LSN {lsn} was acknowledged at replicated and is not there"
        );
    }
    held
}

/// What a committer got, each commit with the term and LSN the client knew it by:
/// acknowledged, in doubt, and answered `Unprotected` (on one node alone).
pub struct Outcomes<R> {
    pub acked: Vec<(u64, u64, R)>,
    pub doubtful: Vec<(u64, u64, R)>,
    pub alone: Vec<(u64, u64, R)>,
}

impl<R> Default for Outcomes<R> {
    fn default() -> Self {
        Outcomes {
            acked: Vec::new(),
            doubtful: Vec::new(),
            alone: Vec::new(),
        }
    }
}

impl<R> Outcomes<R> {
    /// Files the answer to a `replicated` commit of `record`, appended at (`term`, `lsn`).
    /// In doubt and `Unprotected` answers carry the term and LSN the daemon reported; any
    /// other failure fails the test.
    pub fn file(
        &mut self,
        answer: Result<(), stela_client::Error>,
        term: u64,
        lsn: u64,
        record: R,
    ) {
        match answer {
            Ok(()) => self.acked.push((term, lsn, record)),
            Err(stela_client::Error::InDoubt {
                term,
                lsn: Some(lsn),
                ..
            }) => self.doubtful.push((term, lsn.get(), record)),
            Err(stela_client::Error::Unprotected {
                term: at_term,
                lsn: Some(at),
                ..
            }) => {
                assert_eq!(
                    (at_term, at.get()),
                    (term, lsn),
                    "Unprotected names the commit"
                );
                self.alone.push((term, lsn, record));
            }
            Err(error) => panic!("a commit failed other than in doubt or alone: {error}"),
        }
    }

    pub fn extend(&mut self, other: Outcomes<R>) {
        self.acked.extend(other.acked);
        self.doubtful.extend(other.doubtful);
        self.alone.extend(other.alone);
    }

    /// The acknowledged records by LSN, as [`check_ledger`] takes them.
    pub fn acked_by_lsn(&self) -> BTreeMap<u64, R>
    where
        R: Clone,
    {
        self.acked
            .iter()
            .map(|(_, lsn, record)| (*lsn, record.clone()))
            .collect()
    }
}

/// Each commit in doubt, settled (LSN, record, resolution), agrees with the log `held`: decided
/// (never `NotYet`), and `Kept` exactly when the log holds the record at its LSN.
pub fn check_resolutions<R: PartialEq>(held: &[R], settled: &[(u64, R, Resolution)]) {
    for (lsn, record, outcome) in settled {
        assert_ne!(
            *outcome,
            Resolution::NotYet,
            "an appended record is decided by now"
        );
        let there = held.get(*lsn as usize - 1) == Some(record);
        assert_eq!(
            there,
            *outcome == Resolution::Kept,
            "LSN {lsn} resolved {outcome:?} but the log {} it",
            if there { "holds" } else { "does not hold" }
        );
    }
}
