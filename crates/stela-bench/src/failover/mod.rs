//! `stela-bench failover`: availability under faults, after RemusDB's failover experiments
//! (its Figures 5 to 7). A witness (or, with `--coordinator etcd`, an etcd in its place) and
//! two or three (`--nodes`) `stela serve` nodes with automatic failover run in network
//! namespaces of their own, a client commits at `replicated`
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
//! - [`fault`]: the kinds of fault, and one fault injected, undone and waited out.
//! - [`report`]: the rows per fault and per kind, the summary, the printed tables.
//!
//! This module owns the sequence: build, start, for each fault inject / undo / restart /
//! wait until protected, then stop everything cleanly, read the logs, report.

pub mod analysis;
pub mod chart;
pub mod client;
pub mod cluster;
pub mod events;
mod fault;
pub mod overlap;
mod report;
pub mod terms;
pub mod topology;
pub mod verify;

pub use fault::FaultKind;
use fault::{
    choose_standby, inject, logs_of, promoted_other, wait_primary, wait_protected,
    whole_and_protected,
};
use report::{fault_rows, kind_rows, print_table, unresolved};
pub use report::{FaultRow, KindRow, NodeCheck, Summary};

use crate::netns::{pause, sibling, wait_within};
use analysis::FaultWindow;
use anyhow::Context;
use cluster::{every_standby_holds_all, role, tail, Client, Cluster, Role, Timing};
use events::{mono_ms, LOG};
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;
use topology::Topology;

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
    /// The coordinator the nodes name: the built-in witness, or etcd (Debian's `etcd-server`)
    /// in the witness's place, whose lease is each node's --suspect-after-ms (--lease-ms
    /// then applies to nothing). The kill-witness kinds kill and restart it.
    #[arg(long, value_enum, default_value_t = cluster::CoordinatorKind::Witness)]
    pub coordinator: cluster::CoordinatorKind,
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
        coordinator: args.coordinator,
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
    let node_logs: Vec<(&str, String)> = cluster
        .nodes
        .iter()
        .map(|n| {
            (
                n.name,
                std::fs::read_to_string(n.log_path()).unwrap_or_default(),
            )
        })
        .collect();
    // On etcd the grants are logged by the nodes' own coordinator instances.
    let mut coordinator_log =
        std::fs::read_to_string(cluster.witness.log_path()).unwrap_or_default();
    if args.coordinator == cluster::CoordinatorKind::Etcd {
        for (_, log) in &node_logs {
            coordinator_log.push_str(log);
        }
    }
    let log_conflicts = terms::conflicts(&node_logs, &coordinator_log);
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
