//! The report: each fault's row from the client's events and the run's records, the rows per
//! kind, the summary, and the tables printed from them.
//!
//! Invariant: every acknowledgement lost, every commit in doubt and every sample with two
//! primaries is attributed to exactly one fault (by its time), so the rows add up to the run.

use super::analysis::FaultWindow;
use super::topology::Topology;
use super::{analysis, cluster, events, topology, verify, FailoverArgs, FaultKind, FaultRun};
use serde::Serialize;
use std::io::Write;

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

/// Each fault's row: the client's events of its period, the lost acknowledgements and
/// resolutions attributed to it (by the time of the acknowledgement, of the doubt), the status
/// samples with two primaries in it.
pub(super) fn fault_rows(
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
pub(super) fn kind_rows(rows: &[FaultRow]) -> Vec<KindRow> {
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
pub(super) fn unresolved(events: &[events::Event]) -> u64 {
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

pub(super) fn round(ms: f64) -> f64 {
    (ms * 10.0).round() / 10.0
}

/// The table per kind of fault, and the checker's counts over the run.
pub(super) fn print_kinds(out: &mut dyn Write, summary: &Summary) -> anyhow::Result<()> {
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

pub(super) fn print_table(
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
        "# coordinator {}; heartbeat {} ms, suspect after {} ms, lease {} ms; faults of {} ms; {} B records; one commit at a time",
        args.coordinator.name(),
        args.heartbeat_ms,
        args.suspect_after_ms,
        args.lease_ms,
        args.fault_ms,
        args.record_bytes
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
