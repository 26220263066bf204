//! `stela-bench failover`: availability under faults, after RemusDB's failover experiments
//! (its Figures 5 to 7). A witness and two or three (`--nodes`) `stela serve` nodes with
//! automatic failover run in network namespaces of their own, a client commits at `replicated`
//! without pause to the endpoint list of every node, and faults are injected in turn; after
//! each, the old primary (or whatever was hit) is brought back and the cluster reprotected (every
//! standby caught up) before the next. A fault aimed at "the standby" hits one of the standbys,
//! chosen by the seed. Reported per
//! fault: the downtime seen by the client, acknowledgements, commits in doubt, records lost,
//! acknowledgements from a deposed primary, failovers, the bytes shipped to reprotect, and for
//! the faults that must not fail over, the longest blocked commit. Clients and replication run
//! over TLS (the daemon serves plain TCP on loopback only; see [`cluster`]). Needs root.
//!
//! - [`topology`]: the namespaces, the bridge, and the network faults.
//! - [`cluster`]: the processes (witness, nodes, client), signals, restarts, status.
//! - [`client`]: the hidden `stela-bench failover-client`, the client's loop.
//! - [`events`]: the client's event lines, its records, the shared clock.
//! - [`analysis`]: from the events, each fault's figures (pure).
//! - [`verify`]: the final logs read back and checked against the acknowledgements.
//! - [`overlap`]: issue 52's kinds (silent links, overlapping process faults) and the watch
//!   for two primaries of one epoch.
//! - [`terms`]: one primary per epoch as the nodes' and the witness's logs tell it.
//! - [`chart`]: the SVG.
//!
//! This module owns the sequence: build, start, for each fault inject / undo / restart /
//! wait until protected, then stop everything cleanly, read the logs, report.

pub mod analysis;
pub mod chart;
pub mod client;
pub mod cluster;
pub mod events;
pub mod overlap;
pub mod terms;
pub mod topology;
pub mod verify;

use crate::netns::{pause, poll_within, sibling, wait_within};
use analysis::FaultWindow;
use anyhow::Context;
use cluster::{
    epoch, every_standby_holds_all, fully_protected, log_positions, role, shipped_to, tail, Client,
    Cluster, Role, Timing,
};
use events::{mono_ms, LOG};
use rustix::process::Signal;
use serde::Serialize;
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;
use topology::Topology;

/// The kinds of fault, injected in this order (cycling) unless `--kinds` says otherwise.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// SIGKILL of the primary; restarted once the standby took over (it rejoins as standby).
    KillPrimary,
    /// SIGSTOP of the primary for the fault's length, then SIGCONT: it must find itself in an
    /// old epoch and exit 75 by itself; then restarted.
    StopPrimary,
    /// The primary's interface down (cut off from everyone) for the fault's length: it must
    /// step down and exit 75 once the link is back; then restarted.
    IsolatePrimary,
    /// Primary and standby cannot reach each other (blackhole routes both ways); both still
    /// reach the witness and the client. No failover.
    PartitionPair,
    /// Loss 20 % and delay 20 ms on the standby's link, both directions, by netem (or by
    /// netfilter on a kernel without netem). No failover.
    LossyStandby,
    /// SIGKILL of the standby, restarted after the fault's length. No failover.
    KillStandby,
    /// SIGKILL of the witness, restarted after the fault's length: the pair runs on. No
    /// failover.
    KillWitness,
    /// The primary's packets to the standby dropped silently (an iptables rule on the
    /// standby's input), the other way untouched, for the fault's length. No failover.
    Asym,
    /// The pair's link dropped silently both ways (iptables on both inputs: no reset, no
    /// unreachable), both still reach the witness and the client, for the fault's length. No
    /// failover.
    BlackHole,
    /// SIGKILL of the primary; once the standby is promoted, SIGKILL of the new primary too;
    /// then both started again with their configured roles, as `Restart=on-failure` would.
    KillThenKillNew,
    /// SIGKILL of the primary; once the standby is promoted, SIGSTOP of the new primary for 2
    /// to 5 s (seeded), while the old one is started again with its configured role; then
    /// SIGCONT.
    PauseNew,
    /// SIGKILL of the primary; after the promotion, SIGKILL of the witness, the old primary
    /// started again with its configured role while the witness is down (it must come up a
    /// standby, never a second primary), for the fault's length; then the witness restarted.
    WitnessDownRestartOld,
    /// Three nodes only: SIGKILL of one standby, then (once the primary has noticed, a
    /// suspicion period later) of the primary, for the fault's length: the node left alone
    /// can gather no majority of promises (N - K = 2 with K = 1), so no primary may be
    /// elected and no commit begun meanwhile acknowledged (commits block; none is lost).
    /// Then the standby is started again (the two elect), then the old primary.
    KillStandbyThenPrimary,
    /// Three nodes only: SIGKILL of both standbys for the fault's length: the primary, alone,
    /// has no standby to hold a record, so no commit begun meanwhile may be acknowledged
    /// (`replicated` waits for K = 1 standby). Then both started again. No failover.
    KillStandbys,
    /// Not a fault: a planned `stela cluster switchover` to the standby, run as an operator
    /// would; the old primary steps down (exit 75) and is restarted, as `Restart=on-failure`
    /// would. Only with `--kinds switchover` (not in the default cycle, so the default
    /// schedules of earlier runs repeat from their seeds).
    Switchover,
}

impl FaultKind {
    pub const ALL: [FaultKind; 14] = [
        FaultKind::KillPrimary,
        FaultKind::StopPrimary,
        FaultKind::IsolatePrimary,
        FaultKind::PartitionPair,
        FaultKind::LossyStandby,
        FaultKind::KillStandby,
        FaultKind::KillWitness,
        FaultKind::Asym,
        FaultKind::BlackHole,
        FaultKind::KillThenKillNew,
        FaultKind::PauseNew,
        FaultKind::WitnessDownRestartOld,
        FaultKind::KillStandbyThenPrimary,
        FaultKind::KillStandbys,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::KillPrimary => "kill-primary",
            FaultKind::StopPrimary => "stop-primary",
            FaultKind::IsolatePrimary => "isolate-primary",
            FaultKind::PartitionPair => "partition-pair",
            FaultKind::LossyStandby => "lossy-standby",
            FaultKind::KillStandby => "kill-standby",
            FaultKind::KillWitness => "kill-witness",
            FaultKind::Asym => "asym",
            FaultKind::BlackHole => "black-hole",
            FaultKind::KillThenKillNew => "kill-then-kill-new",
            FaultKind::PauseNew => "pause-new",
            FaultKind::WitnessDownRestartOld => "witness-down-restart-old",
            FaultKind::KillStandbyThenPrimary => "kill-standby-then-primary",
            FaultKind::KillStandbys => "kill-standbys",
            FaultKind::Switchover => "switchover",
        }
    }

    /// Whether the kind needs three nodes (with two it would take both down at once).
    pub fn needs_three(self) -> bool {
        matches!(
            self,
            FaultKind::KillStandbyThenPrimary | FaultKind::KillStandbys
        )
    }

    /// One fault at a time (not overlapping): the kinds the availability targets hold for.
    pub fn is_single(self) -> bool {
        !matches!(
            self,
            FaultKind::KillThenKillNew
                | FaultKind::PauseNew
                | FaultKind::WitnessDownRestartOld
                | FaultKind::KillStandbyThenPrimary
                | FaultKind::KillStandbys
        )
    }

    pub fn expects_failover(self) -> bool {
        matches!(
            self,
            FaultKind::KillPrimary
                | FaultKind::StopPrimary
                | FaultKind::IsolatePrimary
                | FaultKind::KillThenKillNew
                | FaultKind::PauseNew
                | FaultKind::WitnessDownRestartOld
                | FaultKind::KillStandbyThenPrimary
                | FaultKind::Switchover
        )
    }

    /// The kinds of issue 52: overlapping faults and silent links, run by
    /// [`inject_overlapping`], restarting whatever exits as a service manager would.
    fn is_overlapping(self) -> bool {
        matches!(
            self,
            FaultKind::Asym
                | FaultKind::BlackHole
                | FaultKind::KillThenKillNew
                | FaultKind::PauseNew
                | FaultKind::WitnessDownRestartOld
                | FaultKind::KillStandbyThenPrimary
                | FaultKind::KillStandbys
        )
    }
}

