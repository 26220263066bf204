//! The targets `stela-bench commit` judges the daemon by: ratios of commits/s between modes at
//! each client count (over the ring, at the baseline idle count), each judged against its
//! minimum, with the socket's figures printed beside without a target.
//!
//! Invariant: a ratio is computed only where both rows were run (same client count, record
//! size, transport and idle count) and its denominator is positive; a target none of whose
//! client counts was run says so rather than "met".

use super::CommitRow;
use std::io::Write;
use stela::drive::Mode;

/// Which rows a ratio line compares: a mode, and for the service modes, how they ran.
#[derive(Clone, Copy)]
struct Pick<'a> {
    mode: Mode,
    transport: Option<&'a str>,
    idle: Option<usize>,
}

impl Pick<'_> {
    fn matches(&self, row: &CommitRow) -> bool {
        row.mode == self.mode.name()
            && row.transport.as_deref() == self.transport
            && row.idle_connections == self.idle
    }
}

fn find<'r>(
    rows: &'r [CommitRow],
    pick: Pick<'_>,
    clients: usize,
    bytes: usize,
) -> Option<&'r CommitRow> {
    rows.iter()
        .find(|r| pick.matches(r) && r.clients == clients && r.record_bytes == bytes)
}

/// `numerator / denominator` commits/s at every client count both were run at.
fn ratios(
    rows: &[CommitRow],
    bytes: usize,
    numerator: Pick<'_>,
    denominator: Pick<'_>,
) -> Vec<(usize, f64)> {
    let mut clients: Vec<usize> = rows
        .iter()
        .filter(|r| r.record_bytes == bytes)
        .map(|r| r.clients)
        .collect();
    clients.sort_unstable();
    clients.dedup();
    clients
        .into_iter()
        .filter_map(|c| {
            let n = find(rows, numerator, c, bytes)?;
            let d = find(rows, denominator, c, bytes)?;
            (d.commits_per_s > 0.0).then(|| (c, n.commits_per_s / d.commits_per_s))
        })
        .collect()
}

fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "NOT met"
    }
}

/// A target on a ratio: at least `min` at each of `at` (client counts) that was run.
struct Target {
    min: f64,
    at: &'static [usize],
}

impl Target {
    /// "(target >= 0.50 at 1, 16, 64: met)", judged on the counts run, or why it is not judged.
    fn judge(&self, found: &[(usize, f64)]) -> String {
        let at: Vec<String> = self.at.iter().map(|c| c.to_string()).collect();
        let judged: Vec<f64> = found
            .iter()
            .filter(|(c, _)| self.at.contains(c))
            .map(|&(_, r)| r)
            .collect();
        let outcome = if judged.is_empty() {
            "none of these client counts run".to_string()
        } else {
            verdict(judged.iter().all(|&r| r >= self.min)).to_string()
        };
        format!("target >= {:.2} at {}: {outcome}", self.min, at.join(", "))
    }
}

