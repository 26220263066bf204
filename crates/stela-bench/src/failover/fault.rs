//! The faults: their kinds (what each hits, whether it must fail over) and, for one fault, the
//! sequence inject / undo / bring back / wait until the cluster is whole and protected again.
//!
//! Invariant: a fault is over only once every node is back and every standby holds all the
//! primary's records (or the wait's deadline names the node that is not), so each fault starts
//! from a protected cluster and its figures are its own.

use super::cluster::{
    epoch, fully_protected, log_positions, role, shipped_to, tail, Client, Cluster, Role,
};
use super::events::{mono_ms, LOG};
use super::topology::Topology;
use super::{overlap, verify, FailoverArgs, FaultRun, FAILOVER_WAIT, PROTECT_WAIT, STEP_DOWN_WAIT};
use crate::netns::{pause, poll_within, wait_within};
use anyhow::Context;
use rustix::process::Signal;
use serde::Serialize;
use std::time::Duration;

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
    pub(super) fn is_overlapping(self) -> bool {
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

/// Injects one fault, undoes it, brings back what it took down, and waits until the pair is
/// protected again.
pub(super) fn inject(
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
    let (p, before) = wait_primary(cluster).context("no primary before the fault")?;
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
    // A killed node is dead here (the kill waits for it): no commit begun from now on can
    // have been received by it.
    let in_force_ms = mono_ms();
    let inject_ms = match kind {
        FaultKind::KillPrimary
        | FaultKind::StopPrimary
        | FaultKind::KillStandby
        | FaultKind::KillWitness
        | FaultKind::Switchover => start_ms,
        _ => in_force_ms,
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
        // A pair's primary is alone while its standby is down: it acknowledges nothing begun
        // then. Counted from the standby's death, not from the fault's start: a commit begun
        // between the two could be held and acknowledged by the standby before the signal took
        // effect (`stela-bench failover --faults 48 --seed 53` counted 2 such, each begun and
        // acknowledged within a millisecond of the kill, the next one blocked for the fault).
        alone: (kind == FaultKind::KillStandby && cluster.nodes.len() == 2)
            .then_some((in_force_ms, restore_ms)),
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
pub(super) fn choose_standby(cluster: &Cluster, p: usize, choices: &mut overlap::Choices) -> usize {
    let others: Vec<usize> = cluster.others(p).collect();
    match others.len() {
        // No draw: a pair's runs repeat from the seeds printed before there were three.
        1 => others[0],
        n => others[choices.between(0, n as u64 - 1) as usize],
    }
}

/// Whether node `i` is the primary of an epoch above `epoch_before`.
pub(super) fn promoted(cluster: &Cluster, i: usize, epoch_before: u64) -> bool {
    cluster.nodes[i]
        .status()
        .is_some_and(|s| role(&s) == "primary" && epoch(&s) > epoch_before)
}

/// The node other than `p` that is the primary of an epoch above `epoch_before`, if one is.
pub(super) fn promoted_other(cluster: &Cluster, p: usize, epoch_before: u64) -> Option<usize> {
    cluster
        .others(p)
        .find(|&i| promoted(cluster, i, epoch_before))
}

/// The primary, if the cluster is whole and protected: it is protected with every other node
/// its standby, connected and caught up, and each of them says it is a standby of its epoch.
pub(super) fn whole_and_protected(cluster: &Cluster) -> Option<(usize, stela_proto::StatusReport)> {
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

/// Waits for some node to be the primary (a fault begins only once there is one: an election
/// that a slow renewal started during the settling time is part of the previous fault).
pub(super) fn wait_primary(
    cluster: &Cluster,
) -> anyhow::Result<(usize, stela_proto::StatusReport)> {
    let mut found = None;
    wait_within("a primary", PROTECT_WAIT, || {
        found = cluster.primary();
        found.is_some()
    })
    .with_context(|| logs_of(cluster))?;
    Ok(found.expect("waited for it"))
}

/// Waits until the cluster is whole and protected ([`whole_and_protected`]).
pub(super) fn wait_protected(
    cluster: &Cluster,
) -> anyhow::Result<(usize, stela_proto::StatusReport)> {
    let mut found = None;
    wait_within("the cluster to be protected again", PROTECT_WAIT, || {
        found = whole_and_protected(cluster);
        found.is_some()
    })
    .with_context(|| logs_of(cluster))?;
    Ok(found.expect("waited for it"))
}

/// The ends of every process's log, for an error.
pub(super) fn logs_of(cluster: &Cluster) -> String {
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