/// Arguments of `stela-bench failover`.
#[derive(clap::Args, Debug, Clone)]
pub struct FailoverArgs {
    /// Nodes in the cluster: 2 (a pair) or 3 (each started with the other two as --peer).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u8).range(2..=3))]
    pub nodes: u8,
    /// The nodes' --replicas (K, standbys that must hold a `replicated` record) with three
    /// nodes; a pair has one standby.
    #[arg(long, default_value_t = 1)]
    pub replicas: usize,
    /// Faults to inject, one after the other, cycling through --kinds (default: one of each).
    #[arg(long)]
    pub faults: Option<usize>,
    /// The kinds of fault, in order (comma list; default all, those needing three nodes left
    /// out of a run of two).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = FaultKind::ALL)]
    pub kinds: Vec<FaultKind>,
    /// How long a fault lasts where it has a length (stop, link down, partition, netem, a
    /// stopped standby or witness).
    #[arg(long, default_value_t = 2000)]
    pub fault_ms: u64,
    /// Steady running before each fault and after the last.
    #[arg(long, default_value_t = 1000)]
    pub settle_ms: u64,
    /// Filler bytes per record.
    #[arg(long, default_value_t = 100)]
    pub record_bytes: usize,
    /// The nodes' --heartbeat-ms.
    #[arg(long, default_value_t = 50)]
    pub heartbeat_ms: u64,
    /// The nodes' --suspect-after-ms.
    #[arg(long, default_value_t = 300)]
    pub suspect_after_ms: u64,
    /// The witness's --lease-ms.
    #[arg(long, default_value_t = 300)]
    pub lease_ms: u64,
    /// The client's `probe_after`: how long a request waits before the client asks the other
    /// node whether a newer primary has taken over.
    #[arg(long, default_value_t = 250)]
    pub probe_after_ms: u64,
    /// Plain TCP for the clients and the replication stream (`--tcp-insecure --repl-insecure`)
    /// instead of TLS. Today's daemon refuses `--tcp-insecure` off loopback, so the nodes do
    /// not start; this is for a daemon that accepts it inside a private network.
    #[arg(long)]
    pub plain_tcp: bool,
    /// Seeds the choices the faults make (pause-new's pause length; with three nodes, the
    /// standby a fault hits); default: from the clock.
    /// Printed with the results, so a run can be repeated in the same order and lengths.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Print only the JSON lines (one per fault, then the summary).
    #[arg(long)]
    pub json: bool,
    /// Save an SVG chart of acknowledged commits per 100 ms, faults marked, to PATH.
    #[arg(long, value_name = "PATH")]
    pub chart: Option<PathBuf>,
    /// Keep the nodes' directories, the processes' logs and the client's events here (must be
    /// new or empty); default a temporary directory, kept only if the run fails.
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

/// One fault's line of results.
#[derive(Debug, Clone, Serialize)]
pub struct FaultRow {
    pub fault: &'static str,
    /// Injection to the first acknowledgement of a commit begun after it (0 for the faults
    /// that must not fail over; null if none came).
    pub downtime_ms: Option<f64>,
    /// Injection to protected again (the cluster whole: every standby connected and caught up).
    pub recovered_ms: f64,
    /// The longest time without an acknowledgement, from the injection to the next fault.
    pub unavailable_ms: f64,
    pub acked: u64,
    /// Commits answered `Unprotected` (then asked again until acknowledged or in doubt).
    pub unprotected: u64,
    pub in_doubt: u64,
    /// Of the commits in doubt in this fault: resolved `Kept`, resolved `Lost`, and resolved
    /// against what the final log holds (Kept absent or Lost present).
    pub resolved_kept: u64,
    pub resolved_lost: u64,
    pub resolution_wrong: u64,
    pub lost: u64,
    /// Acknowledgements in an older term after a newer one, or in one term by two nodes, plus
    /// samples of both nodes' status naming both primary of one epoch, plus (for
    /// witness-down-restart-old) samples of the restarted old primary saying it is primary.
    pub double_primary: u64,
    /// Commits begun while at most one node was up and acknowledged before a second came back
    /// (kill-then-kill-new, kill-standby-then-primary: no majority to elect a primary;
    /// kill-standbys, and kill-standby of a pair: a primary with no standby to hold a record);
    /// must be 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acked_alone: Option<u64>,
    /// kill-standby-then-primary: status samples of the node left alone saying it is primary
    /// (must be 0: one node of three is no majority).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alone_primary: Option<u64>,
    /// Epochs the cluster went through during the fault (each is one promotion).
    pub failovers: u64,
    /// The faults that must not fail over: the longest wait of a `replicated` commit waiting
    /// at some moment during the fault.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blocked_ms: Option<f64>,
    /// What the primary shipped to the node that rejoins or was hit (to every standby for the
    /// overlapping kinds) from its restart (or the end of the fault) until it was caught up:
    /// its status's `shipped_bytes`, summed over logs, after minus before (all of it for a log shipped in a new term since; live records shipped
    /// meanwhile included). Null if the primary changed in between.
    pub reprotect_bytes: Option<u64>,
    /// What reprotection had to move, in the same frame bytes: the standby's records past its
    /// common prefix with the primary when the fault ended (diverged: cut, not shipped) plus
    /// the primary's past it up to its last LSN once protected (missing, live records
    /// included). `reprotect_bytes` may be at most 1.05 times this (issue 9). Only for the
    /// faults after which a node rejoins (its log read while it is down); null for a standby
    /// that stayed up, and when `reprotect_bytes` is null. The primary's last LSN may name a
    /// record or two not yet shipped when it reported, so this can exceed what had to go by
    /// those.
    pub reprotect_need_bytes: Option<u64>,
    /// The size of the client's log once protected again: its frames (header and record) up
    /// to the primary's last LSN then, counted from the final log (the files themselves are
    /// preallocated whole segments).
    pub log_bytes: u64,
    /// stop-primary and isolate-primary: the deposed primary's exit status (75 expected; null
    /// if it did not exit by itself within 10 s).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub old_primary_exit: Option<Option<i32>>,
    /// lossy-standby: how the link was made lossy and slow, "netem" or, on a kernel without
    /// it, "netfilter" (the same loss and delay by iptables and a netfilter queue).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub impairment: Option<&'static str>,
}

/// Per kind of fault, over the run.
#[derive(Debug, Clone, Serialize)]
pub struct KindRow {
    pub kind: &'static str,
    pub faults: usize,
    /// Write unavailability ([`FaultRow::unavailable_ms`]): nearest-rank p50, p99, max.
    pub unavailable_p50_ms: Option<f64>,
    pub unavailable_p99_ms: Option<f64>,
    pub unavailable_max_ms: Option<f64>,
    pub acked: u64,
    pub unprotected: u64,
    pub in_doubt: u64,
    pub resolved_kept: u64,
    pub resolved_lost: u64,
    pub resolution_wrong: u64,
    pub lost: u64,
    pub double_primary: u64,
}

/// The closing line.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub summary: bool,
    /// What seeded the faults' choices (`--seed` repeats them).
    pub seed: u64,
    pub faults: usize,
    /// Over the faults that fail over: downtime percentiles (nearest rank) and maximum.
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub max_ms: Option<f64>,
    pub acked: u64,
    /// Commits answered `Unprotected` at least once.
    pub unprotected: u64,
    pub in_doubt: u64,
    pub resolved_kept: u64,
    pub resolved_lost: u64,
    /// Commits in doubt never settled (the client gives up 5 s after it is told to stop).
    pub unresolved: u64,
    /// Acknowledged records not at their LSN in the final primary's log (all of the run,
    /// including before the first fault).
    pub lost: u64,
    pub double_primary: u64,
    /// Commits in doubt whose resolution the final log contradicts: Kept absent, Lost present.
    pub resolution_wrong: u64,
    pub kept_absent: u64,
    pub lost_present: u64,
    /// Status samples in which two nodes said they were primary of one epoch.
    pub double_primary_status: u64,
    /// Epochs the nodes' and the witness's logs give more than one holder ([`terms`]).
    pub double_primary_logs: u64,
    /// Commits acknowledged while at most one node was up (see [`FaultRow::acked_alone`]).
    pub acked_alone: u64,
    /// Nodes in the cluster.
    pub nodes: usize,
    /// Per node: acknowledged records its final log does not hold at their LSN (after the
    /// run every standby is caught up before it is stopped, so each must hold all of them),
    /// and LSNs it holds with another record than the final primary (null: unreadable).
    pub node_checks: Vec<NodeCheck>,
    /// Status samples in which an old primary restarted while the witness was down said it
    /// was primary.
    pub old_came_up_primary: u64,
    /// Status samples in which the one node left up of three (kill-standby-then-primary) said
    /// it was primary: no majority elected it.
    pub alone_primary: u64,
    /// Per kind of fault.
    pub kinds: Vec<KindRow>,
    /// LSNs the final standby holds with another record than the primary (null: its log could
    /// not be read).
    pub standby_mismatch: Option<u64>,
    /// The largest `reprotect_bytes / reprotect_need_bytes` over the faults that have both
    /// (target: at most 1.05).
    pub reprotect_over_need: Option<f64>,
}

