//! The faults of issue 52: silent links (one way, both ways) and overlapping process faults
//! (kill then kill the new primary; kill then pause the new primary; restart the old primary
//! while the witness is down; with three nodes, kill a standby then the primary, and kill both
//! standbys). Unlike the
//! older kinds, a node that exits here is started again with its *configured* role (`a`
//! primary, `b` and `c` standby), as `Restart=on-failure` restarts a service with the same
//! command line: the role is a preference, and only the coordinator's grant may make a node
//! primary, which is what these faults put to the test.
//!
//! Also here: [`PrimaryWatch`], which asks every node for its status through the whole run
//! and records every moment two of them say they are primary in the same epoch.
//!
//! Invariants kept: every fault is undone before [`inject`] returns (rules deleted, processes
//! continued, the witness running), and it returns only with the cluster whole and protected
//! again.

use super::cluster::{epoch, role, status_of, Cluster, Role};
use super::events::mono_ms;
use super::topology::Topology;
use super::{
    choose_standby, promoted_other, wait_primary, whole_and_protected, FailoverArgs, FaultKind,
    FaultRun, FAILOVER_WAIT,
};
use crate::netns::{check_interrupted, pause, poll_within};
use anyhow::{bail, Context};
use rustix::process::Signal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The role node `i` is configured with (`a` starts as primary).
pub fn configured_role(i: usize) -> Role {
    if i == 0 {
        Role::Primary
    } else {
        Role::Standby
    }
}

/// A seeded xorshift64*: the run's choices, repeatable from the printed seed.
#[derive(Debug, Clone)]
pub struct Choices(u64);

impl Choices {
    pub fn new(seed: u64) -> Choices {
        Choices(seed.max(1))
    }

    /// Uniform in `low..=high`.
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        debug_assert!(low <= high);
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        low + self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % (high - low + 1)
    }
}

/// How long the pair may take to be protected again after one of these faults.
const PROTECT_WAIT: Duration = Duration::from_secs(60);
/// How long a service manager waits before it restarts a service (systemd's `RestartSec`
/// default).
const RESTART_AFTER: Duration = Duration::from_millis(100);

