//! Issue 52, failure 4: a black-holed link between primary and standby used to be invisible.
//! The stream stayed "connected" in `stela status` for the whole fault (TCP retransmits with
//! backoff, and nothing checked the standby's side), and after the fault healed `replicated`
//! commits waited for TCP's next retransmission, seconds later. Now both ends heartbeat the
//! stream and each has a deadline: the primary tears a silent stream down and opens it again,
//! and its status says the standby is not (or no longer really) connected.
//!
//! Real processes in network namespaces this test creates (needs root: it fails, naming the
//! reason, where `ip netns add` fails). Nothing here asserts on timing: the waits are liveness
//! bounds; the time from the heal to the first commit is printed, and measured in
//! `stela-bench failover --kinds partition-pair`.

use std::path::PathBuf;
use std::time::{Duration, Instant};
use stela_bench::failover::cluster::{self, log_replica, role, Client, Cluster, Role, Timing};
use stela_bench::failover::events::mono_ms;
use stela_bench::failover::topology::{Host, Topology};

fn stela() -> PathBuf {
    stela_bench::netns::sibling("stela")
        .or_else(|_| {
            // The test binary sits in target/debug/deps; the daemon beside stela-bench.
            let bench = PathBuf::from(env!("CARGO_BIN_EXE_stela-bench"));
            let stela = bench.with_file_name("stela");
            if stela.exists() {
                Ok(stela)
            } else {
                Err(anyhow::anyhow!(
                    "{} not found: cargo build -p stela first",
                    stela.display()
                ))
            }
        })
        .unwrap()
}