/// One node's final log against the acknowledgements and the final primary's log.
#[derive(Debug, Clone, Serialize)]
pub struct NodeCheck {
    pub node: &'static str,
    pub primary: bool,
    pub acked_missing: Option<u64>,
    pub mismatch: Option<u64>,
}

/// What the run recorded of one fault.
#[derive(Debug, Clone)]
struct FaultRun {
    kind: FaultKind,
    start_ms: f64,
    inject_ms: f64,
    restore_ms: f64,
    recovered_ms: f64,
    epoch_before: u64,
    epoch_after: u64,
    reprotect_bytes: Option<u64>,
    /// Diverged plus missing bytes (see [`FaultRow::reprotect_need_bytes`]).
    reprotect_need: Option<u64>,
    /// The primary's last LSN of the client's log once protected again.
    log_lsn: u64,
    old_primary_exit: Option<Option<i32>>,
    /// witness-down-restart-old: samples of the restarted old primary saying it is primary.
    old_came_up_primary: u64,
    /// kill-standby-then-primary: samples of the node left alone saying it is primary.
    alone_primary: u64,
    /// kill-then-kill-new, kill-standby-then-primary: from when at most one node was up to
    /// when a second was started again.
    alone: Option<(f64, f64)>,
}

/// How long a failover, a step-down and a reprotection may take before the run says so.
const FAILOVER_WAIT: Duration = Duration::from_secs(10);
const STEP_DOWN_WAIT: Duration = Duration::from_secs(10);
const PROTECT_WAIT: Duration = Duration::from_secs(60);

/// Runs the benchmark, printing to `out`.
///
/// # Errors
/// Not root, a process that does not start, a pair
/// that is not protected again within a minute, logs that cannot be read.
pub fn run(args: &FailoverArgs, out: &mut dyn Write) -> anyhow::Result<(Vec<FaultRow>, Summary)> {
    anyhow::ensure!(args.faults != Some(0), "--faults must be at least 1");
    anyhow::ensure!(
        !kinds_of(args).is_empty(),
        "--kinds names no fault for {} nodes",
        args.nodes
    );
    anyhow::ensure!(
        args.replicas >= 1 && args.replicas < usize::from(args.nodes),
        "--replicas must be between 1 and the standbys ({})",
        args.nodes - 1
    );
    crate::netns::stop_on_signals()?;
    let stela = sibling("stela")?;
    let me = std::env::current_exe()?;
    match &args.dir {
        Some(dir) => {
            if dir.exists() {
                anyhow::ensure!(
                    std::fs::read_dir(dir)?.next().is_none(),
                    "{} is not empty; choose a new --dir",
                    dir.display()
                );
            }
            std::fs::create_dir_all(dir)?;
            run_in(args, &stela, &me, dir, out)
        }
        None => {
            let temp = tempfile::Builder::new()
                .prefix("stela-failover-")
                .tempdir()?;
            let result = run_in(args, &stela, &me, temp.path(), out);
            if result.is_err() {
                let kept = temp.keep();
                eprintln!(
                    "stela-bench failover: the run's directories and logs are kept in {}",
                    kept.display()
                );
            }
            result
        }
    }
}

/// The kinds this run injects, in order: `--kinds` less those needing more nodes than it has.
fn kinds_of(args: &FailoverArgs) -> Vec<FaultKind> {
    args.kinds
        .iter()
        .copied()
        .filter(|k| args.nodes >= 3 || !k.needs_three())
        .collect()
}

