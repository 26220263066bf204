//! `stela status`: a running daemon's status as text or JSON, and the health check it is
//! (the problems that make the exit code [`EXIT_UNHEALTHY`]).
//!
//! Invariant: the text and the JSON report the same problems, found by one function
//! ([`health_problems`]) from the daemon's own report.

use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;
use stela_proto::{RequestBody, ResponseBody, StatusReport};

use super::{connect, TargetArgs};

/// The exit code of `stela status` when the daemon answers but is not healthy: power is
/// failing (writes refused), or a log has stopped or waits for disk space.
pub const EXIT_UNHEALTHY: u8 = crate::exit::UNHEALTHY;

/// Prints a running daemon's status; returns its problems (empty when healthy), so that
/// `stela status` can serve as a health check.
pub fn status(target: TargetArgs, json: bool, out: &mut dyn Write) -> anyhow::Result<Vec<String>> {
    let answer = connect(&target)?.request(RequestBody::Status)?;
    let ResponseBody::Status(report) = answer else {
        anyhow::bail!("unexpected answer to Status: {answer:?}");
    };
    let mut problems = health_problems(&report);
    problems.extend(standby_unreachable(&report));
    if json {
        let mut value = status_json(&report);
        value["healthy"] = serde_json::json!(problems.is_empty());
        value["problems"] = serde_json::json!(problems);
        writeln!(out, "{}", serde_json::to_string_pretty(&value)?)?;
    } else {
        print_status(&report, out)?;
        match problems.as_slice() {
            [] => writeln!(out, "health: ok")?,
            _ => writeln!(out, "health: UNHEALTHY: {}", problems.join("; "))?,
        }
    }
    Ok(problems)
}

/// A primary with no log open ships nothing, so no log says whether its standby is there: a
/// TCP connection to the standby's replication address (closed at once) does. A standby that
/// does not exist would otherwise show only at the first `replicated` commit, which waits.
pub(crate) fn standby_unreachable(report: &StatusReport) -> Option<String> {
    let replication = report.replication.as_ref()?;
    if replication.role != "primary" || !replication.logs.is_empty() {
        return None;
    }
    let addr: SocketAddr = replication.peer.parse().ok()?;
    match std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
        Ok(_) => None,
        Err(error) => Some(format!(
            "the standby at {addr} does not answer ({error}); no log is open, so nothing ships \
             yet, and replicated commits will wait for it"
        )),
    }
}

/// What `stela status --json` prints when it gets no report: the verdict a monitor reads, and
/// why. `reachable` is false when no daemon answers at the address (exit 6).
pub fn status_failure_json(error: &anyhow::Error) -> serde_json::Value {
    let code = crate::exit::code_number(error);
    serde_json::json!({
        "healthy": false,
        "reachable": code != crate::exit::DAEMON_UNREACHABLE,
        "problems": [crate::exit::render(error)],
        "exit_code": code,
    })
}

/// Records `--degrade-after` acknowledged without the standby that it does not hold yet: they
/// are on this node alone.
fn degraded_not_on_standby(log: &stela_proto::ReplicaStatus) -> bool {
    log.degraded_through > log.received_lsn
}