/// The targets at one record size, where the rows allow: one column per client count.
/// Over the ring with the baseline idle count; the socket's figures beside, without target;
/// then `service-buffered` with each other idle count against the baseline.
pub(super) fn print_ratios(
    rows: &[CommitRow],
    bytes: usize,
    baseline: usize,
    out: &mut dyn Write,
) -> std::io::Result<()> {
    let mut clients: Vec<usize> = rows
        .iter()
        .filter(|r| r.record_bytes == bytes && r.transport.is_some())
        .map(|r| r.clients)
        .collect();
    clients.sort_unstable();
    clients.dedup();
    if clients.is_empty() {
        return Ok(());
    }
    let columns: String = clients.iter().map(|c| format!("{c:>8}")).collect();
    let label_width = 52;
    writeln!(out)?;
    writeln!(
        out,
        "{:<label_width$}{columns}",
        format!("{bytes} B records, clients:")
    )?;
    let values = |found: &[(usize, f64)]| -> String {
        clients
            .iter()
            .map(|c| match found.iter().find(|(fc, _)| fc == c) {
                Some((_, r)) => format!("{r:>8.2}"),
                None => format!("{:>8}", "-"),
            })
            .collect()
    };
    let embedded = |mode| Pick {
        mode,
        transport: None,
        idle: None,
    };
    let idle_note = if baseline == 0 {
        String::new()
    } else {
        format!(", {baseline} idle")
    };
    let transports = ["shm", "socket"];
    for transport in transports {
        let judged = transport == "shm";
        let service = |mode| Pick {
            mode,
            transport: Some(transport),
            idle: Some(baseline),
        };
        let lines = [
            (
                Mode::ServiceBuffered,
                Mode::EmbeddedUnsafe,
                Target {
                    min: 0.5,
                    at: &[1, 16, 64],
                },
            ),
            (
                Mode::ServiceDisk,
                Mode::EmbeddedGroup,
                Target {
                    min: 0.9,
                    at: &[16, 64],
                },
            ),
        ];
        for (numerator, denominator, target) in lines {
            let found = ratios(rows, bytes, service(numerator), embedded(denominator));
            if found.is_empty() {
                continue;
            }
            let judgement = if judged {
                target.judge(&found)
            } else {
                "no target".to_string()
            };
            writeln!(
                out,
                "{:<label_width$}{}   ({judgement})",
                format!("  {transport}{idle_note}: {numerator} / {denominator}"),
                values(&found)
            )?;
        }
        if let Some(p50) =
            find(rows, service(Mode::ServiceBuffered), 1, bytes).and_then(|r| r.p50_us)
        {
            let judgement = if judged {
                format!("target <= 2 us: {}", verdict(p50 <= 2.0))
            } else {
                "no target".to_string()
            };
            writeln!(
                out,
                "  {transport}{idle_note}: {} p50 at 1 client: {p50:.1} us ({judgement})",
                Mode::ServiceBuffered
            )?;
        }
    }
    // Idle connections: buffered commits/s with each other count against the baseline.
    let mut idle_counts: Vec<usize> = rows
        .iter()
        .filter_map(|r| r.idle_connections)
        .filter(|&n| n != baseline)
        .collect();
    idle_counts.sort_unstable();
    idle_counts.dedup();
    for transport in transports {
        for &idle in &idle_counts {
            let pick = |idle| Pick {
                mode: Mode::ServiceBuffered,
                transport: Some(transport),
                idle: Some(idle),
            };
            let found = ratios(rows, bytes, pick(idle), pick(baseline));
            if found.is_empty() {
                continue;
            }
            let judgement = if transport == "shm" {
                let met = found.iter().all(|&(_, r)| r >= 0.9);
                format!("target within 10 %, >= 0.90: {}", verdict(met))
            } else {
                "no target".to_string()
            };
            writeln!(
                out,
                "{:<label_width$}{}   ({judgement})",
                format!("  {transport}: buffered commits/s with {idle} idle / with {baseline}"),
                values(&found)
            )?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(
        mode: Mode,
        transport: Option<&str>,
        idle: Option<usize>,
        clients: usize,
        rate: f64,
    ) -> CommitRow {
        CommitRow {
            mode: mode.name().into(),
            transport: transport.map(str::to_string),
            idle_connections: idle,
            clients,
            record_bytes: 100,
            commits: rate as u64,
            seconds: 1.0,
            commits_per_s: rate,
            p50_us: Some(1.5),
            p99_us: Some(9.0),
            daemon_rss_kib: None,
            daemon_threads: None,
            daemon_connections: None,
        }
    }

    #[test]
    fn ratios_are_judged_at_their_client_counts_over_shm_only() {
        let mut rows = Vec::new();
        for clients in [1, 4, 16, 64] {
            rows.push(row(Mode::EmbeddedUnsafe, None, None, clients, 1000.0));
            rows.push(row(Mode::EmbeddedGroup, None, None, clients, 1000.0));
            // Below target only at 4 clients, which the target does not name.
            let buffered = if clients == 4 { 100.0 } else { 600.0 };
            rows.push(row(
                Mode::ServiceBuffered,
                Some("shm"),
                Some(0),
                clients,
                buffered,
            ));
            rows.push(row(
                Mode::ServiceBuffered,
                Some("socket"),
                Some(0),
                clients,
                10.0,
            ));
            rows.push(row(Mode::ServiceDisk, Some("shm"), Some(0), clients, 950.0));
            // 5000 idle costs 20 % at 64 clients, nothing elsewhere.
            let idle = if clients == 64 { 480.0 } else { buffered };
            rows.push(row(
                Mode::ServiceBuffered,
                Some("shm"),
                Some(5000),
                clients,
                idle,
            ));
        }
        let mut out = Vec::new();
        print_ratios(&rows, 100, 0, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let line = |start: &str| {
            text.lines()
                .find(|l| l.trim_start().starts_with(start))
                .unwrap_or_else(|| panic!("{start:?} missing from\n{text}"))
                .to_string()
        };
        let buffered = line("shm: service-buffered / embedded-unsafe");
        assert!(
            buffered.contains("0.60    0.10    0.60    0.60"),
            "{buffered}"
        );
        assert!(
            buffered.ends_with("(target >= 0.50 at 1, 16, 64: met)"),
            "{buffered}"
        );
        assert!(line("shm: service-disk / embedded-group").ends_with(": met)"));
        assert!(line("socket: service-buffered / embedded-unsafe").ends_with("(no target)"));
        assert!(
            line("shm: service-buffered p50 at 1 client").contains("1.5 us (target <= 2 us: met)")
        );
        let idle = line("shm: buffered commits/s with 5000 idle / with 0");
        assert!(idle.contains("1.00    1.00    1.00    0.80"), "{idle}");
        assert!(idle.ends_with("NOT met)"), "{idle}");
        // Without a baseline of 0, the ratios are judged at the fewest idle connections run.
        let mut out = Vec::new();
        let shifted: Vec<CommitRow> = rows
            .iter()
            .filter(|r| r.idle_connections != Some(0))
            .cloned()
            .collect();
        print_ratios(&shifted, 100, 5000, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("shm, 5000 idle: service-buffered / embedded-unsafe"),
            "{text}"
        );
    }
}