fn run_in(
    args: &FailoverArgs,
    stela: &Path,
    me: &Path,
    base: &Path,
    out: &mut dyn Write,
) -> anyhow::Result<(Vec<FaultRow>, Summary)> {
    // Dropped in reverse: the client, the daemons, then the network.
    let topology = Topology::create_for(args.nodes.into())?;
    let timing = Timing {
        heartbeat_ms: args.heartbeat_ms,
        suspect_after_ms: args.suspect_after_ms,
        lease_ms: args.lease_ms,
        replicas: args.replicas,
    };
    let security = if args.plain_tcp {
        None
    } else {
        Some(cluster::Security::create(&base.join("tls"))?)
    };
    let mut cluster = Cluster::new(
        stela.to_owned(),
        &topology,
        base,
        &timing,
        security.as_ref(),
    );
    cluster.witness.start(stela, &topology)?;
    cluster.nodes[0].start(stela, &topology, Role::Primary)?;
    for i in 1..cluster.nodes.len() {
        cluster.nodes[i].start(stela, &topology, Role::Standby)?;
    }
    wait_within(
        "node a to be the primary and reach the witness",
        FAILOVER_WAIT,
        || {
            cluster.nodes[0].status().is_some_and(|s| {
                role(&s) == "primary"
                    && s.replication
                        .as_ref()
                        .and_then(|r| r.coordinator.as_ref())
                        .is_some_and(|c| c.reachable)
            })
        },
    )
    .with_context(|| {
        format!(
            "node a's log ends:\n{}\nthe witness's log ends:\n{}",
            tail(cluster.nodes[0].log_path(), 10),
            tail(cluster.witness.log_path(), 10)
        )
    })?;
    let scheme = if security.is_some() { "tls" } else { "tcp" };
    let endpoints = cluster
        .nodes
        .iter()
        .map(|n| {
            format!(
                "{scheme}://{}:{}",
                topology.address(n.host),
                cluster::CLIENT_PORT
            )
        })
        .collect::<Vec<_>>()
        .join(",");
    let mut client_args: Vec<String> = vec![
        "failover-client".into(),
        "--endpoints".into(),
        endpoints.clone(),
        "--record-bytes".into(),
        args.record_bytes.to_string(),
        "--probe-after-ms".into(),
        args.probe_after_ms.to_string(),
    ];
    if let Some(security) = &security {
        client_args.extend([
            "--tls-ca".into(),
            security.cert.display().to_string(),
            "--server-name".into(),
            cluster::SERVER_NAME.into(),
            "--token-file".into(),
            security.client_token.display().to_string(),
        ]);
    }
    let t0_ms = mono_ms();
    let mut client = Client::start(me, &topology, base, &client_args)?;
    client.wait_for_ack(Duration::from_secs(30))?;
    wait_protected(&cluster)?;

    let seed = args.seed.unwrap_or_else(|| mono_ms().to_bits());
    let mut choices = overlap::Choices::new(seed);
    if !args.json {
        eprintln!("failover: seed {seed}");
    }
    let watch = overlap::PrimaryWatch::start(cluster.nodes.iter().map(|n| n.socket()).collect());
    let kinds = kinds_of(args);
    let faults = args.faults.unwrap_or(kinds.len());
    let mut runs = Vec::new();
    for i in 0..faults {
        let kind = kinds[i % kinds.len()];
        pause(Duration::from_millis(args.settle_ms))?;
        if !args.json {
            eprintln!("failover: fault {} of {}: {}", i + 1, faults, kind.name());
        }
        runs.push(inject(
            kind,
            args,
            &mut cluster,
            &topology,
            &mut client,
            &mut choices,
        )?);
    }
    pause(Duration::from_millis(args.settle_ms))?;
    let two_primaries = watch.finish();

    // Stop cleanly: the client (it settles what is in doubt), then, once every standby holds
    // the whole log, the standbys before the primary, so that no promotion happens on the way
    // out.
    let events = client.stop()?;
    let (final_primary, _) = cluster
        .primary()
        .context("no primary at the end of the run")?;
    let standbys = cluster.nodes.len() - 1;
    wait_within("every standby to hold the whole log", PROTECT_WAIT, || {
        cluster.nodes[final_primary]
            .status()
            .is_some_and(|s| every_standby_holds_all(&s, standbys))
    })
    .with_context(|| logs_of(&cluster))?;
    let others: Vec<usize> = cluster.others(final_primary).collect();
    for &i in &others {
        cluster.nodes[i].stop()?;
    }
    cluster.nodes[final_primary].stop()?;
    cluster.witness.kill();
    let primary_copy = verify::read_log(&cluster.nodes[final_primary].dir, LOG)?;
    let other_copies: Vec<(usize, anyhow::Result<verify::LogCopy>)> = others
        .iter()
        .map(|&i| (i, verify::read_log(&cluster.nodes[i].dir, LOG)))
        .collect();
    for (i, copy) in &other_copies {
        if let Err(error) = copy {
            eprintln!(
                "failover: node {}'s final log could not be read: {error:#}",
                cluster.nodes[*i].name
            );
        }
    }
    let log_conflicts = terms::conflicts(
        &cluster
            .nodes
            .iter()
            .map(|n| {
                (
                    n.name,
                    std::fs::read_to_string(n.log_path()).unwrap_or_default(),
                )
            })
            .collect::<Vec<_>>(),
        &std::fs::read_to_string(cluster.witness.log_path()).unwrap_or_default(),
    );
    for conflict in &log_conflicts {
        eprintln!(
            "failover: DOUBLE PRIMARY in the logs: epoch {} promoted {:?}, granted {:?}",
            conflict.epoch, conflict.promoted, conflict.granted
        );
    }

    let windows: Vec<FaultWindow> = runs
        .iter()
        .map(|r| FaultWindow {
            start_ms: r.start_ms,
            inject_ms: r.inject_ms,
            restore_ms: r.restore_ms,
            expects_failover: r.kind.expects_failover(),
            epoch_before: r.epoch_before,
        })
        .collect();
    let acked = analysis::acknowledged(&events);
    let resolved = analysis::resolutions(&events);
    let verdict = verify::check(&acked, &resolved, &primary_copy, None);
    let mut node_checks = vec![NodeCheck {
        node: cluster.nodes[final_primary].name,
        primary: true,
        acked_missing: Some(verdict.lost.len() as u64),
        mismatch: Some(0),
    }];
    for (i, copy) in &other_copies {
        let theirs = copy
            .as_ref()
            .ok()
            .map(|copy| verify::check(&acked, &resolved, &primary_copy, Some(copy)));
        let missing = copy.as_ref().ok().map(|copy| {
            let as_primary = verify::check(&acked, &HashMap::new(), copy, None);
            as_primary.lost.len() as u64
        });
        node_checks.push(NodeCheck {
            node: cluster.nodes[*i].name,
            primary: false,
            acked_missing: missing,
            mismatch: theirs.map(|v| v.standby_mismatch.len() as u64),
        });
    }
    let rows = fault_rows(
        &runs,
        &windows,
        &events,
        &verdict,
        &two_primaries,
        &primary_copy,
        &topology,
    );
    let acked_alone = rows.iter().filter_map(|r| r.acked_alone).sum();
    let downtimes: Vec<f64> = rows
        .iter()
        .zip(&runs)
        .filter(|(_, run)| run.kind.expects_failover())
        .filter_map(|(row, _)| row.downtime_ms)
        .collect();
    let resolved_kept = resolved
        .values()
        .filter(|(_, o)| *o == events::Outcome::Kept)
        .count() as u64;
    let summary = Summary {
        summary: true,
        seed,
        faults: rows.len(),
        p50_ms: analysis::percentile(&downtimes, 50.0),
        p99_ms: analysis::percentile(&downtimes, 99.0),
        max_ms: analysis::percentile(&downtimes, 100.0),
        acked: acked.len() as u64,
        unprotected: events
            .iter()
            .filter(|e| matches!(e, events::Event::Unprotected { .. }))
            .count() as u64,
        in_doubt: resolved.len() as u64 + unresolved(&events),
        resolved_kept,
        resolved_lost: resolved.len() as u64 - resolved_kept,
        unresolved: unresolved(&events),
        lost: verdict.lost.len() as u64,
        double_primary: analysis::double_primary_times(&events).len() as u64
            + two_primaries.len() as u64
            + runs.iter().map(|r| r.old_came_up_primary).sum::<u64>()
            + log_conflicts.len() as u64,
        resolution_wrong: verdict.resolution_wrong.len() as u64,
        kept_absent: verdict.kept_absent.len() as u64,
        lost_present: verdict.lost_present.len() as u64,
        double_primary_status: two_primaries.len() as u64,
        double_primary_logs: log_conflicts.len() as u64,
        acked_alone,
        nodes: cluster.nodes.len(),
        node_checks: node_checks.clone(),
        old_came_up_primary: runs.iter().map(|r| r.old_came_up_primary).sum(),
        alone_primary: runs.iter().map(|r| r.alone_primary).sum(),
        kinds: kind_rows(&rows),
        standby_mismatch: node_checks.iter().map(|c| c.mismatch).sum::<Option<u64>>(),
        reprotect_over_need: rows
            .iter()
            .filter_map(|r| Some(r.reprotect_bytes? as f64 / r.reprotect_need_bytes?.max(1) as f64))
            .reduce(f64::max),
    };

    if !args.json {
        print_table(out, args, &topology, &endpoints, &rows, &summary, &verdict)?;
    }
    for row in &rows {
        writeln!(out, "{}", serde_json::to_string(row)?)?;
    }
    writeln!(out, "{}", serde_json::to_string(&summary)?)?;
    if let Some(path) = &args.chart {
        let markers: Vec<chart::Marker> = runs
            .iter()
            .map(|r| chart::Marker {
                label: r.kind.name().into(),
                inject_ms: r.inject_ms,
                restore_ms: r.restore_ms,
                recovered_ms: r.recovered_ms,
            })
            .collect();
        chart::save(&events, &markers, t0_ms, path)?;
        if !args.json {
            writeln!(out, "chart saved to {}", path.display())?;
        }
    }
    Ok((rows, summary))
}