/// What keeps the daemon from taking writes: a power-fail notice in force, a stopped log, a
/// log waiting for space. (Shutting down is not a problem of health: the daemon is leaving.)
pub(crate) fn health_problems(report: &StatusReport) -> Vec<String> {
    let mut problems = Vec::new();
    if report.power != "normal" && !report.power.starts_with("shutting down") {
        problems.push(format!("power {}", report.power));
    }
    for log in &report.logs {
        if let Some(failure) = &log.failure {
            problems.push(format!("log {} stopped: {failure}", log.name));
        }
        if let Some(reason) = &log.waiting_for_space {
            problems.push(format!("log {} waits for disk space: {reason}", log.name));
        }
    }
    if let Some(replication) = &report.replication {
        if replication.role == "stepped down" {
            problems.push("this node stepped down: a newer primary exists".to_owned());
        }
        if replication
            .coordinator
            .as_ref()
            .is_some_and(|c| !c.reachable)
        {
            problems.push(
                "the failover coordinator is unreachable: failover is unavailable".to_owned(),
            );
        }
        if replication.unprotected_since_ms > 0 {
            problems.push(
                "unprotected: records acknowledged at replicated since the failover are on this node alone until a rejoined standby holds them"
                    .to_owned(),
            );
        }
    }
    // The first standby's streams are `logs` (below); the others' are listed here.
    for standby in report
        .replication
        .iter()
        .flat_map(|r| r.standbys.iter().skip(1))
    {
        if !standby.connected {
            problems.push(format!("standby {} is not connected", standby.peer));
        } else if standby.stalled {
            problems.push(format!(
                "standby {} has acknowledged nothing past the link's deadline",
                standby.peer
            ));
        }
    }
    for log in report.replication.iter().flat_map(|r| &r.logs) {
        if let Some(why) = &log.stopped {
            problems.push(format!(
                "log {} stopped shipping to the standby: {why}",
                log.log
            ));
        } else if !log.connected {
            problems.push(format!(
                "log {}: the standby is not connected (replicated commits wait)",
                log.log
            ));
        } else if log.stalled {
            problems.push(format!(
                "log {}: the standby has acknowledged nothing for {} ms, past the link's deadline                  (a black-holed or one-way link, or a stopped standby): the stream is being opened                  again; replicated commits wait",
                log.log, log.last_ack_ms
            ));
        } else if degraded_not_on_standby(log) {
            problems.push(format!(
                "log {}: records acknowledged without the standby (--degrade-after, through LSN {}) \
                 are on this node alone until it holds them (it holds {})",
                log.log, log.degraded_through, log.received_lsn
            ));
        }
    }
    problems
}

/// `[#####...............]  25 %`: how full the dirty-byte cap is, in plain text.
fn fill_bar(used: u64, cap: u64) -> String {
    const WIDTH: u64 = 20;
    let filled = if cap == 0 {
        WIDTH
    } else {
        (used.min(cap) * WIDTH).div_ceil(cap)
    };
    let percent = (used * 100).checked_div(cap).unwrap_or(100);
    format!(
        "[{}{}] {percent:>3} %",
        "#".repeat(filled as usize),
        ".".repeat((WIDTH - filled) as usize)
    )
}