/// Injects `kind` (one of [`FaultKind::is_overlapping`]), undoes it, and waits, restarting any
/// node that exits, until the pair is protected again.
pub(super) fn inject(
    kind: FaultKind,
    args: &FailoverArgs,
    cluster: &mut Cluster,
    topology: &Topology,
    choices: &mut Choices,
) -> anyhow::Result<FaultRun> {
    debug_assert!(kind.is_overlapping());
    let (p, before) = wait_primary(cluster).context("no primary before the fault")?;
    let s = choose_standby(cluster, p, choices);
    let (p_host, s_host) = (cluster.nodes[p].host, cluster.nodes[s].host);
    let epoch_before = epoch(&before);
    let hold = Duration::from_millis(args.fault_ms);
    let start_ms = mono_ms();
    let mut old_came_up_primary = 0;
    let mut alone = None;
    let mut alone_primary = 0;
    let inject_ms;
    match kind {
        FaultKind::Asym | FaultKind::BlackHole => {
            topology.set_dropped(p_host, s_host, true)?;
            if kind == FaultKind::BlackHole {
                topology.set_dropped(s_host, p_host, true)?;
            }
            inject_ms = mono_ms();
            pause(hold)?;
            topology.set_dropped(p_host, s_host, false)?;
            if kind == FaultKind::BlackHole {
                topology.set_dropped(s_host, p_host, false)?;
            }
        }
        FaultKind::KillThenKillNew => {
            cluster.nodes[p].kill();
            inject_ms = start_ms;
            let q = wait_promoted(cluster, p, epoch_before)?;
            cluster.nodes[q].kill();
            // At most one node up now (none of a pair): no majority of promises.
            let alone_from = mono_ms();
            pause(RESTART_AFTER)?;
            alone = Some((alone_from, mono_ms()));
            restart(cluster, topology, p)?;
            restart(cluster, topology, q)?;
        }
        FaultKind::KillStandbyThenPrimary => {
            debug_assert_eq!(cluster.nodes.len(), 3);
            cluster.nodes[s].kill();
            inject_ms = start_ms;
            // The primary runs on with its other standby for a suspicion period, then goes too.
            pause(Duration::from_millis(args.suspect_after_ms))?;
            cluster.nodes[p].kill();
            let alone_from = mono_ms();
            let lone = cluster
                .others(p)
                .find(|&i| i != s)
                .expect("three nodes: one is left");
            alone_primary = watch_not_primary(cluster, lone, hold, "left alone")?;
            alone = Some((alone_from, mono_ms()));
            restart(cluster, topology, s)?;
            restart(cluster, topology, p)?;
        }
        FaultKind::KillStandbys => {
            debug_assert_eq!(cluster.nodes.len(), 3);
            let standbys: Vec<usize> = cluster.others(p).collect();
            for &i in &standbys {
                cluster.nodes[i].kill();
            }
            inject_ms = mono_ms();
            pause(hold)?;
            alone = Some((inject_ms, mono_ms()));
            for i in standbys {
                restart(cluster, topology, i)?;
            }
        }
        FaultKind::PauseNew => {
            cluster.nodes[p].kill();
            inject_ms = start_ms;
            let s = wait_promoted(cluster, p, epoch_before)?;
            cluster.nodes[s].signal(Signal::STOP)?;
            let stopped = Duration::from_millis(choices.between(2000, 5000));
            let stopped_at = Instant::now();
            restart(cluster, topology, p)?;
            pause(stopped.saturating_sub(stopped_at.elapsed()))?;
            cluster.nodes[s].signal(Signal::CONT)?;
        }
        FaultKind::WitnessDownRestartOld => {
            cluster.nodes[p].kill();
            inject_ms = start_ms;
            wait_promoted(cluster, p, epoch_before)?;
            cluster.witness.kill();
            restart(cluster, topology, p)?;
            old_came_up_primary =
                watch_not_primary(cluster, p, hold, "restarted while the witness is down")?;
            cluster.witness.start(&cluster.stela, topology)?;
        }
        _ => unreachable!("not an overlapping kind: {kind:?}"),
    }
    let restore_ms = mono_ms();
    let (shipping, now) = wait_primary(cluster)?;
    let (primary, report) = wait_protected_restarting(cluster, topology)?;
    let recovered_ms = mono_ms();
    let log_lsn = super::cluster::log_positions(&report).map_or(0, |p| p.last_lsn);
    Ok(FaultRun {
        kind,
        start_ms,
        inject_ms,
        restore_ms,
        recovered_ms,
        epoch_before,
        epoch_after: epoch(&report),
        reprotect_bytes: (primary == shipping)
            .then(|| super::cluster::shipped_since(&now, &report)),
        reprotect_need: None,
        log_lsn,
        old_primary_exit: None,
        old_came_up_primary,
        alone,
        alone_primary,
    })
}

/// Waits for a node other than `p` to be promoted above `epoch_before`; which one.
fn wait_promoted(cluster: &Cluster, p: usize, epoch_before: u64) -> anyhow::Result<usize> {
    let mut found = None;
    let promoted_in_time = poll_within(FAILOVER_WAIT, || {
        found = promoted_other(cluster, p, epoch_before);
        found.is_some()
    })?;
    match found {
        Some(q) if promoted_in_time => Ok(q),
        _ => bail!(
            "no node but {} was promoted within {FAILOVER_WAIT:?}:\n{}",
            cluster.nodes[p].name,
            super::logs_of(cluster)
        ),
    }
}

fn start_configured(cluster: &mut Cluster, topology: &Topology, i: usize) -> anyhow::Result<()> {
    let stela = cluster.stela.clone();
    cluster.nodes[i].start(&stela, topology, configured_role(i))
}

/// Starts node `i` as a service manager restarts it; a start that fails (the node exits at
/// once) is said and left to [`wait_protected_restarting`], which tries again.
fn restart(cluster: &mut Cluster, topology: &Topology, i: usize) -> anyhow::Result<()> {
    check_interrupted()?;
    if let Err(error) = start_configured(cluster, topology, i) {
        eprintln!(
            "failover: node {} did not start, tried again later: {error:#}",
            cluster.nodes[i].name
        );
    }
    Ok(())
}