/// Each fault's row: the client's events of its period, the lost acknowledgements and
/// resolutions attributed to it (by the time of the acknowledgement, of the doubt), the status
/// samples with two primaries in it.
fn fault_rows(
    runs: &[FaultRun],
    windows: &[FaultWindow],
    events: &[events::Event],
    verdict: &verify::Verdict,
    two_primaries: &[(f64, u64)],
    primary_copy: &verify::LogCopy,
    topology: &Topology,
) -> Vec<FaultRow> {
    let facts = analysis::facts(events, windows);
    let acked = analysis::acknowledged(events);
    let mut lost_in = vec![0u64; runs.len()];
    for seq in verdict.lost.keys() {
        if let Some(i) = analysis::fault_at(windows, acked[seq].2) {
            lost_in[i] += 1;
        }
    }
    let doubted_at: std::collections::HashMap<u64, f64> = events
        .iter()
        .filter_map(|e| match e {
            events::Event::InDoubt { seq, t_ms, .. } => Some((*seq, *t_ms)),
            _ => None,
        })
        .collect();
    // (kept, lost, wrong) per fault.
    let mut resolved_in = vec![(0u64, 0u64, 0u64); runs.len()];
    for (seq, (_, outcome)) in analysis::resolutions(events) {
        let Some(i) = doubted_at
            .get(&seq)
            .and_then(|&t| analysis::fault_at(windows, t))
        else {
            continue;
        };
        match outcome {
            events::Outcome::Kept => resolved_in[i].0 += 1,
            events::Outcome::Lost => resolved_in[i].1 += 1,
        }
        resolved_in[i].2 += u64::from(verdict.resolution_wrong.binary_search(&seq).is_ok());
    }
    let mut two_in = vec![0u64; runs.len()];
    for &(t_ms, _) in two_primaries {
        if let Some(i) = analysis::fault_at(windows, t_ms) {
            two_in[i] += 1;
        }
    }
    runs.iter()
        .enumerate()
        .map(|(i, run)| FaultRow {
            fault: run.kind.name(),
            downtime_ms: facts[i].downtime_ms.map(round),
            recovered_ms: round(run.recovered_ms - run.inject_ms),
            unavailable_ms: round(facts[i].unavailable_ms),
            acked: facts[i].acked,
            unprotected: facts[i].unprotected,
            in_doubt: facts[i].in_doubt,
            resolved_kept: resolved_in[i].0,
            resolved_lost: resolved_in[i].1,
            resolution_wrong: resolved_in[i].2,
            lost: lost_in[i],
            double_primary: facts[i].double_primary + two_in[i] + run.old_came_up_primary,
            acked_alone: run
                .alone
                .map(|(from, until)| analysis::begun_and_acked_within(events, from, until)),
            alone_primary: (run.kind == FaultKind::KillStandbyThenPrimary)
                .then_some(run.alone_primary),
            failovers: run.epoch_after.saturating_sub(run.epoch_before),
            blocked_ms: (!run.kind.expects_failover()).then(|| round(facts[i].blocked_ms)),
            reprotect_bytes: run.reprotect_bytes,
            reprotect_need_bytes: run.reprotect_need,
            log_bytes: primary_copy.bytes_through(run.log_lsn),
            old_primary_exit: run.old_primary_exit,
            impairment: (run.kind == FaultKind::LossyStandby)
                .then(|| topology.lossy_method().name()),
        })
        .collect()
}

/// The rows summed per kind, in the order of [`FaultKind::ALL`], then `switchover` (kinds not
/// run left out).
fn kind_rows(rows: &[FaultRow]) -> Vec<KindRow> {
    FaultKind::ALL
        .iter()
        .chain([&FaultKind::Switchover])
        .filter_map(|kind| {
            let of: Vec<&FaultRow> = rows.iter().filter(|r| r.fault == kind.name()).collect();
            if of.is_empty() {
                return None;
            }
            let unavailable: Vec<f64> = of.iter().map(|r| r.unavailable_ms).collect();
            let sum = |f: fn(&FaultRow) -> u64| of.iter().map(|r| f(r)).sum::<u64>();
            Some(KindRow {
                kind: kind.name(),
                faults: of.len(),
                unavailable_p50_ms: analysis::percentile(&unavailable, 50.0),
                unavailable_p99_ms: analysis::percentile(&unavailable, 99.0),
                unavailable_max_ms: analysis::percentile(&unavailable, 100.0),
                acked: sum(|r| r.acked),
                unprotected: sum(|r| r.unprotected),
                in_doubt: sum(|r| r.in_doubt),
                resolved_kept: sum(|r| r.resolved_kept),
                resolved_lost: sum(|r| r.resolved_lost),
                resolution_wrong: sum(|r| r.resolution_wrong),
                lost: sum(|r| r.lost),
                double_primary: sum(|r| r.double_primary),
            })
        })
        .collect()
}

/// Commits in doubt never settled.
fn unresolved(events: &[events::Event]) -> u64 {
    let doubted = events
        .iter()
        .filter(|e| matches!(e, events::Event::InDoubt { .. }))
        .count();
    let settled = events
        .iter()
        .filter(|e| matches!(e, events::Event::Resolved { .. }))
        .count();
    doubted.saturating_sub(settled) as u64
}