fn print_status(report: &StatusReport, out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(
        out,
        "{} (pid {}), dir {}, up {:.1} s, {} thread(s), event loop {}, {}",
        report.server,
        report.pid,
        report.dir,
        report.uptime_ms as f64 / 1e3,
        report.threads,
        if report.realtime_loop {
            "realtime (SCHED_FIFO 1)"
        } else {
            "normal scheduling"
        },
        if report.loop_spins {
            "spinning after work"
        } else {
            "sleeping after work"
        }
    )?;
    writeln!(
        out,
        "connections: {} of at most {} (file limit {}), {} with a shared-memory ring, {} refused since start",
        report.connections,
        report.max_connections,
        report.file_limit,
        report.rings,
        report.refused_connections
    )?;
    writeln!(
        out,
        "partly received frames: {} B of a cap of {} B",
        report.partial_frame_bytes, report.partial_frame_cap
    )?;
    writeln!(
        out,
        "answers not yet sent: {} B of a cap of {} B",
        report.output_bytes, report.output_cap
    )?;
    writeln!(out, "power: {}", report.power)?;
    writeln!(
        out,
        "buffers: {} x {} B, {} free; flush interval {} ms",
        report.buffers, report.buffer_bytes, report.free_buffers, report.flush_interval_ms
    )?;
    writeln!(
        out,
        "dirty: {} {} B of a cap of {} B",
        fill_bar(report.dirty_bytes, report.dirty_cap.bytes),
        report.dirty_bytes,
        report.dirty_cap.bytes
    )?;
    writeln!(out, "  {}", report.dirty_cap.derivation)?;
    if report.live_dirty_cap.bytes > 0 {
        writeln!(
            out,
            "  live cap now {} ({} changes since start)",
            report.live_dirty_cap.reason, report.live_dirty_cap.changes
        )?;
    }
    writeln!(
        out,
        "appends that waited for space: {}; bytes written: {}",
        report.appends_waited, report.bytes_written
    )?;
    if let Some(flush) = &report.last_emergency_flush {
        writeln!(
            out,
            "last emergency flush: {} B in {:.3} ms (budget {:.1} ms){}",
            flush.bytes,
            flush.micros as f64 / 1e3,
            flush.budget_micros as f64 / 1e3,
            if flush.failures.is_empty() {
                String::new()
            } else {
                format!("; FAILED: {}", flush.failures.join("; "))
            }
        )?;
    }
    writeln!(out, "logs:")?;
    for log in &report.logs {
        let p = log.positions;
        writeln!(
            out,
            "  {:<20} {:<8} LSN {}..={}, durable {}, dirty {} B{}",
            log.name,
            log.codec,
            p.first_lsn,
            p.last_lsn,
            p.durable_lsn,
            log.dirty_bytes,
            match (&log.failure, &log.waiting_for_space) {
                (Some(failure), _) => format!(", STOPPED: {failure}"),
                (None, Some(reason)) =>
                    format!(", WAITING FOR SPACE (retried each second): {reason}"),
                (None, None) => String::new(),
            }
        )?;
    }
    if let Some(replication) = &report.replication {
        writeln!(
            out,
            "replication: {} ({} {})",
            replication.role.to_uppercase(),
            if replication.role == "primary" {
                "shipping to"
            } else {
                "taking streams on"
            },
            replication.peer
        )?;
        if let Some(coordinator) = &replication.coordinator {
            writeln!(
                out,
                "  epoch {}; coordinator {}: {}, names {} the primary of epoch {}",
                replication.epoch,
                coordinator.describe,
                if coordinator.reachable {
                    format!("reachable (answered {} ms ago)", coordinator.last_answer_ms)
                } else {
                    "UNREACHABLE: the pair runs on, but failover is unavailable".to_owned()
                },
                coordinator.holder.as_deref().unwrap_or("nobody"),
                coordinator.epoch
            )?;
        }
        if replication.standbys.len() > 1 {
            writeln!(
                out,
                "  {} standbys; replicated waits for {} of them",
                replication.standbys.len(),
                replication.replicas
            )?;
            for standby in &replication.standbys {
                let acked: Vec<String> = standby
                    .logs
                    .iter()
                    .map(|l| format!("{} up to LSN {}", l.log, l.received_lsn))
                    .collect();
                writeln!(
                    out,
                    "  standby {}: {}{}; holds {}",
                    standby.peer,
                    if standby.connected {
                        "connected"
                    } else {
                        "NOT CONNECTED"
                    },
                    if standby.stalled { ", STALLED" } else { "" },
                    if acked.is_empty() {
                        "nothing yet".to_owned()
                    } else {
                        acked.join(", ")
                    }
                )?;
            }
        }
        if let Some(failover) = &replication.last_failover {
            writeln!(
                out,
                "  last failover: promoted to epoch {} at {} (unix ms), {} ms from the primary's last message to serving: {}",
                failover.epoch, failover.at_unix_ms, failover.took_ms, failover.reason
            )?;
        }
        if replication.unprotected_since_ms > 0 {
            writeln!(
                out,
                "  UNPROTECTED since {} (unix ms): while no standby is connected, replicated commits are answered Unprotected (appended, never Ok); they are on this node alone until a rejoined standby has caught up to them",
                replication.unprotected_since_ms
            )?;
        }
        for log in &replication.logs {
            writeln!(
                out,
                "  {:<20} term {}, {}, standby holds up to LSN {} (durable {}){}{}",
                log.log,
                log.term,
                if log.stalled {
                    "STALLED (no acknowledgement within the link's deadline)"
                } else if log.connected {
                    "connected"
                } else {
                    "NOT CONNECTED"
                },
                log.received_lsn,
                log.durable_lsn,
                if log.lag_records > 0 {
                    format!(
                        ", behind by {} record(s), {} byte(s), for {} ms",
                        log.lag_records, log.lag_bytes, log.lag_ms
                    )
                } else {
                    String::new()
                },
                match &log.stopped {
                    Some(why) => format!(", STOPPED: {why}"),
                    None => String::new(),
                }
            )?;
            if let Some(end) = &log.last_end {
                print_end(out, "last session", end)?;
            }
            if log.shipped_bytes > 0 {
                writeln!(
                    out,
                    "  {:<20} shipped {} B of log as {} B on the wire (lz4 where it pays)",
                    "", log.shipped_bytes, log.wire_bytes
                )?;
            }
            if log.degraded || log.degraded_acks > 0 {
                writeln!(
                    out,
                    "  {:<20} {}{} replicated commit(s) answered Unprotected without the standby since start, the last at LSN {}{}",
                    "",
                    if log.degraded {
                        "DEGRADED (--degrade-after): replicated commits answered Unprotected (as buffered, never Ok) now; "
                    } else {
                        ""
                    },
                    log.degraded_acks,
                    log.degraded_through,
                    if degraded_not_on_standby(log) {
                        " (not on the standby yet)"
                    } else {
                        ""
                    }
                )?;
            }
        }
    }
    if let Some(replication) = &report.replication {
        print_session_ends(replication, out)?;
    }
    writeln!(out, "what an acknowledgement survives:")?;
    for line in &report.crash_semantics {
        writeln!(out, "  - {line}")?;
    }
    Ok(())
}