/// For `within`, watches node `i` (restarted while the witness is down, or left alone): the
/// samples in which it says it is primary (each is printed: it must never be).
fn watch_not_primary(
    cluster: &Cluster,
    i: usize,
    within: Duration,
    why: &str,
) -> anyhow::Result<u64> {
    let until = Instant::now() + within;
    let mut seen = 0;
    while Instant::now() < until {
        check_interrupted()?;
        if let Some(report) = cluster.nodes[i].status() {
            if role(&report) == "primary" {
                seen += 1;
                eprintln!(
                    "failover: A PRIMARY IT MUST NOT BE: node {} {why} says it is primary of epoch {}",
                    cluster.nodes[i].name,
                    epoch(&report)
                );
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(seen)
}

/// Waits until the cluster is whole and protected (as [`super::wait_protected`]), starting
/// again, with its configured role, every node that exits meanwhile (a deposed primary exits
/// 75).
pub(super) fn wait_protected_restarting(
    cluster: &mut Cluster,
    topology: &Topology,
) -> anyhow::Result<(usize, stela_proto::StatusReport)> {
    let deadline = Instant::now() + PROTECT_WAIT;
    loop {
        check_interrupted()?;
        for i in 0..cluster.nodes.len() {
            let exited = cluster.nodes[i].try_exit();
            if !cluster.nodes[i].running() {
                if let Some(status) = exited {
                    eprintln!(
                        "failover: node {} exited ({status}); restarted",
                        cluster.nodes[i].name
                    );
                }
                pause(RESTART_AFTER)?;
                restart(cluster, topology, i)?;
            }
        }
        if let Some(found) = whole_and_protected(cluster) {
            return Ok(found);
        }
        if Instant::now() > deadline {
            bail!(
                "the cluster was not protected again within {PROTECT_WAIT:?}:\n{}",
                super::logs_of(cluster)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Asks every node for its status every 50 ms on a thread of its own, for the whole run, and
/// keeps the moments two say they are primary of the same epoch.
pub struct PrimaryWatch {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<(f64, u64)>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl PrimaryWatch {
    pub fn start(sockets: Vec<PathBuf>) -> PrimaryWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (stop_there, seen_there) = (Arc::clone(&stop), Arc::clone(&seen));
        let thread = std::thread::spawn(move || {
            while !stop_there.load(Ordering::SeqCst) {
                let primaries: Vec<u64> = sockets
                    .iter()
                    .filter_map(|socket| status_of(socket, Duration::from_millis(200)))
                    .filter(|report| role(report) == "primary")
                    .map(|report| epoch(&report))
                    .collect();
                if let Some(shared) = shared_epoch(&primaries) {
                    eprintln!(
                        "failover: DOUBLE PRIMARY: two nodes say they are primary of epoch {shared}"
                    );
                    seen_there.lock().expect("watch").push((mono_ms(), shared));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        PrimaryWatch {
            stop,
            seen,
            thread: Some(thread),
        }
    }

    /// Stops the watch; the (time, epoch) of every sample with two primaries of one epoch.
    pub fn finish(mut self) -> Vec<(f64, u64)> {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        std::mem::take(&mut *self.seen.lock().expect("watch"))
    }
}

impl Drop for PrimaryWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// An epoch two of the primaries' epochs (one per node that said it is primary) share.
fn shared_epoch(primaries: &[u64]) -> Option<u64> {
    primaries
        .iter()
        .enumerate()
        .find(|(i, e)| primaries[i + 1..].contains(e))
        .map(|(_, &e)| e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_primaries_of_one_epoch_among_any_number() {
        assert_eq!(shared_epoch(&[]), None);
        assert_eq!(shared_epoch(&[3]), None);
        assert_eq!(shared_epoch(&[3, 4]), None);
        assert_eq!(shared_epoch(&[3, 3]), Some(3));
        assert_eq!(shared_epoch(&[2, 5, 5]), Some(5));
        assert_eq!(shared_epoch(&[5, 2, 5]), Some(5));
    }

    #[test]
    fn choices_repeat_from_their_seed_and_stay_in_range() {
        let (mut a, mut b) = (Choices::new(7), Choices::new(7));
        let drawn: Vec<u64> = (0..100).map(|_| a.between(2000, 5000)).collect();
        assert!(drawn.iter().all(|&d| (2000..=5000).contains(&d)));
        assert_eq!(
            drawn,
            (0..100).map(|_| b.between(2000, 5000)).collect::<Vec<_>>()
        );
        assert!(drawn.iter().any(|&d| d != drawn[0]));
    }
}