fn round(ms: f64) -> f64 {
    (ms * 10.0).round() / 10.0
}

/// Injects one fault, undoes it, brings back what it took down, and waits until the pair is
/// protected again.
fn inject(
    kind: FaultKind,
    args: &FailoverArgs,
    cluster: &mut Cluster,
    topology: &Topology,
    client: &mut Client,
    choices: &mut overlap::Choices,
) -> anyhow::Result<FaultRun> {
    if kind.is_overlapping() {
        let run = overlap::inject(kind, args, cluster, topology, choices)?;
        client.wait_for_ack(FAILOVER_WAIT)?;
        return Ok(run);
    }
    let (p, before) = cluster.primary().context("no primary before the fault")?;
    let s = choose_standby(cluster, p, choices);
    let (p_host, s_host) = (cluster.nodes[p].host, cluster.nodes[s].host);
    let epoch_before = epoch(&before);
    let hold = Duration::from_millis(args.fault_ms);
    // The fault itself. It is in force once the signal is sent, or once the `ip`/`tc` command
    // that makes it returns (it runs a few milliseconds, in which a commit could still complete
    // the old way); its period (what its events are counted against) starts before either.
    let start_ms = mono_ms();
    match kind {
        FaultKind::KillPrimary => cluster.nodes[p].kill(),
        FaultKind::StopPrimary => cluster.nodes[p].signal(Signal::STOP)?,
        FaultKind::IsolatePrimary => topology.set_link(p_host, false)?,
        FaultKind::PartitionPair => topology.set_blackhole(p_host, s_host, true)?,
        FaultKind::LossyStandby => topology.set_lossy(s_host, 20, 20, true)?,
        FaultKind::KillStandby => cluster.nodes[s].kill(),
        FaultKind::KillWitness => cluster.witness.kill(),
        FaultKind::Switchover => switch_over(cluster, p, s)?,
        _ => unreachable!("{kind:?} is injected by overlap::inject"),
    }
    let inject_ms = match kind {
        FaultKind::KillPrimary
        | FaultKind::Switchover
        | FaultKind::StopPrimary
        | FaultKind::KillStandby
        | FaultKind::KillWitness => start_ms,
        _ => mono_ms(),
    };
    let mut old_primary_exit = None;
    // The node to start again once the fault is over.
    let mut rejoin = None;
    match kind {
        FaultKind::KillPrimary => {
            // Restarted as soon as the standby took over, as a service manager restarts it:
            // with two nodes the new primary protects no commit until the old one is back as
            // its standby (a `replicated` commit is never answered `Ok` by one node alone,
            // issue 52), so the restart is part of the downtime measured.
            poll_within(FAILOVER_WAIT, || {
                promoted_other(cluster, p, epoch_before).is_some()
            })?;
            rejoin = Some(p);
        }
        FaultKind::Switchover => {
            old_primary_exit = Some(cluster.nodes[p].wait_exit(STEP_DOWN_WAIT)?);
            rejoin = (!cluster.nodes[p].running()).then_some(p);
        }
        FaultKind::StopPrimary => {
            pause(hold)?;
            cluster.nodes[p].signal(Signal::CONT)?;
            old_primary_exit = Some(cluster.nodes[p].wait_exit(STEP_DOWN_WAIT)?);
            rejoin = (!cluster.nodes[p].running()).then_some(p);
        }
        FaultKind::IsolatePrimary => {
            pause(hold)?;
            topology.set_link(p_host, true)?;
            old_primary_exit = Some(cluster.nodes[p].wait_exit(STEP_DOWN_WAIT)?);
            rejoin = (!cluster.nodes[p].running()).then_some(p);
        }
        FaultKind::PartitionPair => {
            pause(hold)?;
            topology.set_blackhole(p_host, s_host, false)?;
        }
        FaultKind::LossyStandby => {
            pause(hold)?;
            topology.set_lossy(s_host, 20, 20, false)?;
        }
        FaultKind::KillStandby => {
            pause(hold)?;
            rejoin = Some(s);
        }
        FaultKind::KillWitness => {
            pause(hold)?;
            cluster.witness.start(&cluster.stela, topology)?;
        }
        _ => unreachable!("{kind:?} is injected by overlap::inject"),
    }
    // Reprotection is measured on whichever node is the primary now, from this moment.
    let (shipping, now) = wait_primary(cluster)?;
    // What the node that rejoins holds, read while it is down (so exactly what it restarts
    // with). A standby that stayed up (partition, witness) is not read: its log moves while it
    // is read, and its catch-up cannot be set against the primary's counter at one instant.
    let standby_had = rejoin
        .map(|node| verify::peek_log(&cluster.nodes[node].dir, LOG, None))
        .transpose()?;
    let restore_ms = mono_ms();
    if let Some(node) = rejoin {
        // A node started again never claims the primary role by configuration: the
        // coordinator's holder decides.
        cluster.nodes[node].start(&cluster.stela, topology, Role::Standby)?;
    }
    // A failover the fault was not meant to cause (a lease missed on a loaded machine) deposes
    // a node, which exits 75: it is started again, as a service manager would.
    let (primary, report) = overlap::wait_protected_restarting(cluster, topology)?;
    client.wait_for_ack(FAILOVER_WAIT)?;
    let recovered_ms = mono_ms();
    let log_lsn = log_positions(&report).map_or(0, |p| p.last_lsn);
    let reprotect_need = match standby_had {
        Some(standby_had) if primary == shipping => {
            // The primary's files lag its pool by up to the write threshold (the flush interval
            // at most): read before they hold `log_lsn`, they would leave out bytes it shipped
            // from memory, and the need would be under-counted.
            wait_within(
                "the primary to write its log up to the LSN caught up to",
                FAILOVER_WAIT,
                || {
                    cluster.nodes[primary].status().is_some_and(|s| {
                        log_positions(&s).is_some_and(|p| p.written_lsn >= log_lsn)
                    })
                },
            )?;
            let primary_had = verify::peek_log(&cluster.nodes[primary].dir, LOG, Some(log_lsn))?;
            let (diverged, missing) = verify::reprotect_need(&standby_had, &primary_had);
            Some(diverged + missing)
        }
        _ => None,
    };
    Ok(FaultRun {
        kind,
        start_ms,
        inject_ms,
        restore_ms,
        recovered_ms,
        epoch_before,
        epoch_after: epoch(&report),
        // To the node that rejoins or was hit, where it is a standby now (the other standby's
        // live records are no part of its reprotection).
        reprotect_bytes: (primary == shipping).then(|| {
            let hit = rejoin.unwrap_or(s);
            let peer = (hit != primary).then(|| cluster.nodes[hit].repl.as_str());
            shipped_to(&now, &report, peer)
        }),
        reprotect_need,
        log_lsn,
        old_primary_exit,
        old_came_up_primary: 0,
        // A pair's primary is alone while its standby is down: it acknowledges nothing then.
        alone: (kind == FaultKind::KillStandby && cluster.nodes.len() == 2)
            .then_some((inject_ms, restore_ms)),
        alone_primary: 0,
    })
}