/// A standby's streams that are down, and the count of session ends by kind.
fn print_session_ends(
    replication: &stela_proto::ReplicationStatus,
    out: &mut dyn Write,
) -> std::io::Result<()> {
    for ended in &replication.ended_streams {
        writeln!(out, "  {:<20} stream down", ended.log)?;
        print_end(out, "ended", &ended.end)?;
    }
    let counted: Vec<String> = replication
        .session_ends
        .iter()
        .filter(|(_, &count)| count > 0)
        .map(|(kind, count)| format!("{kind} {count}"))
        .collect();
    if !counted.is_empty() {
        writeln!(out, "  sessions ended since start: {}", counted.join(", "))?;
    }
    Ok(())
}

/// `last session: LINK 1.2 s ago: connect ...: refused`.
fn print_end(
    out: &mut dyn Write,
    what: &str,
    end: &stela_proto::SessionEndReport,
) -> std::io::Result<()> {
    writeln!(
        out,
        "  {:<20} {what}: {} {:.1} s ago: {}",
        "",
        end.kind.to_uppercase(),
        end.ago_ms as f64 / 1e3,
        end.message
    )
}

fn status_json(report: &StatusReport) -> serde_json::Value {
    serde_json::json!({
        "server": report.server, "pid": report.pid, "dir": report.dir, "uptime_ms": report.uptime_ms,
        "connections": report.connections, "max_connections": report.max_connections,
        "file_limit": report.file_limit, "rings": report.rings,
        "refused_connections": report.refused_connections, "threads": report.threads,
        "realtime_loop": report.realtime_loop, "loop_spins": report.loop_spins,
        "partial_frame_bytes": report.partial_frame_bytes, "partial_frame_cap": report.partial_frame_cap,
        "output_bytes": report.output_bytes, "output_cap": report.output_cap,
        "power": report.power,
        "buffers": report.buffers, "buffer_bytes": report.buffer_bytes, "free_buffers": report.free_buffers,
        "flush_interval_ms": report.flush_interval_ms,
        "dirty_bytes": report.dirty_bytes,
        "dirty_cap": {
            "bytes": report.dirty_cap.bytes, "power_window_ms": report.dirty_cap.power_window_ms,
            "measured_write_bytes_per_s": report.dirty_cap.measured_write_bytes_per_s,
            "window_bytes": report.dirty_cap.window_bytes, "pool_bytes": report.dirty_cap.pool_bytes,
            "derivation": report.dirty_cap.derivation,
        },
        "live_dirty_cap": {
            "bytes": report.live_dirty_cap.bytes, "reason": report.live_dirty_cap.reason,
            "changes": report.live_dirty_cap.changes,
        },
        "appends_waited": report.appends_waited, "bytes_written": report.bytes_written,
        "last_emergency_flush": report.last_emergency_flush.as_ref().map(|f| serde_json::json!({
            "bytes": f.bytes, "micros": f.micros, "budget_micros": f.budget_micros,
            "at_unix_ms": f.at_unix_ms, "failures": f.failures,
        })),
        "logs": report.logs.iter().map(|l| serde_json::json!({
            "name": l.name, "codec": l.codec, "first_lsn": l.positions.first_lsn,
            "last_lsn": l.positions.last_lsn, "durable_lsn": l.positions.durable_lsn,
            "dirty_bytes": l.dirty_bytes, "failure": l.failure, "waiting_for_space": l.waiting_for_space,
        })).collect::<Vec<_>>(),
        "crash_semantics": report.crash_semantics,
        // Every field of the replication section, by its name in the protocol.
        "replication": report.replication.as_ref().and_then(|r| serde_json::to_value(r).ok()),
    })
}