fn wait(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A running pair in namespaces of its own, with a client committing at `replicated`.
struct Pair {
    // Dropped in this order: the client, the daemons, then the network.
    client: Client,
    cluster: Cluster,
    topology: Topology,
    stela: PathBuf,
    _base: tempfile::TempDir,
}

/// One topology at a time: its namespaces are named after this process.
static NETWORK: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl Pair {
    fn start() -> Pair {
        Pair::start_suspecting_after(300)
    }

    /// With the standby's suspicion (and the witness's lease) at `suspect_after_ms`.
    fn start_suspecting_after(suspect_after_ms: u64) -> Pair {
        let base = tempfile::tempdir().unwrap();
        let topology = Topology::create().expect("network namespaces (run as root)");
        let timing = Timing {
            heartbeat_ms: 50,
            suspect_after_ms,
            lease_ms: suspect_after_ms,
            replicas: 1,
            coordinator: cluster::CoordinatorKind::Witness,
        };
        let security = cluster::Security::create(&base.path().join("tls")).unwrap();
        let stela = stela();
        let mut cluster = Cluster::new(
            stela.clone(),
            &topology,
            base.path(),
            &timing,
            Some(&security),
        );
        cluster.witness.start(&stela, &topology).unwrap();
        cluster.nodes[0]
            .start(&stela, &topology, Role::Primary)
            .unwrap();
        cluster.nodes[1]
            .start(&stela, &topology, Role::Standby)
            .unwrap();
        wait("a to be the primary", Duration::from_secs(30), || {
            cluster.nodes[0]
                .status()
                .is_some_and(|s| role(&s) == "primary")
        });
        let endpoints = format!(
            "tls://{}:{port},tls://{}:{port}",
            topology.address(Host::Primary),
            topology.address(Host::Standby),
            port = cluster::CLIENT_PORT
        );
        let args: Vec<String> = [
            "failover-client",
            "--endpoints",
            &endpoints,
            "--tls-ca",
            &security.cert.display().to_string(),
            "--server-name",
            cluster::SERVER_NAME,
            "--token-file",
            &security.client_token.display().to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let me = PathBuf::from(env!("CARGO_BIN_EXE_stela-bench"));
        let mut client = Client::start(&me, &topology, base.path(), &args).unwrap();
        client.wait_for_ack(Duration::from_secs(30)).unwrap();
        let pair = Pair {
            client,
            cluster,
            topology,
            stela,
            _base: base,
        };
        wait("the stream to be up", Duration::from_secs(10), || {
            let r = pair.replica();
            r.connected && !r.stalled
        });
        pair
    }

    /// The primary's (node a's) view of the client's log's stream.
    fn replica(&self) -> stela_proto::ReplicaStatus {
        self.cluster.nodes[0]
            .status()
            .and_then(|s| log_replica(&s).cloned())
            .expect("the primary ships the client's log")
    }

    /// With the link cut (by the caller): within a few deadlines the primary's status stops
    /// saying the standby is connected (it is stalled, or its stream was torn down and is being
    /// opened again), `stela status` exits 3, and no failover happens (both nodes reach the
    /// witness).
    fn sees_the_cut(&self) {
        wait(
            "the primary's status to see the stalled link",
            Duration::from_secs(5),
            || {
                let r = self.replica();
                r.stalled || !r.connected
            },
        );
        let shown = std::process::Command::new(&self.stela)
            .args(["status", "--socket"])
            .arg(self.cluster.nodes[0].dir.join("stela.sock"))
            .output()
            .unwrap();
        assert_eq!(
            shown.status.code(),
            Some(3),
            "stela status must say unhealthy: {}",
            String::from_utf8_lossy(&shown.stdout)
        );
        std::thread::sleep(Duration::from_millis(1500));
        assert_eq!(
            self.cluster.primary().map(|(i, _)| i),
            Some(0),
            "no failover: both nodes reach the witness"
        );
    }

    /// With the link healed (by the caller): the stream is opened again and `replicated`
    /// commits are acknowledged again.
    fn recovers(mut self) {
        let healed_ms = mono_ms();
        let healed = Instant::now();
        wait(
            "a replicated commit after the heal",
            Duration::from_secs(20),
            || self.client.acked_since(healed_ms),
        );
        eprintln!(
            "first replicated acknowledgement {} ms after the heal",
            healed.elapsed().as_millis()
        );
        wait(
            "the stream to be healthy again",
            Duration::from_secs(10),
            || {
                let r = self.replica();
                r.connected && !r.stalled
            },
        );
        self.client.stop().unwrap();
    }
}

#[test]
fn a_black_holed_link_is_seen_torn_down_and_reopened_once_it_heals() {
    let _one = NETWORK.lock().unwrap_or_else(|e| e.into_inner());
    let pair = Pair::start();
    pair.topology
        .set_blackhole(Host::Primary, Host::Standby, true)
        .unwrap();
    pair.sees_the_cut();
    pair.topology
        .set_blackhole(Host::Primary, Host::Standby, false)
        .unwrap();
    pair.recovers();
}

/// One way only: the standby's packets to the primary are dropped (its acknowledgements are
/// lost, the primary's chunks and heartbeats still arrive).
#[test]
fn a_one_way_link_is_seen_torn_down_and_reopened_once_it_heals() {
    let _one = NETWORK.lock().unwrap_or_else(|e| e.into_inner());
    let pair = Pair::start();
    let primary = pair.topology.address(Host::Primary).to_string();
    let standby_ns = pair.topology.namespace(Host::Standby).name().to_owned();
    let rule = |verb: &str| {
        stela_bench::netns::run(
            "ip",
            &[
                "netns",
                "exec",
                &standby_ns,
                "iptables",
                "-w",
                verb,
                "OUTPUT",
                "-d",
                &primary,
                "-j",
                "DROP",
            ],
        )
        .expect("iptables in the standby's namespace (Debian's iptables package)")
    };
    rule("-A");
    pair.sees_the_cut();
    rule("-D");
    pair.recovers();
}

/// The standby's side of the deadline: the primary stops (SIGSTOP) and, with a suspicion long
/// enough that no failover happens, the standby's stream from it ends within a few deadlines
/// (over TLS, whose own I/O thread a socket read timeout does not reach), so the log is free
/// for the primary's next stream once it resumes.
#[test]
fn a_silent_primary_is_seen_by_the_standby_which_ends_the_stream() {
    let _one = NETWORK.lock().unwrap_or_else(|e| e.into_inner());
    let mut pair = Pair::start_suspecting_after(60_000);
    let on_standby = |pair: &Pair| {
        pair.cluster.nodes[1]
            .status()
            .and_then(|s| log_replica(&s).cloned())
    };
    assert!(on_standby(&pair).is_some_and(|r| r.connected));
    pair.cluster.nodes[0]
        .signal(rustix::process::Signal::STOP)
        .unwrap();
    wait(
        "the standby to end the silent primary's stream",
        Duration::from_secs(5),
        || on_standby(&pair).is_none_or(|r| !r.connected),
    );
    pair.cluster.nodes[0]
        .signal(rustix::process::Signal::CONT)
        .unwrap();
    pair.recovers();
}