/// `stela cluster switchover` from the primary `p` to the standby `s`, through the nodes'
/// sockets, as an operator would run it; returns once `s` says it is the primary.
fn switch_over(cluster: &Cluster, p: usize, s: usize) -> anyhow::Result<()> {
    let output = std::process::Command::new(&cluster.stela)
        .args(["cluster", "switchover", "--node"])
        .arg(&cluster.nodes[p].dir)
        .arg("--node")
        .arg(&cluster.nodes[s].dir)
        .args(["--to", cluster.nodes[s].name])
        .output()
        .context("run stela cluster switchover")?;
    anyhow::ensure!(
        output.status.success(),
        "stela cluster switchover failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr).trim()
    );
    Ok(())
}

/// The standby a fault aimed at "the standby" hits: with one, that one; with two, one chosen
/// by the seed.
fn choose_standby(cluster: &Cluster, p: usize, choices: &mut overlap::Choices) -> usize {
    let others: Vec<usize> = cluster.others(p).collect();
    match others.len() {
        // No draw: a pair's runs repeat from the seeds printed before there were three.
        1 => others[0],
        n => others[choices.between(0, n as u64 - 1) as usize],
    }
}

/// Whether node `i` is the primary of an epoch above `epoch_before`.
fn promoted(cluster: &Cluster, i: usize, epoch_before: u64) -> bool {
    cluster.nodes[i]
        .status()
        .is_some_and(|s| role(&s) == "primary" && epoch(&s) > epoch_before)
}

/// The node other than `p` that is the primary of an epoch above `epoch_before`, if one is.
fn promoted_other(cluster: &Cluster, p: usize, epoch_before: u64) -> Option<usize> {
    cluster
        .others(p)
        .find(|&i| promoted(cluster, i, epoch_before))
}

/// The primary, if the cluster is whole and protected: it is protected with every other node
/// its standby, connected and caught up, and each of them says it is a standby of its epoch.
fn whole_and_protected(cluster: &Cluster) -> Option<(usize, stela_proto::StatusReport)> {
    let standbys = cluster.nodes.len() - 1;
    cluster.primary().filter(|(i, report)| {
        fully_protected(report, standbys)
            && cluster.others(*i).all(|j| {
                cluster.nodes[j]
                    .status()
                    .is_some_and(|s| role(&s) == "standby" && epoch(&s) == epoch(report))
            })
    })
}

/// Waits for some node to be the primary.
fn wait_primary(cluster: &Cluster) -> anyhow::Result<(usize, stela_proto::StatusReport)> {
    let mut found = None;
    wait_within("a primary", PROTECT_WAIT, || {
        found = cluster.primary();
        found.is_some()
    })
    .with_context(|| logs_of(cluster))?;
    Ok(found.expect("waited for it"))
}

/// Waits until the cluster is whole and protected ([`whole_and_protected`]).
fn wait_protected(cluster: &Cluster) -> anyhow::Result<(usize, stela_proto::StatusReport)> {
    let mut found = None;
    wait_within("the cluster to be protected again", PROTECT_WAIT, || {
        found = whole_and_protected(cluster);
        found.is_some()
    })
    .with_context(|| logs_of(cluster))?;
    Ok(found.expect("waited for it"))
}

/// The ends of every process's log, for an error.
fn logs_of(cluster: &Cluster) -> String {
    let mut text = String::new();
    for node in &cluster.nodes {
        text += &format!(
            "node {} ({}): {}\n{}\n",
            node.name,
            if node.running() {
                "running"
            } else {
                "not running"
            },
            node.status()
                .and_then(|s| serde_json::to_string(&s.replication).ok())
                .unwrap_or_else(|| "no status".into()),
            tail(node.log_path(), 10)
        );
    }
    text + &format!("witness:\n{}", tail(cluster.witness.log_path(), 10))
}

/// The table per kind of fault, and the checker's counts over the run.
fn print_kinds(out: &mut dyn Write, summary: &Summary) -> anyhow::Result<()> {
    writeln!(
        out,
        "# per kind: write unavailability (longest time without an acknowledgement, injection to the next fault) p50 / p99 / max; commits answered Unprotected; in doubt, resolved Kept / Lost, wrong resolutions; acknowledged records lost; double primary"
    )?;
    writeln!(
        out,
        "{:<24} {:>6} {:>9} {:>9} {:>9} {:>8} {:>7} {:>6} {:>6} {:>6} {:>6} {:>5} {:>7}",
        "kind",
        "faults",
        "p50",
        "p99",
        "max",
        "acked",
        "unprot",
        "doubt",
        "kept",
        "lost?",
        "wrong",
        "lost",
        "double"
    )?;
    let ms = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.0} ms"));
    for k in &summary.kinds {
        writeln!(
            out,
            "{:<24} {:>6} {:>9} {:>9} {:>9} {:>8} {:>7} {:>6} {:>6} {:>6} {:>6} {:>5} {:>7}",
            k.kind,
            k.faults,
            ms(k.unavailable_p50_ms),
            ms(k.unavailable_p99_ms),
            ms(k.unavailable_max_ms),
            k.acked,
            k.unprotected,
            k.in_doubt,
            k.resolved_kept,
            k.resolved_lost,
            k.resolution_wrong,
            k.lost,
            k.double_primary
        )?;
    }
    for k in &summary.kinds {
        let single = FaultKind::ALL
            .iter()
            .chain([&FaultKind::Switchover])
            .find(|kind| kind.name() == k.kind)
            .is_some_and(|kind| kind.is_single());
        if summary.nodes >= 3 && single {
            let met = k.unavailable_p99_ms.is_some_and(|v| v < 1000.0)
                && k.unavailable_max_ms.is_some_and(|v| v < 2000.0);
            writeln!(
                out,
                "target (three nodes, one fault at a time): {} unavailability p99 < 1 s and max < 2 s: {}",
                k.kind,
                if met { "met" } else { "NOT met" }
            )?;
        }
    }
    for node in &summary.node_checks {
        let n = |v: Option<u64>| v.map_or("unreadable".to_owned(), |v| v.to_string());
        writeln!(
            out,
            "node {}{}: acknowledged records missing from its final log {}, LSNs holding another record than the final primary's {}",
            node.node,
            if node.primary { " (final primary)" } else { "" },
            n(node.acked_missing),
            n(node.mismatch)
        )?;
    }
    writeln!(
        out,
        "checker (seed {}): {} acknowledged, {} lost; {} answered Unprotected; {} in doubt: {} resolved Kept, {} Lost, {} unresolved; wrong resolutions {} (Kept absent {}, Lost present {}); double primary {} (client-seen {}, status samples with two primaries of one epoch {}, epochs the nodes' and the witness's logs give two holders {}, old primary up as primary while the witness was down {}); samples of the one node left up of three saying it is primary {}; commits begun and acknowledged while at most one node was up {}",
        summary.seed,
        summary.acked,
        summary.lost,
        summary.unprotected,
        summary.in_doubt,
        summary.resolved_kept,
        summary.resolved_lost,
        summary.unresolved,
        summary.resolution_wrong,
        summary.kept_absent,
        summary.lost_present,
        summary.double_primary,
        summary.double_primary
            - summary.double_primary_status
            - summary.double_primary_logs
            - summary.old_came_up_primary,
        summary.double_primary_status,
        summary.double_primary_logs,
        summary.old_came_up_primary,
        summary.alone_primary,
        summary.acked_alone
    )?;
    Ok(())
}