#[cfg(test)]
mod health_tests {
    use super::*;
    use stela_proto::LogStatus;

    fn report(power: &str, logs: Vec<LogStatus>) -> StatusReport {
        StatusReport {
            power: power.to_owned(),
            logs,
            ..StatusReport::default()
        }
    }

    fn log(name: &str, failure: Option<&str>, waiting: Option<&str>) -> LogStatus {
        LogStatus {
            name: name.to_owned(),
            failure: failure.map(str::to_owned),
            waiting_for_space: waiting.map(str::to_owned),
            ..LogStatus::default()
        }
    }

    #[test]
    fn health_names_every_problem_and_nothing_else() {
        assert!(health_problems(&report("normal", vec![log("a", None, None)])).is_empty());
        assert!(health_problems(&report("shutting down", vec![])).is_empty());
        let problems = health_problems(&report(
            "failed: writes refused until power-restore",
            vec![
                log("a", Some("fdatasync failed"), None),
                log("b", None, Some("no space for the next segment")),
                log("c", None, None),
            ],
        ));
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems[0].starts_with("power failed"), "{problems:?}");
        assert!(problems[1].contains("log a stopped"), "{problems:?}");
        assert!(
            problems[2].contains("log b waits for disk space"),
            "{problems:?}"
        );
    }

    /// A standby back after a `--degrade-after` spell: healthy only once it holds what was
    /// acknowledged without it.
    #[test]
    fn records_acknowledged_without_the_standby_are_a_problem_until_it_holds_them() {
        let with_standby_at = |received_lsn: u64| {
            let mut report = report("normal", vec![]);
            report.replication = Some(stela_proto::ReplicationStatus {
                role: "primary".into(),
                peer: "127.0.0.1:7000".into(),
                logs: vec![stela_proto::ReplicaStatus {
                    log: "orders".into(),
                    connected: true,
                    term: 1,
                    received_lsn,
                    durable_lsn: received_lsn,
                    lag_records: 0,
                    lag_ms: 0,
                    lag_bytes: 0,
                    stopped: None,
                    shipped_bytes: 0,
                    wire_bytes: 0,
                    degraded: false,
                    degraded_acks: 40,
                    degraded_through: 120,
                    unprotected_acks: 0,
                    stalled: false,
                    last_ack_ms: 0,
                    last_end: None,
                }],
                epoch: 0,
                coordinator: None,
                last_failover: None,
                unprotected_since_ms: 0,
                standbys: Vec::new(),
                replicas: 1,
                session_ends: Default::default(),
                ended_streams: Vec::new(),
            });
            health_problems(&report)
        };
        let behind = with_standby_at(119);
        assert_eq!(behind.len(), 1, "{behind:?}");
        assert!(
            behind[0].contains("log orders") && behind[0].contains("through LSN 120"),
            "{behind:?}"
        );
        assert!(with_standby_at(120).is_empty());
    }

    #[test]
    fn the_fill_bar_is_plain_and_bounded() {
        assert_eq!(fill_bar(0, 100), "[....................]   0 %");
        assert_eq!(fill_bar(50, 100), "[##########..........]  50 %");
        assert_eq!(fill_bar(1, 100), "[#...................]   1 %");
        assert_eq!(fill_bar(100, 100), "[####################] 100 %");
        assert_eq!(fill_bar(7, 0), "[####################] 100 %");
        // Over the cap (it can be lowered at a restart): the bar stays full, the figure says so.
        assert_eq!(fill_bar(150, 100), "[####################] 150 %");
    }
}