fn print_table(
    out: &mut dyn Write,
    args: &FailoverArgs,
    topology: &Topology,
    endpoints: &str,
    rows: &[FaultRow],
    summary: &Summary,
    verdict: &verify::Verdict,
) -> anyhow::Result<()> {
    writeln!(
        out,
        "# stela-bench failover: witness, nodes {} (a starts primary{}), and the client in namespaces of their own on 10.231.{}.0/24 (a bridge in another); client commits at replicated to {endpoints}",
        cluster::NODE_NAMES[..topology.nodes()].join(", "),
        if topology.nodes() >= 3 {
            format!("; each node has the other two as --peer, --replicas {}", args.replicas)
        } else {
            String::new()
        },
        topology.subnet()
    )?;
    writeln!(
        out,
        "# heartbeat {} ms, suspect after {} ms, lease {} ms; faults of {} ms; {} B records; one commit at a time",
        args.heartbeat_ms, args.suspect_after_ms, args.lease_ms, args.fault_ms, args.record_bytes
    )?;
    if rows.iter().any(|r| r.impairment.is_some()) {
        writeln!(
            out,
            "# lossy-standby: loss 20 % and delay 20 ms each way on the standby's link, by {}",
            match topology.lossy_method() {
                topology::LossyMethod::Netem => "netem on both ends of its veth pair",
                topology::LossyMethod::Netfilter =>
                    "netfilter in its namespace (this kernel has no netem): iptables's statistic \
                     match drops, a netfilter queue holds the rest for the delay",
            }
        )?;
    }
    writeln!(
        out,
        "{:>3} {:<24} {:>9} {:>10} {:>9} {:>8} {:>6} {:>6} {:>5} {:>6} {:>6} {:>9} {:>11} {:>11} {:>10} {:>5}",
        "#",
        "fault",
        "downtime",
        "protected",
        "unavail",
        "acked",
        "unprot",
        "doubt",
        "lost",
        "double",
        "epochs",
        "blocked",
        "reprotect B",
        "need B",
        "log B",
        "exit"
    )?;
    let ms = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.0} ms"));
    for (i, row) in rows.iter().enumerate() {
        writeln!(
            out,
            "{:>3} {:<24} {:>9} {:>10} {:>9} {:>8} {:>6} {:>6} {:>5} {:>6} {:>6} {:>9} {:>11} {:>11} {:>10} {:>5}",
            i + 1,
            row.fault,
            ms(row.downtime_ms),
            ms(Some(row.recovered_ms)),
            ms(Some(row.unavailable_ms)),
            row.acked,
            row.unprotected,
            row.in_doubt,
            row.lost,
            row.double_primary,
            row.failovers,
            ms(row.blocked_ms),
            row.reprotect_bytes.map_or("-".into(), |b| b.to_string()),
            row.reprotect_need_bytes.map_or("-".into(), |b| b.to_string()),
            row.log_bytes,
            match row.old_primary_exit {
                None => "".to_owned(),
                Some(None) => "none".to_owned(),
                Some(Some(code)) => code.to_string(),
            }
        )?;
    }
    writeln!(
        out,
        "downtime over the faults that fail over: p50 {}, p99 {}, max {}; {} acknowledged, {} in doubt, {} lost, {} from a deposed primary, {} resolutions contradicted by the log, standby mismatches {}",
        ms(summary.p50_ms),
        ms(summary.p99_ms),
        ms(summary.max_ms),
        summary.acked,
        summary.in_doubt,
        summary.lost,
        summary.double_primary,
        summary.resolution_wrong,
        summary.standby_mismatch.map_or("(standby log unreadable)".into(), |n| n.to_string())
    )?;
    print_kinds(out, summary)?;
    if let Some(over) = summary.reprotect_over_need {
        writeln!(
            out,
            "reprotection shipped at most {over:.3} times what it had to (diverged + missing; target <= 1.05: {})",
            if over <= 1.05 { "met" } else { "NOT met" }
        )?;
    }
    for (seq, there) in verdict.lost.iter().take(10) {
        writeln!(
            out,
            "LOST: seq {seq}: its LSN holds {}",
            there.map_or("nothing (past the end)".into(), |s| format!("seq {s}"))
        )?;
    }
    for (what, seqs) in [
        (
            "resolved Kept, absent from the final log",
            &verdict.kept_absent,
        ),
        (
            "resolved Lost, present in the final log",
            &verdict.lost_present,
        ),
    ] {
        for seq in seqs.iter().take(10) {
            writeln!(out, "WRONG RESOLUTION: seq {seq} {what}")?;
        }
    }
    writeln!(
        out,
        "# downtime: injection to the first acknowledgement, by a primary of a newer epoch, of a commit begun after it; protected: injection to the cluster whole again (every standby connected and caught up); blocked: longest wait of a commit waiting during the fault; reprotect B: the primary's shipped_bytes (status) to the node that rejoins or was hit (to every standby if none) from the restart (or the end of the fault) to caught up; need B: what it had to move, the rejoining node's frames past its common prefix with the primary, read while it was down (diverged), plus the primary's past it up to its last LSN once caught up (missing), for the faults after which a node rejoins; log B: the log's frames up to the primary's last LSN then; epochs: promotions during the fault; injection: the moment the fault is in force"
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: FailoverArgs,
    }

    #[test]
    fn kinds_default_to_all_in_order_and_parse_by_name() {
        let cli = Cli::try_parse_from(["x"]).unwrap();
        assert_eq!(cli.args.kinds, FaultKind::ALL.to_vec());
        assert_eq!(cli.args.faults, None);
        assert_eq!((cli.args.nodes, cli.args.replicas), (2, 1));
        // A pair leaves out the kinds that need three nodes; three run them all.
        assert_eq!(kinds_of(&cli.args).len(), 12);
        assert_eq!(FaultKind::ALL.iter().filter(|k| k.needs_three()).count(), 2);
        assert!(kinds_of(&cli.args).iter().all(|k| !k.needs_three()));
        let three = Cli::try_parse_from(["x", "--nodes", "3"]).unwrap();
        assert_eq!(kinds_of(&three.args), FaultKind::ALL.to_vec());
        assert!(Cli::try_parse_from(["x", "--nodes", "4"]).is_err());
        assert!(Cli::try_parse_from(["x", "--nodes", "1"]).is_err());
        let single: Vec<_> = FaultKind::ALL.iter().filter(|k| k.is_single()).collect();
        assert_eq!(single.len(), 9);
        let cli = Cli::try_parse_from(["x", "--kinds", "kill-primary,partition-pair"]).unwrap();
        assert_eq!(
            cli.args.kinds,
            vec![FaultKind::KillPrimary, FaultKind::PartitionPair]
        );
        for kind in FaultKind::ALL {
            assert_eq!(
                serde_json::to_value(kind).unwrap(),
                serde_json::json!(kind.name())
            );
        }
        let failing_over: Vec<_> = FaultKind::ALL
            .iter()
            .filter(|k| k.expects_failover())
            .collect();
        assert_eq!(failing_over.len(), 7);
        let cli = Cli::try_parse_from([
            "x",
            "--kinds",
            "asym,black-hole,kill-then-kill-new,pause-new,witness-down-restart-old",
        ])
        .unwrap();
        assert!(cli.args.kinds.iter().all(|k| k.is_overlapping()));
        assert_eq!(cli.args.kinds.len(), 5);
    }
}
